//! `GgufError`: every way a GGUF file can be missing, malformed or misused, each with a message
//! that says what to do about it.

use std::path::PathBuf;

use crate::types::GgmlType;

/// Result alias used throughout the crate.
pub type Result<T, E = GgufError> = std::result::Result<T, E>;

/// Everything that can go wrong while opening, parsing or reading a GGUF file.
///
/// Parsing never panics and never allocates from a header field before checking it against the
/// bytes that remain in the file; malformed input always ends up here.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum GgufError {
    /// The file does not exist.
    #[error(
        "GGUF file not found: {path}; check the path, or set KVLAB_MODELS to the folder that \
         holds the model files (for example KVLAB_MODELS=~/models)"
    )]
    NotFound {
        /// The path that was opened, as given.
        path: PathBuf,
    },

    /// Any other I/O failure while opening or mapping the file.
    #[error("cannot read GGUF file {path}: {source}; check that it is a readable regular file")]
    Io {
        /// The file that could not be read.
        path: PathBuf,
        /// The operating system's error.
        #[source]
        source: std::io::Error,
    },

    /// The first four bytes are not `GGUF`.
    #[error(
        "not a GGUF file: the first 4 bytes are {found:02x?} but a GGUF file starts with \
         \"GGUF\" (47 47 55 46); pass a llama.cpp .gguf file (safetensors or llama2.c .bin \
         checkpoints have their own loaders)"
    )]
    BadMagic {
        /// The file's first 4 bytes (a GGUF file's are `GGUF`, 47 47 55 46).
        found: [u8; 4],
    },

    /// A version other than 2 or 3.
    #[error(
        "unsupported GGUF version {version}: kvlab-gguf reads versions 2 and 3{hint}; \
         re-convert the model with a recent llama.cpp (convert_hf_to_gguf.py)"
    )]
    UnsupportedVersion {
        /// The u32 version field after the magic.
        version: u32,
        /// A parenthesised guess at the cause (big-endian file, obsolete v1), or empty.
        hint: &'static str,
    },

    /// A read ran past the end of the file (a header field, a string, an array, tensor infos).
    #[error(
        "GGUF file is truncated: {what} at byte {offset} needs {needed} bytes but only \
         {available} remain; the file was probably cut short while downloading or copying, \
         fetch it again and compare its sha256"
    )]
    Truncated {
        /// What was being read, e.g. "tensor count" or a key's value.
        what: String,
        /// Byte offset in the file where the read started.
        offset: u64,
        /// Bytes the read needs.
        needed: u64,
        /// Bytes left in the file from `offset`.
        available: u64,
    },

    /// A string (key, value, tensor name) is not valid UTF-8.
    #[error("{what} at byte {offset} is not valid UTF-8; the file is corrupt, fetch it again")]
    InvalidUtf8 {
        /// What the string is (a key, a string value, a tensor name).
        what: String,
        /// Byte offset in the file where the string's bytes start.
        offset: u64,
    },

    /// A metadata value has a type id outside GGUF's table, or a shape this reader rejects.
    #[error(
        "metadata key '{key}' has an unsupported value type ({reason}); the file is corrupt or \
         was written by a newer tool than kvlab-gguf knows"
    )]
    BadMetadataValue {
        /// The metadata key whose value was rejected.
        key: String,
        /// Why: the unknown type id, or the rejected shape (e.g. nested arrays).
        reason: String,
    },

    /// The same metadata key appears twice.
    #[error("metadata key '{key}' appears twice; the file is corrupt, re-convert it")]
    DuplicateKey {
        /// The repeated key.
        key: String,
    },

    /// The same tensor name appears twice.
    #[error("tensor '{name}' appears twice; the file is corrupt, re-convert it")]
    DuplicateTensor {
        /// The repeated tensor name.
        name: String,
    },

    /// `general.alignment` is zero, not a power of two, or not a u32.
    #[error(
        "general.alignment is {value} but must be a power of two stored as u32; the file is \
         corrupt, re-convert it"
    )]
    BadAlignment {
        /// The stored value and its GGUF type, e.g. `"3 (u32)"`.
        value: String,
    },

    /// A tensor's ggml type id is not one ggml defines.
    #[error(
        "tensor '{tensor}' has unknown ggml type id {type_id}; it was written by a newer \
         llama.cpp than kvlab-gguf knows, re-quantize it to a common type (for example Q8_0 or \
         Q4_K_M)"
    )]
    UnknownTensorType {
        /// The tensor's name.
        tensor: String,
        /// The u32 type id from its tensor info (ggml's `enum ggml_type`).
        type_id: u32,
    },

    /// A known ggml type that this crate cannot dequantize (yet).
    #[error(
        "tensor '{tensor}' is {ggml_type}, which kvlab-gguf cannot dequantize (it reads F32, \
         F16, BF16, Q4_0, Q4_1, Q5_0, Q5_1, Q8_0, Q4_K, Q5_K, Q6_K, Q8_K); use a file \
         quantized to one of those, for example Q4_K_M or Q8_0"
    )]
    UnsupportedTensorType {
        /// The tensor's name.
        tensor: String,
        /// Its ggml type, one [`GgmlType`] without a dequantizer here.
        ggml_type: GgmlType,
    },

    /// Shape problems: too many dims, element count overflow, a row that is not a whole number
    /// of blocks, a buffer of the wrong length.
    #[error(
        "tensor '{tensor}' has an inconsistent shape: {reason}; the file is corrupt or was written by an incompatible tool"
    )]
    BadShape {
        /// The tensor's name.
        tensor: String,
        /// Which rule the shape breaks, with the numbers.
        reason: String,
    },

    /// A tensor's data does not lie inside the file's data section.
    #[error(
        "tensor '{tensor}' data (bytes {start}..{end} of the file) lies beyond the end of the \
         file ({file_len} bytes); the file is truncated or corrupt, fetch it again and compare \
         its sha256"
    )]
    TensorOutOfBounds {
        /// The tensor's name.
        tensor: String,
        /// Byte offset in the file of its first byte (data section start + its offset;
        /// `u64::MAX` on overflow).
        start: u64,
        /// Byte offset in the file one past its last byte (`u64::MAX` on overflow).
        end: u64,
        /// The file's length in bytes.
        file_len: u64,
    },

    /// Two tensors claim overlapping bytes.
    #[error(
        "tensors '{first}' and '{second}' overlap in the data section (offsets {first_range:?} \
         and {second_range:?}); the file is corrupt, re-convert it"
    )]
    TensorOverlap {
        /// The tensor that starts first.
        first: String,
        /// The tensor that starts inside `first`'s bytes.
        second: String,
        /// `first`'s bytes, as byte offsets in the file.
        first_range: std::ops::Range<u64>,
        /// `second`'s bytes, as byte offsets in the file.
        second_range: std::ops::Range<u64>,
    },

    /// A tensor's data offset is not a multiple of the file's alignment.
    #[error(
        "tensor '{tensor}' starts at data offset {offset}, which is not a multiple of the file's \
         alignment {alignment}; the file is corrupt, re-convert it"
    )]
    MisalignedTensor {
        /// The tensor's name.
        tensor: String,
        /// Its offset in bytes from the start of the data section, as stored in its tensor info.
        offset: u64,
        /// The file's alignment in bytes (`general.alignment`, 32 when absent).
        alignment: u64,
    },

    /// A metadata key the caller asked for is absent.
    #[error(
        "metadata key '{key}' is missing; this file does not describe what the loader needs \
         (is it the right architecture? `kvlab info FILE` lists its keys)"
    )]
    MissingKey {
        /// The key asked for, e.g. `llama.block_count`.
        key: String,
    },

    /// A metadata key holds a value of another type than the caller asked for.
    #[error(
        "metadata key '{key}' holds {found} but {expected} was asked for; use the accessor for \
         {found} (or check that the key is the one you meant)"
    )]
    WrongType {
        /// The key asked for.
        key: String,
        /// The type the accessor reads, e.g. `"u32"`.
        expected: &'static str,
        /// The type the value has.
        found: String,
    },

    /// A tensor the caller asked for is absent.
    #[error(
        "tensor '{name}' is not in this file; `GgufFile::tensor_names()` (or `kvlab info FILE`) \
         lists the tensors it has"
    )]
    MissingTensor {
        /// The tensor name asked for.
        name: String,
    },

    /// A row range past a tensor's last row.
    #[error("rows {start}..{end} requested from tensor '{tensor}', which has {n_rows} rows")]
    RowOutOfRange {
        /// The tensor's name.
        tensor: String,
        /// First row asked for.
        start: usize,
        /// One past the last row asked for.
        end: usize,
        /// Rows the tensor has (the product of its dims after `ne[0]`, the row length).
        n_rows: usize,
    },
}

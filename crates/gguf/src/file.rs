//! `GgufFile`: opens (memory-maps) a GGUF file, parses and validates its header, and hands out
//! metadata, tensor infos, raw tensor bytes and dequantized f32 tensors.
//!
//! File layout (GGUF v2/v3, little-endian; llama.cpp `ggml/src/gguf.cpp`, `docs/gguf.md`):
//! ```text
//! magic "GGUF" | version u32 | n_tensors u64 | n_kv u64
//! n_kv × (key: string, value_type: u32, value)
//! n_tensors × (name: string, n_dims: u32, ne: [u64; n_dims], ggml_type: u32, offset: u64)
//! padding to `general.alignment` (default 32)
//! data section: each tensor at data_start + offset (offset a multiple of the alignment)
//! ```

use std::collections::HashMap;
use std::ops::{Deref, Range};
use std::path::{Path, PathBuf};
use std::sync::Arc;

use crate::dequant::dequantize_named;
use crate::error::{GgufError, Result};
use crate::metadata::{Metadata, MetadataValue};
use crate::reader::Cursor;
use crate::summary::Summary;
use crate::tensor::{MAX_DIMS, TensorInfo};
use crate::types::GgmlType;

/// GGUF's default data alignment when `general.alignment` is absent.
pub const DEFAULT_ALIGNMENT: u64 = 32;

const MAGIC: [u8; 4] = *b"GGUF";

/// Smallest possible tensor info: name length (8) + n_dims (4) + type (4) + offset (8).
const MIN_TENSOR_INFO_BYTES: u64 = 8 + 4 + 4 + 8;

/// The bytes of the file: a read-only memory map, or an owned buffer (tests, in-memory files).
enum Bytes {
    Mapped(Arc<memmap2::Mmap>),
    Owned(Vec<u8>),
}

impl Deref for Bytes {
    type Target = [u8];
    fn deref(&self) -> &[u8] {
        match self {
            Bytes::Mapped(m) => m,
            Bytes::Owned(v) => v,
        }
    }
}

/// A parsed GGUF file. Cheap to query; tensor data stays in the memory map until asked for.
pub struct GgufFile {
    path: Option<PathBuf>,
    bytes: Bytes,
    version: u32,
    metadata: Metadata,
    /// Tensor infos in file order.
    tensors: Vec<TensorInfo>,
    by_name: HashMap<String, usize>,
    alignment: u64,
    data_start: u64,
}

impl std::fmt::Debug for GgufFile {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("GgufFile")
            .field("path", &self.path)
            .field("version", &self.version)
            .field("n_metadata", &self.metadata.len())
            .field("n_tensors", &self.tensors.len())
            .field("alignment", &self.alignment)
            .field("data_start", &self.data_start)
            .finish()
    }
}

impl GgufFile {
    /// Opens and memory-maps `path`, then parses and validates the header and tensor table.
    ///
    /// The map is read-only; like every mmap-based loader it assumes the file is not modified
    /// while open (model files are read-only inputs). The header is parsed into owned values
    /// through a map that is then dropped, so of the file only the tensor pages that are read
    /// stay resident in this process.
    ///
    /// # Errors
    /// [`GgufError::NotFound`] or [`GgufError::Io`] (also if the file changes size while it is
    /// being opened), then every parse and validation error of the header and tensor table.
    pub fn open(path: impl AsRef<Path>) -> Result<Self> {
        let path = path.as_ref();
        let io = |source: std::io::Error| {
            if source.kind() == std::io::ErrorKind::NotFound {
                GgufError::NotFound {
                    path: path.to_path_buf(),
                }
            } else {
                GgufError::Io {
                    path: path.to_path_buf(),
                    source,
                }
            }
        };
        let file = std::fs::File::open(path).map_err(io)?;
        let len = file.metadata().map_err(io)?.len();
        if len == 0 {
            // Mapping an empty file fails on some platforms; an empty buffer parses to the
            // same "truncated" error.
            return Self::parse(Bytes::Owned(Vec::new()));
        }
        let mut f = Self::parse(Bytes::Mapped(Arc::new(map_file(&file).map_err(io)?)))?;
        // Parsing read the header through that map (Gemma 3's: 6.5 MB of tokenizer strings,
        // scores and types), and a map keeps the pages it has read resident for as long as it
        // lives. Everything parsed is owned now, so the map kept for tensor data is a fresh one
        // whose header pages are never read: only tensor pages count in the process's RSS.
        let fresh = map_file(&file).map_err(io)?;
        if fresh.len() != f.bytes.len() {
            return Err(io(std::io::Error::other(
                "the file changed size while it was being opened",
            )));
        }
        f.bytes = Bytes::Mapped(Arc::new(fresh));
        f.path = Some(path.to_path_buf());
        Ok(f)
    }

    /// Parses a GGUF file held in memory.
    pub fn from_bytes(bytes: Vec<u8>) -> Result<Self> {
        Self::parse(Bytes::Owned(bytes))
    }

    fn parse(bytes: Bytes) -> Result<Self> {
        let buf: &[u8] = &bytes;
        let mut c = Cursor::new(buf);

        let magic = c.bytes(4, "magic").map_err(|_| GgufError::Truncated {
            what: "GGUF magic (the file is shorter than 4 bytes)".into(),
            offset: 0,
            needed: 4,
            available: buf.len() as u64,
        })?;
        if magic != MAGIC {
            let mut found = [0u8; 4];
            found.copy_from_slice(magic);
            return Err(GgufError::BadMagic { found });
        }
        let version = c.u32("GGUF version")?;
        if version != 2 && version != 3 {
            let hint = if version.swap_bytes() == 2 || version.swap_bytes() == 3 {
                " (this one looks big-endian; kvlab-gguf reads little-endian files only)"
            } else if version == 1 {
                " (version 1 used 32-bit counts and is obsolete)"
            } else {
                ""
            };
            return Err(GgufError::UnsupportedVersion { version, hint });
        }
        let n_tensors = c.u64("tensor count")?;
        let n_kv = c.u64("metadata key-value count")?;

        let metadata = Metadata::parse(&mut c, n_kv)?;
        let alignment = match metadata.get("general.alignment") {
            None => DEFAULT_ALIGNMENT,
            Some(MetadataValue::U32(a)) if a.is_power_of_two() => u64::from(*a),
            Some(v) => {
                return Err(GgufError::BadAlignment {
                    value: format!("{v} ({})", v.type_name()),
                });
            }
        };

        // Tensor infos. Counts were checked against the remaining bytes before allocating.
        let n = c.check_count(n_tensors, MIN_TENSOR_INFO_BYTES, "tensor infos")?;
        let mut raw = Vec::with_capacity(n);
        for i in 0..n {
            let name = c.string(&format!("name of tensor {i}"))?.to_owned();
            let what = format!("tensor info of '{name}'");
            let n_dims = c.u32(&what)?;
            if n_dims as usize > MAX_DIMS || n_dims == 0 {
                return Err(GgufError::BadShape {
                    tensor: name,
                    reason: format!("{n_dims} dimensions, ggml allows 1 to {MAX_DIMS}"),
                });
            }
            let mut ne = Vec::with_capacity(n_dims as usize);
            for _ in 0..n_dims {
                ne.push(c.u64(&what)?);
            }
            let type_id = c.u32(&what)?;
            let offset = c.u64(&what)?;
            raw.push((name, ne, type_id, offset));
        }

        // The data section starts at the next multiple of the alignment.
        let header_end = c.pos() as u64;
        let data_start = header_end.div_ceil(alignment) * alignment;
        let file_len = buf.len() as u64;

        let mut tensors = Vec::with_capacity(raw.len());
        let mut by_name = HashMap::with_capacity(raw.len());
        for (name, ne, type_id, offset) in raw {
            let info = validate_tensor(name, ne, type_id, offset, alignment, data_start, file_len)?;
            if by_name.contains_key(&info.name) {
                return Err(GgufError::DuplicateTensor { name: info.name });
            }
            by_name.insert(info.name.clone(), tensors.len());
            tensors.push(info);
        }
        check_no_overlap(&tensors)?;

        Ok(GgufFile {
            path: None,
            bytes,
            version,
            metadata,
            tensors,
            by_name,
            alignment,
            data_start,
        })
    }

    /// The path given to [`GgufFile::open`] (None for [`GgufFile::from_bytes`]).
    pub fn path(&self) -> Option<&Path> {
        self.path.as_deref()
    }

    /// GGUF format version (2 or 3).
    pub fn version(&self) -> u32 {
        self.version
    }

    /// Data alignment in bytes (`general.alignment`, default 32).
    pub fn alignment(&self) -> u64 {
        self.alignment
    }

    /// Absolute file offset of the data section.
    pub fn data_start(&self) -> u64 {
        self.data_start
    }

    /// Size of the file in bytes.
    pub fn file_len(&self) -> u64 {
        self.bytes.len() as u64
    }

    /// All metadata, with typed lookups (`get_u32`, `get_str_array`, ...).
    pub fn metadata(&self) -> &Metadata {
        &self.metadata
    }

    /// Tensor infos in file order.
    pub fn tensors(&self) -> &[TensorInfo] {
        &self.tensors
    }

    /// Tensor names in file order.
    pub fn tensor_names(&self) -> impl Iterator<Item = &str> {
        self.tensors.iter().map(|t| t.name.as_str())
    }

    /// Whether a tensor of that name exists.
    pub fn has_tensor(&self, name: &str) -> bool {
        self.by_name.contains_key(name)
    }

    /// The info of tensor `name`, or [`GgufError::MissingTensor`].
    pub fn tensor_info(&self, name: &str) -> Result<&TensorInfo> {
        self.by_name
            .get(name)
            .map(|&i| &self.tensors[i])
            .ok_or_else(|| GgufError::MissingTensor {
                name: name.to_string(),
            })
    }

    /// The raw (still quantized) bytes of tensor `name`, borrowed from the memory map.
    pub fn tensor_bytes(&self, name: &str) -> Result<&[u8]> {
        let info = self.tensor_info(name)?;
        Ok(self.bytes_of(info))
    }

    /// The file's memory map and the byte range of tensor `name` in it, so that a caller can
    /// keep the tensor's bytes without copying them; `None` for a file parsed from memory.
    pub fn tensor_mapping(&self, name: &str) -> Result<Option<(Arc<memmap2::Mmap>, Range<usize>)>> {
        let info = self.tensor_info(name)?;
        Ok(match &self.bytes {
            Bytes::Mapped(map) => Some((
                Arc::clone(map),
                info.file_range.start as usize..info.file_range.end as usize,
            )),
            Bytes::Owned(_) => None,
        })
    }

    fn bytes_of(&self, info: &TensorInfo) -> &[u8] {
        // file_range was checked to lie inside the file when the header was parsed.
        &self.bytes[info.file_range.start as usize..info.file_range.end as usize]
    }

    /// Tensor `name` dequantized to f32, row-major in ggml's layout: for `ne = [in, out]` the
    /// result is `(out, in)` (see [`TensorInfo::shape`]). Large tensors are dequantized in
    /// parallel with rayon.
    pub fn dequantize(&self, name: &str) -> Result<Vec<f32>> {
        let info = self.tensor_info(name)?;
        let mut out = vec![0f32; info.len()];
        dequantize_named(info.ggml_type, self.bytes_of(info), &mut out, &info.name)?;
        Ok(out)
    }

    /// Rows `rows` of tensor `name` dequantized to f32: `(rows.len(), row_len)` row-major.
    /// For lookups such as one token's embedding without dequantizing the whole
    /// `(vocab, n_embd)` table.
    pub fn dequantize_rows(&self, name: &str, rows: Range<usize>) -> Result<Vec<f32>> {
        let info = self.tensor_info(name)?;
        let mut out = vec![0f32; rows.len().saturating_mul(info.row_len())];
        self.dequantize_rows_into(name, rows, &mut out)?;
        Ok(out)
    }

    /// Like [`GgufFile::dequantize_rows`], writing into `out` (length `rows.len() * row_len`).
    pub fn dequantize_rows_into(
        &self,
        name: &str,
        rows: Range<usize>,
        out: &mut [f32],
    ) -> Result<()> {
        let info = self.tensor_info(name)?;
        if rows.start > rows.end || rows.end > info.n_rows() {
            return Err(GgufError::RowOutOfRange {
                tensor: info.name.clone(),
                start: rows.start,
                end: rows.end,
                n_rows: info.n_rows(),
            });
        }
        let rb = info.row_bytes();
        let bytes = &self.bytes_of(info)[rows.start * rb..rows.end * rb];
        dequantize_named(info.ggml_type, bytes, out, &info.name)
    }

    /// Counts and bytes per type, for `kvlab info`.
    pub fn summary(&self) -> Summary {
        Summary::of(self)
    }
}

/// A read-only map of the whole of `file`.
fn map_file(file: &std::fs::File) -> std::io::Result<memmap2::Mmap> {
    // SAFETY: the map is read-only and private to the `GgufFile` that holds it; the file is a
    // model input that nothing writes while it is open. All reads go through bounds-checked
    // slices of the map.
    unsafe { memmap2::Mmap::map(file) }
}

/// Checks one tensor's shape, type and data range and builds its [`TensorInfo`].
fn validate_tensor(
    name: String,
    ne: Vec<u64>,
    type_id: u32,
    offset: u64,
    alignment: u64,
    data_start: u64,
    file_len: u64,
) -> Result<TensorInfo> {
    let bad = |name: &str, reason: String| GgufError::BadShape {
        tensor: name.to_string(),
        reason,
    };
    let Some(ggml_type) = GgmlType::from_id(type_id) else {
        return Err(GgufError::UnknownTensorType {
            tensor: name,
            type_id,
        });
    };
    // Like ggml: every dim is a non-negative int64 and the product of all dims (zeros counted
    // as 1, so that row counts cannot overflow either) fits int64.
    let mut n_elements: u64 = 1;
    let mut bound: u64 = 1;
    for &d in &ne {
        bound = bound
            .checked_mul(d.max(1))
            .filter(|&b| b <= i64::MAX as u64)
            .ok_or_else(|| bad(&name, format!("dims {ne:?} multiply past 2^63 (overflow)")))?;
        n_elements *= d; // <= bound, cannot overflow
    }
    if usize::try_from(bound).is_err() {
        return Err(bad(
            &name,
            format!("dims {ne:?} do not fit this platform's usize"),
        ));
    }
    let bs = ggml_type.block_size() as u64;
    if ne[0] % bs != 0 {
        return Err(bad(
            &name,
            format!(
                "row length ne[0] = {} is not a multiple of the {ggml_type} block size {bs}",
                ne[0]
            ),
        ));
    }
    let n_bytes = ggml_type.bytes_for(n_elements).ok_or_else(|| {
        bad(
            &name,
            format!("{n_elements} elements of {ggml_type} overflow u64 bytes"),
        )
    })?;
    if offset % alignment != 0 {
        return Err(GgufError::MisalignedTensor {
            tensor: name,
            offset,
            alignment,
        });
    }
    let start = data_start.checked_add(offset);
    let end = start.and_then(|s| s.checked_add(n_bytes));
    match (start, end) {
        (Some(start), Some(end)) if end <= file_len => Ok(TensorInfo {
            name,
            ne,
            ggml_type,
            offset,
            n_elements,
            n_bytes,
            file_range: start..end,
        }),
        _ => Err(GgufError::TensorOutOfBounds {
            tensor: name,
            start: start.unwrap_or(u64::MAX),
            end: end.unwrap_or(u64::MAX),
            file_len,
        }),
    }
}

/// Fails if the data of any two (non-empty) tensors overlap.
fn check_no_overlap(tensors: &[TensorInfo]) -> Result<()> {
    let mut order: Vec<&TensorInfo> = tensors.iter().filter(|t| t.n_bytes > 0).collect();
    order.sort_by_key(|t| t.file_range.start);
    for w in order.windows(2) {
        if w[1].file_range.start < w[0].file_range.end {
            return Err(GgufError::TensorOverlap {
                first: w[0].name.clone(),
                second: w[1].name.clone(),
                first_range: w[0].file_range.clone(),
                second_range: w[1].file_range.clone(),
            });
        }
    }
    Ok(())
}

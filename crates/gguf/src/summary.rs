//! A short account of a GGUF file for `kvlab info`: tensor count, bytes and a histogram of
//! tensor types.

use std::collections::BTreeMap;
use std::fmt;

use crate::file::GgufFile;
use crate::types::GgmlType;

/// Tensors of one ggml type.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct TypeCount {
    /// The type these counts are for.
    pub ggml_type: GgmlType,
    /// Tensors stored as this type.
    pub n_tensors: usize,
    /// Elements (parameters) in those tensors.
    pub n_elements: u64,
    /// Bytes of data in those tensors.
    pub n_bytes: u64,
}

/// Counts and sizes of a GGUF file.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Summary {
    /// GGUF version from the header (2 or 3).
    pub version: u32,
    /// `general.architecture`, if present.
    pub architecture: Option<String>,
    /// Metadata key-value pairs.
    pub n_metadata: usize,
    /// Tensors (tensor infos).
    pub n_tensors: usize,
    /// Sum of all tensors' element counts (parameters).
    pub n_elements: u64,
    /// Sum of all tensors' data bytes.
    pub tensor_bytes: u64,
    /// Length of the whole file in bytes (header, metadata, tensor infos, padding, data).
    pub file_bytes: u64,
    /// One entry per type present, in ggml id order.
    pub by_type: Vec<TypeCount>,
}

impl Summary {
    pub(crate) fn of(f: &GgufFile) -> Self {
        let mut by: BTreeMap<u32, TypeCount> = BTreeMap::new();
        for t in f.tensors() {
            let e = by.entry(t.ggml_type.id()).or_insert(TypeCount {
                ggml_type: t.ggml_type,
                n_tensors: 0,
                n_elements: 0,
                n_bytes: 0,
            });
            e.n_tensors += 1;
            e.n_elements += t.n_elements;
            e.n_bytes += t.n_bytes;
        }
        Summary {
            version: f.version(),
            architecture: f.metadata().architecture().ok().map(str::to_owned),
            n_metadata: f.metadata().len(),
            n_tensors: f.tensors().len(),
            n_elements: f.tensors().iter().map(|t| t.n_elements).sum(),
            tensor_bytes: f.tensors().iter().map(|t| t.n_bytes).sum(),
            file_bytes: f.file_len(),
            by_type: by.into_values().collect(),
        }
    }

    /// Average bits per parameter over all tensors.
    pub fn bits_per_weight(&self) -> f64 {
        if self.n_elements == 0 {
            0.0
        } else {
            self.tensor_bytes as f64 * 8.0 / self.n_elements as f64
        }
    }
}

impl fmt::Display for Summary {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        writeln!(
            f,
            "GGUF v{}, architecture {}, {} metadata keys, {} tensors",
            self.version,
            self.architecture.as_deref().unwrap_or("?"),
            self.n_metadata,
            self.n_tensors
        )?;
        writeln!(
            f,
            "{} parameters in {} bytes of tensor data ({:.2} bits/weight), file {} bytes",
            self.n_elements,
            self.tensor_bytes,
            self.bits_per_weight(),
            self.file_bytes
        )?;
        writeln!(
            f,
            "{:<8} {:>8} {:>14} {:>14}",
            "type", "tensors", "elements", "bytes"
        )?;
        for t in &self.by_type {
            writeln!(
                f,
                "{:<8} {:>8} {:>14} {:>14}",
                t.ggml_type.name(),
                t.n_tensors,
                t.n_elements,
                t.n_bytes
            )?;
        }
        Ok(())
    }
}

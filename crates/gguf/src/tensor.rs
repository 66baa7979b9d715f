//! Tensor infos: name, shape (GGUF order), ggml type and where the data lies.
//!
//! # Shapes
//! GGUF stores ggml's `ne` array: `ne[0]` is the fastest-varying axis (the length of one row),
//! `ne[1]` the number of rows, and so on. A linear layer `y = W x` with `x: (in,)` and
//! `y: (out,)` is stored with `ne = [in, out]`; its data, and its dequantized `Vec<f32>`, are
//! `out` rows of `in` values, i.e. row-major `(out, in)` — the same layout as PyTorch's
//! `nn.Linear.weight`. [`TensorInfo::shape`] gives that row-major shape (`ne` reversed).
//! Examples from Gemma 3 270M: `token_embd.weight` ne = [640, 262144] → (vocab, n_embd);
//! `blk.0.attn_q.weight` ne = [640, 1024] → (n_head·head_dim, n_embd);
//! `blk.0.ffn_down.weight` ne = [2048, 640] → (n_embd, n_ff).

use std::ops::Range;

use crate::types::GgmlType;

/// ggml's GGML_MAX_DIMS.
pub const MAX_DIMS: usize = 4;

/// One tensor's description from the file's tensor-info table (already validated: the shape is
/// consistent with the type and the data lies inside the file).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct TensorInfo {
    /// Tensor name, e.g. `blk.0.attn_q.weight`.
    pub name: String,
    /// ggml `ne` (GGUF order): `ne[0]` is the fastest-varying axis (row length, the `in` axis of
    /// a weight matrix); 1 to 4 entries.
    pub ne: Vec<u64>,
    /// Element type.
    pub ggml_type: GgmlType,
    /// Byte offset of the data from the start of the file's data section.
    pub offset: u64,
    /// Product of `ne`.
    pub n_elements: u64,
    /// Bytes of data (`n_elements / block_size * type_size`).
    pub n_bytes: u64,
    /// Absolute byte range of the data in the file.
    pub file_range: Range<u64>,
}

impl TensorInfo {
    /// Row-major shape, outermost axis first: `ne` reversed. For a weight matrix with
    /// `ne = [in, out]` this is `[out, in]`; for a vector `[n]`.
    pub fn shape(&self) -> Vec<usize> {
        self.ne.iter().rev().map(|&d| d as usize).collect()
    }

    /// Elements per row: `ne[0]`.
    pub fn row_len(&self) -> usize {
        self.ne.first().copied().unwrap_or(1) as usize
    }

    /// Number of rows: product of `ne[1..]` (1 for a vector).
    pub fn n_rows(&self) -> usize {
        self.ne.iter().skip(1).product::<u64>() as usize
    }

    /// Bytes taken by one row.
    pub fn row_bytes(&self) -> usize {
        (self.row_len() / self.ggml_type.block_size()) * self.ggml_type.type_size()
    }

    /// Number of elements as usize.
    pub fn len(&self) -> usize {
        self.n_elements as usize
    }

    /// Whether the tensor has no elements.
    pub fn is_empty(&self) -> bool {
        self.n_elements == 0
    }
}

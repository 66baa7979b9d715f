//! kvlab-gguf: reads llama.cpp's GGUF files (v2 and v3) and dequantizes their tensors to f32.
//!
//! ```no_run
//! use kvlab_gguf::{GgufFile, StringArray};
//! # fn main() -> kvlab_gguf::Result<()> {
//! let f = GgufFile::open("gemma-3-270m-q4_k_m.gguf")?;
//! let md = f.metadata();
//! let n_layers = md.get_u32("gemma3.block_count")?; // 18
//! let eps = md.get_f32("gemma3.attention.layer_norm_rms_epsilon")?; // 1e-6
//! let tokens: &StringArray = md.get_str_array("tokenizer.ggml.tokens")?; // (vocab,)
//! assert_eq!(&tokens[2], "<bos>");
//! let scores: &[f32] = md.get_f32_array("tokenizer.ggml.scores")?; // (vocab,)
//! // ne = [640, 1024] in GGUF order (ne[0] = in, fastest-varying) ...
//! let info = f.tensor_info("blk.0.attn_q.weight")?;
//! assert_eq!(info.ne, [640, 1024]);
//! // ... so the f32 data is row-major (out, in) = (n_head * head_dim, n_embd) = (1024, 640).
//! let wq: Vec<f32> = f.dequantize("blk.0.attn_q.weight")?;
//! assert_eq!(info.shape(), [1024, 640]);
//! // One row of the (vocab, n_embd) embedding table without dequantizing all of it:
//! let emb_bos: Vec<f32> = f.dequantize_rows("token_embd.weight", 2..3)?; // (1, 640)
//! println!("{}", f.summary());
//! # let _ = (n_layers, eps, tokens, scores, wq, emb_bos); Ok(()) }
//! ```
//!
//! # Why the parser is hand-written
//! The crates that parse GGUF were weighed against this crate's requirements (no panic and no
//! allocation sized by an unchecked header field on any input; zero-copy tensor bytes from a
//! memory map; light to build on a 2-core machine; the workspace's MSRV 1.85):
//! - `ggus` 0.5 (InfiniTensor): small and zero-copy, but it pre-allocates
//!   `IndexMap::with_capacity(header.metadata_kv_count)` straight from the header, `unwrap`s a
//!   `Layout` computed from a length field, and pulls `regex`; its companion `ggml-quants` 0.1
//!   leaves Q4_K and Q6_K `dequantize` as `todo!()` (a panic), and this file's FFN and
//!   attention-output weights are exactly those types.
//! - `gguf-rs` 0.1: `clap`, `comfy-table`, `simple_logger`, `anyhow` are non-optional deps of
//!   the library, and it allocates `vec![0; len]` from an unchecked string length.
//! - candle-core's `quantized::gguf_file`: sound dequantization, but candle-core is a large
//!   build (gemm, safetensors, zip, ...) for one module, and its `read_string` also allocates
//!   `vec![0u8; len]` from the file before checking it.
//! - `gguf-rs-lib` 0.3: careful (budgets on sizes), but it copies through `std::io::Read`,
//!   declares rust-version 1.87 (the workspace promises 1.85), and is a young single-vendor
//!   crate.
//!
//! GGUF itself is small (a header, typed key-values, a tensor table), so the reader here is
//! ~300 lines over a bounds-checked cursor (`src/reader.rs`), and the block formats are
//! ports of ggml's `dequantize_row_*` with one hand-computed unit test each. Dependencies:
//! `memmap2` (the mmap), `half` (exact f16 → f32), `rayon` (parallel dequantization of large
//! tensors), `thiserror` (the error enum) — all already in the workspace.
//!
//! # Guarantees
//! - Every count (key-values, tensors, array lengths, string lengths) is checked against the
//!   bytes left in the file before anything is allocated for it.
//! - Every tensor's shape is checked (1..=4 dims, no overflow, rows are whole blocks) and its
//!   data range lies inside the file, aligned, and overlaps no other tensor, before
//!   [`GgufFile::open`] returns; later reads cannot fail on bounds.
//! - Errors are [`GgufError`] values whose messages say what to do.

mod builder;
mod dequant;
mod error;
mod file;
mod metadata;
mod reader;
mod summary;
mod tensor;
mod types;

pub use builder::GgufBuilder;
pub use dequant::{dequantize, dequantize_into};
pub use error::{GgufError, Result};
pub use file::{DEFAULT_ALIGNMENT, GgufFile};
pub use metadata::{Metadata, MetadataArray, MetadataValue, StringArray};
pub use summary::{Summary, TypeCount};
pub use tensor::{MAX_DIMS, TensorInfo};
pub use types::{GgmlType, QK_K};

/// File name of the Gemma 3 270M checkpoint in `KVLAB_MODELS`.
pub const GEMMA3_270M_FILE: &str = "gemma-3-270m-q4_k_m.gguf";

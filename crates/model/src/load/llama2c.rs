//! llama2.c's legacy checkpoint format (Karpathy, llama2.c `run.c` `read_checkpoint`, and
//! `export.py` `legacy_export`): a header of 7 little-endian i32
//! `(dim, hidden_dim, n_layers, n_heads, n_kv_heads, vocab_size, seq_len)`, then f32 tensors:
//!
//! ```text
//! token_embedding (vocab, dim)   rms_att (layer, dim)      wq (layer, dim, dim)
//! wk (layer, kv_dim, dim)        wv (layer, kv_dim, dim)    wo (layer, dim, dim)
//! rms_ffn (layer, dim)           w1 (layer, hidden, dim)    w2 (layer, dim, hidden)
//! w3 (layer, hidden, dim)        rms_final (dim)
//! freq_cis_real (seq_len, head_dim/2)  freq_cis_imag (seq_len, head_dim/2)   (unused by run.c)
//! wcls (vocab, dim)              only when the header's vocab_size is negative
//! ```
//!
//! The header is validated and the file size compared with what it implies *before* anything is
//! mapped. The tensors are then used in place from a read-only memory map of the file (run.c's
//! `memory_map_weights` does the same): loading copies nothing, and the weights' resident pages
//! are the file's, so a process holds the weights once.

use std::fs::File;
use std::io::{Read, Write};
use std::path::Path;
use std::sync::Arc;

use crate::weights::{LayerWeights, Tensor};
use crate::{Config, Error, Model, Result, Weights};

const HEADER_BYTES: u64 = 7 * 4;

/// Parses and validates the 7-field header; returns the config and whether the classifier is
/// shared (vocab_size > 0).
///
/// # Errors
/// [`Error::Config`] for zero, negative or absurd fields, `n_heads` not a multiple of
/// `n_kv_heads`, `dim` not a multiple of `n_heads`.
pub fn parse_header(h: [i32; 7]) -> Result<Config> {
    let [
        dim,
        hidden_dim,
        n_layers,
        n_heads,
        n_kv_heads,
        vocab,
        seq_len,
    ] = h;
    use crate::config::{MAX_DIM, MAX_LAYERS, MAX_SEQ_LEN, MAX_VOCAB, check_field};
    let fields = [
        ("dim", dim, MAX_DIM),
        ("hidden_dim", hidden_dim, MAX_DIM * 8),
        ("n_layers", n_layers, MAX_LAYERS),
        ("n_heads", n_heads, MAX_DIM),
        ("n_kv_heads", n_kv_heads, MAX_DIM),
        ("vocab_size", vocab.saturating_abs(), MAX_VOCAB),
        ("seq_len", seq_len, MAX_SEQ_LEN),
    ];
    if let Some((name, v, _)) = fields.iter().find(|(_, v, _)| *v <= 0) {
        return Err(Error::Config(format!(
            "header field {name} = {v}; it must be positive"
        )));
    }
    // Bound every field before Config::llama sizes anything from it (layer_kinds has n_layers
    // entries).
    for (name, v, max) in fields {
        check_field(name, v as usize, max)?;
    }
    let u = |v: i32| v as usize;
    if dim % n_heads != 0 {
        return Err(Error::Config(format!(
            "dim ({dim}) is not a multiple of n_heads ({n_heads})"
        )));
    }
    let config = Config::llama(
        u(dim),
        u(hidden_dim),
        u(n_layers),
        u(n_heads),
        u(n_kv_heads),
        u(vocab.saturating_abs()),
        u(seq_len),
        vocab > 0,
    );
    config.validate()?;
    Ok(config)
}

/// Bytes a llama2.c checkpoint of this config occupies, header included.
pub fn expected_file_bytes(c: &Config) -> u64 {
    let (d, h, l, kv, v) = (
        c.dim as u64,
        c.hidden_dim as u64,
        c.n_layers as u64,
        c.kv_dim() as u64,
        c.vocab_size as u64,
    );
    // validate() bounds every field, so none of these products can overflow u64.
    let per_layer = d + d * d + 2 * kv * d + d * d + d + 3 * h * d;
    let rope = c.max_seq_len as u64 * c.head_dim as u64; // cos and sin, head_dim/2 each
    let cls = if c.shared_classifier { 0 } else { v * d };
    HEADER_BYTES + 4 * (v * d + l * per_layer + d + rope + cls)
}

/// Reads a llama2.c checkpoint's config from its header, checking the file's size against it,
/// without reading any tensor.
///
/// # Errors
/// As [`load`].
pub fn read_config(path: &Path) -> Result<Config> {
    let (config, _) = open_checked(path)?;
    Ok(config)
}

/// Loads a llama2.c checkpoint.
///
/// # Errors
/// [`Error::Open`] if the file cannot be opened; [`Error::Truncated`] if it is shorter than the
/// header or than the header implies; [`Error::SizeMismatch`] if longer; [`Error::Config`] for a
/// bad header (see [`parse_header`]).
pub fn load(path: &Path) -> Result<Model> {
    let (config, file) = open_checked(path)?;
    // The tensors are used in place from a read-only map of the file, as run.c and llama.cpp do:
    // loading copies nothing, and the weights' resident pages are the file's own (shared with
    // the page cache). Every tensor a step reads is mapped in at load (`Weights::prefault`, as
    // llama.cpp's MAP_POPULATE), so the first forward pass pays no page faults; rows a run may
    // never read (embeddings of unused tokens, the unused RoPE tables) become resident only when
    // read, as in run.c.
    // SAFETY: the map is read-only and kvlab never writes the file; like every mmap-based loader
    // it assumes no other process truncates or rewrites the checkpoint while the model lives.
    let map = unsafe { memmap2::Mmap::map(&file) }.map_err(|source| Error::Io {
        path: path.into(),
        source,
    })?;
    let map = Arc::new(map);
    let c = &config;
    let (d, h, l, kv) = (c.dim, c.hidden_dim, c.n_layers, c.kv_dim());
    let mut at = TensorCursor {
        map: &map,
        byte_offset: HEADER_BYTES as usize,
    };
    let token_embedding = at.next(c.vocab_size * d)?;
    // The file stores each tensor for all layers together: (n_layers, ...) per tensor, in
    // LayerWeights::llama's order (rms_att is attn_norm, rms_ffn ffn_norm); a layer's tensor is
    // the slice of it at that layer.
    let mut per_tensor: Vec<Vec<Tensor>> = Vec::new();
    for n in [d, d * d, kv * d, kv * d, d * d, d, h * d, d * h, h * d] {
        per_tensor.push((0..l).map(|_| at.next(n)).collect::<Result<_>>()?);
    }
    let final_norm = at.next(d)?;
    // Unused RoPE tables (max_seq_len, head_dim/2) cos and sin: kvlab computes RoPE itself.
    at.skip(c.max_seq_len * c.head_dim);
    let classifier = if c.shared_classifier {
        None
    } else {
        Some(at.next(c.vocab_size * d)?)
    };
    let layers = (0..l)
        .map(|i| LayerWeights::llama(std::array::from_fn(|t| per_tensor[t][i].clone())))
        .collect();
    let model = Model::new(
        config,
        Weights {
            token_embedding,
            layers,
            final_norm,
            classifier,
        },
    )?;
    model.weights.prefault();
    Ok(model)
}

/// Walks a mapped checkpoint tensor by tensor.
struct TensorCursor<'a> {
    map: &'a Arc<memmap2::Mmap>,
    byte_offset: usize,
}

impl TensorCursor<'_> {
    /// The next `n` f32s as a tensor over the map.
    fn next(&mut self, n: usize) -> Result<Tensor> {
        // open_checked compared the file's size with the header's, so every tensor is in range.
        let t = Tensor::from_map(self.map, self.byte_offset, n).ok_or_else(|| {
            Error::Format(format!(
                "a tensor of {n} f32s at byte {} runs past the file",
                self.byte_offset
            ))
        })?;
        self.skip(n);
        Ok(t)
    }

    /// Steps over `n` f32s.
    fn skip(&mut self, n: usize) {
        self.byte_offset += 4 * n;
    }
}

/// Opens a checkpoint, reads and validates its header and checks the file's size against it;
/// returns the config and a reader positioned at the first tensor.
fn open_checked(path: &Path) -> Result<(Config, File)> {
    let file = File::open(path).map_err(|source| Error::Open {
        path: path.into(),
        source,
    })?;
    let io = |source| Error::Io {
        path: path.into(),
        source,
    };
    let meta = file.metadata().map_err(io)?;
    if !meta.is_file() {
        return Err(Error::Format(format!(
            "{} is not a regular file (a directory or a device); pass a checkpoint file",
            path.display()
        )));
    }
    let len = meta.len();
    if len < HEADER_BYTES {
        return Err(Error::Truncated {
            path: path.into(),
            what: "the 28-byte header",
            needed: HEADER_BYTES,
            actual: len,
        });
    }
    let mut head = [0u8; HEADER_BYTES as usize];
    (&file).read_exact(&mut head).map_err(io)?;
    let mut header = [0i32; 7];
    for (h, b) in header.iter_mut().zip(head.chunks_exact(4)) {
        *h = i32::from_le_bytes([b[0], b[1], b[2], b[3]]);
    }
    let config = parse_header(header)?;
    let expected = expected_file_bytes(&config);
    if len < expected {
        return Err(Error::Truncated {
            path: path.into(),
            what: "the tensors its header announces",
            needed: expected,
            actual: len,
        });
    }
    if len > expected {
        return Err(Error::SizeMismatch {
            path: path.into(),
            expected,
            actual: len,
        });
    }
    Ok((config, file))
}

/// Writes a model in llama2.c's legacy format, so run.c (or any llama2.c port) can run the same
/// weights. Only plain Llama models can be written (no QK-norm, post-norms, GeGLU, windows, NEOX
/// RoPE, or head_dim ≠ dim/n_heads).
///
/// # Errors
/// [`Error::Format`] for a model the format cannot express; [`Error::Io`] on write failure.
pub fn write(model: &Model, path: &Path) -> Result<()> {
    let c = &model.config;
    if *c != c.plain_llama_of_same_shape() {
        return Err(Error::Format(
            "llama2.c's format only holds plain Llama models (Config::llama)".into(),
        ));
    }
    let io = |source| Error::Io {
        path: path.into(),
        source,
    };
    let mut out = std::io::BufWriter::new(File::create(path).map_err(io)?);
    let vocab = if c.shared_classifier {
        c.vocab_size as i32
    } else {
        -(c.vocab_size as i32)
    };
    let header = [
        c.dim as i32,
        c.hidden_dim as i32,
        c.n_layers as i32,
        c.n_heads as i32,
        c.n_kv_heads as i32,
        vocab,
        c.max_seq_len as i32,
    ];
    let mut bytes: Vec<u8> = header.iter().flat_map(|v| v.to_le_bytes()).collect();
    let w = &model.weights;
    let mut put = |t: &[f32]| bytes.extend(t.iter().flat_map(|v| v.to_le_bytes()));
    put(&w.token_embedding);
    let fields: [fn(&LayerWeights) -> &[f32]; 9] = [
        |l| &l.attn_norm,
        |l| &l.wq,
        |l| &l.wk,
        |l| &l.wv,
        |l| &l.wo,
        |l| &l.ffn_norm,
        |l| &l.w1,
        |l| &l.w2,
        |l| &l.w3,
    ];
    for field in fields {
        for l in &w.layers {
            put(field(l));
        }
    }
    put(&w.final_norm);
    // The RoPE tables run.c skips, written as export.py writes them: cos then sin of pos·freq.
    let half = c.head_dim / 2;
    let angle =
        |p: usize, i: usize| p as f32 * c.rope_theta.powf(-((2 * i) as f32) / c.head_dim as f32);
    let (sin, cos): (Vec<f32>, Vec<f32>) = (0..c.max_seq_len)
        .flat_map(|p| (0..half).map(move |i| angle(p, i).sin_cos()))
        .unzip();
    put(&cos);
    put(&sin);
    if let Some(cls) = &w.classifier {
        put(cls);
    }
    out.write_all(&bytes).map_err(io)?;
    out.flush().map_err(io)
}

//! The models a run measures, loaded with the context it measures them at, and the arithmetic of
//! one decode step on them (the bytes that must move and the FLOPs), for the roofline.

use std::sync::Arc;
use std::time::Instant;

use anyhow::{Context, Result, bail};
use kvlab_model::registry::{self, Format};
use kvlab_model::{Config, Model};
use serde::{Deserialize, Serialize};

/// What a run records about a model.
#[derive(Clone, Debug, Serialize, Deserialize)]
pub struct ModelInfo {
    pub name: String,
    /// "llama2c" (real trained weights) or "synthetic" (seeded random weights of the shape).
    pub format: String,
    /// Positions the benchmark runs to (the sequences' max_seq_len).
    pub context: usize,
    /// The model's own max_seq_len. A synthetic shape may be run at a longer context (RoPE has
    /// no trained length limit and the weights are random anyway); a real checkpoint never is.
    pub native_context: usize,
    pub dim: usize,
    pub hidden_dim: usize,
    pub n_layers: usize,
    pub n_heads: usize,
    pub n_kv_heads: usize,
    pub head_dim: usize,
    pub vocab_size: usize,
    pub n_params: usize,
    /// Bytes of the f32 weights in memory.
    pub weight_bytes: u64,
    /// 2 × n_layers × n_kv_heads × head_dim × 4 bytes (f32).
    pub kv_bytes_per_token: u64,
    /// Seconds spent loading or generating the weights.
    pub load_seconds: f64,
}

/// A loaded model and its info.
pub struct BenchModel {
    pub info: ModelInfo,
    pub model: Arc<Model>,
}

/// Loads `name` from fixtures/models.json for a run to `context` positions (`None`: the model's
/// own). Returns `Ok(None)` with the reason when a real checkpoint's file is missing.
pub fn load(name: &str, context: Option<usize>) -> Result<std::result::Result<BenchModel, String>> {
    let t = Instant::now();
    let entry = registry::entry(name).with_context(|| {
        let names: Vec<&str> = registry::manifest()
            .models
            .iter()
            .map(|m| m.name.as_str())
            .collect();
        format!(
            "no model called {name:?} in fixtures/models.json; known: {}",
            names.join(", ")
        )
    })?;
    let (mut model, native, format) = match entry.format {
        // A synthetic model needs no file (its tokenizer is not used: the bench feeds token ids).
        Format::Synthetic => {
            let mut spec = entry
                .synthetic
                .clone()
                .context("synthetic entry without a spec")?;
            let native = spec.max_seq_len;
            if let Some(c) = context {
                spec.max_seq_len = c;
            }
            (spec.build()?, native, "synthetic")
        }
        Format::Llama2c => {
            let path = match crate::verify::locate(name)? {
                Ok((Some(p), _)) => p,
                Ok((None, _)) => bail!("{name} has no model file"),
                Err(why) => return Ok(Err(why)),
            };
            let (m, _) = registry::load_llama2c(&path, None)?;
            let native = m.config.max_seq_len;
            (m, native, "llama2c")
        }
        Format::Gguf | Format::Hf => {
            bail!("{name}: GGUF and Hugging Face models are not benchmarked yet")
        }
    };
    if let Some(c) = context {
        if format == "llama2c" && c > native {
            bail!("{name} was trained to {native} positions; the bench does not run it to {c}");
        }
        model.config.max_seq_len = c;
    }
    let c = &model.config;
    let info = ModelInfo {
        name: name.to_string(),
        format: format.into(),
        context: c.max_seq_len,
        native_context: native,
        dim: c.dim,
        hidden_dim: c.hidden_dim,
        n_layers: c.n_layers,
        n_heads: c.n_heads,
        n_kv_heads: c.n_kv_heads,
        head_dim: c.head_dim,
        vocab_size: c.vocab_size,
        n_params: c.n_params(),
        weight_bytes: model.weights.bytes() as u64,
        kv_bytes_per_token: c.kv_bytes_per_token(4) as u64,
        load_seconds: t.elapsed().as_secs_f64(),
    };
    Ok(Ok(BenchModel {
        info,
        model: Arc::new(model),
    }))
}

/// Parameters of every weight matrix a decode step multiplies by (per-layer projections and
/// FFN, and the classifier): the GEMV weights, excluding the norms' gains and the embedding
/// table, of which a step reads one row.
pub fn matmul_params(c: &Config) -> u64 {
    let (d, h, q, kv) = (c.dim, c.hidden_dim, c.q_dim(), c.kv_dim());
    let layer = d * q + 2 * kv * d + q * d + 3 * h * d;
    (c.n_layers * layer + c.vocab_size * d) as u64
}

/// Bytes a decode step at position `pos` (0-based) must move at least, f32:
/// every weight it uses read once (the projections, FFN and classifier, the norms' gains, and
/// one embedding row) + the cache's keys and values of positions `0..=pos` read once
/// (kv_bytes_per_token × (pos + 1)). Activations are tiny and ignored.
pub fn decode_bytes(c: &Config, pos: usize) -> u64 {
    let norms = (c.n_layers * 2 * c.dim + c.dim) as u64;
    let weights = 4 * (matmul_params(c) + norms + c.dim as u64);
    weights + c.kv_bytes_per_token(4) as u64 * (pos as u64 + 1)
}

/// FLOPs of a decode step at position `pos`: 2 per weight of every GEMV, plus attention's
/// q·k and the weighted sum of v, 2 × head_dim FLOPs each per query head and visible key:
/// 4 × n_heads × head_dim × (pos + 1) per layer. Norms, RoPE and softmax are ignored (O(dim)).
pub fn decode_flops(c: &Config, pos: usize) -> u64 {
    let attn = 4 * c.n_heads * c.head_dim * (pos + 1) * c.n_layers;
    2 * matmul_params(c) + attn as u64
}

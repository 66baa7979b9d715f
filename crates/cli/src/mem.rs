//! `kvlab mem`: the KV-cache memory calculator.
//!
//! bytes per token = 2 (K and V) × n_layers × n_kv_heads × head_dim × bytes per element
//! (sliding-window layers keep at most `window` positions). Presets carry each model's published
//! config and where it comes from.

use anyhow::{Result, bail};
use clap::Args as ClapArgs;

use kvlab_cli::args::{self, usize_in};
use kvlab_cli::human_bytes as bytes;

/// A model's KV-relevant shape.
#[derive(Clone, Debug, Default)]
pub struct Shape {
    pub name: &'static str,
    pub n_layers: usize,
    pub n_heads: usize,
    pub n_kv_heads: usize,
    pub head_dim: usize,
    /// (window, number of layers using it): sliding-window layers.
    pub window: Option<(usize, usize)>,
    pub max_context: usize,
    /// Parameters, for the weight footprint.
    pub params: f64,
    /// Where the numbers come from.
    pub source: &'static str,
}

/// Well-known models, from their published configs.
pub const PRESETS: &[Shape] = &[
    Shape {
        name: "llama-2-7b",
        n_layers: 32,
        n_heads: 32,
        n_kv_heads: 32,
        head_dim: 128,
        window: None,
        max_context: 4096,
        params: 6.74e9,
        source: "meta-llama/Llama-2-7b-hf config.json: hidden_size 4096, num_hidden_layers 32, num_attention_heads 32, num_key_value_heads 32, max_position_embeddings 4096",
    },
    Shape {
        name: "llama-2-70b",
        n_layers: 80,
        n_heads: 64,
        n_kv_heads: 8,
        head_dim: 128,
        window: None,
        max_context: 4096,
        params: 68.98e9,
        source: "meta-llama/Llama-2-70b-hf config.json: hidden_size 8192, num_hidden_layers 80, num_attention_heads 64, num_key_value_heads 8",
    },
    Shape {
        name: "llama-3-8b",
        n_layers: 32,
        n_heads: 32,
        n_kv_heads: 8,
        head_dim: 128,
        window: None,
        max_context: 8192,
        params: 8.03e9,
        source: "meta-llama/Meta-Llama-3-8B config.json: hidden_size 4096, num_hidden_layers 32, num_attention_heads 32, num_key_value_heads 8, max_position_embeddings 8192",
    },
    Shape {
        name: "llama-3.1-70b",
        n_layers: 80,
        n_heads: 64,
        n_kv_heads: 8,
        head_dim: 128,
        window: None,
        max_context: 131072,
        params: 70.55e9,
        source: "meta-llama/Llama-3.1-70B config.json: hidden_size 8192, num_hidden_layers 80, num_attention_heads 64, num_key_value_heads 8, max_position_embeddings 131072",
    },
    Shape {
        name: "mistral-7b",
        n_layers: 32,
        n_heads: 32,
        n_kv_heads: 8,
        head_dim: 128,
        window: Some((4096, 32)),
        max_context: 32768,
        params: 7.24e9,
        source: "mistralai/Mistral-7B-v0.1 config.json: hidden_size 4096, num_hidden_layers 32, num_attention_heads 32, num_key_value_heads 8, sliding_window 4096, max_position_embeddings 32768",
    },
    Shape {
        name: "qwen2.5-7b",
        n_layers: 28,
        n_heads: 28,
        n_kv_heads: 4,
        head_dim: 128,
        window: None,
        max_context: 32768,
        params: 7.61e9,
        source: "Qwen/Qwen2.5-7B config.json: hidden_size 3584, num_hidden_layers 28, num_attention_heads 28, num_key_value_heads 4, max_position_embeddings 32768, use_sliding_window false",
    },
    Shape {
        name: "qwen3-8b",
        n_layers: 36,
        n_heads: 32,
        n_kv_heads: 8,
        head_dim: 128,
        window: None,
        max_context: 40960,
        params: 8.19e9,
        source: "Qwen/Qwen3-8B config.json: hidden_size 4096, num_hidden_layers 36, num_attention_heads 32, num_key_value_heads 8, head_dim 128, max_position_embeddings 40960",
    },
    Shape {
        name: "gemma-3-270m",
        n_layers: 18,
        n_heads: 4,
        n_kv_heads: 1,
        head_dim: 256,
        window: Some((512, 15)),
        max_context: 32768,
        params: 268e6,
        source: "google/gemma-3-270m config.json / the GGUF metadata: 18 layers, 4 heads, 1 KV head, head_dim 256, sliding_window 512 on 15 of 18 layers (every sixth layer global), context 32768",
    },
    Shape {
        name: "stories260K",
        n_layers: 5,
        n_heads: 8,
        n_kv_heads: 4,
        head_dim: 8,
        window: None,
        max_context: 512,
        params: 260e3,
        source: "the stories260K.bin header (karpathy/tinyllamas): dim 64, 5 layers, 8 heads, 4 KV heads, seq_len 512",
    },
    Shape {
        name: "stories15M",
        n_layers: 6,
        n_heads: 6,
        n_kv_heads: 6,
        head_dim: 48,
        window: None,
        max_context: 256,
        params: 15.2e6,
        source: "llama2.c's stories15M: dim 288, 6 layers, 6 heads, seq_len 256 (the stories15M-shape fixture)",
    },
];

/// Bytes per KV element of a precision name at `head_dim`. A `--kv-dtype` name (f32, f16,
/// bf16, fp8-e4m3, int8, int4) is what kvlab's caches really take, scales included
/// (`KvDtype::kv_head_bytes` over 2 × head_dim elements: int8 at head_dim 128 is 132/128 bytes,
/// int4 with key groups of 32 tokens 192/256); the other names are nominal: fp8 as vLLM stores
/// it (one scale per tensor, so 1 byte), q8, q4 (0.5 bytes).
pub fn kv_dtype_bytes(dtype: &str, head_dim: usize) -> Result<f64> {
    match dtype.parse::<kvlab_model::KvDtype>() {
        Ok(d) => {
            let g = d.group(kvlab_model::KvDtype::INT4_GROUP);
            Ok(d.kv_head_bytes(head_dim, g, g) as f64 / (2 * head_dim * g) as f64)
        }
        Err(_) => dtype_bytes(dtype),
    }
}

/// Bytes per element of a precision name, nominal (no scales).
pub fn dtype_bytes(dtype: &str) -> Result<f64> {
    Ok(match dtype {
        "f32" | "fp32" => 4.0,
        "f16" | "fp16" | "bf16" => 2.0,
        "fp8" | "fp8-e4m3" | "int8" | "q8" => 1.0,
        "int4" | "q4" => 0.5,
        other => {
            bail!(
                "unknown precision {other:?}; use f32, f16, bf16, fp8-e4m3, int8, int4, fp8, q8 or q4"
            )
        }
    })
}

impl Shape {
    /// KV bytes per token with every layer counted: 2 × n_layers × n_kv_heads × head_dim × b.
    pub fn bytes_per_token(&self, b: f64) -> f64 {
        2.0 * self.n_layers as f64 * self.n_kv_heads as f64 * self.head_dim as f64 * b
    }

    /// KV bytes of one sequence of `tokens` positions; sliding-window layers keep at most
    /// `window` of them.
    pub fn bytes_per_sequence(&self, tokens: usize, b: f64) -> f64 {
        let per_layer_token = 2.0 * self.n_kv_heads as f64 * self.head_dim as f64 * b;
        let (local_layers, kept) = match self.window {
            Some((w, n)) => (n, tokens.min(w)),
            None => (0, 0),
        };
        per_layer_token * ((self.n_layers - local_layers) * tokens + local_layers * kept) as f64
    }
}

#[derive(ClapArgs)]
pub struct Args {
    /// A preset (see --list) or a model of fixtures/models.json. (No -p: across kvlab, -p is
    /// the prompt, as in llama.cpp.)
    #[arg(long)]
    preset: Option<String>,
    /// List the presets and their sources.
    #[arg(long)]
    list: bool,
    /// Transformer layers, each with its own keys and values (overrides the preset's).
    #[arg(long, value_parser = usize_in(1, MAX_LAYERS))]
    n_layers: Option<usize>,
    /// KV heads per layer: n_heads for MHA, fewer for GQA, 1 for MQA (overrides the preset's).
    #[arg(long, value_parser = usize_in(1, MAX_HEADS))]
    n_kv_heads: Option<usize>,
    /// Channels per head (overrides the preset's).
    #[arg(long, value_parser = usize_in(1, MAX_HEAD_DIM))]
    head_dim: Option<usize>,
    /// Sliding window: positions kept by local layers.
    #[arg(long, value_parser = usize_in(1, MAX_CONTEXT))]
    window: Option<usize>,
    /// How many layers use the sliding window (default: all, with --window).
    #[arg(long, value_parser = usize_in(0, MAX_LAYERS))]
    local_layers: Option<usize>,
    /// KV precision: f32, f16, bf16, fp8-e4m3, int8 or int4 as `--kv-dtype` stores them (the
    /// 8-bit ones with a 4-byte scale per token and KV head, int4 with KIVI's scales), or
    /// nominal: fp8 (vLLM's, one scale per tensor: 1 byte), q8 (1 byte), q4 (0.5 bytes).
    #[arg(long, default_value = "f16")]
    dtype: String,
    /// Tokens per sequence (default: the preset's context).
    #[arg(long, short = 'c', visible_alias = "ctx-size", value_parser = usize_in(1, MAX_CONTEXT))]
    context: Option<usize>,
    /// Sequences in the batch.
    #[arg(long, short, default_value_t = 1, value_parser = usize_in(1, MAX_BATCH))]
    batch: usize,
    /// Device memory in GiB: prints how many sequences fit.
    #[arg(long, value_parser = args::gib)]
    device_gib: Option<f64>,
    /// Weight memory in GiB (default: the preset's parameters at --weights-dtype).
    #[arg(long, value_parser = args::gib_or_zero)]
    weights_gib: Option<f64>,
    /// Weight precision, for the weight memory: bytes per parameter of f32 (4), f16 or bf16 (2),
    /// fp8/int8/q8 (1) or int4/q4 (0.5), without scales.
    #[arg(long, default_value = "f16")]
    weights_dtype: String,
    /// Average tokens a sequence really holds, for the paging estimate (default: half the context).
    #[arg(long, value_parser = usize_in(1, MAX_CONTEXT))]
    avg_tokens: Option<usize>,
    /// Token slots per block, for the paging estimate.
    #[arg(long, default_value_t = 16, value_parser = usize_in(1, args::MAX_BLOCK_SIZE))]
    block_size: usize,
    /// Print JSON instead of text.
    #[arg(long)]
    json: bool,
}

// Bounds of the calculator's inputs: generous for any published model, small enough that every
// product stays exact or at least finite in f64 (2^80 bytes at most), so nothing wraps or turns
// NaN.
const MAX_LAYERS: u64 = 1 << 12;
const MAX_HEADS: u64 = 1 << 12;
const MAX_HEAD_DIM: u64 = 1 << 14;
const MAX_CONTEXT: u64 = 1 << 30;
const MAX_BATCH: u64 = 1 << 20;

fn preset(name: &str) -> Result<Shape> {
    if let Some(p) = PRESETS.iter().find(|p| p.name.eq_ignore_ascii_case(name)) {
        return Ok(p.clone());
    }
    if let Some(e) = kvlab_model::registry::entry(name).and_then(|e| e.synthetic.as_ref()) {
        return Ok(Shape {
            name: "fixture",
            n_layers: e.n_layers,
            n_heads: e.n_heads,
            n_kv_heads: e.n_kv_heads,
            head_dim: e.dim / e.n_heads,
            window: None,
            max_context: e.max_seq_len,
            params: e.config().n_params() as f64,
            source: "fixtures/models.json (synthetic spec)",
        });
    }
    let names: Vec<&str> = PRESETS.iter().map(|p| p.name).collect();
    bail!(
        "no preset {name:?}; presets: {} (or a synthetic model of fixtures/models.json)",
        names.join(", ")
    )
}

pub fn run(a: Args) -> Result<()> {
    if a.list {
        for p in PRESETS {
            println!("{:<14} {}", p.name, p.source);
        }
        return Ok(());
    }
    let mut s = match &a.preset {
        Some(p) => preset(p)?,
        None => Shape {
            name: "custom",
            source: "command-line flags",
            ..Shape::default()
        },
    };
    s.n_layers = a.n_layers.unwrap_or(s.n_layers);
    s.n_kv_heads = a.n_kv_heads.unwrap_or(s.n_kv_heads);
    s.head_dim = a.head_dim.unwrap_or(s.head_dim);
    if let Some(w) = a.window {
        s.window = Some((w, a.local_layers.unwrap_or(s.n_layers)));
    }
    if s.n_layers == 0 || s.n_kv_heads == 0 || s.head_dim == 0 {
        bail!("give --preset NAME, or all of --n-layers, --n-kv-heads and --head-dim");
    }
    if s.window.is_some_and(|(_, n)| n > s.n_layers) {
        bail!("--local-layers cannot exceed --n-layers");
    }
    let b = kv_dtype_bytes(&a.dtype, s.head_dim)?;
    let ctx = a.context.unwrap_or(s.max_context);
    if ctx == 0 {
        bail!("give --context N (tokens per sequence)");
    }
    let per_token = s.bytes_per_token(b);
    let per_seq = s.bytes_per_sequence(ctx, b);
    let fit = fit(&a, &s, b, ctx, per_seq)?;
    if a.json {
        let v = serde_json::json!({
            "model": s.name,
            "source": s.source,
            "n_layers": s.n_layers,
            "n_heads": s.n_heads,
            "n_kv_heads": s.n_kv_heads,
            "head_dim": s.head_dim,
            "window": s.window.map(|(w, n)| serde_json::json!({"positions": w, "layers": n})),
            "dtype": a.dtype,
            "bytes_per_element": b,
            "context": ctx,
            "batch": a.batch,
            "bytes_per_token": per_token,
            "bytes_per_sequence": per_seq,
            "bytes_per_batch": per_seq * a.batch as f64,
            "device": fit,
        });
        println!("{}", serde_json::to_string_pretty(&v)?);
        return Ok(());
    }
    println!("model          {} ({})", s.name, s.source);
    let attn = match (s.n_heads, s.n_kv_heads) {
        (0, _) => String::new(),
        (h, kv) if h == kv => " (MHA)".into(),
        (h, 1) => format!(" (MQA: {h} query heads share 1 KV head)"),
        (h, kv) => format!(
            " (GQA: {h} query heads, {}× fewer KV heads than MHA)",
            h / kv
        ),
    };
    println!(
        "shape          n_layers {} × n_kv_heads {} × head_dim {}{attn}{}",
        s.n_layers,
        s.n_kv_heads,
        s.head_dim,
        s.window.map_or(String::new(), |(w, n)| format!(
            ", {n} layers with a {w}-token window"
        ))
    );
    println!("precision      {} ({b} bytes per element)", a.dtype);
    println!(
        "per token      2 × {} × {} × {} × {b} = {}",
        s.n_layers,
        s.n_kv_heads,
        s.head_dim,
        bytes(per_token)
    );
    println!(
        "per sequence   {} at {ctx} tokens{}",
        bytes(per_seq),
        s.window.map_or(String::new(), |_| format!(
            " (every layer keeping all: {})",
            bytes(per_token * ctx as f64)
        ))
    );
    println!(
        "per batch      {} for {} sequences",
        bytes(per_seq * a.batch as f64),
        a.batch
    );
    if let Some(f) = &fit {
        println!(
            "device         {} GiB, weights {} → {} left for the KV cache",
            f.device_gib,
            bytes(f.weights_bytes),
            bytes(f.free_bytes)
        );
        if f.free_bytes <= 0.0 {
            println!("               the weights alone do not fit");
            return Ok(());
        }
        println!(
            "fits           {} sequences with max-length preallocation ({ctx} tokens reserved each)",
            f.sequences_max_length
        );
        println!(
            "               {} sequences with paging (block_size {}, {} tokens held on average)",
            f.sequences_paged, a.block_size, f.avg_tokens
        );
    }
    Ok(())
}

/// How many sequences fit on a device (`--device-gib`).
#[derive(serde::Serialize)]
struct Fit {
    device_gib: f64,
    weights_bytes: f64,
    /// Device memory left for the KV cache (0 when the weights do not fit).
    free_bytes: f64,
    avg_tokens: usize,
    sequences_max_length: f64,
    sequences_paged: f64,
}

fn fit(a: &Args, s: &Shape, b: f64, ctx: usize, per_seq: f64) -> Result<Option<Fit>> {
    let Some(dev) = a.device_gib else {
        return Ok(None);
    };
    let weights = a
        .weights_gib
        .map(|g| g * GIB)
        .unwrap_or(s.params * dtype_bytes(&a.weights_dtype)?);
    let free = (dev * GIB - weights).max(0.0);
    let avg = a.avg_tokens.unwrap_or(ctx / 2).max(1);
    let paged_seq = s.bytes_per_sequence(avg.div_ceil(a.block_size) * a.block_size, b);
    Ok(Some(Fit {
        device_gib: dev,
        weights_bytes: weights,
        free_bytes: free,
        avg_tokens: avg,
        sequences_max_length: (free / per_seq).floor(),
        sequences_paged: (free / paged_seq).floor(),
    }))
}

const GIB: f64 = 1024.0 * 1024.0 * 1024.0;

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn presets_reproduce_the_formula() {
        for p in PRESETS {
            let manual = 2 * p.n_layers * p.n_kv_heads * p.head_dim * 2;
            assert_eq!(p.bytes_per_token(2.0) as usize, manual, "{}", p.name);
            if p.window.is_none() {
                assert_eq!(
                    p.bytes_per_sequence(1000, 2.0) as usize,
                    manual * 1000,
                    "{}",
                    p.name
                );
            }
        }
        let l = |n: &str| PRESETS.iter().find(|p| p.name == n).unwrap().clone();
        // Llama 3.1 70B: 327,680 bytes per token at f16.
        assert_eq!(l("llama-3.1-70b").bytes_per_token(2.0), 327_680.0);
        // Llama 3 8B: 131,072 bytes per token at f16.
        assert_eq!(l("llama-3-8b").bytes_per_token(2.0), 131_072.0);
        // Gemma 3 270M keeps 3 global layers × 8192 + 15 local × 512 positions at 8,192 tokens.
        assert_eq!(
            l("gemma-3-270m").bytes_per_sequence(8192, 4.0),
            (2 * 256 * 4 * (3 * 8192 + 15 * 512)) as f64
        );
    }

    #[test]
    fn gemma_preset_matches_the_real_config() {
        // Same numbers as Config::kv_bytes_windowed on the loaded GGUF (checked in the Gemma tests).
        let g = PRESETS.iter().find(|p| p.name == "gemma-3-270m").unwrap();
        assert_eq!(g.bytes_per_token(4.0), 36_864.0);
    }
}

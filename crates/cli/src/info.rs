//! `kvlab info`: a model's config and what its KV cache costs, read from the spec or the file's
//! header without building the weights.

use anyhow::Result;
use kvlab_model::KvDtype;

use crate::{ModelArgs, bytes};

#[derive(clap::Args)]
pub struct Args {
    #[command(flatten)]
    model: ModelArgs,
    /// Print JSON (the config, its files and KV bytes) instead of text.
    #[arg(long)]
    json: bool,
}

pub fn run(a: &Args) -> Result<()> {
    let m = &a.model;
    // The config only: an 8B synthetic shape must not build 32 GB of weights to print its shape.
    let (name, config, files) =
        kvlab_cli::fetch::config(&m.model, m.tokenizer.as_deref(), !m.offline)?;
    let c = &config;
    if a.json {
        let v = serde_json::json!({
            "model": name,
            "architecture": c.architecture(),
            "files": files,
            "config": c,
            "n_params": c.n_params(),
            "kv_bytes_per_token_f32": c.kv_bytes_per_token(4),
            "kv_bytes_per_token_f16": c.kv_bytes_per_token(2),
            "kv_bytes_per_token": kvlab_model::KvDtype::ALL
                .map(|d| (d.name(), d.bytes_per_token(c)))
                .into_iter()
                .collect::<std::collections::BTreeMap<_, _>>(),
            "kv_bytes_full_context_f32": c.kv_bytes_full(c.max_seq_len, 4),
            "kv_bytes_windowed_full_context_f32": c.kv_bytes_windowed(c.max_seq_len, 4),
        });
        println!("{}", serde_json::to_string_pretty(&v)?);
        return Ok(());
    }
    println!("model        {name}");
    for f in &files {
        println!("file         {}", f.display());
    }
    println!("architecture {}", c.architecture());
    println!("dim          {}", c.dim);
    println!("hidden_dim   {}", c.hidden_dim);
    println!("n_layers     {}", c.n_layers);
    println!("n_heads      {}", c.n_heads);
    println!(
        "n_kv_heads   {} ({})",
        c.n_kv_heads,
        match c.kv_mul() {
            1 => "MHA".to_string(),
            g if c.n_kv_heads == 1 => format!("MQA, {g} query heads share it"),
            g => format!("GQA, {g} query heads per KV head"),
        }
    );
    println!("head_dim     {}", c.head_dim);
    println!("kv_dim       {}", c.kv_dim());
    println!("vocab_size   {}", c.vocab_size);
    println!("max_seq_len  {}", c.max_seq_len);
    let windows: Vec<usize> = c.layer_kinds.iter().filter_map(|k| k.window()).collect();
    if !windows.is_empty() {
        println!(
            "rope         {:?}, theta {} (local layers {})",
            c.rope_layout, c.rope_theta, c.rope_theta_local
        );
    } else {
        println!("rope         {:?}, theta {}", c.rope_layout, c.rope_theta);
    }
    println!("activation   {:?}", c.activation);
    if let Some(w) = windows.first() {
        println!(
            "layers       {} global, {} sliding-window ({w} positions)",
            c.n_layers - windows.len(),
            windows.len()
        );
    }
    println!(
        "classifier   {}",
        if c.shared_classifier {
            "shared with the embedding"
        } else {
            "unshared"
        }
    );
    println!(
        "parameters   {} ({} as f32)",
        c.n_params(),
        bytes(c.n_params().saturating_mul(4))
    );
    weights_line(c, &files)?;
    println!();
    println!(
        "KV bytes per token = 2 x n_layers x n_kv_heads x head_dim x bytes per element (--kv-dtype; fp8-e4m3 and int8 add a 4-byte scale per KV head; int4 packs two codes per byte, with an 8-byte scale and minimum per key channel per 32 tokens and per 32 value channels)"
    );
    for d in kvlab_model::KvDtype::ALL {
        let hd = c.head_dim;
        let per_head = match d {
            KvDtype::Fp8E4m3 | KvDtype::Int8 => format!("({hd} x 1 + 4)"),
            KvDtype::Int4 => format!(
                "({hd} x 0.5 + ({hd} x 8 / {} + {} x 8) / 2)",
                KvDtype::INT4_GROUP,
                hd.div_ceil(KvDtype::INT4_VALUE_GROUP)
            ),
            _ => format!("{hd} x {}", d.value_bytes(1, 1)),
        };
        println!(
            "  {}: 2 x {} x {} x {per_head} = {}",
            d.name(),
            c.n_layers,
            c.n_kv_heads,
            bytes(d.bytes_per_token(c))
        );
    }
    println!();
    println!(
        "{:>10}  {:>28}  {:>28}",
        "positions", "every layer keeps all (f32)", "windows as ring buffers (f32)"
    );
    let mut ctxs = vec![512, 2048, 8192, c.max_seq_len];
    ctxs.retain(|&n| n <= c.max_seq_len);
    ctxs.dedup();
    for n in ctxs {
        println!(
            "{n:>10}  {:>28}  {:>28}",
            bytes(c.kv_bytes_full(n, 4)),
            bytes(c.kv_bytes_windowed(n, 4))
        );
    }
    Ok(())
}

/// What the weights take in each `--weights` format: as stored (a GGUF's blocks, read from its
/// header), f32, and bf16/f16 (matrices at 2 B per parameter, norm gains kept at 4 B).
fn weights_line(c: &kvlab_model::Config, files: &[std::path::PathBuf]) -> Result<()> {
    let (d, q, kv, h) = (c.dim, c.q_dim(), c.kv_dim(), c.hidden_dim);
    let classifiers = if c.shared_classifier { 1 } else { 2 };
    let matrices =
        c.n_layers * (2 * q * d + 2 * kv * d + 3 * h * d) + classifiers * c.vocab_size * d;
    let norms = c.n_params().saturating_sub(matrices);
    let gguf = files.iter().find(|f| {
        f.extension()
            .is_some_and(|e| e.eq_ignore_ascii_case("gguf"))
    });
    let stored = match gguf {
        Some(path) => {
            let s = kvlab_gguf::GgufFile::open(path)?.summary();
            let types: Vec<String> = s
                .by_type
                .iter()
                .map(|t| format!("{}×{}", t.n_tensors, t.ggml_type))
                .collect();
            format!("{} ({})", bytes(s.tensor_bytes as usize), types.join(" "))
        }
        None => format!("{} (f32)", bytes(4 * c.n_params())),
    };
    println!(
        "weights      stored {stored} | f32 {} | bf16/f16 {}",
        bytes(4 * c.n_params()),
        bytes(2 * matrices + 4 * norms)
    );
    Ok(())
}

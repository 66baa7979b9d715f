//! `kvlab depth`: decode speed against context depth (llama-bench's `-d`). One sequence is filled
//! with text to each depth in turn and `-n` greedy tokens are decoded there, each step timed: at
//! position `pos` a decode step reads the weights once and every cached key and value it
//! attends to (global layers: `pos` positions; sliding-window layers: at most their window), so
//! the per-token time against depth shows what a long context costs and which part of the
//! cache each model reads.
//!
//! `--fill random` skips the computing: each depth's positions get seeded random keys and
//! values (`Engine::fill_random`), so a 1B model reaches 32,768 positions in seconds rather
//! than the ~10 minutes its prefill takes on 2 cores. A decode step reads every cached row
//! whatever it holds, so its time is the same; its tokens are not a continuation of any text.

use std::io::Write;
use std::sync::Arc;
use std::time::Instant;

use anyhow::{Context, Result, bail};
use kvlab_cli::args::{MAX_POSITIONS, usize_in};
use kvlab_engines::{self as engines, EngineKind};
use kvlab_model::{Config, KvDtype};

use kvlab_cli::fill::{FILL_TEXT, Fill};

use crate::KvArgs;

#[derive(clap::Args)]
pub struct Args {
    #[command(flatten)]
    run: crate::RunArgs,
    /// Depths to decode at, in positions (repeatable or comma-separated; llama-bench's -d): the
    /// `-n` decoded tokens take positions depth − n to depth − 1, so the last one sees `depth`
    /// positions. Default: 512, 1024, ... doubling up to the context.
    #[arg(long = "n-depth", short = 'd', value_delimiter = ',',
          value_parser = usize_in(2, MAX_POSITIONS))]
    depths: Vec<usize>,
    /// Greedy tokens decoded and timed at each depth (llama-bench's -n).
    #[arg(long = "n-gen", short = 'n', default_value_t = 32, value_parser = usize_in(1, 4096))]
    n_gen: usize,
    /// The text whose tokens (after BOS) are repeated to fill the context.
    #[arg(long, short = 'p', default_value = FILL_TEXT)]
    prompt: String,
    /// The engine to run.
    #[arg(long, short = 'e', default_value_t = EngineKind::Cpu,
          value_parser = engines::value_parser(&EngineKind::ALL))]
    engine: EngineKind,
    #[command(flatten)]
    kv: KvArgs,
    /// How the positions before each depth's decoded tokens are filled: `text` (prefill the
    /// text) or `random` (seeded random keys and values, no compute; engines that keep a cache
    /// in place: cpu).
    #[arg(long, value_enum, default_value_t = Fill::Text)]
    fill: Fill,
    /// Most fill tokens per forward call (llama.cpp's -ub).
    #[arg(long = "ubatch-size", visible_alias = "ubatch", default_value_t = 512,
          value_parser = usize_in(1, MAX_POSITIONS))]
    ubatch_size: usize,
    /// Print the results as one JSON object on stdout instead of a table.
    #[arg(long)]
    json: bool,
}

/// One depth's measurement.
#[derive(serde::Serialize)]
struct DepthRow {
    /// Positions seen by the last decoded token.
    depth: usize,
    /// Seconds spent filling the context from the previous depth to this one's first decode.
    fill_s: f64,
    /// Fill tokens per second of that stretch.
    fill_tokens_per_s: f64,
    /// Each decode step's wall time, ms, in order.
    step_ms: Vec<f64>,
    /// The median step, ms.
    median_step_ms: f64,
    /// n_gen ÷ the steps' total time.
    decode_tokens_per_s: f64,
    /// The greedy ids decoded.
    ids: Vec<u32>,
    /// KV bytes the last step's attention reads: every layer's cached positions, sliding
    /// windows counted at their window (`KvDtype::bytes_windowed`).
    kv_read_bytes: usize,
    /// KV bytes the cache holds after the step (the engine's count).
    kv_used_bytes: usize,
}

/// The depths to run: sorted, deduplicated, each within the context and above `n_gen`.
fn plan(depths: &[usize], n_gen: usize, max_seq_len: usize) -> Result<Vec<usize>> {
    let mut d: Vec<usize> = if depths.is_empty() {
        std::iter::successors(Some(512usize), |d| d.checked_mul(2))
            .take_while(|&d| d <= max_seq_len)
            .collect()
    } else {
        depths.to_vec()
    };
    if d.is_empty() {
        d.push(max_seq_len);
    }
    d.sort_unstable();
    d.dedup();
    if let Some(&bad) = d.iter().find(|&&x| x > max_seq_len) {
        bail!("depth {bad} is past the model's context of {max_seq_len} positions; lower -d");
    }
    if let Some(&bad) = d.iter().find(|&&x| x <= n_gen) {
        bail!(
            "depth {bad} leaves no room to fill before {n_gen} decoded tokens; raise -d or lower -n"
        );
    }
    if let Some(w) = d.windows(2).find(|w| w[1] - w[0] < n_gen) {
        bail!(
            "depths {} and {} are closer than the {n_gen} tokens decoded at each; space them out or lower -n",
            w[0],
            w[1]
        );
    }
    Ok(d)
}

/// The `k`-th fill token: BOS (`ids[0]`), then the text's other tokens over and over.
fn fill_token(ids: &[u32], k: usize) -> u32 {
    if k == 0 || ids.len() == 1 {
        ids[0]
    } else {
        ids[1 + (k - 1) % (ids.len() - 1)]
    }
}

fn median(xs: &[f64]) -> f64 {
    let mut s = xs.to_vec();
    s.sort_by(f64::total_cmp);
    let n = s.len();
    if n % 2 == 1 {
        s[n / 2]
    } else {
        (s[n / 2 - 1] + s[n / 2]) / 2.0
    }
}

pub fn run(a: Args) -> Result<()> {
    let loaded = a.run.start()?;
    let tok = crate::tokenizer_of(&loaded.tokenizer, &loaded.name)?;
    let ids = tok.encode_special(&a.prompt, true, false);
    if ids.len() < 2 {
        bail!(
            "the fill text encodes to {} token(s); give -p some words",
            ids.len()
        );
    }
    let model = Arc::new(loaded.model);
    let config: Config = model.config.clone();
    let depths = plan(&a.depths, a.n_gen, config.max_seq_len)?;
    let ctx = *depths.last().context("no depth")?;
    let kv: KvDtype = a.kv.kv_dtype;
    if a.engine.has_cache() {
        kvlab_engines::memory::ensure_fits(
            "the KV cache",
            u64::try_from(kv.bytes_windowed(&config, ctx)).ok(),
            "lower -d",
        )?;
    }
    let weight_bytes = model.weights.bytes();
    let mut engine = engines::build_for(a.engine, model, ctx, kv)?;
    let seq = engine.new_sequence(ctx)?;
    let threads = kvlab_cpu::threads::num_threads();
    if !a.json {
        eprintln!(
            "{} on {} | {threads} threads | KV {kv} | {} | {ctx} positions",
            loaded.name,
            engine.name(),
            match a.fill {
                Fill::Text => format!("{} fill tokens repeated", ids.len() - 1),
                Fill::Random => "random keys and values filled".into(),
            }
        );
    }
    let (mut pos, mut fed, mut rows) = (0usize, 0usize, Vec::new());
    let mut logits = Vec::new();
    for &depth in &depths {
        let t_fill = Instant::now();
        let start = pos;
        let mut first = None;
        if a.fill == Fill::Random && pos < depth - a.n_gen {
            let n = depth - a.n_gen - pos;
            if !engine.fill_random(seq, n, depth as u64)? {
                bail!(
                    "the {} engine cannot fill its cache without computing; use --fill text or -e cpu",
                    engine.name()
                );
            }
            // No logits came with the random positions: the first decoded token is the next
            // fill token, as if the text went on.
            first = Some(fill_token(&ids, fed + n));
            fed += n;
            pos += n;
        }
        while pos < depth - a.n_gen {
            let n = a.ubatch_size.min(depth - a.n_gen - pos);
            let chunk: Vec<u32> = (fed..fed + n).map(|k| fill_token(&ids, k)).collect();
            logits = engine.prefill(seq, &chunk)?;
            fed += n;
            pos += n;
        }
        let fill_s = t_fill.elapsed().as_secs_f64();
        let (mut step_ms, mut out) = (Vec::new(), Vec::new());
        for _ in 0..a.n_gen {
            let next = first
                .take()
                .unwrap_or_else(|| kvlab_model::sampler::argmax(&logits));
            let t = Instant::now();
            logits = engine.decode(seq, next)?;
            step_ms.push(t.elapsed().as_secs_f64() * 1e3);
            out.push(next);
            pos += 1;
        }
        let total_s: f64 = step_ms.iter().sum::<f64>() / 1e3;
        let row = DepthRow {
            depth,
            fill_s,
            fill_tokens_per_s: (depth - a.n_gen - start) as f64 / fill_s.max(1e-9),
            median_step_ms: median(&step_ms),
            decode_tokens_per_s: a.n_gen as f64 / total_s,
            step_ms,
            ids: out,
            kv_read_bytes: kv.bytes_windowed(&config, depth),
            kv_used_bytes: engine.kv_usage().used_bytes,
        };
        if !a.json {
            eprintln!(
                "depth {depth:>6}: filled {} positions in {:.1} s; decode {:.1} tok/s (median step {:.2} ms)",
                depth - a.n_gen - start,
                row.fill_s,
                row.decode_tokens_per_s,
                row.median_step_ms
            );
        }
        rows.push(row);
    }
    let usage = engine.kv_usage();
    engine.free(seq);
    let mut out = std::io::stdout().lock();
    if a.json {
        let report = serde_json::json!({
            "model": loaded.name,
            "engine": engine.name(),
            "threads": threads,
            "kv_dtype": kv,
            "n_gen": a.n_gen,
            "fill": a.fill,
            "ubatch": a.ubatch_size,
            "fill_ids": ids,
            "weight_bytes": weight_bytes,
            "kv_reserved_bytes": usage.reserved_bytes,
            "depths": rows,
        });
        writeln!(out, "{report}")?;
        return Ok(());
    }
    writeln!(
        out,
        "{:>7} | {:>12} | {:>14} | {:>13} | {:>10}",
        "depth", "decode tok/s", "median step ms", "KV read/token", "fill tok/s"
    )?;
    for r in &rows {
        writeln!(
            out,
            "{:>7} | {:>12.1} | {:>14.2} | {:>9.1} MiB | {:>10.1}",
            r.depth,
            r.decode_tokens_per_s,
            r.median_step_ms,
            r.kv_read_bytes as f64 / f64::from(1 << 20),
            r.fill_tokens_per_s
        )?;
    }
    writeln!(
        out,
        "weights {} read per token; KV cache reserved {}",
        crate::bytes(weight_bytes),
        crate::bytes(usage.reserved_bytes)
    )?;
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn depths_default_to_doublings_and_refuse_what_cannot_run() {
        assert_eq!(plan(&[], 32, 2048).unwrap(), vec![512, 1024, 2048]);
        assert_eq!(plan(&[], 32, 300).unwrap(), vec![300]);
        assert_eq!(plan(&[900, 100, 900], 32, 1000).unwrap(), vec![100, 900]);
        assert!(
            plan(&[2000], 32, 1000)
                .unwrap_err()
                .to_string()
                .contains("past")
        );
        assert!(
            plan(&[32], 32, 1000)
                .unwrap_err()
                .to_string()
                .contains("no room")
        );
        assert!(
            plan(&[100, 120], 32, 1000)
                .unwrap_err()
                .to_string()
                .contains("closer")
        );
    }

    #[test]
    fn fill_repeats_the_text_after_bos() {
        let ids = [1, 7, 8, 9];
        let got: Vec<u32> = (0..8).map(|k| fill_token(&ids, k)).collect();
        assert_eq!(got, vec![1, 7, 8, 9, 7, 8, 9, 7]);
    }
}

//! `cargo xtask kv-quality`: what storing the KV cache in f16, bf16, fp8-e4m3 or int8 costs in
//! quality and buys in memory and speed, on real checkpoints.
//!
//! Each model reads a held-out text shipped in `fixtures/text/` (written for kvlab, so no model
//! was trained on it), teacher-forced one position at a time through the cpu engine: once with
//! an f32 cache (the reference) and once per dtype, the same weights each time. Per context
//! range (positions 1–128, 129–512, 513–1,024, 1,025–2,048, as far as the text and the model's
//! context reach; Gemma 3's sliding window is 512) it reports top-1 agreement with the f32
//! cache, mean and max KL(P_f32 ‖ P_dtype) of the next-token distribution, and the perplexity
//! of the text under each; per dtype the KV bytes per token and the decode speed over the last
//! range, where the cache is longest. JSON goes to `--out`; `benches/kv_quality.json` is the
//! recorded run the README and the book quote.

use std::path::PathBuf;
use std::sync::Arc;
use std::time::Instant;

use anyhow::{Context, Result};
use indicatif::{ProgressBar, ProgressStyle};
use kvlab_cpu::CpuEngine;
use kvlab_model::{DistributionComparison, Engine, KvDtype, Model, compare_distributions};
use serde::Serialize;

use crate::bench::machine;
use crate::paths::{self, workspace_root};

/// Each real model and the held-out text it reads.
const TEXTS: [(&str, &str); 2] = [
    ("stories260K", "fixtures/text/tinystories-heldout.txt"),
    ("gemma-3-270m", "fixtures/text/english-heldout.txt"),
];

/// Upper ends of the context ranges reported (a range is cut at the text's length).
const RANGES: [usize; 4] = [128, 512, 1024, 2048];

#[derive(clap::Args)]
#[command(
    about = "Quality, memory and speed of each KV cache dtype against f32, on real checkpoints",
    after_help = "env: KVLAB_MODELS (folder of real checkpoints). A model whose files are not \
                  found is SKIPPED with the reason, or fails with KVLAB_REQUIRE_MODELS=1."
)]
pub struct Args {
    /// Models to measure (default: every one with a held-out text: stories260K, gemma-3-270m).
    #[arg(long, short = 'm')]
    model: Vec<String>,
    /// Most positions teacher-forced per model (the text and the model's context also cap it).
    #[arg(long, default_value_t = 2048, value_parser = kvlab_cli::args::usize_in(2, 1 << 20))]
    max_positions: usize,
    /// Where the JSON report goes (default: target/kvlab-bench/kv_quality.json).
    #[arg(long)]
    out: Option<PathBuf>,
}

/// One dtype's measurements on one model.
#[derive(Serialize)]
struct DtypeRow {
    kv_dtype: KvDtype,
    kv_bytes_per_token: usize,
    /// Per context range: (first position, last position, comparison with the f32 cache).
    ranges: Vec<RangeRow>,
    /// Decode steps per second over the last range.
    decode_tokens_per_s: f64,
}

#[derive(Serialize)]
struct RangeRow {
    /// Query positions 1-based, inclusive: the range's first and last.
    first: usize,
    last: usize,
    #[serde(flatten)]
    quality: DistributionComparison,
}

#[derive(Serialize)]
struct ModelReport {
    model: String,
    text: String,
    positions: usize,
    /// The f32 cache's own row (perplexity, speed) comes first.
    dtypes: Vec<DtypeRow>,
}

#[derive(Serialize)]
struct Report {
    machine: machine::Machine,
    threads: usize,
    models: Vec<ModelReport>,
}

/// `cargo xtask kv-quality` with its parsed options: the table and kv_quality.json.
///
/// # Errors
/// A model that fails to load or run, a missing model under `KVLAB_REQUIRE_MODELS=1`, an
/// unreadable held-out text or an unwritable report.
pub fn run(a: Args) -> Result<()> {
    let mut models = Vec::new();
    for (name, text) in TEXTS {
        if !a.model.is_empty() && !a.model.iter().any(|m| m == name) {
            continue;
        }
        let loaded = match kvlab_cli::fetch::load(name, None, false) {
            Ok(l) => l,
            Err(e) if std::env::var("KVLAB_REQUIRE_MODELS").is_ok_and(|v| v == "1") => {
                return Err(e.context(format!(
                    "KVLAB_REQUIRE_MODELS=1 and {name} is missing; set KVLAB_MODELS to the folder holding it"
                )));
            }
            Err(e) => {
                eprintln!("SKIPPED {name}: {e:#}");
                continue;
            }
        };
        let tok = loaded.tokenizer.context("the model has no tokenizer")?;
        let text_path = workspace_root().join(text);
        let body = std::fs::read_to_string(&text_path)
            .with_context(|| format!("reading {}", text_path.display()))?;
        let mut ids = tok.encode_special(&body, true, false);
        let model = Arc::new(loaded.model);
        ids.truncate(a.max_positions.min(model.config.max_seq_len));
        models.push(measure(name, text, &model, &ids)?);
    }
    if models.is_empty() {
        anyhow::bail!(
            "no model was measured: set KVLAB_MODELS to the folder holding the checkpoints"
        );
    }
    let report = Report {
        machine: machine::detect(),
        threads: kvlab_cpu::threads::num_threads(),
        models,
    };
    print_tables(&report);
    let out = a
        .out
        .unwrap_or_else(|| paths::bench_out().join("kv_quality.json"));
    if let Some(dir) = out.parent() {
        std::fs::create_dir_all(dir)?;
    }
    std::fs::write(&out, serde_json::to_string_pretty(&report)? + "\n")?;
    eprintln!("wrote {}", out.display());
    Ok(())
}

/// Every dtype on one model: the f32 cache first, the reference of the others.
fn measure(name: &str, text: &str, model: &Arc<Model>, ids: &[u32]) -> Result<ModelReport> {
    let n = ids.len() - 1; // positions whose next token is known
    let next = &ids[1..];
    let ranges: Vec<(usize, usize)> = RANGES
        .iter()
        .scan(0, |lo, &hi| {
            let r = (*lo, hi.min(n));
            *lo = hi;
            Some(r)
        })
        .filter(|(lo, hi)| lo < hi)
        .collect();
    let bar = ProgressBar::new((KvDtype::ALL.len() * n) as u64);
    bar.set_style(
        ProgressStyle::with_template("{spinner} {msg} [{bar:30}] {pos}/{len} {elapsed}")
            .expect("template")
            .progress_chars("=> "),
    );
    let mut reference = Vec::new();
    let mut dtypes = Vec::new();
    for dtype in KvDtype::ALL {
        bar.set_message(format!("{name} --kv-dtype {dtype}"));
        let (logits, step_s) = force(model, ids, dtype, &bar)?;
        if dtype == KvDtype::F32 {
            reference = logits.clone();
        }
        let (lo, hi) = *ranges.last().expect("at least one range");
        let last_s: f64 = step_s[lo..hi].iter().sum();
        dtypes.push(DtypeRow {
            kv_dtype: dtype,
            kv_bytes_per_token: dtype.bytes_per_token(&model.config),
            ranges: ranges
                .iter()
                .map(|&(lo, hi)| RangeRow {
                    first: lo + 1,
                    last: hi,
                    quality: compare_distributions(
                        &logits[lo..hi],
                        &reference[lo..hi],
                        &next[lo..hi],
                    ),
                })
                .collect(),
            decode_tokens_per_s: (hi - lo) as f64 / last_s,
        });
    }
    bar.finish_and_clear();
    Ok(ModelReport {
        model: name.into(),
        text: text.into(),
        positions: n,
        dtypes,
    })
}

/// The cpu engine's logits after each of ids[..n] (n = ids.len() − 1), fed one position at a
/// time, and each step's seconds.
fn force(
    model: &Arc<Model>,
    ids: &[u32],
    dtype: KvDtype,
    bar: &ProgressBar,
) -> Result<(Vec<Vec<f32>>, Vec<f64>)> {
    let mut e = CpuEngine::with_kv_dtype(model.clone(), dtype);
    let seq = e.new_sequence(ids.len())?;
    let (mut logits, mut secs) = (Vec::new(), Vec::new());
    for (i, &t) in ids[..ids.len() - 1].iter().enumerate() {
        let start = Instant::now();
        logits.push(if i == 0 {
            e.prefill(seq, &[t])?
        } else {
            e.decode(seq, t)?
        });
        secs.push(start.elapsed().as_secs_f64());
        bar.inc(1);
    }
    e.free(seq);
    Ok((logits, secs))
}

fn print_tables(r: &Report) {
    for m in &r.models {
        println!(
            "\n{}: {} positions of {} ({} threads; against the f32 cache)\n",
            m.model, m.positions, m.text, r.threads
        );
        println!(
            "| kv dtype | KV bytes/token | positions | top-1 agreement | mean KL (nats) | max KL (nats) | perplexity f32 → dtype | decode tok/s (last range) |"
        );
        println!("| --- | --- | --- | --- | --- | --- | --- | --- |");
        for d in &m.dtypes {
            for (i, g) in d.ranges.iter().enumerate() {
                let q = &g.quality;
                println!(
                    "| {} | {} | {}–{} | {:.4} | {:.2e} | {:.2e} | {:.3} → {:.3} | {} |",
                    d.kv_dtype,
                    d.kv_bytes_per_token,
                    g.first,
                    g.last,
                    q.top1_agreement,
                    q.mean_kl,
                    q.max_kl,
                    q.perplexity_reference,
                    q.perplexity,
                    if i + 1 == d.ranges.len() {
                        format!("{:.1}", d.decode_tokens_per_s)
                    } else {
                        String::new()
                    }
                );
            }
        }
    }
}

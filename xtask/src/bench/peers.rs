//! `cargo xtask peers` (also spelled `cargo xtask bench --peers`): kvlab's `generate` against llama2.c's `run.c` and llama.cpp on
//! the same weights, as separate processes, interleaved rep by rep so the ratios are taken under
//! the same load, with the same thread count and greedy decoding, and with a token-identity check.
//!
//! * run.c: llama2.c checkpoints (stories260K, and synthetic shapes written with `kvlab export`).
//!   Not shipped: build llama2.c's `run.c` yourself and point `KVLAB_RUNC` at the binary.
//! * llama.cpp: GGUF checkpoints (Gemma 3 270M), through llama-cpp-python from PyPI
//!   (`scripts/peers/llama_cpp_decode.py`); `KVLAB_PYTHON` names the interpreter (default python3).
//! * llama.cpp prefill: the stories15M and stories42M shapes in f32, the same weights for both
//!   (`kvlab export` writes the llama2.c checkpoint, `scripts/peers/llama2c_to_gguf.py` the same
//!   tensors and tokenizer as a GGUF of architecture `llama`), a ~100-token prompt, and the
//!   prompt's evaluation alone timed (`scripts/peers/llama_cpp_prefill.py`; kvlab's
//!   `prefill_tokens_per_s`). The prompt ids and the greedy ids after it must be the same.
//!
//! A peer that is missing is reported as missing, with how to install it; nothing is skipped
//! silently. Decode rows time decode only: run.c's "achieved tok/s" starts after the first
//! forward pass, kvlab's "decode ... tok/s" counts the steps after prefill. Prefill rows time the
//! prompt's forward pass only (the first after loading, on both sides).

use std::path::{Path, PathBuf};
use std::process::Command;

use anyhow::{Context, Result, bail};
use serde::Serialize;

use kvlab_model::{Config, WeightFormat};

use kvlab_cli::args::usize_in;

use super::machine;
use super::stats::Summary;
use crate::paths::{self, target_dir, workspace_root};

/// `cargo xtask peers`' options (`cargo xtask bench --peers` forwards its own).
#[derive(clap::Args)]
#[command(
    after_help = "env: KVLAB_MODELS (folder of real checkpoints), KVLAB_RUNC (llama2.c's run.c \
                  binary), KVLAB_PYTHON (a python with llama-cpp-python) and KVLAB_BIN (the \
                  kvlab binary to measure; default: cargo build --release -p kvlab-cli)"
)]
pub struct PeersArgs {
    /// Only this model of the comparison (repeatable)
    #[arg(long = "model", value_name = "NAME")]
    pub models: Vec<String>,
    /// Threads of both sides [default: physical cores]
    #[arg(long, value_name = "N", value_parser = usize_in(1, 1 << 16))]
    pub threads: Option<usize>,
    /// Positions per run
    #[arg(long, value_name = "N", default_value_t = 256, value_parser = usize_in(1, 1 << 20))]
    pub steps: usize,
    /// Repetitions
    #[arg(long, value_name = "N", default_value_t = 3, value_parser = usize_in(1, 1 << 20))]
    pub reps: usize,
    /// Where peers.json goes [default: target/kvlab-bench]
    #[arg(long, value_name = "DIR")]
    pub out: Option<PathBuf>,
    /// kvlab's `--activations` in the llama.cpp rows: f32 (kvlab's reference path) or q8
    /// (8-bit activations and integer dot products, as llama.cpp computes)
    #[arg(long, default_value_t = kvlab_model::Activations::F32,
          value_parser = kvlab_cli::args::activations())]
    pub activations: kvlab_model::Activations,
}

/// `cargo xtask peers`: the comparison with run.c and llama.cpp, its table and peers.json.
///
/// # Errors
/// kvlab's build failing, an unwritable output folder, or no peer that ran at all.
pub fn command(a: &PeersArgs) -> Result<()> {
    let p = PeerOpts {
        models: a.models.clone(),
        threads: a.threads.unwrap_or_else(kvlab_cpu::threads::physical_cores),
        steps: a.steps,
        reps: a.reps,
        activations: a.activations,
    };
    let m = machine::detect();
    let machine = format!(
        "{} ({} logical CPUs, {}), load {:.1} at the start, {}",
        m.cpu_model,
        m.logical_cpus,
        m.kvlab_simd,
        m.loadavg_start.map_or(0.0, |l| l[0]),
        m.date_utc
    );
    let report = run(&p, machine)?;
    print(&report);
    let out = a.out.clone().unwrap_or_else(paths::bench_out);
    std::fs::create_dir_all(&out).with_context(|| format!("creating {}", out.display()))?;
    let json = out.join("peers.json");
    std::fs::write(&json, serde_json::to_string_pretty(&report)?)?;
    println!("wrote {}", json.display());
    if report.rows.is_empty() {
        bail!("no peer ran (see the missing lines above)");
    }
    Ok(())
}

/// One model's comparison.
#[derive(Debug, Serialize)]
pub struct PeerRow {
    pub model: String,
    pub peer: String,
    /// What is timed: "decode" (tokens/s of the steps after prefill) or "prefill" (prompt
    /// tokens/s of the prompt's forward pass).
    pub phase: String,
    pub threads: usize,
    /// kvlab's `--weights` (the peer's are always the checkpoint's own: f32 for run.c).
    pub kvlab_weights: String,
    /// kvlab's `--activations`: "f32", or "q8" (rounded to 8 bits, as llama.cpp does).
    pub kvlab_activations: String,
    /// Positions generated per run (prompt included).
    pub steps: usize,
    /// Prompt tokens (BOS included).
    pub prompt_tokens: Option<usize>,
    /// Tokens/s of `phase` in every rep, kvlab and the peer, in run order.
    pub kvlab_tok_s: Vec<f64>,
    pub peer_tok_s: Vec<f64>,
    /// Median of the per-rep ratios kvlab / peer (each pair measured back to back).
    pub ratio_median: f64,
    /// Same generated text (run.c) or ids (llama.cpp prefill) as the peer; `None` where it is
    /// not compared (llama.cpp on the quantized Gemma).
    pub same_tokens: Option<bool>,
    /// Decode rows against run.c: the fraction of the machine's measured read bandwidth each side
    /// moved, (bytes a step must read: the weights as held, the cache to the mean position) ×
    /// median tok/s ÷ [`PeerRow::bandwidth_gb_per_s`]; (kvlab, run.c).
    pub bandwidth_fraction: Option<(f64, f64)>,
    /// kvlab's weights fit in the last-level cache, so DRAM bandwidth is not their limit.
    pub weights_in_cache: bool,
    /// What each side's fraction is of, GB/s, (kvlab, run.c): [`PeersReport::read_gb_per_s`]
    /// (DRAM), or where that side's weights fit in the last-level cache, the read bandwidth over
    /// a buffer of its step's bytes with the row's threads (`bandwidth::read_in_cache`). Near 1,
    /// a step reads as fast as a plain read of the same bytes does; a kernel with more streams
    /// per thread can go a few percent past it.
    pub bandwidth_gb_per_s: Option<(f64, f64)>,
    /// The issue's goal for `ratio_median` ("> 1", "≥ 1.8", …) and whether this run meets it.
    pub goal: String,
    pub goal_met: bool,
    pub note: String,
}

/// Why a peer did not run.
#[derive(Debug, Serialize)]
pub struct Missing {
    pub model: String,
    pub peer: String,
    pub why: String,
}

#[derive(Debug, Serialize)]
pub struct PeersReport {
    pub machine: String,
    /// The best read bandwidth measured at the start (bench::bandwidth, every thread count),
    /// GB/s (1e9 B/s); `None` when no run.c row ran.
    pub read_gb_per_s: Option<f64>,
    pub rows: Vec<PeerRow>,
    pub missing: Vec<Missing>,
}

pub struct PeerOpts {
    pub models: Vec<String>,
    pub threads: usize,
    pub steps: usize,
    pub reps: usize,
    /// kvlab's `--activations` in the llama.cpp rows.
    pub activations: kvlab_model::Activations,
}

/// Which comparison a row is.
#[derive(Clone, Copy)]
enum Peer {
    /// Decode against run.c (f32) on a llama2.c checkpoint, kvlab's matrices in this format.
    RunC(WeightFormat),
    /// Decode against llama.cpp on a GGUF of the manifest.
    LlamaCppDecode,
    /// Prefill against llama.cpp on an f32 GGUF written from kvlab's llama2.c export.
    LlamaCppPrefill,
    /// Prefill against llama.cpp on a GGUF of the manifest as stored (Gemma 3 270M's 4-bit
    /// blocks), at [`GGUF_PREFILL_WORDS`]' three prompt lengths: time to first token.
    LlamaCppPrefillGguf,
    /// kvlab's paged engine decoding 32 sequences in one batch against itself at 1 and 8.
    Batched,
}

/// The models a peer can run.
const MODELS: [(&str, Peer); 9] = [
    ("stories260K", Peer::RunC(WeightFormat::Stored)),
    ("stories15M-shape", Peer::RunC(WeightFormat::Stored)),
    ("stories42M-shape", Peer::RunC(WeightFormat::Stored)),
    // Fewer bytes per token: kvlab's bf16 matrices against run.c's f32 (issue goal: ≥ 1.8×).
    ("stories42M-shape", Peer::RunC(WeightFormat::Bf16)),
    ("gemma-3-270m", Peer::LlamaCppDecode),
    ("gemma-3-270m", Peer::LlamaCppPrefillGguf),
    ("stories15M-shape", Peer::LlamaCppPrefill),
    ("stories42M-shape", Peer::LlamaCppPrefill),
    ("stories15M-shape", Peer::Batched),
];

/// Tokens each sequence of the batched rows generates (the serve load test's completion length;
/// the stories15M shape holds 256 positions).
const BATCH_GENERATE: usize = 64;
/// The batched rows' batch sizes: the measured one and the two it is compared with.
const BATCHES: [usize; 3] = [1, 8, 32];

/// The issue's goal for a row's kvlab / peer ratio: at least `min`, or above it when `strict`.
#[derive(Clone, Copy)]
struct Goal {
    min: f64,
    strict: bool,
}

impl Goal {
    const BEAT: Goal = Goal {
        min: 1.0,
        strict: true,
    };
    const fn at_least(min: f64) -> Goal {
        Goal { min, strict: false }
    }
    fn text(self) -> String {
        format!("{} {}", if self.strict { ">" } else { "≥" }, self.min)
    }
    fn met(self, ratio: f64) -> bool {
        if self.strict {
            ratio > self.min
        } else {
            ratio >= self.min
        }
    }
}

/// The prefill rows' prompt: 102 tokens with the Llama 2 tokenizer (BOS included).
const PREFILL_PROMPT: &str = "Once upon a time, in a small village at the edge of a great \
    forest, there lived a little girl named Lily. Every morning she walked to the river with her \
    dog Max to watch the fish jump in the sun. One day she found a shiny red stone near the \
    water. She picked it up and showed it to her mom. Her mom smiled and said that the stone was \
    very special, because it could make wishes come true. Lily thought very hard about what to \
    wish for.";

/// Greedy ids compared after the prompt in the prefill rows.
const PREFILL_NEW: usize = 8;

pub fn run(o: &PeerOpts, machine: String) -> Result<PeersReport> {
    let kvlab = build_kvlab()?;
    let dir = paths::bench_out().join("peers");
    std::fs::create_dir_all(&dir)?;
    let mut report = PeersReport {
        machine,
        read_gb_per_s: None,
        rows: vec![],
        missing: vec![],
    };
    // Measured before the first run.c row, once.
    let mut bandwidth: Option<ReadBandwidth> = None;
    for (model, peer) in MODELS {
        if !o.models.is_empty() && !o.models.iter().any(|m| m.eq_ignore_ascii_case(model)) {
            continue;
        }
        let one = |r: Result<PeerRow>| r.map(|row| vec![row]);
        let (result, name) = match peer {
            Peer::RunC(w) => {
                let b = bandwidth.get_or_insert_with(ReadBandwidth::measure);
                report.read_gb_per_s = Some(b.gb_per_s);
                (one(vs_runc(&kvlab, &dir, model, w, o, b)), "run.c")
            }
            Peer::LlamaCppDecode => (one(vs_llama_cpp(&kvlab, model, o)), "llama.cpp"),
            Peer::LlamaCppPrefill => (
                one(vs_llama_cpp_prefill(&kvlab, &dir, model, o)),
                "llama.cpp prefill",
            ),
            Peer::LlamaCppPrefillGguf => (
                vs_llama_cpp_prefill_gguf(&kvlab, &dir, model, o),
                "llama.cpp prefill",
            ),
            Peer::Batched => (vs_batch(&kvlab, model, o), "kvlab batch 1 and 8"),
        };
        match result {
            Ok(rows) => report.rows.extend(rows),
            Err(e) => report.missing.push(Missing {
                model: model.into(),
                peer: name.into(),
                why: format!("{e:#}"),
            }),
        }
    }
    Ok(report)
}

/// What the run.c rows' bandwidth fractions are taken of.
struct ReadBandwidth {
    /// The best read bandwidth of [`super::bandwidth::measure`] (1 thread and every CPU, 5
    /// passes over a buffer of 4 × the last-level cache, at least 512 MiB), GB/s.
    gb_per_s: f64,
    /// The last-level cache, bytes, where the machine says.
    llc_bytes: Option<u64>,
}

impl ReadBandwidth {
    fn measure() -> ReadBandwidth {
        let llc_bytes = machine::detect().llc_bytes;
        let buffer = super::bandwidth::buffer_bytes(512 << 20, llc_bytes);
        let b = super::bandwidth::measure(buffer, 5, "start");
        let gb_per_s = b
            .rows
            .iter()
            .filter(|r| r.kind == "read")
            .map(|r| r.gb_per_s.max)
            .fold(0.0, f64::max);
        ReadBandwidth {
            gb_per_s,
            llc_bytes,
        }
    }
}

/// `row` (a decode against run.c, of the model `c`) with each side's fraction of the read
/// bandwidth: the bytes a step must read (models.rs's `decode_bytes`, with kvlab's matrices at 2
/// bytes a weight in bf16) at the generation's mean position, times each side's median tok/s.
fn with_bandwidth(row: PeerRow, c: &Config, weights: WeightFormat, b: &ReadBandwidth) -> PeerRow {
    let pos = row.steps / 2;
    let f32_bytes = super::models::decode_bytes(c, pos) as f64;
    let kvlab_bytes = match weights {
        WeightFormat::Bf16 | WeightFormat::F16 => {
            f32_bytes - 2.0 * super::models::matmul_params(c) as f64
        }
        _ => f32_bytes,
    };
    let median = |v: &[f64]| Summary::of(v).median;
    let kv = c.kv_bytes_per_token(4) as f64 * (pos + 1) as f64;
    let in_cache = |bytes: f64| b.llc_bytes.is_some_and(|l| bytes - kv <= l as f64);
    // Each side's reference: a read of its own bytes in the LLC where its weights fit there
    // (about 2 GB read per run, at least 5 passes), DRAM's otherwise.
    let reference = |bytes: f64| {
        if in_cache(bytes) {
            let passes = (2e9 / bytes.max(1.0)).clamp(5.0, 1000.0) as usize;
            super::bandwidth::read_in_cache(bytes as usize, row.threads, passes)
        } else {
            b.gb_per_s
        }
    };
    let kvlab_gbs = reference(kvlab_bytes);
    let peer_gbs = if f32_bytes == kvlab_bytes {
        kvlab_gbs
    } else {
        reference(f32_bytes)
    };
    let fraction = |bytes: f64, tok_s: f64, gbs: f64| bytes * tok_s / 1e9 / gbs;
    PeerRow {
        bandwidth_fraction: Some((
            fraction(kvlab_bytes, median(&row.kvlab_tok_s), kvlab_gbs),
            fraction(f32_bytes, median(&row.peer_tok_s), peer_gbs),
        )),
        weights_in_cache: in_cache(kvlab_bytes),
        bandwidth_gb_per_s: Some((kvlab_gbs, peer_gbs)),
        ..row
    }
}

/// Builds the release `kvlab` binary and returns its path; `KVLAB_BIN` names another binary to
/// measure instead (an older build, say).
pub(crate) fn build_kvlab() -> Result<PathBuf> {
    if let Some(bin) = std::env::var_os("KVLAB_BIN") {
        return Ok(PathBuf::from(bin));
    }
    let mut cargo = Command::new(std::env::var("CARGO").unwrap_or_else(|_| "cargo".into()));
    let st = crate::verify::without_cargo_run_env(&mut cargo)
        .args(["build", "--release", "-p", "kvlab-cli"])
        .current_dir(workspace_root())
        .status()
        .context("running cargo build -p kvlab-cli")?;
    if !st.success() {
        bail!("cargo build --release -p kvlab-cli failed");
    }
    Ok(target_dir().join("release").join("kvlab"))
}

/// Runs a command and returns (stdout, stderr); fails with its stderr when it fails.
pub(crate) fn output(cmd: &mut Command, what: &str) -> Result<(String, String)> {
    let out = cmd.output().with_context(|| format!("starting {what}"))?;
    let (so, se) = (
        String::from_utf8_lossy(&out.stdout).into_owned(),
        String::from_utf8_lossy(&out.stderr).into_owned(),
    );
    if !out.status.success() {
        bail!("{what} failed ({}): {}", out.status, se.trim());
    }
    Ok((so, se))
}

/// The number after `key` in `text` ("decode 255 tokens at 412.3 tok/s" → key "at ").
fn number_after(text: &str, key: &str) -> Option<f64> {
    let at = text.rfind(key)? + key.len();
    let s: String = text[at..]
        .chars()
        .take_while(|c| c.is_ascii_digit() || *c == '.')
        .collect();
    s.parse().ok()
}

/// The stats `kvlab generate --json` and `kvlab batch --json` print on stderr (its last JSON
/// line).
fn kvlab_stats(stderr: &str) -> Result<serde_json::Value> {
    let line = stderr
        .lines()
        .rev()
        .find(|l| l.trim_start().starts_with('{'))
        .with_context(|| format!("no JSON stats in kvlab's stderr: {stderr}"))?;
    Ok(serde_json::from_str(line)?)
}

/// kvlab's decode tokens/s from its stats: `generate`'s steps after prefill, `batch`'s steps
/// that prefilled nothing.
fn kvlab_decode_tok_s(stderr: &str) -> Result<f64> {
    let v = kvlab_stats(stderr)?;
    v["decode_tokens_per_s"]
        .as_f64()
        .with_context(|| format!("no decode_tokens_per_s in {v}"))
}

fn kvlab_cmd(kvlab: &Path, threads: usize) -> Command {
    let mut c = Command::new(kvlab);
    c.env("RAYON_NUM_THREADS", threads.to_string());
    c
}

/// `o.reps` pairs, the peer then kvlab back to back (`pair` returns kvlab's and the peer's
/// decode tokens/s), and the median of the per-pair ratios, judged against `goal`.
fn paired(
    o: &PeerOpts,
    model: &str,
    peer: &str,
    goal: Goal,
    mut pair: impl FnMut() -> Result<(f64, f64)>,
) -> Result<PeerRow> {
    let (mut ours, mut theirs) = (vec![], vec![]);
    for _ in 0..o.reps {
        let (k, r) = pair()?;
        ours.push(k);
        theirs.push(r);
    }
    Ok(PeerRow::of_runs(
        (model, peer.into(), "decode".into()),
        (o.threads, o.steps),
        (ours, theirs),
        goal,
    ))
}

impl PeerRow {
    /// A row of kvlab's and the peer's tokens/s per rep (stored weights, f32 activations), the
    /// median of the per-rep ratios judged against `goal`; the bandwidth, token and prompt
    /// columns empty, for the caller to fill.
    fn of_runs(
        (model, peer, phase): (&str, String, String),
        (threads, steps): (usize, usize),
        (kvlab_tok_s, peer_tok_s): (Vec<f64>, Vec<f64>),
        goal: Goal,
    ) -> PeerRow {
        let ratios: Vec<f64> = kvlab_tok_s
            .iter()
            .zip(&peer_tok_s)
            .map(|(k, p)| k / p)
            .collect();
        let ratio_median = Summary::of(&ratios).median;
        PeerRow {
            model: model.into(),
            peer,
            phase,
            threads,
            kvlab_weights: WeightFormat::Stored.name().into(),
            kvlab_activations: kvlab_model::Activations::F32.name().into(),
            bandwidth_fraction: None,
            weights_in_cache: false,
            bandwidth_gb_per_s: None,
            steps,
            prompt_tokens: None,
            kvlab_tok_s,
            peer_tok_s,
            ratio_median,
            same_tokens: None,
            goal: goal.text(),
            goal_met: goal.met(ratio_median),
            note: String::new(),
        }
    }
}

/// Batched decode (issue goal: batch 32 ≥ 8× batch 1, and above batch 8): `kvlab batch` on the
/// paged CPU engine with 1, 8 and 32 requests arriving together, [`BATCH_GENERATE`] tokens
/// each, one of each per rep, back to back; the rows are batch 32 against batch 1 and against
/// batch 8.
fn vs_batch(kvlab: &Path, model: &str, o: &PeerOpts) -> Result<Vec<PeerRow>> {
    let run = |b: usize| -> Result<f64> {
        let mut cmd = kvlab_cmd(kvlab, o.threads);
        cmd.args(["batch", "-m", model, "--engine", "cpu-paged", "--json"])
            .args(["-n", &BATCH_GENERATE.to_string(), "--arrival-gap", "0"]);
        for i in 0..b {
            cmd.args(["-p", &format!("Once upon a time, in story number {i},")]);
        }
        let (_, err) = output(&mut cmd, &format!("kvlab batch ({b} requests)"))?;
        kvlab_decode_tok_s(&err)
    };
    let mut tok_s: [Vec<f64>; 3] = Default::default();
    for _ in 0..o.reps {
        for (i, &b) in BATCHES.iter().enumerate() {
            tok_s[i].push(run(b)?);
        }
    }
    let row = |vs: usize, goal: Goal| PeerRow {
        note: format!(
            "cpu-paged, {} requests at once against {}, {BATCH_GENERATE} tokens each; tokens/s of \
             the steps that prefilled nothing",
            BATCHES[2], BATCHES[vs]
        ),
        ..PeerRow::of_runs(
            (
                model,
                format!("kvlab batch {}", BATCHES[vs]),
                format!("decode, batch {}", BATCHES[2]),
            ),
            (o.threads, BATCH_GENERATE),
            (tok_s[2].clone(), tok_s[vs].clone()),
            goal,
        )
    };
    Ok(vec![row(0, Goal::at_least(8.0)), row(1, Goal::BEAT)])
}

/// The model whose llama2.c tokenizer (Llama 2's 32,000 pieces) pads a synthetic model's.
const LLAMA2_TOKENIZER_OF: &str = "stories15M-shape";

/// Filler pieces of a padded tokenizer score this: below every real piece, so no merge
/// prefers one (and no text holds the private-use character they start with).
const PAD_SCORE: f32 = -1e9;

/// The llama2.c tokenizer of `model`: its own from the manifest, or for a synthetic model
/// without one (the Llama-3.2-1B shape's 128,256 ids), Llama 2's 32,000 pieces followed by
/// filler pieces `\u{E000}pad N` scored [`PAD_SCORE`] up to the model's vocabulary, written
/// in `dir` (again on every call: a file from an older or interrupted run is never reused): text tokenizes to Llama 2's ids on both sides (kvlab reads the file,
/// llama.cpp its GGUF copy), and every id has a piece.
///
/// # Errors
/// A model not in the manifest, a tokenizer file that is missing, unreadable or malformed.
pub(crate) fn llama2c_tokenizer_of(dir: &Path, model: &str) -> Result<PathBuf> {
    let entry = kvlab_model::registry::entry(model)
        .with_context(|| format!("{model} is not in fixtures/models.json"))?;
    let find = |name: &str| -> Result<PathBuf> {
        let tok_ref = (kvlab_model::registry::entry(name).and_then(|e| e.tokenizer.as_ref()))
            .with_context(|| format!("{name} has no llama2.c tokenizer"))?;
        kvlab_model::registry::find_file(tok_ref).with_context(|| {
            format!(
                "{name}'s tokenizer {} is missing: {}",
                tok_ref.file,
                kvlab_model::registry::searched_places(tok_ref)
            )
        })
    };
    let vocab = match (&entry.tokenizer, &entry.synthetic) {
        (None, Some(spec)) => spec.vocab_size,
        _ => return find(model),
    };
    let padded = dir.join(format!("{model}.tokenizer.bin"));
    let base = find(LLAMA2_TOKENIZER_OF)?;
    let bytes = std::fs::read(&base).with_context(|| format!("reading {}", base.display()))?;
    let partial = padded.with_extension("bin.partial");
    std::fs::write(&partial, pad_llama2c_tokenizer(&bytes, vocab)?)
        .with_context(|| format!("writing {}", partial.display()))?;
    std::fs::rename(&partial, &padded)
        .with_context(|| format!("renaming {} to {}", partial.display(), padded.display()))?;
    Ok(padded)
}

/// A llama2.c tokenizer file (i32 max_token_length, then per piece f32 score, i32 length,
/// bytes) with filler pieces appended up to `vocab` pieces (see [`llama2c_tokenizer_of`]).
///
/// # Errors
/// A file that ends inside a piece, or holds `vocab` pieces or more already.
fn pad_llama2c_tokenizer(bytes: &[u8], vocab: usize) -> Result<Vec<u8>> {
    let i32_at = |at: usize| -> Result<i32> {
        let b = bytes
            .get(at..at + 4)
            .context("the tokenizer file is truncated")?;
        Ok(i32::from_le_bytes(b.try_into()?))
    };
    let (mut at, mut n) = (4usize, 0usize);
    while at < bytes.len() {
        let len = usize::try_from(i32_at(at + 4)?).context("a negative piece length")?;
        at += 8 + len;
        n += 1;
    }
    if at != bytes.len() {
        bail!("the tokenizer file ends inside piece {n}: truncated or not a llama2.c tokenizer");
    }
    if n >= vocab {
        bail!("the tokenizer already holds {n} pieces; there is nothing to pad to {vocab}");
    }
    let mut out = bytes.to_vec();
    let mut max_len = i32_at(0)?;
    for id in n..vocab {
        let piece = format!("\u{E000}pad {id}");
        out.extend(PAD_SCORE.to_le_bytes());
        out.extend(i32::try_from(piece.len())?.to_le_bytes());
        out.extend(piece.as_bytes());
        max_len = max_len.max(i32::try_from(piece.len())?);
    }
    out[..4].copy_from_slice(&max_len.to_le_bytes());
    Ok(out)
}

/// Writes `model` as a llama2.c checkpoint in `dir` with `kvlab export`; returns its path and
/// its llama2.c tokenizer's ([`llama2c_tokenizer_of`]).
fn export_llama2c(kvlab: &Path, dir: &Path, model: &str) -> Result<(PathBuf, PathBuf)> {
    let tokenizer = llama2c_tokenizer_of(dir, model)?;
    // The same weights for both: kvlab writes them as a llama2.c checkpoint.
    let bin = dir.join(format!("{model}.bin"));
    output(
        kvlab_cmd(kvlab, 1)
            .args(["export", "-m", model, "-o"])
            .arg(&bin),
        "kvlab export",
    )?;
    Ok((bin, tokenizer))
}

/// kvlab (its matrices as `weights`) against run.c on one llama2.c checkpoint, from BOS alone,
/// `steps` positions, with each side's fraction of `bandwidth`.
fn vs_runc(
    kvlab: &Path,
    dir: &Path,
    model: &str,
    weights: WeightFormat,
    o: &PeerOpts,
    bandwidth: &ReadBandwidth,
) -> Result<PeerRow> {
    let runc = std::env::var_os("KVLAB_RUNC").map(PathBuf::from).context(
        "run.c not found: build llama2.c's run.c (in a checkout of github.com/karpathy/llama2.c: \
         gcc -Ofast -march=native -fopenmp run.c -lm -o runomp) and set KVLAB_RUNC=/path/to/runomp",
    )?;
    let (bin, tokenizer) = export_llama2c(kvlab, dir, model)?;
    let steps = o.steps.to_string();
    let mut same = true;
    // run.c on its own weights by at least a tenth (issue 37); in bf16, half the bytes per
    // token, ≥ 1.8×.
    let goal = match weights {
        WeightFormat::Bf16 => Goal::at_least(1.8),
        _ => Goal::at_least(1.1),
    };
    let row = paired(o, model, "run.c", goal, || {
        let (r_out, r_err) = output(
            Command::new(&runc)
                .env("OMP_NUM_THREADS", o.threads.to_string())
                .arg(&bin)
                .arg("-z")
                .arg(&tokenizer)
                .args(["-t", "0", "-n", &steps, "-i", ""]),
            "run.c",
        )?;
        let r = number_after(&r_err, "achieved tok/s: ")
            .with_context(|| format!("no 'achieved tok/s' in run.c's output: {r_err}"))?;
        let (k_out, k_err) = output(
            kvlab_cmd(kvlab, o.threads)
                .args(["generate", "-m"])
                .arg(&bin)
                .arg("--tokenizer")
                .arg(&tokenizer)
                .args(["--temp", "0", "--steps", &steps, "-p", "", "--json"])
                .args(["--weights", weights.name()]),
            "kvlab generate",
        )?;
        let k = kvlab_decode_tok_s(&k_err)?;
        // run.c prints nothing for a lone byte token that is not valid UTF-8 where kvlab prints
        // U+FFFD; apart from that the texts are byte for byte the same.
        same &= k_out.replace('\u{FFFD}', "").trim_end() == r_out.trim_end();
        Ok((k, r))
    })?;
    let (same_tokens, note) = match weights {
        WeightFormat::Stored | WeightFormat::F32 => (Some(same), String::new()),
        // Rounded weights may part from f32's text at a near-tie; verify measures their quality.
        _ => (
            None,
            format!("kvlab {weights} weights vs run.c f32: text not compared; "),
        ),
    };
    let row = PeerRow {
        same_tokens,
        kvlab_weights: weights.name().into(),
        note: format!("{note}run.c: {}", runc.display()),
        ..row
    };
    let config = kvlab_model::llama2c::read_config(&bin)?;
    Ok(with_bandwidth(row, &config, weights, bandwidth))
}

/// kvlab against llama.cpp (llama-cpp-python) on a GGUF checkpoint: the same prompt and the
/// same number of positions (`steps`, prompt included, run.c's meaning).
fn vs_llama_cpp(kvlab: &Path, model: &str, o: &PeerOpts) -> Result<PeerRow> {
    let (python, version) = llama_cpp_python()?;
    let script = workspace_root().join("scripts/peers/llama_cpp_decode.py");
    let gguf = manifest_gguf(model)?;
    let prompt = "Once upon a time";
    let row = paired(o, model, "llama.cpp", Goal::at_least(1.0), || {
        let (p_out, _) = output(
            Command::new(&python)
                .arg(&script)
                .arg(&gguf)
                .args(["--threads", &o.threads.to_string()])
                .args(["--prompt", prompt, "--steps", &o.steps.to_string()]),
            "scripts/peers/llama_cpp_decode.py",
        )?;
        let v: serde_json::Value = serde_json::from_str(p_out.trim())
            .with_context(|| format!("llama_cpp_decode.py printed {p_out:?}"))?;
        let r = v["decode_tok_s"].as_f64().context("no decode_tok_s")?;
        let (_, k_err) = output(
            kvlab_cmd(kvlab, o.threads)
                .args(["generate", "-m", model, "--temp", "0", "-p", prompt])
                .args(["--steps", &o.steps.to_string(), "--json"])
                .args(["--activations", o.activations.name()]),
            "kvlab generate",
        )?;
        Ok((kvlab_decode_tok_s(&k_err)?, r))
    })?;
    Ok(PeerRow {
        kvlab_activations: o.activations.name().into(),
        note: format!(
            "llama-cpp-python {version}; both read the GGUF's quantized blocks; llama.cpp \
             rounds activations to 8 bits, kvlab with --activations {}, so greedy ids part at \
             near-ties (see cargo xtask verify's oracle notes): ids are not compared here",
            o.activations
        ),
        ..row
    })
}

/// The model file of a manifest entry (fixtures/models.json), or why it cannot be found.
fn manifest_gguf(model: &str) -> Result<PathBuf> {
    use kvlab_model::registry::{Located, locate};
    match locate(model)? {
        Located::Ready {
            model: Some(path), ..
        } => Ok(path),
        Located::Ready { model: None, .. } => bail!("{model} has no model file in the manifest"),
        Located::Missing { file, searched, .. } => bail!("{} is missing: {searched}", file.file),
    }
}

/// The python of `KVLAB_PYTHON` (default python3) and its llama-cpp-python's version.
pub(crate) fn llama_cpp_python() -> Result<(String, String)> {
    let python = std::env::var("KVLAB_PYTHON").unwrap_or_else(|_| "python3".into());
    let probe = Command::new(&python)
        .args(["-c", "import llama_cpp; print(llama_cpp.__version__)"])
        .output();
    match probe {
        Ok(p) if p.status.success() => {
            let version = String::from_utf8_lossy(&p.stdout).trim().to_string();
            Ok((python, version))
        }
        _ => bail!(
            "llama-cpp-python is not installed for {python}: pip install llama-cpp-python==0.3.36 \
             (builds llama.cpp from source, about 10 minutes on 2 cores), or set KVLAB_PYTHON"
        ),
    }
}

/// The ids of the `[trace] pos … fed [ids] …` lines of `kvlab generate --trace`, in order: the
/// prompt's, then each sampled id fed back.
fn kvlab_fed_ids(stderr: &str) -> Vec<Vec<u32>> {
    stderr
        .lines()
        .filter(|l| l.starts_with("[trace] pos"))
        .filter_map(|l| {
            let list = l.split_once(" fed [")?.1.split_once(']')?.0;
            list.split(',')
                .map(|x| x.trim())
                .filter(|x| !x.is_empty())
                .map(|x| x.parse().ok())
                .collect()
        })
        .collect()
}

/// kvlab against llama.cpp's f32 prefill on the same weights: `kvlab export` writes the model as
/// a llama2.c checkpoint, `scripts/peers/llama2c_to_gguf.py` writes that checkpoint and its
/// tokenizer as a GGUF; both evaluate [`PREFILL_PROMPT`] in one batch, then [`PREFILL_NEW`]
/// greedy ids, which must be the same, as must the prompt's ids.
fn vs_llama_cpp_prefill(kvlab: &Path, dir: &Path, model: &str, o: &PeerOpts) -> Result<PeerRow> {
    let (python, version) = llama_cpp_python()?;
    let (gguf, bin, tokenizer) = export_gguf(kvlab, dir, model, &python)?;
    let prompt_file = dir.join("prefill_prompt.txt");
    std::fs::write(&prompt_file, PREFILL_PROMPT)?;
    let mut kvlab_model = vec![bin.into_os_string(), "--tokenizer".into()];
    kvlab_model.push(tokenizer.into_os_string());
    let mut p = PrefillPair::new(
        &python,
        kvlab,
        &kvlab_model,
        &gguf,
        (PREFILL_PROMPT, &prompt_file),
    );
    let row = paired(o, model, "llama.cpp", Goal::at_least(1.0), || p.run(o))?;
    let (same, prompt_tokens, steps) = (p.same, p.prompt_tokens, p.steps);
    let omp_wait = omp_wait();
    Ok(PeerRow {
        phase: "prefill".into(),
        steps,
        prompt_tokens: Some(prompt_tokens),
        same_tokens: Some(same),
        note: format!(
            "llama-cpp-python {version}; f32 GGUF {} written from kvlab's llama2.c export by \
             scripts/peers/llama2c_to_gguf.py; the prompt in one batch, first evaluation after \
             loading on both sides, OMP_WAIT_POLICY={omp_wait} for llama.cpp; same text = same \
             prompt ids and {PREFILL_NEW} greedy ids",
            gguf.display()
        ),
        ..row
    })
}

/// `model` written as an f32 GGUF in `dir` by way of a llama2.c export
/// (`scripts/peers/llama2c_to_gguf.py`, run by `python`): (the GGUF, the checkpoint, its
/// tokenizer).
///
/// # Errors
/// `python` without the gguf package (the error says how to install it), or an export that
/// fails.
fn export_gguf(
    kvlab: &Path,
    dir: &Path,
    model: &str,
    python: &str,
) -> Result<(PathBuf, PathBuf, PathBuf)> {
    let ok = Command::new(python)
        .args(["-c", "import gguf"])
        .output()
        .is_ok_and(|p| p.status.success());
    if !ok {
        bail!(
            "the gguf package (to write the f32 GGUF) is not installed for {python}: \
             {python} -m pip install gguf"
        );
    }
    let (bin, tokenizer) = export_llama2c(kvlab, dir, model)?;
    let gguf = dir.join(format!("{model}.f32.gguf"));
    output(
        Command::new(python)
            .arg(workspace_root().join("scripts/peers/llama2c_to_gguf.py"))
            .arg(&bin)
            .arg(&tokenizer)
            .arg(&gguf),
        "scripts/peers/llama2c_to_gguf.py",
    )?;
    Ok((gguf, bin, tokenizer))
}

/// The GGUF of `model`: its own file where the manifest has one (Gemma 3 270M), else the model
/// exported as an f32 GGUF in `dir` ([`export_gguf`], with `KVLAB_PYTHON`'s python, which needs
/// the gguf package); with the export, the llama2.c tokenizer it was written with (for kvlab's
/// `--tokenizer`: a synthetic model has none of its own).
///
/// # Errors
/// A manifest model whose file is missing, or an export that fails.
pub(crate) fn gguf_of(kvlab: &Path, dir: &Path, model: &str) -> Result<(PathBuf, Option<PathBuf>)> {
    let has_gguf = kvlab_model::registry::entry(model)
        .and_then(|e| e.model.as_ref())
        .is_some_and(|f| f.file.ends_with(".gguf"));
    if has_gguf {
        // Its own file, or why it cannot be found (not an export of something else).
        return Ok((manifest_gguf(model)?, None));
    }
    let python = std::env::var("KVLAB_PYTHON").unwrap_or_else(|_| "python3".into());
    let (gguf, _, tokenizer) = export_gguf(kvlab, dir, model, &python)?;
    Ok((gguf, Some(tokenizer)))
}

/// One prefill comparison's pair of runs, llama.cpp's then kvlab's on the same prompt, and what
/// they tokenized and generated so far.
struct PrefillPair<'a> {
    python: &'a str,
    kvlab: &'a Path,
    /// `generate`'s model arguments (`-m` follows): a path, and `--tokenizer` where it needs one.
    kvlab_model: &'a [std::ffi::OsString],
    gguf: &'a Path,
    prompt: &'a str,
    /// `prompt`, written out for the script.
    prompt_file: &'a Path,
    /// Whether every pair had the same prompt ids.
    same_prompt: bool,
    /// Whether every pair had the same prompt ids and the same greedy ids.
    same: bool,
    /// The last pair's prompt ids (BOS included), and its positions (prompt and greedy ids).
    prompt_tokens: usize,
    steps: usize,
}

impl<'a> PrefillPair<'a> {
    /// No pair run yet: `kvlab_model` are `generate`'s arguments after `-m`, `prompt` the text
    /// and the file holding it for the script.
    fn new(
        python: &'a str,
        kvlab: &'a Path,
        kvlab_model: &'a [std::ffi::OsString],
        gguf: &'a Path,
        (prompt, prompt_file): (&'a str, &'a Path),
    ) -> Self {
        PrefillPair {
            python,
            kvlab,
            kvlab_model,
            gguf,
            prompt,
            prompt_file,
            same_prompt: true,
            same: true,
            prompt_tokens: 0,
            steps: 0,
        }
    }

    /// Times the prompt's evaluation in one batch on each side (the first after loading) and
    /// returns (kvlab, llama.cpp) prompt tokens/s; then [`PREFILL_NEW`] greedy ids each, which
    /// `same` compares with the prompt ids.
    fn run(&mut self, o: &PeerOpts) -> Result<(f64, f64)> {
        let new = PREFILL_NEW.to_string();
        let (p_out, _) = output(
            Command::new(self.python)
                .arg(workspace_root().join("scripts/peers/llama_cpp_prefill.py"))
                .arg(self.gguf)
                .args(["--threads", &o.threads.to_string(), "--prompt-file"])
                .arg(self.prompt_file)
                .args(["--new", &new]),
            "scripts/peers/llama_cpp_prefill.py",
        )?;
        let v: serde_json::Value = serde_json::from_str(p_out.trim())
            .with_context(|| format!("llama_cpp_prefill.py printed {p_out:?}"))?;
        let r = v["prefill_tok_s"].as_f64().context("no prefill_tok_s")?;
        let ids = |key: &str| -> Result<Vec<u32>> {
            serde_json::from_value(v[key].clone()).with_context(|| format!("no {key}"))
        };
        let (p_prompt, p_ids) = (ids("prompt_ids")?, ids("ids")?);
        // -n PREFILL_NEW + 1: the trace lists the ids fed, so the last of PREFILL_NEW is fed too.
        let (_, k_err) = output(
            kvlab_cmd(self.kvlab, o.threads)
                .args(["generate", "-m"])
                .args(self.kvlab_model)
                .args(["--temp", "0", "-p", self.prompt, "-n"])
                .arg((PREFILL_NEW + 1).to_string())
                .args(["--trace", "--json", "--activations", o.activations.name()]),
            "kvlab generate",
        )?;
        let k = kvlab_stats(&k_err)?["prefill_tokens_per_s"]
            .as_f64()
            .context("no prefill_tokens_per_s in kvlab's stats")?;
        let fed = kvlab_fed_ids(&k_err);
        let k_ids: Vec<u32> = fed.iter().skip(1).flatten().copied().collect();
        self.same_prompt &= fed.first() == Some(&p_prompt);
        self.same &= self.same_prompt && k_ids.starts_with(&p_ids) && !p_ids.is_empty();
        self.prompt_tokens = p_prompt.len();
        self.steps = p_prompt.len() + p_ids.len();
        Ok((k, r))
    }
}

/// llama.cpp runs with the OpenMP wait policy it is given: unset (libgomp spins, then sleeps)
/// is how it ships, and on an idle 2-core machine it was the fastest (42M shape: ~2050 tok/s
/// unset, ~1550 with OMP_WAIT_POLICY=passive). Under other load the spinning collapses (64 to
/// 3200 tok/s for the same run at load 4-5); OMP_WAIT_POLICY=passive then keeps it steady, at
/// that cost. The notes record which one ran.
fn omp_wait() -> String {
    std::env::var("OMP_WAIT_POLICY").unwrap_or_else(|_| "unset".into())
}

/// Words of [`PREFILL_PROMPT`] (repeated as needed) in the GGUF prefill rows' prompts: 10, 100
/// and 1,002 tokens with Gemma 3's tokenizer, BOS included (counted with llama.cpp's; each row
/// records its own count).
const GGUF_PREFILL_WORDS: [usize; 3] = [8, 90, 907];

/// kvlab against llama.cpp's prefill on a manifest GGUF as stored (issue goal: ≥ 1.2× at every
/// length; the short prompt's ratio is the time to first token's, which must be ≥ 1): both read
/// the same quantized blocks; llama.cpp rounds the activations to 8 bits where kvlab keeps f32, so
/// the prompt ids must be the same (else the row fails) but greedy ids may part at near-ties and
/// are not compared.
fn vs_llama_cpp_prefill_gguf(
    kvlab: &Path,
    dir: &Path,
    model: &str,
    o: &PeerOpts,
) -> Result<Vec<PeerRow>> {
    let (python, version) = llama_cpp_python()?;
    let gguf = manifest_gguf(model)?;
    let words: Vec<&str> = PREFILL_PROMPT.split_whitespace().collect();
    let mut rows = vec![];
    for n in GGUF_PREFILL_WORDS {
        let prompt: Vec<&str> = words.iter().cycle().take(n).copied().collect();
        let prompt = prompt.join(" ");
        let prompt_file = dir.join(format!("prefill_prompt_{n}.txt"));
        std::fs::write(&prompt_file, &prompt)?;
        let kvlab_model = [gguf.clone().into_os_string()];
        let mut p = PrefillPair::new(&python, kvlab, &kvlab_model, &gguf, (&prompt, &prompt_file));
        let row = paired(o, model, "llama.cpp", Goal::at_least(1.2), || p.run(o))?;
        if !p.same_prompt {
            bail!("kvlab and llama.cpp tokenized the {n}-word prompt differently");
        }
        rows.push(PeerRow {
            phase: "prefill".into(),
            kvlab_activations: o.activations.name().into(),
            steps: p.steps,
            prompt_tokens: Some(p.prompt_tokens),
            same_tokens: None,
            note: format!(
                "llama-cpp-python {version}; the GGUF's own blocks on both sides, the prompt \
                 ({n} words of the prefill prompt) in one batch, first evaluation after loading, \
                 OMP_WAIT_POLICY={} for llama.cpp; prompt ids the same; greedy ids not \
                 compared (llama.cpp's 8-bit activations part from kvlab's f32 at near-ties)",
                omp_wait()
            ),
            ..row
        });
    }
    Ok(rows)
}

/// Prints the comparison, ratios first.
pub fn print(r: &PeersReport) {
    println!("== peers: same weights, same threads, interleaved (tok/s of the phase) ==");
    let fmt = |v: &[f64]| {
        let v: Vec<String> = v.iter().map(|x| format!("{x:.0}")).collect();
        v.join(" ")
    };
    crate::table::columns(
        &r.rows,
        &[
            ("model", &|p| p.model.clone()),
            ("peer", &|p| p.peer.clone()),
            ("phase", &|p| p.phase.clone()),
            ("kvlab weights", &|p| p.kvlab_weights.clone()),
            ("activations", &|p| p.kvlab_activations.clone()),
            ("of read bandwidth, kvlab (peer)", &|p| {
                let cached = if p.weights_in_cache { ", in LLC" } else { "" };
                match (p.bandwidth_fraction, p.bandwidth_gb_per_s) {
                    (Some((k, r)), Some((kg, rg))) if kg == rg => {
                        format!("{k:.2} ({r:.2}) of {kg:.0} GB/s{cached}")
                    }
                    (Some((k, r)), Some((kg, rg))) => {
                        format!("{k:.2} of {kg:.0} ({r:.2} of {rg:.0}) GB/s{cached}")
                    }
                    _ => "-".into(),
                }
            }),
            ("kvlab/peer", &|p| format!("{:.2}x", p.ratio_median)),
            ("goal", &|p| {
                let met = if p.goal_met { "met" } else { "NOT met" };
                format!("{} ({met})", p.goal)
            }),
            ("kvlab tok/s", &|p| fmt(&p.kvlab_tok_s)),
            ("peer tok/s", &|p| fmt(&p.peer_tok_s)),
            ("threads", &|p| p.threads.to_string()),
            ("steps", &|p| p.steps.to_string()),
            ("prompt", &|p| {
                p.prompt_tokens
                    .map_or_else(|| "-".into(), |n| n.to_string())
            }),
            ("same text", &|p| {
                let same = match p.same_tokens {
                    Some(true) => "yes",
                    Some(false) => "NO",
                    None => "not compared",
                };
                same.into()
            }),
        ],
    );
    let met = r.rows.iter().filter(|p| p.goal_met).count();
    println!(
        "goals met in this run: {met} of {} rows{}",
        r.rows.len(),
        if r.missing.is_empty() {
            ""
        } else {
            " (rows missing below)"
        }
    );
    for m in &r.missing {
        println!("missing: {} / {}: {}", m.model, m.peer, m.why);
    }
    println!("machine: {}", r.machine);
    if let Some(gbs) = r.read_gb_per_s {
        println!(
            "read bandwidth: {gbs:.1} GB/s from DRAM, the best of 1 and every thread at the \
             start (the decode rows' fractions are of it, or where a side's weights fit in \
             the last-level cache, of a plain read of its step's bytes there with the row's \
             threads)"
        );
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_padded_tokenizer_encodes_as_its_base_and_names_every_id() {
        use kvlab_model::Tokenizer;
        let Some(base) = kvlab_model::registry::test_model_file("tok512.bin") else {
            return;
        };
        let bytes = std::fs::read(&base).unwrap();
        let dir = tempfile::tempdir().unwrap();
        let padded = dir.path().join("padded.bin");
        std::fs::write(&padded, pad_llama2c_tokenizer(&bytes, 600).unwrap()).unwrap();
        let (a, b) = (
            Tokenizer::load_llama2c(&base, 512).unwrap(),
            Tokenizer::load_llama2c(&padded, 600).unwrap(),
        );
        let text = "Once upon a time, a little dog found a big red ball.";
        assert_eq!(a.encode(text, true, false), b.encode(text, true, false));
        let spm = b.as_spm().unwrap();
        assert_eq!(spm.piece(599), "\u{E000}pad 599".as_bytes());
        assert_eq!(spm.piece(511), a.as_spm().unwrap().piece(511));
        // A file cut inside a piece, or one already as large, is refused.
        assert!(pad_llama2c_tokenizer(&bytes[..bytes.len() - 1], 600).is_err());
        assert!(pad_llama2c_tokenizer(&bytes, 512).is_err());
    }

    #[test]
    fn goals_are_strict_where_the_issue_says_beat() {
        assert!(!Goal::BEAT.met(1.0) && Goal::BEAT.met(1.01));
        assert!(Goal::at_least(8.0).met(8.0) && !Goal::at_least(8.0).met(7.99));
        assert_eq!(Goal::BEAT.text(), "> 1");
        assert_eq!(Goal::at_least(1.8).text(), "≥ 1.8");
        assert!(!Goal::at_least(1.0).met(f64::NAN));
    }

    #[test]
    fn fed_ids_come_from_trace_lines_only() {
        let err = "[trace] pos     0 fed [1, 403, 407] len 3\n[trace]   layer  0 K,V (3, 32)\n\
                   [trace] pos     3 fed [432] len 4\n{\"prefill_tokens_per_s\": 1.0}\n";
        assert_eq!(kvlab_fed_ids(err), vec![vec![1, 403, 407], vec![432]]);
    }

    #[test]
    fn number_after_takes_the_last_match() {
        let t = "achieved tok/s: 12.5\nachieved tok/s: 400.25 done";
        assert_eq!(number_after(t, "achieved tok/s: "), Some(400.25));
    }
}

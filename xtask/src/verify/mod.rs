//! `cargo xtask verify`: every engine must produce the naive engine's greedy tokens, token for
//! token, on every model of `fixtures/models.json` and every prompt of `fixtures/prompts.txt`
//! (or, for models with an oracle fixture, its cases).
//!
//! For each (model, case): the first cached engine greedy-generates to the end of the context
//! (stop tokens are ignored, so every position is compared). The naive engine then computes the
//! logits of every one of those positions in one causally masked pass over the whole sequence —
//! exactly what it returns step by step, at the cost of one forward — and checks that its argmax
//! at each position is the generated token: by induction, the naive engine's own greedy run would
//! give the same sequence. Every engine's tokens are compared with it, and its logits (greedy
//! run, or the sequence teacher-forced when its tokens differ) with the naive ones (f32 engines:
//! max |Δ| ≤ 1e-4 + 1e-4 · max |ref| at every position). A divergence is reported with its step, both tokens and the naive
//! top-2 margin there: a near-tie flipped by float noise is still a failure to investigate.
//! Oracle cases also compare the tokens with another implementation's (llama.cpp for Gemma).
//! A missing real checkpoint is SKIPPED, or a failure with `KVLAB_REQUIRE_MODELS=1`.

use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::Arc;
use std::time::Instant;

use anyhow::{Context, Result, bail};
use indicatif::{ProgressBar, ProgressStyle};
use kvlab_engines::{self as engines, EngineKind};
use kvlab_model::registry::{self, Located, ModelEntry};
use kvlab_model::sampler::{argmax, top2_margin};
use kvlab_model::{Engine, Model, Tolerance, WeightFormat, compare_logits, teacher_force};
use rayon::prelude::*;
use serde::Serialize;

use crate::{paths, prompts, table};

mod batched;
mod cases;
mod formats;

use cases::Case;

/// `cargo xtask verify`: every engine gives the naive engine's greedy tokens on every model and
/// prompt.
#[derive(clap::Args)]
#[command(
    after_help = "env: KVLAB_MODELS (folder of real checkpoints), KVLAB_REQUIRE_MODELS=1 (a \
                  missing checkpoint fails)"
)]
pub struct Opts {
    /// Only this model (repeatable); default: every model marked verify in fixtures/models.json
    #[arg(long = "model", value_name = "NAME")]
    models: Vec<String>,
    /// Only this engine besides the naive reference (repeatable); default: all
    #[arg(long = "engine", value_name = "NAME", value_parser = |s: &str| s.parse::<EngineKind>())]
    engines: Vec<EngineKind>,
    /// Prompt fixture file [default: fixtures/prompts.txt]
    #[arg(long, value_name = "FILE")]
    prompts: Option<PathBuf>,
    /// JSON report [default: target/kvlab-verify/verify.json]
    #[arg(long, value_name = "FILE")]
    out: Option<PathBuf>,
}

/// `cmd` (a `cargo` build, or a shell that runs one) without the package variables `cargo run`
/// set for xtask itself: `CARGO_MANIFEST_*`, `CARGO_PKG_*`, `CARGO_CRATE_NAME`,
/// `CARGO_BIN_NAME`, `CARGO_PRIMARY_PACKAGE`. Build scripts such as ring's declare
/// `rerun-if-env-changed` on some of them, and cargo compares its own environment: a build run
/// from xtask (which saw xtask's values) and one run from the shell (which saw none) rebuilt
/// ring, rustls, ureq, hf-hub and kvlab-cli in turn, an LTO relink each time (~30 s here, and
/// several times in a CI run).
pub fn without_cargo_run_env(cmd: &mut Command) -> &mut Command {
    for (key, _) in std::env::vars_os() {
        let Some(key) = key.to_str() else { continue };
        if key.starts_with("CARGO_MANIFEST_")
            || key.starts_with("CARGO_PKG_")
            || matches!(
                key,
                "CARGO_CRATE_NAME" | "CARGO_BIN_NAME" | "CARGO_PRIMARY_PACKAGE"
            )
        {
            cmd.env_remove(key);
        }
    }
    cmd
}

/// Where two greedy runs first differ.
#[derive(Serialize, Clone)]
struct Divergence {
    step: usize,
    reference: u32,
    got: u32,
    reference_top2_margin: f32,
}

/// One row of the report.
#[derive(Serialize, Clone, Default)]
struct Row {
    model: String,
    prompt_index: usize,
    prompt: String,
    prompt_tokens: usize,
    /// The prompt was longer than the context and was cut to max_seq_len − 1 tokens.
    prompt_cut: bool,
    engine: String,
    /// "reference", "ok", "MISMATCH", "SKIPPED" or "ERROR".
    status: String,
    tokens_compared: usize,
    identical: bool,
    first_divergence: Option<Divergence>,
    /// Largest |Δlogit| over every teacher-forced position and vocabulary entry.
    max_abs_dlogit: f32,
    /// Smallest top-2 margin of the reference's logits over the generation.
    min_top2_margin: f32,
    ms: f64,
    note: String,
    /// Weight formats only: fraction of positions whose top-1 token is the f32 engine's.
    #[serde(skip_serializing_if = "Option::is_none")]
    top1_agreement: Option<f64>,
    /// Batched mode only: what the scheduler did.
    #[serde(skip_serializing_if = "Option::is_none")]
    batch: Option<BatchInfo>,
}

/// The scheduler's counters over a batched run.
#[derive(Serialize, Clone)]
struct BatchInfo {
    requests: usize,
    steps: usize,
    num_blocks: usize,
    block_size: usize,
    num_preemptions: u64,
    /// Prompt tokens served from the prefix cache.
    prefix_cache_hits: u64,
    num_recomputed_tokens: u64,
    /// Blocks spilled to the tiers (of them, offloaded on purpose as a paused request ended)
    /// and restored from them (the run with tiers; 0 otherwise).
    num_spills: u64,
    num_offloaded_blocks: u64,
    num_restores: u64,
}

/// A model ready to verify: its manifest entry, weights (matrices in f32), tokenizer, cases,
/// the model as its checkpoint stores it (for the weight formats' tolerance mode), and the draft
/// of its speculative runs with a draft model (the stored model's first half of layers,
/// [`Model::early_exit`]).
type Loaded<'a> = (
    &'a ModelEntry,
    Arc<Model>,
    kvlab_model::Tokenizer,
    Vec<Case>,
    Model,
    Arc<Model>,
);

/// `cargo xtask verify` with its parsed options: the table, verify.json, the verdict.
///
/// # Errors
/// A token or logit mismatch, an engine that fails, a missing model under
/// `KVLAB_REQUIRE_MODELS=1`, an unreadable prompt file or an unwritable report.
pub fn run(o: Opts) -> Result<()> {
    let out = o.out.unwrap_or_else(paths::verify_report);
    let require = std::env::var("KVLAB_REQUIRE_MODELS").is_ok_and(|v| v == "1");
    let fixture = paths::fixtures().join("prompts.txt");
    let prompts = prompts::load(o.prompts.as_ref().unwrap_or(&fixture))?;
    let mut rows: Vec<Row> = Vec::new();
    let engines = available_engines(&o.engines, &mut rows);
    let loaded = load_models(&o.models, &prompts, &mut rows)?;
    let refs = run_cases(&loaded, &engines, &mut rows);
    run_batched(&loaded, &refs, &engines, &mut rows);
    if engines.contains(&EngineKind::Cpu) {
        run_formats(&loaded, &refs, &mut rows);
    }
    report(&rows, &out)?;
    verdict(&rows, require)
}

/// The cached engines to compare with the reference; those this machine cannot run (cuda
/// without a GPU) get a SKIPPED row, or an ERROR one when required.
fn available_engines(wanted: &[EngineKind], rows: &mut Vec<Row>) -> Vec<EngineKind> {
    let mut out = Vec::new();
    for e in engines::selected(wanted)
        .into_iter()
        .filter(|e| e.has_cache())
    {
        match engines::availability(e) {
            Ok(()) => out.push(e),
            Err(why) => {
                let required = engines::require_cuda();
                eprintln!(
                    "{} engine {e}: {why}",
                    if required { "FAILED" } else { "SKIPPED" }
                );
                rows.push(Row {
                    status: if required { "ERROR" } else { "SKIPPED" }.into(),
                    note: why,
                    ..Row::empty("all", e.name())
                });
            }
        }
    }
    out
}

/// Loads every model asked for (sequentially: loading checks sha256) and builds its cases; a
/// missing checkpoint gets a SKIPPED row, a broken one an ERROR row.
fn load_models<'a>(
    names: &[String],
    prompts: &[String],
    rows: &mut Vec<Row>,
) -> Result<Vec<Loaded<'a>>> {
    let entries: Vec<&ModelEntry> = registry::manifest()
        .models
        .iter()
        .filter(|m| {
            if names.is_empty() {
                m.verify
            } else {
                names.iter().any(|n| n.eq_ignore_ascii_case(&m.name))
            }
        })
        .collect();
    if entries.is_empty() {
        bail!("no model matches {names:?}; see fixtures/models.json");
    }
    let mut loaded = Vec::new();
    for entry in entries {
        let result = load(entry).and_then(|m| {
            let (model, tok) = match m {
                Ok(m) => m,
                Err(why) => return Ok(Err(why)),
            };
            let ctx = entry
                .verify_max_seq_len
                .unwrap_or(model.config.max_seq_len)
                .min(model.config.max_seq_len);
            let cases = cases::for_model(entry, ctx, &tok, prompts)?;
            // The identity suite runs f32 matrices (a GGUF's blocks decoded once); the stored
            // model is kept for the formats' tolerance mode.
            let f32_model = model.clone().with_weight_format(WeightFormat::F32);
            let draft = Arc::new(model.early_exit(model.config.n_layers.div_ceil(2))?);
            Ok(Ok((entry, Arc::new(f32_model), tok, cases, model, draft)))
        });
        match result {
            Ok(Ok(l)) => loaded.push(l),
            Ok(Err(why)) => {
                eprintln!("SKIPPED {}: {why}", entry.name);
                rows.push(Row {
                    status: "SKIPPED".into(),
                    note: why,
                    ..Row::empty(&entry.name, "all")
                });
            }
            Err(e) => rows.push(Row {
                status: "ERROR".into(),
                note: format!("{e:#}"),
                ..Row::empty(&entry.name, "all")
            }),
        }
    }
    Ok(loaded)
}

/// Runs the (model, case) pairs on one worker per core (each is independent) and puts the
/// rows back in order; returns each model's verified references, for the batched mode.
fn run_cases(
    loaded: &[Loaded],
    engines: &[EngineKind],
    rows: &mut Vec<Row>,
) -> Vec<Vec<Option<Reference>>> {
    let work: Vec<(usize, usize)> = loaded
        .iter()
        .enumerate()
        .flat_map(|(m, l)| (0..l.3.len()).map(move |c| (m, c)))
        .collect();
    let bar = ProgressBar::new(work.len() as u64);
    bar.set_style(
        ProgressStyle::with_template(
            "{spinner} verify [{bar:30}] {pos}/{len} cases, {elapsed} elapsed, eta {eta} {msg}",
        )
        .expect("template")
        .progress_chars("=> "),
    );
    // On rayon's pool, a worker per core; `collect` keeps the cases' order.
    let done: Vec<CaseResult> = work
        .par_iter()
        .map(|&(m, c)| {
            let (entry, model, _, cases, _, draft) = &loaded[m];
            bar.set_message(format!("{} case {c}", entry.name));
            let r = verify_case(entry, (model, draft), &cases[c], engines);
            bar.inc(1);
            if bar.is_hidden() {
                // No terminal (CI, a pipe): say how far we are in plain lines.
                eprintln!(
                    "verify: {}/{} {} case {c} done ({:.0} s)",
                    bar.position(),
                    work.len(),
                    entry.name,
                    bar.elapsed().as_secs_f64()
                );
            }
            r
        })
        .collect();
    bar.finish_and_clear();
    let mut refs: Vec<Vec<Option<Reference>>> = loaded.iter().map(|_| Vec::new()).collect();
    for (&(m, _), (r, reference)) in work.iter().zip(done) {
        rows.extend(r);
        refs[m].push(reference);
    }
    refs
}

/// Batched mode: every prompt of a model at once through the scheduler and a paged engine.
fn run_batched(
    loaded: &[Loaded],
    refs: &[Vec<Option<Reference>>],
    engines: &[EngineKind],
    rows: &mut Vec<Row>,
) {
    for &name in engines.iter().filter(|e| e.is_paged()) {
        for ((entry, model, tok, _, _, draft), refs) in loaded.iter().zip(refs) {
            eprintln!("verify: batched run of {} on {name}", entry.name);
            rows.extend(
                batched::run(entry, (model, draft), tok, refs, name).unwrap_or_else(|e| {
                    vec![Row {
                        prompt: "batched".into(),
                        status: "ERROR".into(),
                        note: format!("{e:#}"),
                        ..Row::empty(&entry.name, name.name())
                    }]
                }),
            );
        }
    }
}

/// Weight formats in tolerance mode, for the models with a real checkpoint (a synthetic model's
/// random weights say nothing about a format's quality).
fn run_formats(loaded: &[Loaded], refs: &[Vec<Option<Reference>>], rows: &mut Vec<Row>) {
    for ((entry, f32_model, _, _, stored, _), refs) in loaded.iter().zip(refs) {
        if entry.model.is_some() {
            eprintln!(
                "verify: weight formats and KV dtypes of {} in tolerance mode",
                entry.name
            );
            rows.extend(formats::run(entry, f32_model, stored, refs));
        }
    }
}

/// Fails on a mismatch, an error, or (with `KVLAB_REQUIRE_MODELS=1`) a missing model; prints
/// the closing line otherwise.
fn verdict(rows: &[Row], require: bool) -> Result<()> {
    let failed: Vec<&Row> = rows
        .iter()
        .filter(|r| {
            r.status == "MISMATCH"
                || r.status == "ERROR"
                || (require && r.status == "SKIPPED" && r.engine == "all")
        })
        .collect();
    if !failed.is_empty() {
        for r in &failed {
            eprintln!(
                "FAILED: {} / prompt {} / {}: {} {}",
                r.model, r.prompt_index, r.engine, r.status, r.note
            );
        }
        if require && failed.iter().any(|r| r.status == "SKIPPED") {
            eprintln!(
                "KVLAB_REQUIRE_MODELS=1: missing checkpoints are failures; set KVLAB_MODELS to the folder holding them"
            );
        }
        bail!("verify failed: {} of {} rows", failed.len(), rows.len());
    }
    println!("{}", passed(rows)?);
    Ok(())
}

/// The closing line of a verify run that had no failure. A run that compared no engine with the
/// reference (every model skipped, or filters that select nothing) proves nothing and fails.
fn passed(rows: &[Row]) -> Result<String> {
    let ok: Vec<&Row> = rows.iter().filter(|r| r.status == "ok").collect();
    if ok.is_empty() {
        let skipped: Vec<String> = rows
            .iter()
            .filter(|r| r.status == "SKIPPED")
            .map(|r| format!("{} / {}: {}", r.model, r.engine, r.note))
            .collect();
        bail!(
            "verify compared no engine with the reference ({} rows{}); set KVLAB_MODELS to the \
             folder holding the checkpoints, or choose --model and --engine values that can run \
             here (not only the reference engine, naive)",
            rows.len(),
            if skipped.is_empty() {
                String::new()
            } else {
                format!("; skipped: {}", skipped.join("; "))
            }
        );
    }
    let compared: usize = ok.iter().map(|r| r.tokens_compared).sum();
    let within = rows.iter().filter(|r| r.status == "within").count();
    Ok(format!(
        "verify passed: {} engine runs, {compared} tokens identical to the naive reference{}",
        ok.len(),
        if within > 0 {
            format!("; {within} weight-format runs within their tolerance of f32")
        } else {
            String::new()
        }
    ))
}

impl Row {
    fn empty(model: &str, engine: &str) -> Row {
        Row {
            model: model.into(),
            engine: engine.into(),
            min_top2_margin: f32::INFINITY,
            ..Row::default()
        }
    }
}

/// A manifest model's files: the model's and the tokenizer's, where it has them.
type Files = (Option<PathBuf>, Option<PathBuf>);

/// A manifest model's files, or why they cannot be found.
pub fn locate(name: &str) -> Result<std::result::Result<Files, String>> {
    Ok(match registry::locate(name)? {
        Located::Ready {
            model, tokenizer, ..
        } => Ok((model, tokenizer)),
        Located::Missing { file, searched, .. } => Err(format!(
            "{} not found in {searched} (set KVLAB_MODELS to the folder holding it)",
            file.file
        )),
    })
}

/// Loads a manifest model after checking its files' sha256, or says which file is missing.
fn load(
    entry: &ModelEntry,
) -> Result<std::result::Result<(Model, kvlab_model::Tokenizer), String>> {
    let (model, tokenizer) = match locate(&entry.name)? {
        Ok(paths) => paths,
        Err(why) => return Ok(Err(why)),
    };
    for (path, f) in [(&model, &entry.model), (&tokenizer, &entry.tokenizer)] {
        if let (Some(path), Some(f)) = (path, f) {
            let sha = registry::sha256_file(path)?;
            if sha != f.sha256 {
                bail!(
                    "{} has sha256 {sha}, fixtures/models.json expects {}",
                    path.display(),
                    f.sha256
                );
            }
        }
    }
    let loaded = registry::load_entry(entry, model.as_deref(), tokenizer.as_deref())?;
    let tok = loaded.tokenizer.with_context(|| {
        format!(
            "{} has no tokenizer, so text prompts cannot be verified on it",
            entry.name
        )
    })?;
    Ok(Ok((loaded.model, tok)))
}

/// Greedy generation of `n_gen` tokens after `prompt` prefilled `ubatch` tokens a call (0: in
/// one), stop tokens ignored; returns the tokens and the logits that predicted each of them.
fn greedy(
    engine: &mut dyn Engine,
    (prompt, ubatch): (&[u32], usize),
    n_gen: usize,
) -> Result<(Vec<u32>, Vec<Vec<f32>>)> {
    let seq = engine.new_sequence(prompt.len() + n_gen - 1)?;
    let out = (|| -> Result<_> {
        let mut logits = kvlab_model::prefill_chunked(engine, seq, prompt, ubatch)?;
        let (mut tokens, mut all) = (Vec::new(), Vec::new());
        loop {
            let next = argmax(&logits);
            tokens.push(next);
            if tokens.len() == n_gen {
                all.push(logits);
                break;
            }
            all.push(std::mem::replace(&mut logits, engine.decode(seq, next)?));
        }
        Ok((tokens, all))
    })();
    engine.free(seq);
    out
}

/// A case's rows and the naive engine's verified tokens (for the batched mode).
type CaseResult = (Vec<Row>, Option<Reference>);

/// The naive engine's verdict on a generated sequence.
struct NaiveCheck {
    /// Logits of every generated position. (n_gen, vocab_size)
    logits: Vec<Vec<f32>>,
    /// First step whose naive argmax is not the generated token.
    first_mismatch: Option<usize>,
}

fn naive_check(model: &Arc<Model>, prompt: &[u32], tokens: &[u32]) -> Result<NaiveCheck> {
    let naive = kvlab_naive::NaiveEngine::new(model.clone());
    let seq: Vec<u32> = prompt
        .iter()
        .chain(&tokens[..tokens.len() - 1])
        .copied()
        .collect();
    let logits = naive.logits_at_every_position(&seq, prompt.len() - 1)?;
    let first_mismatch = logits.iter().zip(tokens).position(|(l, &t)| argmax(l) != t);
    Ok(NaiveCheck {
        logits,
        first_mismatch,
    })
}

/// The first cached engine's greedy run, checked at every position by one naive pass.
struct Generated {
    /// The first engine's tokens and the logits that chose them, and its time.
    tokens: Vec<u32>,
    logits: Vec<Vec<f32>>,
    ms: f64,
    check: NaiveCheck,
    /// The naive engine's own greedy tokens, as far as they are known: the generated ones up
    /// to its first disagreement, then its own choice there.
    reference: Vec<u32>,
    /// Smallest top-2 margin of the naive logits.
    min_margin: f32,
    /// Time of the naive check.
    naive_ms: f64,
}

impl Generated {
    /// Where `got` first leaves the reference.
    fn divergence(&self, got: &[u32]) -> Option<Divergence> {
        let step = self
            .reference
            .iter()
            .zip(got)
            .position(|(a, b)| a != b)
            .or(self.check.first_mismatch)?;
        Some(Divergence {
            step,
            reference: self.reference[step],
            got: got[step],
            reference_top2_margin: top2_margin(&self.check.logits[step]),
        })
    }
}

fn verify_case(
    entry: &ModelEntry,
    (model, draft): (&Arc<Model>, &Arc<Model>),
    case: &Case,
    engines: &[EngineKind],
) -> CaseResult {
    let base = Row {
        prompt_index: case.index,
        prompt: case.label.clone(),
        prompt_tokens: case.prompt.len(),
        prompt_cut: case.cut,
        note: if case.cut {
            format!(
                "prompt cut to {} tokens to fill the context",
                case.prompt.len()
            )
        } else {
            String::new()
        },
        ..Row::empty(&entry.name, EngineKind::REFERENCE.name())
    };
    let error = |engine: &str, e: anyhow::Error| Row {
        engine: engine.into(),
        status: "ERROR".into(),
        note: format!("{e:#}"),
        ..base.clone()
    };
    let Some(&first) = engines.first() else {
        let e = anyhow::anyhow!("no engine to verify");
        return (vec![error("all", e)], None);
    };
    // 1. The first cached engine generates; the naive engine checks every position in one pass.
    let g = match generate_and_check(model, case, first) {
        Ok(g) => g,
        Err((engine, e)) => return (vec![error(engine.name(), e)], None),
    };
    let mut rows = vec![Row {
        status: "reference".into(),
        tokens_compared: g.tokens.len(),
        identical: g.check.first_mismatch.is_none(),
        min_top2_margin: g.min_margin,
        ms: g.naive_ms,
        note: "one masked pass over the generated sequence".into(),
        ..base.clone()
    }];
    // 2. Every engine against the naive logits, then with the prompt prefilled in chunks
    //    (the naive engine has no cache to fill in chunks).
    for &name in engines {
        let row = compare_engine(model, case, name, first, &g, &base);
        rows.push(row.unwrap_or_else(|e| error(name.name(), e)));
    }
    for &name in engines.iter().filter(|&&e| e != EngineKind::REFERENCE) {
        let row = compare_chunked(model, case, name, &g, &base);
        rows.push(row.unwrap_or_else(|e| error(name.name(), e)));
        let row = compare_speculative((model, draft), case, name, &g, &base);
        rows.push(row.unwrap_or_else(|e| error(name.name(), e)));
    }
    // 3. Other implementations' ids, where the case has them.
    rows.extend(
        case.oracles
            .iter()
            .map(|o| oracle_row(o, &g.reference, &base)),
    );
    let reference = Reference {
        prompt: case.prompt.clone(),
        tokens: g.reference,
    };
    (rows, Some(reference))
}

/// Step 1 of a case: `first` greedy-generates, the naive engine checks it; an error names the
/// engine that failed.
fn generate_and_check(
    model: &Arc<Model>,
    case: &Case,
    first: EngineKind,
) -> std::result::Result<Generated, (EngineKind, anyhow::Error)> {
    let t = Instant::now();
    let (tokens, logits) = engines::build(first, model.clone())
        .and_then(|mut e| greedy(e.as_mut(), (&case.prompt, 0), case.n_gen))
        .map_err(|e| (first, e))?;
    let ms = t.elapsed().as_secs_f64() * 1e3;
    let t = Instant::now();
    let check =
        naive_check(model, &case.prompt, &tokens).map_err(|e| (EngineKind::REFERENCE, e))?;
    let min_margin = check
        .logits
        .iter()
        .map(|l| top2_margin(l))
        .fold(f32::INFINITY, f32::min);
    let reference: Vec<u32> = match check.first_mismatch {
        None => tokens.clone(),
        Some(s) => tokens[..s]
            .iter()
            .copied()
            .chain([argmax(&check.logits[s])])
            .collect(),
    };
    Ok(Generated {
        tokens,
        logits,
        ms,
        check,
        reference,
        min_margin,
        naive_ms: t.elapsed().as_secs_f64() * 1e3,
    })
}

/// Step 2 of a case: one engine's tokens and teacher-forced logits against the naive ones.
fn compare_engine(
    model: &Arc<Model>,
    case: &Case,
    name: EngineKind,
    first: EngineKind,
    g: &Generated,
    base: &Row,
) -> Result<Row> {
    let t = Instant::now();
    let (got, logits, ms) = if name == first {
        (g.tokens.clone(), g.logits.clone(), g.ms)
    } else {
        let mut engine = engines::build(name, model.clone())?;
        let (tokens, logits) = greedy(engine.as_mut(), (&case.prompt, 0), case.n_gen)?;
        (tokens, logits, t.elapsed().as_secs_f64() * 1e3)
    };
    // Identical tokens mean identical inputs: the greedy run's logits are the teacher-forced
    // ones. Otherwise force the generated sequence through the engine.
    let forced = if got == g.tokens {
        logits
    } else {
        let mut engine = engines::build(name, model.clone())?;
        let positions = case.prompt.len() + case.n_gen - 1;
        teacher_force(engine.as_mut(), &case.prompt, &g.tokens, positions)?
    };
    let c = compare_logits(&forced, &g.check.logits, Tolerance::F32);
    let (max_d, within) = (c.max_abs_dlogit, c.within_tolerance);
    let div = g.divergence(&got);
    let ok = div.is_none() && within;
    Ok(Row {
        engine: name.name().into(),
        status: if ok { "ok" } else { "MISMATCH" }.into(),
        tokens_compared: g.tokens.len(),
        identical: div.is_none(),
        first_divergence: div,
        max_abs_dlogit: max_d,
        min_top2_margin: g.min_margin,
        ms,
        note: if within {
            base.note.clone()
        } else {
            let Tolerance { abs, rel } = Tolerance::F32;
            format!("teacher-forced logits exceed max|Δ| ≤ {abs} + {rel}·max|ref|")
        },
        ..base.clone()
    })
}

/// Prompt tokens per prefill call in the chunked solo runs, by case: one token a call, a chunk
/// shorter than a paged block, and one that straddles blocks, so that every model meets all
/// three over its cases.
const UBATCH_SIZES: [usize; 3] = [1, 7, 21];

/// Tokens the chunked solo runs generate: enough to read back every chunk's keys; the full
/// greedy run already checks long decodes.
const CHUNKED_TOKENS: usize = 8;

/// Step 2b of a case: one engine prefills the prompt in chunks of `UBATCH_SIZES` (by case) and
/// greedy-decodes `CHUNKED_TOKENS` tokens, which must be the reference's.
fn compare_chunked(
    model: &Arc<Model>,
    case: &Case,
    name: EngineKind,
    g: &Generated,
    base: &Row,
) -> Result<Row> {
    let t = Instant::now();
    let ubatch = UBATCH_SIZES[case.index % UBATCH_SIZES.len()];
    let n_gen = case.n_gen.min(CHUNKED_TOKENS).min(g.reference.len());
    anyhow::ensure!(n_gen > 0, "no reference token to compare with");
    let mut engine = engines::build(name, model.clone())?;
    let (got, _) = greedy(engine.as_mut(), (&case.prompt, ubatch), n_gen)?;
    let step = (0..n_gen).find(|&s| got[s] != g.reference[s]);
    Ok(variant_row(
        base,
        format!("{} ubatch={ubatch}", name.name()),
        (g, &got, step, n_gen),
        t,
        format!("prompt prefilled {ubatch} tokens a call, then {n_gen} greedy tokens"),
    ))
}

/// The row of a variant of one engine's run (chunked, speculative), labelled `engine`: `got`
/// against the reference's tokens, `compared` of them, first differing at `step`.
fn variant_row(
    base: &Row,
    engine: String,
    (g, got, step, compared): (&Generated, &[u32], Option<usize>, usize),
    t: Instant,
    note: String,
) -> Row {
    Row {
        engine,
        status: if step.is_none() { "ok" } else { "MISMATCH" }.into(),
        tokens_compared: compared,
        identical: step.is_none(),
        first_divergence: step.map(|s| Divergence {
            step: s,
            reference: g.reference.get(s).copied().unwrap_or(u32::MAX),
            got: got.get(s).copied().unwrap_or(u32::MAX),
            reference_top2_margin: f32::NAN,
        }),
        max_abs_dlogit: f32::NAN,
        ms: t.elapsed().as_secs_f64() * 1e3,
        note,
        ..base.clone()
    }
}

/// Guesses per step in the speculative solo runs, by case, so every model meets each.
const SPECULATIVE_K: [usize; 3] = [1, 4, 8];

/// Step 2c of a case: one engine decodes speculatively (`SPECULATIVE_K` guesses a step by case;
/// prompt lookup on even cases, a draft model on odd ones: `draft`, the model's first half of
/// layers, on the same engine, its own cache rolled back too; greedy verification, the cache
/// rolled back after each rejection); every token must be the reference's, up to a stop token
/// where generation ends.
fn compare_speculative(
    (model, draft): (&Arc<Model>, &Arc<Model>),
    case: &Case,
    name: EngineKind,
    g: &Generated,
    base: &Row,
) -> Result<Row> {
    let t = Instant::now();
    let k = SPECULATIVE_K[case.index % SPECULATIVE_K.len()];
    let n_gen = case.n_gen.min(g.reference.len());
    anyhow::ensure!(n_gen > 0, "no reference token to compare with");
    let mut engine = engines::build(name, model.clone())?;
    let proposer = if case.index.is_multiple_of(2) {
        kvlab_model::Proposer::Ngram(kvlab_model::NgramProposer::default())
    } else {
        let vocab = model.config.vocab_size;
        let draft = engines::build(name, draft.clone())?;
        kvlab_model::Proposer::Draft(kvlab_model::DraftModel::new(draft, vocab)?)
    };
    let method = proposer.method();
    let opts = kvlab_model::GenerateOptions {
        steps: case.prompt.len() + n_gen - 1,
        max_seq_len: case.prompt.len() + n_gen - 1,
        trace: false,
        special: false,
        ubatch: 0,
        speculative: Some(kvlab_model::Speculative {
            proposer,
            num_speculative_tokens: k,
        }),
    };
    let mut sampler = kvlab_model::Sampler::greedy();
    let out =
        kvlab_model::generate_tokens(engine.as_mut(), &case.prompt, &opts, &mut sampler, |_| {})?;
    let got = out.tokens;
    let mut step = (0..got.len()).find(|&s| g.reference.get(s) != got.get(s));
    // Generation ended at a stop token (not in `tokens`): the reference must hold one there.
    let stop_ids = &model.config.stop_ids;
    let at = got.len();
    if step.is_none() && out.stopped && !g.reference.get(at).is_some_and(|t| stop_ids.contains(t)) {
        step = Some(at);
    }
    let s = out.spec;
    Ok(variant_row(
        base,
        format!("{} speculative {method} k={k}", name.name()),
        (g, &got, step, got.len() + usize::from(out.stopped)),
        t,
        format!(
            "{method}: {} of {} guesses kept, {} rollbacks",
            s.num_accepted_tokens, s.num_draft_tokens, s.num_rollbacks
        ),
    ))
}

/// Step 3 of a case: another implementation's ids against the reference's.
fn oracle_row(o: &cases::Oracle, reference: &[u32], base: &Row) -> Row {
    let step = o.ids.iter().zip(reference).position(|(a, b)| a != b);
    let (status, note) = match step {
        None => ("ok", format!("identical to {}", o.source)),
        Some(s) if o.margins.get(s).is_some_and(|&m| m < o.near_tie) => (
            "near-tie",
            format!(
                "{} diverges at step {s} where its own top-2 margin is {:.3} < {}: it computes in lower precision (8-bit activations)",
                o.source, o.margins[s], o.near_tie
            ),
        ),
        Some(s) => (
            "MISMATCH",
            format!(
                "{} diverges at step {s} with top-2 margin {:.3}",
                o.source,
                o.margins.get(s).copied().unwrap_or(f32::NAN)
            ),
        ),
    };
    Row {
        engine: o.source.split(' ').next().unwrap_or("oracle").to_string(),
        status: status.into(),
        tokens_compared: o.ids.len(),
        identical: step.is_none(),
        first_divergence: step.map(|s| Divergence {
            step: s,
            reference: reference[s],
            got: o.ids[s],
            reference_top2_margin: o.margins.get(s).copied().unwrap_or(f32::NAN),
        }),
        min_top2_margin: o.margins.iter().copied().fold(f32::INFINITY, f32::min),
        note,
        ..base.clone()
    }
}

/// The naive engine's greedy tokens for `prompt`: generated by the CPU engine and checked at every
/// position by one naive pass.
///
/// # Errors
/// Engine errors, or a position where the two disagree.
fn reference_run(model: &Arc<Model>, prompt: &[u32], n_gen: usize) -> Result<Vec<u32>> {
    let (tokens, _) = greedy(
        engines::build(EngineKind::Cpu, model.clone())?.as_mut(),
        (prompt, 0),
        n_gen,
    )?;
    if let Some(s) = naive_check(model, prompt, &tokens)?.first_mismatch {
        bail!("the cpu and naive engines disagree at step {s} of a batched-mode reference");
    }
    Ok(tokens)
}

/// The naive engine's greedy tokens for a prompt (as far as verified).
struct Reference {
    prompt: Vec<u32>,
    tokens: Vec<u32>,
}

fn report(rows: &[Row], out: &Path) -> Result<()> {
    let identical = |r: &Row| match r.status.as_str() {
        "SKIPPED" | "ERROR" => "-",
        _ if r.identical => "yes",
        _ => "NO",
    };
    table::columns(
        rows,
        &[
            ("model", &|r| r.model.clone()),
            ("prompt", &|r| format!("{:>2} {}", r.prompt_index, r.prompt)),
            ("engine", &|r| r.engine.clone()),
            ("status", &|r| r.status.clone()),
            ("tokens compared", &|r| {
                let cut = if r.prompt_cut { ", cut" } else { "" };
                format!("{} (+{} prompt{cut})", r.tokens_compared, r.prompt_tokens)
            }),
            ("identical", &|r| identical(r).into()),
            ("first divergence", &|r| {
                r.first_divergence.as_ref().map_or("-".into(), |d| {
                    format!(
                        "step {}: {} vs {} (margin {:.2e})",
                        d.step, d.reference, d.got, d.reference_top2_margin
                    )
                })
            }),
            ("max |Δlogit|", &|r| match r.engine == EngineKind::REFERENCE
                || r.max_abs_dlogit.is_nan()
            {
                true => "-".into(),
                false => format!("{:.1e}", r.max_abs_dlogit),
            }),
            ("min margin", &|r| match r.min_top2_margin.is_finite() {
                true => format!("{:.3}", r.min_top2_margin),
                false => "-".into(),
            }),
            ("ms", &|r| format!("{:.0}", r.ms)),
        ],
    );
    for r in rows {
        if let Some(b) = &r.batch {
            println!(
                "{} {} / {}: {} requests in {} steps, pool {} blocks x {} tokens: {} preemptions, {} prefix-cache hit tokens, {} recomputed tokens{}",
                r.prompt.split(':').next().unwrap_or("batched"),
                r.model,
                r.engine,
                b.requests,
                b.steps,
                b.num_blocks,
                b.block_size,
                b.num_preemptions,
                b.prefix_cache_hits,
                b.num_recomputed_tokens,
                if b.num_spills > 0 {
                    format!(
                        ", {} blocks spilled ({} offloaded paused) and {} restored",
                        b.num_spills, b.num_offloaded_blocks, b.num_restores
                    )
                } else {
                    String::new()
                }
            );
        }
    }
    for r in rows
        .iter()
        .filter(|r| !r.note.is_empty() && r.status != "ok" && r.status != "reference")
    {
        println!(
            "note: {} / {} / {}: {}",
            r.model, r.prompt_index, r.engine, r.note
        );
    }
    if let Some(dir) = out.parent() {
        std::fs::create_dir_all(dir)?;
    }
    let json =
        serde_json::json!({ "format_version": 1, "tolerance": Tolerance::F32, "rows": rows });
    std::fs::write(out, serde_json::to_string_pretty(&json)?)?;
    println!("report written to {}", out.display());
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn row(status: &str, engine: &str) -> Row {
        Row {
            status: status.into(),
            tokens_compared: 10,
            ..Row::empty("stories260K", engine)
        }
    }

    #[test]
    fn zero_engine_runs_is_a_failure_not_a_pass() {
        let e = passed(&[]).unwrap_err().to_string();
        assert!(e.contains("compared no engine"), "{e}");
        let e = passed(&[row("reference", "naive"), row("SKIPPED", "cuda")])
            .unwrap_err()
            .to_string();
        assert!(e.contains("skipped: stories260K / cuda"), "{e}");
        let ok = passed(&[row("reference", "naive"), row("ok", "cpu")]).unwrap();
        assert_eq!(
            ok,
            "verify passed: 1 engine runs, 10 tokens identical to the naive reference"
        );
    }
}

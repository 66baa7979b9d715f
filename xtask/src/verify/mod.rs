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

use std::path::PathBuf;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Instant;

use anyhow::{Context, Result, bail};
use indicatif::{ProgressBar, ProgressStyle};
use kvlab_model::registry::{self, Located, ModelEntry};
use kvlab_model::sampler::{argmax, top2_margin};
use kvlab_model::{Engine, Model, teacher_force};
use serde::Serialize;

use crate::{prompts, table};

mod batched;
mod cases;

use cases::Case;

/// Tolerance of teacher-forced logits for f32 engines (ARCHITECTURE.md's invariants).
const ABS_TOL: f32 = 1e-4;
const REL_TOL: f32 = 1e-4;

struct Opts {
    models: Vec<String>,
    engines: Vec<String>,
    prompts: PathBuf,
    out: PathBuf,
}

const USAGE: &str = "\
cargo xtask verify [--model NAME]... [--engine NAME]... [--prompts FILE] [--out FILE]

  --model NAME    only this model (repeatable); default: every model marked verify in fixtures/models.json
  --engine NAME   only this engine besides the naive reference (repeatable); default: all
  --prompts FILE  prompt fixture file (default fixtures/prompts.txt)
  --out FILE      JSON report (default target/kvlab-verify/verify.json)
env: KVLAB_MODELS (folder of real checkpoints), KVLAB_REQUIRE_MODELS=1 (a missing checkpoint fails)";

fn parse(args: &[String]) -> Result<Opts> {
    let root = workspace_root();
    let mut o = Opts {
        models: vec![],
        engines: vec![],
        prompts: root.join("fixtures/prompts.txt"),
        out: target_dir().join("kvlab-verify/verify.json"),
    };
    let mut it = args.iter();
    while let Some(a) = it.next() {
        let mut val = || {
            it.next()
                .cloned()
                .with_context(|| format!("{a} needs a value\n\n{USAGE}"))
        };
        match a.as_str() {
            "--model" => o.models.push(val()?),
            "--engine" => o.engines.push(val()?),
            "--prompts" => o.prompts = val()?.into(),
            "--out" => o.out = val()?.into(),
            "-h" | "--help" => {
                println!("{USAGE}");
                std::process::exit(0);
            }
            other => bail!("unknown option {other:?}\n\n{USAGE}"),
        }
    }
    kvlab_cli::engines::check_names(&o.engines)?;
    Ok(o)
}

pub fn workspace_root() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
        .parent()
        .expect("xtask lives in the workspace")
        .to_path_buf()
}

pub fn target_dir() -> PathBuf {
    std::env::var_os("CARGO_TARGET_DIR")
        .map(PathBuf::from)
        .unwrap_or_else(|| workspace_root().join("target"))
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
#[derive(Serialize, Clone)]
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
}

pub fn run(args: &[String]) -> Result<()> {
    let o = parse(args)?;
    let require = std::env::var("KVLAB_REQUIRE_MODELS").is_ok_and(|v| v == "1");
    let prompts = prompts::load(&o.prompts)?;
    let entries: Vec<&ModelEntry> = registry::manifest()
        .models
        .iter()
        .filter(|m| {
            if o.models.is_empty() {
                m.verify
            } else {
                o.models.iter().any(|n| n.eq_ignore_ascii_case(&m.name))
            }
        })
        .collect();
    if entries.is_empty() {
        bail!("no model matches {:?}; see fixtures/models.json", o.models);
    }
    let wanted: Vec<&str> = kvlab_cli::engines::ENGINES
        .iter()
        .copied()
        .filter(|e| *e != "naive" && (o.engines.is_empty() || o.engines.iter().any(|x| x == e)))
        .collect();
    // Engines this machine cannot run (cuda without a GPU) are SKIPPED, or fail when required.
    let mut rows: Vec<Row> = Vec::new();
    let mut engines = Vec::new();
    for e in wanted {
        match kvlab_cli::engines::availability(e) {
            Ok(()) => engines.push(e),
            Err(why) => {
                let required = kvlab_cli::engines::require_cuda();
                eprintln!(
                    "{} engine {e}: {why}",
                    if required { "FAILED" } else { "SKIPPED" }
                );
                rows.push(Row {
                    status: if required { "ERROR" } else { "SKIPPED" }.into(),
                    note: why,
                    ..Row::empty("all", e)
                });
            }
        }
    }

    // Load every model first (sequentially: loading checks sha256) and build its cases, then run
    // the (model, case) pairs on one worker per core; each is independent and rows are put back
    // in order.
    let mut loaded: Vec<(&ModelEntry, Arc<Model>, kvlab_model::Tokenizer, Vec<Case>)> = Vec::new();
    for entry in entries {
        let result = load(entry).and_then(|m| {
            m.map(|(model, tok)| {
                let ctx = entry
                    .verify_max_seq_len
                    .unwrap_or(model.config.max_seq_len)
                    .min(model.config.max_seq_len);
                let cases = cases::for_model(entry, ctx, &tok, &prompts)?;
                Ok((entry, Arc::new(model), tok, cases))
            })
            .transpose()
        });
        match result {
            Ok(Some(l)) => loaded.push(l),
            Ok(None) => {
                let why = missing_reason(entry);
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
    let next = AtomicUsize::new(0);
    let done: Mutex<Vec<(usize, CaseResult)>> = Mutex::new(Vec::new());
    let workers = std::thread::available_parallelism()
        .map_or(1, |n| n.get())
        .min(work.len().max(1));
    std::thread::scope(|scope| {
        for _ in 0..workers {
            scope.spawn(|| {
                loop {
                    let i = next.fetch_add(1, Ordering::Relaxed);
                    let Some(&(m, c)) = work.get(i) else { break };
                    let (entry, model, _, cases) = &loaded[m];
                    bar.set_message(format!("{} case {c}", entry.name));
                    let r = verify_case(entry, model, &cases[c], &engines);
                    done.lock().expect("no worker panicked").push((i, r));
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
                }
            });
        }
    });
    let mut done = done.into_inner().expect("no worker panicked");
    done.sort_by_key(|(i, _)| *i);
    let mut refs: Vec<Vec<Option<Reference>>> = loaded.iter().map(|_| Vec::new()).collect();
    for (i, (r, reference)) in done {
        rows.extend(r);
        refs[work[i].0].push(reference);
    }
    bar.finish_and_clear();

    // Batched mode: every prompt of a model at once through the scheduler and a paged engine.
    for &name in engines
        .iter()
        .filter(|e| kvlab_cli::engines::PAGED_ENGINES.contains(e))
    {
        for ((entry, model, tok, _), refs) in loaded.iter().zip(&refs) {
            eprintln!("verify: batched run of {} on {name}", entry.name);
            rows.push(
                batched::run(entry, model, tok, refs, name).unwrap_or_else(|e| Row {
                    prompt: "batched".into(),
                    status: "ERROR".into(),
                    note: format!("{e:#}"),
                    ..Row::empty(&entry.name, name)
                }),
            );
        }
    }
    report(&rows, &o)?;

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
    println!("{}", passed(&rows)?);
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
    Ok(format!(
        "verify passed: {} engine runs, {compared} tokens identical to the naive reference",
        ok.len()
    ))
}

impl Row {
    fn empty(model: &str, engine: &str) -> Row {
        Row {
            model: model.into(),
            prompt_index: 0,
            prompt: String::new(),
            prompt_tokens: 0,
            prompt_cut: false,
            engine: engine.into(),
            status: String::new(),
            tokens_compared: 0,
            identical: false,
            first_divergence: None,
            max_abs_dlogit: 0.0,
            min_top2_margin: f32::INFINITY,
            ms: 0.0,
            note: String::new(),
            batch: None,
        }
    }
}

fn missing_reason(entry: &ModelEntry) -> String {
    match registry::locate(&entry.name) {
        Ok(Located::Missing { file, searched, .. }) => format!(
            "{} not found in {searched} (set KVLAB_MODELS to the folder holding it)",
            file.file
        ),
        _ => "files missing".into(),
    }
}

/// Loads a manifest model after checking its files' sha256; `None` when a file is missing.
fn load(entry: &ModelEntry) -> Result<Option<(Model, kvlab_model::Tokenizer)>> {
    let Located::Ready {
        model, tokenizer, ..
    } = registry::locate(&entry.name)?
    else {
        return Ok(None);
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
    Ok(Some((loaded.model, tok)))
}

/// Greedy generation of `n_gen` tokens after `prompt`, stop tokens ignored; returns the tokens and
/// the logits that predicted each of them.
fn greedy(
    engine: &mut dyn Engine,
    prompt: &[u32],
    n_gen: usize,
) -> Result<(Vec<u32>, Vec<Vec<f32>>)> {
    let seq = engine.new_sequence(prompt.len() + n_gen - 1)?;
    let out = (|| -> Result<_> {
        let mut logits = engine.prefill(seq, prompt)?;
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

/// The largest |a − b| over all positions and entries, and whether every position is within
/// tolerance: max_j |a_j − b_j| ≤ ABS_TOL + REL_TOL · max_j |b_j|. The relative part is taken
/// against the position's largest reference logit, not entry by entry: a logit near zero is the
/// sum of terms as large as the others, so it carries the same absolute rounding error.
fn compare_logits(got: &[Vec<f32>], reference: &[Vec<f32>]) -> (f32, bool) {
    let mut max = 0.0f32;
    let mut ok = got.len() == reference.len();
    for (g, r) in got.iter().zip(reference) {
        let scale = r.iter().fold(0.0f32, |m, v| m.max(v.abs()));
        let worst = g
            .iter()
            .zip(r)
            .map(|(a, b)| (a - b).abs())
            .fold(0.0f32, |m, d| {
                if d.is_nan() || m.is_nan() {
                    f32::NAN
                } else {
                    m.max(d)
                }
            });
        // NaN never passes, and poisons the max.
        if worst.is_nan() || worst > ABS_TOL + REL_TOL * scale || g.len() != r.len() {
            ok = false;
        }
        max = if worst.is_nan() || max.is_nan() {
            f32::NAN
        } else {
            max.max(worst)
        };
    }
    (max, ok)
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

fn verify_case(
    entry: &ModelEntry,
    model: &Arc<Model>,
    case: &Case,
    engines: &[&str],
) -> (Vec<Row>, Option<Reference>) {
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
        ..Row::empty(&entry.name, "naive")
    };
    let error = |engine: &str, e: anyhow::Error| Row {
        engine: engine.into(),
        status: "ERROR".into(),
        note: format!("{e:#}"),
        ..base.clone()
    };
    let Some(&first) = engines.first() else {
        return (
            vec![error("all", anyhow::anyhow!("no engine to verify"))],
            None,
        );
    };

    // 1. The first cached engine generates; the naive engine checks every position in one pass.
    let t = Instant::now();
    let generated = kvlab_cli::engines::build(first, model.clone())
        .and_then(|mut e| greedy(e.as_mut(), &case.prompt, case.n_gen));
    let (tokens, first_logits) = match generated {
        Ok(g) => g,
        Err(e) => return (vec![error(first, e)], None),
    };
    let first_ms = t.elapsed().as_secs_f64() * 1e3;
    let t = Instant::now();
    let check = match naive_check(model, &case.prompt, &tokens) {
        Ok(c) => c,
        Err(e) => return (vec![error("naive", e)], None),
    };
    let min_margin = check
        .logits
        .iter()
        .map(|l| top2_margin(l))
        .fold(f32::INFINITY, f32::min);
    // The naive engine's own greedy tokens, as far as they are known: the generated ones up to
    // its first disagreement, then its own choice there.
    let reference: Vec<u32> = match check.first_mismatch {
        None => tokens.clone(),
        Some(s) => tokens[..s]
            .iter()
            .copied()
            .chain([argmax(&check.logits[s])])
            .collect(),
    };
    let divergence = |got: &[u32]| -> Option<Divergence> {
        let step = reference
            .iter()
            .zip(got)
            .position(|(a, b)| a != b)
            .or(check.first_mismatch)?;
        Some(Divergence {
            step,
            reference: reference[step],
            got: got[step],
            reference_top2_margin: top2_margin(&check.logits[step]),
        })
    };
    let mut rows = vec![Row {
        status: "reference".into(),
        tokens_compared: tokens.len(),
        identical: check.first_mismatch.is_none(),
        min_top2_margin: min_margin,
        ms: t.elapsed().as_secs_f64() * 1e3,
        note: "one masked pass over the generated sequence".into(),
        ..base.clone()
    }];

    // 2. Every engine against the naive logits.
    for &name in engines {
        let t = Instant::now();
        let result = (|| -> Result<Row> {
            let (got, logits, ms) = if name == first {
                (tokens.clone(), first_logits.clone(), first_ms)
            } else {
                let mut engine = kvlab_cli::engines::build(name, model.clone())?;
                let (g, l) = greedy(engine.as_mut(), &case.prompt, case.n_gen)?;
                (g, l, t.elapsed().as_secs_f64() * 1e3)
            };
            // Identical tokens mean identical inputs: the greedy run's logits are the
            // teacher-forced ones. Otherwise force the generated sequence through the engine.
            let forced = if got == tokens {
                logits
            } else {
                let mut engine = kvlab_cli::engines::build(name, model.clone())?;
                teacher_force(
                    engine.as_mut(),
                    &case.prompt,
                    &tokens,
                    case.prompt.len() + case.n_gen - 1,
                )?
            };
            let (max_d, within) = compare_logits(&forced, &check.logits);
            let div = divergence(&got);
            let ok = div.is_none() && within;
            Ok(Row {
                engine: name.into(),
                status: if ok { "ok" } else { "MISMATCH" }.into(),
                tokens_compared: tokens.len(),
                identical: div.is_none(),
                first_divergence: div,
                max_abs_dlogit: max_d,
                min_top2_margin: min_margin,
                ms,
                note: if within {
                    base.note.clone()
                } else {
                    format!("teacher-forced logits exceed max|Δ| ≤ {ABS_TOL} + {REL_TOL}·max|ref|")
                },
                ..base.clone()
            })
        })();
        rows.push(result.unwrap_or_else(|e| error(name, e)));
    }

    // 3. Other implementations' ids, where the case has them.
    for o in &case.oracles {
        let step = o.ids.iter().zip(&reference).position(|(a, b)| a != b);
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
        rows.push(Row {
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
        });
    }
    (
        rows,
        Some(Reference {
            prompt: case.prompt.clone(),
            tokens: reference,
        }),
    )
}

/// The naive engine's greedy tokens for `prompt`: generated by the CPU engine and checked at every
/// position by one naive pass.
///
/// # Errors
/// Engine errors, or a position where the two disagree.
fn reference_run(model: &Arc<Model>, prompt: &[u32], n_gen: usize) -> Result<Vec<u32>> {
    let (tokens, _) = greedy(
        kvlab_cli::engines::build("cpu", model.clone())?.as_mut(),
        prompt,
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

fn report(rows: &[Row], o: &Opts) -> Result<()> {
    let cells: Vec<Vec<String>> = rows
        .iter()
        .map(|r| {
            vec![
                r.model.clone(),
                format!("{:>2} {}", r.prompt_index, r.prompt),
                r.engine.clone(),
                r.status.clone(),
                format!(
                    "{} (+{} prompt{})",
                    r.tokens_compared,
                    r.prompt_tokens,
                    if r.prompt_cut { ", cut" } else { "" }
                ),
                if r.status == "SKIPPED" || r.status == "ERROR" {
                    "-".into()
                } else if r.identical {
                    "yes".into()
                } else {
                    "NO".into()
                },
                r.first_divergence.as_ref().map_or("-".into(), |d| {
                    format!(
                        "step {}: {} vs {} (margin {:.2e})",
                        d.step, d.reference, d.got, d.reference_top2_margin
                    )
                }),
                if r.engine == "naive" {
                    "-".into()
                } else {
                    format!("{:.1e}", r.max_abs_dlogit)
                },
                if r.min_top2_margin.is_finite() {
                    format!("{:.3}", r.min_top2_margin)
                } else {
                    "-".into()
                },
                format!("{:.0}", r.ms),
            ]
        })
        .collect();
    table::print(
        &[
            "model",
            "prompt",
            "engine",
            "status",
            "tokens compared",
            "identical",
            "first divergence",
            "max |Δlogit|",
            "min margin",
            "ms",
        ],
        &cells,
    );
    for r in rows {
        if let Some(b) = &r.batch {
            println!(
                "batched {} / {}: {} requests in {} steps, pool {} blocks x {} tokens: {} preemptions, {} prefix-cache hit tokens, {} recomputed tokens",
                r.model,
                r.engine,
                b.requests,
                b.steps,
                b.num_blocks,
                b.block_size,
                b.num_preemptions,
                b.prefix_cache_hits,
                b.num_recomputed_tokens
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
    if let Some(dir) = o.out.parent() {
        std::fs::create_dir_all(dir)?;
    }
    let json = serde_json::json!({ "format_version": 1, "tolerance": { "abs": ABS_TOL, "rel": REL_TOL }, "rows": rows });
    std::fs::write(&o.out, serde_json::to_string_pretty(&json)?)?;
    println!("report written to {}", o.out.display());
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

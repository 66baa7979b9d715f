//! `cargo xtask verify`: every engine must produce the naive engine's greedy tokens, token for
//! token, on every model of `fixtures/models.json` and every prompt of `fixtures/prompts.txt`.
//!
//! For each (model, prompt): the naive engine greedy-generates to the end of the context (stop
//! tokens are ignored, so every position is compared) and records the logits of every step. Each
//! other engine then greedy-generates the same way; its tokens are compared with the reference's,
//! and the reference tokens are teacher-forced through it to compare logits at every position
//! (f32 engines: |Δ| ≤ 1e-4 + 1e-4·|ref|). A divergence is reported with its step, both tokens
//! and the reference's top-2 margin there: a near-tie flipped by float noise is still a failure to
//! investigate. A missing real checkpoint is SKIPPED, or a failure with `KVLAB_REQUIRE_MODELS=1`.

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

/// Tolerance of teacher-forced logits for f32 engines (DESIGN.md's correctness contract).
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
    for e in &o.engines {
        if !kvlab_cli::engines::ENGINES.contains(&e.as_str()) {
            bail!(
                "unknown engine {e:?}; known: {}",
                kvlab_cli::engines::ENGINES.join(", ")
            );
        }
    }
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
    let engines: Vec<&str> = kvlab_cli::engines::ENGINES
        .iter()
        .copied()
        .filter(|e| *e != "naive" && (o.engines.is_empty() || o.engines.iter().any(|x| x == e)))
        .collect();

    let bar = ProgressBar::new((entries.len() * prompts.len()) as u64);
    bar.set_style(
        ProgressStyle::with_template(
            "{spinner} verify [{bar:30}] {pos}/{len} cases, {elapsed} elapsed, eta {eta} {msg}",
        )
        .expect("template")
        .progress_chars("=> "),
    );
    // Load every model first (sequentially: loading checks sha256), then run the (model, prompt)
    // cases on one worker per core; each case is independent and rows are put back in order.
    let mut rows: Vec<Row> = Vec::new();
    let mut loaded: Vec<(&ModelEntry, Arc<Model>, kvlab_model::Tokenizer)> = Vec::new();
    for entry in entries {
        match load(entry) {
            Ok(Some((model, tok))) => loaded.push((entry, Arc::new(model), tok)),
            Ok(None) => {
                let why = missing_reason(entry);
                bar.println(format!("SKIPPED {}: {why}", entry.name));
                rows.push(Row {
                    status: "SKIPPED".into(),
                    note: why,
                    ..Row::empty(&entry.name, "all")
                });
                bar.inc(prompts.len() as u64);
            }
            Err(e) => {
                rows.push(Row {
                    status: "ERROR".into(),
                    note: format!("{e:#}"),
                    ..Row::empty(&entry.name, "all")
                });
                bar.inc(prompts.len() as u64);
            }
        }
    }
    let cases: Vec<(usize, usize)> = (0..loaded.len())
        .flat_map(|m| (0..prompts.len()).map(move |p| (m, p)))
        .collect();
    let next = AtomicUsize::new(0);
    let done: Mutex<Vec<(usize, Vec<Row>)>> = Mutex::new(Vec::new());
    let workers = std::thread::available_parallelism()
        .map_or(1, |n| n.get())
        .min(cases.len().max(1));
    std::thread::scope(|scope| {
        for _ in 0..workers {
            scope.spawn(|| {
                loop {
                    let i = next.fetch_add(1, Ordering::Relaxed);
                    let Some(&(m, p)) = cases.get(i) else { break };
                    let (entry, model, tok) = &loaded[m];
                    bar.set_message(format!("{} prompt {p}", entry.name));
                    let r = verify_case(entry, model, tok, p, &prompts[p], &engines);
                    done.lock().expect("no worker panicked").push((i, r));
                    bar.inc(1);
                }
            });
        }
    });
    let mut done = done.into_inner().expect("no worker panicked");
    done.sort_by_key(|(i, _)| *i);
    rows.extend(done.into_iter().flat_map(|(_, r)| r));
    bar.finish_and_clear();
    report(&rows, &o)?;

    let failed: Vec<&Row> = rows
        .iter()
        .filter(|r| {
            r.status == "MISMATCH" || r.status == "ERROR" || (require && r.status == "SKIPPED")
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
                "KVLAB_REQUIRE_MODELS=1: missing checkpoints are failures; set KVLAB_MODELS=../shared/models"
            );
        }
        bail!("verify failed: {} of {} rows", failed.len(), rows.len());
    }
    let compared: usize = rows
        .iter()
        .filter(|r| r.status == "ok")
        .map(|r| r.tokens_compared)
        .sum();
    println!(
        "verify passed: {} engine runs, {compared} tokens identical to the naive reference",
        rows.iter().filter(|r| r.status == "ok").count()
    );
    Ok(())
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
        }
    }
}

fn missing_reason(entry: &ModelEntry) -> String {
    match registry::locate(&entry.name) {
        Ok(Located::Missing { file, searched, .. }) => format!(
            "{} not found in {searched} (set KVLAB_MODELS=../shared/models)",
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

/// Greedy generation to the end of the context, stop tokens ignored; returns the tokens and the
/// logits that predicted each of them.
fn greedy(
    engine: &mut dyn Engine,
    prompt: &[u32],
    max_seq_len: usize,
) -> Result<(Vec<u32>, Vec<Vec<f32>>)> {
    let seq = engine.new_sequence(max_seq_len)?;
    let out = (|| -> Result<_> {
        let mut logits = engine.prefill(seq, prompt)?;
        let (mut tokens, mut all) = (Vec::new(), Vec::new());
        let mut pos = prompt.len() - 1;
        loop {
            let next = argmax(&logits);
            tokens.push(next);
            pos += 1;
            if pos >= max_seq_len {
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

/// |a − b| over all positions and entries; and whether every entry is within tolerance.
fn compare_logits(got: &[Vec<f32>], reference: &[Vec<f32>]) -> (f32, bool) {
    let mut max = 0.0f32;
    let mut ok = got.len() == reference.len();
    for (g, r) in got.iter().zip(reference) {
        for (&a, &b) in g.iter().zip(r) {
            let d = (a - b).abs();
            // NaN never passes: a NaN difference fails the `<=` and poisons the max.
            if d.is_nan() || d > ABS_TOL + REL_TOL * b.abs() {
                ok = false;
            }
            max = if d.is_nan() { f32::NAN } else { max.max(d) };
        }
    }
    (max, ok)
}

fn verify_case(
    entry: &ModelEntry,
    model: &Arc<Model>,
    tok: &kvlab_model::Tokenizer,
    index: usize,
    prompt_text: &str,
    engines: &[&str],
) -> Vec<Row> {
    let max_seq_len = entry
        .verify_max_seq_len
        .unwrap_or(model.config.max_seq_len)
        .min(model.config.max_seq_len);
    let mut prompt = tok.encode(prompt_text, true, false);
    let cut = prompt.len() >= max_seq_len;
    prompt.truncate(max_seq_len - 1);
    let base = Row {
        prompt_index: index,
        prompt: prompts::label(prompt_text),
        prompt_tokens: prompt.len(),
        prompt_cut: cut,
        note: if cut {
            format!("prompt cut to {} tokens to fill the context", prompt.len())
        } else {
            String::new()
        },
        ..Row::empty(&entry.name, "naive")
    };
    let t = Instant::now();
    let mut naive = match kvlab_cli::engines::build("naive", model.clone()) {
        Ok(e) => e,
        Err(e) => {
            return vec![Row {
                status: "ERROR".into(),
                note: format!("{e:#}"),
                ..base
            }];
        }
    };
    let (ref_tokens, ref_logits) = match greedy(naive.as_mut(), &prompt, max_seq_len) {
        Ok(r) => r,
        Err(e) => {
            return vec![Row {
                status: "ERROR".into(),
                note: format!("naive: {e:#}"),
                ..base
            }];
        }
    };
    let min_margin = ref_logits
        .iter()
        .map(|l| top2_margin(l))
        .fold(f32::INFINITY, f32::min);
    let mut rows = vec![Row {
        status: "reference".into(),
        tokens_compared: ref_tokens.len(),
        identical: true,
        min_top2_margin: min_margin,
        ms: t.elapsed().as_secs_f64() * 1e3,
        ..base.clone()
    }];
    for &name in engines {
        let t = Instant::now();
        let result = (|| -> Result<Row> {
            let mut engine = kvlab_cli::engines::build(name, model.clone())?;
            let (tokens, logits) = greedy(engine.as_mut(), &prompt, max_seq_len)?;
            let first = tokens.iter().zip(&ref_tokens).position(|(a, b)| a != b);
            // Identical tokens mean identical inputs: the greedy run's logits are already the
            // teacher-forced ones. Otherwise force the reference tokens through the engine.
            let forced = match first {
                None => logits,
                Some(_) => teacher_force(engine.as_mut(), &prompt, &ref_tokens, max_seq_len)?,
            };
            let (max_d, within) = compare_logits(&forced, &ref_logits);
            let ok = first.is_none() && tokens.len() == ref_tokens.len() && within;
            Ok(Row {
                engine: name.into(),
                status: if ok { "ok" } else { "MISMATCH" }.into(),
                tokens_compared: ref_tokens.len(),
                identical: first.is_none(),
                first_divergence: first.map(|s| Divergence {
                    step: s,
                    reference: ref_tokens[s],
                    got: tokens[s],
                    reference_top2_margin: top2_margin(&ref_logits[s]),
                }),
                max_abs_dlogit: max_d,
                min_top2_margin: min_margin,
                ms: t.elapsed().as_secs_f64() * 1e3,
                note: if within {
                    base.note.clone()
                } else {
                    format!("teacher-forced logits exceed |Δ| ≤ {ABS_TOL} + {REL_TOL}·|ref|")
                },
                ..base.clone()
            })
        })();
        rows.push(result.unwrap_or_else(|e| Row {
            engine: name.into(),
            status: "ERROR".into(),
            note: format!("{e:#}"),
            ..base.clone()
        }));
    }
    rows
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

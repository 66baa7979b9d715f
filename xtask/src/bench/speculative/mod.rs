//! `cargo xtask bench --speculative`: speculative decoding against plain decoding, on prompts
//! that ask the model to copy them and prompts that ask it to write freely, greedily (whose
//! answers may still repeat themselves: small models loop, and lookup finds the loop) and
//! sampled at temperature 1 (text that repeats far less: the case where guessing must not cost).
//!
//! Per weight format (the checkpoint's own, and f32), workload and repetition, interleaved, on
//! the contiguous `cpu` engine: each prompt is generated without speculation, with prompt
//! lookup at `k` guesses a step for every `k` asked, and with a draft model (the model's first
//! third of layers, an early exit) at k = 3; the decode time (everything after the prefill) is
//! timed, and every greedy speculative run's tokens must equal the plain run's (a sampled one
//! draws other tokens from the same distribution). Reported per configuration: the decode
//! time, its speed-up over plain decoding (decode tokens per second, medians), the guesses'
//! acceptance rate and the tokens each engine step yields.

mod plot;

use std::sync::Arc;
use std::time::Instant;

use anyhow::{Context, Result, bail};
use kvlab_model::{
    DraftModel, Engine, GenerateOptions, Model, NgramProposer, Proposer, Sampler, Speculative,
    WeightFormat, generate_tokens,
};
use serde::Serialize;

use super::stats::Summary as Stat;

pub struct SpecOpts {
    /// The side bench's common options.
    pub side: super::Side,
    /// Guesses per step to measure (default 1, 2, 3, 4, 8; --quick 2, 4).
    pub ks: Vec<usize>,
}

/// Guesses per step of the draft-model rows.
const DRAFT_K: usize = 3;

/// The temperature of the sampled workload (top-k, top-p and min-p off).
const SAMPLED_TEMPERATURE: f32 = 1.0;

/// The workloads: prompts asking for a copy of themselves, and prompts asking for new text,
/// greedily and sampled (label, prompts, temperature).
fn workloads(chat: bool) -> [(&'static str, Vec<String>, f32); 3] {
    let wrap = |s: &str| match chat {
        true => format!("<start_of_turn>user\n{s}<end_of_turn>\n<start_of_turn>model\n"),
        false => s.to_string(),
    };
    let copying = [
        "Repeat this text exactly: The quick brown fox jumps over the lazy dog near the river bank, and then the fox runs into the forest to find its family before the sun goes down.",
        "Copy this list exactly, one item per line: apples, bread, milk, eggs, butter, cheese, tomatoes, onions, rice, coffee, tea, sugar.",
        "Repeat after me, word for word: Once upon a time there was a little girl named Lily who loved to play in the garden with her dog.",
    ];
    let fresh = [
        "Write a short poem about the sea at night.",
        "Explain in a few sentences why the sky is blue.",
        "Tell me a story about a robot who learns to paint.",
    ];
    let fresh: Vec<String> = fresh.iter().map(|s| wrap(s)).collect();
    [
        (
            "asked to copy",
            copying.iter().map(|s| wrap(s)).collect(),
            0.0,
        ),
        ("writes freely", fresh.clone(), 0.0),
        ("writes freely, sampled", fresh, SAMPLED_TEMPERATURE),
    ]
}

/// One way of decoding: plain (k = 0), prompt lookup, or the draft model, with k guesses.
#[derive(Clone, Copy, PartialEq)]
enum Method {
    Plain,
    Ngram(usize),
    Draft(usize),
}

impl Method {
    fn name(self) -> &'static str {
        match self {
            Method::Plain => "plain",
            Method::Ngram(_) => "ngram",
            Method::Draft(_) => "draft_model",
        }
    }

    fn k(self) -> usize {
        match self {
            Method::Plain => 0,
            Method::Ngram(k) | Method::Draft(k) => k,
        }
    }
}

#[derive(Serialize)]
pub struct SpecReport {
    pub model: String,
    pub machine: String,
    pub threads: usize,
    pub engine: String,
    /// Tokens generated per prompt (fewer where a stop token comes first).
    pub max_tokens: usize,
    pub prompt_lookup: NgramProposer,
    /// The draft model's layers: the target's first ones, then its final norm and classifier.
    pub draft_layers: usize,
    pub reps: usize,
    pub rows: Vec<SpecRow>,
    pub plots: Vec<String>,
    pub wall_seconds: f64,
}

#[derive(Serialize)]
pub struct SpecRow {
    /// The checkpoint's own weights ("stored") or f32.
    pub weights: String,
    pub workload: String,
    /// The sampler's temperature (0: greedy).
    pub temperature: f32,
    /// `plain`, `ngram` (prompt lookup) or `draft_model`.
    pub method: String,
    /// Guesses per step; 0 is plain decoding.
    pub k: usize,
    /// Decode seconds for all the workload's prompts (min, median, max over repetitions).
    pub decode_s: Stat,
    /// Median decode tokens per second over plain decoding's (greedy: the same tokens, so the
    /// ratio of decode times).
    pub speedup: f64,
    /// Guesses kept over guesses checked (NaN for plain decoding).
    pub acceptance_rate: f64,
    /// Tokens generated per engine step after the prefill (1 for plain decoding).
    pub tokens_per_step: f64,
    /// Tokens generated, all prompts together.
    pub tokens: usize,
}

/// Generates every prompt once at `temperature` (seeded per prompt) with `method`, drafting
/// with `draft` for [`Method::Draft`]; returns (decode seconds, every output, the speculation
/// counts, decode steps).
fn one_pass(
    engine: &mut dyn Engine,
    draft: &Arc<Model>,
    prompts: &[Vec<u32>],
    (max_tokens, temperature): (usize, f32),
    method: Method,
) -> Result<(f64, Vec<Vec<u32>>, kvlab_model::SpecStats, usize)> {
    let (mut secs, mut outs, mut steps) = (0.0, Vec::new(), 0);
    let mut stats = kvlab_model::SpecStats::default();
    for (i, p) in prompts.iter().enumerate() {
        let proposer = match method {
            Method::Plain => None,
            Method::Ngram(_) => Some(Proposer::Ngram(NgramProposer::default())),
            Method::Draft(_) => {
                let engine = Box::new(kvlab_cpu::CpuEngine::new(draft.clone()));
                let vocab = draft.config.vocab_size;
                Some(Proposer::Draft(DraftModel::new(engine, vocab)?))
            }
        };
        let opts = GenerateOptions {
            steps: p.len() + max_tokens - 1,
            max_seq_len: 0,
            trace: false,
            special: false,
            ubatch: 0,
            speculative: proposer.map(|proposer| Speculative {
                proposer,
                num_speculative_tokens: method.k(),
            }),
        };
        let mut sampler = Sampler::new(temperature, 1.0, i as u64 + 1)?;
        let g = generate_tokens(engine, p, &opts, &mut sampler, |_| {})?;
        secs += g.decode_time.as_secs_f64();
        steps += g.decode_steps;
        stats.num_draft_tokens += g.spec.num_draft_tokens;
        stats.num_accepted_tokens += g.spec.num_accepted_tokens;
        outs.push(g.tokens);
    }
    Ok((secs, outs, stats, steps))
}

pub fn run(o: &SpecOpts) -> Result<SpecReport> {
    let started = Instant::now();
    let (name, loaded) = super::side_model(&o.side.model, o.side.quick)?;
    let tok = loaded
        .tokenizer
        .as_ref()
        .with_context(|| format!("{name} has no tokenizer"))?;
    let chat = tok.chat_template().is_some();
    let max_tokens = if o.side.quick { 32 } else { 64 };
    let ks = if !o.ks.is_empty() {
        o.ks.clone()
    } else if o.side.quick {
        vec![2, 4]
    } else {
        vec![1, 2, 3, 4, 8]
    };
    let formats = if o.side.quick {
        vec![WeightFormat::Stored]
    } else {
        vec![WeightFormat::Stored, WeightFormat::F32]
    };
    let work: Vec<(&str, Vec<Vec<u32>>, f32)> = workloads(chat)
        .into_iter()
        .map(|(w, texts, temperature)| {
            let ids = texts
                .iter()
                .map(|t| tok.encode_special(t, true, false))
                .collect();
            (w, ids, temperature)
        })
        .collect();
    let configs: Vec<Method> = std::iter::once(Method::Plain)
        .chain(ks.iter().map(|&k| Method::Ngram(k)))
        .chain([Method::Draft(DRAFT_K)])
        .collect();
    let draft_layers = loaded.model.config.n_layers.div_ceil(3);
    let progress = indicatif::ProgressBar::new((formats.len() * o.side.reps * work.len()) as u64);
    let mut rows = Vec::new();
    for format in formats {
        let model: Arc<Model> = Arc::new(loaded.model.clone().with_weight_format(format));
        let draft = Arc::new(model.early_exit(draft_layers)?);
        let mut engine = kvlab_cpu::CpuEngine::new(model);
        // (workload, k) → decode seconds per repetition, and the last pass's counts.
        let mut secs = vec![vec![Vec::new(); configs.len()]; work.len()];
        let mut counts =
            vec![vec![(kvlab_model::SpecStats::default(), 0, 0); configs.len()]; work.len()];
        one_pass(
            &mut engine,
            &draft,
            &work[0].1[..1],
            (4, 0.0),
            Method::Plain,
        )?; // Warm-up.
        for _ in 0..o.side.reps {
            for (w, (label, prompts, temperature)) in work.iter().enumerate() {
                progress.set_message(format!("{name} {}, {label}", format.name()));
                let mut plain = None;
                for (c, &method) in configs.iter().enumerate() {
                    let (s, outs, stats, steps) = one_pass(
                        &mut engine,
                        &draft,
                        prompts,
                        (max_tokens, *temperature),
                        method,
                    )?;
                    match &plain {
                        None => plain = Some(outs.clone()),
                        Some(p) if *p != outs && *temperature == 0.0 => bail!(
                            "{} weights, {label}, {} k = {}: speculative tokens differ from plain greedy decoding's",
                            format.name(),
                            method.name(),
                            method.k()
                        ),
                        Some(_) => {}
                    }
                    secs[w][c].push(s);
                    let tokens = outs.iter().map(Vec::len).sum();
                    counts[w][c] = (stats, steps, tokens);
                }
                progress.inc(1);
            }
        }
        for (w, (label, _, temperature)) in work.iter().enumerate() {
            // Decode tokens per second (the first token of each prompt comes from its prefill).
            let rate = |c: usize, secs: f64| (counts[w][c].2 - work[w].1.len()) as f64 / secs;
            let plain = rate(0, Stat::of(&secs[w][0]).median);
            for (c, &method) in configs.iter().enumerate() {
                let s = Stat::of(&secs[w][c]);
                let (stats, steps, tokens) = counts[w][c];
                rows.push(SpecRow {
                    weights: format.name().to_string(),
                    workload: label.to_string(),
                    temperature: *temperature,
                    method: method.name().to_string(),
                    k: method.k(),
                    speedup: rate(c, s.median) / plain,
                    decode_s: s,
                    acceptance_rate: stats.acceptance_rate(),
                    // The first token of each prompt comes from its prefill.
                    tokens_per_step: (tokens - work[w].1.len()) as f64 / steps.max(1) as f64,
                    tokens,
                });
            }
        }
    }
    progress.finish_and_clear();
    let mut report = SpecReport {
        model: name,
        machine: o.side.machine.clone(),
        threads: kvlab_cpu::threads::num_threads(),
        engine: "cpu".into(),
        max_tokens,
        prompt_lookup: NgramProposer::default(),
        draft_layers,
        reps: o.side.reps,
        rows,
        plots: Vec::new(),
        wall_seconds: 0.0,
    };
    report.plots = super::plot::draw_if(o.side.plots, || plot::figure(&o.side.out, &report))?;
    report.wall_seconds = started.elapsed().as_secs_f64();
    Ok(report)
}

pub fn print(r: &SpecReport) {
    println!(
        "{}: speculative decoding on the {} engine, {} tokens per prompt, {} threads, median of {}; draft model: the first {} layers",
        r.model, r.engine, r.max_tokens, r.threads, r.reps, r.draft_layers
    );
    println!(
        "{:<8} {:<24} {:<12} {:>3} {:>11} {:>9} {:>12} {:>16}",
        "weights",
        "workload",
        "method",
        "k",
        "decode, s",
        "speed-up",
        "acceptance",
        "tokens per step"
    );
    for row in &r.rows {
        println!(
            "{:<8} {:<24} {:<12} {:>3} {:>11.3} {:>8.2}x {:>12} {:>16.2}",
            row.weights,
            row.workload,
            row.method,
            row.k,
            row.decode_s.median,
            row.speedup,
            match row.acceptance_rate.is_nan() {
                true => "-".to_string(),
                false => format!("{:.1}%", 100.0 * row.acceptance_rate),
            },
            row.tokens_per_step
        );
    }
}

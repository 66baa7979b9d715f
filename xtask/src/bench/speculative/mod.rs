//! `cargo xtask bench --speculative`: prompt-lookup speculative decoding against plain greedy
//! decoding, on prompts that ask the model to copy them and prompts that ask it to write freely
//! (whose answers may still repeat themselves: small models loop, and lookup finds the loop).
//!
//! Per weight format (the checkpoint's own, and f32), workload and repetition, interleaved, on
//! the contiguous `cpu` engine: each prompt is generated greedily without speculation and with
//! `k` guesses a step for every `k` asked; the decode time (everything after the prefill) is
//! timed, and every speculative run's tokens must equal the plain run's. Reported per
//! configuration: the decode time, its speed-up over plain decoding (medians), the guesses' acceptance rate and the
//! tokens each engine step yields.

mod plot;

use std::path::PathBuf;
use std::sync::Arc;
use std::time::Instant;

use anyhow::{Context, Result, bail};
use kvlab_model::{
    Engine, GenerateOptions, Model, NgramProposer, Sampler, Speculative, WeightFormat,
    generate_tokens,
};
use serde::Serialize;

use super::stats::Summary as Stat;

pub struct SpecOpts {
    pub quick: bool,
    pub model: Option<String>,
    /// Guesses per step to measure (default 1, 2, 3, 4, 8; --quick 2, 4).
    pub ks: Vec<usize>,
    pub reps: usize,
    pub out: PathBuf,
    pub plots: bool,
    pub machine: String,
}

/// The two workloads: prompts asking for a copy of themselves, and prompts asking for new text.
fn workloads(chat: bool) -> [(&'static str, Vec<String>); 2] {
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
    [
        ("asked to copy", copying.iter().map(|s| wrap(s)).collect()),
        ("writes freely", fresh.iter().map(|s| wrap(s)).collect()),
    ]
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
    /// Guesses per step; 0 is plain greedy decoding.
    pub k: usize,
    /// Decode seconds for all the workload's prompts (min, median, max over repetitions).
    pub decode_s: Stat,
    /// Plain decoding's median decode time over this one's.
    pub speedup: f64,
    /// Guesses kept over guesses checked (NaN for plain decoding).
    pub acceptance_rate: f64,
    /// Tokens generated per engine step after the prefill (1 for plain decoding).
    pub tokens_per_step: f64,
    /// Tokens generated, all prompts together.
    pub tokens: usize,
}

/// Generates every prompt once; returns (decode seconds, every output, the speculation counts,
/// decode steps).
fn one_pass(
    engine: &mut dyn Engine,
    prompts: &[Vec<u32>],
    max_tokens: usize,
    k: usize,
) -> Result<(f64, Vec<Vec<u32>>, kvlab_model::SpecStats, usize)> {
    let (mut secs, mut outs, mut steps) = (0.0, Vec::new(), 0);
    let mut stats = kvlab_model::SpecStats::default();
    for p in prompts {
        let opts = GenerateOptions {
            steps: p.len() + max_tokens - 1,
            max_seq_len: 0,
            trace: false,
            special: false,
            ubatch: 0,
            speculative: (k > 0).then_some(Speculative::ngram(NgramProposer::default(), k)),
        };
        let g = generate_tokens(engine, p, &opts, &mut Sampler::greedy(), |_| {})?;
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
    let (name, loaded) = super::side_model(&o.model, o.quick)?;
    let tok = loaded
        .tokenizer
        .as_ref()
        .with_context(|| format!("{name} has no tokenizer"))?;
    let chat = tok.chat_template().is_some();
    let max_tokens = if o.quick { 32 } else { 64 };
    let ks = if !o.ks.is_empty() {
        o.ks.clone()
    } else if o.quick {
        vec![2, 4]
    } else {
        vec![1, 2, 3, 4, 8]
    };
    let formats = if o.quick {
        vec![WeightFormat::Stored]
    } else {
        vec![WeightFormat::Stored, WeightFormat::F32]
    };
    let work: Vec<(&str, Vec<Vec<u32>>)> = workloads(chat)
        .into_iter()
        .map(|(w, texts)| {
            let ids = texts
                .iter()
                .map(|t| tok.encode_special(t, true, false))
                .collect();
            (w, ids)
        })
        .collect();
    let configs: Vec<usize> = std::iter::once(0).chain(ks.iter().copied()).collect();
    let progress = indicatif::ProgressBar::new((formats.len() * o.reps * work.len()) as u64);
    let mut rows = Vec::new();
    for format in formats {
        let model: Arc<Model> = Arc::new(loaded.model.clone().with_weight_format(format));
        let mut engine = kvlab_cpu::CpuEngine::new(model);
        // (workload, k) → decode seconds per repetition, and the last pass's counts.
        let mut secs = vec![vec![Vec::new(); configs.len()]; work.len()];
        let mut counts =
            vec![vec![(kvlab_model::SpecStats::default(), 0, 0); configs.len()]; work.len()];
        one_pass(&mut engine, &work[0].1[..1], 4, 0)?; // Warm-up.
        for _ in 0..o.reps {
            for (w, (label, prompts)) in work.iter().enumerate() {
                progress.set_message(format!("{name} {}, {label}", format.name()));
                let mut plain = None;
                for (c, &k) in configs.iter().enumerate() {
                    let (s, outs, stats, steps) = one_pass(&mut engine, prompts, max_tokens, k)?;
                    match &plain {
                        None => plain = Some(outs.clone()),
                        Some(p) if *p != outs => bail!(
                            "{} weights, {label}, k = {k}: speculative tokens differ from plain greedy decoding's",
                            format.name()
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
        for (w, (label, _)) in work.iter().enumerate() {
            let plain = Stat::of(&secs[w][0]).median;
            for (c, &k) in configs.iter().enumerate() {
                let s = Stat::of(&secs[w][c]);
                let (stats, steps, tokens) = counts[w][c];
                rows.push(SpecRow {
                    weights: format.name().to_string(),
                    workload: label.to_string(),
                    k,
                    speedup: plain / s.median,
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
        machine: o.machine.clone(),
        threads: kvlab_cpu::threads::num_threads(),
        engine: "cpu".into(),
        max_tokens,
        prompt_lookup: NgramProposer::default(),
        reps: o.reps,
        rows,
        plots: Vec::new(),
        wall_seconds: 0.0,
    };
    report.plots = super::plot::draw_if(o.plots, || plot::figure(&o.out, &report))?;
    report.wall_seconds = started.elapsed().as_secs_f64();
    Ok(report)
}

pub fn print(r: &SpecReport) {
    println!(
        "{}: prompt-lookup speculative decoding on the {} engine, {} tokens per prompt, {} threads, median of {}",
        r.model, r.engine, r.max_tokens, r.threads, r.reps
    );
    println!(
        "{:<8} {:<18} {:>3} {:>11} {:>9} {:>12} {:>16}",
        "weights", "workload", "k", "decode, s", "speed-up", "acceptance", "tokens per step"
    );
    for row in &r.rows {
        println!(
            "{:<8} {:<18} {:>3} {:>11.3} {:>8.2}x {:>12} {:>16.2}",
            row.weights,
            row.workload,
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

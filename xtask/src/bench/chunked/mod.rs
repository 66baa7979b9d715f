//! `cargo xtask bench --chunked-prefill`: what a long prompt does to the decodes already running,
//! with the prompt prefilled whole (one step holds all of it) and in chunks under a per-step
//! token budget (vLLM's `--enable-chunked-prefill --max-num-batched-tokens N`).
//!
//! Per configuration and repetition, interleaved, on a fresh paged CPU engine: `decodes`
//! requests with short prompts start decoding; at step [`ARRIVAL_STEP`] one long prompt arrives.
//! Each step is timed (wall clock, scheduling and sampling included), and every decode's
//! inter-token latency (ITL: the time between two of its tokens) is recorded. Reported per
//! configuration: ITL p50 and p99 over all decode tokens of the run, the long prompt's time to
//! first token, and the throughput (tokens computed per second of the whole run). The greedy
//! tokens of every configuration must equal the whole-prefill run's: chunking changes when work
//! is done, never what is computed.

mod plot;

use std::sync::Arc;
use std::time::Instant;

use anyhow::{Result, bail};
use kvlab_engines::{EngineKind, PoolOptions, build_paged};
use kvlab_model::sampler::argmax;
use kvlab_model::{KvDtype, Model};
use kvlab_paged::{DEFAULT_BLOCK_SIZE, RequestId, Scheduler, SchedulerConfig, StopConditions};
use rand::{Rng, SeedableRng};
use serde::Serialize;

use super::stats::{Summary as Stat, percentile_sorted};

/// The step at which the long prompt arrives: every decode has started by then.
const ARRIVAL_STEP: usize = 4;
/// Prompt tokens of each running decode.
const DECODE_PROMPT: usize = 16;

pub struct ChunkedOpts {
    /// The side bench's common options.
    pub side: super::Side,
    /// Tokens of the long prompt (default 2,000; --quick 400).
    pub prompt_len: Option<usize>,
    /// Running decodes the prompt arrives among.
    pub decodes: usize,
    /// Budgets of the chunked configurations (default 512, 256, 128; --quick 128, 64).
    pub budgets: Vec<usize>,
}

#[derive(Serialize)]
pub struct ChunkedReport {
    pub model: String,
    pub machine: String,
    pub threads: usize,
    /// Running decodes, and the tokens each generates.
    pub decodes: usize,
    pub decode_tokens: usize,
    /// Tokens of the long prompt.
    pub prompt_len: usize,
    pub reps: usize,
    pub rows: Vec<ChunkedRow>,
    /// Per configuration, the last repetition's steps.
    pub steps: Vec<(String, Vec<StepTime>)>,
    pub plots: Vec<String>,
    pub wall_seconds: f64,
}

#[derive(Serialize)]
pub struct ChunkedRow {
    /// "whole" or "chunked ≤ N".
    pub config: String,
    /// `max_num_batched_tokens`.
    pub budget: usize,
    pub chunked: bool,
    /// Inter-token latency of the running decodes, ms: each repetition's p50 and p99 over every
    /// decode token of the run, summarised over repetitions.
    pub itl_p50_ms: Stat,
    pub itl_p99_ms: Stat,
    /// Time from the long prompt's arrival to its first token, ms.
    pub long_ttft_ms: Stat,
    /// Tokens computed (prompt and generated) per second of the whole run.
    pub tokens_per_s: Stat,
    /// The whole-prefill median p99 ITL over this one's (above 1: chunking cut it).
    pub p99_cut: f64,
    /// 1 − this throughput / whole prefill's (medians): the throughput chunking costs.
    pub throughput_cost: f64,
    /// Steps of the run (last repetition).
    pub steps: usize,
}

/// One step: (milliseconds since the run began, the step's milliseconds, tokens computed).
pub type StepTime = (f64, f64, usize);

/// What one run measured.
struct Run {
    itl_ms: Vec<f64>,
    long_ttft_ms: f64,
    tokens_per_s: f64,
    steps: Vec<StepTime>,
    /// Every request's generated tokens, decodes first, the long prompt last.
    outputs: Vec<Vec<u32>>,
}

/// One run of the workload under `config`.
fn one_run(
    model: &Arc<Model>,
    (decode_prompts, long): (&[Vec<u32>], &[u32]),
    decode_tokens: usize,
    config: impl Fn(SchedulerConfig) -> SchedulerConfig,
) -> Result<Run> {
    let bs = DEFAULT_BLOCK_SIZE;
    let max_model_len = (long.len() + 8).max(DECODE_PROMPT + decode_tokens + 1);
    let demand = decode_prompts.len() * (DECODE_PROMPT + decode_tokens).div_ceil(bs)
        + max_model_len.div_ceil(bs);
    let pool = PoolOptions {
        num_blocks: demand + 1,
        block_size: bs,
        kv_dtype: KvDtype::F32,
    };
    let mut engine = build_paged(EngineKind::CpuPaged, model.clone(), pool)?;
    let base = SchedulerConfig::new(engine.kv_cache().clone(), max_model_len);
    let mut sched = Scheduler::new(config(base))?;
    let mut ids: Vec<RequestId> = decode_prompts
        .iter()
        .map(|p| sched.add_request(p.clone(), StopConditions::max_tokens(decode_tokens)))
        .collect::<Result<_, _>>()?;
    let mut last_token: Vec<Option<Instant>> = vec![None; ids.len() + 1];
    let (mut outputs, mut itl_ms) = (vec![Vec::new(); ids.len() + 1], Vec::new());
    let (mut steps, mut computed, mut long_ttft_ms) = (Vec::new(), 0, f64::NAN);
    let (started, mut arrived) = (Instant::now(), None);
    for step in 0.. {
        if step == ARRIVAL_STEP {
            ids.push(sched.add_request(long.to_vec(), StopConditions::max_tokens(4))?);
            arrived = Some(Instant::now());
        }
        let t = Instant::now();
        let mut sample = |_, logits: Vec<f32>| Ok::<_, std::convert::Infallible>(argmax(&logits));
        let outcome =
            kvlab_paged::driver::step(engine.as_mut(), &mut sched, &mut sample, |_, _| {})?;
        let now = Instant::now();
        let Some(outcome) = outcome else {
            if step > ARRIVAL_STEP && !sched.has_unfinished() {
                break;
            }
            continue;
        };
        let n = outcome.batch.num_batched_tokens();
        computed += n;
        let ms = |a: Instant, b: Instant| (b - a).as_secs_f64() * 1e3;
        steps.push((ms(started, t), ms(t, now), n));
        for (id, token) in outcome.sampled {
            let Some(i) = ids.iter().position(|&x| x == id) else {
                continue;
            };
            outputs[i].push(token);
            if i < decode_prompts.len() {
                if let Some(prev) = last_token[i] {
                    itl_ms.push(ms(prev, now));
                }
                last_token[i] = Some(now);
            } else if let (Some(a), true) = (arrived, long_ttft_ms.is_nan()) {
                long_ttft_ms = ms(a, now);
            }
        }
    }
    let wall = started.elapsed().as_secs_f64();
    Ok(Run {
        itl_ms,
        long_ttft_ms,
        tokens_per_s: computed as f64 / wall,
        steps,
        outputs,
    })
}

pub fn run(o: &ChunkedOpts) -> Result<ChunkedReport> {
    let started = Instant::now();
    let (name, loaded) = super::side_model(&o.side.model, o.side.quick)?;
    let model = Arc::new(loaded.model);
    let prompt_len = o
        .prompt_len
        .unwrap_or(if o.side.quick { 400 } else { 2000 });
    let decode_tokens = if o.side.quick { 32 } else { 48 };
    if prompt_len + 8 > model.config.max_seq_len {
        bail!(
            "a prompt of {prompt_len} tokens does not fit {name}'s {} positions with its output; \
             choose a shorter --prompt-len",
            model.config.max_seq_len
        );
    }
    let budgets = if !o.budgets.is_empty() {
        o.budgets.clone()
    } else if o.side.quick {
        vec![128, 64]
    } else {
        vec![512, 256, 128]
    };
    let vocab = model.config.vocab_size as u32;
    let mut rng = rand_chacha::ChaCha8Rng::seed_from_u64(o.side.seed);
    let mut prompt = |len: usize| -> Vec<u32> {
        std::iter::once(model.config.bos_id)
            .chain((1..len).map(|_| rng.random_range(0..vocab)))
            .collect()
    };
    let decode_prompts: Vec<Vec<u32>> = (0..o.decodes).map(|_| prompt(DECODE_PROMPT)).collect();
    let long = prompt(prompt_len);
    // Whole prefill first: its budget holds the prompt and every decode in one step.
    let whole_budget = (prompt_len + o.decodes).max(2048);
    let configs: Vec<(String, usize, bool)> =
        std::iter::once(("whole".into(), whole_budget, false))
            .chain(budgets.iter().map(|&b| (format!("chunked ≤ {b}"), b, true)))
            .collect();
    let progress = indicatif::ProgressBar::new((configs.len() * o.side.reps) as u64);
    let mut runs: Vec<Vec<Run>> = configs.iter().map(|_| Vec::new()).collect();
    for _ in 0..o.side.reps {
        for (i, (label, budget, chunked)) in configs.iter().enumerate() {
            progress.set_message(format!("{name}, {label}"));
            let config = |c: SchedulerConfig| SchedulerConfig {
                max_num_batched_tokens: *budget,
                enable_chunked_prefill: *chunked,
                ..c
            };
            let r = one_run(&model, (&decode_prompts, &long), decode_tokens, config)?;
            if let Some(whole) = runs[0].first()
                && whole.outputs != r.outputs
            {
                bail!(
                    "{label}: the greedy tokens differ from whole prefill's; chunking must not change them"
                );
            }
            runs[i].push(r);
            progress.inc(1);
        }
    }
    progress.finish_and_clear();
    let pct = |v: &[f64], p: f64| {
        let mut v = v.to_vec();
        v.sort_by(f64::total_cmp);
        percentile_sorted(&v, p)
    };
    let summary =
        |rs: &[Run], f: &dyn Fn(&Run) -> f64| Stat::of(&rs.iter().map(f).collect::<Vec<_>>());
    let p99 = |r: &Run| pct(&r.itl_ms, 99.0);
    let (whole_p99, whole_tps) = (
        summary(&runs[0], &p99).median,
        summary(&runs[0], &|r| r.tokens_per_s).median,
    );
    let rows = configs
        .iter()
        .zip(&runs)
        .map(|((label, budget, chunked), rs)| {
            let tps = summary(rs, &|r| r.tokens_per_s);
            let itl_p99_ms = summary(rs, &p99);
            ChunkedRow {
                config: label.clone(),
                budget: *budget,
                chunked: *chunked,
                itl_p50_ms: summary(rs, &|r| pct(&r.itl_ms, 50.0)),
                p99_cut: whole_p99 / itl_p99_ms.median,
                itl_p99_ms,
                long_ttft_ms: summary(rs, &|r| r.long_ttft_ms),
                throughput_cost: 1.0 - tps.median / whole_tps,
                tokens_per_s: tps,
                steps: rs.last().map_or(0, |r| r.steps.len()),
            }
        })
        .collect();
    let steps = configs
        .iter()
        .zip(&runs)
        .map(|((label, ..), rs)| {
            (
                label.clone(),
                rs.last().map(|r| r.steps.clone()).unwrap_or_default(),
            )
        })
        .collect();
    let mut report = ChunkedReport {
        model: name,
        machine: o.side.machine.clone(),
        threads: kvlab_cpu::threads::num_threads(),
        decodes: o.decodes,
        decode_tokens,
        prompt_len,
        reps: o.side.reps,
        rows,
        steps,
        plots: Vec::new(),
        wall_seconds: 0.0,
    };
    report.plots = super::plot::draw_if(o.side.plots, || plot::figure(&o.side.out, &report))?;
    report.wall_seconds = started.elapsed().as_secs_f64();
    Ok(report)
}

pub fn print(r: &ChunkedReport) {
    println!(
        "{}: a {}-token prompt arrives among {} running decodes ({} tokens each), {} threads, median of {}",
        r.model, r.prompt_len, r.decodes, r.decode_tokens, r.threads, r.reps
    );
    println!(
        "{:<14} {:>7} {:>13} {:>13} {:>10} {:>15} {:>12} {:>10} {:>6}",
        "config",
        "budget",
        "ITL p50, ms",
        "ITL p99, ms",
        "p99 cut",
        "long TTFT, ms",
        "tokens/s",
        "tput cost",
        "steps"
    );
    for row in &r.rows {
        println!(
            "{:<14} {:>7} {:>13.1} {:>13.1} {:>9.2}x {:>15.0} {:>12.0} {:>9.1}% {:>6}",
            row.config,
            row.budget,
            row.itl_p50_ms.median,
            row.itl_p99_ms.median,
            row.p99_cut,
            row.long_ttft_ms.median,
            row.tokens_per_s.median,
            row.throughput_cost * 100.0,
            row.steps
        );
    }
}

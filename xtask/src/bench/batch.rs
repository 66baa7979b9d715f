//! Batched decode throughput and continuous batching.
//!
//! * Contiguous engines (naive, cpu) have no batched step: their "batch B" is B sequences, each
//!   prefilled, then decoded round-robin one `Engine::decode` call at a time. Their throughput
//!   cannot grow with B (the weights are streamed once per token, not once per step); they are
//!   measured so the paged engines' batched steps have a reference in the same run.
//! * Paged engines run B requests through kvlab-paged's scheduler and `drive` loop: one step
//!   computes one token of every running sequence, streaming the weights once for all B.
//!
//! Throughput counts decode tokens only: tokens of steps that prefill nothing, over those steps'
//! engine time (prefill is measured on its own in prefill.rs).

use std::time::Instant;

use anyhow::{Result, anyhow};
use kvlab_engines::{PagedEngine, PoolOptions};
use kvlab_model::sampler::argmax;
use kvlab_model::{Engine, Model};
use kvlab_paged::{DriveReport, Request, Scheduler, StopConditions};
use serde::{Deserialize, Serialize};

use super::stats::Summary;

/// Decode tokens and the seconds they took.
#[derive(Clone, Copy, Debug)]
pub struct Timed {
    pub tokens: usize,
    pub seconds: f64,
}

/// B sequences with the given prompts, each decoded `generate` steps round-robin.
pub fn contiguous(engine: &mut dyn Engine, prompts: &[Vec<u32>], generate: usize) -> Result<Timed> {
    let mut seqs = Vec::new();
    let mut next = Vec::new();
    let result = (|| -> Result<Timed> {
        for p in prompts {
            let s = engine.new_sequence(p.len() + generate)?;
            seqs.push(s);
            next.push(argmax(&engine.prefill(s, p)?));
        }
        let t = Instant::now();
        for _ in 0..generate {
            for (s, n) in seqs.iter().zip(next.iter_mut()) {
                *n = argmax(&engine.decode(*s, *n)?);
            }
        }
        Ok(Timed {
            tokens: generate * prompts.len(),
            seconds: t.elapsed().as_secs_f64(),
        })
    })();
    for s in seqs {
        engine.free(s);
    }
    result
}

/// Runs `requests` through a fresh scheduler over `engine`'s pool.
pub fn drive(
    engine: &mut dyn PagedEngine,
    model: &Model,
    pool: PoolOptions,
    max_model_len: usize,
    requests: &[Request],
) -> Result<DriveReport> {
    let cfg = kvlab_engines::scheduler_config(model, pool, max_model_len);
    let mut sched = Scheduler::new(cfg)?;
    kvlab_paged::drive(engine, &mut sched, requests, argmax, |_, _, _| {})
        .map_err(|e| anyhow!("{e}"))
}

/// B requests arriving together, each generating `generate` decode tokens after its prefill.
pub fn paged(
    engine: &mut dyn PagedEngine,
    model: &Model,
    pool: PoolOptions,
    prompts: &[Vec<u32>],
    generate: usize,
) -> Result<Timed> {
    let max_len = prompts.iter().map(Vec::len).max().unwrap_or(1) + generate + 1;
    let requests: Vec<Request> = prompts
        .iter()
        .map(|p| Request {
            prompt: p.clone(),
            stop: StopConditions::max_tokens(generate + 1),
            arrival_step: 0,
            tenant: 0,
            resumes: false,
        })
        .collect();
    let report = drive(engine, model, pool, max_len, &requests)?;
    Ok(decode_only(&report))
}

/// Tokens and seconds of the steps that prefilled nothing.
pub fn decode_only(r: &DriveReport) -> Timed {
    let (tokens, seconds) = r.decode_only();
    Timed { tokens, seconds }
}

/// Throughput of one (model, engine, batch size).
#[derive(Clone, Debug, Serialize, Deserialize)]
pub struct BatchRow {
    pub model: String,
    pub engine: String,
    pub batch: usize,
    /// "round-robin" (contiguous engines: B sequences, one decode call each in turn) or
    /// "batched" (paged engines: one scheduled step for all B).
    pub mode: String,
    pub prompt_len: usize,
    /// Decode steps per sequence.
    pub generate: usize,
    /// Decode tokens per second (all sequences together), over repetitions.
    pub tok_per_s: Summary,
}

pub fn batch_row(
    model: &str,
    engine: &str,
    batch: usize,
    paged: bool,
    prompt_len: usize,
    generate: usize,
    runs: &[Timed],
) -> BatchRow {
    let tps: Vec<f64> = runs.iter().map(|t| t.tokens as f64 / t.seconds).collect();
    BatchRow {
        model: model.into(),
        engine: engine.into(),
        batch,
        mode: if paged { "batched" } else { "round-robin" }.into(),
        prompt_len,
        generate,
        tok_per_s: Summary::of(&tps),
    }
}

/// Continuous batching over an arrival trace.
#[derive(Clone, Debug, Default, Serialize, Deserialize)]
pub struct ContinuousRow {
    pub model: String,
    pub engine: String,
    /// "continuous batching" for a paged engine; "one request at a time" for the contiguous
    /// reference serving the same trace in arrival order.
    pub mode: String,
    pub num_requests: usize,
    /// Σ prompt tokens and Σ generated tokens of the trace.
    pub prompt_tokens: usize,
    pub generated_tokens: usize,
    /// Engine seconds for the whole trace.
    pub engine_seconds: f64,
    /// (prompt + generated tokens) / engine seconds.
    pub total_tok_per_s: f64,
    /// Generated tokens / engine seconds.
    pub generated_tok_per_s: f64,
    /// Scheduler steps, mean and max sequences per step (paged only).
    pub steps: Option<usize>,
    pub mean_batch: Option<f64>,
    pub max_batch: Option<usize>,
    pub preemptions: Option<u64>,
    /// Blocks in the pool and block size (paged only).
    pub pool_blocks: Option<usize>,
    pub block_size: Option<usize>,
}

impl ContinuousRow {
    /// A row of `requests` (model, engine, mode) that generated `generated` tokens in `secs`
    /// seconds of engine time; the paged columns empty.
    fn new(
        (model, engine, mode): (&str, &str, &str),
        requests: &[Request],
        generated: usize,
        secs: f64,
    ) -> ContinuousRow {
        let prompt_tokens: usize = requests.iter().map(|q| q.prompt.len()).sum();
        ContinuousRow {
            model: model.into(),
            engine: engine.into(),
            mode: mode.into(),
            num_requests: requests.len(),
            prompt_tokens,
            generated_tokens: generated,
            engine_seconds: secs,
            total_tok_per_s: (prompt_tokens + generated) as f64 / secs,
            generated_tok_per_s: generated as f64 / secs,
            ..Default::default()
        }
    }
}

/// A seeded arrival trace: request i arrives at step ⌊i · gap⌋.
pub fn trace(prompts: Vec<Vec<u32>>, outputs: &[usize], gap: f64) -> Vec<Request> {
    prompts
        .into_iter()
        .zip(outputs)
        .enumerate()
        .map(|(i, (prompt, &o))| Request {
            prompt,
            stop: StopConditions::max_tokens(o),
            arrival_step: (i as f64 * gap) as usize,
            tenant: 0,
            resumes: false,
        })
        .collect()
}

/// The paged engine over the trace.
pub fn continuous_paged(
    model_name: &str,
    engine_name: &str,
    engine: &mut dyn PagedEngine,
    model: &Model,
    pool: PoolOptions,
    max_model_len: usize,
    requests: &[Request],
) -> Result<ContinuousRow> {
    let r = drive(engine, model, pool, max_model_len, requests)?;
    let generated: usize = r.outputs.iter().map(|o| o.0.len()).sum();
    let secs = r.engine_time.as_secs_f64();
    let n = r.steps.len().max(1);
    let mode = "continuous batching";
    Ok(ContinuousRow {
        steps: Some(r.steps.len()),
        mean_batch: Some(r.steps.iter().map(|s| s.num_seqs).sum::<usize>() as f64 / n as f64),
        max_batch: r.steps.iter().map(|s| s.num_seqs).max(),
        preemptions: Some(r.metrics.num_preemptions),
        pool_blocks: Some(pool.num_blocks),
        block_size: Some(pool.block_size),
        ..ContinuousRow::new((model_name, engine_name, mode), requests, generated, secs)
    })
}

/// A contiguous engine serving the trace one request at a time, in arrival order.
pub fn continuous_sequential(
    model_name: &str,
    engine: &mut dyn Engine,
    requests: &[Request],
) -> Result<ContinuousRow> {
    let mut secs = 0.0;
    let mut generated = 0;
    for r in requests {
        let n = r.stop.max_tokens;
        let seq = engine.new_sequence(r.prompt.len() + n)?;
        let t = Instant::now();
        let res = (|| -> Result<()> {
            let mut next = argmax(&engine.prefill(seq, &r.prompt)?);
            for _ in 1..n {
                next = argmax(&engine.decode(seq, next)?);
            }
            std::hint::black_box(next);
            Ok(())
        })();
        secs += t.elapsed().as_secs_f64();
        engine.free(seq);
        res?;
        generated += n;
    }
    let mode = "one request at a time";
    Ok(ContinuousRow::new(
        (model_name, engine.name(), mode),
        requests,
        generated,
        secs,
    ))
}

//! The continuous-batching step, written once for every paged engine and every caller: [`step`]
//! is schedule → execute → sample → update, and both [`drive`] (batched runs, verify, bench)
//! and `kvlab serve`'s engine thread turn it.
//!
//! Each step: the [`Scheduler`] picks a batch; blocks move between the pool and the tiers below
//! it if it has any; the engine ([`StepExecutor`]) performs the batch's block copies and runs its
//! tokens, returning one row of logits per scheduled sequence; a token is sampled for each; the
//! scheduler appends them, frees finished sequences and registers full blocks for reuse. `drive`
//! adds arrivals: requests whose arrival step has come join the waiting queue first.

use std::time::{Duration, Instant};

use serde::Serialize;

use crate::{
    BlockId, FinishReason, FinishedSeq, Metrics, ModelInput, PagedError, RequestId, ScheduledBatch,
    Scheduler, StopConditions, Tenant, TierMoveError,
};

/// An engine that runs scheduled steps over a paged KV cache (CPU or CUDA).
pub trait StepExecutor {
    /// What the engine fails with (a malformed step, out of device memory, a kernel failure).
    type Error;

    /// Checks `input` ([`ModelInput::validate`]), performs every block copy of it
    /// (copy-on-write, before any write), then computes each sequence's new tokens, storing
    /// their K and V at the step's `slot_mapping` and attending through the sequence's row of
    /// `block_tables`. Returns the logits (vocab_size,) of each `logits_indices` row, in
    /// sequence order.
    ///
    /// # Errors
    /// A malformed step, or whatever the engine fails with (out of device memory, a kernel
    /// failure, ...).
    fn execute(&mut self, input: &ModelInput) -> Result<Vec<Vec<f32>>, Self::Error>;

    /// The bytes of `block` of KV cache group `group`: every layer of the group, keys and
    /// values, exactly as the pool stores them (scales included), for a tier below the pool
    /// ([`crate::tier`]). `None` (the default): this engine cannot move blocks, and what the
    /// tiers would hold is dropped instead.
    ///
    /// # Errors
    /// Whatever the engine fails with reading its pool.
    fn read_block(&mut self, group: usize, block: BlockId) -> Result<Option<Vec<u8>>, Self::Error> {
        let _ = (group, block);
        Ok(None)
    }

    /// Overwrites `block` of `group` with bytes [`Self::read_block`] returned, so that it reads
    /// back bit-identical. `false` (the default): this engine cannot move blocks.
    ///
    /// # Errors
    /// Whatever the engine fails with, including bytes of the wrong length for a block.
    fn write_block(
        &mut self,
        group: usize,
        block: BlockId,
        bytes: &[u8],
    ) -> Result<bool, Self::Error> {
        let _ = (group, block, bytes);
        Ok(false)
    }
}

/// Runs one scheduled step: the tier moves it needs
/// ([`crate::KvCacheManager::move_tier_blocks`]), then the engine's copies and forward pass
/// ([`StepExecutor::execute`] on the step's [`ModelInput`]).
///
/// # Errors
/// [`DriveError::Tier`] from the moves, [`DriveError::Engine`] from the step.
pub fn execute_step<E: StepExecutor + ?Sized>(
    engine: &mut E,
    scheduler: &mut Scheduler,
    batch: &ScheduledBatch,
) -> Result<Vec<Vec<f32>>, DriveError<E::Error>>
where
    E::Error: std::fmt::Display,
{
    scheduler
        .kv_cache_manager_mut()
        .move_tier_blocks(engine)
        .map_err(DriveError::Tier)?;
    engine
        .execute(&batch.model_input())
        .map_err(DriveError::Engine)
}

/// What one [`step`] did.
#[derive(Debug)]
pub struct StepOutcome<R> {
    /// The step the scheduler built and the engine ran.
    pub batch: ScheduledBatch,
    /// (sequence, token) sampled, in batch order (none for partial prefills).
    pub sampled: Vec<(RequestId, u32)>,
    /// Sequences the sampler refused, with its reason: aborted, their blocks already free.
    pub refused: Vec<(RequestId, R)>,
    /// Sequences that finished with this step; their blocks are already free.
    pub finished: Vec<FinishedSeq>,
    /// Wall time of the tier moves and the engine's step.
    pub engine_time: Duration,
}

/// One turn of continuous batching: schedule a step (`None` when it is empty: nothing waits
/// or runs, or nothing fits), show it to `on_batch`, run it ([`execute_step`]), sample the
/// logits of each sequence that [`crate::ScheduledSeq::samples`] with `sample` (an `Err`
/// aborts that sequence; a partial prefill's logits are dropped), and hand the tokens back to
/// the scheduler.
///
/// # Errors
/// [`DriveError`] from the scheduler, the tier moves or the engine; the step is then left in
/// flight only if the engine failed (abort its sequences, or `update(&[])` after aborting them).
pub fn step<E: StepExecutor + ?Sized, R>(
    engine: &mut E,
    scheduler: &mut Scheduler,
    mut sample: impl FnMut(RequestId, Vec<f32>) -> Result<u32, R>,
    on_batch: impl FnOnce(&ScheduledBatch, &Scheduler),
) -> Result<Option<StepOutcome<R>>, DriveError<E::Error>>
where
    E::Error: std::fmt::Display,
{
    let batch = scheduler.schedule()?;
    if batch.is_empty() {
        return Ok(None);
    }
    on_batch(&batch, scheduler);
    let t = Instant::now();
    let logits = execute_step(engine, scheduler, &batch)?;
    let engine_time = t.elapsed();
    let (mut sampled, mut refused) = (Vec::with_capacity(logits.len()), Vec::new());
    let samples = batch.seqs.iter().zip(logits).filter(|(s, _)| s.samples);
    for (s, row) in samples {
        match sample(s.seq_id, row) {
            Ok(token) => sampled.push((s.seq_id, token)),
            Err(reason) => {
                scheduler.abort(s.seq_id)?;
                refused.push((s.seq_id, reason));
            }
        }
    }
    let finished = scheduler.update(&sampled)?;
    Ok(Some(StepOutcome {
        batch,
        sampled,
        refused,
        finished,
        engine_time,
    }))
}

/// A request of a batched run.
#[derive(Debug, Clone)]
pub struct Request {
    /// Prompt token ids, BOS included.
    pub prompt: Vec<u32>,
    /// When it finishes: max_tokens, stop_token_ids, max_seq_len.
    pub stop: StopConditions,
    /// The step at which it arrives (0: before the first step).
    pub arrival_step: usize,
    /// Whose request it is, for per-tenant prefix-cache quotas and hit rates (0 if nobody's).
    pub tenant: Tenant,
    /// The session pauses after it and a later request continues it (a multi-turn trace's
    /// turn before the last): with `TierConfig::offload_paused` its KV goes to the tiers as
    /// soon as it finishes ([`Scheduler::offload_when_finished`]).
    pub resumes: bool,
}

/// One step of a batched run, for reports and plots.
#[derive(Debug, Clone, Serialize)]
pub struct StepStats {
    /// The step's index in the run (0: the first step).
    pub step: usize,
    /// Sequences scheduled in the step (prefills and decodes).
    pub num_seqs: usize,
    /// Sequences that prefilled (a whole prompt or a chunk of one) in the step.
    pub num_prefills: usize,
    /// Tokens computed this step (prefill tokens plus one per decoding sequence).
    pub num_batched_tokens: usize,
    /// Sequences preempted by recompute in the step (their blocks freed).
    pub num_preempted: usize,
    /// Seconds the engine spent on the step.
    pub seconds: f64,
    /// Fraction of blocks in use after the step (vLLM's `kv_cache_usage_perc`, 0..1).
    pub kv_cache_usage_perc: f64,
}

/// What a batched run produced.
#[derive(Debug, Clone, Serialize)]
pub struct DriveReport {
    /// Per request, in the order given: its generated tokens and why it finished.
    pub outputs: Vec<(Vec<u32>, FinishReason)>,
    /// Per request, in the order given: the step that sampled its first token.
    pub first_token_steps: Vec<Option<usize>>,
    /// One entry per step, in order.
    pub steps: Vec<StepStats>,
    /// The scheduler's metrics after the last step.
    pub metrics: Metrics,
    /// Engine time summed over steps.
    #[serde(skip)]
    pub engine_time: Duration,
    /// The whole run: scheduling, engine steps, sampling and updates (arrivals are step
    /// numbers, never waited for), as vLLM's `benchmark_throughput.py` times `LLM.generate`.
    #[serde(skip)]
    pub wall_time: Duration,
}

impl DriveReport {
    /// Decode tokens and the engine seconds they took: the steps that prefilled nothing (a
    /// step that prefills is mostly prompt, so it would mix the two phases' speeds).
    pub fn decode_only(&self) -> (usize, f64) {
        let d = self.steps.iter().filter(|s| s.num_prefills == 0);
        (
            d.clone().map(|s| s.num_batched_tokens).sum(),
            d.map(|s| s.seconds).sum(),
        )
    }
}

/// Errors of [`drive`]: the scheduler's or the engine's.
#[derive(Debug, thiserror::Error)]
pub enum DriveError<E: std::fmt::Display> {
    /// The scheduler refused a request or an update (see [`PagedError`]).
    #[error(transparent)]
    Paged(#[from] PagedError),
    /// The engine failed to run a step; its error.
    #[error("engine: {0}")]
    Engine(E),
    /// Moving blocks between the pool and its tiers failed before a step.
    #[error("tier move: {0}")]
    Tier(TierMoveError<E>),
    /// At this step nothing could be scheduled while requests were unfinished and all had
    /// arrived: the pool is too small for them; raise num_blocks or shorten the requests.
    #[error(
        "the scheduler made no progress at step {0} with requests still unfinished; the pool is too small for them"
    )]
    Stuck(usize),
}

/// Runs `requests` to completion through `scheduler` and `engine`, sampling with `sample`.
/// `on_step` sees every batch before it runs (for tracing and pictures).
///
/// # Errors
/// [`DriveError`] from the scheduler, the engine, or a step that schedules nothing while work
/// remains.
pub fn drive<E: StepExecutor + ?Sized>(
    engine: &mut E,
    scheduler: &mut Scheduler,
    requests: &[Request],
    mut sample: impl FnMut(&[f32]) -> u32,
    mut on_step: impl FnMut(usize, &ScheduledBatch, &Scheduler),
) -> Result<DriveReport, DriveError<E::Error>>
where
    E::Error: std::fmt::Display,
{
    let mut ids: Vec<Option<RequestId>> = vec![None; requests.len()];
    let mut outputs: Vec<Option<(Vec<u32>, FinishReason)>> = vec![None; requests.len()];
    let mut first_token_steps: Vec<Option<usize>> = vec![None; requests.len()];
    let mut steps = Vec::new();
    let mut engine_time = Duration::ZERO;
    let started = Instant::now();
    let last_arrival = requests.iter().map(|r| r.arrival_step).max().unwrap_or(0);
    let mut step = 0;
    loop {
        for (i, r) in requests.iter().enumerate() {
            if ids[i].is_none() && r.arrival_step <= step {
                let (prompt, stop) = (r.prompt.clone(), r.stop.clone());
                let id = scheduler.add_request_for(prompt, stop, r.tenant)?;
                if r.resumes {
                    scheduler.offload_when_finished(id)?;
                }
                ids[i] = Some(id);
            }
        }
        if !scheduler.has_unfinished() && step >= last_arrival {
            break;
        }
        let on_batch = |batch: &ScheduledBatch, s: &Scheduler| on_step(step, batch, s);
        let sample = |_, logits: Vec<f32>| Ok::<_, std::convert::Infallible>(sample(&logits));
        let Some(outcome) = self::step(engine, scheduler, sample, on_batch)? else {
            if scheduler.has_unfinished() && step >= last_arrival {
                return Err(DriveError::Stuck(step));
            }
            step += 1;
            continue;
        };
        let (batch, seconds) = (&outcome.batch, outcome.engine_time);
        engine_time += seconds;
        for (i, id) in ids.iter().enumerate() {
            if first_token_steps[i].is_none()
                && id.is_some_and(|id| outcome.sampled.iter().any(|(s, _)| *s == id))
            {
                first_token_steps[i] = Some(step);
            }
        }
        for f in outcome.finished {
            if let Some(i) = ids.iter().position(|id| *id == Some(f.seq_id)) {
                outputs[i] = Some((f.output_token_ids, f.reason));
            }
        }
        let m = scheduler.metrics();
        steps.push(StepStats {
            step,
            num_seqs: batch.seqs.len(),
            num_prefills: batch.num_prefills(),
            num_batched_tokens: batch.num_batched_tokens(),
            num_preempted: batch.preempted.len(),
            seconds: seconds.as_secs_f64(),
            kv_cache_usage_perc: m.kv_cache_usage_perc,
        });
        step += 1;
    }
    Ok(DriveReport {
        outputs: outputs
            .into_iter()
            .map(|o| o.unwrap_or((Vec::new(), FinishReason::Length)))
            .collect(),
        first_token_steps,
        steps,
        metrics: scheduler.metrics(),
        engine_time,
        wall_time: started.elapsed(),
    })
}

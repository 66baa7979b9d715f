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

/// What turns a step's logits into tokens, one sequence at a time; with speculative decoding
/// it also proposes the draft tokens each decode checks. A closure
/// `FnMut(RequestId, Vec<f32>) -> Result<u32, R>` is one that never proposes.
pub trait TokenSampler {
    /// Why a sequence cannot be sampled (it is then aborted).
    type Error;

    /// The token after a row of logits (vocab_size,) of sequence `id`. Rows are sampled in
    /// position order, so a sampler that remembers what it picked (a repeat penalty) sees each
    /// kept token before the next row.
    ///
    /// # Errors
    /// Whatever the sampler refuses (non-finite logits, a request that is gone).
    fn sample(&mut self, id: RequestId, logits: Vec<f32>) -> Result<u32, Self::Error>;

    /// Whether [`Self::propose`] may return anything (the driver skips asking otherwise).
    fn speculates(&self) -> bool {
        false
    }

    /// Up to `max` draft tokens for decoding sequence `id`, guesses of the tokens after
    /// `token_ids` (its prompt and output so far). None by default.
    fn propose(&mut self, id: RequestId, token_ids: &[u32], max: usize) -> Vec<u32> {
        let _ = (id, token_ids, max);
        Vec::new()
    }

    /// The step checked `num_drafts` draft tokens of `id` and kept `num_kept` (a proposer may
    /// guess less often where its guesses fail).
    fn drafts_checked(&mut self, id: RequestId, num_drafts: usize, num_kept: usize) {
        let _ = (id, num_drafts, num_kept);
    }

    /// Sequence `id` finished or was aborted: forget what was kept for it.
    fn release(&mut self, id: RequestId) {
        let _ = id;
    }
}

impl<R, F: FnMut(RequestId, Vec<f32>) -> Result<u32, R>> TokenSampler for F {
    type Error = R;

    fn sample(&mut self, id: RequestId, logits: Vec<f32>) -> Result<u32, R> {
        self(id, logits)
    }
}

/// What one [`step`] did.
#[derive(Debug)]
pub struct StepOutcome<R> {
    /// The step the scheduler built and the engine ran.
    pub batch: ScheduledBatch,
    /// (sequence, token) sampled, in batch order (none for partial prefills); a sequence whose
    /// step checked draft tokens has one entry per token it gained (the drafts kept, then the
    /// token after them), none past a stop.
    pub sampled: Vec<(RequestId, u32)>,
    /// Sequences the sampler refused, with its reason: aborted, their blocks already free.
    pub refused: Vec<(RequestId, R)>,
    /// Sequences that finished with this step; their blocks are already free.
    pub finished: Vec<FinishedSeq>,
    /// Wall time of the tier moves and the engine's step.
    pub engine_time: Duration,
}

/// One turn of continuous batching: with a speculating `sampler`, draft tokens for every
/// decoding sequence ([`TokenSampler::propose`], [`Scheduler::set_spec_token_ids`]); then
/// schedule a step (`None` when it is empty: nothing waits or runs, or nothing fits), show it to
/// `on_batch`, run it ([`execute_step`]), sample each sequence that
/// [`crate::ScheduledSeq::samples`] (an `Err` aborts that sequence; a partial prefill's logits
/// are dropped), and hand the tokens back to the scheduler.
///
/// Draft tokens are verified by sampling: the row of the last token gives a token; if it is the
/// first draft, the draft's row gives the next, and so on, until a sampled token differs from
/// its draft or the drafts run out. Greedy, this keeps exactly the drafts plain decoding would
/// have produced. At a temperature it is speculative sampling with a deterministic draft
/// (Leviathan et al. 2023): a draft `x` is kept with probability `p(x)`, and otherwise the
/// token is drawn from `p` without `x`, so every token has plain sampling's distribution.
///
/// # Errors
/// [`DriveError`] from the scheduler, the tier moves or the engine; the step is then left in
/// flight only if the engine failed (abort its sequences, or `update(&[])` after aborting them).
pub fn step<E: StepExecutor + ?Sized, S: TokenSampler + ?Sized>(
    engine: &mut E,
    scheduler: &mut Scheduler,
    sampler: &mut S,
    on_batch: impl FnOnce(&ScheduledBatch, &Scheduler),
) -> Result<Option<StepOutcome<S::Error>>, DriveError<E::Error>>
where
    E::Error: std::fmt::Display,
{
    if sampler.speculates() {
        propose(scheduler, sampler)?;
    }
    scheduler.kv_cache_manager_mut().learn_block_bytes(engine);
    let batch = scheduler.schedule()?;
    if batch.is_empty() {
        return Ok(None);
    }
    on_batch(&batch, scheduler);
    let t = Instant::now();
    let logits = execute_step(engine, scheduler, &batch)?;
    let engine_time = t.elapsed();
    let (mut sampled, mut refused) = (Vec::with_capacity(logits.len()), Vec::new());
    let mut rows = logits.into_iter();
    // Outputs so far of the sequences that checked drafts: only they can gain tokens past a
    // stop, which `update` does not append.
    let mut before = Vec::new();
    for s in &batch.seqs {
        let seq_rows: Vec<Vec<f32>> = rows.by_ref().take(s.num_logits()).collect();
        if !s.samples {
            continue;
        }
        if s.num_draft_tokens > 0 {
            let outputs = (scheduler.sequence(s.seq_id)).map_or(0, |q| q.output_token_ids().len());
            before.push((s.seq_id, outputs));
        }
        match verify(sampler, s.seq_id, s.draft_token_ids(), seq_rows) {
            Ok(tokens) => sampled.extend(tokens.into_iter().map(|t| (s.seq_id, t))),
            Err(reason) => {
                scheduler.abort(s.seq_id)?;
                sampler.release(s.seq_id);
                refused.push((s.seq_id, reason));
            }
        }
    }
    let finished = scheduler.update(&sampled)?;
    for f in &finished {
        sampler.release(f.seq_id);
        // Tokens sampled past a stop among kept drafts were not appended.
        let Some(&(_, had)) = before.iter().find(|(id, _)| *id == f.seq_id) else {
            continue;
        };
        let mut left = f.output_token_ids.len().saturating_sub(had);
        sampled.retain(|(id, _)| {
            let keep = *id != f.seq_id || left > 0;
            if *id == f.seq_id {
                left = left.saturating_sub(1);
            }
            keep
        });
    }
    Ok(Some(StepOutcome {
        batch,
        sampled,
        refused,
        finished,
        engine_time,
    }))
}

/// Asks `sampler` for the draft tokens of every decoding sequence.
fn propose<S: TokenSampler + ?Sized>(
    scheduler: &mut Scheduler,
    sampler: &mut S,
) -> Result<(), PagedError> {
    let ids: Vec<RequestId> = scheduler.decoding().map(|(id, _)| id).collect();
    for id in ids {
        let max = scheduler.max_draft_tokens(id)?;
        let Some(seq) = scheduler.sequence(id).filter(|_| max > 0) else {
            continue;
        };
        let drafts = sampler.propose(id, seq.token_ids(), max);
        scheduler.set_spec_token_ids(id, drafts)?;
    }
    Ok(())
}

/// The tokens of sequence `id` from `rows` (the logits of its last token, then of each of its
/// `drafts`): each row sampled in turn while the token sampled is the draft at its place.
fn verify<S: TokenSampler + ?Sized>(
    sampler: &mut S,
    id: RequestId,
    drafts: &[u32],
    rows: Vec<Vec<f32>>,
) -> Result<Vec<u32>, S::Error> {
    let mut tokens = Vec::with_capacity(rows.len());
    for (i, row) in rows.into_iter().enumerate() {
        let t = sampler.sample(id, row)?;
        tokens.push(t);
        if drafts.get(i) != Some(&t) {
            break;
        }
    }
    if !drafts.is_empty() {
        sampler.drafts_checked(id, drafts.len(), tokens.len().saturating_sub(1));
    }
    Ok(tokens)
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
    on_step: impl FnMut(usize, &ScheduledBatch, &Scheduler),
) -> Result<DriveReport, DriveError<E::Error>>
where
    E::Error: std::fmt::Display,
{
    let mut sampler = |_, logits: Vec<f32>| Ok::<_, std::convert::Infallible>(sample(&logits));
    drive_with(engine, scheduler, requests, &mut sampler, on_step)
}

/// [`drive`] with a [`TokenSampler`] that cannot fail, which may speculate (propose draft
/// tokens for the decodes to check).
///
/// # Errors
/// As [`drive`].
pub fn drive_with<E: StepExecutor + ?Sized, S>(
    engine: &mut E,
    scheduler: &mut Scheduler,
    requests: &[Request],
    sampler: &mut S,
    mut on_step: impl FnMut(usize, &ScheduledBatch, &Scheduler),
) -> Result<DriveReport, DriveError<E::Error>>
where
    E::Error: std::fmt::Display,
    S: TokenSampler<Error = std::convert::Infallible> + ?Sized,
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
        let Some(outcome) = self::step(engine, scheduler, sampler, on_batch)? else {
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
    scheduler.kv_cache_manager_mut().flush_remote_writes(engine);
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

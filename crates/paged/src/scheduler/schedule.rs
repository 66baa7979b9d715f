//! Building one step of continuous batching: which sequences run, with which slots.
//!
//! Each [`Scheduler::schedule`] has two phases:
//!
//! 1. **Decode every running sequence**, oldest first, one token each. If a sequence cannot get
//!    the block its next token needs, the *newest* running sequence is preempted by recompute
//!    (blocks freed, back to the head of the waiting queue, generated tokens kept) until it can;
//!    if it is itself the newest, it is the one preempted.
//! 2. **Admit waiting sequences** in FCFS order while a seat (`max_num_seqs`), the token budget
//!    (`max_num_batched_tokens` minus the decodes) and the blocks allow. A prompt's prefill is
//!    every token after its prefix-cache hit. The first one that does not fit stops admission
//!    (no overtaking), and nothing is admitted in a step that had to preempt.
//!
//! So a step may **mix** decodes and prefills (vLLM v1's choice, unlike v0's prefill-only steps):
//! decodes never stall behind a burst of new prompts, and the engine handles any mix the same way
//! (variable-length queries over paged keys). Prompts are prefilled whole, never chunked; the
//! configuration guarantees that any prompt fits one step (see [`crate::SchedulerConfig::validate`]).

use super::seq_mut;
use crate::{
    BlockCopy, PagedError, RequestId, Result, ScheduledBatch, ScheduledSeq, Scheduler,
    SequenceStatus, StepKind,
};

impl Scheduler {
    /// Builds the next step: decodes for all running sequences (preempting the newest when
    /// blocks run out), then FCFS admissions. An empty batch means no unfinished sequence.
    ///
    /// # Errors
    /// [`PagedError::UpdatePending`] if the previous batch was not passed to `update` yet;
    /// [`PagedError::Stuck`] (never under a validated configuration) if nothing could run.
    pub fn schedule(&mut self) -> Result<ScheduledBatch> {
        if self.in_flight.is_some() {
            return Err(PagedError::UpdatePending);
        }
        self.kv.begin_step(self.counters.num_steps);
        let mut batch = ScheduledBatch::default();
        let mut i = 0;
        while i < self.running.len() {
            let id = self.running[i];
            if let Some(s) = self.schedule_decode(id, &mut batch)? {
                batch.seqs.push(s);
                i += 1;
            }
        }
        let mut budget = self
            .config
            .max_num_batched_tokens
            .saturating_sub(batch.seqs.len());
        while batch.preempted.is_empty() && self.running.len() < self.config.max_num_seqs {
            let Some(&id) = self.waiting.front() else {
                break;
            };
            let Some(s) = self.try_admit(id, budget)? else {
                break;
            };
            budget = budget.saturating_sub(s.num_new_tokens());
            batch.seqs.push(s);
        }
        if batch.is_empty() && !self.seqs.is_empty() {
            return Err(PagedError::Stuck(format!(
                "{} waiting and {} running sequences but no step fits",
                self.waiting.len(),
                self.running.len()
            )));
        }
        self.kv.end_step(batch.is_empty());
        if !batch.is_empty() {
            self.in_flight = Some(batch.seqs.iter().map(|s| s.seq_id).collect());
            self.counters.num_steps += 1;
        }
        Ok(batch)
    }

    /// Reserves the next token of running sequence `id`, preempting the newest running
    /// sequences until it fits. `None` when `id` itself was preempted.
    fn schedule_decode(
        &mut self,
        id: RequestId,
        batch: &mut ScheduledBatch,
    ) -> Result<Option<ScheduledSeq>> {
        loop {
            self.trim_windows(id)?;
            let seq = seq_mut(&mut self.seqs, id)?;
            let (start, len) = (seq.num_computed_tokens, seq.len());
            match self
                .kv
                .allocate_slots(&mut seq.block_tables, len - start, len)
            {
                Ok(copies) => {
                    return Ok(Some(self.scheduled(id, start, StepKind::Decode, copies)?));
                }
                Err(PagedError::OutOfBlocks { .. }) => {} // Preempt the newest, then try again.
                Err(e) => return Err(e),
            }
            let Some(&victim) = self.running.last() else {
                return Err(PagedError::Stuck(format!("{id} is running but not listed")));
            };
            self.preempt(victim, batch)?;
            if victim == id {
                return Ok(None);
            }
        }
    }

    /// Admits waiting sequence `id` if a prefill of its uncached tokens fits `budget` and the
    /// pools ([`crate::KvCacheManager::get_computed_blocks`]); `None` (nothing changed)
    /// otherwise.
    fn try_admit(&mut self, id: RequestId, budget: usize) -> Result<Option<ScheduledSeq>> {
        let seq = seq_mut(&mut self.seqs, id)?;
        let len = seq.len();
        let Some(hit) = self.kv.get_computed_blocks(&seq.token_ids, budget) else {
            return Ok(None);
        };
        let (cached, declined) = (
            hit.num_blocks * self.config.kv_cache.block_size,
            hit.num_restores_declined,
        );
        let slots = self
            .kv
            .allocate_prompt_slots(&mut seq.block_tables, hit, len)?;
        self.waiting.pop_front();
        seq.status = SequenceStatus::Running;
        seq.num_computed_tokens = cached;
        let is_recompute = seq.num_preemptions > 0;
        let recomputed = seq.max_computed_tokens.min(len).saturating_sub(cached);
        let c = &mut self.counters;
        c.prefix_cache_queries += len as u64;
        c.prefix_cache_hits += cached as u64;
        c.hits_by_tier += slots.hits_by_tier;
        c.num_recomputed_tokens += recomputed as u64;
        c.num_restores_declined += declined as u64;
        let tenant = self.tenant_hits.entry(seq.tenant).or_default();
        (tenant.0, tenant.1) = (tenant.0 + len as u64, tenant.1 + cached as u64);
        let pos = self.running.partition_point(|&r| r < id);
        self.running.insert(pos, id);
        let kind = StepKind::Prefill {
            num_cached_tokens: cached,
            is_recompute,
        };
        Ok(Some(self.scheduled(id, cached, kind, slots.copies)?))
    }

    /// Preempts running `id` by recompute: frees its blocks and puts it at the head of the
    /// waiting queue with its generated tokens kept.
    pub(crate) fn preempt(&mut self, id: RequestId, batch: &mut ScheduledBatch) -> Result<()> {
        let seq = seq_mut(&mut self.seqs, id)?;
        self.kv.free(&mut seq.block_tables, false)?;
        seq.status = SequenceStatus::Waiting;
        seq.num_computed_tokens = 0;
        seq.num_preemptions += 1;
        self.running.retain(|&r| r != id);
        self.waiting.push_front(id);
        self.counters.num_preemptions += 1;
        batch.preempted.push(id);
        Ok(())
    }

    /// The plain-data description of `id`'s step over positions `start..len`.
    fn scheduled(
        &self,
        id: RequestId,
        start: usize,
        kind: StepKind,
        copies: Vec<Vec<BlockCopy>>,
    ) -> Result<ScheduledSeq> {
        let seq = self.seq(id)?;
        let tokens = &seq.token_ids[start..];
        Ok(ScheduledSeq::new(
            id,
            tokens,
            start,
            kind,
            &seq.block_tables,
            copies,
        ))
    }
}

//! Building one step of continuous batching: which sequences run, with which slots.
//!
//! Each [`Scheduler::schedule`] spends the step's token budget (`max_num_batched_tokens`) in
//! three passes:
//!
//! 1. **Decode every running sequence**, oldest first, one token each (with speculative
//!    decoding, that token and the draft tokens it was given, as many as the budget leaves). If a sequence cannot get
//!    the block its next token needs, the *newest* running sequence is preempted by recompute
//!    (blocks freed, back to the head of the waiting queue, generated tokens kept) until it can;
//!    if it is itself the newest, it is the one preempted.
//! 2. **Continue chunked prefills** (with `enable_chunked_prefill`): a running sequence whose
//!    prompt is only partly computed gets its next chunk, as much as the budget left allows,
//!    oldest first, preempting as decodes do.
//! 3. **Admit waiting sequences** in FCFS order while a seat (`max_num_seqs`), the budget and
//!    the blocks allow. A prompt's prefill is every token after its prefix-cache hit; without
//!    chunking it must fit the budget whole, with it the first chunk is what the budget leaves.
//!    The first one that does not fit stops admission (no overtaking), and nothing is admitted
//!    in a step that had to preempt.
//!
//! So a step may **mix** decodes and prefills (vLLM v1's choice, unlike v0's prefill-only steps):
//! decodes never stall behind a burst of new prompts, and the engine handles any mix the same way
//! (variable-length queries over paged keys). With chunked prefill (vLLM v1's default) a long
//! prompt no longer stalls them either: it is computed a budget's worth per step, each chunk
//! attending over the chunks already in the cache, and only its last chunk samples a token.
//! Without it, prompts are prefilled whole and the configuration guarantees that any prompt fits
//! one step (see [`crate::SchedulerConfig::validate`]); with it a budget of 1 token is enough,
//! and decodes beyond the budget simply wait a step.

use super::{InFlight, seq_mut};
use crate::{
    BlockCopy, PagedError, RequestId, Result, ScheduledBatch, ScheduledSeq, Scheduler,
    SequenceStatus, StepKind,
};

impl Scheduler {
    /// Builds the next step: decodes for all running sequences (preempting the newest when
    /// blocks run out), the next chunks of partly computed prompts, then FCFS admissions. An
    /// empty batch means no unfinished sequence.
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
        let mut budget = self.config.max_num_batched_tokens;
        for chunks in [false, true] {
            let mut i = 0;
            while i < self.running.len() && budget > 0 {
                let id = self.running[i];
                let seq = self.seq(id)?;
                let (start, len) = (seq.num_computed_tokens, seq.len());
                if (start < seq.prefill_len) != chunks {
                    i += 1; // Not this pass's kind.
                    continue;
                }
                // A decode feeds its last token and the drafts it was given.
                let drafts = if chunks { 0 } else { seq.spec_token_ids.len() };
                let n = (len - start + drafts).min(budget);
                let (s, refund) = self.schedule_running(id, n, &mut batch)?;
                budget += refund;
                if let Some(s) = s {
                    budget -= s.num_new_tokens();
                    batch.seqs.push(s);
                    i += 1;
                }
            }
        }
        while batch.preempted.is_empty() && self.running.len() < self.config.max_num_seqs {
            let Some(&id) = self.waiting.front() else {
                break;
            };
            let Some(s) = self.try_admit(id, budget)? else {
                break;
            };
            budget -= s.num_new_tokens();
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
            for s in &batch.seqs {
                seq_mut(&mut self.seqs, s.seq_id)?.spec_token_ids.clear();
            }
            let in_flight = batch.seqs.iter().map(|s| InFlight {
                id: s.seq_id,
                end: s.context_len,
                samples: s.samples,
                drafts: s.draft_token_ids().to_vec(),
            });
            self.in_flight = Some(in_flight.collect());
            self.counters.num_steps += 1;
        }
        Ok(batch)
    }

    /// Reserves the next `num_new_tokens` of running sequence `id` (its decode, or its prompt's
    /// next chunk), preempting the newest running sequences until they fit. A chunk that does
    /// not fit is halved first, down to one token: a sliding-window pool may hold only one
    /// window, and a chunk's queries read up to `window − 1` cached keys besides its own.
    /// Returns the step (`None` when `id` itself was preempted) and the budget given back by
    /// victims that were already in `batch`.
    fn schedule_running(
        &mut self,
        id: RequestId,
        num_new_tokens: usize,
        batch: &mut ScheduledBatch,
    ) -> Result<(Option<ScheduledSeq>, usize)> {
        let (mut refund, mut n) = (0, num_new_tokens);
        loop {
            self.trim_windows(id)?;
            let seq = seq_mut(&mut self.seqs, id)?;
            let (start, prefill_len) = (seq.num_computed_tokens, seq.prefill_len);
            let end = start + n;
            match self.kv.allocate_slots(&mut seq.block_tables, n, end) {
                Ok(copies) => {
                    let kind = if start < prefill_len {
                        StepKind::Prefill {
                            num_cached_tokens: start,
                            is_recompute: seq.num_preemptions > 0,
                        }
                    } else {
                        StepKind::Decode
                    };
                    let s = self.scheduled(id, start..end, kind, copies)?;
                    return Ok((Some(s), refund));
                }
                Err(PagedError::OutOfBlocks { .. }) if n > 1 => {
                    n /= 2;
                    continue;
                }
                Err(PagedError::OutOfBlocks { .. }) => {} // Preempt the newest, then try again.
                Err(e) => return Err(e),
            }
            let Some(&victim) = self.running.last() else {
                return Err(PagedError::Stuck(format!("{id} is running but not listed")));
            };
            n = num_new_tokens;
            refund += self.preempt(victim, batch)?;
            if victim == id {
                return Ok((None, refund));
            }
        }
    }

    /// Admits waiting sequence `id` if a prefill of its uncached tokens (or with chunked
    /// prefill, a first chunk of them) fits `budget` and the pools
    /// ([`crate::KvCacheManager::get_computed_blocks`]); `None` (nothing changed) otherwise.
    fn try_admit(&mut self, id: RequestId, budget: usize) -> Result<Option<ScheduledSeq>> {
        let chunked = self.config.enable_chunked_prefill;
        let seq = seq_mut(&mut self.seqs, id)?;
        let len = seq.len();
        let salt = seq.block_tables.first().map_or(0, |t| t.salt());
        let Some(hit) = self
            .kv
            .get_computed_blocks((&seq.token_ids, salt), budget, chunked)
        else {
            return Ok(None);
        };
        let (cached, declined) = (
            hit.num_blocks * self.config.kv_cache.block_size,
            hit.num_restores_declined,
        );
        let end = cached + hit.num_new_tokens;
        let slots = self.kv.allocate_prompt_slots(&mut seq.block_tables, hit)?;
        self.waiting.pop_front();
        seq.status = SequenceStatus::Running;
        seq.num_computed_tokens = cached;
        seq.prefill_len = len;
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
        Ok(Some(self.scheduled(id, cached..end, kind, slots.copies)?))
    }

    /// Preempts running `id` by recompute: frees its blocks and puts it at the head of the
    /// waiting queue with its generated tokens kept. If `batch` already holds a step of it, the
    /// step is dropped; returns the tokens it would have fed (0 if none).
    pub(crate) fn preempt(&mut self, id: RequestId, batch: &mut ScheduledBatch) -> Result<usize> {
        let seq = seq_mut(&mut self.seqs, id)?;
        self.kv.free(&mut seq.block_tables, false)?;
        seq.spec_token_ids.clear();
        seq.status = SequenceStatus::Waiting;
        seq.num_computed_tokens = 0;
        seq.num_preemptions += 1;
        self.running.retain(|&r| r != id);
        self.waiting.push_front(id);
        self.counters.num_preemptions += 1;
        batch.preempted.push(id);
        let dropped = batch.seqs.iter().position(|s| s.seq_id == id);
        Ok(dropped.map_or(0, |i| batch.seqs.remove(i).num_new_tokens()))
    }

    /// The plain-data description of `id`'s step over positions `range`; it samples if the
    /// range reaches the sequence's last token, and positions past it are its draft tokens.
    fn scheduled(
        &self,
        id: RequestId,
        range: std::ops::Range<usize>,
        kind: StepKind,
        copies: Vec<Vec<BlockCopy>>,
    ) -> Result<ScheduledSeq> {
        let seq = self.seq(id)?;
        let len = seq.len();
        let samples = range.end >= len;
        let num_draft_tokens = range.end.saturating_sub(len);
        let tokens: Vec<u32> = (seq.token_ids[range.start..range.end.min(len)].iter())
            .chain(&seq.spec_token_ids[..num_draft_tokens])
            .copied()
            .collect();
        let mut s = ScheduledSeq::new(
            id,
            (&tokens, range.start),
            (kind, samples),
            &seq.block_tables,
            copies,
        );
        s.num_draft_tokens = num_draft_tokens;
        Ok(s)
    }
}

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
    BlockCopy, PagedError, Result, ScheduledBatch, ScheduledSeq, Scheduler, SeqId, SequenceStatus,
    StepKind,
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
        self.forget_unmoved();
        for alloc in &mut self.allocators {
            alloc.tick(self.counters.num_steps);
        }
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
        // Paused sessions go down once the step's admissions have taken what they hit (a
        // block one of them holds again stays); the step's moves read the rest before a later
        // step can reuse them. An empty step runs no moves, so they wait for one that does.
        if !batch.is_empty() {
            for (g, blocks) in std::mem::take(&mut self.paused_blocks) {
                self.allocators[g].offload(&blocks);
            }
        }
        self.collect_tier_ops();
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
        id: SeqId,
        batch: &mut ScheduledBatch,
    ) -> Result<Option<ScheduledSeq>> {
        loop {
            self.trim_windows(id)?;
            let seq = self.seq(id)?;
            let start = seq.num_computed_tokens;
            let end = seq.len();
            let mut fits = true;
            for (g, alloc) in self.allocators.iter().enumerate() {
                let keep = self.keep_from(g, end);
                let need =
                    alloc.blocks_needed_to_append(&seq.block_tables[g], end - start, keep)?;
                fits &= need <= alloc.num_free_blocks();
            }
            if fits {
                let copies = self.reserve(id, end - start)?;
                return Ok(Some(self.scheduled(id, start, StepKind::Decode, copies)?));
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
    /// pools; `None` (nothing changed) otherwise.
    ///
    /// The prefix hit is the longest `h` full blocks that every group can serve: a
    /// full-attention group needs all `h` blocks, a sliding-window group only those from
    /// `window_start(h · block_size)` on (see `allocator/prefix.rs`).
    fn try_admit(&mut self, id: SeqId, budget: usize) -> Result<Option<ScheduledSeq>> {
        let bs = self.config.kv_cache.block_size;
        let seq = self.seq(id)?;
        let len = seq.len();
        let max_blocks = (len - 1) / bs;
        let mut matches: Vec<_> = (0..self.allocators.len())
            .map(|g| {
                let alloc = &self.allocators[g];
                match self.config.kv_cache.groups[g].sliding_window {
                    Some(_) => alloc.match_prefix_levels(&seq.token_ids, max_blocks),
                    None => alloc.match_prefix(&seq.token_ids, max_blocks),
                }
            })
            .collect();
        let declined = self.weigh_restores(&mut matches);
        for (g, m) in matches.iter_mut().enumerate() {
            self.check_restores(g, m);
        }
        let first_needed = |g: usize, h: usize| self.keep_from(g, h * bs) / bs;
        // First position of the prompt group g keeps after a hit of h blocks. A sliding-window
        // group needs only what the queries after this prefill can see (`keep_from(len)`): the
        // keys only this prefill's own queries read get PAD_SLOT and no memory. With prefix
        // caching, those keys are what a later prompt sharing this one needs to hit, so the
        // prefill writes them, registers its full blocks and trims them into the cache right
        // after the step (vLLM also allocates the whole scheduled prompt); when the pool cannot
        // take that, the prompt is prefilled windowed and simply caches less.
        let caching = self.config.enable_prefix_caching;
        let keep = |g: usize, h: usize, cache_all: bool| {
            if cache_all {
                self.keep_from(g, h * bs)
            } else {
                self.keep_from(g, len)
            }
        };
        // Blocks group g must take to prefill from a hit of h blocks: the matched blocks it
        // adopts that are evictable now, plus fresh ones for the uncached positions it keeps.
        let blocks_to_take = |g: usize, h: usize, cache_all: bool| {
            let adopted = matches[g].num_blocks_taken_in(first_needed(g, h).min(h)..h);
            let keep = keep(g, h, cache_all);
            let fresh = (h..len.div_ceil(bs))
                .filter(|j| (j + 1) * bs > keep)
                .count();
            adopted + fresh
        };
        let longest = matches.iter().map(|m| m.num_blocks()).min().unwrap_or(0);
        let groups = || 0..matches.len();
        let fits = |h: usize, cache_all: bool| {
            groups().all(|g| self.allocators[g].can_allocate(blocks_to_take(g, h, cache_all)))
        };
        let hit = (0..=longest)
            .rev()
            .filter(|&h| groups().all(|g| matches[g].holds(h, first_needed(g, h))))
            .take_while(|&h| len - h * bs <= budget) // A shorter hit computes even more tokens.
            .find_map(|h| {
                if caching && fits(h, true) {
                    Some((h, true))
                } else {
                    fits(h, false).then_some((h, false))
                }
            });
        let Some((hit_blocks, cache_all)) = hit else {
            return Ok(None);
        };
        let keeps: Vec<usize> = groups().map(|g| keep(g, hit_blocks, cache_all)).collect();
        let cached = hit_blocks * bs;
        for (g, m) in matches.iter_mut().enumerate() {
            m.truncate(hit_blocks);
            m.forget_before(first_needed(g, hit_blocks));
        }
        let by_tier = self.hits_by_tier(&matches, hit_blocks);
        let mut copies = Vec::with_capacity(matches.len());
        for (g, m) in matches.iter().enumerate() {
            let alloc = &mut self.allocators[g];
            let seq = seq_mut(&mut self.seqs, id)?;
            let table = &mut seq.block_tables[g];
            alloc.adopt_prefix(table, m)?;
            copies.push(alloc.append_slots(table, len - cached, keeps[g])?);
        }
        self.waiting.pop_front();
        let seq = seq_mut(&mut self.seqs, id)?;
        seq.status = SequenceStatus::Running;
        seq.num_computed_tokens = cached;
        let is_recompute = seq.num_preemptions > 0;
        let recomputed = seq.max_computed_tokens.min(len).saturating_sub(cached);
        self.counters.prefix_cache_queries += len as u64;
        self.counters.prefix_cache_hits += cached as u64;
        let h = &mut self.counters.hits_by_tier;
        (h.pool, h.host, h.disk) = (
            h.pool + by_tier.pool,
            h.host + by_tier.host,
            h.disk + by_tier.disk,
        );
        let tenant = self.tenant_hits.entry(seq.tenant).or_default();
        (tenant.0, tenant.1) = (tenant.0 + len as u64, tenant.1 + cached as u64);
        self.counters.num_recomputed_tokens += recomputed as u64;
        self.counters.num_restores_declined += declined as u64;
        let pos = self.running.partition_point(|&r| r < id);
        self.running.insert(pos, id);
        let kind = StepKind::Prefill {
            num_cached_tokens: cached,
            is_recompute,
        };
        Ok(Some(self.scheduled(id, cached, kind, copies)?))
    }

    /// Preempts running `id` by recompute: frees its blocks and puts it at the head of the
    /// waiting queue with its generated tokens kept.
    pub(crate) fn preempt(&mut self, id: SeqId, batch: &mut ScheduledBatch) -> Result<()> {
        let seq = seq_mut(&mut self.seqs, id)?;
        for (alloc, table) in self.allocators.iter_mut().zip(&mut seq.block_tables) {
            alloc.free(table)?;
        }
        seq.status = SequenceStatus::Waiting;
        seq.num_computed_tokens = 0;
        seq.num_preemptions += 1;
        self.running.retain(|&r| r != id);
        self.waiting.push_front(id);
        self.counters.num_preemptions += 1;
        batch.preempted.push(id);
        Ok(())
    }

    /// Reserves slots for the tokens `num_computed..len` of `id` in every group.
    fn reserve(&mut self, id: SeqId, n: usize) -> Result<Vec<Vec<BlockCopy>>> {
        let seq = seq_mut(&mut self.seqs, id)?;
        let (len, groups) = (seq.len(), &self.config.kv_cache.groups);
        let tables = self.allocators.iter_mut().zip(&mut seq.block_tables);
        tables
            .zip(groups)
            .map(|((alloc, table), g)| alloc.append_slots(table, n, g.keep_from(len)))
            .collect()
    }

    /// The plain-data description of `id`'s step over positions `start..len`.
    fn scheduled(
        &self,
        id: SeqId,
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

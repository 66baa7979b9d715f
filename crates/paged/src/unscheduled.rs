//! Sequences driven one at a time through the `Engine` API, without the scheduler (`kvlab
//! generate`, verify's solo runs): one [`BlockAllocator`] per KV group with prefix caching off,
//! and per sequence a [`BlockTable`] per group. Each step reserves slots exactly as the
//! [`crate::Scheduler`] does — free the sliding-window blocks the step's first query cannot
//! reach, then `append_slots` with `keep_from = window_start(end, window)` — and describes itself
//! as a one-sequence [`ModelInput`], which a paged engine runs like any scheduled step. The
//! CPU and CUDA paged engines both use it, so a new paged engine implements only its step.

use crate::{
    BlockAllocator, BlockTable, KvCacheConfig, ModelInput, RequestId, Result, ScheduledBatch,
    ScheduledSeq, StepKind,
};

/// One sequence's tables and length.
#[derive(Debug, Clone)]
pub struct UnscheduledSeq {
    /// (num_groups,)
    pub tables: Vec<BlockTable>,
    /// Positions whose K and V are in the pool.
    pub len: usize,
    /// Most positions the sequence may reach (prompt plus generated tokens).
    pub max_seq_len: usize,
    /// Group 0's slots of the last step, for `Engine::trace`.
    pub last_slots: Vec<i64>,
}

impl UnscheduledSeq {
    /// Group 0's block table and the slots of the last step, for `Engine::trace`: a hole
    /// (`PAD_BLOCK`) or an unstored slot (`PAD_SLOT`) reads `u32::MAX`.
    pub fn trace_rows(&self) -> (Vec<u32>, Vec<u32>) {
        let pad = |x: i64| u32::try_from(x).unwrap_or(u32::MAX);
        let table = self
            .tables
            .first()
            .map(BlockTable::to_row)
            .unwrap_or_default();
        (
            table.iter().map(|&b| pad(b.into())).collect(),
            self.last_slots.iter().map(|&s| pad(s)).collect(),
        )
    }
}

/// The pools of the unscheduled sequences of one engine.
#[derive(Debug, Clone)]
pub struct UnscheduledPools {
    allocators: Vec<BlockAllocator>,
    /// Their shape: the engine's pool.
    kv_cache: KvCacheConfig,
}

impl UnscheduledPools {
    /// One pool per group of `kv_cache` (the engine's), prefix caching off.
    ///
    /// # Errors
    /// [`crate::PagedError::InvalidConfig`] for sizes the allocator refuses (zero, too large to index).
    pub fn new(kv_cache: &KvCacheConfig) -> Result<UnscheduledPools> {
        Ok(UnscheduledPools {
            allocators: kv_cache.allocators(false, crate::EvictionPolicy::Lru, None, None)?,
            kv_cache: kv_cache.clone(),
        })
    }

    /// An empty sequence.
    pub fn new_seq(&self, max_seq_len: usize) -> UnscheduledSeq {
        UnscheduledSeq {
            tables: vec![BlockTable::new(self.kv_cache.block_size); self.allocators.len()],
            len: 0,
            max_seq_len,
            last_slots: Vec::new(),
        }
    }

    /// Reserves the slots of `tokens` at the sequence's next positions in every group (all or
    /// none) and returns the one-sequence step to execute. The caller adds `tokens.len()` to
    /// `seq.len` once it ran.
    ///
    /// # Errors
    /// [`crate::PagedError::OutOfBlocks`] when a group lacks free blocks (nothing is reserved).
    pub fn step(&mut self, seq: &mut UnscheduledSeq, tokens: &[u32]) -> Result<ModelInput> {
        let (pos0, n) = (seq.len, tokens.len());
        let end = pos0 + n;
        let groups = &self.kv_cache.groups;
        for ((alloc, table), g) in self.allocators.iter_mut().zip(&mut seq.tables).zip(groups) {
            if let Some(w) = g.sliding_window {
                alloc.free_outside_window(table, pos0, w)?;
            }
        }
        for ((alloc, table), g) in self.allocators.iter().zip(&seq.tables).zip(groups) {
            alloc.ensure_free(alloc.blocks_needed_to_append(table, n, g.keep_from(end))?)?;
        }
        let copies = (self.allocators.iter_mut().zip(&mut seq.tables).zip(groups))
            .map(|((alloc, table), g)| alloc.append_slots(table, n, g.keep_from(end)))
            .collect::<Result<_>>()?;
        let kind = if n == 1 && pos0 > 0 {
            StepKind::Decode
        } else {
            StepKind::Prefill {
                num_cached_tokens: 0,
                is_recompute: false,
            }
        };
        let step = ScheduledSeq::new(RequestId(0), tokens, pos0, kind, &seq.tables, copies);
        seq.last_slots = step
            .groups
            .first()
            .map(|g| g.slot_mapping.clone())
            .unwrap_or_default();
        let batch = ScheduledBatch {
            seqs: vec![step],
            ..ScheduledBatch::default()
        };
        Ok(batch.model_input())
    }

    /// Forgets positions `len..` of `seq` in every group, or in none: `false` when a group
    /// cannot ([`BlockAllocator::can_truncate`]: a sliding window already freed a block the
    /// query at `len` reads), and the caller starts the sequence again.
    pub fn truncate(&mut self, seq: &mut UnscheduledSeq, len: usize) -> bool {
        let groups = &self.kv_cache.groups;
        let possible = (self.allocators.iter().zip(&seq.tables).zip(groups))
            .all(|((alloc, table), g)| alloc.can_truncate(table, len, g.sliding_window));
        if !possible || len > seq.len {
            return false;
        }
        for ((alloc, table), g) in self.allocators.iter_mut().zip(&mut seq.tables).zip(groups) {
            // Checked above, and a table built by these pools belongs to its allocator.
            let _ = alloc.truncate(table, len, g.sliding_window);
        }
        seq.len = len;
        true
    }

    /// Returns every block of `seq` to the pools.
    pub fn free(&mut self, seq: &mut UnscheduledSeq) {
        for (alloc, table) in self.allocators.iter_mut().zip(&mut seq.tables) {
            // A table built by these pools always belongs to its allocator.
            let _ = alloc.free(table);
        }
    }

    /// The pools' shape, which the engine's pool has and its scheduler takes.
    pub fn kv_cache(&self) -> &KvCacheConfig {
        &self.kv_cache
    }

    /// Blocks in use in group `g`.
    pub fn used_blocks(&self, g: usize) -> usize {
        self.allocators
            .get(g)
            .map_or(0, BlockAllocator::num_used_blocks)
    }
}

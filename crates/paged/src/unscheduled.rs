//! Sequences driven one at a time through the `Engine` API, without the scheduler (`kvlab
//! generate`, verify's solo runs): a [`KvCacheManager`] with prefix caching off, and per
//! sequence a [`BlockTable`] per group. Each step reserves slots through the same manager calls
//! as the [`crate::Scheduler`]'s decodes — `trim_windows` (free the sliding-window blocks the
//! step's first query cannot reach), then `allocate_slots` — and describes itself as a
//! one-sequence [`ModelInput`], which a paged engine runs like any scheduled step. The CPU and
//! CUDA paged engines both use it, so a new paged engine implements only its step.

use crate::{
    BlockAllocator, BlockTable, KvCacheConfig, KvCacheManager, ModelInput, RequestId, Result,
    ScheduledBatch, ScheduledSeq, StepKind,
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
#[derive(Debug)]
pub struct UnscheduledPools {
    /// One pool per KV cache group of the engine's shape, prefix caching off.
    kv: KvCacheManager,
}

impl UnscheduledPools {
    /// One pool per group of `kv_cache` (the engine's), prefix caching off.
    ///
    /// # Errors
    /// [`crate::PagedError::InvalidConfig`] for sizes the allocator refuses (zero, too large to index).
    pub fn new(kv_cache: &KvCacheConfig) -> Result<UnscheduledPools> {
        Ok(UnscheduledPools {
            kv: KvCacheManager::without_prefix_caching(kv_cache)?,
        })
    }

    /// An empty sequence.
    pub fn new_seq(&self, max_seq_len: usize) -> UnscheduledSeq {
        UnscheduledSeq {
            tables: self.kv.empty_tables(0),
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
        self.kv.trim_windows(&mut seq.tables, pos0)?;
        let copies = self.kv.allocate_slots(&mut seq.tables, n, end)?;
        let kind = if n == 1 && pos0 > 0 {
            StepKind::Decode
        } else {
            StepKind::Prefill {
                num_cached_tokens: 0,
                is_recompute: false,
            }
        };
        let step = ScheduledSeq::new(
            RequestId(0),
            (tokens, pos0),
            (kind, true),
            &seq.tables,
            copies,
        );
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
        if len > seq.len || !self.kv.truncate(&mut seq.tables, len) {
            return false;
        }
        seq.len = len;
        true
    }

    /// Returns every block of `seq` to the pools.
    pub fn free(&mut self, seq: &mut UnscheduledSeq) {
        // A table built by these pools always belongs to its allocator.
        let _ = self.kv.free(&mut seq.tables, false);
    }

    /// The pools' shape, which the engine's pool has and its scheduler takes.
    pub fn kv_cache(&self) -> &KvCacheConfig {
        self.kv.kv_cache()
    }

    /// Blocks in use in group `g`.
    pub fn used_blocks(&self, g: usize) -> usize {
        (self.kv.allocators().get(g)).map_or(0, BlockAllocator::num_used_blocks)
    }
}

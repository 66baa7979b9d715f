//! Counters and gauges named like vLLM's, for logs, JSON results and the teaching chapters.

use serde::Serialize;

use crate::{BlockAllocator, RemoteTierStats, TierDrops, TierStoreStats};

/// A snapshot of the KV cache and scheduler. Block counts add up over all KV cache groups.
///
/// Prefix-cache counters are in **tokens**, as vLLM counts them: each admission (including a
/// readmission after preemption) queries `len` tokens and hits the cached prefix length.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct Metrics {
    /// Blocks in all pools.
    pub num_blocks_total: usize,
    /// Blocks referenced by some block table.
    pub num_blocks_used: usize,
    /// Blocks that can be handed out: never-cached free blocks plus evictable cached ones.
    pub num_blocks_free: usize,
    /// Free blocks that still hold cached prefix content (a subset of `num_blocks_free`).
    pub num_blocks_cached_free: usize,
    /// `num_blocks_used / num_blocks_total`, a fraction in `[0, 1]` (vLLM's name, vLLM's unit:
    /// despite "perc", 1.0 means full).
    pub kv_cache_usage_perc: f64,
    /// Prompt tokens looked up in the prefix cache.
    pub prefix_cache_queries: u64,
    /// Prompt tokens served by the prefix cache (their prefill was skipped).
    pub prefix_cache_hits: u64,
    /// The same tokens by where they came from: blocks in the pool, or restored from a tier
    /// (the hit rate per tier is each over `prefix_cache_queries`).
    pub prefix_cache_hits_by_tier: HitsByTier,
    /// Cached blocks whose content was dropped to make room.
    pub num_evictions: u64,
    /// Sequences preempted by recompute.
    pub num_preemptions: u64,
    /// Tokens prefilled again after preemption that had been computed before.
    pub num_recomputed_tokens: u64,
    /// Copy-on-write block copies handed to the engine.
    pub num_cow_copies: u64,
    /// Hash collisions detected and refused by the prefix cache.
    pub num_hash_collisions: u64,
    /// Computed blocks replaced by an identical cached block.
    pub num_dedup_blocks: u64,
    /// Sequences in the running queue.
    pub num_running: usize,
    /// Sequences in the waiting queue.
    pub num_waiting: usize,
    /// Non-empty steps scheduled so far.
    pub num_steps: u64,
    /// Evicted cached blocks whose bytes went down a tier instead of away ([`crate::tier`]).
    pub num_spills: u64,
    /// Of those, blocks of paused sessions offloaded on purpose, not by eviction
    /// (`TierConfig::offload_paused`).
    pub num_offloaded_blocks: u64,
    /// Prefix-cache levels restored from a tier into a fresh block (their prefill skipped).
    pub num_restores: u64,
    /// Levels the tiers let go, by why (full, expired, computed again, lost).
    pub tier_drops: TierDrops,
    /// Levels the tiers hold now.
    pub num_tiered_blocks: usize,
    /// Restorable levels recomputed instead because the restore cost model said so, counted
    /// once per admission.
    pub num_restores_declined: u64,
    /// Bytes per tier now and moved so far (zeros without tiers).
    pub tier_store: TierStoreStats,
    /// What the remote tier looked up, found, refused and wrote (zeros without one).
    pub remote_tier: RemoteTierStats,
    /// Draft tokens checked by decode steps (speculative decoding; vLLM's
    /// `spec_decode_num_draft_tokens`).
    pub spec_decode_num_draft_tokens: u64,
    /// Of those, the ones the model agreed with and kept (`spec_decode_num_accepted_tokens`).
    pub spec_decode_num_accepted_tokens: u64,
    /// Decode steps that checked at least one draft token (`spec_decode_num_drafts`).
    pub spec_decode_num_drafts: u64,
}

/// Prefix-cache hit tokens by where their KV came from: a level counts for the lowest tier any
/// KV cache group restored it from (disk, then host memory), else for the pool.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize)]
pub struct HitsByTier {
    /// Served by blocks in the pool (held or evictable).
    pub pool: u64,
    /// Restored from host memory.
    pub host: u64,
    /// Restored from files.
    pub disk: u64,
    /// Fetched from the remote tier (another process computed them) and restored.
    pub remote: u64,
}

impl std::ops::AddAssign for HitsByTier {
    fn add_assign(&mut self, other: HitsByTier) {
        self.pool += other.pool;
        self.host += other.host;
        self.disk += other.disk;
        self.remote += other.remote;
    }
}

impl Metrics {
    /// Block gauges and allocator counters of some pools; scheduler counters left at 0.
    pub fn of_pools(pools: &[BlockAllocator]) -> Self {
        let total: usize = pools.iter().map(BlockAllocator::num_blocks).sum();
        let used: usize = pools.iter().map(BlockAllocator::num_used_blocks).sum();
        let stat = |f: fn(&BlockAllocator) -> u64| pools.iter().map(f).sum::<u64>();
        Self {
            num_blocks_total: total,
            num_blocks_used: used,
            num_blocks_free: pools.iter().map(BlockAllocator::num_free_blocks).sum(),
            num_blocks_cached_free: pools.iter().map(BlockAllocator::num_evictable_blocks).sum(),
            kv_cache_usage_perc: if total == 0 {
                0.0
            } else {
                used as f64 / total as f64
            },
            prefix_cache_queries: 0,
            prefix_cache_hits: 0,
            prefix_cache_hits_by_tier: HitsByTier::default(),
            num_evictions: stat(|a| a.stats().num_evictions),
            num_preemptions: 0,
            num_recomputed_tokens: 0,
            num_cow_copies: stat(|a| a.stats().num_cow_copies),
            num_hash_collisions: stat(|a| a.stats().num_hash_collisions),
            num_dedup_blocks: stat(|a| a.stats().num_dedup_blocks),
            num_running: 0,
            num_waiting: 0,
            num_steps: 0,
            num_spills: stat(|a| a.tier_stats().spills),
            num_offloaded_blocks: stat(|a| a.stats().num_offloaded),
            num_restores: stat(|a| a.tier_stats().restores),
            tier_drops: pools
                .iter()
                .fold(TierDrops::default(), |d, a| d + a.tier_stats().drops),
            num_tiered_blocks: pools.iter().map(BlockAllocator::num_tiered_blocks).sum(),
            num_restores_declined: 0,
            tier_store: TierStoreStats::default(),
            remote_tier: RemoteTierStats::default(),
            spec_decode_num_draft_tokens: 0,
            spec_decode_num_accepted_tokens: 0,
            spec_decode_num_drafts: 0,
        }
    }

    /// Draft tokens kept over draft tokens checked (vLLM's draft acceptance rate); NaN before
    /// any draft.
    pub fn spec_decode_acceptance_rate(&self) -> f64 {
        self.spec_decode_num_accepted_tokens as f64 / self.spec_decode_num_draft_tokens as f64
    }

    /// `prefix_cache_hits / prefix_cache_queries` (0 before any query).
    pub fn prefix_cache_hit_rate(&self) -> f64 {
        if self.prefix_cache_queries == 0 {
            0.0
        } else {
            self.prefix_cache_hits as f64 / self.prefix_cache_queries as f64
        }
    }
}

/// Totals the scheduler counts itself (the pools count the rest).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub(crate) struct Counters {
    pub(crate) prefix_cache_queries: u64,
    pub(crate) prefix_cache_hits: u64,
    /// Of the hits, tokens served from the pool, restored from host memory, from files.
    pub(crate) hits_by_tier: HitsByTier,
    pub(crate) num_preemptions: u64,
    pub(crate) num_recomputed_tokens: u64,
    pub(crate) num_steps: u64,
    pub(crate) num_restores_declined: u64,
    pub(crate) spec_decode_num_draft_tokens: u64,
    pub(crate) spec_decode_num_accepted_tokens: u64,
    pub(crate) spec_decode_num_drafts: u64,
}

impl Counters {
    /// The metrics: these counters, the queue lengths and the pools' and tiers' half `kv`.
    pub(crate) fn metrics(&self, num_running: usize, num_waiting: usize, kv: Metrics) -> Metrics {
        Metrics {
            prefix_cache_queries: self.prefix_cache_queries,
            prefix_cache_hits: self.prefix_cache_hits,
            prefix_cache_hits_by_tier: self.hits_by_tier,
            num_preemptions: self.num_preemptions,
            num_recomputed_tokens: self.num_recomputed_tokens,
            num_running,
            num_waiting,
            num_steps: self.num_steps,
            num_restores_declined: self.num_restores_declined,
            spec_decode_num_draft_tokens: self.spec_decode_num_draft_tokens,
            spec_decode_num_accepted_tokens: self.spec_decode_num_accepted_tokens,
            spec_decode_num_drafts: self.spec_decode_num_drafts,
            ..kv
        }
    }
}

//! [`KvCacheManager`]: every block a request holds, in every KV cache group — vLLM v1's
//! `KVCacheManager`, the seam between the scheduler (queues, the token budget, preemption) and
//! the pools. The scheduler asks it three things, with vLLM's verbs:
//!
//! * [`KvCacheManager::get_computed_blocks`]: the longest prefix-cache hit a prompt can take
//!   (every group must serve it; `hit.rs`), restores from the tiers weighed and checked;
//! * [`KvCacheManager::allocate_slots`] / [`KvCacheManager::allocate_prompt_slots`]: slots for a
//!   step's new tokens (copy-on-write copies returned), or `OutOfBlocks` when the pools cannot
//!   take them;
//! * [`KvCacheManager::free`]: a request's blocks back to the pools (or, for a paused session,
//!   down to the tiers at the next step).
//!
//! Besides: sliding-window groups drop the blocks their next query cannot reach
//! ([`KvCacheManager::trim_windows`]), full blocks are registered for reuse, and the tiers below
//! the pools are moved with the engine (`tiers.rs`). A request's block tables, and through them
//! its chain of block hashes, live in its [`crate::Sequence`]; every method here takes them.

mod hit;
mod remote;
mod session;
mod tiers;

pub use hit::{ComputedBlocks, PromptSlots};
pub use tiers::TierMoveError;

use crate::tier::remote::Publish;
use crate::{
    BlockAllocator, BlockCopy, BlockId, BlockTable, EvictionPolicy, HashFn, KvCacheConfig,
    KvTierStore, Metrics, RemoteTier, Result, SchedulerConfig, Tenant, TierConfig, TierOp,
};

/// The pools of every KV cache group, their prefix caches and the tiers below them.
#[derive(Debug)]
pub struct KvCacheManager {
    pub(crate) kv_cache: KvCacheConfig,
    pub(crate) enable_prefix_caching: bool,
    pub(crate) tier_config: Option<TierConfig>,
    /// (num_groups,) one pool per KV cache group.
    pub(crate) allocators: Vec<BlockAllocator>,
    /// The bytes of the blocks the tiers below the pools hold (`None`: no tiers).
    pub(crate) tiers: Option<KvTierStore>,
    /// The tier moves of the step last scheduled, until `move_tier_blocks` makes them.
    pub(crate) pending_tier_ops: Vec<TierOp>,
    /// (group, blocks in logical order) of paused sessions that finished since the last step,
    /// offloaded to the tiers when the next step is built (`TierConfig::offload_paused`).
    pub(crate) paused_blocks: Vec<(usize, Vec<BlockId>)>,
    /// The tier in Redis below the others, shared with other processes (`None`: none).
    pub(crate) remote: Option<RemoteTier>,
    /// Blocks computed for the first time since the last step was built, to write to the
    /// remote tier (with what names them there).
    pub(crate) unwritten: Vec<(Publish, BlockId)>,
    /// The same, taken into the step last scheduled: its moves read and write them.
    pub(crate) pending_writes: Vec<(Publish, BlockId)>,
}

impl KvCacheManager {
    /// All blocks free, pools and tiers as `config` says.
    ///
    /// # Errors
    /// [`crate::PagedError::InvalidConfig`] from the pool sizes; [`crate::PagedError::Tier`] if
    /// the disk tier's directory cannot be created or written.
    pub fn new(config: &SchedulerConfig) -> Result<Self> {
        let mut allocators = config.kv_cache.allocators(
            config.enable_prefix_caching,
            config.eviction_policy,
            config.tenant_quota,
            config.tiers.as_ref().map(|t| (t.capacity(), t.ttl_steps)),
        )?;
        let tiers = match &config.tiers {
            Some(t) => Some(KvTierStore::new(t, allocators.len())?),
            None => None,
        };
        let remote = match config.tiers.as_ref().and_then(|t| t.remote.as_ref()) {
            Some(r) => Some(RemoteTier::new(r, allocators.len())?),
            None => None,
        };
        for alloc in &mut allocators {
            alloc.list_newly_cached(remote.is_some());
        }
        Ok(Self {
            kv_cache: config.kv_cache.clone(),
            enable_prefix_caching: config.enable_prefix_caching,
            tier_config: config.tiers.clone(),
            allocators,
            tiers,
            pending_tier_ops: Vec::new(),
            paused_blocks: Vec::new(),
            remote,
            unwritten: Vec::new(),
            pending_writes: Vec::new(),
        })
    }

    /// Pools of the shape `kv_cache` with prefix caching off and no tiers: the blocks of
    /// sequences driven one at a time, without the scheduler ([`crate::UnscheduledPools`]).
    ///
    /// # Errors
    /// [`crate::PagedError::InvalidConfig`] for sizes the allocator refuses (zero, too large to
    /// index).
    pub fn without_prefix_caching(kv_cache: &KvCacheConfig) -> Result<Self> {
        Ok(Self {
            kv_cache: kv_cache.clone(),
            enable_prefix_caching: false,
            tier_config: None,
            allocators: kv_cache.allocators(false, EvictionPolicy::Lru, None, None)?,
            tiers: None,
            pending_tier_ops: Vec::new(),
            paused_blocks: Vec::new(),
            remote: None,
            unwritten: Vec::new(),
            pending_writes: Vec::new(),
        })
    }

    /// The pools' shape.
    pub fn kv_cache(&self) -> &KvCacheConfig {
        &self.kv_cache
    }

    /// Replaces the block hash function of every pool (tests force collisions with it).
    pub fn with_hash_fn(mut self, hash_fn: HashFn) -> Self {
        self.allocators = self
            .allocators
            .into_iter()
            .map(|a| a.with_hash_fn(hash_fn))
            .collect();
        self
    }

    /// One pool per KV cache group, in group order.
    pub fn allocators(&self) -> &[BlockAllocator] {
        &self.allocators
    }

    /// One empty block table per group for a request of `tenant`.
    pub fn empty_tables(&self, tenant: Tenant) -> Vec<BlockTable> {
        let table = BlockTable::new(self.kv_cache.block_size).with_tenant(tenant);
        vec![table; self.allocators.len()]
    }

    /// Opens step `step`: moves the last step never made are forgotten, and the pools age
    /// their cached blocks (eviction by recency or time to live).
    pub(crate) fn begin_step(&mut self, step: u64) {
        self.forget_unmoved();
        // Blocks the last step would have written to the remote tier: it never ran its moves,
        // so they may have been written over since.
        self.pending_writes.clear();
        for alloc in &mut self.allocators {
            alloc.tick(step);
        }
    }

    /// Closes a step being built: paused sessions go down once the step's admissions have taken
    /// what they hit (a block one of them holds again stays), and the pools' tier moves are
    /// listed for `move_tier_blocks`. An empty step runs no moves, so paused blocks wait for
    /// one that does.
    pub(crate) fn end_step(&mut self, step_is_empty: bool) {
        if !step_is_empty {
            for (g, blocks) in std::mem::take(&mut self.paused_blocks) {
                self.allocators[g].offload(&blocks);
            }
            self.pending_writes.append(&mut self.unwritten);
        }
        self.collect_tier_ops();
    }

    /// Frees the blocks of the sliding-window groups of `tables` that the next query (at
    /// position `num_computed_tokens`) cannot reach.
    ///
    /// # Errors
    /// [`crate::PagedError`] if a table holds a block its pool does not (a bug).
    pub fn trim_windows(
        &mut self,
        tables: &mut [BlockTable],
        num_computed_tokens: usize,
    ) -> Result<()> {
        let groups = self
            .allocators
            .iter_mut()
            .zip(tables)
            .zip(&self.kv_cache.groups);
        for ((alloc, table), group) in groups {
            if let Some(window) = group.sliding_window {
                alloc.free_outside_window(table, num_computed_tokens, window)?;
            }
        }
        Ok(())
    }

    /// Slots for the `num_new_tokens` last of `len` tokens in every group. Returns each group's
    /// copy-on-write copies, which the engine makes before it writes.
    ///
    /// # Errors
    /// [`crate::PagedError::OutOfBlocks`] (first short group's need and free blocks; nothing
    /// changed) when a pool cannot take the blocks the tokens need; other errors if a table
    /// holds a block its pool does not (a bug).
    pub fn allocate_slots(
        &mut self,
        tables: &mut [BlockTable],
        num_new_tokens: usize,
        len: usize,
    ) -> Result<Vec<Vec<BlockCopy>>> {
        let groups = &self.kv_cache.groups;
        for ((alloc, table), g) in self.allocators.iter().zip(&*tables).zip(groups) {
            alloc.ensure_free(alloc.blocks_needed_to_append(
                table,
                num_new_tokens,
                g.keep_from(len),
            )?)?;
        }
        let tables = self.allocators.iter_mut().zip(tables);
        tables
            .zip(groups)
            .map(|((alloc, table), g)| alloc.append_slots(table, num_new_tokens, g.keep_from(len)))
            .collect()
    }

    /// Forgets positions `len..` of `tables` in every group, or in none: `false` when a group
    /// cannot ([`BlockAllocator::can_truncate`]: a sliding window already freed a block the
    /// query at `len` reads).
    pub fn truncate(&mut self, tables: &mut [BlockTable], len: usize) -> bool {
        let groups = &self.kv_cache.groups;
        let possible = (self.allocators.iter().zip(&*tables).zip(groups))
            .all(|((alloc, table), g)| alloc.can_truncate(table, len, g.sliding_window));
        if possible {
            for ((alloc, table), g) in self.allocators.iter_mut().zip(tables).zip(groups) {
                // Checked above, and a table built by these pools belongs to its allocator.
                let _ = alloc.truncate(table, len, g.sliding_window);
            }
        }
        possible
    }

    /// Registers the full blocks of `tables` among the first `num_computed_tokens` of `tokens`
    /// in the prefix cache, so later prompts can hit them.
    ///
    /// # Errors
    /// [`crate::PagedError`] if a table holds a block its pool does not (a bug).
    pub fn cache_blocks(
        &mut self,
        tables: &mut [BlockTable],
        tokens: &[u32],
        num_computed_tokens: usize,
    ) -> Result<()> {
        for (g, table) in tables.iter_mut().enumerate() {
            self.allocators[g].register_full_blocks(table, tokens, num_computed_tokens)?;
            self.list_remote_writes(g, table.salt, tokens);
        }
        Ok(())
    }

    /// Gives every block of `tables` back (cached ones stay evictable). With `offload` — a
    /// paused session that finished, and tiers with `offload_paused` on — the blocks nobody
    /// else holds go down to the tiers at the next step instead of waiting for eviction.
    ///
    /// # Errors
    /// [`crate::PagedError`] if a table holds a block its pool does not (a bug).
    pub fn free(&mut self, tables: &mut [BlockTable], offload: bool) -> Result<()> {
        let offload = offload && self.tier_config.as_ref().is_some_and(|t| t.offload_paused);
        for (g, (alloc, table)) in self.allocators.iter_mut().zip(tables).enumerate() {
            if offload {
                let blocks = table.blocks.iter().flatten().copied().collect();
                self.paused_blocks.push((g, blocks));
            }
            alloc.free(table)?;
        }
        Ok(())
    }

    /// Copy-on-write tables for a fork of `tables`: every block shared (ref counts + 1).
    ///
    /// # Errors
    /// [`crate::PagedError`] if a table holds a block its pool does not (a bug).
    pub fn fork(&mut self, tables: &[BlockTable]) -> Result<Vec<BlockTable>> {
        let pairs = self.allocators.iter_mut().zip(tables);
        pairs.map(|(alloc, table)| alloc.fork(table)).collect()
    }

    /// The pools' and the tiers' half of [`Metrics`] (the scheduler adds its counters).
    pub fn metrics(&self) -> Metrics {
        Metrics {
            tier_store: self
                .tiers
                .as_ref()
                .map_or_else(Default::default, KvTierStore::stats),
            remote_tier: self
                .remote
                .as_ref()
                .map_or_else(Default::default, RemoteTier::stats),
            ..Metrics::of_pools(&self.allocators)
        }
    }
}

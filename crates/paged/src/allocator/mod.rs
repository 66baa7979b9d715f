//! [`BlockAllocator`]: one pool of `num_blocks` KV blocks of `block_size` token slots, a ref
//! count per block (the number of block tables holding it: forks and prefix-cache hits share
//! blocks), a free list and the prefix cache. Block tables are passed in explicitly: nano-vllm's
//! block manager without its globals. One idea per file:
//!
//! * here: the pool (hand blocks out, take and drop references), and freeing and forking a table;
//! * `append.rs`: reserving a step's slots, with copy-on-write for shared blocks;
//! * `prefix.rs`: prefix caching on a table (match, adopt, register full blocks);
//! * `window.rs`: sliding-window layers (free the blocks no future query reads).
//!
//! A sequence takes a block only when its previous one is full, so at most one partly filled
//! block per sequence is wasted (vLLM's PagedAttention). Queries (`can_allocate`, `can_append`,
//! `blocks_needed_to_append`, `match_prefix`) never mutate; mutations (`allocate`,
//! `append_slot(s)`, `fork`, `free`, `adopt_prefix`) check first and either succeed completely or
//! change nothing.

mod append;
mod prefix;
mod remote;
mod window;

pub(crate) use prefix::salted;

pub use append::BlockCopy;
pub use window::{max_window_blocks, window_start};

use std::collections::VecDeque;

use serde::Serialize;

use crate::prefix_cache::PrefixCache;
use crate::{BlockId, BlockTable, EvictionPolicy, HashFn, PagedError, Result, fnv1a_block_hash};

/// The block size vLLM uses by default on GPUs.
pub const DEFAULT_BLOCK_SIZE: usize = 16;

/// Running totals of what the allocator did.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize)]
pub struct AllocatorStats {
    /// Cached blocks whose content was dropped to make room.
    pub num_evictions: u64,
    /// Copy-on-write copies handed to the engine.
    pub num_cow_copies: u64,
    /// Hash collisions detected (same hash, different tokens or parent) and refused.
    pub num_hash_collisions: u64,
    /// Freshly computed full blocks replaced by an identical cached block (memory deduplicated).
    pub num_dedup_blocks: u64,
    /// Cached blocks of paused sessions moved to the tiers on purpose ([`BlockAllocator::offload`]);
    /// each is also a spill.
    pub num_offloaded: u64,
}

/// A pool of `num_blocks` KV blocks of `block_size` tokens with ref counts and a prefix cache.
#[derive(Debug, Clone)]
pub struct BlockAllocator {
    pub(crate) block_size: usize,
    /// (num_blocks,) how many block tables hold each block.
    pub(crate) ref_counts: Vec<u32>,
    /// Unreferenced blocks without cached content, handed out front first.
    pub(crate) free_list: VecDeque<BlockId>,
    pub(crate) cache: PrefixCache,
    pub(crate) prefix_caching: bool,
    pub(crate) stats: AllocatorStats,
    /// (level, block) of every content `register_full_blocks` stored in a block for the first
    /// time since the last take, for a remote tier to write (`None`: nobody asks).
    pub(crate) newly_cached: Option<Vec<(usize, BlockId)>>,
}

impl BlockAllocator {
    /// A pool of `num_blocks` free blocks of `block_size` tokens, prefix caching on, FNV-1a hash.
    ///
    /// # Errors
    /// [`PagedError::InvalidConfig`] if either size is 0, or if block ids would not fit a
    /// kernel's `i32` block table or slots its `i64` slot mapping.
    pub fn new(num_blocks: usize, block_size: usize) -> Result<Self> {
        if num_blocks == 0 || block_size == 0 {
            return Err(PagedError::InvalidConfig(format!(
                "num_blocks ({num_blocks}) and block_size ({block_size}) must both be at least 1"
            )));
        }
        let too_big = i32::try_from(num_blocks).is_err()
            || num_blocks
                .checked_mul(block_size)
                .is_none_or(|s| i64::try_from(s).is_err());
        if too_big {
            return Err(PagedError::InvalidConfig(format!(
                "{num_blocks} blocks of {block_size} tokens overflow i32 block ids or i64 slots; \
                 use fewer blocks"
            )));
        }
        Ok(Self {
            block_size,
            ref_counts: vec![0; num_blocks],
            free_list: (0..num_blocks as BlockId).collect(),
            cache: PrefixCache::new(num_blocks, fnv1a_block_hash, EvictionPolicy::Lru),
            prefix_caching: true,
            stats: AllocatorStats::default(),
            newly_cached: None,
        })
    }

    /// Turns prefix caching on or off (off: full blocks are never registered or matched).
    pub fn with_prefix_caching(mut self, enabled: bool) -> Self {
        self.prefix_caching = enabled;
        self
    }

    /// Chooses the eviction policy of the prefix cache (LRU unless set). Call it on a fresh
    /// allocator: it empties the cache.
    pub fn with_eviction_policy(mut self, policy: EvictionPolicy) -> Self {
        self.cache = self.cache.with_eviction_policy(policy);
        self
    }

    /// Gives every tenant a quota of `quota` cached blocks (`None`: no quotas, the default):
    /// when a block must be evicted and some tenant holds more cached blocks than its quota,
    /// the block comes from the tenant furthest over it, so one tenant's demand cannot evict a
    /// tenant within its quota. Call it on a fresh allocator.
    pub fn with_tenant_quota(mut self, quota: Option<usize>) -> Self {
        self.cache = self.cache.with_tenant_quota(quota);
        self
    }

    /// Spills evicted cached blocks to tiers below the pool that hold `capacity` blocks of this
    /// pool, each for at most `ttl_steps` scheduler steps (`None`: evicted content is dropped,
    /// the default); see [`crate::tier`]. Call it on a fresh allocator.
    pub fn with_tier(mut self, tier: Option<(usize, Option<u64>)>) -> Self {
        self.cache = self.cache.with_tier(tier);
        self
    }

    /// Tells the pool the scheduler's step (spills are stamped with it) and drops the tiered
    /// levels whose time to live is over.
    pub(crate) fn tick(&mut self, step: u64) {
        self.cache.tick(step);
    }

    /// Spills, restores and drops so far (zeros without tiers).
    pub fn tier_stats(&self) -> crate::TierStats {
        self.cache.tier_counts()
    }

    /// Prefix-cache levels whose bytes the tiers below hold now.
    pub fn num_tiered_blocks(&self) -> usize {
        self.cache.num_tiered()
    }

    /// The tier moves decided since the last call, in order.
    pub(crate) fn take_tier_ops(&mut self) -> Vec<crate::tier::index::IndexOp> {
        self.cache.take_tier_ops()
    }

    /// Whether a spill of `entry` was decided and not yet taken by [`Self::take_tier_ops`].
    pub(crate) fn spill_pending(&self, entry: u64) -> bool {
        self.cache.spill_pending(entry)
    }

    /// The tiers lost `entry`'s bytes: its level becomes a plain ghost (recomputed on a hit).
    pub(crate) fn forget_tiered(&mut self, entry: u64) {
        self.cache.forget_tiered(entry, true);
    }

    /// The per-tenant quota of cached blocks, if any.
    pub fn tenant_quota(&self) -> Option<usize> {
        self.cache.tenant_quota()
    }

    /// Cached blocks (held or evictable) whose content `tenant`'s sequences computed.
    pub fn num_cached_blocks_of(&self, tenant: crate::Tenant) -> usize {
        self.cache.num_cached_of(tenant)
    }

    /// The prefix cache's eviction policy.
    pub fn eviction_policy(&self) -> EvictionPolicy {
        self.cache.eviction_policy()
    }

    /// Replaces the block hash function; meant for tests that force collisions.
    pub fn with_hash_fn(mut self, hash_fn: HashFn) -> Self {
        self.cache.hash_fn = hash_fn;
        self
    }

    /// Tokens per block.
    pub fn block_size(&self) -> usize {
        self.block_size
    }

    /// Blocks in the pool.
    pub fn num_blocks(&self) -> usize {
        self.ref_counts.len()
    }

    /// Blocks that can be handed out now: never-cached free blocks plus evictable cached ones.
    pub fn num_free_blocks(&self) -> usize {
        self.free_list.len() + self.cache.num_evictable()
    }

    /// Unreferenced blocks that still hold cached content (a subset of the free blocks).
    pub fn num_evictable_blocks(&self) -> usize {
        self.cache.num_evictable()
    }

    /// Blocks referenced by at least one block table.
    pub fn num_used_blocks(&self) -> usize {
        self.num_blocks() - self.num_free_blocks()
    }

    /// Blocks holding registered prefix-cache content, referenced or not.
    pub fn num_cached_blocks(&self) -> usize {
        self.cache.num_cached()
    }

    /// Number of block tables holding `block` (0 for free or out-of-range blocks).
    pub fn ref_count(&self, block: BlockId) -> usize {
        self.ref_counts
            .get(block as usize)
            .map_or(0, |&r| r as usize)
    }

    /// Whether `block` is unreferenced but keeps cached content (an LRU eviction candidate).
    pub fn is_evictable(&self, block: BlockId) -> bool {
        self.cache.is_evictable(block)
    }

    /// Whether full blocks are registered and matched.
    pub fn prefix_caching_enabled(&self) -> bool {
        self.prefix_caching
    }

    /// Totals of evictions, copies, collisions and deduplications so far.
    pub fn stats(&self) -> AllocatorStats {
        self.stats
    }

    /// Whether `n_blocks` fresh blocks can be handed out now.
    pub fn can_allocate(&self, n_blocks: usize) -> bool {
        n_blocks <= self.num_free_blocks()
    }

    /// Hands out `n_blocks` fresh blocks with ref count 1, taking never-cached blocks first and
    /// evicting least recently released cached blocks only when those run out. The caller owns
    /// the references and returns them with [`Self::free_block`].
    ///
    /// # Errors
    /// [`PagedError::OutOfBlocks`] (nothing is taken) if fewer than `n_blocks` are free.
    pub fn allocate(&mut self, n_blocks: usize) -> Result<Vec<BlockId>> {
        self.ensure_free(n_blocks)?;
        (0..n_blocks).map(|_| self.alloc_one()).collect()
    }

    /// Drops one reference on `block`; at 0 it becomes evictable (if cached) or free.
    ///
    /// # Errors
    /// [`PagedError::InvalidBlock`] if `block` is out of range or not referenced.
    pub fn free_block(&mut self, block: BlockId) -> Result<()> {
        self.check_held(block)?;
        self.release(block);
        Ok(())
    }

    /// Drops every reference `table` holds, last block first (so its tail is evicted before its
    /// shared head), and its hold on the prefix-cache entry its registration ended at, and leaves
    /// the table empty (its tenant and salt kept). (A table dropped without `free` keeps those references forever.)
    ///
    /// # Errors
    /// [`PagedError::BlockSizeMismatch`] or [`PagedError::InvalidBlock`] (nothing is freed) if
    /// the table does not belong to this allocator.
    pub fn free(&mut self, table: &mut BlockTable) -> Result<()> {
        self.check_table(table)?;
        for block in table.blocks.iter().rev().flatten() {
            self.release(*block);
        }
        if let Some((_, entry)) = table.chain.last {
            self.cache.unpin(entry);
        }
        // Empty, but still the same request's: its tenant and salt hold when it is readmitted.
        *table = BlockTable::new(self.block_size)
            .with_tenant(table.tenant)
            .with_salt(table.salt);
        Ok(())
    }

    /// Whether [`Self::truncate`] can cut `table` to `len` positions: `len` is within it, the
    /// cut keeps every block the table registered in the prefix cache (those are full of
    /// computed keys other sequences may share; a speculative rollback cuts only above them),
    /// and, under a sliding window of `window` positions, every key the query at `len` reads
    /// ([`window::window_start`]`(len, window)..len`) still has its block.
    pub fn can_truncate(&self, table: &BlockTable, len: usize, window: Option<usize>) -> bool {
        if len > table.num_tokens || len < table.chain.num_blocks * self.block_size {
            return false;
        }
        let first = window.map_or(0, |w| window::window_start(len, w) / self.block_size);
        let end = len.div_ceil(self.block_size);
        table.blocks[first.min(end)..end]
            .iter()
            .all(Option::is_some)
    }

    /// Forgets positions `len..` of `table` (llama.cpp's `llama_memory_seq_rm`): the blocks
    /// wholly past `len` go back to the pool, last first, and the next slot appended is `len`'s
    /// (into the kept partial block, copied first if shared). Returns `false`, changing
    /// nothing, when [`Self::can_truncate`] says no.
    ///
    /// # Errors
    /// [`PagedError::BlockSizeMismatch`] or [`PagedError::InvalidBlock`] (nothing changes) if
    /// the table does not belong to this allocator.
    pub fn truncate(
        &mut self,
        table: &mut BlockTable,
        len: usize,
        window: Option<usize>,
    ) -> Result<bool> {
        self.check_table(table)?;
        if !self.can_truncate(table, len, window) {
            return Ok(false);
        }
        let keep = len.div_ceil(self.block_size);
        for block in table.blocks.drain(keep..).rev().flatten() {
            self.release(block);
        }
        table.num_tokens = len;
        Ok(true)
    }

    /// A child table sharing every block of `table` (each ref count + 1): a copy-on-write fork
    /// for parallel sampling or beam search. The first write into the shared partial block
    /// copies it (see [`Self::append_slots`]).
    ///
    /// # Errors
    /// [`PagedError::BlockSizeMismatch`] or [`PagedError::InvalidBlock`] (nothing changes) if
    /// the table does not belong to this allocator.
    pub fn fork(&mut self, table: &BlockTable) -> Result<BlockTable> {
        self.check_table(table)?;
        for block in table.blocks.iter().flatten() {
            self.ref_counts[*block as usize] += 1;
        }
        if let Some((_, entry)) = table.chain.last {
            self.cache.pin(entry);
        }
        Ok(table.clone())
    }

    /// Offloads a paused session: each of `blocks` (a table's, in logical order) that is
    /// cached and that nobody holds any more is evicted now, deepest first, so its bytes go to
    /// the tiers (the next step's moves read them before the block is reused) and the block is
    /// free at once. Shared blocks another sequence holds stay. Without tiers it does nothing
    /// (evicting would only drop the content). Returns the number offloaded.
    pub fn offload(&mut self, blocks: &[BlockId]) -> usize {
        if self.cache.tier_config().is_none() {
            return 0;
        }
        let mut n = 0;
        for &block in blocks.iter().rev() {
            if self.cache.evict_block(block) {
                self.free_list.push_back(block);
                n += 1;
            }
        }
        self.stats.num_offloaded += n as u64;
        n
    }

    /// Takes one block off the free list, or evicts the cached block the eviction policy picks.
    pub(crate) fn alloc_one(&mut self) -> Result<BlockId> {
        let block = match self.free_list.pop_front() {
            Some(b) => b,
            None => {
                let b = self
                    .cache
                    .evict()
                    .ok_or(PagedError::OutOfBlocks { needed: 1, free: 0 })?;
                self.stats.num_evictions += 1;
                b
            }
        };
        self.ref_counts[block as usize] = 1;
        Ok(block)
    }

    /// Takes a reference on a block that is held or evictable (a prefix hit or a deduplication).
    pub(crate) fn acquire(&mut self, block: BlockId) {
        self.cache.hit(block);
        self.ref_counts[block as usize] += 1;
    }

    /// Drops a reference on a held block (already checked).
    pub(crate) fn release(&mut self, block: BlockId) {
        let rc = &mut self.ref_counts[block as usize];
        if *rc == 0 {
            return; // Unreachable through checked paths; never underflow.
        }
        *rc -= 1;
        if *rc == 0 {
            if self.cache.is_cached(block) {
                self.cache.push_evictable(block);
            } else {
                self.free_list.push_back(block);
            }
        }
    }

    pub(crate) fn ensure_free(&self, needed: usize) -> Result<()> {
        let free = self.num_free_blocks();
        if needed > free {
            return Err(PagedError::OutOfBlocks { needed, free });
        }
        Ok(())
    }

    pub(crate) fn check_held(&self, block: BlockId) -> Result<()> {
        if self.ref_count(block) == 0 {
            return Err(PagedError::InvalidBlock {
                block,
                num_blocks: self.num_blocks(),
            });
        }
        Ok(())
    }

    pub(crate) fn check_block_size(&self, table: &BlockTable) -> Result<()> {
        if table.block_size() != self.block_size {
            return Err(PagedError::BlockSizeMismatch {
                table: table.block_size(),
                allocator: self.block_size,
            });
        }
        Ok(())
    }

    pub(crate) fn check_table(&self, table: &BlockTable) -> Result<()> {
        self.check_block_size(table)?;
        table
            .blocks
            .iter()
            .flatten()
            .try_for_each(|&b| self.check_held(b))
    }
}

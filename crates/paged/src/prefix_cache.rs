//! The store behind prefix caching: which physical block holds which full-block content, and
//! which unreferenced cached blocks to evict first.
//!
//! A full block, once written, never changes (later tokens go to later blocks), so its KV can be
//! shared by every sequence whose prompt starts with the same tokens. The cache maps a block's
//! chained hash ([`crate::hash`]) to an *entry* for that content, and the entry to the physical
//! block holding it.
//!
//! **Collisions are verified, never trusted.** Each entry has a unique `EntryId` (never reused),
//! its token ids and its parent's `EntryId`. A lookup at level i succeeds only if the entry under
//! the hash has the same tokens *and* its parent is the very entry matched at level i-1. By
//! induction a hit's whole prefix is identical token for token, even if the hash function were
//! constant. (Comparing the parent's *hash* would not be enough: a collision one level up would
//! pass unnoticed.)
//!
//! **Entries can outlive their blocks (ghosts).** The chain of verified entries is the identity
//! of a prefix; a block is only where one level of it is stored. When a cached block is evicted,
//! or a sliding-window table never stored a level (it was behind the window when computed), the
//! entry stays as a *ghost* (no block) for as long as something hangs from it: a child entry, or
//! a block table whose registration chain ends there (`refs`). That is what lets a
//! sliding-window group, which holds only the last `ceil(W / block_size) + 1` blocks of a
//! sequence, still prove that those blocks follow exactly this prompt's first tokens; and an
//! evicted level that is computed again re-attaches to its old entry, so the cached levels after
//! it become reachable again. A ghost that nothing hangs from is dropped at once (and its parent
//! after it, if that was the last thing holding it), so ghosts never outnumber the levels on the
//! paths to cached blocks and live tables.
//!
//! **Eviction is by policy over unreferenced blocks.** A cached block whose ref count drops to 0
//! keeps its content and entry and becomes *evictable*: still counted as free, still a possible
//! hit. The allocator evicts only when its free list of never-cached blocks is empty, and the
//! [`EvictionPolicy`] (`eviction.rs`; LRU by default, oldest release first) picks the block.
//! Sequences release their blocks last-to-first, so under LRU a sequence's tail is evicted before
//! its head, which more requests share.
//!
//! **Tenants can have quotas.** A cached block remembers the tenant whose sequence computed it.
//! With a quota of Q blocks, an eviction first takes, in the policy's order, a block of the tenant
//! holding the most cached blocks above Q; only when no tenant with an evictable block is over Q
//! does the policy choose among all of them. A tenant within its quota thus keeps its cached
//! blocks while any other is over (a noisy neighbour evicts itself first).
//!
//! **Evicted blocks can go down a tier instead of away** ([`crate::tier`]). With tiers, an
//! evicted block's entry becomes a *tiered* ghost: the tiers hold one `refs` on it, the block's
//! bytes are spilled, and a later lookup that reaches the entry can restore it into a fresh
//! block instead of recomputing it. When the tiers are full the oldest spill is dropped (its
//! ghost goes the way of any ghost); when the same content is computed again, the copy below
//! is dropped too.

use std::collections::{BTreeMap, HashMap};

use crate::eviction::EvictionQueue;
use crate::tier::TierStats;
use crate::tier::index::{IndexOp, TierIndex};
use crate::{BlockHash, BlockId, EvictionPolicy, HashFn, Tenant};

/// Identity of one cached content. Unique for the allocator's lifetime, so an entry can never be
/// confused with a later, different content that happens to reuse its hash or its block.
pub(crate) type EntryId = u64;

/// How far the prefix cache has registered a block table's leading full blocks. A table whose
/// chain ends at an entry holds one `refs` on it (see [`PrefixCache::pin`]).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub(crate) struct PrefixChain {
    /// Leading full blocks already registered (or found equal to a cached block).
    pub(crate) num_blocks: usize,
    /// Hash and entry of block `num_blocks - 1`: the parent of the next block to register.
    pub(crate) last: Option<(BlockHash, EntryId)>,
    /// A true hash collision stopped registration; later blocks stay private.
    pub(crate) broken: bool,
}

/// One cached content.
#[derive(Debug, Clone)]
struct CacheEntry {
    hash: BlockHash,
    parent: Option<EntryId>,
    /// (block_size,) the tokens whose KV the block holds, compared on every hit.
    tokens: Box<[u32]>,
    /// The block holding this content; `None` for a ghost (evicted, or never stored).
    block: Option<BlockId>,
    /// Child entries plus block tables whose chain ends here. A ghost at 0 is dropped.
    refs: u32,
    /// Prefix level: 0 for a prompt's first block, the parent's plus one otherwise.
    depth: u32,
}

/// Result of looking one block up.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Lookup {
    /// The entry for exactly these tokens after exactly this parent, and the block holding it
    /// (`None`: a ghost, the content is known but stored nowhere).
    Hit {
        block: Option<BlockId>,
        hash: BlockHash,
        entry: EntryId,
    },
    /// Nothing cached under the hash.
    Miss { hash: BlockHash },
    /// Something else is cached under the hash: a hash collision, detected.
    Collision { hash: BlockHash },
}

/// Hash → entry map, the entries, the block of each entry and the queue of evictable blocks.
#[derive(Debug, Clone)]
pub(crate) struct PrefixCache {
    pub(crate) hash_fn: HashFn,
    by_hash: HashMap<BlockHash, EntryId>,
    entries: HashMap<EntryId, CacheEntry>,
    /// (num_blocks,) the entry each cached block holds.
    block_entry: Vec<Option<EntryId>>,
    num_cached: usize,
    /// The evictable blocks, in the order the policy evicts them.
    evictable: EvictionQueue,
    next_entry: EntryId,
    /// Cached blocks each tenant may keep safe from other tenants' demand (`None`: no quotas).
    tenant_quota: Option<usize>,
    /// (num_blocks,) the tenant whose sequence filled each cached block.
    block_tenant: Vec<Tenant>,
    /// Cached blocks (held or evictable) per tenant; tenants with none are not kept.
    cached_by_tenant: BTreeMap<Tenant, usize>,
    /// Evictable blocks per tenant; tenants with none are not kept.
    evictable_by_tenant: BTreeMap<Tenant, usize>,
    /// The entries a lower tier holds (`None`: evicted blocks are dropped).
    tier: Option<TierIndex>,
}

/// counts[t] += 1.
fn count_up(counts: &mut BTreeMap<Tenant, usize>, t: Tenant) {
    *counts.entry(t).or_default() += 1;
}

/// counts[t] −= 1, forgetting a tenant that reaches 0 (so the maps hold at most one entry per
/// cached block, whatever tenants requests name).
fn count_down(counts: &mut BTreeMap<Tenant, usize>, t: Tenant) {
    if let Some(n) = counts.get_mut(&t) {
        *n -= 1;
        if *n == 0 {
            counts.remove(&t);
        }
    }
}

impl PrefixCache {
    pub(crate) fn new(num_blocks: usize, hash_fn: HashFn, policy: EvictionPolicy) -> Self {
        Self {
            hash_fn,
            by_hash: HashMap::new(),
            entries: HashMap::new(),
            block_entry: vec![None; num_blocks],
            num_cached: 0,
            evictable: EvictionQueue::new(num_blocks, policy),
            next_entry: 0,
            tenant_quota: None,
            block_tenant: vec![0; num_blocks],
            cached_by_tenant: BTreeMap::new(),
            evictable_by_tenant: BTreeMap::new(),
            tier: None,
        }
    }

    /// The same empty cache spilling evicted blocks to tiers that hold `capacity` blocks, each
    /// for at most `ttl_steps` scheduler steps (`None`: no tiers, evicted content is dropped).
    pub(crate) fn with_tier(mut self, tier: Option<(usize, Option<u64>)>) -> Self {
        self.tier = tier.map(|(capacity, ttl)| TierIndex::new(capacity, ttl));
        self
    }

    /// The tiers' capacity in blocks and time to live in steps (`None`: no tiers).
    pub(crate) fn tier_config(&self) -> Option<(usize, Option<u64>)> {
        self.tier.as_ref().map(|t| (t.capacity(), t.ttl_steps()))
    }

    /// The scheduler's step is `now`: later spills are stamped with it, and the tiered entries
    /// whose time to live is over are dropped.
    pub(crate) fn tick(&mut self, now: u64) {
        let expired = self.tier.as_mut().map_or_else(Vec::new, |t| t.tick(now));
        for entry in expired {
            self.unpin(entry);
        }
    }

    /// Whether a lower tier holds `entry`'s bytes (a ghost that can be restored).
    pub(crate) fn is_tiered(&self, entry: EntryId) -> bool {
        self.tier.as_ref().is_some_and(|t| t.contains(entry))
    }

    /// Entries the tiers hold now.
    pub(crate) fn num_tiered(&self) -> usize {
        self.tier.as_ref().map_or(0, TierIndex::len)
    }

    /// Spills, restores and drops so far.
    pub(crate) fn tier_counts(&self) -> TierStats {
        self.tier
            .as_ref()
            .map_or_else(TierStats::default, |t| t.stats)
    }

    /// The moves decided since the last call, in order.
    pub(crate) fn take_tier_ops(&mut self) -> Vec<IndexOp> {
        self.tier
            .as_mut()
            .map_or_else(Vec::new, |t| std::mem::take(&mut t.ops))
    }

    /// Whether a spill of `entry` is among the moves not yet taken.
    pub(crate) fn spill_pending(&self, entry: EntryId) -> bool {
        self.tier.as_ref().is_some_and(|t| {
            t.ops
                .iter()
                .any(|op| matches!(op, IndexOp::Spill { entry: e, .. } if *e == entry))
        })
    }

    /// Takes tiered `entry` out of the tiers ahead of [`Self::restore`], keeping the tiers' hold
    /// on it until then (so that evictions in between cannot push it out). Whether it was there.
    pub(crate) fn take_tiered(&mut self, entry: EntryId) -> bool {
        self.tier.as_mut().is_some_and(|t| t.remove(entry))
    }

    /// Entry `entry`, taken by [`Self::take_tiered`], comes back into `block` for a sequence of
    /// `tenant`: a restore move is recorded and the tiers' hold dropped.
    pub(crate) fn restore(&mut self, entry: EntryId, block: BlockId, tenant: Tenant) {
        self.attach(entry, block, tenant);
        if let Some(t) = self.tier.as_mut() {
            t.restore(entry, block);
        }
        self.unpin(entry);
    }

    /// The tiers hold `entry`'s bytes, fetched from the remote tier into the store (no spill
    /// move): it becomes a tiered ghost like a spilled one. `false` without tiers, or if
    /// `entry` is unknown, held in a block or tiered already.
    pub(crate) fn hold_fetched(&mut self, entry: EntryId) -> bool {
        let ghost = self.entries.get(&entry).is_some_and(|e| e.block.is_none());
        if !ghost || self.is_tiered(entry) {
            return false;
        }
        let Some(tier) = self.tier.as_mut() else {
            return false;
        };
        tier.withdraw_drop(entry);
        let pushed_out = tier.hold(entry);
        self.held_below(entry, pushed_out);
        true
    }

    /// The tiers now hold `entry` (spilled or fetched), having pushed out `pushed_out` to make
    /// room: their hold keeps the ghost (and so its chain) alive while they keep it, and the
    /// entries pushed out lose theirs.
    fn held_below(&mut self, entry: EntryId, pushed_out: Vec<EntryId>) {
        self.pin(entry);
        for old in pushed_out {
            self.unpin(old);
        }
    }

    /// Forgets `entry` below: its content was computed again (`lost` false), or the tiers lost
    /// its bytes (an unreadable file, a failed write: `lost` true), so the next lookup is a plain
    /// ghost hit (recompute).
    pub(crate) fn forget_tiered(&mut self, entry: EntryId, lost: bool) {
        if self.take_tiered(entry) {
            if let Some(t) = self.tier.as_mut() {
                t.drop_entry(entry, lost);
            }
            self.unpin(entry);
        }
    }

    /// The same empty cache with a per-tenant quota of cached blocks (`None`: none).
    pub(crate) fn with_tenant_quota(mut self, quota: Option<usize>) -> Self {
        self.tenant_quota = quota;
        self
    }

    /// The per-tenant quota of cached blocks, if any.
    pub(crate) fn tenant_quota(&self) -> Option<usize> {
        self.tenant_quota
    }

    /// Cached blocks (held or evictable) whose content `tenant`'s sequences computed.
    pub(crate) fn num_cached_of(&self, tenant: Tenant) -> usize {
        self.cached_by_tenant.get(&tenant).copied().unwrap_or(0)
    }

    /// The eviction policy.
    pub(crate) fn eviction_policy(&self) -> EvictionPolicy {
        self.evictable.policy()
    }

    /// An empty cache of the same size with another eviction policy (chosen before any use).
    pub(crate) fn with_eviction_policy(self, policy: EvictionPolicy) -> Self {
        Self::new(self.block_entry.len(), self.hash_fn, policy)
            .with_tenant_quota(self.tenant_quota)
            .with_tier(self.tier_config())
    }

    /// Looks up the block after `parent` (None for the first block) holding `tokens`.
    pub(crate) fn lookup(&self, parent: Option<(BlockHash, EntryId)>, tokens: &[u32]) -> Lookup {
        let hash = (self.hash_fn)(parent.map(|(h, _)| h), tokens);
        let Some(&entry) = self.by_hash.get(&hash) else {
            return Lookup::Miss { hash };
        };
        match self.entries.get(&entry) {
            Some(e) if e.parent == parent.map(|(_, id)| id) && *e.tokens == *tokens => {
                Lookup::Hit {
                    block: e.block,
                    hash,
                    entry,
                }
            }
            _ => Lookup::Collision { hash },
        }
    }

    /// Registers `tokens` after `parent`, stored in `block` (`None`: a ghost, which the caller
    /// pins or gives a child at once) by a sequence of `tenant`. The caller has seen
    /// `Lookup::Miss` for this hash and checked that the block holds no entry yet.
    pub(crate) fn insert(
        &mut self,
        block: Option<BlockId>,
        hash: BlockHash,
        parent: Option<EntryId>,
        tokens: &[u32],
        tenant: Tenant,
    ) -> EntryId {
        let id = self.next_entry;
        self.next_entry += 1;
        let mut depth = 0;
        if let Some(e) = parent.and_then(|p| self.entries.get_mut(&p)) {
            e.refs += 1;
            depth = e.depth + 1;
        }
        self.by_hash.insert(hash, id);
        self.entries.insert(
            id,
            CacheEntry {
                hash,
                parent,
                tokens: tokens.into(),
                block: None,
                refs: 0,
                depth,
            },
        );
        if let Some(b) = block {
            self.attach(id, b, tenant);
        }
        id
    }

    /// Stores ghost `entry` in `block` again (the same content was computed once more, by a
    /// sequence of `tenant`; a copy in the tiers below is dropped). The caller has seen the
    /// ghost hit and checked that the block holds no entry.
    pub(crate) fn attach(&mut self, entry: EntryId, block: BlockId, tenant: Tenant) {
        if let Some(e) = self.entries.get_mut(&entry) {
            e.block = Some(block);
            self.block_entry[block as usize] = Some(entry);
            self.num_cached += 1;
            self.block_tenant[block as usize] = tenant;
            count_up(&mut self.cached_by_tenant, tenant);
        }
        self.forget_tiered(entry, false);
    }

    /// Keeps `entry` alive: a block table's registration chain ends there.
    pub(crate) fn pin(&mut self, entry: EntryId) {
        if let Some(e) = self.entries.get_mut(&entry) {
            e.refs += 1;
        }
    }

    /// Undoes one [`Self::pin`]; a ghost left with nothing hanging from it is dropped.
    pub(crate) fn unpin(&mut self, entry: EntryId) {
        if let Some(e) = self.entries.get_mut(&entry) {
            e.refs = e.refs.saturating_sub(1);
        }
        self.drop_unused_ghosts(entry);
    }

    /// Drops `entry` if it is a ghost nothing hangs from, then its parent on the same terms.
    fn drop_unused_ghosts(&mut self, mut entry: EntryId) {
        while let Some(e) = self.entries.get(&entry) {
            if e.block.is_some() || e.refs > 0 {
                return;
            }
            let (hash, parent) = (e.hash, e.parent);
            self.entries.remove(&entry);
            self.by_hash.remove(&hash);
            let Some(p) = parent else { return };
            if let Some(pe) = self.entries.get_mut(&p) {
                pe.refs = pe.refs.saturating_sub(1);
            }
            entry = p;
        }
    }

    /// Whether `entry` is still known (held in a block or a ghost).
    pub(crate) fn contains(&self, entry: EntryId) -> bool {
        self.entries.contains_key(&entry)
    }

    /// The entry a cached block holds.
    pub(crate) fn entry_id(&self, block: BlockId) -> Option<EntryId> {
        self.block_entry.get(block as usize).copied().flatten()
    }

    /// Whether `block` holds registered content.
    pub(crate) fn is_cached(&self, block: BlockId) -> bool {
        self.entry_id(block).is_some()
    }

    /// Whether `block` is cached, unreferenced and waiting to be evicted.
    pub(crate) fn is_evictable(&self, block: BlockId) -> bool {
        self.evictable.contains(block)
    }

    /// Number of evictable blocks.
    pub(crate) fn num_evictable(&self) -> usize {
        self.evictable.len()
    }

    /// Number of blocks holding registered content (referenced or evictable).
    pub(crate) fn num_cached(&self) -> usize {
        self.num_cached
    }

    /// Number of ghost entries: verified levels that no block holds.
    pub(crate) fn num_ghosts(&self) -> usize {
        self.entries.len() - self.num_cached
    }

    /// Queues a cached block whose ref count just reached 0 for eviction.
    pub(crate) fn push_evictable(&mut self, block: BlockId) {
        let depth = self
            .entry_id(block)
            .and_then(|e| self.entries.get(&e))
            .map_or(0, |e| e.depth as usize);
        if !self.evictable.contains(block) {
            count_up(
                &mut self.evictable_by_tenant,
                self.block_tenant[block as usize],
            );
        }
        self.evictable.push(block, depth);
    }

    /// Someone references a cached block again (a prefix hit or a duplicate found): out of the
    /// eviction queue if it was there, one more hit for the policy.
    pub(crate) fn hit(&mut self, block: BlockId) {
        if self.evictable.contains(block) {
            count_down(
                &mut self.evictable_by_tenant,
                self.block_tenant[block as usize],
            );
        }
        self.evictable.hit(block);
    }

    /// The tenant to evict from under quotas: the one furthest over its quota that has an
    /// evictable block (ties: the lowest id). `None` without quotas or when every tenant with
    /// evictable blocks is within its quota.
    fn over_quota(&self) -> Option<Tenant> {
        let quota = self.tenant_quota?;
        self.evictable_by_tenant
            .keys()
            .map(|&t| (self.num_cached_of(t), t))
            .filter(|&(cached, _)| cached > quota)
            .max_by_key(|&(cached, t)| (cached, std::cmp::Reverse(t)))
            .map(|(_, t)| t)
    }

    /// Evicts the block the policy picks: its entry becomes a ghost (dropped unless something
    /// hangs from it) and the block is returned as a plain free block. `None` when nothing is
    /// evictable. With a tenant quota, the block is the first in the policy's order of the
    /// tenant furthest over its quota, so a tenant within its quota loses no cached block while
    /// another is over; when nobody is over, the policy chooses across all tenants.
    pub(crate) fn evict(&mut self) -> Option<BlockId> {
        let block = match self.over_quota() {
            Some(t) => {
                let owner = &self.block_tenant;
                self.evictable.pop_where(|b| owner[b as usize] == t)?
            }
            None => self.evictable.pop()?,
        };
        self.evicted(block);
        Some(block)
    }

    /// Evicts `block` itself, if it is evictable, as [`PrefixCache::evict`] would have (a
    /// paused session offloaded on purpose). Returns whether it was.
    pub(crate) fn evict_block(&mut self, block: BlockId) -> bool {
        if !self.evictable.contains(block) {
            return false;
        }
        self.evictable.remove(block);
        self.evicted(block);
        true
    }

    /// The bookkeeping of an evicted block, just out of the eviction queue: its entry becomes a
    /// ghost, spilled to the tiers if there are tiers.
    fn evicted(&mut self, block: BlockId) {
        count_down(
            &mut self.evictable_by_tenant,
            self.block_tenant[block as usize],
        );
        if let Some(entry) = self.block_entry[block as usize].take() {
            self.num_cached -= 1;
            count_down(
                &mut self.cached_by_tenant,
                self.block_tenant[block as usize],
            );
            if let Some(e) = self.entries.get_mut(&entry) {
                e.block = None;
            }
            if let Some(tier) = self.tier.as_mut() {
                let pushed_out = tier.spill(block, entry);
                self.held_below(entry, pushed_out);
            }
            self.drop_unused_ghosts(entry);
        }
    }
}

/// The cached levels a prompt starts with, from [`crate::BlockAllocator::match_prefix`] or
/// [`crate::BlockAllocator::match_prefix_levels`].
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct PrefixMatch {
    /// (num_matched_blocks,) the physical block of each verified level, in logical order;
    /// `None` where no block holds that level (only from `match_prefix_levels`, or after
    /// `forget_before`).
    pub(crate) blocks: Vec<Option<BlockId>>,
    /// Hash and entry of each matched level, to re-check at adoption and to continue the chain.
    pub(crate) links: Vec<(BlockHash, EntryId)>,
    /// Whether adopting each level takes a block out of the free count: a matched block that is
    /// unreferenced now, or the fresh block a restored level is copied into.
    pub(crate) takes_block: Vec<bool>,
    /// Whether each level is a ghost whose bytes a lower tier holds: adopting it restores them
    /// into a fresh block ([`crate::tier`]).
    pub(crate) restore: Vec<bool>,
    /// Levels before the first hole (a restorable level is no hole): `holds(h, 0)` in O(1), so
    /// scanning hit lengths for a long prompt stays linear.
    pub(crate) num_leading_held: usize,
    pub(crate) collision: bool,
}

impl PrefixMatch {
    /// The matched levels' physical blocks, in logical order (`None`: not held).
    pub fn blocks(&self) -> &[Option<BlockId>] {
        &self.blocks
    }

    /// Number of matched levels (held or not).
    pub fn num_blocks(&self) -> usize {
        self.blocks.len()
    }

    /// Blocks adopting the match takes out of the free count: matched blocks unreferenced now,
    /// plus one fresh block per restored level.
    pub fn num_blocks_taken(&self) -> usize {
        self.num_blocks_taken_in(0..self.takes_block.len())
    }

    /// What adopting only `levels` takes out of the free count (see [`Self::num_blocks_taken`]);
    /// levels past the match count nothing.
    pub(crate) fn num_blocks_taken_in(&self, levels: std::ops::Range<usize>) -> usize {
        let end = levels.end.min(self.takes_block.len());
        let start = levels.start.min(end);
        self.takes_block[start..end].iter().filter(|&&e| e).count()
    }

    /// Whether the walk stopped at a block whose hash was cached for other content (a hash
    /// collision, caught by comparing tokens and parent).
    pub fn collision_detected(&self) -> bool {
        self.collision
    }

    /// Levels a lower tier holds, which adopting restores (a subset of the `None` levels).
    pub fn num_restores(&self) -> usize {
        self.restore.iter().filter(|&&r| r).count()
    }

    /// Whether level `level` is matched and held, in the pool or in a tier below.
    pub(crate) fn serves(&self, level: usize) -> bool {
        self.blocks.get(level).is_some_and(Option::is_some)
            || self.restore.get(level) == Some(&true)
    }

    /// Whether a hit of `num_blocks` levels is usable by a table that needs the blocks from
    /// logical block `first_needed` on (0 for full attention): all those levels are matched and
    /// held, in the pool or in a tier below.
    pub fn holds(&self, num_blocks: usize, first_needed: usize) -> bool {
        match first_needed.min(num_blocks) {
            _ if num_blocks > self.blocks.len() => false,
            0 => num_blocks <= self.num_leading_held,
            first => (first..num_blocks).all(|i| self.serves(i)),
        }
    }

    /// Keeps only the first `num_blocks` matched levels.
    pub fn truncate(&mut self, num_blocks: usize) {
        self.blocks.truncate(num_blocks);
        self.links.truncate(num_blocks);
        self.takes_block.truncate(num_blocks);
        self.restore.truncate(num_blocks);
        self.num_leading_held = self.num_leading_held.min(num_blocks);
    }

    /// Makes every level below `first_needed` a hole: a sliding-window table adopts only the
    /// blocks its next query can see (the levels stay part of the verified chain).
    pub fn forget_before(&mut self, first_needed: usize) {
        let end = first_needed.min(self.blocks.len());
        self.blocks[..end].fill(None);
        self.takes_block[..end].fill(false);
        self.restore[..end].fill(false);
        if end > 0 {
            self.num_leading_held = 0;
        }
    }

    /// Makes restorable `level` a hole (its bytes cannot be read back this step).
    pub(crate) fn unhold(&mut self, level: usize) {
        if self.restore.get(level) == Some(&true) {
            self.restore[level] = false;
            self.takes_block[level] = false;
            self.num_leading_held = self.num_leading_held.min(level);
        }
    }
}

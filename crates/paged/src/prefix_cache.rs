//! The store behind prefix caching: which physical block holds which full-block content, and
//! which unreferenced cached blocks to evict first.
//!
//! A full block, once written, never changes (later tokens go to later blocks), so its KV can be
//! shared by every sequence whose prompt starts with the same tokens. The cache maps a block's
//! chained hash ([`crate::hash`]) to the physical block holding it.
//!
//! **Collisions are verified, never trusted.** Each cached block keeps an *entry*: a unique
//! `EntryId` (never reused), its token ids and its parent's `EntryId`. A lookup at level i
//! succeeds only if the entry under the hash has the same tokens *and* its parent is the very
//! entry matched at level i-1. By induction a hit's whole prefix is identical token for token,
//! even if the hash function were constant. (Comparing the parent's *hash* would not be enough: a
//! collision one level up would pass unnoticed.)
//!
//! **Eviction is LRU over unreferenced blocks.** A cached block whose ref count drops to 0 keeps
//! its content and entry and becomes *evictable*: still counted as free, still a possible hit.
//! The allocator evicts (oldest release first) only when its free list of never-cached blocks is
//! empty. Sequences release their blocks last-to-first, so a sequence's tail is evicted before
//! its head, which more requests share.

use std::collections::{BTreeMap, HashMap};

use crate::BlockId;
use crate::hash::{BlockHash, HashFn};

/// Identity of one cached content. Unique for the allocator's lifetime, so a child entry whose
/// parent was evicted can never be matched through a later, different block.
pub(crate) type EntryId = u64;

/// How far the prefix cache has registered a block table's leading full blocks.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub(crate) struct PrefixChain {
    /// Leading full blocks already registered (or found equal to a cached block).
    pub(crate) num_blocks: usize,
    /// Hash and entry of block `num_blocks - 1`: the parent of the next block to register.
    pub(crate) last: Option<(BlockHash, EntryId)>,
    /// A true hash collision (or a hole) stopped registration; later blocks stay private.
    pub(crate) broken: bool,
}

/// One cached content.
#[derive(Debug, Clone)]
struct CacheEntry {
    id: EntryId,
    hash: BlockHash,
    parent: Option<EntryId>,
    /// (block_size,) the tokens whose KV the block holds, compared on every hit.
    tokens: Box<[u32]>,
}

/// Result of looking one block up.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Lookup {
    /// The block holding exactly these tokens after exactly this parent.
    Hit {
        block: BlockId,
        hash: BlockHash,
        entry: EntryId,
    },
    /// Nothing cached under the hash.
    Miss { hash: BlockHash },
    /// Something else is cached under the hash: a hash collision, detected.
    Collision { hash: BlockHash },
}

/// Hash → block map, per-block entries and the LRU of evictable blocks.
#[derive(Debug, Clone)]
pub(crate) struct PrefixCache {
    pub(crate) hash_fn: HashFn,
    by_hash: HashMap<BlockHash, BlockId>,
    /// (num_blocks,) the entry of each cached block.
    entries: Vec<Option<CacheEntry>>,
    /// Evictable blocks keyed by release tick; the smallest key is evicted first.
    lru: BTreeMap<u64, BlockId>,
    /// (num_blocks,) the LRU key of each evictable block.
    lru_key: Vec<Option<u64>>,
    next_tick: u64,
    next_entry: EntryId,
}

impl PrefixCache {
    pub(crate) fn new(num_blocks: usize, hash_fn: HashFn) -> Self {
        Self {
            hash_fn,
            by_hash: HashMap::new(),
            entries: vec![None; num_blocks],
            lru: BTreeMap::new(),
            lru_key: vec![None; num_blocks],
            next_tick: 0,
            next_entry: 0,
        }
    }

    /// Looks up the block after `parent` (None for the first block) holding `tokens`.
    pub(crate) fn lookup(&self, parent: Option<(BlockHash, EntryId)>, tokens: &[u32]) -> Lookup {
        let hash = (self.hash_fn)(parent.map(|(h, _)| h), tokens);
        let Some(&block) = self.by_hash.get(&hash) else {
            return Lookup::Miss { hash };
        };
        match self.entries.get(block as usize).and_then(Option::as_ref) {
            Some(e) if e.parent == parent.map(|(_, id)| id) && *e.tokens == *tokens => {
                Lookup::Hit {
                    block,
                    hash,
                    entry: e.id,
                }
            }
            _ => Lookup::Collision { hash },
        }
    }

    /// Registers `block` as holding `tokens` after `parent`. The caller has seen `Lookup::Miss`
    /// for this hash and checked that the block has no entry yet.
    pub(crate) fn insert(
        &mut self,
        block: BlockId,
        hash: BlockHash,
        parent: Option<EntryId>,
        tokens: &[u32],
    ) -> EntryId {
        let id = self.next_entry;
        self.next_entry += 1;
        self.by_hash.insert(hash, block);
        self.entries[block as usize] = Some(CacheEntry {
            id,
            hash,
            parent,
            tokens: tokens.into(),
        });
        id
    }

    /// The entry id of a cached block.
    pub(crate) fn entry_id(&self, block: BlockId) -> Option<EntryId> {
        self.entries
            .get(block as usize)
            .and_then(Option::as_ref)
            .map(|e| e.id)
    }

    /// Whether `block` holds registered content.
    pub(crate) fn is_cached(&self, block: BlockId) -> bool {
        self.entry_id(block).is_some()
    }

    /// Whether `block` is cached, unreferenced and waiting in the LRU.
    pub(crate) fn is_evictable(&self, block: BlockId) -> bool {
        self.lru_key
            .get(block as usize)
            .is_some_and(Option::is_some)
    }

    /// Number of evictable blocks.
    pub(crate) fn num_evictable(&self) -> usize {
        self.lru.len()
    }

    /// Number of blocks holding registered content (referenced or evictable).
    pub(crate) fn num_cached(&self) -> usize {
        self.by_hash.len()
    }

    /// Puts a cached block whose ref count just reached 0 at the young end of the LRU.
    pub(crate) fn push_evictable(&mut self, block: BlockId) {
        let tick = self.next_tick;
        self.next_tick += 1;
        self.lru.insert(tick, block);
        self.lru_key[block as usize] = Some(tick);
    }

    /// Takes a block out of the LRU because someone references it again (a hit).
    pub(crate) fn remove_evictable(&mut self, block: BlockId) {
        if let Some(tick) = self.lru_key[block as usize].take() {
            self.lru.remove(&tick);
        }
    }

    /// Evicts the least recently released block: forgets its content and returns it, now a
    /// plain free block. `None` when nothing is evictable.
    pub(crate) fn evict_lru(&mut self) -> Option<BlockId> {
        let (_, block) = self.lru.pop_first()?;
        self.lru_key[block as usize] = None;
        if let Some(entry) = self.entries[block as usize].take() {
            self.by_hash.remove(&entry.hash);
        }
        Some(block)
    }
}

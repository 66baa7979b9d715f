//! Prefix caching on a block table: find the cached blocks a new prompt starts with, adopt them,
//! and register a sequence's own full blocks once their k and v are computed.
//!
//! The flow for a new sequence (the scheduler does exactly this):
//!
//! 1. `match_prefix(prompt, max_blocks)` (a query) walks the prompt's full blocks and stops at
//!    the first one not cached. Pass `max_blocks = (prompt_len - 1) / block_size`: at least the
//!    last prompt token must be computed to get logits, so a fully cached prompt recomputes its
//!    whole last block (into a fresh block) as vLLM does. Cached blocks are then never written.
//! 2. `adopt_prefix(table, &m)` takes a reference on each matched block (evictable ones leave
//!    the LRU) and sets `table.num_tokens()` to the cached token count; the engine prefills only
//!    the rest.
//! 3. After each step, `register_full_blocks(table, tokens, num_computed)` names every newly
//!    full, computed block. If an identical block is already cached, the table switches to the
//!    cached one and its own copy returns to the pool (deduplication, as vLLM v0 did).
//!
//! **Sliding-window groups** need only the blocks the first uncached query can see, not the
//! whole prefix (vLLM v1's `SlidingWindowManager` makes the same observation). For them,
//! `match_prefix_levels` walks every *verified* level, including the ones no block holds any more
//! (ghosts, see `prefix_cache.rs`, which also holds [`PrefixMatch`]), and reports which levels are held; the caller picks a hit
//! length `h` for which [`PrefixMatch::holds`] the blocks from `window_start(h · block_size) /
//! block_size` on, and [`PrefixMatch::forget_before`] turns the older levels into holes before
//! adopting. A model with both kinds of layers takes the longest `h` that every group holds,
//! which is what vLLM's hybrid KV cache coordinator computes.
//!
//! **Cache salts** (vLLM's `cache_salt`) keep requests from sharing blocks: a table's salt is
//! mixed into its first block's key, so a salted prompt matches only prompts of the same salt
//! (and unsalted ones only unsalted ones). A shared prefix cache otherwise tells a tenant,
//! through a faster first token, that another tenant sent the same prefix.

use crate::prefix_cache::{EntryId, Lookup, PrefixChain};
use crate::{BlockAllocator, BlockTable, PagedError, PrefixMatch, Result};

impl BlockAllocator {
    /// The longest run of cached, held full blocks that `tokens` starts with, at most
    /// `max_blocks` (pass `(prompt_len - 1) / block_size`, see the module docs): what a
    /// full-attention table can adopt. Empty when prefix caching is off. Each hit is verified on
    /// tokens and parent, so a hash collision ends the match instead of returning a wrong block.
    pub fn match_prefix(&self, tokens: &[u32], max_blocks: usize) -> PrefixMatch {
        self.match_prefix_salted(tokens, 0, max_blocks)
    }

    /// [`Self::match_prefix`] for a request whose cache salt is `salt` (0: none): it hits only
    /// blocks registered by tables of the same salt ([`BlockTable::with_salt`]).
    pub fn match_prefix_salted(&self, tokens: &[u32], salt: u64, max_blocks: usize) -> PrefixMatch {
        let mut m = self.match_prefix_levels_salted(tokens, salt, max_blocks);
        m.truncate(m.num_leading_held);
        m
    }

    /// Every verified level `tokens` starts with, at most `max_blocks`, including levels that
    /// no block holds any more (`None`): what a sliding-window table chooses its hit from with
    /// [`PrefixMatch::holds`]. Empty when prefix caching is off.
    pub fn match_prefix_levels(&self, tokens: &[u32], max_blocks: usize) -> PrefixMatch {
        self.match_prefix_levels_salted(tokens, 0, max_blocks)
    }

    /// [`Self::match_prefix_levels`] for a request whose cache salt is `salt` (0: none).
    pub fn match_prefix_levels_salted(
        &self,
        tokens: &[u32],
        salt: u64,
        max_blocks: usize,
    ) -> PrefixMatch {
        let mut m = PrefixMatch::default();
        if !self.prefix_caching {
            return m;
        }
        let blocks = tokens.chunks_exact(self.block_size).take(max_blocks);
        for (i, block_tokens) in blocks.enumerate() {
            let key = salted(block_tokens, salt, i);
            match self.cache.lookup(m.links.last().copied(), &key) {
                Lookup::Hit { block, hash, entry } => {
                    let restore = block.is_none() && self.cache.is_tiered(entry);
                    if (block.is_some() || restore) && m.num_leading_held == m.blocks.len() {
                        m.num_leading_held += 1;
                    }
                    m.blocks.push(block);
                    m.links.push((hash, entry));
                    m.takes_block
                        .push(restore || block.is_some_and(|b| self.cache.is_evictable(b)));
                    m.restore.push(restore);
                }
                Lookup::Miss { .. } => break,
                Lookup::Collision { .. } => {
                    m.collision = true;
                    break;
                }
            }
        }
        m
    }

    /// Makes the empty `table` start with the matched levels (ref count + 1 on each held block,
    /// a fresh block for each level a lower tier holds, whose bytes the step restores — see
    /// [`crate::tier`] —, a hole for each level without either) and marks their tokens as
    /// present. Returns the number of cached tokens, which the engine skips. A full-attention
    /// table must only adopt matches without holes (what [`Self::match_prefix`] returns).
    ///
    /// # Errors
    /// [`PagedError::TableNotEmpty`] or [`PagedError::BlockSizeMismatch`] for an unsuitable
    /// table; [`PagedError::StalePrefixMatch`] if a matched block was evicted, or a tiered level
    /// dropped, since `match_prefix`; [`PagedError::OutOfBlocks`] if the restores do not fit
    /// (nothing changes in any case).
    pub fn adopt_prefix(&mut self, table: &mut BlockTable, m: &PrefixMatch) -> Result<usize> {
        if table.num_tokens != 0 || !table.blocks.is_empty() {
            return Err(PagedError::TableNotEmpty {
                num_tokens: table.num_tokens,
            });
        }
        self.check_table(table)?;
        for (level, (&block, &(_, entry))) in m.blocks.iter().zip(&m.links).enumerate() {
            let fresh = match block {
                Some(b) => self.cache.entry_id(b) == Some(entry),
                None if m.restore[level] => self.cache.is_tiered(entry),
                None => self.cache.contains(entry),
            };
            if !fresh {
                return Err(PagedError::StalePrefixMatch { level });
            }
        }
        self.ensure_free(m.num_blocks_taken())?;
        for &block in m.blocks.iter().flatten() {
            self.acquire(block);
        }
        table.blocks = m.blocks.clone();
        // Restored levels last: the held blocks are out of the eviction queue by now, and every
        // level to restore out of the tiers, so the evictions these allocations cause (and the
        // spills they push) touch neither.
        let restores: Vec<(usize, EntryId)> = (0..m.blocks.len())
            .filter(|&l| m.restore[l])
            .map(|l| (l, m.links[l].1))
            .collect();
        for &(_, entry) in &restores {
            self.cache.take_tiered(entry);
        }
        for (level, entry) in restores {
            let block = self.alloc_one()?;
            self.cache.restore(entry, block, table.tenant);
            table.blocks[level] = Some(block);
        }
        table.num_tokens = m.blocks.len() * self.block_size;
        table.chain = PrefixChain {
            num_blocks: m.blocks.len(),
            last: m.links.last().copied(),
            broken: false,
        };
        if let Some((_, entry)) = table.chain.last {
            self.cache.pin(entry);
        }
        Ok(table.num_tokens)
    }

    /// Registers every full block of `table` whose tokens are computed (positions below
    /// `num_computed`) and not yet registered; `tokens` is the sequence's token history.
    /// A block identical to a cached one is replaced by it (deduplication); a level the table
    /// holds no block for (a sliding-window hole) is registered as a ghost, but only on the way
    /// to a held block, so trailing holes wait for the next call. A hash collision stops
    /// registration for this table (its later blocks stay private, counted in
    /// [`crate::AllocatorStats::num_hash_collisions`]). No-op when prefix caching is off.
    ///
    /// # Errors
    /// [`PagedError::BlockSizeMismatch`] / [`PagedError::InvalidBlock`] if the table does not
    /// belong to this allocator.
    pub fn register_full_blocks(
        &mut self,
        table: &mut BlockTable,
        tokens: &[u32],
        num_computed: usize,
    ) -> Result<()> {
        if !self.prefix_caching {
            return Ok(());
        }
        self.check_table(table)?;
        let bs = self.block_size;
        let full = num_computed.min(tokens.len()).min(table.num_tokens) / bs;
        let done = table.chain.num_blocks;
        let full = (done..full)
            .rev()
            .find(|&i| table.blocks[i].is_some())
            .map_or(done, |i| i + 1);
        while table.chain.num_blocks < full && !table.chain.broken {
            let i = table.chain.num_blocks;
            let parent = table.chain.last;
            let block = table.blocks[i];
            let block_tokens = &salted(&tokens[i * bs..(i + 1) * bs], table.salt, i);
            let free_of_entry = block.is_none_or(|b| !self.cache.is_cached(b));
            let link = match (self.cache.lookup(parent, block_tokens), block) {
                (
                    Lookup::Hit {
                        block: Some(cached),
                        hash,
                        entry,
                    },
                    Some(own),
                ) => {
                    if cached != own {
                        self.acquire(cached);
                        self.release(own);
                        table.blocks[i] = Some(cached);
                        self.stats.num_dedup_blocks += 1;
                    }
                    (hash, entry)
                }
                (
                    Lookup::Hit {
                        block: None,
                        hash,
                        entry,
                    },
                    Some(own),
                ) if free_of_entry => {
                    self.cache.attach(entry, own, table.tenant);
                    if let Some(new) = self.newly_cached.as_mut() {
                        new.push((i, own));
                    }
                    (hash, entry)
                }
                (Lookup::Hit { hash, entry, .. }, None) => (hash, entry),
                (Lookup::Miss { hash }, _) if free_of_entry => {
                    let parent = parent.map(|(_, e)| e);
                    let entry = self
                        .cache
                        .insert(block, hash, parent, block_tokens, table.tenant);
                    if let (Some(new), Some(own)) = (self.newly_cached.as_mut(), block) {
                        new.push((i, own));
                    }
                    (hash, entry)
                }
                _ => {
                    self.stats.num_hash_collisions += 1;
                    table.chain.broken = true;
                    break;
                }
            };
            self.cache.pin(link.1);
            if let Some((_, old)) = parent {
                self.cache.unpin(old);
            }
            table.chain.num_blocks += 1;
            table.chain.last = Some(link);
        }
        Ok(())
    }

    /// Levels the prefix cache knows but no block holds (evicted, or behind a sliding window
    /// when computed): kept only while a cached block or a live table hangs from them.
    pub fn num_ghost_entries(&self) -> usize {
        self.cache.num_ghosts()
    }
}

/// The key level `level` of a prompt is cached under: its tokens, and for the first level of a
/// salted request (vLLM's `cache_salt`) a marker and the salt before them. The first block's
/// hash and verified tokens then differ from every other salt's, and every later level hangs
/// from that first entry, so requests share blocks only with requests of the same salt.
pub(crate) fn salted(tokens: &[u32], salt: u64, level: usize) -> std::borrow::Cow<'_, [u32]> {
    if salt == 0 || level > 0 {
        return std::borrow::Cow::Borrowed(tokens);
    }
    let mark = [u32::MAX, salt as u32, (salt >> 32) as u32];
    std::borrow::Cow::Owned(mark.iter().chain(tokens).copied().collect())
}

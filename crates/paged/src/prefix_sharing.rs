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

use crate::allocator::BlockAllocator;
use crate::block_table::{BlockId, BlockTable};
use crate::error::{PagedError, Result};
use crate::hash::BlockHash;
use crate::prefix_cache::{EntryId, Lookup, PrefixChain};

/// The cached blocks a prompt starts with, from [`BlockAllocator::match_prefix`].
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct PrefixMatch {
    /// (num_matched_blocks,) physical blocks, in logical order.
    blocks: Vec<BlockId>,
    /// Hash and entry of each matched block, to re-check at adoption and to continue the chain.
    links: Vec<(BlockHash, EntryId)>,
    /// Whether each matched block is currently unreferenced (adopting takes it out of the free
    /// count).
    evictable: Vec<bool>,
    collision: bool,
}

impl PrefixMatch {
    /// The matched physical blocks, in logical order.
    pub fn blocks(&self) -> &[BlockId] {
        &self.blocks
    }

    /// Number of matched blocks.
    pub fn num_blocks(&self) -> usize {
        self.blocks.len()
    }

    /// Matched blocks that are unreferenced now: adopting them lowers the free count by this.
    pub fn num_evictable(&self) -> usize {
        self.evictable.iter().filter(|&&e| e).count()
    }

    /// Whether the walk stopped at a block whose hash was cached for other content (a hash
    /// collision, caught by comparing tokens and parent).
    pub fn collision_detected(&self) -> bool {
        self.collision
    }

    /// Keeps only the first `num_blocks` matched blocks.
    pub fn truncate(&mut self, num_blocks: usize) {
        self.blocks.truncate(num_blocks);
        self.links.truncate(num_blocks);
        self.evictable.truncate(num_blocks);
    }
}

impl BlockAllocator {
    /// The longest run of cached full blocks that `tokens` starts with, at most `max_blocks`
    /// (pass `(prompt_len - 1) / block_size`, see the module docs). Empty when prefix caching
    /// is off. Each hit is verified on tokens and parent, so a hash collision ends the match
    /// instead of returning a wrong block.
    pub fn match_prefix(&self, tokens: &[u32], max_blocks: usize) -> PrefixMatch {
        let mut m = PrefixMatch::default();
        if !self.prefix_caching {
            return m;
        }
        for block_tokens in tokens.chunks_exact(self.block_size).take(max_blocks) {
            match self.cache.lookup(m.links.last().copied(), block_tokens) {
                Lookup::Hit { block, hash, entry } => {
                    m.blocks.push(block);
                    m.links.push((hash, entry));
                    m.evictable.push(self.cache.is_evictable(block));
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

    /// Makes the empty `table` start with the matched blocks (ref count + 1 each) and marks their
    /// tokens as present. Returns the number of cached tokens, which the engine skips.
    ///
    /// # Errors
    /// [`PagedError::TableNotEmpty`] or [`PagedError::BlockSizeMismatch`] for an unsuitable
    /// table; [`PagedError::StalePrefixMatch`] if a matched block was evicted since
    /// `match_prefix` (nothing changes in either case).
    pub fn adopt_prefix(&mut self, table: &mut BlockTable, m: &PrefixMatch) -> Result<usize> {
        if table.num_tokens != 0 || !table.blocks.is_empty() {
            return Err(PagedError::TableNotEmpty {
                num_tokens: table.num_tokens,
            });
        }
        self.check_table(table)?;
        for (&block, &(_, entry)) in m.blocks.iter().zip(&m.links) {
            if self.cache.entry_id(block) != Some(entry) {
                return Err(PagedError::StalePrefixMatch { block });
            }
        }
        for &block in &m.blocks {
            self.acquire(block);
        }
        table.blocks = m.blocks.iter().map(|&b| Some(b)).collect();
        table.num_tokens = m.blocks.len() * self.block_size;
        table.chain = PrefixChain {
            num_blocks: m.blocks.len(),
            last: m.links.last().copied(),
            broken: false,
        };
        Ok(table.num_tokens)
    }

    /// Registers every full block of `table` whose tokens are computed (positions below
    /// `num_computed`) and not yet registered; `tokens` is the sequence's token history.
    /// A block identical to a cached one is replaced by it (deduplication); a hash collision
    /// stops registration for this table (its later blocks stay private, counted in
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
        while table.chain.num_blocks < full && !table.chain.broken {
            let i = table.chain.num_blocks;
            let parent = table.chain.last;
            let Some(block) = table.blocks[i] else {
                table.chain.broken = true; // A hole: nothing left to name.
                break;
            };
            let block_tokens = &tokens[i * bs..(i + 1) * bs];
            let link = match self.cache.lookup(parent, block_tokens) {
                Lookup::Hit {
                    block: cached,
                    hash,
                    entry,
                } => {
                    if cached != block {
                        self.acquire(cached);
                        self.release(block);
                        table.blocks[i] = Some(cached);
                        self.stats.num_dedup_blocks += 1;
                    }
                    (hash, entry)
                }
                Lookup::Miss { hash } if !self.cache.is_cached(block) => {
                    let entry =
                        self.cache
                            .insert(block, hash, parent.map(|(_, e)| e), block_tokens);
                    (hash, entry)
                }
                Lookup::Miss { .. } | Lookup::Collision { .. } => {
                    self.stats.num_hash_collisions += 1;
                    table.chain.broken = true;
                    break;
                }
            };
            table.chain.num_blocks += 1;
            table.chain.last = Some(link);
        }
        Ok(())
    }
}

//! The prefix hit of a prompt over every KV cache group, and the slots of its prefill.
//!
//! The hit is the longest `h` full blocks that every group can serve: a full-attention group
//! needs all `h` blocks, a sliding-window group only those from `window_start(h · block_size)`
//! on (see `allocator/prefix.rs`). Levels the tiers below the pools would restore are weighed
//! against recomputing them (`RestoreCost`) and checked readable before a step relies on them.

use super::KvCacheManager;
use crate::{BlockCopy, BlockTable, HitsByTier, PrefixMatch, Result};

/// What [`KvCacheManager::get_computed_blocks`] found for a prompt: the hit every group serves,
/// to hand to [`KvCacheManager::allocate_prompt_slots`] before anything else changes the pools.
#[derive(Debug)]
pub struct ComputedBlocks {
    /// (num_groups,) each group's match, levels past the hit not yet cut.
    matches: Vec<PrefixMatch>,
    /// Full blocks of the prompt served from the cache (its first `num_blocks · block_size`
    /// tokens are computed).
    pub num_blocks: usize,
    /// Tokens the first step computes after the hit: the rest of the prompt, or with chunked
    /// prefill a first chunk of it that fits the budget.
    pub num_new_tokens: usize,
    /// Whether the prefill keeps (and so caches) every key it writes, or only what its sliding
    /// windows need once it ends (when the pools cannot take more).
    cache_all: bool,
    /// Restorable levels declined because recomputing them was cheaper.
    pub num_restores_declined: usize,
}

/// What [`KvCacheManager::allocate_prompt_slots`] gave a prefill.
#[derive(Debug)]
pub struct PromptSlots {
    /// Per group, the copy-on-write copies the engine makes before it writes.
    pub copies: Vec<Vec<BlockCopy>>,
    /// Tokens of the hit by where they came from: the pool, host memory, files, the remote
    /// tier.
    pub hits_by_tier: HitsByTier,
}

impl KvCacheManager {
    /// The longest prefix-cache hit of the prompt `tokens` (of a request salted `salt`, 0 for
    /// none: it hits only blocks of the same salt) that leaves a prefill of at most `budget`
    /// tokens the pools can take; `None` when even no hit does not fit. The last
    /// token is always computed (its logits are the step's output). With `chunked`, any hit
    /// fits the budget: the step computes only the first `budget` tokens after it (a chunk),
    /// and the pools need only take those.
    pub fn get_computed_blocks(
        &mut self,
        (tokens, salt): (&[u32], u64),
        budget: usize,
        chunked: bool,
    ) -> Option<ComputedBlocks> {
        let bs = self.kv_cache.block_size;
        let len = tokens.len();
        if budget == 0 {
            return None;
        }
        // Where the first step ends after a hit of h blocks.
        let end = |h: usize| {
            if chunked {
                len.min(h * bs + budget)
            } else {
                len
            }
        };
        let max_blocks = (len - 1) / bs;
        self.fetch_remote(tokens, salt, max_blocks);
        let mut matches: Vec<_> = (self.allocators.iter().zip(&self.kv_cache.groups))
            .map(|(alloc, group)| match group.sliding_window {
                Some(_) => alloc.match_prefix_levels_salted(tokens, salt, max_blocks),
                None => alloc.match_prefix_salted(tokens, salt, max_blocks),
            })
            .collect();
        let declined = self.weigh_restores(&mut matches);
        for (g, m) in matches.iter_mut().enumerate() {
            self.check_restores(g, m);
        }
        let keep_from = |g: usize, end: usize| self.kv_cache.groups[g].keep_from(end);
        let first_needed = |g: usize, h: usize| keep_from(g, h * bs) / bs;
        // First position of the prompt group g keeps after a hit of h blocks. A sliding-window
        // group needs only what the queries after this step can see (`keep_from(end)`): the
        // keys only this prefill's own queries read get PAD_SLOT and no memory. With prefix
        // caching, those keys are what a later prompt sharing this one needs to hit, so the
        // prefill writes them, registers its full blocks and trims them into the cache right
        // after the step (vLLM also allocates the whole scheduled prompt); when the pool cannot
        // take that, the prompt is prefilled windowed and simply caches less.
        let keep = |g: usize, h: usize, cache_all: bool| {
            keep_from(g, if cache_all { h * bs } else { end(h) })
        };
        // Blocks group g must take to prefill from a hit of h blocks: the matched blocks it
        // adopts that are evictable now, plus fresh ones for the uncached positions it keeps.
        let blocks_to_take = |g: usize, h: usize, cache_all: bool| {
            let adopted = matches[g].num_blocks_taken_in(first_needed(g, h).min(h)..h);
            let keep = keep(g, h, cache_all);
            let fresh = (h..end(h).div_ceil(bs))
                .filter(|j| (j + 1) * bs > keep)
                .count();
            adopted + fresh
        };
        let longest = matches.iter().map(|m| m.num_blocks()).min().unwrap_or(0);
        let groups = || 0..matches.len();
        let fits = |h: usize, cache_all: bool| {
            groups().all(|g| self.allocators[g].can_allocate(blocks_to_take(g, h, cache_all)))
        };
        let caching = self.enable_prefix_caching;
        let (num_blocks, cache_all) = (0..=longest)
            .rev()
            .filter(|&h| groups().all(|g| matches[g].holds(h, first_needed(g, h))))
            .take_while(|&h| chunked || len - h * bs <= budget) // Shorter hits compute more.
            .find_map(|h| {
                if caching && fits(h, true) {
                    Some((h, true))
                } else {
                    fits(h, false).then_some((h, false))
                }
            })?;
        Some(ComputedBlocks {
            matches,
            num_blocks,
            num_new_tokens: end(num_blocks) - num_blocks * bs,
            cache_all,
            num_restores_declined: declined,
        })
    }

    /// Takes the hit `computed` found for the prompt of `tables` — its cached blocks adopted,
    /// restores scheduled — and slots for the `computed.num_new_tokens` after it.
    ///
    /// # Errors
    /// [`crate::PagedError`] if the pools changed since `computed` was found (a bug).
    pub fn allocate_prompt_slots(
        &mut self,
        tables: &mut [BlockTable],
        computed: ComputedBlocks,
    ) -> Result<PromptSlots> {
        let bs = self.kv_cache.block_size;
        let (h, mut matches) = (computed.num_blocks, computed.matches);
        let (n, end) = (computed.num_new_tokens, h * bs + computed.num_new_tokens);
        for (m, group) in matches.iter_mut().zip(&self.kv_cache.groups) {
            m.truncate(h);
            m.forget_before(group.keep_from(h * bs) / bs);
        }
        let hits_by_tier = self.hits_by_tier(&matches, h);
        let mut copies = Vec::with_capacity(matches.len());
        let pools = self.allocators.iter_mut().zip(tables);
        for (((alloc, table), m), group) in pools.zip(&matches).zip(&self.kv_cache.groups) {
            let keep = group.keep_from(if computed.cache_all { h * bs } else { end });
            alloc.adopt_prefix(table, m)?;
            copies.push(alloc.append_slots(table, n, keep)?);
        }
        Ok(PromptSlots {
            copies,
            hits_by_tier,
        })
    }
}

//! The two configurations. [`KvCacheConfig`] is the shape of the paged KV cache: the engine lays
//! its pool out by it and the scheduler sizes its allocators by it, one value given to both (as
//! vLLM v1 gives its `KVCacheConfig` to the scheduler's KV cache manager and to the model
//! runner), so the two cannot disagree. [`SchedulerConfig`] adds the budgets of a step.
//!
//! `validate` rejects every configuration under which the scheduler could wait forever: it
//! demands that one sequence of `max_model_len` tokens fits the pool and a step's token budget on
//! its own (vLLM refuses the same configurations at start-up). With that, a lone sequence can
//! always run to completion, and preempting newer sequences always lets the oldest one progress.

use serde::Serialize;

use crate::{
    BlockAllocator, EvictionPolicy, PagedError, Result, TierConfig, max_window_blocks, window_start,
};

/// One KV cache group: a set of layers sharing an attention kind, served by its own pool.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
pub struct KvGroupConfig {
    /// Blocks in this group's pool.
    pub num_blocks: usize,
    /// `None` for full (global) attention; `Some(W)` for sliding-window (local) layers.
    pub sliding_window: Option<usize>,
}

impl KvGroupConfig {
    /// First position whose key this group must keep once `end` tokens are computed: 0 for full
    /// attention, [`crate::window_start`]`(end, W)` for a window of W.
    pub fn keep_from(&self, end: usize) -> usize {
        self.sliding_window.map_or(0, |w| window_start(end, w))
    }
}

/// The shape of a paged KV cache: tokens per block and one pool per KV cache group. The engine's
/// cache tensors are `(n_layers_in_group, num_blocks, block_size, n_kv_heads, head_dim)` per
/// group; the scheduler keeps one [`BlockAllocator`] per group over the same blocks.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct KvCacheConfig {
    /// Tokens per block, shared by all groups ([`crate::DEFAULT_BLOCK_SIZE`] = 16, as in vLLM).
    pub block_size: usize,
    /// (num_groups,) the KV cache groups; a plain Llama has one full-attention group.
    pub groups: Vec<KvGroupConfig>,
}

impl KvCacheConfig {
    /// `num_blocks` blocks of `block_size` tokens for each group of `windows`, in order (`None`:
    /// full attention, `Some(W)`: a window of W tokens): the paged engines' layout, with
    /// `windows` from the model (`Config::kv_cache_groups`).
    pub fn new(
        windows: impl IntoIterator<Item = Option<usize>>,
        num_blocks: usize,
        block_size: usize,
    ) -> Self {
        let groups = windows
            .into_iter()
            .map(|sliding_window| KvGroupConfig {
                num_blocks,
                sliding_window,
            })
            .collect();
        Self { block_size, groups }
    }

    /// One pool per group, in group order.
    ///
    /// # Errors
    /// [`PagedError::InvalidConfig`] for sizes [`BlockAllocator::new`] refuses (zero, or too
    /// large to index).
    pub fn allocators(
        &self,
        prefix_caching: bool,
        eviction: EvictionPolicy,
        tenant_quota: Option<usize>,
        tier: Option<(usize, Option<u64>)>,
    ) -> Result<Vec<BlockAllocator>> {
        self.groups
            .iter()
            .map(|g| {
                BlockAllocator::new(g.num_blocks, self.block_size).map(|a| {
                    a.with_prefix_caching(prefix_caching)
                        .with_eviction_policy(eviction)
                        .with_tenant_quota(tenant_quota)
                        .with_tier(tier)
                })
            })
            .collect()
    }
}

/// Everything the scheduler needs to know up front.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct SchedulerConfig {
    /// Block size and pools: the value the engine was built with.
    pub kv_cache: KvCacheConfig,
    /// Most tokens computed in one step (prefill tokens not served by the prefix cache, plus
    /// one per decoding sequence).
    pub max_num_batched_tokens: usize,
    /// Prefill a prompt that does not fit the step's remaining budget in chunks, one per step,
    /// each attending over the chunks already cached (vLLM's `--enable-chunked-prefill`, on by
    /// default in vLLM v1). Off: a prompt is prefilled whole, so the budget must cover
    /// `max_model_len`.
    pub enable_chunked_prefill: bool,
    /// Most sequences running at once (so most sequences in one step).
    pub max_num_seqs: usize,
    /// Most tokens (prompt + generated) in any sequence.
    pub max_model_len: usize,
    /// Share cached full blocks between sequences with a common prefix, in every group (a hit
    /// must be served by all groups; sliding-window groups need only the blocks in the window).
    pub enable_prefix_caching: bool,
    /// Which evictable cached block goes first when a pool runs out of free ones.
    pub eviction_policy: EvictionPolicy,
    /// Cached blocks per pool each tenant keeps safe from other tenants' demand (`None`: no
    /// quotas; see `BlockAllocator::with_tenant_quota`).
    pub tenant_quota: Option<usize>,
    /// Tiers below the pools that evicted cached blocks spill to and hits restore from
    /// (`None`: evicted content is dropped; see [`crate::tier`]). Needs prefix caching.
    pub tiers: Option<TierConfig>,
}

impl SchedulerConfig {
    /// A scheduler over `kv_cache` with prefix caching on (LRU eviction), `max_num_seqs = 256`
    /// and `max_num_batched_tokens = max(2048, max_model_len)`, chunked prefill on (vLLM v1's
    /// defaults; with that budget only prompts longer than 2,048 tokens, or those arriving
    /// beside many decodes, are chunked).
    pub fn new(kv_cache: KvCacheConfig, max_model_len: usize) -> Self {
        Self {
            kv_cache,
            max_num_batched_tokens: max_model_len.max(2048),
            enable_chunked_prefill: true,
            max_num_seqs: 256,
            max_model_len,
            enable_prefix_caching: true,
            eviction_policy: EvictionPolicy::Lru,
            tenant_quota: None,
            tiers: None,
        }
    }

    /// Checks that the configuration can always make progress.
    ///
    /// # Errors
    /// [`PagedError::InvalidConfig`] naming the value to change when: a size is 0; there is no
    /// group; a full-attention pool holds fewer than `max_model_len` tokens; a sliding-window
    /// pool holds fewer blocks than one sequence needs (`ceil(W / block_size) + 1`, or
    /// `ceil(max_model_len / block_size)` if smaller); without chunked prefill,
    /// `max_num_batched_tokens` is below `max_model_len` or `max_num_seqs` (with it, 1 token
    /// is enough: decodes beyond the budget wait a step, prompts are cut to fit); tiers without
    /// prefix caching or of 0 blocks.
    pub fn validate(&self) -> Result<()> {
        let bad = |msg: String| Err(PagedError::InvalidConfig(msg));
        let KvCacheConfig { block_size, groups } = &self.kv_cache;
        if *block_size == 0 || self.max_num_seqs == 0 || self.max_model_len == 0 {
            return bad(format!(
                "block_size ({}), max_num_seqs ({}) and max_model_len ({}) must be at least 1",
                block_size, self.max_num_seqs, self.max_model_len
            ));
        }
        if groups.is_empty() {
            return bad("no KV cache group; add at least one KvGroupConfig".into());
        }
        if self.max_num_batched_tokens == 0 {
            return bad("max_num_batched_tokens must be at least 1".into());
        }
        if !self.enable_chunked_prefill
            && self.max_num_batched_tokens < self.max_model_len.max(self.max_num_seqs)
        {
            return bad(format!(
                "max_num_batched_tokens ({}) must be at least max_model_len ({}) and \
                 max_num_seqs ({}) so that any prompt and any decode step fit one step; raise \
                 it, lower the others, or turn chunked prefill on",
                self.max_num_batched_tokens, self.max_model_len, self.max_num_seqs
            ));
        }
        if let Some(t) = &self.tiers {
            if !self.enable_prefix_caching {
                return bad(
                    "tiers hold evicted prefix-cache blocks; turn prefix caching on \
                            or the tiers off"
                        .into(),
                );
            }
            if t.capacity() == 0 {
                return bad("tiers of 0 blocks; give host_blocks or disk_blocks a size".into());
            }
            if t.remote.is_some() && t.host_blocks == 0 {
                return bad(
                    "the remote tier restores through host memory; give host_blocks a size \
                     (--host-tier-blocks)"
                        .into(),
                );
            }
        }
        let seq_blocks = self.max_model_len.div_ceil(*block_size);
        for (g, group) in groups.iter().enumerate() {
            let needed = match group.sliding_window {
                None => seq_blocks,
                Some(0) => return bad(format!("group {g}: sliding_window must be at least 1")),
                Some(w) => seq_blocks.min(max_window_blocks(w, *block_size)),
            };
            if group.num_blocks < needed {
                return bad(format!(
                    "group {g}: {} blocks cannot hold one sequence of max_model_len = {} tokens \
                     (needs {needed} blocks of {}); raise num_blocks or lower max_model_len",
                    group.num_blocks, self.max_model_len, block_size
                ));
            }
        }
        Ok(())
    }
}

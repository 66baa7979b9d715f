//! Scheduler configuration: the pool(s), the per-step budgets and the longest sequence.
//!
//! `validate` rejects every configuration under which the scheduler could wait forever: it
//! demands that one sequence of `max_model_len` tokens fits the pool and a step's token budget on
//! its own (vLLM refuses the same configurations at start-up). With that, a lone sequence can
//! always run to completion, and preempting newer sequences always lets the oldest one progress.

use serde::Serialize;

use crate::{DEFAULT_BLOCK_SIZE, PagedError, Result, max_window_blocks};

/// One KV cache group: a set of layers sharing an attention kind, served by its own pool.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
pub struct KvGroupConfig {
    /// Blocks in this group's pool.
    pub num_blocks: usize,
    /// `None` for full (global) attention; `Some(W)` for sliding-window (local) layers.
    pub sliding_window: Option<usize>,
}

/// Everything the scheduler needs to know up front.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct SchedulerConfig {
    /// Tokens per block, shared by all groups (16 by default, as in vLLM).
    pub block_size: usize,
    /// (num_groups,) the KV cache groups; a plain Llama has one full-attention group.
    pub groups: Vec<KvGroupConfig>,
    /// Most tokens computed in one step (prefill tokens not served by the prefix cache, plus
    /// one per decoding sequence).
    pub max_num_batched_tokens: usize,
    /// Most sequences running at once (so most sequences in one step).
    pub max_num_seqs: usize,
    /// Most tokens (prompt + generated) in any sequence.
    pub max_model_len: usize,
    /// Share cached full blocks between sequences with a common prefix, in every group (a hit
    /// must be served by all groups; sliding-window groups need only the blocks in the window).
    pub enable_prefix_caching: bool,
}

impl SchedulerConfig {
    /// One full-attention group of `num_blocks` blocks of 16 tokens, prefix caching on,
    /// `max_num_seqs = 256` and `max_num_batched_tokens = max(2048, max_model_len)`.
    pub fn new(num_blocks: usize, max_model_len: usize) -> Self {
        Self {
            block_size: DEFAULT_BLOCK_SIZE,
            groups: vec![KvGroupConfig {
                num_blocks,
                sliding_window: None,
            }],
            max_num_batched_tokens: max_model_len.max(2048),
            max_num_seqs: 256,
            max_model_len,
            enable_prefix_caching: true,
        }
    }

    /// Blocks of `block_size` tokens that fit `budget_bytes` of KV memory for one group:
    /// `floor(budget_bytes / (kv_bytes_per_token · block_size))`, where `kv_bytes_per_token =
    /// 2 × n_layers_in_group × n_kv_heads × head_dim × bytes per element` (k and v). Returns 0
    /// when a size is 0.
    pub fn num_blocks_for_memory(
        budget_bytes: usize,
        kv_bytes_per_token: usize,
        block_size: usize,
    ) -> usize {
        match kv_bytes_per_token.checked_mul(block_size) {
            Some(block_bytes) if block_bytes > 0 => budget_bytes / block_bytes,
            _ => 0,
        }
    }

    /// The total number of slots of group `g` (0 for a missing group).
    pub fn num_slots(&self, group: usize) -> usize {
        self.groups
            .get(group)
            .map_or(0, |g| g.num_blocks * self.block_size)
    }

    /// Checks that the configuration can always make progress.
    ///
    /// # Errors
    /// [`PagedError::InvalidConfig`] naming the value to change when: a size is 0; there is no
    /// group; a full-attention pool holds fewer than `max_model_len` tokens; a sliding-window
    /// pool holds fewer blocks than one sequence needs (`ceil(W / block_size) + 1`, or
    /// `ceil(max_model_len / block_size)` if smaller); `max_num_batched_tokens` is below
    /// `max_model_len` or `max_num_seqs`.
    pub fn validate(&self) -> Result<()> {
        let bad = |msg: String| Err(PagedError::InvalidConfig(msg));
        if self.block_size == 0 || self.max_num_seqs == 0 || self.max_model_len == 0 {
            return bad(format!(
                "block_size ({}), max_num_seqs ({}) and max_model_len ({}) must be at least 1",
                self.block_size, self.max_num_seqs, self.max_model_len
            ));
        }
        if self.groups.is_empty() {
            return bad("no KV cache group; add at least one KvGroupConfig".into());
        }
        if self.max_num_batched_tokens < self.max_model_len.max(self.max_num_seqs) {
            return bad(format!(
                "max_num_batched_tokens ({}) must be at least max_model_len ({}) and \
                 max_num_seqs ({}) so that any prompt and any decode step fit one step; raise \
                 it or lower the others",
                self.max_num_batched_tokens, self.max_model_len, self.max_num_seqs
            ));
        }
        let seq_blocks = self.max_model_len.div_ceil(self.block_size);
        for (g, group) in self.groups.iter().enumerate() {
            let needed = match group.sliding_window {
                None => seq_blocks,
                Some(0) => return bad(format!("group {g}: sliding_window must be at least 1")),
                Some(w) => seq_blocks.min(max_window_blocks(w, self.block_size)),
            };
            if group.num_blocks < needed {
                return bad(format!(
                    "group {g}: {} blocks cannot hold one sequence of max_model_len = {} tokens \
                     (needs {needed} blocks of {}); raise num_blocks or lower max_model_len",
                    group.num_blocks, self.max_model_len, self.block_size
                ));
            }
        }
        Ok(())
    }
}

//! [`PoolView`]: who holds which block, the picture of the book's block-table figure as data.
//!
//! `kvlab batch --svg` draws it for one step of a replayed trace, and `kvlab serve` sends it to
//! its live page (`GET /pool`) as JSON, so both show the same thing: every physical block of
//! every KV cache group as free, cached (free, content kept for a prefix hit) or held by one or
//! more sequences (more than one: a shared prefix or a fork), and every live sequence's block
//! tables.

use serde::Serialize;

use crate::{BlockId, EvictionPolicy, Metrics, Scheduler};

/// A snapshot of the pools and the live sequences.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct PoolView {
    /// Most tokens of one sequence.
    pub max_model_len: usize,
    /// Which evictable cached block goes first.
    pub eviction_policy: EvictionPolicy,
    /// (num_groups,) one pool per KV cache group, in group order.
    pub groups: Vec<GroupView>,
    /// The running queue (oldest first), then the waiting queue (head first).
    pub sequences: Vec<SeqView>,
    /// The scheduler's counters and gauges at the same moment.
    pub metrics: Metrics,
}

/// One KV cache group's pool.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct GroupView {
    /// Token slots per block.
    pub block_size: usize,
    /// Sliding window in tokens for a windowed group (`None`: full attention).
    pub sliding_window: Option<usize>,
    /// (num_blocks,) the state of each physical block, indexed by block id.
    pub blocks: Vec<BlockState>,
}

/// A physical block's state.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
#[serde(tag = "state", rename_all = "snake_case")]
pub enum BlockState {
    /// Free, holding nothing worth keeping.
    Free,
    /// Free, but its content is a cached prefix block a later prompt can reuse (evictable).
    Cached,
    /// In the block tables of these sequences (ids, in running-queue order); more than one
    /// means a shared block (prefix cache or fork).
    Held {
        /// The holders' sequence ids.
        seqs: Vec<u64>,
    },
}

/// One live sequence.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct SeqView {
    /// The sequence's id (its `RequestId`).
    pub id: u64,
    /// "running" or "waiting".
    pub status: &'static str,
    /// Tokens in its prompt.
    pub num_prompt_tokens: usize,
    /// Tokens generated so far.
    pub num_output_tokens: usize,
    /// Positions whose k and v are in the cache.
    pub num_computed_tokens: usize,
    /// Times it was preempted (by recompute) so far.
    pub num_preemptions: usize,
    /// (num_groups, blocks) each group's block table; `None` is a block a sliding window has
    /// already freed. Empty tables while waiting.
    pub block_tables: Vec<Vec<Option<BlockId>>>,
}

impl PoolView {
    /// The view of `s` now.
    pub fn of(s: &Scheduler) -> PoolView {
        let groups_cfg = &s.config().kv_cache.groups;
        let live: Vec<u64> = s
            .running()
            .iter()
            .copied()
            .chain(s.waiting())
            .map(|id| id.0)
            .collect();
        let sequences: Vec<SeqView> = live
            .iter()
            .filter_map(|&id| s.sequence(crate::RequestId(id)))
            .map(|seq| SeqView {
                id: seq.id().0,
                status: seq.status().name(),
                num_prompt_tokens: seq.prompt_token_ids().len(),
                num_output_tokens: seq.output_token_ids().len(),
                num_computed_tokens: seq.num_computed_tokens(),
                num_preemptions: seq.num_preemptions(),
                block_tables: seq
                    .block_tables()
                    .iter()
                    .map(|t| t.blocks().to_vec())
                    .collect(),
            })
            .collect();
        let groups = s
            .kv_cache_manager()
            .allocators()
            .iter()
            .enumerate()
            .map(|(g, alloc)| {
                let mut holders: Vec<Vec<u64>> = vec![Vec::new(); alloc.num_blocks()];
                for seq in &sequences {
                    for b in seq.block_tables.get(g).into_iter().flatten().flatten() {
                        if let Some(h) = holders.get_mut(*b as usize) {
                            h.push(seq.id);
                        }
                    }
                }
                let blocks = holders
                    .into_iter()
                    .enumerate()
                    .map(|(b, seqs)| match seqs.is_empty() {
                        false => BlockState::Held { seqs },
                        true if alloc.is_evictable(b as BlockId) => BlockState::Cached,
                        true => BlockState::Free,
                    })
                    .collect();
                GroupView {
                    block_size: alloc.block_size(),
                    sliding_window: groups_cfg.get(g).and_then(|c| c.sliding_window),
                    blocks,
                }
            })
            .collect();
        PoolView {
            max_model_len: s.config().max_model_len,
            eviction_policy: s.config().eviction_policy,
            groups,
            sequences,
            metrics: s.metrics(),
        }
    }
}

//! What one scheduler step hands to the engine, and what finished.
//!
//! A [`ScheduledBatch`] is plain data; the engine needs nothing else to run the step. For each
//! [`ScheduledSeq`] it feeds `token_ids` at `positions`, stores each token's k and v at its slot
//! in every group (skipping `PAD_SLOT`), lets each query at position `p` attend to positions
//! `0..=p` (or the window) through the group's block table, and samples one token from the
//! logits of the last position, unless the step is a chunk of a prompt that continues. Block copies come first: see [`ScheduledBatch`].
//!
//! [`ScheduledBatch::model_input`] flattens the step into the [`crate::ModelInput`] every paged
//! engine executes (`model_input.rs`).

use serde::Serialize;

use crate::{BlockCopy, BlockTable, FinishReason, RequestId};

/// Prefill or decode, as vLLM's attention metadata distinguishes them.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
pub enum StepKind {
    /// A step of the sequence's prefill since admission or readmission: all its tokens after the
    /// cached prefix, or with chunked prefill the next chunk of them (the rest follows in later
    /// steps). `num_cached_tokens` positions are already in the cache and are skipped;
    /// `is_recompute` is true after a preemption.
    Prefill {
        /// Leading positions whose k and v the cache already holds: the prefix-cache hit (or a
        /// tier restore) for the first chunk, that and the earlier chunks for a later one.
        num_cached_tokens: usize,
        /// The sequence was preempted and recomputes its prompt and earlier output tokens.
        is_recompute: bool,
    },
    /// One new token at the end of a running sequence (and with speculative decoding the draft
    /// tokens after it, [`ScheduledSeq::num_draft_tokens`]).
    Decode,
}

/// One sequence's data for one KV cache group.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct GroupStep {
    /// (num_new_tokens,) where to store each fed token's k and v; `PAD_SLOT` (-1) = do not store
    /// (sliding-window key that no later query reads; attend to it from the in-flight k/v).
    pub slot_mapping: Vec<i64>,
    /// (num_logical_blocks,) the sequence's block table after this step's reservations,
    /// `PAD_BLOCK` (-1) for sliding-window holes.
    pub block_table: Vec<i32>,
    /// Copy-on-write copies for this sequence in this group: copy every slot of `src` into `dst`
    /// (all layers of the group, k and v) before any write of the step.
    pub block_copies: Vec<BlockCopy>,
}

/// One sequence of a step.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct ScheduledSeq {
    /// The sequence this row of the step belongs to.
    pub seq_id: RequestId,
    /// (num_new_tokens,) the tokens to feed this step.
    pub token_ids: Vec<u32>,
    /// (num_new_tokens,) their positions, consecutive, ending at `context_len - 1`.
    pub positions: Vec<usize>,
    /// Tokens in the sequence's context after this step: keys at `0..context_len` exist
    /// (cached, or written this step).
    pub context_len: usize,
    /// Prefill (with its cached prefix) or decode.
    pub kind: StepKind,
    /// Whether the step samples a token for it: false for a chunk that does not reach the end of
    /// its prompt (its last row's logits are computed and dropped, as vLLM v1 drops partial
    /// prefills' samples).
    pub samples: bool,
    /// Speculative decoding: the last `num_draft_tokens` of `token_ids` are draft tokens
    /// (guesses after the sequence's last token, [`crate::Scheduler::set_spec_token_ids`]). The
    /// step computes logits for the last `1 + num_draft_tokens` rows, and `update` takes the
    /// drafts the model agreed with plus one token. 0 for prefills and plain decodes.
    pub num_draft_tokens: usize,
    /// (num_groups,) slot mapping, block table and copies per KV cache group.
    pub groups: Vec<GroupStep>,
}

impl ScheduledSeq {
    /// `tokens` fed at positions `start..`, with each group's slots and table read from
    /// `tables` (the sequence's, after this step's reservations) and its copies from `copies`;
    /// `samples` unless a later chunk of the prompt follows.
    pub(crate) fn new(
        seq_id: RequestId,
        (tokens, start): (&[u32], usize),
        (kind, samples): (StepKind, bool),
        tables: &[BlockTable],
        copies: Vec<Vec<BlockCopy>>,
    ) -> Self {
        let end = start + tokens.len();
        let groups = tables.iter().zip(copies);
        Self {
            seq_id,
            token_ids: tokens.to_vec(),
            positions: (start..end).collect(),
            context_len: end,
            kind,
            samples,
            num_draft_tokens: 0,
            groups: groups
                .map(|(t, block_copies)| GroupStep {
                    slot_mapping: t.slot_mapping(start..end),
                    block_table: t.to_row(),
                    block_copies,
                })
                .collect(),
        }
    }

    /// Whether this is a prefill.
    pub fn is_prefill(&self) -> bool {
        matches!(self.kind, StepKind::Prefill { .. })
    }

    /// Tokens fed this step.
    pub fn num_new_tokens(&self) -> usize {
        self.token_ids.len()
    }

    /// The draft tokens the step checks (the tail of `token_ids`).
    pub fn draft_token_ids(&self) -> &[u32] {
        &self.token_ids[self.token_ids.len() - self.num_draft_tokens..]
    }

    /// Rows of logits the step returns for it: its last token's, and each draft token's.
    pub fn num_logits(&self) -> usize {
        1 + self.num_draft_tokens
    }
}

/// One step of continuous batching.
///
/// The caller must, in order: (0) let [`crate::KvCacheManager::move_tier_blocks`] make the tier
/// moves, if any (`driver::execute_step` does; [`crate::KvCacheManager::pending_tier_ops`] lists
/// them); (1) perform every block copy of every sequence and group (all of
/// them before any write: a copy's `src` may be written in place by another sequence of the same
/// step once the copy has dropped its share); (2) run the model on all fed tokens, writing k and
/// v to their slots and attending through the block tables; (3) return one sampled token per
/// sequence that [`ScheduledSeq::samples`] to [`crate::Scheduler::update`] (with draft tokens,
/// the drafts kept and one token more).
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize)]
pub struct ScheduledBatch {
    /// Decodes first (oldest sequence first), then prefills (admission order).
    pub seqs: Vec<ScheduledSeq>,
    /// Sequences preempted by recompute during this step (their blocks are already free; the
    /// engine should drop any per-sequence state it keeps for them).
    pub preempted: Vec<RequestId>,
}

impl ScheduledBatch {
    /// Whether there is nothing to run.
    pub fn is_empty(&self) -> bool {
        self.seqs.is_empty()
    }

    /// Tokens fed this step (the budget `max_num_batched_tokens` bounds it).
    pub fn num_batched_tokens(&self) -> usize {
        self.seqs.iter().map(ScheduledSeq::num_new_tokens).sum()
    }

    /// Sequences the step samples a token for (all but partial prefills).
    pub fn num_sampled(&self) -> usize {
        self.seqs.iter().filter(|s| s.samples).count()
    }

    /// Draft tokens the step checks, over all sequences.
    pub fn num_draft_tokens(&self) -> usize {
        self.seqs.iter().map(|s| s.num_draft_tokens).sum()
    }

    /// Number of prefills (whole prompts or chunks) in the step.
    pub fn num_prefills(&self) -> usize {
        self.seqs.iter().filter(|s| s.is_prefill()).count()
    }

    /// Every block copy of group `group` in this step, to perform before running it.
    pub fn block_copies(&self, group: usize) -> Vec<BlockCopy> {
        self.seqs
            .iter()
            .filter_map(|s| s.groups.get(group))
            .flat_map(|g| g.block_copies.iter().copied())
            .collect()
    }
}

/// A sequence that finished, with everything the caller needs to answer the request.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct FinishedSeq {
    /// The finished sequence; its blocks are already freed.
    pub seq_id: RequestId,
    /// (prompt_len,) its prompt.
    pub prompt_token_ids: Vec<u32>,
    /// (num_output_tokens,) the tokens it generated, a final stop token included.
    pub output_token_ids: Vec<u32>,
    /// Why it finished.
    pub reason: FinishReason,
}

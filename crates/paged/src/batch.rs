//! A step flattened into the arrays a batched kernel takes (vLLM's attention metadata).
//!
//! All sequences' tokens are concatenated into one `(num_tokens,)` batch; `query_start_loc`
//! (cumulative query lengths, FlashAttention's `cu_seqlens_q`) says where each sequence's tokens
//! start. A paged-attention kernel then needs, per group, the `slot_mapping` (where to store each
//! token's k and v) and the padded `block_tables` (where to find each sequence's keys), plus
//! `context_lens` (how many keys each sequence has after the step).

use serde::Serialize;

use crate::allocator::BlockCopy;
use crate::block_table::PaddedBlockTables;
use crate::scheduled_batch::ScheduledBatch;

/// One KV cache group's kernel inputs.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct GroupInput {
    /// (num_tokens,) slot of each token; `PAD_SLOT` (-1) = do not store.
    pub slot_mapping: Vec<i64>,
    /// (num_seqs, max_blocks_per_seq) row-major, `PAD_BLOCK` (-1) padded.
    pub block_tables: PaddedBlockTables,
    /// Copies to perform before anything else in this step.
    pub block_copies: Vec<BlockCopy>,
}

/// A whole step as flat, kernel-ready arrays.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize)]
pub struct ModelInput {
    /// (num_tokens,) token ids of all sequences, concatenated in batch order.
    pub input_ids: Vec<u32>,
    /// (num_tokens,) position of each token within its sequence.
    pub positions: Vec<i64>,
    /// (num_seqs + 1,) `query_start_loc[i]..query_start_loc[i + 1]` are sequence i's tokens.
    pub query_start_loc: Vec<i32>,
    /// (num_seqs,) keys per sequence after this step (`context_len`).
    pub context_lens: Vec<i32>,
    /// (num_seqs,) index into the token axis of each sequence's last token: the rows whose
    /// logits are sampled.
    pub logits_indices: Vec<usize>,
    /// (num_groups,) per-group slot mappings, block tables and copies.
    pub groups: Vec<GroupInput>,
}

impl ScheduledBatch {
    /// Flattens the step for a batched kernel. Counts beyond `i32` saturate (a validated
    /// configuration never gets near).
    pub fn model_input(&self) -> ModelInput {
        let num_groups = self.seqs.first().map_or(0, |s| s.groups.len());
        let to_i32 = |x: usize| i32::try_from(x).unwrap_or(i32::MAX);
        let mut input = ModelInput {
            query_start_loc: vec![0],
            ..ModelInput::default()
        };
        for seq in &self.seqs {
            input.input_ids.extend_from_slice(&seq.token_ids);
            input.positions.extend(
                seq.positions
                    .iter()
                    .map(|&p| i64::try_from(p).unwrap_or(i64::MAX)),
            );
            input.query_start_loc.push(to_i32(input.input_ids.len()));
            input.context_lens.push(to_i32(seq.context_len));
            input
                .logits_indices
                .push(input.input_ids.len().saturating_sub(1));
        }
        for g in 0..num_groups {
            let parts = || self.seqs.iter().filter_map(move |s| s.groups.get(g));
            let rows: Vec<&[i32]> = parts().map(|p| p.block_table.as_slice()).collect();
            input.groups.push(GroupInput {
                slot_mapping: parts()
                    .flat_map(|p| p.slot_mapping.iter().copied())
                    .collect(),
                block_tables: PaddedBlockTables::from_rows(&rows),
                block_copies: self.block_copies(g),
            });
        }
        input
    }
}

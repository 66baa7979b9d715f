//! [`ModelInput`]: one step as the flat arrays every paged engine executes (vLLM's attention
//! metadata): all sequences' tokens concatenated into one `(num_tokens,)` batch;
//! `query_start_loc` (cumulative query lengths, FlashAttention's `cu_seqlens_q`) says where each
//! sequence's tokens start; `logits_indices` which rows' logits are computed (each sequence's
//! last, and with speculative decoding its draft tokens' before it); per KV cache group the
//! `slot_mapping` (where to store each token's k and v) and the padded `block_tables` (where to
//! find each sequence's keys), plus `context_lens` (how many keys each sequence has after the
//! step). [`ModelInput::validate`] holds every check that does not depend on the engine, so the
//! CPU and CUDA engines refuse the same malformed steps with the same reason.

use serde::Serialize;

use crate::{
    BlockCopy, KvCacheConfig, PAD_BLOCK, PAD_SLOT, PaddedBlockTables, PagedError, Result,
    ScheduledBatch,
};

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
            let end = input.input_ids.len();
            input
                .logits_indices
                .extend(end.saturating_sub(seq.num_logits())..end);
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

/// A whole step as flat, kernel-ready arrays: what every paged engine executes.
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
    /// (num_logits,) indices into the token axis of the rows whose logits the step returns, in
    /// order: each sequence's last `1 + num_draft_tokens` rows (its last token's alone without
    /// speculative decoding).
    pub logits_indices: Vec<usize>,
    /// (num_groups,) per-group slot mappings, block tables and copies.
    pub groups: Vec<GroupInput>,
}

/// The first key position a query at `pos` sees under `window` (all of them without one).
pub fn first_key(pos: usize, window: Option<usize>) -> usize {
    window.map_or(0, |w| (pos + 1).saturating_sub(w))
}

impl ModelInput {
    /// Sequences in the step.
    pub fn num_seqs(&self) -> usize {
        self.context_lens.len()
    }

    /// Checks the step against the pool `kv_cache`, a vocabulary of `vocab_size` ids and RoPE
    /// tables of `max_positions` positions: every array its length; token ids in the
    /// vocabulary; each sequence at least one token, its positions consecutive and ending at
    /// `context_len − 1`, below `max_positions`; the logits indices of each sequence a run of
    /// its rows ending at its last token, in order; per group, block ids inside the pool, every slot either `PAD_SLOT` or exactly
    /// `block_table[pos / block_size] · block_size + pos % block_size`, every cached key a query
    /// reads (inside its window) backed by a block, and copies inside the pool between distinct
    /// blocks. What an engine would otherwise read or write out of bounds, or compute wrong.
    ///
    /// # Errors
    /// [`PagedError::MalformedStep`] naming the first violation.
    pub fn validate(
        &self,
        kv_cache: &KvCacheConfig,
        vocab_size: usize,
        max_positions: usize,
    ) -> Result<()> {
        let bad = |msg: String| Err(PagedError::MalformedStep(msg));
        let (n_tokens, n_seqs) = (self.input_ids.len(), self.num_seqs());
        if n_seqs == 0 || n_tokens == 0 {
            return bad("an empty step".into());
        }
        if self.positions.len() != n_tokens
            || self.query_start_loc.len() != n_seqs + 1
            || self.logits_indices.len() < n_seqs
            || self.logits_indices.len() > n_tokens
        {
            return bad(format!(
                "inconsistent lengths: {n_tokens} tokens, {} positions, {} query_start_loc, {} \
                 context_lens, {} logits_indices",
                self.positions.len(),
                self.query_start_loc.len(),
                n_seqs,
                self.logits_indices.len()
            ));
        }
        if self.groups.len() != kv_cache.groups.len() {
            return bad(format!(
                "{} KV groups in the step, the model has {}",
                self.groups.len(),
                kv_cache.groups.len()
            ));
        }
        if let Some(&id) = self.input_ids.iter().find(|&&t| t as usize >= vocab_size) {
            return bad(format!(
                "token id {id} is outside the vocabulary ({vocab_size})"
            ));
        }
        let qsl = &self.query_start_loc;
        if qsl[0] != 0 || qsl[n_seqs] as usize != n_tokens {
            return bad(format!(
                "query_start_loc runs {}..{}, the step has {n_tokens} tokens",
                qsl[0], qsl[n_seqs]
            ));
        }
        let mut logits = self.logits_indices.as_slice();
        for s in 0..n_seqs {
            self.validate_seq(s, max_positions)?;
            logits = self.validate_logits(s, logits)?;
        }
        if let Some(r) = logits.first() {
            return bad(format!(
                "logits indices from {r} are past the last sequence's rows"
            ));
        }
        for g in 0..self.groups.len() {
            self.validate_group(g, kv_cache)?;
        }
        Ok(())
    }

    /// Sequence `s`'s rows: tokens, consecutive positions, logits index.
    fn validate_seq(&self, s: usize, max_positions: usize) -> Result<()> {
        let bad = |msg: String| Err(PagedError::MalformedStep(msg));
        let (a, b) = (self.query_start_loc[s], self.query_start_loc[s + 1]);
        if b <= a || a < 0 {
            return bad(format!(
                "sequence {s} has no tokens (query_start_loc {a}..{b})"
            ));
        }
        let n = (b - a) as usize;
        let ctx = self.context_lens[s];
        if ctx < n as i32 {
            return bad(format!(
                "sequence {s} feeds {n} tokens but its context_len is {ctx}"
            ));
        }
        for r in a as usize..b as usize {
            let want = ctx as i64 - (b as i64 - r as i64);
            let p = self.positions[r];
            if p != want {
                return bad(format!(
                    "token {r} of sequence {s} is at position {p}; positions must be consecutive \
                     and end at context_len - 1 = {}",
                    ctx - 1
                ));
            }
            if p as usize >= max_positions {
                return bad(format!(
                    "position {p} is past the RoPE tables ({max_positions} positions)"
                ));
            }
        }
        Ok(())
    }

    /// Sequence `s`'s logits indices at the head of `logits`: a run of its rows ending at its
    /// last token. Returns the rest.
    fn validate_logits<'a>(&self, s: usize, logits: &'a [usize]) -> Result<&'a [usize]> {
        let (a, b) = (
            self.query_start_loc[s] as usize,
            self.query_start_loc[s + 1] as usize,
        );
        let n = logits.iter().take_while(|&&r| r < b).count();
        let run = (b - n..b).filter(|_| n <= b - a);
        if n == 0 || !logits[..n].iter().copied().eq(run) {
            return Err(PagedError::MalformedStep(format!(
                "logits indices {:?} of sequence {s} are not a run of its rows {a}..{b} ending at \
                 its last token {}",
                &logits[..n],
                b - 1
            )));
        }
        Ok(&logits[n..])
    }

    /// Group `g`'s arrays: lengths, block ids, slots, blocks behind every cached key read,
    /// copies.
    fn validate_group(&self, g: usize, kv_cache: &KvCacheConfig) -> Result<()> {
        let bad = |msg: String| Err(PagedError::MalformedStep(msg));
        let (gi, group, bs) = (&self.groups[g], &kv_cache.groups[g], kv_cache.block_size);
        let (nb, window) = (group.num_blocks, group.sliding_window);
        let (n_tokens, n_seqs, bt) = (self.input_ids.len(), self.num_seqs(), &gi.block_tables);
        if gi.slot_mapping.len() != n_tokens || bt.num_seqs != n_seqs {
            return bad(format!(
                "group {g}: {} slots for {n_tokens} tokens, {} block-table rows for {n_seqs} \
                 sequences",
                gi.slot_mapping.len(),
                bt.num_seqs
            ));
        }
        let outside = |b: i32| b != PAD_BLOCK && (b < 0 || b as usize >= nb);
        if let Some(&b) = bt.data.iter().find(|&&b| outside(b)) {
            return bad(format!(
                "group {g}: block id {b} outside the pool of {nb} blocks"
            ));
        }
        for s in 0..n_seqs {
            let row = bt.row(s).unwrap_or(&[]);
            let block_of = |pos: usize| row.get(pos / bs).copied().unwrap_or(PAD_BLOCK);
            let (a, b) = (
                self.query_start_loc[s] as usize,
                self.query_start_loc[s + 1] as usize,
            );
            let pos0 = self.context_lens[s] as usize - (b - a);
            for (r, pos) in (a..b).zip(pos0..) {
                let slot = gi.slot_mapping[r];
                if slot == PAD_SLOT {
                    continue;
                }
                let block = block_of(pos);
                let want = block as i64 * bs as i64 + (pos % bs) as i64;
                if block == PAD_BLOCK || slot != want {
                    return bad(format!(
                        "group {g}: token {r} (position {pos}) has slot {slot}, its block table \
                         puts it at {want}"
                    ));
                }
            }
            let lo = first_key(pos0, window);
            let mut cached_blocks = (lo / bs..pos0.div_ceil(bs)).filter(|_| lo < pos0);
            if let Some(j) = cached_blocks.find(|j| block_of(j * bs) == PAD_BLOCK) {
                return bad(format!(
                    "group {g}: sequence {s} attends to cached keys in logical block {j}, \
                     which has no physical block"
                ));
            }
        }
        if let Some(c) = (gi.block_copies.iter())
            .find(|c| c.src as usize >= nb || c.dst as usize >= nb || c.src == c.dst)
        {
            return bad(format!(
                "group {g}: block copy {} -> {} outside the pool of {nb} blocks",
                c.src, c.dst
            ));
        }
        Ok(())
    }
}

impl ModelInput {
    /// Copies of this step, each breaking one rule of [`ModelInput::validate`] (for a pool of
    /// `kv_cache` and a vocabulary of `vocab_size`), with a word the refusal names: engines'
    /// tests feed them all, so that every paged engine refuses the same steps. Rules this step
    /// cannot break (a hole under cached keys needs a sequence past its first block) are left
    /// out.
    pub fn malformed_variants(
        &self,
        kv_cache: &KvCacheConfig,
        vocab_size: usize,
    ) -> Vec<(&'static str, ModelInput)> {
        let mut out = vec![("empty", ModelInput::default())];
        let has_rows =
            |g: &GroupInput| !g.block_tables.data.is_empty() && !g.slot_mapping.is_empty();
        if self.input_ids.is_empty() || !self.groups.first().is_some_and(has_rows) {
            return out; // Not a valid step to start from.
        }
        let mut push = |word, corrupt: &dyn Fn(&mut ModelInput)| {
            let mut bad = self.clone();
            corrupt(&mut bad);
            out.push((word, bad));
        };
        let pool = |g: usize| kv_cache.groups.get(g).map_or(0, |g| g.num_blocks);
        push("vocabulary", &|m| m.input_ids[0] = vocab_size as u32);
        push("consecutive", &|m| m.positions[0] += 1);
        push("inconsistent lengths", &|m| {
            m.positions.pop();
        });
        push("query_start_loc", &|m| {
            *m.query_start_loc.last_mut().unwrap_or(&mut 0) += 1
        });
        push("logits indices", &|m| {
            if let Some(i) = m.logits_indices.first_mut() {
                *i += 1;
            }
        });
        push("KV groups", &|m| {
            m.groups.pop();
        });
        push("outside the pool", &|m| {
            m.groups[0].block_tables.data[0] = pool(0) as i32
        });
        push("copy", &|m| {
            m.groups[0].block_copies.push(BlockCopy {
                src: 0,
                dst: pool(0) as u32,
            })
        });
        if self.groups[0].slot_mapping[0] != PAD_SLOT {
            push("slot", &|m| m.groups[0].slot_mapping[0] += 1);
        }
        let bs = kv_cache.block_size;
        let pos0 = self.positions[0] as usize;
        if kv_cache.groups[0].sliding_window.is_none() && pos0 >= bs {
            // The first sequence's first block holds keys its queries read.
            push("no physical block", &|m| {
                m.groups[0].block_tables.data[0] = PAD_BLOCK;
            });
        }
        out
    }
}

//! Paged attention on the CPU: the query at position p of a sequence attends to keys
//! `lo..=p` (lo = max(0, p + 1 − window)). Keys computed before this step are read from the pool
//! by walking the sequence's block table — block `table[j / block_size]`, offset
//! `j % block_size` — and keys of this step's own tokens from the step's rows (as vLLM's prefill
//! reads them: a sliding-window group does not keep a block for every one of them). Softmax and
//! the weighted sum of values are `crate::attention`'s; only where a key lives differs.

use std::ops::Range;

use crate::attention::{Heads, KvRows, Part, attention};
use crate::kv_store::KvStore;

/// One sequence's rows of a step, as the attention sees them.
#[derive(Clone, Copy)]
pub struct SeqSpan<'a> {
    /// Row of this sequence's first new token in the step's activations.
    pub row0: usize,
    /// New tokens this step.
    pub n: usize,
    /// Position of the first new token.
    pub pos0: usize,
    /// Its block table for this layer's group (PAD_BLOCK = −1 for holes). (num_logical_blocks,)
    pub block_table: &'a [i32],
}

/// One layer's pool and the step's own keys and values.
#[derive(Clone, Copy)]
pub struct PagedLayer<'a> {
    /// The layer's pool. (num_blocks · block_size, kv_dim) each
    pub pool_k: &'a KvStore,
    /// (num_blocks · block_size, kv_dim) the layer's values in the pool.
    pub pool_v: &'a KvStore,
    /// Slots per block: positions `b · block_size..(b + 1) · block_size` share a block table entry.
    pub block_size: usize,
    /// Keys and values of every new token of the step, as the pool gives them back (what a
    /// later step reads). (num_tokens, kv_dim) each
    pub k_new: &'a [f32],
    /// (num_tokens, kv_dim) the step's new values, as the pool gives them back.
    pub v_new: &'a [f32],
    /// Elements of one key or value row: n_kv_heads · head_dim.
    pub kv_dim: usize,
}

/// The rows of one sequence: its block table into the pool, its new rows in the step.
#[derive(Clone, Copy)]
struct BlockRows<'a> {
    layer: PagedLayer<'a>,
    seq: SeqSpan<'a>,
}

// ANCHOR: paged_lookup
impl BlockRows<'_> {
    /// Where row j lives: (in the step's rows?, row there).
    #[inline(always)]
    fn at(&self, j: usize) -> (bool, usize) {
        let (s, bs) = (&self.seq, self.layer.block_size);
        if j >= s.pos0 {
            (true, s.row0 + j - s.pos0)
        } else {
            let block = s.block_table[j / bs];
            debug_assert!(block >= 0, "position {j} is in a freed window block");
            (false, block as usize * bs + j % bs)
        }
    }
}
// ANCHOR_END: paged_lookup

impl KvRows for BlockRows<'_> {
    #[inline(always)]
    fn rows<'a>(
        &'a self,
        part: Part,
        j: usize,
        end: usize,
        kv_heads: Range<usize>,
        tile: &'a mut Vec<f32>,
    ) -> &'a [f32] {
        let l = &self.layer;
        let (new, pool) = part.pick((l.k_new, l.pool_k), (l.v_new, l.pool_v));
        match self.run(j, end) {
            (true, rows) => &new[rows.start * l.kv_dim..rows.end * l.kv_dim],
            (false, rows) => pool.read(rows, kv_heads, tile),
        }
    }

    #[inline(always)]
    fn rows_f16(&self, part: Part, j: usize, end: usize) -> Option<&[u16]> {
        let pool = part.pick(self.layer.pool_k, self.layer.pool_v);
        match self.run(j, end) {
            // The step's own rows are f32 until written.
            (true, _) => None,
            (false, rows) => pool.raw_f16(rows),
        }
    }
}

impl BlockRows<'_> {
    /// Where the run from j lives: (in the step's rows?, its rows there). A run ends at the end
    /// of j's block or where the step's own rows begin (those of one sequence are consecutive),
    /// and at end.
    #[inline(always)]
    fn run(&self, j: usize, end: usize) -> (bool, Range<usize>) {
        let (new, row) = self.at(j);
        let (pos0, bs) = (self.seq.pos0, self.layer.block_size);
        let c = if new {
            end - j
        } else {
            (end.min(pos0) - j).min(bs - j % bs)
        };
        (new, row..row + c)
    }
}

// ANCHOR: paged_attention
/// out (num_tokens, n_heads·head_dim) ← attention of every new query q (num_tokens,
/// n_heads·head_dim) over its own sequence's keys; `row_seq[r]` is row r's index in `seqs`.
pub fn paged_attention(
    out: &mut [f32],
    q: &[f32],
    heads: &Heads,
    layer: PagedLayer<'_>,
    seqs: &[SeqSpan<'_>],
    row_seq: &[usize],
) {
    let seq_of = |r: usize| seqs[row_seq[r]];
    attention(
        out,
        q,
        heads,
        |r| {
            let s = seq_of(r);
            s.pos0 + r - s.row0
        },
        |r| row_seq[r],
        |r| BlockRows {
            layer,
            seq: seq_of(r),
        },
    );
}
// ANCHOR_END: paged_attention

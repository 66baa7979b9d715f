//! Paged attention on the CPU: the query at position p of a sequence attends to keys
//! `lo..=p` (lo = max(0, p + 1 − window)). Keys computed before this step are read from the pool
//! by walking the sequence's block table — block `table[j / block_size]`, offset
//! `j % block_size` — and keys of this step's own tokens from the fresh rows, as in the
//! contiguous engine. Softmax and the weighted sum of values are the same maths as
//! `crate::attention`; only where a key lives differs.

use crate::attention::{attend, for_each_head};

/// One sequence of a step, as the attention sees it.
pub struct SeqView<'a> {
    /// Row of this sequence's first new token in the step's activations.
    pub row0: usize,
    /// New tokens this step.
    pub n: usize,
    /// Position of the first new token.
    pub pos0: usize,
    /// Its block table for this layer's group (PAD_BLOCK = −1 for holes). (num_logical_blocks,)
    pub block_table: &'a [i32],
}

/// The inputs of one layer's paged attention over a whole step.
pub struct PagedInput<'a> {
    /// Queries of every new token. (num_tokens, n_heads·head_dim)
    pub q: &'a [f32],
    /// Keys and values of every new token. (num_tokens, kv_dim)
    pub k_new: &'a [f32],
    pub v_new: &'a [f32],
    /// The layer's pool. (num_blocks · block_size, kv_dim)
    pub pool_k: &'a [f32],
    pub pool_v: &'a [f32],
    pub block_size: usize,
    pub seqs: &'a [SeqView<'a>],
    /// For every token row, the index of its sequence in `seqs`. (num_tokens,)
    pub row_seq: &'a [usize],
    pub n_heads: usize,
    pub n_kv_heads: usize,
    pub head_dim: usize,
    pub scale: f32,
    /// Keys visible to a query, its own included (usize::MAX for global layers).
    pub window: usize,
}

/// out (num_tokens, n_heads·head_dim) ← attention of every new query and head.
pub fn paged_attention(out: &mut [f32], a: &PagedInput<'_>) {
    let hd = a.head_dim;
    let work: usize = a
        .seqs
        .iter()
        .map(|s| s.n * (s.pos0 + s.n).min(a.window))
        .sum::<usize>()
        * a.n_heads
        * hd;
    for_each_head(out, hd, work, |o, i, scores| {
        one_head(o, a, i / a.n_heads, i % a.n_heads, scores)
    });
}

// ANCHOR: paged_one_head
fn one_head(o: &mut [f32], a: &PagedInput<'_>, row: usize, h: usize, scores: &mut Vec<f32>) {
    let (hd, kv_dim, bs) = (a.head_dim, a.n_kv_heads * a.head_dim, a.block_size);
    let s = &a.seqs[a.row_seq[row]];
    let g = h / (a.n_heads / a.n_kv_heads);
    let q = &a.q[row * a.n_heads * hd + h * hd..][..hd];
    let p = s.pos0 + (row - s.row0);
    let lo = (p + 1).saturating_sub(a.window);
    // Where key/value j of this head lives: a fresh row of this step, or a pool slot found
    // through the block table.
    let at = |j: usize| -> (bool, usize) {
        if j >= s.pos0 {
            (true, (s.row0 + j - s.pos0) * kv_dim + g * hd)
        } else {
            let block = s.block_table[j / bs];
            debug_assert!(block >= 0, "position {j} is in a freed window block");
            (false, (block as usize * bs + j % bs) * kv_dim + g * hd)
        }
    };
    let key = |j: usize| match at(j) {
        (true, off) => &a.k_new[off..off + hd],
        (false, off) => &a.pool_k[off..off + hd],
    };
    let val = |j: usize| match at(j) {
        (true, off) => &a.v_new[off..off + hd],
        (false, off) => &a.pool_v[off..off + hd],
    };
    attend(o, q, a.scale, lo..=p, key, val, scores);
}
// ANCHOR_END: paged_one_head

//! Causal attention of new queries over the KV cache, one (query, head) pair per task.
//!
//! For the query at position p and head h (KV head g = h / (n_heads / n_kv_heads), GQA/MQA):
//!   s_j = (q_h · k_{g,j}) · scale            for j in lo..=p, lo = max(0, p + 1 − window)
//!   a   = softmax(s)
//!   o_h = Σ_j a_j v_{g,j}                      (axpy per key)
//! Keys of positions before this call come from the cache (slot j % cap); keys of the call's own
//! tokens come from the fresh `k_new`/`v_new` rows, because a ring buffer shorter than the prompt
//! must not be overwritten before the earlier queries have read it.

use rayon::prelude::*;

use crate::simd;

/// The inputs of one layer's attention.
pub struct AttentionInput<'a> {
    /// Queries of the new tokens. (t, n_heads·head_dim)
    pub q: &'a [f32],
    /// Keys and values of the new tokens. (t, kv_dim) each
    pub k_new: &'a [f32],
    pub v_new: &'a [f32],
    /// The layer's cache, slots `pos % cap`. (cap, kv_dim) each
    pub cache_k: &'a [f32],
    pub cache_v: &'a [f32],
    pub cap: usize,
    /// Position of the first new token.
    pub pos0: usize,
    pub n_heads: usize,
    pub n_kv_heads: usize,
    pub head_dim: usize,
    pub scale: f32,
    /// Keys visible to a query, its own included (usize::MAX for global layers).
    pub window: usize,
}

/// Below this many multiply-adds the heads run on the calling thread.
const PAR_MIN_WORK: usize = 1 << 14;

/// out (t, n_heads·head_dim) ← attention of every new query and head.
pub fn attention(out: &mut [f32], a: &AttentionInput<'_>) {
    let hd = a.head_dim;
    let t = a.q.len() / (a.n_heads * hd);
    let work = t * a.n_heads * (a.pos0 + t).min(a.window) * hd;
    for_each_head(out, hd, work, |o, i, scores| {
        one_head(o, a, i / a.n_heads, i % a.n_heads, scores)
    });
}

/// Calls `f(out_head, index, scores)` for every head_dim-wide chunk of `out` (index = query row ×
/// n_heads + head), on the calling thread below [`PAR_MIN_WORK`] multiply-adds, across rayon's
/// threads above; `scores` is scratch reused across the heads one thread handles.
pub(crate) fn for_each_head(
    out: &mut [f32],
    hd: usize,
    work: usize,
    f: impl Fn(&mut [f32], usize, &mut Vec<f32>) + Sync,
) {
    if work < PAR_MIN_WORK {
        let mut scores = Vec::new();
        out.chunks_exact_mut(hd)
            .enumerate()
            .for_each(|(i, o)| f(o, i, &mut scores));
    } else {
        out.par_chunks_exact_mut(hd)
            .enumerate()
            .for_each_init(Vec::new, |scores, (i, o)| f(o, i, scores));
    }
}

/// o (head_dim,) ← attention of new query `t`, head `h`.
// ANCHOR: one_head
fn one_head(o: &mut [f32], a: &AttentionInput<'_>, t: usize, h: usize, scores: &mut Vec<f32>) {
    let (hd, kv_dim) = (a.head_dim, a.n_kv_heads * a.head_dim);
    let g = h / (a.n_heads / a.n_kv_heads);
    let q = &a.q[(t * a.n_heads + h) * hd..][..hd];
    let p = a.pos0 + t;
    let lo = (p + 1).saturating_sub(a.window);
    // Row of key/value j: in the fresh rows if this call computed it, else in its cache slot.
    let row = |j: usize| {
        let r = if j >= a.pos0 { j - a.pos0 } else { j % a.cap };
        r * kv_dim + g * hd..r * kv_dim + (g + 1) * hd
    };
    let key = |j: usize| {
        if j >= a.pos0 {
            &a.k_new[row(j)]
        } else {
            &a.cache_k[row(j)]
        }
    };
    let val = |j: usize| {
        if j >= a.pos0 {
            &a.v_new[row(j)]
        } else {
            &a.cache_v[row(j)]
        }
    };

    attend(o, q, a.scale, lo..=p, key, val, scores);
}

/// The attention of one query over keys and values `keys` (wherever they live):
/// s_j = (q · k_j) · scale, a = softmax(s), o = Σ_j a_j v_j.
pub(crate) fn attend<'k>(
    o: &mut [f32],
    q: &[f32],
    scale: f32,
    keys: std::ops::RangeInclusive<usize>,
    key: impl Fn(usize) -> &'k [f32],
    val: impl Fn(usize) -> &'k [f32],
    scores: &mut Vec<f32>,
) {
    scores.clear();
    scores.extend(keys.clone().map(|j| simd::dot_short(q, key(j)) * scale));
    kvlab_model::ops::softmax(scores);
    o.fill(0.0);
    for (j, &w) in keys.zip(scores.iter()) {
        simd::axpy_short(o, w, val(j));
    }
}
// ANCHOR_END: one_head

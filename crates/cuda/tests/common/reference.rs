//! Scalar CPU references of the kernels, written for clarity and kept beside the kernel tests
//! (as llm.c keeps its CPU references), not in the library: `gpu_kernels` runs each kernel on
//! random inputs and compares with these. The attention reference reads keys exactly as the
//! kernels do — the step's own rows for positions at or after the step's first, the paged pool
//! through the block table before it — but with a plain two-pass softmax
//! (`kvlab_model::ops::softmax`), not the online one.

use kvlab_model::ops;

/// y (rows, n) = rmsnorm of each row of x with gain w (n,).
pub fn rmsnorm_rows(x: &[f32], w: &[f32], n: usize, eps: f32) -> Vec<f32> {
    let mut y = vec![0.0; x.len()];
    for (yr, xr) in y.chunks_exact_mut(n).zip(x.chunks_exact(n)) {
        ops::rmsnorm(yr, xr, w, eps);
    }
    y
}

/// One attention call on the host, all f32: a batch of sequences over a paged pool, the leading
/// `n_decode` decoding (one query each), the rest prefilling. The fields of
/// `kvlab_cuda::ops::AttentionArgs`, as host vectors the GPU test uploads.
pub struct AttnCase {
    /// (n_tokens, n_heads, head_dim)
    pub q: Vec<f32>,
    /// (n_tokens, n_kv_heads, head_dim) each
    pub k_new: Vec<f32>,
    pub v_new: Vec<f32>,
    /// (num_slots, n_kv_heads, head_dim) each
    pub k_cache: Vec<f32>,
    pub v_cache: Vec<f32>,
    /// (n_seqs, max_blocks)
    pub block_tables: Vec<i32>,
    pub max_blocks: usize,
    /// (n_seqs + 1,)
    pub query_start_loc: Vec<i32>,
    /// (n_seqs,)
    pub context_lens: Vec<i32>,
    /// (n_tokens,): each token's sequence
    pub token_seq: Vec<i32>,
    pub n_decode: usize,
    pub n_heads: usize,
    pub n_kv_heads: usize,
    pub head_dim: usize,
    pub block_size: usize,
    pub window: Option<usize>,
    pub scale: f32,
}

impl AttnCase {
    pub fn n_tokens(&self) -> usize {
        self.token_seq.len()
    }

    pub fn num_slots(&self) -> usize {
        self.k_cache.len() / (self.n_kv_heads * self.head_dim)
    }
}

/// out (n_tokens, n_heads, head_dim): causal (windowed) attention of every query.
pub fn attention(a: &AttnCase) -> Vec<f32> {
    let (h_n, hd, kvh) = (a.n_heads, a.head_dim, a.n_kv_heads);
    let mut out = vec![0.0; a.n_tokens() * h_n * hd];
    for s in 0..a.context_lens.len() {
        let (q0, q1) = (
            a.query_start_loc[s] as usize,
            a.query_start_loc[s + 1] as usize,
        );
        let ctx = a.context_lens[s] as usize;
        let pos0 = ctx - (q1 - q0);
        let table = &a.block_tables[s * a.max_blocks..(s + 1) * a.max_blocks];
        // Offset of position j's vector for KV head g, and whether it is in the step's rows.
        let at = |j: usize, g: usize| -> (bool, usize) {
            if j >= pos0 {
                (true, ((q0 + j - pos0) * kvh + g) * hd)
            } else {
                let block = table[j / a.block_size] as usize;
                let slot = block * a.block_size + j % a.block_size;
                (false, (slot * kvh + g) * hd)
            }
        };
        for r in q0..q1 {
            let p = pos0 + (r - q0);
            let lo = kvlab_cuda::launch::first_key(p, a.window);
            for h in 0..h_n {
                let g = h / (h_n / kvh);
                let q = &a.q[(r * h_n + h) * hd..][..hd];
                let mut scores: Vec<f32> = (lo..=p)
                    .map(|j| {
                        let (fresh, off) = at(j, g);
                        let k = if fresh { &a.k_new } else { &a.k_cache };
                        ops::dot(q, &k[off..off + hd]) * a.scale
                    })
                    .collect();
                ops::softmax(&mut scores);
                let o = &mut out[(r * h_n + h) * hd..][..hd];
                for (j, &w) in (lo..=p).zip(&scores) {
                    let (fresh, off) = at(j, g);
                    let v = if fresh { &a.v_new } else { &a.v_cache };
                    ops::axpy(o, w, &v[off..off + hd]);
                }
            }
        }
    }
    out
}

/// Stores rows of k, v (n_tokens, kv_dim) at `slots` of the caches (num_slots, kv_dim); -1 skips.
pub fn reshape_and_cache(
    k: &[f32],
    v: &[f32],
    k_cache: &mut [f32],
    v_cache: &mut [f32],
    slots: &[i32],
    kv_dim: usize,
) {
    for (t, &slot) in slots.iter().enumerate() {
        if slot < 0 {
            continue;
        }
        let (src, dst) = (t * kv_dim, slot as usize * kv_dim);
        k_cache[dst..dst + kv_dim].copy_from_slice(&k[src..src + kv_dim]);
        v_cache[dst..dst + kv_dim].copy_from_slice(&v[src..src + kv_dim]);
    }
}

/// y (t, out) = x (t, in) @ w (out, in)ᵀ.
pub fn linear(x: &[f32], w: &[f32], in_dim: usize, out_dim: usize) -> Vec<f32> {
    let t = x.len() / in_dim;
    let mut y = vec![0.0; t * out_dim];
    for (yr, xr) in y.chunks_exact_mut(out_dim).zip(x.chunks_exact(in_dim)) {
        ops::matvec(yr, w, xr);
    }
    y
}

/// Normwise relative error `max_i |g_i − r_i| / max_i |r_i|` (the absolute error when the
/// reference is all zeros), or infinity if `got` holds a NaN or an infinity anywhere: NaN never
/// passes, and an element a kernel left unwritten keeps its NaN poison and fails here.
pub fn rel_err(got: &[f32], want: &[f32]) -> f32 {
    assert_eq!(got.len(), want.len(), "lengths differ");
    if got.iter().any(|g| !g.is_finite()) {
        return f32::INFINITY;
    }
    let scale = want.iter().fold(0.0f32, |m, r| m.max(r.abs()));
    let diff = got
        .iter()
        .zip(want)
        .fold(0.0f32, |m, (g, r)| m.max((g - r).abs()));
    let e = if scale > 0.0 { diff / scale } else { diff };
    if e.is_nan() { f32::INFINITY } else { e }
}

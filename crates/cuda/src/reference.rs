//! Scalar CPU references of the kernels, written for clarity: the GPU tests run each kernel on
//! random inputs and compare with these (DESIGN: every fast kernel has a scalar reference beside
//! it). The attention reference reads keys exactly as the kernels do — the step's own rows for
//! positions at or after the step's first, the paged pool through the block table before it —
//! but with a plain two-pass softmax (`kvlab_model::ops::softmax`), not the online one.

use kvlab_model::ops;

/// y (rows, n) = rmsnorm of each row of x with gain w (n,).
pub fn rmsnorm_rows(x: &[f32], w: &[f32], n: usize, eps: f32) -> Vec<f32> {
    let mut y = vec![0.0; x.len()];
    for (yr, xr) in y.chunks_exact_mut(n).zip(x.chunks_exact(n)) {
        ops::rmsnorm(yr, xr, w, eps);
    }
    y
}

/// The inputs of one attention call, all f32, shapes as in `ops::AttentionArgs`.
pub struct AttentionInput<'a> {
    /// (n_tokens, n_heads, head_dim)
    pub q: &'a [f32],
    /// (n_tokens, n_kv_heads, head_dim) each
    pub k_new: &'a [f32],
    pub v_new: &'a [f32],
    /// (num_slots, n_kv_heads, head_dim) each
    pub k_cache: &'a [f32],
    pub v_cache: &'a [f32],
    /// (n_seqs, max_blocks)
    pub block_tables: &'a [i32],
    pub max_blocks: usize,
    /// (n_seqs + 1,)
    pub query_start_loc: &'a [i32],
    /// (n_seqs,)
    pub context_lens: &'a [i32],
    pub n_heads: usize,
    pub n_kv_heads: usize,
    pub head_dim: usize,
    pub block_size: usize,
    pub window: Option<usize>,
    pub scale: f32,
}

/// out (n_tokens, n_heads, head_dim): causal (windowed) attention of every query.
pub fn attention(a: &AttentionInput<'_>) -> Vec<f32> {
    let (h_n, hd, kvh) = (a.n_heads, a.head_dim, a.n_kv_heads);
    let n_tokens = a.q.len() / (h_n * hd);
    let mut out = vec![0.0; n_tokens * h_n * hd];
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
            let lo = crate::launch::first_key(p, a.window);
            for h in 0..h_n {
                let g = h / (h_n / kvh);
                let q = &a.q[(r * h_n + h) * hd..][..hd];
                let mut scores: Vec<f32> = (lo..=p)
                    .map(|j| {
                        let (fresh, off) = at(j, g);
                        let k = if fresh { a.k_new } else { a.k_cache };
                        ops::dot(q, &k[off..off + hd]) * a.scale
                    })
                    .collect();
                ops::softmax(&mut scores);
                let o = &mut out[(r * h_n + h) * hd..][..hd];
                for (j, &w) in (lo..=p).zip(&scores) {
                    let (fresh, off) = at(j, g);
                    let v = if fresh { a.v_new } else { a.v_cache };
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

/// The GPU forward pass (`forward.rs`) mirrored on the CPU with the references above: the same
/// packed step (`launch::pack_step`'s arena is what it reads), the same pool layout, the same
/// order of operations (copies first; per layer reshape_and_cache then attention reading this
/// step's keys from its rows and earlier keys through the block table). Driven by the scheduler
/// against the naive engine it checks the engine's bookkeeping and data flow without a GPU; the
/// GPU tests then only need each kernel to match its reference.
pub struct HostForward {
    model: std::sync::Arc<kvlab_model::Model>,
    geometry: crate::launch::PackGeometry,
    /// Per layer, K and V pools (num_slots, kv_dim).
    k: Vec<Vec<f32>>,
    v: Vec<Vec<f32>>,
    /// Per distinct theta: cos and sin (max_pos, head_dim/2); and each layer's index.
    tables: Vec<(Vec<f32>, Vec<f32>)>,
    of_layer: Vec<usize>,
}

impl HostForward {
    /// A pool of `num_blocks` blocks of `block_size` per group, filled with NaN (a read of a
    /// never-written slot poisons the result).
    pub fn new(
        model: std::sync::Arc<kvlab_model::Model>,
        num_blocks: usize,
        block_size: usize,
    ) -> HostForward {
        let c = &model.config;
        let slots = num_blocks * block_size * c.kv_dim();
        let rope = kvlab_model::rope::RopeTables::for_config(c, c.max_seq_len);
        let of_layer = rope.of_layer;
        let tables = rope.tables.into_iter().map(|t| (t.cos, t.sin)).collect();
        HostForward {
            geometry: crate::launch::PackGeometry {
                vocab_size: c.vocab_size,
                max_positions: c.max_seq_len,
                num_blocks,
                block_size,
                windows: c.kv_cache_groups(),
            },
            k: vec![vec![f32::NAN; slots]; c.n_layers],
            v: vec![vec![f32::NAN; slots]; c.n_layers],
            tables,
            of_layer,
            model,
        }
    }

    /// Runs a packed step; returns each sequence's logits.
    pub fn step(&mut self, p: &crate::launch::PackedStep) -> Vec<Vec<f32>> {
        let c = &self.model.config;
        let w = &self.model.weights;
        let ints = &p.ints;
        let (d, hd, qd, kvd, hid) = (c.dim, c.head_dim, c.q_dim(), c.kv_dim(), c.hidden_dim);
        let bs = self.geometry.block_size;
        for (g, gm) in p.groups.iter().enumerate() {
            for pair in ints[gm.copies.clone()].chunks_exact(2) {
                let (src, dst) = (pair[0] as usize * bs * kvd, pair[1] as usize * bs * kvd);
                for l in (0..c.n_layers).filter(|&l| c.layer_cache_group(l) == g) {
                    self.k[l].copy_within(src..src + bs * kvd, dst);
                    self.v[l].copy_within(src..src + bs * kvd, dst);
                }
            }
        }
        let ids = &ints[p.input_ids.clone()];
        let positions = &ints[p.positions.clone()];
        let mut x: Vec<f32> = ids
            .iter()
            .flat_map(|&t| {
                w.token_embedding[t as usize * d..][..d]
                    .iter()
                    .map(|e| e * c.embed_scale)
            })
            .collect();
        let neox = c.rope_layout == kvlab_model::RopeLayout::Neox;
        for (l, lw) in w.layers.iter().enumerate() {
            let xn = rmsnorm_rows(&x, &lw.attn_norm, d, c.norm_eps);
            let mut q = linear(&xn, &lw.wq, d, qd);
            let mut k = linear(&xn, &lw.wk, d, kvd);
            let v = linear(&xn, &lw.wv, d, kvd);
            if c.qk_norm {
                q = rmsnorm_rows(&q, &lw.q_norm, hd, c.norm_eps);
                k = rmsnorm_rows(&k, &lw.k_norm, hd, c.norm_eps);
            }
            let (cos, sin) = &self.tables[self.of_layer[l]];
            for (i, &pos) in positions.iter().enumerate() {
                let pos = pos as usize;
                crate::rope::apply_table(&mut q[i * qd..][..qd], cos, sin, pos, hd, neox);
                crate::rope::apply_table(&mut k[i * kvd..][..kvd], cos, sin, pos, hd, neox);
            }
            let gm = &p.groups[c.layer_cache_group(l)];
            let slots = &ints[gm.slot_mapping.clone()];
            reshape_and_cache(&k, &v, &mut self.k[l], &mut self.v[l], slots, kvd);
            let att = attention(&AttentionInput {
                q: &q,
                k_new: &k,
                v_new: &v,
                k_cache: &self.k[l],
                v_cache: &self.v[l],
                block_tables: &ints[gm.block_tables.clone()],
                max_blocks: gm.max_blocks,
                query_start_loc: &ints[p.query_start_loc.clone()],
                context_lens: &ints[p.context_lens.clone()],
                n_heads: c.n_heads,
                n_kv_heads: c.n_kv_heads,
                head_dim: hd,
                block_size: bs,
                window: gm.window,
                scale: c.attn_scale,
            });
            let mut o = linear(&att, &lw.wo, qd, d);
            if c.post_norms {
                o = rmsnorm_rows(&o, &lw.post_attn_norm, d, c.norm_eps);
            }
            x.iter_mut().zip(&o).for_each(|(x, o)| *x += o);
            let xn = rmsnorm_rows(&x, &lw.ffn_norm, d, c.norm_eps);
            let mut gate = linear(&xn, &lw.w1, d, hid);
            let up = linear(&xn, &lw.w3, d, hid);
            ops::glu(&mut gate, &up, c.activation);
            let mut o = linear(&gate, &lw.w2, hid, d);
            if c.post_norms {
                o = rmsnorm_rows(&o, &lw.post_ffn_norm, d, c.norm_eps);
            }
            x.iter_mut().zip(&o).for_each(|(x, o)| *x += o);
        }
        ints[p.logits_rows.clone()]
            .iter()
            .map(|&r| {
                let last = rmsnorm_rows(&x[r as usize * d..][..d], &w.final_norm, d, c.norm_eps);
                linear(&last, w.classifier(), d, c.vocab_size)
            })
            .collect()
    }
}

impl kvlab_paged::StepExecutor for HostForward {
    type Error = crate::CudaError;

    fn execute(
        &mut self,
        batch: &kvlab_paged::ScheduledBatch,
    ) -> Result<Vec<Vec<f32>>, crate::CudaError> {
        let p = crate::launch::pack_step(&batch.model_input(), &self.geometry)?;
        Ok(self.step(&p))
    }
}

/// A small deterministic generator for test inputs (xorshift64*), so the GPU tests need no
/// extra dependency and every run sees the same numbers.
pub struct Rng(u64);

impl Rng {
    pub fn new(seed: u64) -> Rng {
        Rng(seed.wrapping_mul(0x9E37_79B9_7F4A_7C15) | 1)
    }

    /// Uniform in [0, 1).
    pub fn next_f32(&mut self) -> f32 {
        self.0 ^= self.0 >> 12;
        self.0 ^= self.0 << 25;
        self.0 ^= self.0 >> 27;
        let bits = self.0.wrapping_mul(0x2545_F491_4F6C_DD1D) >> 40;
        bits as f32 / (1u64 << 24) as f32
    }

    /// Uniform in [-a, a).
    pub fn sym(&mut self, a: f32) -> f32 {
        (2.0 * self.next_f32() - 1.0) * a
    }

    /// `n` values uniform in [-a, a).
    pub fn vec(&mut self, n: usize, a: f32) -> Vec<f32> {
        (0..n).map(|_| self.sym(a)).collect()
    }

    /// Uniform in 0..n.
    pub fn below(&mut self, n: usize) -> usize {
        ((self.next_f32() as f64 * n as f64) as usize).min(n.saturating_sub(1))
    }
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

#[cfg(test)]
mod tests {
    use super::*;

    /// The paged reference, with keys scattered over shuffled blocks and some read from the
    /// step's rows, equals plain contiguous attention of the same sequence.
    #[test]
    fn paged_reference_equals_contiguous_attention() {
        let mut rng = Rng::new(3);
        let (h_n, kvh, hd, bs) = (4, 2, 8, 4);
        let kv_dim = kvh * hd;
        let (ctx, n_new) = (11, 3); // keys 0..8 cached, 8..11 new
        let pos0 = ctx - n_new;
        let k_all = rng.vec(ctx * kv_dim, 1.0);
        let v_all = rng.vec(ctx * kv_dim, 1.0);
        let q = rng.vec(n_new * h_n * hd, 1.0);
        let table = [5i32, 1, 3]; // logical blocks 0..3 → physical
        let num_slots = 6 * bs;
        let (mut kc, mut vc) = (
            vec![f32::NAN; num_slots * kv_dim],
            vec![f32::NAN; num_slots * kv_dim],
        );
        let slots: Vec<i32> = (0..pos0)
            .map(|j| table[j / bs] * bs as i32 + (j % bs) as i32)
            .collect();
        reshape_and_cache(&k_all, &v_all, &mut kc, &mut vc, &slots, kv_dim);
        for window in [None, Some(5)] {
            let got = attention(&AttentionInput {
                q: &q,
                k_new: &k_all[pos0 * kv_dim..],
                v_new: &v_all[pos0 * kv_dim..],
                k_cache: &kc,
                v_cache: &vc,
                block_tables: &table,
                max_blocks: 3,
                query_start_loc: &[0, n_new as i32],
                context_lens: &[ctx as i32],
                n_heads: h_n,
                n_kv_heads: kvh,
                head_dim: hd,
                block_size: bs,
                window,
                scale: 0.35,
            });
            for i in 0..n_new {
                let p = pos0 + i;
                let lo = crate::launch::first_key(p, window);
                for h in 0..h_n {
                    let g = h / (h_n / kvh);
                    let qh = &q[(i * h_n + h) * hd..][..hd];
                    let mut s: Vec<f32> = (lo..=p)
                        .map(|j| ops::dot(qh, &k_all[j * kv_dim + g * hd..][..hd]) * 0.35)
                        .collect();
                    ops::softmax(&mut s);
                    let mut want = vec![0.0; hd];
                    for (j, w) in (lo..=p).zip(s) {
                        ops::axpy(&mut want, w, &v_all[j * kv_dim + g * hd..][..hd]);
                    }
                    let o = &got[(i * h_n + h) * hd..][..hd];
                    assert!(rel_err(o, &want) < 1e-6, "{window:?} {i} {h}");
                }
            }
        }
    }

    #[test]
    fn errors_flag_nan_and_infinity() {
        assert_eq!(rel_err(&[1.0, 2.0], &[1.0, 2.0]), 0.0);
        assert!(rel_err(&[f32::NAN], &[1.0]).is_infinite());
        assert!(rel_err(&[f32::INFINITY], &[1.0]).is_infinite());
        assert!((rel_err(&[1.1, -2.0], &[1.0, -2.0]) - 0.05).abs() < 1e-6);
        assert_eq!(rel_err(&[0.5], &[0.0]), 0.5);
        let mut r = Rng::new(1);
        let v = r.vec(1000, 2.0);
        assert!(v.iter().all(|x| (-2.0..2.0).contains(x)));
        assert!(v.iter().any(|&x| x < -1.0) && v.iter().any(|&x| x > 1.0));
        assert!((0..100).all(|_| r.below(7) < 7));
    }

    #[test]
    fn linear_is_x_times_w_transposed() {
        let y = linear(&[1.0, 2.0, 3.0, 4.0], &[1.0, 0.0, 0.0, 1.0, 1.0, 1.0], 2, 3);
        assert_eq!(y, vec![1.0, 2.0, 3.0, 3.0, 4.0, 7.0]);
    }
}

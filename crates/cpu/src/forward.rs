//! The forward pass of the cached engine over `t` new tokens at positions `pos0..pos0+t`.
//! `t = 1` is a decode step (GEMVs), `t > 1` a prefill (sgemm); both write every new position's K
//! and V into the cache in place and attend over the cache plus the new rows.

use kvlab_model::{LayerKind, Model, ops};

use crate::attention::{AttentionInput, attention};
use crate::kv_cache::KvCache;
use crate::linear::{gemv, linear};
use crate::rope::RopeTable;

/// Runs `tokens` and returns the logits (vocab_size,) of the last one.
pub fn forward(model: &Model, rope: &[RopeTable], cache: &mut KvCache, tokens: &[u32]) -> Vec<f32> {
    let c = &model.config;
    let w = &model.weights;
    let t = tokens.len();
    let pos0 = cache.len;
    let (d, hd, qd, kvd, hid) = (c.dim, c.head_dim, c.q_dim(), c.kv_dim(), c.hidden_dim);

    // Activations for the t new tokens, row-major.
    let mut x = vec![0.0f32; t * d]; // (t, dim) residual stream
    let mut xn = vec![0.0f32; t * d]; // (t, dim) normalised
    let mut q = vec![0.0f32; t * qd]; // (t, q_dim)
    let mut k = vec![0.0f32; t * kvd]; // (t, kv_dim)
    let mut v = vec![0.0f32; t * kvd]; // (t, kv_dim)
    let mut att = vec![0.0f32; t * qd]; // (t, q_dim)
    let mut o = vec![0.0f32; t * d]; // (t, dim)
    let mut gate = vec![0.0f32; t * hid]; // (t, hidden_dim)
    let mut up = vec![0.0f32; t * hid]; // (t, hidden_dim)

    for (row, &tok) in x.chunks_exact_mut(d).zip(tokens) {
        let e = &w.token_embedding[tok as usize * d..(tok as usize + 1) * d];
        row.iter_mut()
            .zip(e)
            .for_each(|(r, &e)| *r = e * c.embed_scale);
    }

    for (l, lw) in w.layers.iter().enumerate() {
        // Attention block.
        rmsnorm_rows(&mut xn, &x, &lw.attn_norm, d, c.norm_eps);
        linear(&mut q, &xn, &lw.wq, t, d, qd);
        linear(&mut k, &xn, &lw.wk, t, d, kvd);
        linear(&mut v, &xn, &lw.wv, t, d, kvd);
        if c.qk_norm {
            q.chunks_exact_mut(hd)
                .for_each(|h| ops::rmsnorm_in_place(h, &lw.q_norm, c.norm_eps));
            k.chunks_exact_mut(hd)
                .for_each(|h| ops::rmsnorm_in_place(h, &lw.k_norm, c.norm_eps));
        }
        let table = rope
            .iter()
            .find(|r| r.theta == c.rope_theta_for(l))
            .expect("a table per theta");
        for i in 0..t {
            table.apply(&mut q[i * qd..(i + 1) * qd], pos0 + i, c.rope_layout);
            table.apply(&mut k[i * kvd..(i + 1) * kvd], pos0 + i, c.rope_layout);
        }
        let window = match c.layer_kinds[l] {
            LayerKind::Global => usize::MAX,
            LayerKind::Local { window } => window,
        };
        {
            let (cache_k, cache_v) = cache.layer(l);
            let input = AttentionInput {
                q: &q,
                k_new: &k,
                v_new: &v,
                cache_k,
                cache_v,
                cap: cache.cap(l),
                pos0,
                n_heads: c.n_heads,
                n_kv_heads: c.n_kv_heads,
                head_dim: hd,
                scale: c.attn_scale,
                window,
            };
            attention(&mut att, &input);
        }
        // Only now write the new K and V into the cache: with a ring buffer shorter than `t`,
        // only the last `cap` of them survive, and earlier queries above still needed the rest.
        for i in t.saturating_sub(cache.cap(l))..t {
            cache.write(
                l,
                pos0 + i,
                &k[i * kvd..(i + 1) * kvd],
                &v[i * kvd..(i + 1) * kvd],
            );
        }
        linear(&mut o, &att, &lw.wo, t, qd, d);
        if c.post_norms {
            o.chunks_exact_mut(d)
                .for_each(|r| ops::rmsnorm_in_place(r, &lw.post_attn_norm, c.norm_eps));
        }
        x.iter_mut().zip(&o).for_each(|(x, o)| *x += o);

        // Feed-forward block: W2 (act(W1 x) ⊙ W3 x).
        rmsnorm_rows(&mut xn, &x, &lw.ffn_norm, d, c.norm_eps);
        linear(&mut gate, &xn, &lw.w1, t, d, hid);
        linear(&mut up, &xn, &lw.w3, t, d, hid);
        ops::glu(&mut gate, &up, c.activation);
        linear(&mut o, &gate, &lw.w2, t, hid, d);
        if c.post_norms {
            o.chunks_exact_mut(d)
                .for_each(|r| ops::rmsnorm_in_place(r, &lw.post_ffn_norm, c.norm_eps));
        }
        x.iter_mut().zip(&o).for_each(|(x, o)| *x += o);
    }
    cache.len = pos0 + t;

    // Logits of the last token only: W_cls (vocab, dim) @ rmsnorm(x_last).
    let last = &x[(t - 1) * d..];
    let mut xl = vec![0.0f32; d];
    ops::rmsnorm(&mut xl, last, &w.final_norm, c.norm_eps);
    let mut logits = vec![0.0f32; c.vocab_size];
    gemv(&mut logits, w.classifier(), &xl);
    logits
}

/// RMSNorm of each row of x (t, d) into out (t, d).
fn rmsnorm_rows(out: &mut [f32], x: &[f32], w: &[f32], d: usize, eps: f32) {
    for (o, r) in out.chunks_exact_mut(d).zip(x.chunks_exact(d)) {
        ops::rmsnorm(o, r, w, eps);
    }
}

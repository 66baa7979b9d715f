//! The forward pass over a whole token sequence, in ndarray, one equation per line.
//!
//! Shapes: T = number of tokens, d = dim, h = hidden_dim, q = n_heads·head_dim,
//! kv = n_kv_heads·head_dim. Weight matrices are stored (out, in), so `x (T, in) @ Wᵀ` is
//! `x.dot(&w.t())`.

use kvlab_model::{Activation, LayerKind, Model, RopeLayout};
use ndarray::{Array2, ArrayView1, ArrayView2, Axis, s};

/// Logits (vocab_size,) of the last of `tokens`, computed from scratch.
pub fn forward(model: &Model, tokens: &[u32]) -> Vec<f32> {
    forward_rows(model, tokens, tokens.len() - 1)
        .row(0)
        .to_vec()
}

/// Logits of positions `from..T` of `tokens`, (T − from, vocab_size), computed from scratch in
/// one causally masked pass: row t sees only tokens 0..=t, so row t's logits are exactly what a
/// step-by-step run would produce after token t.
pub fn forward_rows(model: &Model, tokens: &[u32], from: usize) -> Array2<f32> {
    let c = &model.config;
    let w = &model.weights;
    let t = tokens.len();
    let (d, hd) = (c.dim, c.head_dim);

    // Embedding lookup, scaled (Gemma multiplies by sqrt(dim)). x: (T, d)
    let emb = mat(&w.token_embedding, c.vocab_size, d);
    let mut x = Array2::<f32>::zeros((t, d));
    for (i, &tok) in tokens.iter().enumerate() {
        x.row_mut(i)
            .assign(&(&emb.row(tok as usize) * c.embed_scale));
    }

    // ANCHOR: naive_attention
    for (l, lw) in w.layers.iter().enumerate() {
        // --- attention block ---
        let xn = rmsnorm_rows(&x, &lw.attn_norm, c.norm_eps); // (T, d)
        let mut q = xn.dot(&mat(&lw.wq, c.q_dim(), d).t()); // (T, q)
        let mut k = xn.dot(&mat(&lw.wk, c.kv_dim(), d).t()); // (T, kv)
        let mut v = xn.dot(&mat(&lw.wv, c.kv_dim(), d).t()); // (T, kv)
        if c.qkv_bias {
            // Qwen2: q = xn·Wqᵀ + bq, likewise k and v (broadcast over rows).
            q += &ArrayView1::from(&lw.bq[..]);
            k += &ArrayView1::from(&lw.bk[..]);
            v += &ArrayView1::from(&lw.bv[..]);
        }
        if c.qk_norm {
            q = rmsnorm_heads(&q, hd, &lw.q_norm, c.norm_eps);
            k = rmsnorm_heads(&k, hd, &lw.k_norm, c.norm_eps);
        }
        let freqs = c.rope_freqs(c.rope_theta_for(l));
        rope_rows(&mut q, hd, &freqs, c.rope_layout);
        rope_rows(&mut k, hd, &freqs, c.rope_layout);

        // Causal mask, narrowed to a sliding window on local layers:
        // query i may see key j iff j ≤ i and i − j < window.
        let window = match c.layer_kinds[l] {
            LayerKind::Global => usize::MAX,
            LayerKind::Local { window } => window,
        };
        let mut att = Array2::<f32>::zeros((t, c.q_dim())); // (T, q)
        for h in 0..c.n_heads {
            let g = h / c.kv_mul(); // the KV head this query head shares (GQA/MQA)
            let qh = q.slice(s![.., h * hd..(h + 1) * hd]); // (T, hd)
            let kh = k.slice(s![.., g * hd..(g + 1) * hd]); // (T, hd)
            let vh = v.slice(s![.., g * hd..(g + 1) * hd]); // (T, hd)
            // scores = Q Kᵀ · scale, (T, T)
            let mut scores = qh.dot(&kh.t()) * c.attn_scale;
            masked_softmax_rows(&mut scores, window);
            // out = softmax(scores) V, (T, hd)
            att.slice_mut(s![.., h * hd..(h + 1) * hd])
                .assign(&scores.dot(&vh));
        }
        let mut o = att.dot(&mat(&lw.wo, d, c.q_dim()).t()); // (T, d)
        if c.post_norms {
            o = rmsnorm_rows(&o, &lw.post_attn_norm, c.norm_eps);
        }
        x += &o;
        // ANCHOR_END: naive_attention

        // --- feed-forward block: W2 (act(W1 x) ⊙ W3 x) ---
        let xn = rmsnorm_rows(&x, &lw.ffn_norm, c.norm_eps);
        let gate = xn.dot(&mat(&lw.w1, c.hidden_dim, d).t()); // (T, h)
        let up = xn.dot(&mat(&lw.w3, c.hidden_dim, d).t()); // (T, h)
        let act = gate.mapv(|g| activation(g, c.activation)) * &up;
        let mut f = act.dot(&mat(&lw.w2, d, c.hidden_dim).t()); // (T, d)
        if c.post_norms {
            f = rmsnorm_rows(&f, &lw.post_ffn_norm, c.norm_eps);
        }
        x += &f;
    }

    // Logits of the requested rows only: logits = norm(x_rows) (r, d) @ W_clsᵀ (d, vocab).
    let rows = rmsnorm_rows(
        &x.slice(s![from..t, ..]).to_owned(),
        &w.final_norm,
        c.norm_eps,
    );
    rows.dot(&mat(w.classifier(), c.vocab_size, d).t())
}

/// A weight as a matrix view (rows, cols).
fn mat(v: &[f32], rows: usize, cols: usize) -> ArrayView2<'_, f32> {
    ArrayView2::from_shape((rows, cols), v).expect("shape checked at load")
}

/// RMSNorm of each row: x / sqrt(mean(x²) + eps) ⊙ w.
fn rmsnorm_rows(x: &Array2<f32>, w: &[f32], eps: f32) -> Array2<f32> {
    let w = ArrayView1::from(w);
    let mut out = x.clone();
    for mut row in out.rows_mut() {
        let ms = row.dot(&row) / row.len() as f32;
        let inv = 1.0 / (ms + eps).sqrt();
        row.zip_mut_with(&w, |v, &wi| *v = *v * inv * wi);
    }
    out
}

/// RMSNorm of every head of every row: x (T, n·hd) seen as (T, n, hd), normalised over hd.
fn rmsnorm_heads(x: &Array2<f32>, hd: usize, w: &[f32], eps: f32) -> Array2<f32> {
    let (t, width) = x.dim();
    let heads = x
        .to_shape((t * width / hd, hd))
        .expect("contiguous")
        .to_owned();
    rmsnorm_rows(&heads, w, eps)
        .into_shape_with_order((t, width))
        .expect("same size")
}

/// RoPE on every head of every row; row i is position i. Pair j of a head turns by i · freqs[j]
/// (`Config::rope_freqs`: theta^(−2j/hd), Llama 3's scaling applied where the model has it).
fn rope_rows(x: &mut Array2<f32>, hd: usize, freqs: &[f32], layout: RopeLayout) {
    let half = hd / 2;
    for (pos, mut row) in x.axis_iter_mut(Axis(0)).enumerate() {
        for mut head in row.exact_chunks_mut(hd) {
            for (j, &freq) in freqs.iter().enumerate().take(half) {
                let (sin, cos) = (pos as f32 * freq).sin_cos();
                let (a_i, b_i) = match layout {
                    RopeLayout::Interleaved => (2 * j, 2 * j + 1),
                    RopeLayout::Neox => (j, j + half),
                };
                let (a, b) = (head[a_i], head[b_i]);
                head[a_i] = a * cos - b * sin;
                head[b_i] = a * sin + b * cos;
            }
        }
    }
}

/// Row i: softmax over the visible keys lo..=i (lo = i + 1 − window, or 0), probability 0 for
/// the masked ones — the same as setting masked scores to −∞ before a plain softmax.
fn masked_softmax_rows(scores: &mut Array2<f32>, window: usize) {
    for (i, mut row) in scores.rows_mut().into_iter().enumerate() {
        let lo = (i + 1).saturating_sub(window);
        row.slice_mut(s![..lo]).fill(0.0);
        row.slice_mut(s![i + 1..]).fill(0.0);
        let mut visible = row.slice_mut(s![lo..=i]);
        let max = visible.fold(f32::NEG_INFINITY, |m, &v| m.max(v));
        visible.mapv_inplace(|v| (v - max).exp());
        let sum = visible.sum();
        visible /= sum;
    }
}

fn activation(x: f32, act: Activation) -> f32 {
    match act {
        // silu(x) = x·σ(x)
        Activation::Silu => x / (1.0 + (-x).exp()),
        // gelu_tanh(x) = 0.5·x·(1 + tanh(√(2/π)(x + 0.044715x³)))
        Activation::GeluTanh => {
            0.5 * x * (1.0 + (0.797_884_6 * (x + 0.044_715 * x * x * x)).tanh())
        }
    }
}

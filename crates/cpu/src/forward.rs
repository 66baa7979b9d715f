//! The cached forward step over a step's new tokens (one sequence's prompt, one decode token, or
//! many sequences' tokens at once for the paged engine). Read it beside the naive engine's
//! `forward` (crates/naive/src/forward.rs): the maths is the same; what the cache changes is that
//! q, k and v are computed for the new positions only, k and v are appended to the cache, and the
//! queries attend over the cached positions instead of recomputing the whole prefix.
//!
//! Every projection runs over all the step's rows at once: a GEMV for one row, one matrix product
//! for many. Projections of the same input (q, k and v; gate and up) go to the threads as one
//! job ([`linear_same_x`]): a decode step typically meets the team 5 times a layer instead of
//! 8 (with `--activations q8` the matrices still go one by one).

use kvlab_model::rope::RopeTables;
use kvlab_model::{LayerKind, Model, ops};

use crate::attention::Heads;
use crate::elementwise;
use crate::kv_cache::KvCache;
use crate::linear::{linear, linear_same_x, linear_to_rows};

thread_local! {
    /// The activation buffers of [`forward`] (x, xn, q, k, v, att, o, gate, up), kept on the
    /// thread from step to step up to [`KEEP_MAX_FLOATS`]. A prompt chunk's are megabytes (Gemma
    /// 3 270M, 512 rows: 17.6 MB), which fresh allocations took from the OS and gave back every
    /// call: zeroed and faulted in 4 KiB at a time, 7% of a 1,000-token prefill in the kernel's
    /// `clear_page`. Taken out for the call and put back, so a nested call (none today) would
    /// allocate its own.
    static BUFFERS: std::cell::Cell<[Vec<f32>; 9]> = Default::default();
}

/// The most floats (16 Mi: 64 MiB) of activation buffers a thread keeps between steps: a
/// 512-row chunk of the Llama-3.2-1B shape needs 56 MB; the buffers of a longer step (an 8,192-row
/// prompt step of `kvlab serve`, 0.9 GB on that shape) are given back when it ends.
const KEEP_MAX_FLOATS: usize = 16 << 20;

/// Runs `tokens` at `positions` (one per row) through every layer, appending their keys and
/// values to `cache`, and returns the logits (vocab_size,) of each row listed in `logits_indices`.
pub fn forward(
    model: &Model,
    rope: &RopeTables,
    tokens: &[u32],
    positions: &[usize],
    logits_indices: &[usize],
    cache: &mut impl KvCache,
) -> Vec<Vec<f32>> {
    let c = &model.config;
    let w = &model.weights;
    let t = tokens.len();
    let (d, hd, qd, kvd, hid) = (c.dim, c.head_dim, c.q_dim(), c.kv_dim(), c.hidden_dim);

    // Activations of the step's rows, row-major, in this thread's buffers (see `BUFFERS`); every
    // element is written before it is read.
    let lens = [
        t * d,   // x (rows, dim) residual stream
        t * d,   // xn (rows, dim) normalised
        t * qd,  // q (rows, q_dim)
        t * kvd, // k (rows, kv_dim)
        t * kvd, // v (rows, kv_dim)
        t * qd,  // att (rows, q_dim)
        t * d,   // o (rows, dim)
        t * hid, // gate (rows, hidden_dim)
        t * hid, // up (rows, hidden_dim)
    ];
    let mut buffers = BUFFERS.take();
    for (b, n) in buffers.iter_mut().zip(lens) {
        b.resize(n, 0.0);
        if cfg!(debug_assertions) {
            // The buffers hold the last step's values: in debug builds (the test suite) they
            // hold NaN instead, so that a kernel reading an element before writing it fails.
            b.fill(f32::NAN);
        }
    }
    let [
        mut x,
        mut xn,
        mut q,
        mut k,
        mut v,
        mut att,
        mut o,
        mut gate,
        mut up,
    ] = buffers;

    for (row, &tok) in x.chunks_exact_mut(d).zip(tokens) {
        w.token_embedding.row_into(tok as usize, d, row);
        row.iter_mut().for_each(|r| *r *= c.embed_scale);
    }

    // ANCHOR: cached_attention
    for (l, lw) in w.layers.iter().enumerate() {
        // Attention block: x += [post_norm] Wo · attention(RoPE(q), RoPE(k), v).
        // q, k, v for the step's new positions only. (rows, q_dim), (rows, kv_dim) ×2
        elementwise::rmsnorm_rows(&mut xn, &x, &lw.attn_norm, d, c.norm_eps);
        linear_same_x(
            [&mut q, &mut k, &mut v],
            &xn,
            [&lw.wq, &lw.wk, &lw.wv],
            t,
            d,
        );
        if c.qkv_bias {
            // Qwen2: each row of q, k, v plus its projection's bias.
            for (out, bias) in [(&mut q, &lw.bq), (&mut k, &lw.bk), (&mut v, &lw.bv)] {
                out.chunks_exact_mut(bias.len())
                    .for_each(|row| row.iter_mut().zip(bias.iter()).for_each(|(r, b)| *r += b));
            }
        }
        if c.qk_norm {
            q.chunks_exact_mut(hd)
                .for_each(|h| ops::rmsnorm_in_place(h, &lw.q_norm, c.norm_eps));
            k.chunks_exact_mut(hd)
                .for_each(|h| ops::rmsnorm_in_place(h, &lw.k_norm, c.norm_eps));
        }
        let table = rope.layer(l);
        for (i, &pos) in positions.iter().enumerate() {
            table.apply(&mut q[i * qd..(i + 1) * qd], pos, c.rope_layout);
            table.apply(&mut k[i * kvd..(i + 1) * kvd], pos, c.rope_layout);
        }
        // Write k, v into the cache at their positions (a ring slot on sliding-window layers),
        // then attend over every cached position the query may see, the new ones included.
        cache.append(l, &k, &v);
        let heads = Heads {
            n_heads: c.n_heads,
            n_kv_heads: c.n_kv_heads,
            head_dim: hd,
            scale: c.attn_scale,
            window: match c.layer_kinds[l] {
                LayerKind::Global => usize::MAX,
                LayerKind::Local { window } => window,
            },
        };
        cache.attend(l, &q, &heads, &mut att);
        linear(&mut o, &att, &lw.wo, t, qd, d);
        if c.post_norms {
            o.chunks_exact_mut(d)
                .for_each(|r| ops::rmsnorm_in_place(r, &lw.post_attn_norm, c.norm_eps));
        }
        x.iter_mut().zip(&o).for_each(|(x, o)| *x += o);
        // ANCHOR_END: cached_attention

        // Feed-forward block: x += [post_norm] W2 (act(W1 x) ⊙ W3 x).
        elementwise::rmsnorm_rows(&mut xn, &x, &lw.ffn_norm, d, c.norm_eps);
        linear_same_x([&mut gate, &mut up], &xn, [&lw.w1, &lw.w3], t, d);
        elementwise::glu(&mut gate, &up, c.activation);
        linear(&mut o, &gate, &lw.w2, t, hid, d);
        if c.post_norms {
            o.chunks_exact_mut(d)
                .for_each(|r| ops::rmsnorm_in_place(r, &lw.post_ffn_norm, c.norm_eps));
        }
        x.iter_mut().zip(&o).for_each(|(x, o)| *x += o);
    }

    // Logits of the requested rows only: W_cls (vocab, dim) @ rmsnorm(x_row).
    let b = logits_indices.len();
    let mut picked = vec![0.0f32; b * d]; // (b, dim)
    for (out, &r) in picked.chunks_exact_mut(d).zip(logits_indices) {
        out.copy_from_slice(&x[r * d..(r + 1) * d]);
    }
    let kept = [x, xn, q, k, v, att, o, gate, up];
    if kept.iter().map(Vec::capacity).sum::<usize>() <= KEEP_MAX_FLOATS {
        BUFFERS.set(kept);
    }
    if b == 0 {
        return Vec::new(); // a step that only fills the cache
    }
    let mut xl = vec![0.0f32; b * d]; // (b, dim) normalised
    elementwise::rmsnorm_rows(&mut xl, &picked, &w.final_norm, d, c.norm_eps);
    linear_to_rows(&xl, w.classifier(), b, d, c.vocab_size)
}

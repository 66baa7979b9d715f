//! Build-up, step 2 of 6: a place for K and V (docs/src/build-up.md).
//!
//! The keys and values each layer builds up move into a `KvCache` that the caller owns: per
//! layer, a growing `Vec` to which every row appends its k and v, and from which attention reads.
//! The caller still hands `forward` a fresh, empty cache for every call (the reset), so the whole
//! history is still recomputed: same tokens, same cost as step 1. Only where K and V live changed.
//! Lines marked `NEW (step 2)` are the change from step 1.
//!
//! Run it: `cargo run --release -p kvlab-build-up --bin step2_kv_cache`

use kvlab_build_up::{
    Clock, Lesson, add, argmax, count_scores, embed, feed_forward, logits, matvec, rmsnorm,
};
use kvlab_model::{Config, Model, ops};

/// The KV cache of one sequence: per layer, the key and value rows of every position so far.
// NEW (step 2): a home for the keys and values that outlives one layer's loop
struct KvCache {
    k: Vec<Vec<f32>>, // (n_layers, positions, kv_dim)
    v: Vec<Vec<f32>>, // (n_layers, positions, kv_dim)
}

// NEW (step 2): making a cache
impl KvCache {
    /// Empty: no position cached yet.
    fn new(n_layers: usize) -> KvCache {
        KvCache {
            k: vec![Vec::new(); n_layers],
            v: vec![Vec::new(); n_layers],
        }
    }
}

/// Logits (vocab_size,) of the last of `tokens`; their keys and values are appended to `cache`.
// NEW (step 2): forward is handed the cache to append to
fn forward(model: &Model, tokens: &[u32], cache: &mut KvCache) -> Vec<f32> {
    let (c, hd, kvd) = (&model.config, model.config.head_dim, model.config.kv_dim());
    // The residual stream, one row per token: (rows, dim).
    let mut xs: Vec<Vec<f32>> = tokens.iter().map(|&t| embed(model, t)).collect();
    for (l, lw) in model.weights.layers.iter().enumerate() {
        let theta = c.rope_theta_for(l);
        let keys = &mut cache.k[l]; // NEW (step 2): layer l's keys
        let values = &mut cache.v[l]; // NEW (step 2): layer l's values
        for (i, x) in xs.iter_mut().enumerate() {
            let xn = rmsnorm(x, &lw.attn_norm, c.norm_eps); // (dim,)
            let mut q = matvec(&lw.wq, &xn, c.q_dim()); // (q_dim,) = (n_heads, head_dim)
            let mut k = matvec(&lw.wk, &xn, kvd); // (kv_dim,) = (n_kv_heads, head_dim)
            let v = matvec(&lw.wv, &xn, kvd); // (kv_dim,)
            ops::rope(&mut q, i, hd, theta, c.rope_layout); // rotate by the position: row i
            ops::rope(&mut k, i, hd, theta, c.rope_layout);
            keys.extend_from_slice(&k);
            values.extend_from_slice(&v);
            let att = attend(c, &q, keys, values); // every row pushed so far
            add(x, &matvec(&lw.wo, &att, c.dim));
            feed_forward(c, lw, x);
        }
    }
    logits(model, xs.last().expect("at least one token"))
}

/// One query row q (q_dim,) against the key and value rows (positions, kv_dim) it may see;
/// returns (q_dim,). Query head h reads KV head h / kv_mul (GQA: n_heads / n_kv_heads query heads
/// share one KV head).
fn attend(c: &Config, q: &[f32], keys: &[f32], values: &[f32]) -> Vec<f32> {
    let (hd, kvd) = (c.head_dim, c.kv_dim());
    let mut out = vec![0.0; c.q_dim()];
    for (h, (qh, oh)) in q.chunks_exact(hd).zip(out.chunks_exact_mut(hd)).enumerate() {
        let g = h / c.kv_mul(); // this query head's KV head
        let mut scores: Vec<f32> = keys
            .chunks_exact(kvd)
            .map(|k| ops::dot(qh, &k[g * hd..(g + 1) * hd]) * c.attn_scale)
            .collect(); // (positions,)
        count_scores(scores.len()); // the work, counted where it happens
        ops::softmax(&mut scores);
        for (s, v) in scores.iter().zip(values.chunks_exact(kvd)) {
            ops::axpy(oh, *s, &v[g * hd..(g + 1) * hd]);
        }
    }
    out
}

fn main() -> anyhow::Result<()> {
    let lesson = Lesson::load()?;
    let model = &lesson.model;
    let mut tokens = lesson.prompt.clone(); // BOS + the prompt
    let mut clock = Clock::default();
    // The prompt's positions, then one new token per step until a stop token or --steps.
    // NEW (step 2): a new, empty cache for every call (the reset): nothing is reused yet
    let fresh = || KvCache::new(model.config.n_layers);
    let mut logits = clock.time(0..tokens.len(), || forward(model, &tokens, &mut fresh()));
    loop {
        let next = argmax(&logits);
        if lesson.stops(next) {
            break;
        }
        tokens.push(next);
        if tokens.len() > lesson.steps {
            break; // as run.c: the last token is printed, never fed back
        }
        // NEW (step 2): still every position, into a fresh cache
        logits = clock.time(0..tokens.len(), || forward(model, &tokens, &mut fresh()));
    }
    lesson.report(env!("CARGO_BIN_NAME"), &tokens, &clock);
    Ok(())
}

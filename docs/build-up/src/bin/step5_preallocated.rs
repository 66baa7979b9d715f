//! Build-up, step 5 of 6: allocate once, write in place (docs/src/build-up.md).
//!
//! Growing a `Vec` per token reallocates and copies as it grows, and leaves the sequence's
//! memory unknown until the end. Instead the cache is allocated once, `(n_layers, max_seq_len,
//! kv_dim)` for K and the same for V, and position `p`'s key and value are written in place into
//! slot `p`; attention reads slots `0..=p`. This is what kvlab's CPU engine does
//! (crates/cpu/src/kv_cache.rs). Lines marked `NEW (step 5)` are the change from step 4.
//!
//! Run it: `cargo run --release -p kvlab-build-up --bin step5_preallocated`

use kvlab_build_up::{
    Clock, Lesson, add, argmax, count_scores, embed, feed_forward, logits, matvec, rmsnorm,
};
use kvlab_model::{Config, Model, ops};

/// The KV cache of one sequence: a slot per position, allocated once, written in place.
// NEW (step 5): one buffer for K and one for V, sized up front, never grown
struct KvCache {
    slots: usize, // positions each layer holds: max_seq_len
    kv_dim: usize,
    k: Vec<f32>, // (n_layers, slots, kv_dim)
    v: Vec<f32>, // (n_layers, slots, kv_dim)
}

// NEW (step 2): making a cache
impl KvCache {
    /// Zeroed: `slots` positions per layer.
    // NEW (step 5): allocated once, for every position the sequence may reach
    fn new(c: &Config, slots: usize) -> KvCache {
        let floats = c.n_layers * slots * c.kv_dim();
        KvCache {
            slots,
            kv_dim: c.kv_dim(),
            k: vec![0.0; floats],
            v: vec![0.0; floats],
        }
    }

    /// Where slot `slot` of layer `l` starts in `k` and `v`.
    // NEW (step 5): (layer, slot) to an offset in the buffers
    fn at(&self, l: usize, slot: usize) -> usize {
        (l * self.slots + slot) * self.kv_dim
    }

    /// Bytes held: 2 × n_layers × slots × kv_dim × 4 (f32).
    fn bytes(&self) -> usize {
        (self.k.len() + self.v.len()) * size_of::<f32>() // NEW (step 5)
    }
}

/// Logits (vocab_size,) of the last of `tokens`, which are positions `pos..`; their keys and
/// values are appended to `cache`, which holds positions `0..pos`.
// NEW (step 3): forward is told where its rows are in the sequence
fn forward(model: &Model, tokens: &[u32], pos: usize, cache: &mut KvCache) -> Vec<f32> {
    let (c, hd, kvd) = (&model.config, model.config.head_dim, model.config.kv_dim());
    // The residual stream, one row per token: (rows, dim).
    let mut xs: Vec<Vec<f32>> = tokens.iter().map(|&t| embed(model, t)).collect();
    for (l, lw) in model.weights.layers.iter().enumerate() {
        let theta = c.rope_theta_for(l);
        for (i, x) in xs.iter_mut().enumerate() {
            let p = pos + i; // NEW (step 3): the row's position in the sequence
            let xn = rmsnorm(x, &lw.attn_norm, c.norm_eps); // (dim,)
            let mut q = matvec(&lw.wq, &xn, c.q_dim()); // (q_dim,) = (n_heads, head_dim)
            let mut k = matvec(&lw.wk, &xn, kvd); // (kv_dim,) = (n_kv_heads, head_dim)
            let v = matvec(&lw.wv, &xn, kvd); // (kv_dim,)
            ops::rope(&mut q, p, hd, theta, c.rope_layout); // NEW (step 3): by position p
            ops::rope(&mut k, p, hd, theta, c.rope_layout); // NEW (step 3): cached rotated
            let at = cache.at(l, p); // NEW (step 5): position p's slot
            cache.k[at..at + kvd].copy_from_slice(&k); // NEW (step 5): written in place
            cache.v[at..at + kvd].copy_from_slice(&v); // NEW (step 5)
            let seen = cache.at(l, 0)..cache.at(l, p + 1); // NEW (step 5): slots 0..=p
            let att = attend(c, &q, &cache.k[seen.clone()], &cache.v[seen]); // NEW (step 5)
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
    // NEW (step 5): allocated once: max_seq_len = the positions this run computes (--steps)
    let mut cache = KvCache::new(&model.config, lesson.steps);
    // NEW (step 4): prefill: the prompt's positions, from 0, into the cache
    let mut logits = clock.time(0..tokens.len(), || forward(model, &tokens, 0, &mut cache));
    loop {
        let next = argmax(&logits);
        if lesson.stops(next) {
            break;
        }
        tokens.push(next);
        if tokens.len() > lesson.steps {
            break; // as run.c: the last token is printed, never fed back
        }
        // NEW (step 4): decode: only the new token, at its position; the rest is cached
        let pos = tokens.len() - 1;
        logits = clock.time(pos..pos + 1, || forward(model, &[next], pos, &mut cache));
    }
    lesson.report(env!("CARGO_BIN_NAME"), &tokens, &clock);
    println!("KV cache: {} bytes", cache.bytes()); // NEW (step 4)
    Ok(())
}

//! The KV cache of one sequence: allocated once, when the sequence starts, and written in place at
//! `pos`; never grown or concatenated per token (llama2.c's RunState; candle-nn's preallocated
//! KvCache rather than `Tensor::cat` per step).
//!
//! A cached step does two things per layer, in this order (run.c's `forward`, vLLM's
//! `reshape_and_cache` then attention): [`KvCache::append`] writes the keys and values of the
//! step's new positions into the cache, then [`KvCache::attend`] lets the step's queries attend
//! over the cached positions, the new ones included. The contiguous cache below and the paged
//! pool (`crate::paged`) are the two implementations.
//!
//! Each layer keeps `cap_l` positions: `max_seq_len` for a global layer; for a sliding-window
//! layer a ring buffer of `window − 1 + RING_STEP` slots (fewer if `max_seq_len` is smaller), where
//! position `pos` lives in slot `pos % cap_l`. A query at `pos` sees `pos + 1 − window..=pos`, so a
//! step of up to `RING_STEP` new positions can be written before its first query reads: nothing
//! it still needs is overwritten (llama.cpp sizes its sliding-window cache the same way, window +
//! batch). Longer prompts run in steps of `RING_STEP` ([`ContiguousKvCache::max_step`]). For a
//! model without windows the buffers are exactly `(n_layers, max_seq_len, kv_dim)`.

use std::ops::Range;

use kvlab_model::{Config, KvDtype, KvUsage, LayerKind};

use crate::attention::{Heads, KvRows, Part, attention};
use crate::kv_store::KvStore;

/// New positions one step may write into a ring buffer before its queries read it.
pub const RING_STEP: usize = 64;

/// What a cached forward step needs from a KV cache: store the step's keys and values, then
/// attend over everything cached.
pub trait KvCache {
    /// Writes the keys and values k, v (rows, kv_dim) of the step's new positions at layer `l`.
    fn append(&mut self, l: usize, k: &[f32], v: &[f32]);
    /// out (rows, n_heads·head_dim) ← attention of the step's queries q (rows, n_heads·head_dim)
    /// over layer `l`'s cached keys and values. Every element of out is written (it holds the
    /// previous step's values on entry: `forward` reuses its buffers).
    fn attend(&self, l: usize, q: &[f32], heads: &Heads, out: &mut [f32]);
}

// ANCHOR: kv_cache
/// Keys and values of one sequence for every layer, contiguous, in the cache's dtype.
pub struct ContiguousKvCache {
    /// Keys: layer l's slots are rows `offsets[l]..offsets[l] + caps[l]`. (Σ_l cap_l, kv_dim)
    k: KvStore,
    /// Values, same layout as `k`. (Σ_l cap_l, kv_dim)
    v: KvStore,
    /// Positions layer l keeps. (n_layers,)
    caps: Vec<usize>,
    /// First row of layer l in `k` and `v`. (n_layers,)
    offsets: Vec<usize>,
    kv_dim: usize,
    /// Positions written so far: the position of the step's first new token.
    pub len: usize,
    /// Positions the sequence may reach, fixed when it starts; a step past it is refused.
    pub max_seq_len: usize,
}
// ANCHOR_END: kv_cache

impl ContiguousKvCache {
    /// Forgets positions `len..` so that the next step writes at `len` (llama.cpp's
    /// `llama_memory_seq_rm`): nothing is erased, the slots are simply written again. Possible
    /// when every key the query at `len` reads is still stored: always in a global layer; in a
    /// ring of `cap` slots with window `W`, which holds positions `self.len − cap..self.len`, when
    /// `len + 1 − W ≥ self.len − cap`, or when it has not wrapped yet (`self.len ≤ cap`, always
    /// so for a sequence shorter than its ring). Returns whether it truncated.
    pub fn truncate(&mut self, len: usize, c: &Config) -> bool {
        if len > self.len {
            return false;
        }
        let kept = c
            .layer_kinds
            .iter()
            .zip(&self.caps)
            .all(|(kind, &cap)| match kind {
                LayerKind::Global => true,
                // Nothing was overwritten yet, or the window of `len` is still in the ring.
                LayerKind::Local { window } => {
                    self.len <= cap || len + 1 + cap >= self.len + window
                }
            });
        if kept {
            self.len = len;
        }
        kept
    }

    /// Allocates the whole cache for `max_seq_len` positions, keys and values stored as `dtype`.
    /// For int4, whose keys are quantized per group of [`KvDtype::INT4_GROUP`] slots, a ring
    /// has a whole number of groups and every layer starts on a group.
    pub fn new(c: &Config, max_seq_len: usize, dtype: KvDtype) -> ContiguousKvCache {
        let group = dtype.group(KvDtype::INT4_GROUP);
        let caps: Vec<usize> = c
            .layer_kinds
            .iter()
            .map(|kind| match kind {
                LayerKind::Global => max_seq_len,
                LayerKind::Local { window } => (window - 1 + RING_STEP)
                    .next_multiple_of(group)
                    .min(max_seq_len),
            })
            .collect();
        // Rows each layer takes in the stores: its cap, in whole int4 key groups.
        let padded = caps.iter().map(|cap| cap.next_multiple_of(group));
        let offsets = padded
            .clone()
            .scan(0, |acc, rows| {
                let off = *acc;
                *acc += rows;
                Some(off)
            })
            .collect();
        let rows = padded.sum();
        let shape = (c.n_kv_heads, c.head_dim);
        ContiguousKvCache {
            k: KvStore::new(dtype, Part::Keys, rows, shape, group),
            v: KvStore::new(dtype, Part::Values, rows, shape, group),
            caps,
            offsets,
            kv_dim: c.kv_dim(),
            len: 0,
            max_seq_len,
        }
    }

    /// The most new positions one step may append: unbounded unless a ring buffer wraps.
    pub fn max_step(&self) -> usize {
        if self.caps.iter().all(|&cap| cap == self.max_seq_len) {
            usize::MAX
        } else {
            RING_STEP
        }
    }

    /// Used and reserved bytes: a layer uses min(len, cap_l) slots of 2 rows (K and V) and
    /// reserves its cap (int4: whole key groups). An int4 group's f32 residual is not counted.
    pub fn usage(&self) -> KvUsage {
        let bytes = |slots| self.k.bytes_for(slots) + self.v.bytes_for(slots);
        KvUsage {
            used_bytes: self.caps.iter().map(|&cap| bytes(self.len.min(cap))).sum(),
            reserved_bytes: self.k.bytes() + self.v.bytes(),
        }
    }

    /// Appends `n` positions of seeded random keys and values, uniform in [−1, 1), to every
    /// layer ([`kvlab_model::Engine::fill_random`]); the caller has checked they fit. Written
    /// through [`KvCache::append`] in steps a ring takes, so every dtype stores them as it
    /// stores computed rows.
    pub fn fill_random(&mut self, n: usize, seed: u64) {
        use rand::{Rng, SeedableRng};
        let mut rng = rand_chacha::ChaCha8Rng::seed_from_u64(seed);
        let step = self.max_step().min(256);
        let mut left = n;
        let (mut k, mut v) = (Vec::new(), Vec::new());
        while left > 0 {
            let rows = step.min(left);
            for l in 0..self.caps.len() {
                k.clear();
                v.clear();
                k.extend((0..rows * self.kv_dim).map(|_| rng.random_range(-1.0f32..1.0)));
                v.extend((0..rows * self.kv_dim).map(|_| rng.random_range(-1.0f32..1.0)));
                self.append(l, &k, &v);
            }
            self.len += rows;
            left -= rows;
        }
    }

    /// Per layer, the shape of its K (and V) buffer with axis names.
    pub fn shapes(&self) -> Vec<String> {
        self.caps
            .iter()
            .map(|&cap| {
                if cap == self.max_seq_len {
                    format!(
                        "(max_seq_len={cap}, kv_dim={}) {}, {} written",
                        self.kv_dim,
                        self.k.dtype(),
                        self.len.min(cap)
                    )
                } else {
                    format!(
                        "ring (slots={cap}, kv_dim={}) {}, {} valid",
                        self.kv_dim,
                        self.k.dtype(),
                        self.len.min(cap)
                    )
                }
            })
            .collect()
    }
}

// ANCHOR: append_attend
impl KvCache for ContiguousKvCache {
    /// Position `len + i` of the step goes to slot `(len + i) % cap_l`: its own row for a global
    /// layer (cap = max_seq_len), a ring slot for a sliding-window layer.
    fn append(&mut self, l: usize, k: &[f32], v: &[f32]) {
        let (kv_dim, cap, first) = (self.kv_dim, self.caps[l], self.offsets[l]);
        for (i, (k, v)) in k
            .chunks_exact(kv_dim)
            .zip(v.chunks_exact(kv_dim))
            .enumerate()
        {
            let slot = first + (self.len + i) % cap;
            self.k.write(slot, k);
            self.v.write(slot, v);
        }
    }

    /// Query row i is position `len + i`; it reads keys `first_visible..=len + i` from their slots.
    fn attend(&self, l: usize, q: &[f32], heads: &Heads, out: &mut [f32]) {
        let rows = Slots {
            k: &self.k,
            v: &self.v,
            first: self.offsets[l],
            cap: self.caps[l],
        };
        attention(out, q, heads, |i| self.len + i, |_| 0, |_| rows);
    }
}
// ANCHOR_END: append_attend

/// One layer of the contiguous cache seen as rows by position: position j in slot j % cap, the
/// layer's slots starting at row `first` of the stores.
#[derive(Clone, Copy)]
struct Slots<'a> {
    k: &'a KvStore, // (Σ_l cap_l, kv_dim)
    v: &'a KvStore, // (Σ_l cap_l, kv_dim)
    first: usize,
    cap: usize,
}

impl KvRows for Slots<'_> {
    /// Slots run on from j's up to the end of the layer, where a ring wraps to slot 0.
    #[inline(always)]
    fn rows<'a>(
        &'a self,
        part: Part,
        j: usize,
        end: usize,
        kv_heads: Range<usize>,
        tile: &'a mut Vec<f32>,
    ) -> &'a [f32] {
        self.store(part).read(self.run(j, end), kv_heads, tile)
    }

    #[inline(always)]
    fn rows_f16(&self, part: Part, j: usize, end: usize) -> Option<&[u16]> {
        self.store(part).raw_f16(self.run(j, end))
    }
}

impl Slots<'_> {
    /// The keys' or the values' store.
    #[inline(always)]
    fn store(&self, part: Part) -> &KvStore {
        part.pick(self.k, self.v)
    }

    /// Rows of the positions from j on stored in consecutive slots, at most end − j.
    #[inline(always)]
    fn run(&self, j: usize, end: usize) -> Range<usize> {
        let s = if j < self.cap { j } else { j % self.cap };
        let c = (end - j).min(self.cap - s);
        self.first + s..self.first + s + c
    }
}

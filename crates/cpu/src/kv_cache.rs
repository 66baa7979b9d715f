//! The KV cache of one sequence: allocated once, when the sequence starts, and written in place at
//! `pos`; never grown or concatenated per token (llama2.c's RunState; candle-nn's preallocated
//! KvCache rather than `Tensor::cat` per step).
//!
//! Each layer keeps `cap_l` positions: `max_seq_len` for a global layer, `min(window,
//! max_seq_len)` for a sliding-window layer. A position `pos` lives in slot `pos % cap_l`, so a
//! windowed layer is a ring buffer: position `pos` overwrites `pos − window`, which no query at
//! `pos` or later can see. For a model without windows the buffers are exactly
//! `(n_layers, max_seq_len, kv_dim)`.

use kvlab_model::{Config, KvUsage};

// ANCHOR: kv_cache
/// Keys and values of one sequence for every layer.
pub struct KvCache {
    /// Keys: layer l's slots at `offsets[l]..offsets[l] + caps[l]·kv_dim`. (Σ_l cap_l, kv_dim)
    k: Vec<f32>,
    /// Values, same layout as `k`. (Σ_l cap_l, kv_dim)
    v: Vec<f32>,
    /// Positions layer l keeps. (n_layers,)
    caps: Vec<usize>,
    /// Start of layer l in `k` and `v`, in floats. (n_layers,)
    offsets: Vec<usize>,
    kv_dim: usize,
    /// Positions written so far (the next position to write).
    pub len: usize,
    pub max_seq_len: usize,
}

impl KvCache {
    /// Allocates the whole cache for `max_seq_len` positions.
    pub fn new(c: &Config, max_seq_len: usize) -> KvCache {
        let caps: Vec<usize> = (0..c.n_layers)
            .map(|l| c.cache_positions(l, max_seq_len))
            .collect();
        let offsets = caps
            .iter()
            .scan(0, |acc, &cap| {
                let off = *acc;
                *acc += cap * c.kv_dim();
                Some(off)
            })
            .collect();
        let total = caps.iter().sum::<usize>() * c.kv_dim();
        KvCache {
            k: vec![0.0; total],
            v: vec![0.0; total],
            caps,
            offsets,
            kv_dim: c.kv_dim(),
            len: 0,
            max_seq_len,
        }
    }

    /// Positions layer `l` keeps.
    pub fn cap(&self, l: usize) -> usize {
        self.caps[l]
    }

    /// Layer `l`'s keys and values, each (cap_l, kv_dim).
    pub fn layer(&self, l: usize) -> (&[f32], &[f32]) {
        let r = self.offsets[l]..self.offsets[l] + self.caps[l] * self.kv_dim;
        (&self.k[r.clone()], &self.v[r])
    }

    /// Writes the key and value of position `pos` at layer `l` into its slot `pos % cap_l`.
    // ANCHOR_END: kv_cache
    pub fn write(&mut self, l: usize, pos: usize, k: &[f32], v: &[f32]) {
        let slot = pos % self.caps[l];
        let at = self.offsets[l] + slot * self.kv_dim;
        self.k[at..at + self.kv_dim].copy_from_slice(k);
        self.v[at..at + self.kv_dim].copy_from_slice(v);
    }

    /// Used and reserved bytes (f32 = 4 bytes): a layer uses min(len, cap_l) slots.
    pub fn usage(&self) -> KvUsage {
        let per_slot = 2 * self.kv_dim * 4;
        KvUsage {
            used_bytes: self
                .caps
                .iter()
                .map(|&cap| self.len.min(cap) * per_slot)
                .sum(),
            reserved_bytes: self.caps.iter().map(|&cap| cap * per_slot).sum(),
        }
    }

    /// Per layer, the shape of its K (and V) buffer with axis names.
    pub fn shapes(&self) -> Vec<String> {
        self.caps
            .iter()
            .map(|&cap| {
                if cap == self.max_seq_len {
                    format!(
                        "(max_seq_len={cap}, kv_dim={}), {} written",
                        self.kv_dim,
                        self.len.min(cap)
                    )
                } else {
                    format!(
                        "ring (window={cap}, kv_dim={}), {} valid",
                        self.kv_dim,
                        self.len.min(cap)
                    )
                }
            })
            .collect()
    }
}

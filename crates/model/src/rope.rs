//! RoPE with precomputed cos/sin tables, shared by every engine that rotates with a table (the
//! CPU engines apply them, the CUDA engine uploads them). The angle of pair j at position p is
//! p · theta^(−2j/head_dim) (Su et al. 2021, RoFormer), computed per (theta, p, j) in f32 exactly
//! as [`crate::ops::rope`] computes it on the fly, so a table rotation is bit-identical to the
//! reference. A model has one table per distinct theta (Gemma 3: 1e6 on global layers, 1e4 on
//! sliding-window layers), not one per layer.

use crate::{Config, RopeLayout};

/// cos and sin of every angle for one theta. Each (max_pos, head_dim/2), row-major.
pub struct RopeTable {
    /// The RoPE base the table is for.
    pub theta: f32,
    /// (max_pos, head_dim/2) cos(p · freq_j)
    pub cos: Vec<f32>,
    /// (max_pos, head_dim/2) sin(p · freq_j)
    pub sin: Vec<f32>,
    half: usize,
}

impl RopeTable {
    /// The plain table of base `theta` (no frequency scaling).
    pub fn new(theta: f32, head_dim: usize, max_pos: usize) -> RopeTable {
        let freqs: Vec<f32> = (0..head_dim / 2)
            .map(|j| 1.0 / theta.powf((2 * j) as f32 / head_dim as f32))
            .collect();
        RopeTable::from_freqs(theta, &freqs, max_pos)
    }

    /// The table of the frequencies `freqs` (head_dim/2,) ([`Config::rope_freqs`]).
    pub fn from_freqs(theta: f32, freqs: &[f32], max_pos: usize) -> RopeTable {
        let half = freqs.len();
        let (mut cos, mut sin) = (
            Vec::with_capacity(max_pos * half),
            Vec::with_capacity(max_pos * half),
        );
        for p in 0..max_pos {
            for &f in freqs {
                let (s, c) = (p as f32 * f).sin_cos();
                cos.push(c);
                sin.push(s);
            }
        }
        RopeTable {
            theta,
            cos,
            sin,
            half,
        }
    }

    /// Positions covered.
    pub fn positions(&self) -> usize {
        self.cos.len() / self.half.max(1)
    }

    /// Rotates every head of `x` (n_heads, head_dim) for position `pos`.
    pub fn apply(&self, x: &mut [f32], pos: usize, layout: RopeLayout) {
        let half = self.half;
        let (cos, sin) = (
            &self.cos[pos * half..(pos + 1) * half],
            &self.sin[pos * half..(pos + 1) * half],
        );
        for head in x.chunks_exact_mut(2 * half) {
            match layout {
                RopeLayout::Interleaved => {
                    for (j, pair) in head.chunks_exact_mut(2).enumerate() {
                        let (a, b) = (pair[0], pair[1]);
                        pair[0] = a * cos[j] - b * sin[j];
                        pair[1] = a * sin[j] + b * cos[j];
                    }
                }
                RopeLayout::Neox => {
                    let (lo, hi) = head.split_at_mut(half);
                    for j in 0..half {
                        let (a, b) = (lo[j], hi[j]);
                        lo[j] = a * cos[j] - b * sin[j];
                        hi[j] = a * sin[j] + b * cos[j];
                    }
                }
            }
        }
    }
}

/// A model's tables: one per distinct theta, and which one each layer uses.
pub struct RopeTables {
    /// One per distinct theta, in order of first use.
    pub tables: Vec<RopeTable>,
    /// Index into `tables` of each layer's. (n_layers,)
    pub of_layer: Vec<usize>,
}

impl RopeTables {
    /// Tables for positions `0..max_pos` of every distinct theta of `c`.
    pub fn for_config(c: &Config, max_pos: usize) -> RopeTables {
        let mut tables: Vec<RopeTable> = Vec::new();
        let of_layer = (0..c.n_layers)
            .map(|l| {
                let theta = c.rope_theta_for(l);
                tables
                    .iter()
                    .position(|t| t.theta == theta)
                    .unwrap_or_else(|| {
                        tables.push(RopeTable::from_freqs(theta, &c.rope_freqs(theta), max_pos));
                        tables.len() - 1
                    })
            })
            .collect();
        RopeTables { tables, of_layer }
    }

    /// Layer `l`'s table.
    pub fn layer(&self, l: usize) -> &RopeTable {
        &self.tables[self.of_layer[l]]
    }

    /// Positions every table covers.
    pub fn positions(&self) -> usize {
        self.tables.first().map_or(0, RopeTable::positions)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::LayerKind;

    #[test]
    fn table_rope_equals_the_reference_bit_for_bit() {
        // black_box: with constants the optimizer may fold powf/sin_cos at compile time on one
        // side only; engines always get theta and positions at run time.
        let theta = std::hint::black_box(10_000.0f32);
        for layout in [RopeLayout::Interleaved, RopeLayout::Neox] {
            let table = RopeTable::new(theta, 16, 300);
            for pos in [0, 1, 17, 299] {
                let x: Vec<f32> = (0..48).map(|i| (i as f32 * 0.71).sin()).collect();
                let (mut a, mut b) = (x.clone(), x.clone());
                table.apply(&mut a, pos, layout);
                crate::ops::rope(&mut b, std::hint::black_box(pos), 16, theta, layout);
                assert_eq!(a, b, "{layout:?} pos {pos}");
            }
        }
    }

    #[test]
    fn one_table_per_distinct_theta_for_gemmas_layer_pattern() {
        // Gemma 3: five sliding-window layers, then a global one, repeated.
        let mut c = Config::llama(64, 128, 12, 4, 4, 32, 16, true);
        c.layer_kinds = LayerKind::interleaved(12, 6, 8);
        c.rope_theta = 1e6;
        c.rope_theta_local = 1e4;
        let t = RopeTables::for_config(&c, 20);
        assert_eq!(t.tables.len(), 2);
        assert_eq!(t.tables[0].theta, 1e4);
        assert_eq!(t.of_layer, vec![0, 0, 0, 0, 0, 1, 0, 0, 0, 0, 0, 1]);
        assert_eq!(t.layer(5).theta, 1e6);
        assert_eq!(t.positions(), 20);
    }
}

//! RoPE with precomputed cos/sin tables: the angle of pair j at position p is
//! p · theta^(−2j/head_dim) (Su et al. 2021), computed once per (theta, p, j) in f32 exactly as
//! `kvlab_model::ops::rope` computes it on the fly, so results are bit-identical to the reference.

use kvlab_model::RopeLayout;

/// cos and sin of every angle for one theta. Each (max_pos, head_dim/2).
pub struct RopeTable {
    pub theta: f32,
    cos: Vec<f32>,
    sin: Vec<f32>,
    half: usize,
}

impl RopeTable {
    pub fn new(theta: f32, head_dim: usize, max_pos: usize) -> RopeTable {
        let half = head_dim / 2;
        let freqs: Vec<f32> = (0..half)
            .map(|j| 1.0 / theta.powf((2 * j) as f32 / head_dim as f32))
            .collect();
        let (mut cos, mut sin) = (
            Vec::with_capacity(max_pos * half),
            Vec::with_capacity(max_pos * half),
        );
        for p in 0..max_pos {
            for &f in &freqs {
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

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn table_rope_equals_the_reference_bit_for_bit() {
        for layout in [RopeLayout::Interleaved, RopeLayout::Neox] {
            let table = RopeTable::new(10_000.0, 16, 300);
            for pos in [0, 1, 17, 299] {
                let x: Vec<f32> = (0..48).map(|i| (i as f32 * 0.71).sin()).collect();
                let (mut a, mut b) = (x.clone(), x.clone());
                table.apply(&mut a, pos, layout);
                kvlab_model::ops::rope(&mut b, pos, 16, 10_000.0, layout);
                assert_eq!(a, b, "{layout:?} pos {pos}");
            }
        }
    }
}

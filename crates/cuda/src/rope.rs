//! RoPE cos/sin tables, computed on the host exactly as `kvlab_model::ops::rope` computes the
//! angle (freq_j = 1 / theta^(2j/head_dim) in f32, angle = pos · freq_j, `sin_cos` in f32), so the
//! GPU rotates by bit-identical cos and sin. One table per distinct theta (Gemma 3 has two).

use std::sync::Arc;

use cudarc::driver::{CudaSlice, CudaStream};
use kvlab_model::Config;

use crate::error::Result;

/// cos and sin of every angle for one theta, each (max_pos, head_dim/2) row-major.
pub fn rope_table(theta: f32, head_dim: usize, max_pos: usize) -> (Vec<f32>, Vec<f32>) {
    let half = head_dim / 2;
    let freqs: Vec<f32> = (0..half)
        .map(|j| 1.0 / theta.powf((2 * j) as f32 / head_dim as f32))
        .collect();
    let mut cos = Vec::with_capacity(max_pos * half);
    let mut sin = Vec::with_capacity(max_pos * half);
    for p in 0..max_pos {
        for &f in &freqs {
            let (s, c) = (p as f32 * f).sin_cos();
            cos.push(c);
            sin.push(s);
        }
    }
    (cos, sin)
}

/// The distinct RoPE bases of a model, and the index of each layer's.
pub fn thetas(c: &Config) -> (Vec<f32>, Vec<usize>) {
    let mut distinct: Vec<f32> = Vec::new();
    let mut of_layer = Vec::with_capacity(c.n_layers);
    for l in 0..c.n_layers {
        let t = c.rope_theta_for(l);
        let i = match distinct.iter().position(|&d| d == t) {
            Some(i) => i,
            None => {
                distinct.push(t);
                distinct.len() - 1
            }
        };
        of_layer.push(i);
    }
    (distinct, of_layer)
}

/// The tables on the device.
pub struct RopeTables {
    /// Per distinct theta: cos and sin, (max_pos, head_dim/2) f32.
    pub cos: Vec<CudaSlice<f32>>,
    pub sin: Vec<CudaSlice<f32>>,
    /// (n_layers,) index into `cos`/`sin`.
    pub of_layer: Vec<usize>,
    /// Rows of every table.
    pub max_pos: usize,
}

impl RopeTables {
    /// Computes and uploads the tables for positions `0..c.max_seq_len`.
    ///
    /// # Errors
    /// Driver errors.
    pub fn upload(stream: &Arc<CudaStream>, c: &Config) -> Result<RopeTables> {
        let (distinct, of_layer) = thetas(c);
        let (mut cos, mut sin) = (Vec::new(), Vec::new());
        for theta in distinct {
            let (cc, ss) = rope_table(theta, c.head_dim, c.max_seq_len);
            cos.push(stream.clone_htod(&cc)?);
            sin.push(stream.clone_htod(&ss)?);
        }
        Ok(RopeTables {
            cos,
            sin,
            of_layer,
            max_pos: c.max_seq_len,
        })
    }
}

/// RoPE with a table, as the kernel applies it: x (n_heads, head_dim) at position `pos`.
/// The CPU reference the GPU tests compare against.
pub fn apply_table(
    x: &mut [f32],
    cos: &[f32],
    sin: &[f32],
    pos: usize,
    head_dim: usize,
    neox: bool,
) {
    let half = head_dim / 2;
    for head in x.chunks_exact_mut(head_dim) {
        for j in 0..half {
            let (c, s) = (cos[pos * half + j], sin[pos * half + j]);
            let (ia, ib) = if neox {
                (j, j + half)
            } else {
                (2 * j, 2 * j + 1)
            };
            let (a, b) = (head[ia], head[ib]);
            head[ia] = a * c - b * s;
            head[ib] = a * s + b * c;
        }
    }
}

#[cfg(test)]
mod tests {
    use kvlab_model::{LayerKind, RopeLayout};

    use super::*;

    #[test]
    fn table_rope_equals_the_model_reference_bit_for_bit() {
        let (hd, theta) = (16, 10_000.0);
        let (cos, sin) = rope_table(theta, hd, 300);
        for (layout, neox) in [(RopeLayout::Interleaved, false), (RopeLayout::Neox, true)] {
            for pos in [0, 1, 17, 299] {
                let x: Vec<f32> = (0..48).map(|i| (i as f32 * 0.71).sin()).collect();
                let (mut a, mut b) = (x.clone(), x);
                apply_table(&mut a, &cos, &sin, pos, hd, neox);
                kvlab_model::ops::rope(&mut b, pos, hd, theta, layout);
                assert_eq!(a, b, "{layout:?} pos {pos}");
            }
        }
    }

    #[test]
    fn one_table_per_distinct_theta() {
        let mut c = Config::llama(64, 128, 4, 4, 4, 32, 16, true);
        c.layer_kinds = vec![
            LayerKind::Local { window: 8 },
            LayerKind::Global,
            LayerKind::Local { window: 8 },
            LayerKind::Global,
        ];
        c.rope_theta = 1e6;
        c.rope_theta_local = 1e4;
        let (distinct, of_layer) = thetas(&c);
        assert_eq!(distinct, vec![1e4, 1e6]);
        assert_eq!(of_layer, vec![0, 1, 0, 1]);
    }
}

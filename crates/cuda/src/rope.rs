//! RoPE cos/sin tables, computed on the host exactly as `kvlab_model::ops::rope` computes the
//! angle (freq_j = 1 / theta^(2j/head_dim) in f32, angle = pos · freq_j, `sin_cos` in f32), so the
//! GPU rotates by bit-identical cos and sin. One table per distinct theta (Gemma 3 has two):
//! [`kvlab_model::rope::RopeTables`] builds them on the host.

use std::sync::Arc;

use cudarc::driver::{CudaSlice, CudaStream};
use kvlab_model::Config;

use crate::error::Result;

/// cos and sin of every angle for one theta, each (max_pos, head_dim/2) row-major: the host
/// tables of [`kvlab_model::rope`], which the CPU engines apply too.
pub fn rope_table(theta: f32, head_dim: usize, max_pos: usize) -> (Vec<f32>, Vec<f32>) {
    let t = kvlab_model::rope::RopeTable::new(theta, head_dim, max_pos);
    (t.cos, t.sin)
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
        let host = kvlab_model::rope::RopeTables::for_config(c, c.max_seq_len);
        let (mut cos, mut sin) = (Vec::new(), Vec::new());
        for t in &host.tables {
            cos.push(stream.clone_htod(&t.cos)?);
            sin.push(stream.clone_htod(&t.sin)?);
        }
        let of_layer = host.of_layer;
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
    use kvlab_model::RopeLayout;

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
}

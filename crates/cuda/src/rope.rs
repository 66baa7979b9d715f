//! RoPE cos/sin tables on the device: [`kvlab_model::rope::RopeTables`] computes them on the host
//! exactly as `kvlab_model::ops::rope` computes the angle, one per distinct theta (Gemma 3 has
//! two), so the GPU rotates by the bit-identical cos and sin the CPU engines apply.

use std::sync::Arc;

use cudarc::driver::{CudaSlice, CudaStream};
use kvlab_model::Config;

use crate::error::Result;

/// The tables on the device.
pub struct RopeTables {
    /// Per distinct theta: cos and sin, (max_pos, head_dim/2) f32.
    pub cos: Vec<CudaSlice<f32>>,
    /// Per distinct theta: (max_pos, head_dim/2) f32 sines.
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

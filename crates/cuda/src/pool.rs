//! The paged KV pool on the device: its size, from free memory like vLLM's
//! `gpu_memory_utilization`, and its buffers.
//!
//! Each KV group (global layers; each sliding window) has its own pool of `num_blocks` blocks —
//! the same count in every group, the engine's `kvlab_paged::KvCacheConfig` — and every
//! layer of a group has a K and a V tensor `(num_blocks, block_size, n_kv_heads, head_dim)`.
//! Bytes per token of a group = 2 (K and V) × layers in the group × n_kv_heads × head_dim × bytes
//! per element; summed over groups it is the DESIGN's formula
//! `2 × n_layers × n_kv_heads × head_dim × bytes`.

use std::sync::Arc;

use cudarc::driver::{CudaSlice, CudaStream};
use kvlab_model::Config;
use serde::Serialize;

use crate::dtype::{DType, Precision};
use crate::error::{CudaError, Result};

/// Bytes kept free beyond the utilization fraction for cuBLAS workspaces and the driver.
pub const HEADROOM_BYTES: usize = 256 << 20;

/// One KV group of the pool.
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
pub struct GroupPlan {
    /// `None` for global attention, `Some(window)` for a sliding window.
    pub window: Option<usize>,
    /// Layers in this group, in model order.
    pub layers: Vec<usize>,
    /// 2 × layers × n_kv_heads × head_dim × bytes per element.
    pub bytes_per_token: usize,
}

/// The pool's geometry and size: what `kvlab info`/`mem`-style reports print.
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
pub struct PoolPlan {
    pub num_blocks: usize,
    pub block_size: usize,
    pub kv_dtype: Precision,
    /// (num_groups,) in `Config::kv_cache_groups` order.
    pub groups: Vec<GroupPlan>,
    /// Σ over groups: the bytes one token position takes in every group.
    pub bytes_per_token: usize,
    /// Bytes of the whole pool: num_blocks × block_size × bytes_per_token.
    pub pool_bytes: usize,
}

impl PoolPlan {
    /// Token slots per group.
    pub fn num_slots(&self) -> usize {
        self.num_blocks * self.block_size
    }
}

impl std::fmt::Display for PoolPlan {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "KV pool: {} blocks x {} tokens = {} token slots per group, {}, {} bytes/token, {:.2} GiB",
            self.num_blocks,
            self.block_size,
            self.num_slots(),
            self.kv_dtype.name(),
            self.bytes_per_token,
            self.pool_bytes as f64 / (1u64 << 30) as f64
        )?;
        for g in &self.groups {
            let kind = g
                .window
                .map_or("global".to_string(), |w| format!("window {w}"));
            write!(
                f,
                "\n  group {kind}: {} layers, {} bytes/token",
                g.layers.len(),
                g.bytes_per_token
            )?;
        }
        Ok(())
    }
}

/// Blocks that fit the KV budget: `budget = total · utilization − (total − free) − headroom`,
/// where `free` is measured after the weights and activations are allocated (so they count
/// against the fraction, as in vLLM), divided by the bytes of one block in every group.
///
/// # Errors
/// [`CudaError::OutOfMemory`] when the budget holds no block, saying what to change.
pub fn blocks_for_budget(
    total: usize,
    free: usize,
    utilization: f32,
    headroom: usize,
    bytes_per_block: usize,
) -> Result<usize> {
    if !(utilization > 0.0 && utilization <= 1.0) {
        return Err(CudaError::Unsupported(format!(
            "gpu_memory_utilization {utilization} must be in (0, 1]"
        )));
    }
    let allowed = (total as f64 * utilization as f64) as usize;
    let used = total.saturating_sub(free);
    let budget = allowed.saturating_sub(used).saturating_sub(headroom);
    let blocks = budget / bytes_per_block.max(1);
    if blocks == 0 {
        return Err(CudaError::OutOfMemory(format!(
            "gpu_memory_utilization {utilization} of {:.1} GiB leaves no room for a KV block \
             ({:.1} GiB already in use, {bytes_per_block} bytes per block); raise the fraction \
             or use f16 weights",
            total as f64 / (1u64 << 30) as f64,
            used as f64 / (1u64 << 30) as f64
        )));
    }
    Ok(blocks.min(i32::MAX as usize))
}

/// A plan for `num_blocks` blocks: the groups of `c` with their layers and bytes per token.
pub fn plan(c: &Config, num_blocks: usize, block_size: usize, kv_dtype: Precision) -> PoolPlan {
    let groups: Vec<GroupPlan> = c
        .kv_cache_groups()
        .into_iter()
        .enumerate()
        .map(|(g, window)| {
            let layers: Vec<usize> = (0..c.n_layers)
                .filter(|&l| c.layer_cache_group(l) == g)
                .collect();
            let bytes_per_token = 2 * layers.len() * c.n_kv_heads * c.head_dim * kv_dtype.bytes();
            GroupPlan {
                window,
                layers,
                bytes_per_token,
            }
        })
        .collect();
    let bytes_per_token = groups.iter().map(|g| g.bytes_per_token).sum();
    PoolPlan {
        num_blocks,
        block_size,
        kv_dtype,
        groups,
        bytes_per_token,
        pool_bytes: num_blocks * block_size * bytes_per_token,
    }
}

/// The pool's tensors. `k[l]`, `v[l]`: layer l's `(num_blocks, block_size, n_kv_heads,
/// head_dim)` cache, in the cache type `C`.
pub struct KvPool<C> {
    pub k: Vec<CudaSlice<C>>,
    pub v: Vec<CudaSlice<C>>,
    pub plan: PoolPlan,
}

impl<C: DType> KvPool<C> {
    /// Allocates (zeroed) the tensors of `plan` for every layer of `c`.
    ///
    /// # Errors
    /// Driver errors (out of memory).
    pub fn allocate(stream: &Arc<CudaStream>, c: &Config, plan: PoolPlan) -> Result<KvPool<C>> {
        let elems = plan.num_slots() * c.kv_dim();
        let mut k = Vec::with_capacity(c.n_layers);
        let mut v = Vec::with_capacity(c.n_layers);
        for _ in 0..c.n_layers {
            k.push(stream.alloc_zeros::<C>(elems)?);
            v.push(stream.alloc_zeros::<C>(elems)?);
        }
        Ok(KvPool { k, v, plan })
    }

    /// Block `block` of `layers`, K then V of each, copied to the host as little-endian bytes
    /// (what a tier below the pool keeps; `kvlab_paged::tier`).
    ///
    /// # Errors
    /// [`CudaError::BadInput`] for a block outside the pool; driver errors.
    pub fn read_block(
        &self,
        stream: &Arc<CudaStream>,
        layers: &[usize],
        block: usize,
        kv_dim: usize,
    ) -> Result<Vec<u8>> {
        let range = self.block_range(block, kv_dim)?;
        let mut out = Vec::with_capacity(2 * layers.len() * range.len() * C::BYTES);
        for &l in layers {
            for t in [&self.k[l], &self.v[l]] {
                for x in stream.clone_dtoh(&t.slice(range.clone()))? {
                    x.to_le(&mut out);
                }
            }
        }
        Ok(out)
    }

    /// Overwrites block `block` of `layers` with bytes [`KvPool::read_block`] gave for the
    /// same layers.
    ///
    /// # Errors
    /// [`CudaError::BadInput`] for a block outside the pool or bytes of another length;
    /// driver errors.
    pub fn write_block(
        &mut self,
        stream: &Arc<CudaStream>,
        layers: &[usize],
        block: usize,
        kv_dim: usize,
        bytes: &[u8],
    ) -> Result<()> {
        let range = self.block_range(block, kv_dim)?;
        let per_tensor = range.len() * C::BYTES;
        if bytes.len() != 2 * layers.len() * per_tensor {
            return Err(CudaError::BadInput(format!(
                "{} bytes are not one block of {} layers ({} bytes)",
                bytes.len(),
                layers.len(),
                2 * layers.len() * per_tensor
            )));
        }
        let mut chunks = bytes.chunks_exact(per_tensor);
        for &l in layers {
            for t in [&mut self.k[l], &mut self.v[l]] {
                let chunk = chunks.next().unwrap_or_default();
                let host: Vec<C> = chunk.chunks_exact(C::BYTES).map(C::from_le).collect();
                stream.memcpy_htod(&host, &mut t.slice_mut(range.clone()))?;
            }
        }
        Ok(())
    }

    /// The elements of block `block` in a layer's tensor.
    fn block_range(&self, block: usize, kv_dim: usize) -> Result<std::ops::Range<usize>> {
        if block >= self.plan.num_blocks {
            return Err(CudaError::BadInput(format!(
                "block {block} is outside the pool of {} blocks",
                self.plan.num_blocks
            )));
        }
        let n = self.plan.block_size * kv_dim;
        Ok(block * n..(block + 1) * n)
    }
}

#[cfg(test)]
mod tests {
    use kvlab_model::LayerKind;

    use super::*;

    #[test]
    fn bytes_per_token_is_the_design_formula() {
        let c = Config::llama(4096, 14336, 32, 32, 8, 128_256, 8192, false);
        let p = plan(&c, 1000, 16, Precision::F16);
        assert_eq!(p.bytes_per_token, c.kv_bytes_per_token(2));
        assert_eq!(p.bytes_per_token, 131_072);
        assert_eq!(p.pool_bytes, 1000 * 16 * 131_072);
        assert_eq!(p.groups.len(), 1);
        assert_eq!(p.groups[0].layers.len(), 32);
        assert!(p.to_string().contains("131072 bytes/token"));
    }

    #[test]
    fn groups_split_global_and_window_layers() {
        let mut c = Config::llama(64, 128, 6, 4, 1, 512, 1024, true);
        c.layer_kinds = (0..6)
            .map(|l| {
                if l % 3 == 2 {
                    LayerKind::Global
                } else {
                    LayerKind::Local { window: 64 }
                }
            })
            .collect();
        let p = plan(&c, 10, 16, Precision::F32);
        assert_eq!(p.groups[0].window, None);
        assert_eq!(p.groups[0].layers, vec![2, 5]);
        assert_eq!(p.groups[1].window, Some(64));
        assert_eq!(p.groups[1].layers, vec![0, 1, 3, 4]);
        assert_eq!(p.bytes_per_token, c.kv_bytes_per_token(4));
        assert!(p.to_string().contains("window 64: 4 layers"));
    }

    #[test]
    fn budget_follows_the_utilization_fraction() {
        let gib = 1usize << 30;
        // 80 GiB GPU, 20 GiB in use after weights, 0.75 → 60 − 20 = 40 GiB (minus headroom).
        let blocks = blocks_for_budget(80 * gib, 60 * gib, 0.75, 0, 2 << 20).unwrap();
        assert_eq!(blocks, (60 * gib - 20 * gib) / (2 << 20));
        let with_headroom = blocks_for_budget(80 * gib, 60 * gib, 0.75, HEADROOM_BYTES, 2 << 20);
        assert_eq!(with_headroom.unwrap(), blocks - HEADROOM_BYTES / (2 << 20));
        let e = blocks_for_budget(80 * gib, 10 * gib, 0.5, 0, 1 << 20).unwrap_err();
        assert!(e.to_string().contains("raise the fraction"), "{e}");
        assert!(blocks_for_budget(gib, gib, 1.5, 0, 1).is_err());
        assert!(blocks_for_budget(gib, gib, 0.0, 0, 1).is_err());
    }
}

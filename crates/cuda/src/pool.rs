//! The paged KV pool on the device: its size, from free memory like vLLM's
//! `gpu_memory_utilization`, and its buffers.
//!
//! Each KV group (global layers; each sliding window) has its own pool of `num_blocks` blocks —
//! the same count in every group, the engine's `kvlab_paged::KvCacheConfig` — and every
//! layer of a group has a K and a V tensor `(num_blocks, block_size, n_kv_heads, head_dim)` in
//! the cache type, and for fp8-e4m3 and int8 a K and a V scale `(num_blocks, block_size,
//! n_kv_heads)` f32. Bytes per token of a group = layers in the group × n_kv_heads ×
//! `KvDtype::kv_head_bytes` of one token (2 × head_dim × bytes per element, plus 2 × 4 bytes of
//! scales for the 8-bit formats); summed over groups it is `KvDtype::bytes_per_token`, the
//! DESIGN's `2 × n_layers × n_kv_heads × head_dim × bytes` for the plain types.

use std::ops::Range;
use std::sync::Arc;

use cudarc::driver::{CudaSlice, CudaStream};
use kvlab_model::{Config, KvDtype};
use serde::Serialize;

use crate::dtype::CacheElem;
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
    /// layers × n_kv_heads × `KvDtype::kv_head_bytes` of one token (bytes).
    pub bytes_per_token: usize,
}

/// The pool's geometry and size: what `kvlab info`/`mem`-style reports print.
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
pub struct PoolPlan {
    pub num_blocks: usize,
    pub block_size: usize,
    pub kv_dtype: KvDtype,
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
///
/// # Errors
/// [`CudaError::Unsupported`] for int4, which the device pool does not store: its keys are
/// quantized per channel over a whole block (KIVI), and a block still filling would need an f32
/// copy kept beside it, which the device pool does not have yet (kvlab-cpu's pool has it).
pub fn plan(
    c: &Config,
    num_blocks: usize,
    block_size: usize,
    kv_dtype: KvDtype,
) -> Result<PoolPlan> {
    if kv_dtype == KvDtype::Int4 {
        return Err(CudaError::Unsupported(
            "--kv-dtype int4 on the cuda engine: its per-channel key groups need an f32 copy of \
             the block still filling, which the device pool does not keep yet; use f32, f16, \
             bf16, fp8-e4m3 or int8 (or --engine cpu-paged for int4)"
                .into(),
        ));
    }
    let groups: Vec<GroupPlan> = c
        .kv_cache_groups()
        .into_iter()
        .enumerate()
        .map(|(g, window)| {
            let layers: Vec<usize> = (0..c.n_layers)
                .filter(|&l| c.layer_cache_group(l) == g)
                .collect();
            let bytes_per_token =
                layers.len() * c.n_kv_heads * kv_dtype.kv_head_bytes(c.head_dim, 1, 1);
            GroupPlan {
                window,
                layers,
                bytes_per_token,
            }
        })
        .collect();
    let bytes_per_token = groups.iter().map(|g| g.bytes_per_token).sum();
    Ok(PoolPlan {
        num_blocks,
        block_size,
        kv_dtype,
        groups,
        bytes_per_token,
        pool_bytes: num_blocks * block_size * bytes_per_token,
    })
}

/// The pool's tensors. `k[l]`, `v[l]`: layer l's `(num_blocks, block_size, n_kv_heads,
/// head_dim)` cache, in the cache type `C`; `k_scale[l]`, `v_scale[l]`: its `(num_blocks,
/// block_size, n_kv_heads)` f32 scales when `C::SCALED`, else one unused element (the kernels
/// take a pointer either way).
pub struct KvPool<C> {
    pub k: Vec<CudaSlice<C>>,
    pub v: Vec<CudaSlice<C>>,
    pub k_scale: Vec<CudaSlice<f32>>,
    pub v_scale: Vec<CudaSlice<f32>>,
    pub plan: PoolPlan,
    /// Elements of one block in a layer's cache: block_size × kv_dim.
    block_elems: usize,
    /// Scales of one block in a layer's scale tensor: block_size × n_kv_heads (0 if unscaled).
    block_scales: usize,
}

impl<C: CacheElem> KvPool<C> {
    /// Allocates (zeroed) the tensors of `plan` for every layer of `c`.
    ///
    /// # Errors
    /// Driver errors (out of memory).
    pub fn allocate(stream: &Arc<CudaStream>, c: &Config, plan: PoolPlan) -> Result<KvPool<C>> {
        let elems = plan.num_slots() * c.kv_dim();
        let block_scales = if C::SCALED {
            plan.block_size * c.n_kv_heads
        } else {
            0
        };
        let scales = (plan.num_blocks * block_scales).max(1);
        let mut pool = KvPool {
            k: Vec::with_capacity(c.n_layers),
            v: Vec::with_capacity(c.n_layers),
            k_scale: Vec::with_capacity(c.n_layers),
            v_scale: Vec::with_capacity(c.n_layers),
            block_elems: plan.block_size * c.kv_dim(),
            block_scales,
            plan,
        };
        for _ in 0..c.n_layers {
            pool.k.push(stream.alloc_zeros::<C>(elems)?);
            pool.v.push(stream.alloc_zeros::<C>(elems)?);
            pool.k_scale.push(stream.alloc_zeros::<f32>(scales)?);
            pool.v_scale.push(stream.alloc_zeros::<f32>(scales)?);
        }
        Ok(pool)
    }

    /// Bytes of one block of one layer, K and V with their scales (what a tier keeps per layer).
    fn layer_block_bytes(&self) -> usize {
        2 * (self.block_elems * C::BYTES + self.block_scales * 4)
    }

    /// Block `block` of `layers`, copied to the host as little-endian bytes (what a tier below
    /// the pool keeps; `kvlab_paged::tier`): per layer, K's elements, K's scales, V's elements,
    /// V's scales (the scales only for the scaled formats).
    ///
    /// # Errors
    /// [`CudaError::BadInput`] for a block outside the pool; driver errors.
    pub fn read_block(
        &self,
        stream: &Arc<CudaStream>,
        layers: &[usize],
        block: usize,
    ) -> Result<Vec<u8>> {
        let (elems, scales) = self.block_ranges(block)?;
        let mut out = Vec::with_capacity(layers.len() * self.layer_block_bytes());
        for &l in layers {
            for (t, s) in [
                (&self.k[l], &self.k_scale[l]),
                (&self.v[l], &self.v_scale[l]),
            ] {
                append_le(stream, t, elems.clone(), &mut out)?;
                append_le(stream, s, scales.clone(), &mut out)?;
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
        bytes: &[u8],
    ) -> Result<()> {
        let (elems, scales) = self.block_ranges(block)?;
        let want = layers.len() * self.layer_block_bytes();
        if bytes.len() != want {
            return Err(CudaError::BadInput(format!(
                "{} bytes are not one block of {} layers ({want} bytes)",
                bytes.len(),
                layers.len(),
            )));
        }
        let mut rest = bytes;
        for &l in layers {
            let (k, v) = (&mut self.k[l], &mut self.v[l]);
            let (ks, vs) = (&mut self.k_scale[l], &mut self.v_scale[l]);
            for (t, s) in [(k, ks), (v, vs)] {
                rest = load_le(stream, t, elems.clone(), rest)?;
                rest = load_le(stream, s, scales.clone(), rest)?;
            }
        }
        Ok(())
    }

    /// The elements, and the scales (empty if unscaled), of block `block` in a layer's tensors.
    fn block_ranges(&self, block: usize) -> Result<(Range<usize>, Range<usize>)> {
        if block >= self.plan.num_blocks {
            return Err(CudaError::BadInput(format!(
                "block {block} is outside the pool of {} blocks",
                self.plan.num_blocks
            )));
        }
        let (e, s) = (self.block_elems, self.block_scales);
        Ok((block * e..(block + 1) * e, block * s..(block + 1) * s))
    }
}

/// Appends elements `range` of `t` to `out` as little-endian bytes (nothing for an empty range).
fn append_le<T: CacheElem>(
    stream: &Arc<CudaStream>,
    t: &CudaSlice<T>,
    range: Range<usize>,
    out: &mut Vec<u8>,
) -> Result<()> {
    if !range.is_empty() {
        for x in stream.clone_dtoh(&t.slice(range))? {
            x.to_le(out);
        }
    }
    Ok(())
}

/// Overwrites elements `range` of `t` with the front of `bytes` (as [`append_le`] wrote them;
/// the caller checked the length) and returns the rest.
fn load_le<'a, T: CacheElem>(
    stream: &Arc<CudaStream>,
    t: &mut CudaSlice<T>,
    range: Range<usize>,
    bytes: &'a [u8],
) -> Result<&'a [u8]> {
    let (head, rest) = bytes.split_at(range.len() * T::BYTES);
    if !range.is_empty() {
        let host: Vec<T> = head.chunks_exact(T::BYTES).map(T::from_le).collect();
        stream.memcpy_htod(&host, &mut t.slice_mut(range))?;
    }
    Ok(rest)
}

#[cfg(test)]
mod tests {
    use kvlab_model::LayerKind;

    use super::*;

    #[test]
    fn bytes_per_token_is_the_design_formula() {
        let c = Config::llama(4096, 14336, 32, 32, 8, 128_256, 8192, false);
        let p = plan(&c, 1000, 16, KvDtype::F16).unwrap();
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
        let p = plan(&c, 10, 16, KvDtype::F32).unwrap();
        assert_eq!(p.groups[0].window, None);
        assert_eq!(p.groups[0].layers, vec![2, 5]);
        assert_eq!(p.groups[1].window, Some(64));
        assert_eq!(p.groups[1].layers, vec![0, 1, 3, 4]);
        assert_eq!(p.bytes_per_token, c.kv_bytes_per_token(4));
        assert!(p.to_string().contains("window 64: 4 layers"));
    }

    /// The 8-bit formats add a scale per (token, KV head) to K and to V: what
    /// `KvDtype::bytes_per_token` counts, so `kvlab mem` and the device pool agree. int4 is
    /// refused with the reason.
    #[test]
    fn scaled_formats_count_their_scales_and_int4_is_refused() {
        let c = Config::llama(64, 128, 4, 4, 2, 512, 1024, true);
        for dtype in [KvDtype::Bf16, KvDtype::Fp8E4m3, KvDtype::Int8] {
            let p = plan(&c, 10, 16, dtype).unwrap();
            assert_eq!(p.bytes_per_token, dtype.bytes_per_token(&c), "{dtype}");
            assert_eq!(p.pool_bytes, 10 * dtype.bytes_per_block(&c, 16), "{dtype}");
        }
        // int8: 2 (K, V) × 4 layers × 2 KV heads × (16 codes + a 4-byte scale).
        assert_eq!(
            plan(&c, 1, 16, KvDtype::Int8).unwrap().bytes_per_token,
            2 * 4 * 2 * 20
        );
        let e = plan(&c, 10, 16, KvDtype::Int4).unwrap_err();
        assert!(e.to_string().contains("cpu-paged"), "{e}");
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

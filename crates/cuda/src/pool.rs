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
//!
//! int4 (KIVI) counts per block, `KvDtype::bytes_per_block`: codes `(num_slots, n_kv_heads,
//! ⌈head_dim / 2⌉)` for K and V, an (s, min) pair per key channel per block and per value
//! group of 32 channels per token. Beside the pool, each layer has `residuals` f32 blocks of
//! keys still filling (`residual.rs`), counted apart as `residual_bytes`.

use std::ops::Range;
use std::sync::Arc;

use cudarc::driver::{CudaSlice, CudaStream};
use kvlab_model::{Config, KvDtype};
use serde::Serialize;

use crate::dtype::CacheElem;
use crate::error::{CudaError, Result};
use crate::ops::{Dev, Int4Keys, Int4Op, Launcher, Ops, cache_sizes};
use crate::residual::Residuals;

/// Bytes kept free beyond the utilization fraction for cuBLAS workspaces and the driver.
pub const HEADROOM_BYTES: usize = 256 << 20;

/// One KV group of the pool.
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
pub struct GroupPlan {
    /// `None` for global attention, `Some(window)` for a sliding window.
    pub window: Option<usize>,
    /// Layers in this group, in model order.
    pub layers: Vec<usize>,
    /// layers × n_kv_heads × `KvDtype::kv_head_bytes` of one token (bytes); for int4 a
    /// block's bytes over its tokens, rounded up.
    pub bytes_per_token: usize,
    /// layers × n_kv_heads × `KvDtype::kv_head_bytes` of one block (bytes, exact).
    pub bytes_per_block: usize,
}

/// The pool's geometry and size: what `kvlab info`/`mem`-style reports print.
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
pub struct PoolPlan {
    /// Blocks in each group's pool (the same count in every group).
    pub num_blocks: usize,
    /// Token slots per block.
    pub block_size: usize,
    /// The type keys and values are stored in (`--kv-dtype`).
    pub kv_dtype: KvDtype,
    /// (num_groups,) in `Config::kv_cache_groups` order.
    pub groups: Vec<GroupPlan>,
    /// Σ over groups: the bytes one token position takes in every group.
    pub bytes_per_token: usize,
    /// Bytes of the whole pool: num_blocks × Σ groups' bytes_per_block (= num_blocks ×
    /// block_size × bytes_per_token but for int4's rounding).
    pub pool_bytes: usize,
    /// int4: f32 blocks of keys still filling per layer (`residual.rs`); 0 otherwise.
    pub residuals: usize,
    /// int4: bytes of those residuals, residuals × block_size × kv_dim × 4 × n_layers.
    pub residual_bytes: usize,
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
        if self.residuals > 0 {
            write!(
                f,
                ", plus {} f32 blocks of int4 keys still filling ({:.2} GiB)",
                self.residuals,
                self.residual_bytes as f64 / (1u64 << 30) as f64
            )?;
        }
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

/// A plan for `num_blocks` blocks: the groups of `c` with their layers and bytes per token
/// (no int4 residuals yet: [`PoolPlan::with_residuals`]).
///
/// # Errors
/// [`CudaError::Unsupported`] for a block size of 0.
pub fn plan(
    c: &Config,
    num_blocks: usize,
    block_size: usize,
    kv_dtype: KvDtype,
) -> Result<PoolPlan> {
    if block_size == 0 {
        return Err(CudaError::Unsupported("block_size 0".into()));
    }
    let groups: Vec<GroupPlan> = c
        .kv_cache_groups()
        .into_iter()
        .enumerate()
        .map(|(g, window)| {
            let layers: Vec<usize> = (0..c.n_layers)
                .filter(|&l| c.layer_cache_group(l) == g)
                .collect();
            let per_head = kv_dtype.kv_head_bytes(c.head_dim, block_size, block_size);
            let bytes_per_block = layers.len() * c.n_kv_heads * per_head;
            GroupPlan {
                window,
                layers,
                bytes_per_token: bytes_per_block.div_ceil(block_size),
                bytes_per_block,
            }
        })
        .collect();
    let bytes_per_token = groups.iter().map(|g| g.bytes_per_token).sum();
    let bytes_per_block: usize = groups.iter().map(|g| g.bytes_per_block).sum();
    Ok(PoolPlan {
        num_blocks,
        block_size,
        kv_dtype,
        groups,
        bytes_per_token,
        pool_bytes: num_blocks * bytes_per_block,
        residuals: 0,
        residual_bytes: 0,
    })
}

impl PoolPlan {
    /// The plan with `residuals` f32 blocks of int4 keys per layer (none for the other dtypes).
    pub fn with_residuals(mut self, c: &Config, residuals: usize) -> PoolPlan {
        if self.kv_dtype == KvDtype::Int4 {
            self.residuals = residuals;
            self.residual_bytes = residuals * self.block_size * c.kv_dim() * 4 * c.n_layers;
        }
        self
    }
}

/// The pool's tensors. `k[l]`, `v[l]`: layer l's `(num_blocks, block_size, n_kv_heads,
/// head_dim)` cache, in the cache type `C` (int4: `⌈head_dim / 2⌉` bytes a head); `k_scale[l]`,
/// `v_scale[l]`: its `(num_blocks, block_size, n_kv_heads)` f32 scales when `C::SCALED`, int4's
/// (s, min) pairs (`kernels/cache.cu`), else one unused element (the kernels take a pointer
/// either way).
pub struct KvPool<C> {
    /// (n_layers,) × (num_blocks, block_size, n_kv_heads, head_dim) keys.
    pub k: Vec<CudaSlice<C>>,
    /// (n_layers,) × (num_blocks, block_size, n_kv_heads, head_dim) values.
    pub v: Vec<CudaSlice<C>>,
    /// (n_layers,) × key scales: (num_blocks, block_size, n_kv_heads) f32 when scaled, int4's
    /// (s, min) pairs, else one unused element.
    pub k_scale: Vec<CudaSlice<f32>>,
    /// (n_layers,) × value scales, laid out as `k_scale`'s (int4: per value group).
    pub v_scale: Vec<CudaSlice<f32>>,
    /// int4: per layer, `(residuals, block_size, kv_dim)` f32 keys of blocks still filling;
    /// else one unused element.
    pub k_residual: Vec<CudaSlice<f32>>,
    /// int4: per KV cache group, which residual holds which block (empty otherwise).
    pub residuals: Vec<Residuals>,
    /// int4: per group, `(2, num_blocks)` i32 on the device: the write map, then the read map
    /// of the step (`residual.rs`); one unused element otherwise.
    pub maps: Vec<CudaSlice<i32>>,
    /// The geometry and size the tensors were allocated for.
    pub plan: PoolPlan,
    /// Elements of one block in a layer's cache: block_size × `row_elems`.
    block_elems: usize,
    /// f32s of one block in a layer's `k_scale`: block_size × n_kv_heads (scaled), 2 × kv_dim
    /// (int4), 0 (unscaled); and in `v_scale` (int4: 2 × block_size × n_kv_heads × groups).
    k_block_scales: usize,
    v_block_scales: usize,
    /// f32s of one residual: block_size × kv_dim (int4), else 0.
    residual_floats: usize,
    /// (n_kv_heads, head_dim).
    heads: (usize, usize),
}

impl<C: CacheElem> KvPool<C> {
    /// Allocates (zeroed) the tensors of `plan` for every layer of `c`.
    ///
    /// # Errors
    /// Driver errors (out of memory).
    pub fn allocate(stream: &Arc<CudaStream>, c: &Config, plan: PoolPlan) -> Result<KvPool<C>> {
        let (bs, heads) = (plan.block_size, (c.n_kv_heads, c.head_dim));
        // One block's elements of each tensor, and one residual's.
        let [
            block_elems,
            k_block_scales,
            v_block_scales,
            residual_floats,
            _,
        ] = cache_sizes::<C>(bs, bs, heads, 1);
        let residuals = if C::INT4 { plan.residuals.max(1) } else { 0 };
        let mut pool = KvPool {
            k: Vec::with_capacity(c.n_layers),
            v: Vec::with_capacity(c.n_layers),
            k_scale: Vec::with_capacity(c.n_layers),
            v_scale: Vec::with_capacity(c.n_layers),
            k_residual: Vec::with_capacity(c.n_layers),
            residuals: Vec::new(),
            maps: Vec::new(),
            block_elems,
            k_block_scales,
            v_block_scales,
            residual_floats,
            heads,
            plan,
        };
        let n = pool.plan.num_blocks;
        for _ in 0..c.n_layers {
            pool.k.push(stream.alloc_zeros::<C>(n * pool.block_elems)?);
            pool.v.push(stream.alloc_zeros::<C>(n * pool.block_elems)?);
            pool.k_scale
                .push(stream.alloc_zeros::<f32>((n * k_block_scales).max(1))?);
            pool.v_scale
                .push(stream.alloc_zeros::<f32>((n * v_block_scales).max(1))?);
            let floats = (residuals * residual_floats).max(1);
            pool.k_residual.push(stream.alloc_zeros::<f32>(floats)?);
        }
        for _ in &pool.plan.groups {
            if C::INT4 {
                pool.residuals.push(Residuals::new(n, bs, residuals));
                pool.maps.push(stream.clone_htod(&vec![-1i32; 2 * n])?);
            } else {
                pool.maps.push(stream.alloc_zeros::<i32>(1)?);
            }
        }
        Ok(pool)
    }

    /// The layers of KV cache group `group`.
    ///
    /// # Errors
    /// [`CudaError::BadInput`] for a group the pool does not have.
    pub fn group_layers(&self, group: usize) -> Result<&[usize]> {
        let groups = &self.plan.groups;
        groups
            .get(group)
            .map(|g| g.layers.as_slice())
            .ok_or_else(|| {
                CudaError::BadInput(format!(
                    "KV cache group {group} is not one of the pool's {}",
                    groups.len()
                ))
            })
    }

    /// Bytes of one block of one layer, K and V with their scales (what a tier keeps per layer;
    /// int4 adds a flag byte and, for a block still filling, its f32 residual).
    fn layer_block_bytes(&self) -> usize {
        2 * self.block_elems * C::BYTES + 4 * (self.k_block_scales + self.v_block_scales)
    }

    /// Block `block` of group `group`, copied to the host as little-endian bytes (what a tier
    /// below the pool keeps; `kvlab_paged::tier`): per layer, K's elements, K's scales, V's
    /// elements, V's scales (the scales only for the scaled formats). int4 in kvlab-cpu's
    /// `KvPool::save_block` layout: per layer K's codes, its channels' scales, their minima, a
    /// flag byte (1: the block is still filling) and then its f32 residual, V's codes, its
    /// groups' scales, their minima.
    ///
    /// # Errors
    /// [`CudaError::BadInput`] for a block or group outside the pool; driver errors.
    pub fn read_block(
        &self,
        stream: &Arc<CudaStream>,
        group: usize,
        block: usize,
    ) -> Result<Vec<u8>> {
        let (elems, k_scales, v_scales) = self.block_ranges(block)?;
        let layers = self.group_layers(group)?;
        let mut out = Vec::with_capacity(layers.len() * self.layer_block_bytes());
        for &l in layers {
            append_le(stream, &self.k[l], elems.clone(), &mut out)?;
            if C::INT4 {
                append_pairs(stream, &self.k_scale[l], k_scales.clone(), &mut out)?;
                let residual = self.residuals[group].residual_of(block);
                out.push(u8::from(residual.is_some()));
                if let Some(r) = residual {
                    let floats = self.residual_floats;
                    append_le(
                        stream,
                        &self.k_residual[l],
                        r * floats..(r + 1) * floats,
                        &mut out,
                    )?;
                }
                append_le(stream, &self.v[l], elems.clone(), &mut out)?;
                append_pairs(stream, &self.v_scale[l], v_scales.clone(), &mut out)?;
            } else {
                append_le(stream, &self.k_scale[l], k_scales.clone(), &mut out)?;
                append_le(stream, &self.v[l], elems.clone(), &mut out)?;
                append_le(stream, &self.v_scale[l], v_scales.clone(), &mut out)?;
            }
        }
        Ok(out)
    }

    /// Overwrites block `block` of group `group` with bytes [`KvPool::read_block`] gave for the
    /// same group. int4: a block still filling takes a residual (closing another block early
    /// if none is free, through `ops`), a complete one gives its residual back.
    ///
    /// # Errors
    /// [`CudaError::BadInput`] for a block or group outside the pool, or bytes of another
    /// length or layout (nothing is written then); driver errors.
    pub fn write_block(
        &mut self,
        ops: &Ops,
        group: usize,
        block: usize,
        bytes: &[u8],
    ) -> Result<()> {
        let layers = self.group_layers(group)?.to_vec();
        if C::INT4 {
            return self.write_block_int4(ops, group, block, &layers, bytes);
        }
        let (elems, k_scales, v_scales) = self.block_ranges(block)?;
        let stream = &ops.stream;
        let want = layers.len() * self.layer_block_bytes();
        if bytes.len() != want {
            return Err(bad_length(bytes.len(), layers.len(), want));
        }
        let mut rest = bytes;
        for &l in &layers {
            rest = load_le(stream, &mut self.k[l], elems.clone(), rest)?;
            rest = load_le(stream, &mut self.k_scale[l], k_scales.clone(), rest)?;
            rest = load_le(stream, &mut self.v[l], elems.clone(), rest)?;
            rest = load_le(stream, &mut self.v_scale[l], v_scales.clone(), rest)?;
        }
        Ok(())
    }

    /// [`KvPool::write_block`] for int4: every layer's bytes are parsed before anything is
    /// written.
    fn write_block_int4(
        &mut self,
        ops: &Ops,
        group: usize,
        block: usize,
        layers: &[usize],
        bytes: &[u8],
    ) -> Result<()> {
        let (elems, k_scales, v_scales) = self.block_ranges(block)?;
        let (codes, floats) = (elems.len(), self.residual_floats);
        let malformed = || {
            bad_length(
                bytes.len(),
                layers.len(),
                layers.len() * self.layer_block_bytes(),
            )
        };
        let mut rest = bytes;
        let mut take = |n: usize| -> Result<&[u8]> {
            let (head, tail) = rest.split_at_checked(n).ok_or_else(malformed)?;
            rest = tail;
            Ok(head)
        };
        // (K codes, K pairs, residual, V codes, V pairs) of each layer.
        let mut parsed = Vec::with_capacity(layers.len());
        for _ in layers {
            let k = take(codes)?;
            let k_pairs = take(4 * k_scales.len())?;
            let residual = match take(1)?[0] {
                0 => None,
                1 => Some(take(4 * floats)?),
                _ => return Err(malformed()),
            };
            let v = take(codes)?;
            let v_pairs = take(4 * v_scales.len())?;
            parsed.push((k, k_pairs, residual, v, v_pairs));
        }
        let open = parsed.first().is_some_and(|p| p.2.is_some());
        if !rest.is_empty() || parsed.iter().any(|p| p.2.is_some() != open) {
            return Err(malformed());
        }
        let (residual, close_early) = self.residuals[group].restore(block, open)?;
        self.close_keys(ops, layers, &close_early)?;
        let stream = &ops.stream;
        for (&l, (k, k_pairs, r_bytes, v, v_pairs)) in layers.iter().zip(parsed) {
            load_le(stream, &mut self.k[l], elems.clone(), k)?;
            load_pairs(stream, &mut self.k_scale[l], k_scales.clone(), k_pairs)?;
            if let (Some(r), Some(r_bytes)) = (residual, r_bytes) {
                load_le(
                    stream,
                    &mut self.k_residual[l],
                    r * floats..(r + 1) * floats,
                    r_bytes,
                )?;
            }
            load_le(stream, &mut self.v[l], elems.clone(), v)?;
            load_pairs(stream, &mut self.v_scale[l], v_scales.clone(), v_pairs)?;
        }
        Ok(())
    }

    /// int4: quantizes the keys of `pairs` (block, residual) in every layer of `layers`
    /// (`int4_close_keys_v1`).
    ///
    /// # Errors
    /// Launch errors.
    pub fn close_keys(&self, ops: &Ops, layers: &[usize], pairs: &[[i32; 2]]) -> Result<()> {
        if pairs.is_empty() {
            return Ok(());
        }
        let flat: Vec<i32> = pairs.iter().flatten().copied().collect();
        let dev_pairs = ops.stream.clone_htod(&flat)?;
        for &l in layers {
            let t = self.int4_args(ops, l)?;
            ops.int4_keys(Int4Op::Close, t, ops.dev(&dev_pairs), pairs.len())?;
        }
        Ok(())
    }

    /// The int4 tensors of layer `l` and the pool's shape, for [`Ops::int4_keys`].
    ///
    /// # Errors
    /// [`CudaError::BadInput`] if the pool is not int4.
    pub fn int4_args(&self, ops: &Ops, l: usize) -> Result<Int4Keys> {
        let (n_kv_heads, head_dim) = self.heads;
        Ok(Int4Keys {
            k_cache: ops.dev(&self.k[l]).cast()?,
            k_scale: ops.dev(&self.k_scale[l]),
            k_residual: ops.dev(&self.k_residual[l]),
            num_blocks: self.plan.num_blocks,
            block_size: self.plan.block_size,
            residuals: self.residual_count(),
            n_kv_heads,
            head_dim,
        })
    }

    /// Copy-on-write: blocks `pairs` (n_pairs, 2) = (src, dst) of layer `l`, elements and
    /// scales (an int4 block's residual is copied apart, by the residual plan's copies).
    ///
    /// # Errors
    /// Short buffers, launch errors.
    pub fn copy_blocks(&self, ops: &Ops, l: usize, pairs: Dev<i32>, n_pairs: usize) -> Result<()> {
        let nb = self.plan.num_blocks;
        let (k, v) = (ops.dev(&self.k[l]), ops.dev(&self.v[l]));
        ops.copy_blocks(k, Some(v), pairs, n_pairs, nb, self.block_elems)?;
        if self.k_block_scales > 0 {
            let (ks, vs) = (ops.dev(&self.k_scale[l]), ops.dev(&self.v_scale[l]));
            ops.copy_blocks(ks, None, pairs, n_pairs, nb, self.k_block_scales)?;
            ops.copy_blocks(vs, None, pairs, n_pairs, nb, self.v_block_scales)?;
        }
        Ok(())
    }

    /// int4 residuals per layer (0 for the other dtypes).
    pub fn residual_count(&self) -> usize {
        self.residuals.first().map_or(0, Residuals::capacity)
    }

    /// The elements, K's scales and V's scales (empty if unscaled) of block `block` in a
    /// layer's tensors.
    fn block_ranges(&self, block: usize) -> Result<(Range<usize>, Range<usize>, Range<usize>)> {
        if block >= self.plan.num_blocks {
            return Err(CudaError::BadInput(format!(
                "block {block} is outside the pool of {} blocks",
                self.plan.num_blocks
            )));
        }
        let at = |n: usize| block * n..(block + 1) * n;
        Ok((
            at(self.block_elems),
            at(self.k_block_scales),
            at(self.v_block_scales),
        ))
    }
}

fn bad_length(got: usize, layers: usize, want: usize) -> CudaError {
    CudaError::BadInput(format!(
        "{got} bytes are not one block of {layers} layers ({want} bytes, int4 more for a block \
         still filling)"
    ))
}

/// Appends int4's (s, min) pairs `range` of `t` (f32s, interleaved) as kvlab-cpu stores them:
/// every s, then every min, little-endian.
fn append_pairs(
    stream: &Arc<CudaStream>,
    t: &CudaSlice<f32>,
    range: Range<usize>,
    out: &mut Vec<u8>,
) -> Result<()> {
    let pairs = stream.clone_dtoh(&t.slice(range))?;
    for x in pairs
        .iter()
        .step_by(2)
        .chain(pairs.iter().skip(1).step_by(2))
    {
        out.extend_from_slice(&x.to_le_bytes());
    }
    Ok(())
}

/// Overwrites int4's (s, min) pairs `range` of `t` from bytes [`append_pairs`] wrote (the
/// caller checked the length).
fn load_pairs(
    stream: &Arc<CudaStream>,
    t: &mut CudaSlice<f32>,
    range: Range<usize>,
    bytes: &[u8],
) -> Result<()> {
    let x: Vec<f32> = bytes
        .chunks_exact(4)
        .map(|b| f32::from_le_bytes([b[0], b[1], b[2], b[3]]))
        .collect();
    let (s, m) = x.split_at(x.len() / 2);
    let pairs: Vec<f32> = s.iter().zip(m).flat_map(|(&s, &m)| [s, m]).collect();
    stream.memcpy_htod(&pairs, &mut t.slice_mut(range))?;
    Ok(())
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
    /// `KvDtype::bytes_per_token` counts, so `kvlab mem` and the device pool agree. int4 counts
    /// whole blocks, and its residuals apart.
    #[test]
    fn scaled_formats_count_their_scales_and_int4_its_blocks() {
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
        // int4 at head_dim 16, blocks of 16: per KV head and layer, keys 16 × 8 code bytes +
        // 16 channels × 8 B, values 16 × (8 + 8) B.
        let p = plan(&c, 10, 16, KvDtype::Int4).unwrap();
        assert_eq!(p.pool_bytes, 10 * KvDtype::Int4.bytes_per_block(&c, 16));
        assert_eq!(p.pool_bytes, 10 * 4 * 2 * (16 * 8 + 16 * 8 + 16 * 16));
        assert_eq!(p.residual_bytes, 0);
        let p = p.with_residuals(&c, 3);
        assert_eq!(p.residual_bytes, 3 * 16 * c.kv_dim() * 4 * 4);
        assert!(p.to_string().contains("3 f32 blocks of int4 keys"), "{p}");
        let f16 = plan(&c, 10, 16, KvDtype::F16)
            .unwrap()
            .with_residuals(&c, 3);
        assert_eq!(f16.residual_bytes, 0);
        assert!(plan(&c, 10, 0, KvDtype::F16).is_err());
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

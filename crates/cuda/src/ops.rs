//! Typed launches of every kernel: the forward pass and the kernel tests call these, never
//! `launch_builder` directly. Each wrapper (a provided method of [`Launcher`]) checks that every
//! buffer holds the elements its shape needs before launching, takes its grid from `launch.rs`,
//! and names the entry point `<kernel>_v<version>_<types>` from the element types; [`Ops`] runs
//! them on the GPU, the tests' emulator (kvlab-cuda-emu) on the CPU.

use std::collections::HashMap;
use std::marker::PhantomData;
use std::ops::Range;
use std::sync::{Arc, Mutex};

use cudarc::cublas::CudaBlas;
use cudarc::driver::{
    CudaFunction, CudaModule, CudaSlice, CudaStream, DevicePtr, LaunchConfig, PushKernelArg,
};
use cudarc::nvrtc::Ptx;
use kvlab_model::{Activation, KvDtype};

use crate::device::Device;
use crate::dtype::{CacheElem, DType, Int4x2, row_elems};
use crate::error::{CudaError, Result};
use crate::kernels::{FILES, KernelFile};
use crate::launch::{self, i32_of};
use crate::nvrtc;

/// A device buffer's address and length, typed. Obtained from a live [`CudaSlice`] of the
/// engine's stream; sub-ranges are bounds-checked. Kernels get the raw address.
pub struct Dev<T> {
    ptr: u64,
    len: usize,
    _t: PhantomData<fn() -> T>,
}

impl<T> Clone for Dev<T> {
    fn clone(&self) -> Self {
        *self
    }
}
impl<T> Copy for Dev<T> {}

impl<T> std::fmt::Debug for Dev<T> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "Dev({:#x}, {})", self.ptr, self.len)
    }
}

impl<T> Dev<T> {
    /// Elements.
    pub fn len(self) -> usize {
        self.len
    }

    /// Whether it holds no element.
    pub fn is_empty(self) -> bool {
        self.len == 0
    }

    /// Elements `r` of this buffer.
    ///
    /// # Errors
    /// [`CudaError::BadInput`] if `r` is not inside it.
    pub fn range(self, r: Range<usize>) -> Result<Dev<T>> {
        if r.start > r.end || r.end > self.len {
            return Err(CudaError::BadInput(format!(
                "range {r:?} of a device buffer of {} elements",
                self.len
            )));
        }
        Ok(Dev {
            ptr: self.ptr + (r.start * size_of::<T>()) as u64,
            len: r.end - r.start,
            _t: PhantomData,
        })
    }

    /// The same bytes as elements of `U`, which has `T`'s size (checked).
    ///
    /// # Errors
    /// [`CudaError::BadInput`] for types of different sizes.
    pub fn cast<U>(self) -> Result<Dev<U>> {
        if size_of::<T>() != size_of::<U>() {
            return Err(CudaError::BadInput(format!(
                "a device buffer of {}-byte elements read as {}-byte ones",
                size_of::<T>(),
                size_of::<U>()
            )));
        }
        Ok(Dev {
            ptr: self.ptr,
            len: self.len,
            _t: PhantomData,
        })
    }

    /// A buffer of `len` elements at address `ptr` that is not a cudarc slice: host memory the
    /// CPU emulator of the kernels reads and writes (kvlab-cuda-emu, in tests).
    ///
    /// # Safety
    /// `ptr` addresses `len` live elements of `T`, valid for reads and writes for as long as
    /// any kernel launched with this `Dev` runs.
    pub unsafe fn from_raw_parts(ptr: u64, len: usize) -> Dev<T> {
        Dev {
            ptr,
            len,
            _t: PhantomData,
        }
    }

    /// The address, after checking the buffer holds at least `n` elements.
    ///
    /// # Errors
    /// [`CudaError::BadInput`] naming `what`.
    pub fn need(self, n: usize, what: &str) -> Result<u64> {
        if self.len < n {
            return Err(CudaError::BadInput(format!(
                "{what}: the buffer holds {} elements, the kernel needs {n}",
                self.len
            )));
        }
        Ok(self.ptr)
    }
}

/// Every kernel of `kernels/*.cu`, compiled for one GPU and loaded.
pub struct Kernels {
    functions: HashMap<&'static str, CudaFunction>,
}

impl Kernels {
    /// Compiles (or takes from the process cache) and loads every kernel for `dev`.
    ///
    /// # Errors
    /// Missing NVRTC or headers, a compile error, or a driver error loading a module.
    pub fn load(dev: &Device) -> Result<Kernels> {
        let mut functions = HashMap::new();
        for file in FILES {
            let module = load_module(dev, file)?;
            for &entry in file.entries {
                functions.insert(entry, module.load_function(entry)?);
            }
        }
        Ok(Kernels { functions })
    }

    /// The loaded entry point `name`.
    ///
    /// # Errors
    /// [`CudaError::MissingKernel`].
    pub fn get(&self, name: &str) -> Result<&CudaFunction> {
        self.functions
            .get(name)
            .ok_or_else(|| CudaError::MissingKernel(name.to_string()))
    }
}

/// Loads `file` for `dev`: its cubin for the device's `sm_XY` when NVRTC can build it and the
/// driver takes it, else its PTX (JIT-compiled by the driver). A fallback is reported on stderr
/// once per file and process, with the reason, because PTX from an NVRTC newer than the driver
/// fails to load (`CUDA_ERROR_UNSUPPORTED_PTX_VERSION`) where the cubin would not.
///
/// # Errors
/// When the cubin fails: the PTX's compile error, or the driver's error loading it (with the
/// cubin's failure named).
fn load_module(dev: &Device, file: &KernelFile) -> Result<Arc<CudaModule>> {
    let sm = nvrtc::sm_arch_for(dev.info.compute_capability);
    let why = match nvrtc::compiled(file, &sm, nvrtc::Output::Cubin) {
        Ok(cubin) => match dev.ctx.load_module(Ptx::from_binary(cubin.to_vec())) {
            Ok(module) => return Ok(module),
            Err(e) => format!("the driver refused its {sm} cubin: {e:?}"),
        },
        Err(e) => e.to_string(),
    };
    // The fallback, compiled only now: PTX the driver JIT-compiles, NUL-terminated as the
    // driver reads it as a C string.
    let arch = nvrtc::arch_for(dev.info.compute_capability);
    static WARNED: Mutex<Vec<&'static str>> = Mutex::new(Vec::new());
    let mut warned = WARNED.lock().unwrap_or_else(|p| p.into_inner());
    if !warned.contains(&file.file) {
        warned.push(file.file);
        eprintln!(
            "warning: kernels/{}: loading PTX for {arch} instead of a cubin ({why})",
            file.file
        );
    }
    drop(warned);
    let mut ptx = nvrtc::compiled(file, &arch, nvrtc::Output::Ptx)?.to_vec();
    ptx.push(0);
    dev.ctx.load_module(Ptx::from_binary(ptx)).map_err(|e| {
        CudaError::Unsupported(format!(
            "the driver could not load kernels/{} as {arch} PTX ({e:?}; the cubin failed too: \
             {why}); a CUDA_ERROR_UNSUPPORTED_PTX_VERSION means the NVRTC is newer than the driver",
            file.file
        ))
    })
}

/// The inputs of one attention launch (decode or prefill) for one layer.
///
/// Shapes: `out`, `q` (n_tokens, n_heads, head_dim); `k_new`, `v_new` (n_tokens, n_kv_heads,
/// head_dim); `k_cache`, `v_cache` (num_slots, n_kv_heads, head_dim); `k_scale`, `v_scale`
/// (num_slots, n_kv_heads) f32 when the cache type is scaled (else any one element), int4's
/// (s, min) pairs for int4 ([`cache_sizes`]); `k_residual` (residuals, block_size, kv_dim) and
/// `read_map` (num_blocks,) for int4 (else any one element);
/// `block_tables`
/// (n_seqs, max_blocks); `query_start_loc` (n_seqs + 1,); `context_lens`, (n_seqs,);
/// `token_seq` (n_tokens,).
pub struct AttentionArgs<A, C> {
    /// (n_tokens, n_heads, head_dim) the attention output, one row per query token.
    pub out: Dev<A>,
    /// (n_tokens, n_heads, head_dim) the step's queries, after RoPE.
    pub q: Dev<A>,
    /// (n_tokens, n_kv_heads, head_dim) the step's own keys: positions from pos0 on are read
    /// here, not from the pool.
    pub k_new: Dev<A>,
    /// (n_tokens, n_kv_heads, head_dim) the step's own values.
    pub v_new: Dev<A>,
    /// (num_slots, n_kv_heads, head_dim) the layer's keys in the pool, in the cache type.
    pub k_cache: Dev<C>,
    /// (num_slots, n_kv_heads, head_dim) the layer's values in the pool.
    pub v_cache: Dev<C>,
    /// Key scales: (num_slots, n_kv_heads) for fp8-e4m3 and int8, int4's (num_blocks, kv_dim, 2)
    /// (s, min) per channel, else any one element.
    pub k_scale: Dev<f32>,
    /// Value scales: (num_slots, n_kv_heads) for fp8-e4m3 and int8, int4's (num_slots,
    /// n_kv_heads, ⌈head_dim / 32⌉, 2) (s, min) per group, else any one element.
    pub v_scale: Dev<f32>,
    /// int4: (residuals, block_size, kv_dim) f32 keys of blocks still filling.
    pub k_residual: Dev<f32>,
    /// int4: (num_blocks,) the residual a block's keys are read from, -1 once quantized.
    pub read_map: Dev<i32>,
    /// (n_seqs, max_blocks) each sequence's block ids, row-major, -1 padded.
    pub block_tables: Dev<i32>,
    /// (n_seqs + 1,) cumulative query lengths: sequence s's tokens are rows
    /// `query_start_loc[s]..query_start_loc[s + 1]`.
    pub query_start_loc: Dev<i32>,
    /// (n_seqs,) keys per sequence after the step, its new tokens included.
    pub context_lens: Dev<i32>,
    /// (n_tokens,) sequence index of each query token (the prefill kernel's row → sequence).
    pub token_seq: Dev<i32>,
    /// Query tokens of the step, decode and prefill rows together.
    pub n_tokens: usize,
    /// Sequences of the step; the decode kernels take the leading n_decode of them.
    pub n_seqs: usize,
    /// Columns of `block_tables`.
    pub max_blocks: usize,
    /// Query heads.
    pub n_heads: usize,
    /// Key/value heads; query head h reads KV head h / (n_heads / n_kv_heads).
    pub n_kv_heads: usize,
    /// Elements per head: even, at most [`launch::MAX_HEAD_DIM`].
    pub head_dim: usize,
    /// Token slots per block.
    pub block_size: usize,
    /// Slots in the pool (num_blocks · block_size).
    pub num_slots: usize,
    /// int4's residuals per layer (0 otherwise).
    pub residuals: usize,
    /// 0 for global attention.
    pub window: usize,
    /// Score scale, 1/√head_dim unless the model says otherwise.
    pub scale: f32,
}

/// What [`Ops::int4_keys`] does to whole blocks of int4 keys.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Int4Op {
    /// Residual → codes and (s, min) per channel: the block is complete.
    Close,
    /// Codes → residual: a complete block is written again.
    Open,
}

/// One layer's int4 key tensors and the pool's shape (`KvPool::int4_args`).
#[derive(Clone, Copy, Debug)]
pub struct Int4Keys {
    /// (num_blocks, block_size, n_kv_heads, ⌈head_dim / 2⌉) codes.
    pub k_cache: Dev<Int4x2>,
    /// (num_blocks, kv_dim, 2) (s, min) per channel.
    pub k_scale: Dev<f32>,
    /// (residuals, block_size, kv_dim) f32.
    pub k_residual: Dev<f32>,
    /// Blocks in the layer's pool.
    pub num_blocks: usize,
    /// Token slots per block.
    pub block_size: usize,
    /// f32 residual blocks of the layer.
    pub residuals: usize,
    /// Key heads.
    pub n_kv_heads: usize,
    /// Elements per head (two int4 codes a byte).
    pub head_dim: usize,
}

/// One kernel argument, typed as the kernel's parameter list types it: a device address, an
/// `int`, a `long long` or a `float`.
#[derive(Clone, Copy, Debug, PartialEq)]
pub enum Arg {
    /// A device address (`T*`), from a checked [`Dev`].
    Ptr(u64),
    /// An `int`: counts and sizes (checked to fit by [`i32_of`]).
    I32(i32),
    /// A `long long`: element counts that may pass 2³¹.
    I64(i64),
    /// A `float`, e.g. the attention scale or an epsilon.
    F32(f32),
}
use Arg::{F32, I32, I64, Ptr};

/// Raw kernel arguments shared by the attention kernels, after the bounds checks.
struct AttnPtrs {
    out: u64,
    /// q, k_new, v_new, k_cache, v_cache, k_scale, v_scale, k_residual, read_map,
    /// block_tables, query_start_loc, context_lens: the buffers every attention kernel takes
    /// after its outputs, in this order.
    inputs: [Arg; 12],
    token_seq: u64,
    /// max_blocks, n_heads, n_kv_heads, head_dim, block_size, window, scale: what every
    /// attention kernel takes after its buffers, in this order.
    shape: [Arg; 7],
}

/// Elements a layer's tensors of cache type `C` hold in a pool of `num_slots` slots in blocks
/// of `block_size`, with `residuals` int4 residuals: (cache, key scales, value scales, residual
/// floats, map entries). Scales are one per (slot, KV head) for a scaled type; int4's are (s,
/// min) pairs per key channel per block and per value group per slot, plus the residuals and the
/// block → residual map. 0 for a tensor the type does not use (it is still allocated with one
/// element, so the kernels get a real address). With `num_slots = block_size` and one
/// residual: the sizes of one block, what `KvPool` moves to and from the tiers.
pub fn cache_sizes<C: CacheElem>(
    num_slots: usize,
    block_size: usize,
    (n_kv_heads, head_dim): (usize, usize),
    residuals: usize,
) -> [usize; 5] {
    let cache = num_slots * row_elems::<C>(n_kv_heads, head_dim);
    let kv_dim = n_kv_heads * head_dim;
    if C::SCALED {
        [cache, num_slots * n_kv_heads, num_slots * n_kv_heads, 0, 0]
    } else if C::INT4 {
        let num_blocks = num_slots / block_size.max(1);
        let groups = head_dim.div_ceil(KvDtype::INT4_VALUE_GROUP);
        [
            cache,
            2 * num_blocks * kv_dim,
            2 * num_slots * n_kv_heads * groups,
            residuals * block_size * kv_dim,
            num_blocks,
        ]
    } else {
        [cache, 0, 0, 0, 0]
    }
}

impl<A, C: CacheElem> AttentionArgs<A, C> {
    fn checked(&self) -> Result<AttnPtrs> {
        launch::check_head_dim(self.head_dim)?;
        if self.n_kv_heads == 0 || !self.n_heads.is_multiple_of(self.n_kv_heads) {
            return Err(CudaError::Unsupported(format!(
                "{} query heads over {} KV heads",
                self.n_heads, self.n_kv_heads
            )));
        }
        let (t, hd, kvh) = (self.n_tokens, self.head_dim, self.n_kv_heads);
        let (seqs, slots, mb) = (self.n_seqs, self.num_slots, self.max_blocks);
        let [cache, k_scales, v_scales, residual, map] =
            cache_sizes::<C>(slots, self.block_size, (kvh, hd), self.residuals);
        Ok(AttnPtrs {
            out: self.out.need(t * self.n_heads * hd, "attention out")?,
            inputs: [
                Ptr(self.q.need(t * self.n_heads * hd, "attention q")?),
                Ptr(self.k_new.need(t * kvh * hd, "attention k_new")?),
                Ptr(self.v_new.need(t * kvh * hd, "attention v_new")?),
                Ptr(self.k_cache.need(cache, "key cache")?),
                Ptr(self.v_cache.need(cache, "value cache")?),
                Ptr(self.k_scale.need(k_scales, "key scales")?),
                Ptr(self.v_scale.need(v_scales, "value scales")?),
                Ptr(self.k_residual.need(residual, "int4 key residuals")?),
                Ptr(self.read_map.need(map, "int4 read map")?),
                Ptr(self.block_tables.need(seqs * mb, "block_tables")?),
                Ptr(self.query_start_loc.need(seqs + 1, "query_start_loc")?),
                Ptr(self.context_lens.need(seqs, "context_lens")?),
            ],
            token_seq: self.token_seq.need(t, "token_seq")?,
            shape: [
                I32(i32_of("max_blocks", mb)?),
                I32(i32_of("n_heads", self.n_heads)?),
                I32(i32_of("n_kv_heads", kvh)?),
                I32(i32_of("head_dim", hd)?),
                I32(i32_of("block_size", self.block_size)?),
                I32(i32_of("window", self.window)?),
                F32(self.scale),
            ],
        })
    }
}

/// A step's k/v rows and one layer's pool, as the kernels that move rows between them take
/// them (`reshape_and_cache_v1`, `kv_read_back_v1`).
///
/// Shapes: `k`, `v` (n_tokens, kv_dim); `slots` (n_tokens,), -1 = not stored; the caches,
/// scales and int4's residuals as [`cache_sizes`] gives them for `num_slots` slots in blocks of
/// `block_size`; `map` (num_blocks,) int4's block → residual map (the write map when storing,
/// the read map when reading back; any one element otherwise).
#[derive(Clone, Copy, Debug)]
pub struct RowsAndPool<A, C> {
    /// (n_tokens, kv_dim) the step's keys.
    pub k: Dev<A>,
    /// (n_tokens, kv_dim) the step's values.
    pub v: Dev<A>,
    /// The layer's keys in the pool, (num_slots, n_kv_heads, head_dim) in the cache type.
    pub k_cache: Dev<C>,
    /// The layer's values in the pool, (num_slots, n_kv_heads, head_dim) in the cache type.
    pub v_cache: Dev<C>,
    /// Key scales as [`cache_sizes`] gives them (any one element for an unscaled type).
    pub k_scale: Dev<f32>,
    /// Value scales as [`cache_sizes`] gives them (any one element for an unscaled type).
    pub v_scale: Dev<f32>,
    /// int4: (residuals, block_size, kv_dim) f32 keys of blocks still filling.
    pub k_residual: Dev<f32>,
    /// int4: (num_blocks,) block → residual, the write map when storing, the read map when
    /// reading back.
    pub map: Dev<i32>,
    /// int4's residuals per layer (0 otherwise).
    pub residuals: usize,
    /// (n_tokens,) slot_mapping: each row's slot in the pool, -1 = not stored.
    pub slots: Dev<i32>,
    /// Rows of `k` and `v`.
    pub n_tokens: usize,
    /// Key/value heads.
    pub n_kv_heads: usize,
    /// Elements per head.
    pub head_dim: usize,
    /// Slots in the pool (num_blocks · block_size).
    pub num_slots: usize,
    /// Token slots per block.
    pub block_size: usize,
}

impl<A, C: CacheElem> RowsAndPool<A, C> {
    /// The kernels' arguments in their order: the rows, the caches, the scales, int4's
    /// residuals and map, the slots, then kv_dim, n_kv_heads and block_size; every buffer
    /// checked to hold what the kernels index.
    fn args(&self) -> Result<[Arg; 12]> {
        let (t, nkv, hd) = (self.n_tokens, self.n_kv_heads, self.head_dim);
        let kv_dim = nkv * hd;
        let [cache, k_scales, v_scales, residual, map] =
            cache_sizes::<C>(self.num_slots, self.block_size, (nkv, hd), self.residuals);
        Ok([
            Ptr(self.k.need(t * kv_dim, "k")?),
            Ptr(self.v.need(t * kv_dim, "v")?),
            Ptr(self.k_cache.need(cache, "key cache")?),
            Ptr(self.v_cache.need(cache, "value cache")?),
            Ptr(self.k_scale.need(k_scales, "key scales")?),
            Ptr(self.v_scale.need(v_scales, "value scales")?),
            Ptr(self.k_residual.need(residual, "int4 key residuals")?),
            Ptr(self.map.need(map, "int4 block -> residual map")?),
            Ptr(self.slots.need(t, "slot_mapping")?),
            I32(i32_of("kv_dim", kv_dim)?),
            I32(i32_of("n_kv_heads", nkv)?),
            I32(i32_of("block_size", self.block_size)?),
        ])
    }
}

/// The kernels, cuBLAS and the stream they run on.
pub struct Ops {
    /// The device's one stream: every launch, copy and GEMM is queued on it.
    pub stream: Arc<CudaStream>,
    /// Every entry point of `kernels/*.cu`, compiled for this GPU.
    pub kernels: Kernels,
    /// cuBLAS bound to `stream`, for the linear layers ([`Ops::linear`]).
    pub blas: CudaBlas,
    /// The GPU's SMs: [`launch::choose_decode_kernel`] weighs v1's grid against them.
    pub multiprocessors: usize,
}

impl Ops {
    /// Loads every kernel for `dev` and opens cuBLAS on its stream.
    ///
    /// # Errors
    /// As [`Kernels::load`], or a cuBLAS error.
    pub fn new(dev: &Device) -> Result<Ops> {
        Ok(Ops {
            stream: dev.stream.clone(),
            kernels: Kernels::load(dev)?,
            blas: CudaBlas::new(dev.stream.clone())?,
            multiprocessors: dev.info.multiprocessors,
        })
    }

    /// The device address of a whole slice.
    pub fn dev<T>(&self, s: &CudaSlice<T>) -> Dev<T> {
        let (ptr, _sync) = s.device_ptr(&self.stream);
        Dev {
            ptr,
            len: s.len(),
            _t: PhantomData,
        }
    }
}

impl Launcher for Ops {
    fn multiprocessors(&self) -> usize {
        self.multiprocessors
    }

    unsafe fn launch_kernel(&self, name: &str, cfg: LaunchConfig, args: &[Arg]) -> Result<()> {
        let f = self.kernels.get(name)?;
        let mut b = self.stream.launch_builder(f);
        for a in args {
            match a {
                Ptr(v) => b.arg(v),
                I32(v) => b.arg(v),
                I64(v) => b.arg(v),
                F32(v) => b.arg(v),
            };
        }
        // SAFETY: the caller's contract: the arguments match the kernel, the buffers its grid.
        unsafe { b.launch(cfg) }?;
        Ok(())
    }
}

/// Something that runs kvlab's kernels by name: the GPU ([`Ops`], through cudarc) or, in tests,
/// the CPU emulator (`kvlab-cuda-emu`). Every typed launch below is written once, here: it checks
/// that each buffer holds the elements its shape needs, packs the arguments in the kernel's
/// order, takes its grid from `launch.rs` and calls [`Launcher::launch_kernel`].
pub trait Launcher {
    /// Streaming multiprocessors of the device (the v1/v2 attention choice reads it).
    fn multiprocessors(&self) -> usize;

    /// Runs kernel `name` over grid `cfg` with `args`, in order (queued on the GPU's stream;
    /// run to completion by the emulator).
    ///
    /// # Errors
    /// [`CudaError::MissingKernel`], or the backend's launch error.
    ///
    /// # Safety
    /// `args` match the kernel's parameter list in number, types and order, and every buffer
    /// holds what the grid `cfg` reads and writes.
    unsafe fn launch_kernel(&self, name: &str, cfg: LaunchConfig, args: &[Arg]) -> Result<()>;

    /// x (n_tokens, dim) f32 = table (vocab, dim)[ids] · scale.
    ///
    /// # Errors
    /// Short buffers, launch errors. Token ids must be < vocab (pack_step checks them).
    #[allow(clippy::too_many_arguments)]
    fn embedding<W: DType>(
        &self,
        x: Dev<f32>,
        table: Dev<W>,
        ids: Dev<i32>,
        n_tokens: usize,
        vocab: usize,
        dim: usize,
        scale: f32,
    ) -> Result<()> {
        let f: &str = &format!("embedding_v1_{}", W::NAME);
        let args = [
            Ptr(x.need(n_tokens * dim, "embedding out")?),
            Ptr(table.need(vocab * dim, "embedding table")?),
            Ptr(ids.need(n_tokens, "token ids")?),
            I32(i32_of("dim", dim)?),
            F32(scale),
        ];
        let cfg = launch::row_copy_config(n_tokens, dim)?;
        // SAFETY: argument types and order match embedding_v1_<W> (float*, const W*, const int*,
        // int, float); every buffer was checked to hold what the grid touches, and ids index
        // rows < vocab (checked by the caller).
        unsafe { self.launch_kernel(f, cfg, &args) }
    }

    /// y (rows, n) = rmsnorm(x (rows, n)) · w (n,). In place when `y` and `x` are the same.
    ///
    /// # Errors
    /// Short buffers, launch errors.
    #[allow(clippy::too_many_arguments)]
    fn rmsnorm<I: DType, O: DType>(
        &self,
        y: Dev<O>,
        x: Dev<I>,
        w: Dev<f32>,
        rows: usize,
        n: usize,
        eps: f32,
    ) -> Result<()> {
        let f: &str = &format!("rmsnorm_v1_{}_{}", I::NAME, O::NAME);
        let args = [
            Ptr(y.need(rows * n, "rmsnorm out")?),
            Ptr(x.need(rows * n, "rmsnorm in")?),
            Ptr(w.need(n, "rmsnorm gain")?),
            I32(i32_of("n", n)?),
            F32(eps),
        ];
        let cfg = launch::rmsnorm_config(rows, n)?;
        // SAFETY: matches rmsnorm_v1_<I>_<O> (O*, const I*, const float*, int, float); one block
        // per row of n elements, all checked above; threads are a multiple of 32 (block_sum).
        unsafe { self.launch_kernel(f, cfg, &args) }
    }

    /// RoPE in place on x (n_tokens, n_heads, head_dim) with cos/sin tables (positions,
    /// head_dim/2). Positions must be below the tables' rows (pack_step checks them).
    ///
    /// # Errors
    /// Short buffers, launch errors.
    #[allow(clippy::too_many_arguments)]
    fn rope<T: DType>(
        &self,
        x: Dev<T>,
        positions: Dev<i32>,
        cos: Dev<f32>,
        sin: Dev<f32>,
        n_tokens: usize,
        n_heads: usize,
        head_dim: usize,
        neox: bool,
    ) -> Result<()> {
        launch::check_head_dim(head_dim)?;
        let f: &str = &format!("rope_v1_{}", T::NAME);
        let half = head_dim / 2;
        if cos.len() != sin.len() || !cos.len().is_multiple_of(half) {
            return Err(CudaError::BadInput(
                "RoPE tables are not (positions, head_dim/2)".into(),
            ));
        }
        let args = [
            Ptr(x.need(n_tokens * n_heads * head_dim, "rope x")?),
            Ptr(positions.need(n_tokens, "positions")?),
            Ptr(cos.need(half, "cos table")?),
            Ptr(sin.need(half, "sin table")?),
            I32(i32_of("tokens", n_tokens)?),
            I32(i32_of("n_heads", n_heads)?),
            I32(i32_of("head_dim", head_dim)?),
            I32(neox as i32),
        ];
        let cfg = launch::rope_config(n_tokens, n_heads, head_dim)?;
        // SAFETY: matches rope_v1_<T> (T*, const int*, const float*, const float*, int, int,
        // int, int); the grid covers n_tokens·n_heads·head_dim/2 threads, the kernel returns past
        // that; x was checked; table rows are indexed by positions checked by pack_step.
        unsafe { self.launch_kernel(f, cfg, &args) }
    }

    /// Stores `r.k`, `r.v` at rows `r.slots` of the caches in the cache type, with one scale
    /// per (slot, KV head) for a scaled type; for int4 the keys go to `r.k_residual` through the
    /// write map `r.map` (assigned by `residual.rs` for every block the step writes) and the
    /// values are quantized; skips slot -1. Slots must be below num_slots (pack_step checks
    /// them).
    ///
    /// # Errors
    /// Short buffers, launch errors.
    fn reshape_and_cache<A: DType, C: CacheElem>(&self, r: &RowsAndPool<A, C>) -> Result<()> {
        let f: &str = &format!("reshape_and_cache_v1_{}_{}", A::NAME, C::NAME);
        let args = r.args()?;
        let cfg = launch::row_copy_config(r.n_tokens, r.n_kv_heads * r.head_dim)?;
        // SAFETY: matches reshape_and_cache_v1_<A>_<C> (const A*, const A*, C*, C*, float*,
        // float*, float*, const int*, const int*, int, int, int); one block per token, its
        // threads a multiple of 32 (the scaled types and int4's values reduce per warp); slots
        // are -1 or < num_slots (pack_step), int4's write map names a residual < residuals for
        // every block written (residual.rs), caches and scales checked.
        unsafe { self.launch_kernel(f, cfg, &args) }
    }

    /// The step's own rows `r.k`, `r.v` replaced by what the pool gives back for them after
    /// the layer's writes (`kv_read_back_v1`, kvlab-cpu's read-back): a stored row from its
    /// slot (the read map `r.map` says which int4 keys are still in a residual), a row with
    /// slot -1 quantized and decoded in registers. Nothing to do for an f32 cache.
    ///
    /// # Errors
    /// Short buffers, launch errors.
    fn kv_read_back<A: DType, C: CacheElem>(&self, r: &RowsAndPool<A, C>) -> Result<()> {
        if C::KV_DTYPE == KvDtype::F32 || r.n_tokens == 0 {
            return Ok(());
        }
        let f: &str = &format!("kv_read_back_v1_{}_{}", A::NAME, C::NAME);
        let args = r.args()?;
        let cfg = launch::row_copy_config(r.n_tokens, r.n_kv_heads * r.head_dim)?;
        // SAFETY: matches kv_read_back_v1_<A>_<C> (A*, A*, const C*, const C*, const float*,
        // const float*, const float*, const int*, const int*, int, int, int); one block per
        // token, threads a multiple of 32 (rows not stored reduce per warp); slots are -1 or <
        // num_slots (pack_step); int4's read map names a residual < residuals or -1
        // (residual.rs); buffers checked.
        unsafe { self.launch_kernel(f, cfg, &args) }
    }

    /// int4 keys of whole blocks, `pairs` (n_pairs, 2) = (block, residual): quantized from
    /// their residuals (`Close`) or decoded back into them (`Open`); `int4_close_keys_v1`,
    /// `int4_open_keys_v1`. Ids must be inside the pool and the residuals (residual.rs hands
    /// them out).
    ///
    /// # Errors
    /// Short buffers, launch errors.
    fn int4_keys(&self, op: Int4Op, t: Int4Keys, pairs: Dev<i32>, n_pairs: usize) -> Result<()> {
        if n_pairs == 0 {
            return Ok(());
        }
        let name = match op {
            Int4Op::Close => "int4_close_keys_v1",
            Int4Op::Open => "int4_open_keys_v1",
        };
        let f: &str = name;
        let (bs, heads) = (t.block_size, (t.n_kv_heads, t.head_dim));
        let [cache, k_scales, _, residual, _] =
            cache_sizes::<Int4x2>(t.num_blocks * bs, bs, heads, t.residuals);
        let args = [
            Ptr(t.k_cache.need(cache, "key cache")?),
            Ptr(t.k_scale.need(k_scales, "key scales")?),
            Ptr(t.k_residual.need(residual, "int4 key residuals")?),
            Ptr(pairs.need(2 * n_pairs, "int4 (block, residual) pairs")?),
            I32(i32_of("block_size", bs)?),
            I32(i32_of("n_kv_heads", t.n_kv_heads)?),
            I32(i32_of("head_dim", t.head_dim)?),
        ];
        let cfg = launch::copy_blocks_config(n_pairs)?;
        // SAFETY: matches int4_close_keys_v1 (kvlab_int4x2*, float*, const float*, const int*,
        // int, int, int) and int4_open_keys_v1 (the same but const codes and scales and a
        // mutable residual); one block per pair; block ids < num_blocks and residual ids <
        // residuals (residual.rs); buffers checked.
        unsafe { self.launch_kernel(f, cfg, &args) }
    }

    /// Copies whole blocks `pairs` (n_pairs, 2) = (src, dst) of both caches (num_blocks,
    /// block_elems), or of `k_cache` alone when `v_cache` is `None`. Block ids must be <
    /// num_blocks (pack_step checks them).
    ///
    /// # Errors
    /// Short buffers, launch errors.
    fn copy_blocks<C: CacheElem>(
        &self,
        k_cache: Dev<C>,
        v_cache: Option<Dev<C>>,
        pairs: Dev<i32>,
        n_pairs: usize,
        num_blocks: usize,
        block_elems: usize,
    ) -> Result<()> {
        if n_pairs == 0 {
            return Ok(());
        }
        let f: &str = &format!("copy_blocks_v1_{}", C::NAME);
        let v = match v_cache {
            Some(v) => v.need(num_blocks * block_elems, "value cache")?,
            None => 0,
        };
        let args = [
            Ptr(k_cache.need(num_blocks * block_elems, "key cache")?),
            Ptr(v),
            Ptr(pairs.need(2 * n_pairs, "block copy pairs")?),
            I64(block_elems as i64),
        ];
        let cfg = launch::copy_blocks_config(n_pairs)?;
        // SAFETY: matches copy_blocks_v1_<C> (C*, C*, const int*, long long); one block per
        // pair; block ids < num_blocks (pack_step), caches checked to hold num_blocks blocks (a
        // null value cache is skipped by the kernel).
        unsafe { self.launch_kernel(f, cfg, &args) }
    }

    /// paged_attention_v1 over the leading `n_decode` sequences (one query each).
    ///
    /// # Errors
    /// Short buffers, unsupported shapes, launch errors.
    fn paged_attention_v1<A: DType, C: CacheElem>(
        &self,
        a: &AttentionArgs<A, C>,
        n_decode: usize,
    ) -> Result<()> {
        let p = a.checked()?;
        let f: &str = &format!("paged_attention_v1_{}_{}", A::NAME, C::NAME);
        let cfg = launch::decode_v1_config(n_decode, a.n_heads)?;
        let args = [&[Ptr(p.out)][..], &p.inputs, &p.shape].concat();
        // SAFETY: matches paged_attention_v1_<A>_<C>'s parameter list; every buffer was checked
        // by `checked`; block-table entries the kernel dereferences are valid blocks and query
        // rows / context lengths are consistent (pack_step); head_dim <= 256.
        unsafe { self.launch_kernel(f, cfg, &args) }
    }

    /// paged_attention_v2 (partitions of `launch::PARTITION_SIZE` keys) and its reduce, over
    /// the leading `n_decode` sequences. `workspace` holds
    /// `v2_workspace_floats(n_decode, n_heads, max_partitions, head_dim)` floats.
    ///
    /// # Errors
    /// Short buffers, unsupported shapes, launch errors.
    fn paged_attention_v2<A: DType, C: CacheElem>(
        &self,
        a: &AttentionArgs<A, C>,
        n_decode: usize,
        max_partitions: usize,
        workspace: Dev<f32>,
    ) -> Result<()> {
        let p = a.checked()?;
        let cells = n_decode * a.n_heads * max_partitions;
        let tmp_max = workspace.range(0..cells)?;
        let tmp_sum = workspace.range(cells..2 * cells)?;
        let tmp_acc = workspace.range(2 * cells..workspace.len())?;
        let tmp = [
            Ptr(tmp_max.need(cells, "v2 maxima")?),
            Ptr(tmp_sum.need(cells, "v2 sums")?),
            Ptr(tmp_acc.need(cells * a.head_dim, "v2 accumulators")?),
        ];
        let partitions = [
            I32(launch::PARTITION_SIZE as i32),
            I32(i32_of("partitions", max_partitions)?),
        ];

        let f: &str = &format!("paged_attention_v2_{}_{}", A::NAME, C::NAME);
        let cfg = launch::decode_v2_config(n_decode, a.n_heads, max_partitions)?;
        let args = [&tmp[..], &p.inputs, &p.shape, &partitions].concat();
        // SAFETY: matches paged_attention_v2_<A>_<C>'s parameter list; the workspace holds
        // (n_decode, n_heads, max_partitions) cells of max, sum and head_dim floats (checked);
        // the other buffers as in paged_attention_v1.
        unsafe { self.launch_kernel(f, cfg, &args) }?;

        let f: &str = &format!("paged_attention_v2_reduce_{}", A::NAME);
        // One block per (decode sequence, query head), as v1; threads over dims.
        let cfg = launch::decode_v1_config(n_decode, a.n_heads)?;
        let [.., query_start_loc, context_lens] = p.inputs;
        let [_, n_heads, _, head_dim, _, window, _] = p.shape;
        let per_seq = [query_start_loc, context_lens, n_heads, head_dim, window];
        let args = [&[Ptr(p.out)][..], &tmp, &per_seq, &partitions].concat();
        // SAFETY: matches paged_attention_v2_reduce_<A>; reads only the partitions each
        // sequence has (< max_partitions, as the launch above computed them), writes out rows
        // checked above.
        unsafe { self.launch_kernel(f, cfg, &args) }
    }

    /// prefill_attention_v1 for token rows `first_row .. first_row + n_rows`.
    ///
    /// # Errors
    /// Short buffers, unsupported shapes, launch errors.
    fn prefill_attention_v1<A: DType, C: CacheElem>(
        &self,
        a: &AttentionArgs<A, C>,
        first_row: usize,
        n_rows: usize,
    ) -> Result<()> {
        let p = a.checked()?;
        if first_row + n_rows > a.n_tokens {
            return Err(CudaError::BadInput(format!(
                "prefill rows {first_row}..{} of {} tokens",
                first_row + n_rows,
                a.n_tokens
            )));
        }
        let rows = [Ptr(p.token_seq), I32(i32_of("first_row", first_row)?)];
        let f: &str = &format!("prefill_attention_v1_{}_{}", A::NAME, C::NAME);
        let cfg = launch::prefill_config(n_rows, a.n_heads)?;
        let args = [&[Ptr(p.out)][..], &p.inputs, &rows, &p.shape].concat();
        // SAFETY: matches prefill_attention_v1_<A>_<C>'s parameter list; rows are inside the
        // checked buffers; metadata consistent (pack_step).
        unsafe { self.launch_kernel(f, cfg, &args) }
    }

    /// gate ← act(gate) ⊙ up over n elements.
    ///
    /// # Errors
    /// Short buffers, launch errors.
    fn glu<T: DType>(&self, gate: Dev<T>, up: Dev<T>, n: usize, act: Activation) -> Result<()> {
        let name = match act {
            Activation::Silu => "glu_silu",
            Activation::GeluTanh => "glu_gelu_tanh",
        };
        let f: &str = &format!("{name}_v1_{}", T::NAME);
        let args = [
            Ptr(gate.need(n, "gate")?),
            Ptr(up.need(n, "up")?),
            I64(n as i64),
        ];
        // SAFETY: matches <act>_v1_<T> (T*, const T*, long long); grid-stride over n checked
        // elements.
        unsafe { self.launch_kernel(f, launch::elementwise_config(n), &args) }
    }

    /// x (f32) ← x + o over n elements.
    ///
    /// # Errors
    /// Short buffers, launch errors.
    fn residual_add<T: DType>(&self, x: Dev<f32>, o: Dev<T>, n: usize) -> Result<()> {
        let f: &str = &format!("residual_add_v1_{}", T::NAME);
        let args = [
            Ptr(x.need(n, "residual")?),
            Ptr(o.need(n, "residual addend")?),
            I64(n as i64),
        ];
        // SAFETY: matches residual_add_v1_<T> (float*, const T*, long long); grid-stride over n
        // checked elements.
        unsafe { self.launch_kernel(f, launch::elementwise_config(n), &args) }
    }

    /// x (rows, cols) ← x + bias (cols,), the bias broadcast over rows.
    ///
    /// # Errors
    /// Short buffers, launch errors.
    fn add_bias<T: DType>(
        &self,
        x: Dev<T>,
        bias: Dev<f32>,
        rows: usize,
        cols: usize,
    ) -> Result<()> {
        let f: &str = &format!("add_bias_v1_{}", T::NAME);
        let n = rows * cols;
        let args = [
            Ptr(x.need(n, "biased rows")?),
            Ptr(bias.need(cols, "bias")?),
            I64(n as i64),
            I32(i32_of("bias width", cols)?),
        ];
        // SAFETY: matches add_bias_v1_<T> (T*, const float*, long long, int); grid-stride over n
        // checked elements, bias indices i % cols < cols checked elements.
        unsafe { self.launch_kernel(f, launch::elementwise_config(n), &args) }
    }

    /// out (n_rows, dim) = x[rows] for x (n_tokens, dim). Rows must be < n_tokens.
    ///
    /// # Errors
    /// Short buffers, launch errors.
    fn gather_rows(
        &self,
        out: Dev<f32>,
        x: Dev<f32>,
        rows: Dev<i32>,
        n_rows: usize,
        n_tokens: usize,
        dim: usize,
    ) -> Result<()> {
        let f: &str = "gather_rows_v1_f32";
        let args = [
            Ptr(out.need(n_rows * dim, "gathered rows")?),
            Ptr(x.need(n_tokens * dim, "rows source")?),
            Ptr(rows.need(n_rows, "row indices")?),
            I32(i32_of("dim", dim)?),
        ];
        // SAFETY: matches gather_rows_v1_f32 (float*, const float*, const int*, int); row
        // indices < n_tokens (pack_step's logits rows).
        unsafe { self.launch_kernel(f, launch::row_copy_config(n_rows, dim)?, &args) }
    }

    /// out (n_rows,) = argmax of each row of logits (n_rows, vocab), ties to the lowest id.
    ///
    /// # Errors
    /// Short buffers, launch errors.
    fn argmax(&self, logits: Dev<f32>, out: Dev<i32>, n_rows: usize, vocab: usize) -> Result<()> {
        let f: &str = "argmax_v1_f32";
        let args = [
            Ptr(logits.need(n_rows * vocab, "logits")?),
            Ptr(out.need(n_rows, "argmax out")?),
            I32(i32_of("vocab_size", vocab)?),
        ];
        // SAFETY: matches argmax_v1_f32 (const float*, int*, int); exactly ARGMAX_THREADS
        // threads per block as the kernel's shared arrays assume.
        unsafe { self.launch_kernel(f, launch::argmax_config(n_rows)?, &args) }
    }
}

//! Typed launches of every kernel: the forward pass and the GPU tests call these, never
//! `launch_builder` directly. Each wrapper checks that every buffer holds the elements its shape
//! needs before launching, takes its grid from `launch.rs`, and names the entry point
//! `<kernel>_v<version>_<types>` from the element types.

use std::collections::HashMap;
use std::marker::PhantomData;
use std::ops::Range;
use std::sync::Arc;

use cudarc::cublas::CudaBlas;
use cudarc::driver::{CudaFunction, CudaSlice, CudaStream, DevicePtr, PushKernelArg};
use cudarc::nvrtc::Ptx;
use kvlab_model::Activation;

use crate::device::Device;
use crate::dtype::DType;
use crate::error::{CudaError, Result};
use crate::kernels::FILES;
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
    /// The whole of `s`.
    pub fn of(s: &CudaSlice<T>, stream: &CudaStream) -> Dev<T> {
        let (ptr, _sync) = s.device_ptr(stream);
        Dev {
            ptr,
            len: s.len(),
            _t: PhantomData,
        }
    }

    /// Elements.
    pub fn len(self) -> usize {
        self.len
    }

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
    /// The NVRTC architecture they were compiled for.
    pub arch: String,
}

impl Kernels {
    /// Compiles (or takes from the process cache) and loads every kernel for `dev`.
    ///
    /// # Errors
    /// Missing NVRTC or headers, a compile error, or a driver error loading a module.
    pub fn load(dev: &Device) -> Result<Kernels> {
        let arch = nvrtc::arch_for(dev.info.compute_capability);
        let mut functions = HashMap::new();
        for file in FILES {
            let ptx = nvrtc::ptx(file, &arch)?;
            let module = dev.ctx.load_module(Ptx::from_src(ptx.to_string()))?;
            for &entry in file.entries {
                functions.insert(entry, module.load_function(entry)?);
            }
        }
        Ok(Kernels { functions, arch })
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

/// The inputs of one attention launch (decode or prefill) for one layer.
///
/// Shapes: `out`, `q` (n_tokens, n_heads, head_dim); `k_new`, `v_new` (n_tokens, n_kv_heads,
/// head_dim); `k_cache`, `v_cache` (num_slots, n_kv_heads, head_dim); `block_tables`
/// (n_seqs, max_blocks); `query_start_loc` (n_seqs + 1,); `context_lens`, (n_seqs,);
/// `token_seq` (n_tokens,).
pub struct AttentionArgs<A, C> {
    pub out: Dev<A>,
    pub q: Dev<A>,
    pub k_new: Dev<A>,
    pub v_new: Dev<A>,
    pub k_cache: Dev<C>,
    pub v_cache: Dev<C>,
    pub block_tables: Dev<i32>,
    pub query_start_loc: Dev<i32>,
    pub context_lens: Dev<i32>,
    pub token_seq: Dev<i32>,
    pub n_tokens: usize,
    pub n_seqs: usize,
    pub max_blocks: usize,
    pub n_heads: usize,
    pub n_kv_heads: usize,
    pub head_dim: usize,
    pub block_size: usize,
    /// Slots in the pool (num_blocks · block_size).
    pub num_slots: usize,
    /// 0 for global attention.
    pub window: usize,
    pub scale: f32,
}

/// Raw kernel arguments shared by the attention kernels, after the bounds checks.
struct AttnPtrs {
    out: u64,
    q: u64,
    k_new: u64,
    v_new: u64,
    k_cache: u64,
    v_cache: u64,
    block_tables: u64,
    query_start_loc: u64,
    context_lens: u64,
    token_seq: u64,
    max_blocks: i32,
    n_heads: i32,
    n_kv_heads: i32,
    head_dim: i32,
    block_size: i32,
    window: i32,
}

impl<A, C> AttentionArgs<A, C> {
    fn checked(&self) -> Result<AttnPtrs> {
        launch::check_head_dim(self.head_dim)?;
        if self.n_kv_heads == 0 || !self.n_heads.is_multiple_of(self.n_kv_heads) {
            return Err(CudaError::Unsupported(format!(
                "{} query heads over {} KV heads",
                self.n_heads, self.n_kv_heads
            )));
        }
        let (t, hd) = (self.n_tokens, self.head_dim);
        Ok(AttnPtrs {
            out: self.out.need(t * self.n_heads * hd, "attention out")?,
            q: self.q.need(t * self.n_heads * hd, "attention q")?,
            k_new: self
                .k_new
                .need(t * self.n_kv_heads * hd, "attention k_new")?,
            v_new: self
                .v_new
                .need(t * self.n_kv_heads * hd, "attention v_new")?,
            k_cache: self
                .k_cache
                .need(self.num_slots * self.n_kv_heads * hd, "key cache")?,
            v_cache: self
                .v_cache
                .need(self.num_slots * self.n_kv_heads * hd, "value cache")?,
            block_tables: self
                .block_tables
                .need(self.n_seqs * self.max_blocks, "block_tables")?,
            query_start_loc: self
                .query_start_loc
                .need(self.n_seqs + 1, "query_start_loc")?,
            context_lens: self.context_lens.need(self.n_seqs, "context_lens")?,
            token_seq: self.token_seq.need(t, "token_seq")?,
            max_blocks: i32_of("max_blocks", self.max_blocks)?,
            n_heads: i32_of("n_heads", self.n_heads)?,
            n_kv_heads: i32_of("n_kv_heads", self.n_kv_heads)?,
            head_dim: i32_of("head_dim", hd)?,
            block_size: i32_of("block_size", self.block_size)?,
            window: i32_of("window", self.window)?,
        })
    }
}

/// The kernels, cuBLAS and the stream they run on.
pub struct Ops {
    pub stream: Arc<CudaStream>,
    pub kernels: Kernels,
    pub blas: CudaBlas,
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
        Dev::of(s, &self.stream)
    }

    /// x (n_tokens, dim) f32 = table (vocab, dim)[ids] · scale.
    ///
    /// # Errors
    /// Short buffers, launch errors. Token ids must be < vocab (pack_step checks them).
    #[allow(clippy::too_many_arguments)]
    pub fn embedding<W: DType>(
        &self,
        x: Dev<f32>,
        table: Dev<W>,
        ids: Dev<i32>,
        n_tokens: usize,
        vocab: usize,
        dim: usize,
        scale: f32,
    ) -> Result<()> {
        let f = self.kernels.get(&format!("embedding_v1_{}", W::NAME))?;
        let (x, table, ids) = (
            x.need(n_tokens * dim, "embedding out")?,
            table.need(vocab * dim, "embedding table")?,
            ids.need(n_tokens, "token ids")?,
        );
        let dim_i = i32_of("dim", dim)?;
        let cfg = launch::row_copy_config(n_tokens, dim)?;
        let mut b = self.stream.launch_builder(f);
        b.arg(&x).arg(&table).arg(&ids).arg(&dim_i).arg(&scale);
        // SAFETY: argument types and order match embedding_v1_<W> (float*, const W*, const int*,
        // int, float); every buffer was checked to hold what the grid touches, and ids index
        // rows < vocab (checked by the caller).
        unsafe { b.launch(cfg) }?;
        Ok(())
    }

    /// y (rows, n) = rmsnorm(x (rows, n)) · w (n,). In place when `y` and `x` are the same.
    ///
    /// # Errors
    /// Short buffers, launch errors.
    #[allow(clippy::too_many_arguments)]
    pub fn rmsnorm<I: DType, O: DType>(
        &self,
        y: Dev<O>,
        x: Dev<I>,
        w: Dev<f32>,
        rows: usize,
        n: usize,
        eps: f32,
    ) -> Result<()> {
        let f = self
            .kernels
            .get(&format!("rmsnorm_v1_{}_{}", I::NAME, O::NAME))?;
        let (y, x, w) = (
            y.need(rows * n, "rmsnorm out")?,
            x.need(rows * n, "rmsnorm in")?,
            w.need(n, "rmsnorm gain")?,
        );
        let n_i = i32_of("n", n)?;
        let cfg = launch::rmsnorm_config(rows, n)?;
        let mut b = self.stream.launch_builder(f);
        b.arg(&y).arg(&x).arg(&w).arg(&n_i).arg(&eps);
        // SAFETY: matches rmsnorm_v1_<I>_<O> (O*, const I*, const float*, int, float); one block
        // per row of n elements, all checked above; threads are a multiple of 32 (block_sum).
        unsafe { b.launch(cfg) }?;
        Ok(())
    }

    /// RoPE in place on x (n_tokens, n_heads, head_dim) with cos/sin tables (positions,
    /// head_dim/2). Positions must be below the tables' rows (pack_step checks them).
    ///
    /// # Errors
    /// Short buffers, launch errors.
    #[allow(clippy::too_many_arguments)]
    pub fn rope<T: DType>(
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
        let f = self.kernels.get(&format!("rope_v1_{}", T::NAME))?;
        let half = head_dim / 2;
        if cos.len() != sin.len() || !cos.len().is_multiple_of(half) {
            return Err(CudaError::BadInput(
                "RoPE tables are not (positions, head_dim/2)".into(),
            ));
        }
        let (x, positions, cos, sin) = (
            x.need(n_tokens * n_heads * head_dim, "rope x")?,
            positions.need(n_tokens, "positions")?,
            cos.need(half, "cos table")?,
            sin.need(half, "sin table")?,
        );
        let args = [
            i32_of("tokens", n_tokens)?,
            i32_of("n_heads", n_heads)?,
            i32_of("head_dim", head_dim)?,
            neox as i32,
        ];
        let cfg = launch::rope_config(n_tokens, n_heads, head_dim)?;
        let mut b = self.stream.launch_builder(f);
        b.arg(&x).arg(&positions).arg(&cos).arg(&sin);
        b.arg(&args[0]).arg(&args[1]).arg(&args[2]).arg(&args[3]);
        // SAFETY: matches rope_v1_<T> (T*, const int*, const float*, const float*, int, int,
        // int, int); the grid covers n_tokens·n_heads·head_dim/2 threads, the kernel returns past
        // that; x was checked; table rows are indexed by positions checked by pack_step.
        unsafe { b.launch(cfg) }?;
        Ok(())
    }

    /// Stores k, v (n_tokens, kv_dim) at rows `slots` (n_tokens,) of the caches (num_slots,
    /// kv_dim), skipping -1. Slots must be below num_slots (pack_step checks them).
    ///
    /// # Errors
    /// Short buffers, launch errors.
    #[allow(clippy::too_many_arguments)]
    pub fn reshape_and_cache<A: DType, C: DType>(
        &self,
        k: Dev<A>,
        v: Dev<A>,
        k_cache: Dev<C>,
        v_cache: Dev<C>,
        slots: Dev<i32>,
        n_tokens: usize,
        kv_dim: usize,
        num_slots: usize,
    ) -> Result<()> {
        let f = self
            .kernels
            .get(&format!("reshape_and_cache_v1_{}_{}", A::NAME, C::NAME))?;
        let (k, v, kc, vc, slots) = (
            k.need(n_tokens * kv_dim, "k")?,
            v.need(n_tokens * kv_dim, "v")?,
            k_cache.need(num_slots * kv_dim, "key cache")?,
            v_cache.need(num_slots * kv_dim, "value cache")?,
            slots.need(n_tokens, "slot_mapping")?,
        );
        let kv_dim_i = i32_of("kv_dim", kv_dim)?;
        let cfg = launch::row_copy_config(n_tokens, kv_dim)?;
        let mut b = self.stream.launch_builder(f);
        b.arg(&k)
            .arg(&v)
            .arg(&kc)
            .arg(&vc)
            .arg(&slots)
            .arg(&kv_dim_i);
        // SAFETY: matches reshape_and_cache_v1_<A>_<C> (const A*, const A*, C*, C*, const int*,
        // int); one block per token; slots are -1 or < num_slots (pack_step), caches checked.
        unsafe { b.launch(cfg) }?;
        Ok(())
    }

    /// Copies whole blocks `pairs` (n_pairs, 2) = (src, dst) of both caches (num_blocks,
    /// block_elems). Block ids must be < num_blocks (pack_step checks them).
    ///
    /// # Errors
    /// Short buffers, launch errors.
    pub fn copy_blocks<C: DType>(
        &self,
        k_cache: Dev<C>,
        v_cache: Dev<C>,
        pairs: Dev<i32>,
        n_pairs: usize,
        num_blocks: usize,
        block_elems: usize,
    ) -> Result<()> {
        if n_pairs == 0 {
            return Ok(());
        }
        let f = self.kernels.get(&format!("copy_blocks_v1_{}", C::NAME))?;
        let (kc, vc, pairs) = (
            k_cache.need(num_blocks * block_elems, "key cache")?,
            v_cache.need(num_blocks * block_elems, "value cache")?,
            pairs.need(2 * n_pairs, "block copy pairs")?,
        );
        let block_elems_i = block_elems as i64;
        let cfg = launch::copy_blocks_config(n_pairs)?;
        let mut b = self.stream.launch_builder(f);
        b.arg(&kc).arg(&vc).arg(&pairs).arg(&block_elems_i);
        // SAFETY: matches copy_blocks_v1_<C> (C*, C*, const int*, long long); one block per
        // pair; block ids < num_blocks (pack_step), caches checked to hold num_blocks blocks.
        unsafe { b.launch(cfg) }?;
        Ok(())
    }

    /// paged_attention_v1 over the leading `n_decode` sequences (one query each).
    ///
    /// # Errors
    /// Short buffers, unsupported shapes, launch errors.
    pub fn paged_attention_v1<A: DType, C: DType>(
        &self,
        a: &AttentionArgs<A, C>,
        n_decode: usize,
    ) -> Result<()> {
        let p = a.checked()?;
        let f = self
            .kernels
            .get(&format!("paged_attention_v1_{}_{}", A::NAME, C::NAME))?;
        let cfg = launch::decode_v1_config(n_decode, a.n_heads)?;
        let mut b = self.stream.launch_builder(f);
        b.arg(&p.out)
            .arg(&p.q)
            .arg(&p.k_new)
            .arg(&p.v_new)
            .arg(&p.k_cache);
        b.arg(&p.v_cache)
            .arg(&p.block_tables)
            .arg(&p.query_start_loc);
        b.arg(&p.context_lens)
            .arg(&p.max_blocks)
            .arg(&p.n_heads)
            .arg(&p.n_kv_heads);
        b.arg(&p.head_dim)
            .arg(&p.block_size)
            .arg(&p.window)
            .arg(&a.scale);
        // SAFETY: matches paged_attention_v1_<A>_<C>'s parameter list; every buffer was checked
        // by `checked`; block-table entries the kernel dereferences are valid blocks and query
        // rows / context lengths are consistent (pack_step); head_dim <= 256.
        unsafe { b.launch(cfg) }?;
        Ok(())
    }

    /// paged_attention_v2 (partitions of `launch::PARTITION_SIZE` keys) and its reduce, over
    /// the leading `n_decode` sequences. `workspace` holds
    /// `v2_workspace_floats(n_decode, n_heads, max_partitions, head_dim)` floats.
    ///
    /// # Errors
    /// Short buffers, unsupported shapes, launch errors.
    pub fn paged_attention_v2<A: DType, C: DType>(
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
        let (tmp_max, tmp_sum, tmp_acc) = (
            tmp_max.need(cells, "v2 maxima")?,
            tmp_sum.need(cells, "v2 sums")?,
            tmp_acc.need(cells * a.head_dim, "v2 accumulators")?,
        );
        let partition_size = launch::PARTITION_SIZE as i32;
        let max_partitions_i = i32_of("partitions", max_partitions)?;

        let f = self
            .kernels
            .get(&format!("paged_attention_v2_{}_{}", A::NAME, C::NAME))?;
        let cfg = launch::decode_v2_config(n_decode, a.n_heads, max_partitions)?;
        let mut b = self.stream.launch_builder(f);
        b.arg(&tmp_max)
            .arg(&tmp_sum)
            .arg(&tmp_acc)
            .arg(&p.q)
            .arg(&p.k_new);
        b.arg(&p.v_new)
            .arg(&p.k_cache)
            .arg(&p.v_cache)
            .arg(&p.block_tables);
        b.arg(&p.query_start_loc)
            .arg(&p.context_lens)
            .arg(&p.max_blocks)
            .arg(&p.n_heads);
        b.arg(&p.n_kv_heads)
            .arg(&p.head_dim)
            .arg(&p.block_size)
            .arg(&p.window);
        b.arg(&a.scale).arg(&partition_size).arg(&max_partitions_i);
        // SAFETY: matches paged_attention_v2_<A>_<C>'s parameter list; the workspace holds
        // (n_decode, n_heads, max_partitions) cells of max, sum and head_dim floats (checked);
        // the other buffers as in paged_attention_v1.
        unsafe { b.launch(cfg) }?;

        let f = self
            .kernels
            .get(&format!("paged_attention_v2_reduce_{}", A::NAME))?;
        let cfg = launch::decode_reduce_config(n_decode, a.n_heads)?;
        let mut b = self.stream.launch_builder(f);
        b.arg(&p.out)
            .arg(&tmp_max)
            .arg(&tmp_sum)
            .arg(&tmp_acc)
            .arg(&p.query_start_loc);
        b.arg(&p.context_lens)
            .arg(&p.n_heads)
            .arg(&p.head_dim)
            .arg(&p.window);
        b.arg(&partition_size).arg(&max_partitions_i);
        // SAFETY: matches paged_attention_v2_reduce_<A>; reads only the partitions each
        // sequence has (< max_partitions, as the launch above computed them), writes out rows
        // checked above.
        unsafe { b.launch(cfg) }?;
        Ok(())
    }

    /// prefill_attention_v1 for token rows `first_row .. first_row + n_rows`.
    ///
    /// # Errors
    /// Short buffers, unsupported shapes, launch errors.
    pub fn prefill_attention_v1<A: DType, C: DType>(
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
        let first_row_i = i32_of("first_row", first_row)?;
        let f = self
            .kernels
            .get(&format!("prefill_attention_v1_{}_{}", A::NAME, C::NAME))?;
        let cfg = launch::prefill_config(n_rows, a.n_heads)?;
        let mut b = self.stream.launch_builder(f);
        b.arg(&p.out)
            .arg(&p.q)
            .arg(&p.k_new)
            .arg(&p.v_new)
            .arg(&p.k_cache);
        b.arg(&p.v_cache)
            .arg(&p.block_tables)
            .arg(&p.query_start_loc);
        b.arg(&p.context_lens)
            .arg(&p.token_seq)
            .arg(&first_row_i)
            .arg(&p.max_blocks);
        b.arg(&p.n_heads)
            .arg(&p.n_kv_heads)
            .arg(&p.head_dim)
            .arg(&p.block_size);
        b.arg(&p.window).arg(&a.scale);
        // SAFETY: matches prefill_attention_v1_<A>_<C>'s parameter list; rows are inside the
        // checked buffers; metadata consistent (pack_step).
        unsafe { b.launch(cfg) }?;
        Ok(())
    }

    /// gate ← act(gate) ⊙ up over n elements.
    ///
    /// # Errors
    /// Short buffers, launch errors.
    pub fn glu<T: DType>(&self, gate: Dev<T>, up: Dev<T>, n: usize, act: Activation) -> Result<()> {
        let name = match act {
            Activation::Silu => "glu_silu",
            Activation::GeluTanh => "glu_gelu_tanh",
        };
        let f = self.kernels.get(&format!("{name}_v1_{}", T::NAME))?;
        let (gate, up) = (gate.need(n, "gate")?, up.need(n, "up")?);
        let n_i = n as i64;
        let mut b = self.stream.launch_builder(f);
        b.arg(&gate).arg(&up).arg(&n_i);
        // SAFETY: matches <act>_v1_<T> (T*, const T*, long long); grid-stride over n checked
        // elements.
        unsafe { b.launch(launch::elementwise_config(n)) }?;
        Ok(())
    }

    /// x (f32) ← x + o over n elements.
    ///
    /// # Errors
    /// Short buffers, launch errors.
    pub fn residual_add<T: DType>(&self, x: Dev<f32>, o: Dev<T>, n: usize) -> Result<()> {
        let f = self.kernels.get(&format!("residual_add_v1_{}", T::NAME))?;
        let (x, o) = (x.need(n, "residual")?, o.need(n, "residual addend")?);
        let n_i = n as i64;
        let mut b = self.stream.launch_builder(f);
        b.arg(&x).arg(&o).arg(&n_i);
        // SAFETY: matches residual_add_v1_<T> (float*, const T*, long long); grid-stride over n
        // checked elements.
        unsafe { b.launch(launch::elementwise_config(n)) }?;
        Ok(())
    }

    /// out (n_rows, dim) = x[rows] for x (n_tokens, dim). Rows must be < n_tokens.
    ///
    /// # Errors
    /// Short buffers, launch errors.
    pub fn gather_rows(
        &self,
        out: Dev<f32>,
        x: Dev<f32>,
        rows: Dev<i32>,
        n_rows: usize,
        n_tokens: usize,
        dim: usize,
    ) -> Result<()> {
        let f = self.kernels.get("gather_rows_v1_f32")?;
        let (out, x, rows) = (
            out.need(n_rows * dim, "gathered rows")?,
            x.need(n_tokens * dim, "rows source")?,
            rows.need(n_rows, "row indices")?,
        );
        let dim_i = i32_of("dim", dim)?;
        let mut b = self.stream.launch_builder(f);
        b.arg(&out).arg(&x).arg(&rows).arg(&dim_i);
        // SAFETY: matches gather_rows_v1_f32 (float*, const float*, const int*, int); row
        // indices < n_tokens (pack_step's logits rows).
        unsafe { b.launch(launch::row_copy_config(n_rows, dim)?) }?;
        Ok(())
    }

    /// out (n_rows,) = argmax of each row of logits (n_rows, vocab), ties to the lowest id.
    ///
    /// # Errors
    /// Short buffers, launch errors.
    pub fn argmax(
        &self,
        logits: Dev<f32>,
        out: Dev<i32>,
        n_rows: usize,
        vocab: usize,
    ) -> Result<()> {
        let f = self.kernels.get("argmax_v1_f32")?;
        let (logits, out) = (
            logits.need(n_rows * vocab, "logits")?,
            out.need(n_rows, "argmax out")?,
        );
        let vocab_i = i32_of("vocab_size", vocab)?;
        let mut b = self.stream.launch_builder(f);
        b.arg(&logits).arg(&out).arg(&vocab_i);
        // SAFETY: matches argmax_v1_f32 (const float*, int*, int); exactly ARGMAX_THREADS
        // threads per block as the kernel's shared arrays assume.
        unsafe { b.launch(launch::argmax_config(n_rows)?) }?;
        Ok(())
    }

    /// y (t, out) = x (t, in) @ w (out, in)ᵀ on cuBLAS.
    ///
    /// # Errors
    /// Short buffers, cuBLAS errors.
    pub fn linear<W: DType, Y: DType>(
        &self,
        y: Dev<Y>,
        x: Dev<W>,
        w: Dev<W>,
        t: usize,
        in_dim: usize,
        out_dim: usize,
    ) -> Result<()> {
        crate::gemm::linear(&self.blas, y, x, w, t, in_dim, out_dim)
    }
}

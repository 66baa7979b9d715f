//! [`DeviceModel`]: what one engine holds on the GPU (weights, KV pool, RoPE tables, workspace)
//! for activation/weight type `A` and cache type `C` (f32, f16, bf16, or the codes of fp8-e4m3
//! and int8 with their scales), and the batched forward pass of one scheduled step over it,
//! written block for block as kvlab-cpu's `forward` (crates/cpu/src/forward.rs): embedding, per
//! layer an attention block and a feed-forward block, then the logits.
//!
//! All tokens of the step (decodes first, then prefills, as the scheduler orders them) are rows
//! of one activation matrix, so every linear layer is one cuBLAS GEMM over the whole step:
//!
//! ```text
//! copy_blocks (copy-on-write, every group, every layer)  — before any write
//! x (T, dim) f32 = embedding[ids] · embed_scale
//! per layer l (group g = layer_group(l)):
//!   xn = rmsnorm(x, attn_norm)                 q, k, v = xn Wqᵀ, xn Wkᵀ, xn Wvᵀ      (GEMMs)
//!   [QK-norm per head]                          RoPE(q, k) at positions (theta of layer l)
//!   reshape_and_cache(k, v → pool[l] at slot_mapping[g], quantized to C)   [int4: close]
//!   k, v ← what the pool gives back for them (kv_read_back; not for an f32 pool)
//!   att = paged_attention (decode rows, v1 or v2) ‖ prefill_attention (prefill rows)
//!   o = att Woᵀ   [post_attn_norm]   x += o
//!   xn = rmsnorm(x, ffn_norm)   gate, up = xn W1ᵀ, xn W3ᵀ   gate = act(gate) ⊙ up
//!   o = gate W2ᵀ  [post_ffn_norm]    x += o
//! last (S, dim) = x[last token of each sequence]; logits (S, vocab) f32 = rmsnorm(last) Wclsᵀ
//! ```
//!
//! The residual stream `x` stays f32 in both modes; in f16 mode the GEMM inputs and outputs
//! and the attention I/O are f16 with f32 accumulation inside.

use std::ops::Range;

use cudarc::driver::CudaSlice;
use kvlab_model::{Config, Model, RopeLayout};
use kvlab_paged::KvCacheConfig;

use crate::device::Device;
use crate::dtype::{CacheElem, DType};
use crate::error::{CudaError, Result};
use crate::launch::{self, DecodeAttention, DecodeKernel, PackGeometry, PackedStep};
use crate::ops::{AttentionArgs, Dev, Int4Op, Launcher, Ops, RowsAndPool};
use crate::pool::{KvPool, PoolPlan};
use crate::residual::Residuals;
use crate::rope::RopeTables;
use crate::weights::DeviceWeights;
use crate::workspace::Workspace;

/// Floats of paged_attention_v2's workspace at most (64 MiB): v2 is only chosen where it fits.
pub const MAX_V2_WORKSPACE_FLOATS: usize = 16 << 20;

/// Everything one engine holds on the device.
pub struct DeviceModel<A: DType, C: CacheElem> {
    /// The CUDA context and the stream every launch goes to.
    pub dev: Device,
    /// The compiled kernels and cuBLAS, launched on `dev`'s stream.
    pub ops: Ops,
    /// The model's shape (n_layers, n_heads, n_kv_heads, head_dim, ...).
    pub config: Config,
    /// Every weight matrix and norm on the device, in the activation type `A`.
    pub weights: DeviceWeights<A>,
    /// The paged KV cache: per layer (num_blocks, block_size, n_kv_heads, head_dim) keys and
    /// values in `C`, with their scales.
    pub pool: KvPool<C>,
    /// (max_pos, head_dim / 2) cos and sin tables, one pair per distinct RoPE theta.
    pub rope: RopeTables,
    /// The step's activations and logits, grown to the largest step seen.
    pub ws: Workspace<A>,
    /// The step's packed i32 metadata (grown as needed).
    pub meta: CudaSlice<i32>,
    /// int4: the step's residual pair lists (`plan_residuals`).
    pub res_meta: CudaSlice<i32>,
    /// paged_attention_v2's partial results.
    pub v2_workspace: CudaSlice<f32>,
    /// Which decode attention kernel a step launches (v1, v2, or chosen per step).
    pub decode_attention: DecodeAttention,
    /// (n_layers,) KV group of each layer.
    pub layer_group: Vec<usize>,
    /// The vocabulary, RoPE rows and pool a step is validated against (`pack_step`).
    pub geometry: PackGeometry,
}

/// Where one group's int4 residual pair lists are in `DeviceModel::res_meta` (`ResidualPlan`).
struct ResidualRanges {
    close_early: Range<usize>,
    copies: Range<usize>,
    open: Range<usize>,
    close: Range<usize>,
}

/// What a new [`DeviceModel`] needs besides the model.
pub struct DeviceModelOptions {
    /// Tokens of a step the workspace is first sized for (it grows for a larger one).
    pub max_batch_tokens: usize,
    /// Sequences of a step the workspace is first sized for, and v2's partials are sized for
    /// (v2 runs only on steps whose partials fit).
    pub max_seqs: usize,
    /// Which decode attention kernel to launch.
    pub decode_attention: DecodeAttention,
}

impl<A: DType, C: CacheElem> DeviceModel<A, C> {
    /// Uploads the weights and RoPE tables, allocates the workspace, then sizes the pool with
    /// `pool_size(free, total)` (returning its plan) and allocates it.
    ///
    /// # Errors
    /// Unsupported shapes, driver and memory errors, or whatever `pool_size` returns.
    pub fn new(
        dev: Device,
        ops: Ops,
        model: &Model,
        opts: &DeviceModelOptions,
        pool_size: impl Fn(usize, usize) -> Result<PoolPlan>,
    ) -> Result<Self> {
        let c = model.config.clone();
        launch::check_head_dim(c.head_dim)?;
        let stream = dev.stream.clone();
        let weights = DeviceWeights::<A>::upload(&stream, &model.weights)?;
        let rope = RopeTables::upload(&stream, &c)?;
        let ws = Workspace::<A>::new(&stream, &c, opts.max_batch_tokens, opts.max_seqs)?;
        let parts = launch::num_partitions(c.max_seq_len, launch::PARTITION_SIZE);
        let v2_floats = launch::v2_workspace_floats(opts.max_seqs, c.n_heads, parts, c.head_dim)
            .clamp(1, MAX_V2_WORKSPACE_FLOATS);
        let v2_workspace = stream.alloc_zeros::<f32>(v2_floats)?;
        let meta = stream.alloc_zeros::<i32>(1 << 16)?;
        let res_meta = stream.alloc_zeros::<i32>(1 << 10)?;
        dev.sync()?;
        let (free, total) = dev.mem_info()?;
        let mut plan = pool_size(free, total)?;
        if C::INT4 {
            // The residuals come out of the same budget: size them for the plan's blocks, then
            // plan again with their bytes taken from what is free (fewer blocks need no more).
            let residuals = |plan: &PoolPlan| {
                Residuals::capacity_for(
                    plan.num_blocks,
                    plan.block_size,
                    opts.max_seqs,
                    opts.max_batch_tokens,
                )
            };
            let capacity = residuals(&plan);
            let first = plan.with_residuals(&c, capacity);
            let replanned = pool_size(free.saturating_sub(first.residual_bytes), total)?;
            plan = replanned.with_residuals(&c, first.residuals);
        }
        let kv_cache = KvCacheConfig::new(c.kv_cache_groups(), plan.num_blocks, plan.block_size);
        let pool = KvPool::<C>::allocate(&stream, &c, plan)?;
        let layer_group = (0..c.n_layers).map(|l| c.layer_cache_group(l)).collect();
        let geometry = PackGeometry {
            vocab_size: c.vocab_size,
            max_positions: rope.max_pos,
            kv_cache,
        };
        dev.sync()?;
        Ok(DeviceModel {
            dev,
            ops,
            config: c,
            weights,
            pool,
            rope,
            ws,
            meta,
            res_meta,
            v2_workspace,
            decode_attention: opts.decode_attention,
            layer_group,
            geometry,
        })
    }

    /// Runs a packed step; leaves the logits (n_logits, vocab) in `ws.logits`, a row per
    /// `logits_indices` entry. Read it beside
    /// kvlab-cpu's `forward` (crates/cpu/src/forward.rs): the same blocks in the same order, each
    /// over all the step's rows at once.
    ///
    /// # Errors
    /// Launch, cuBLAS and driver errors; out of memory when the workspace must grow.
    pub fn step(&mut self, p: &PackedStep) -> Result<()> {
        // int4: which residual holds each block's keys this step (residual.rs), its maps and
        // pair lists on the device.
        let residual_steps = if C::INT4 {
            self.plan_residuals(p)?
        } else {
            Vec::new()
        };
        self.upload(p)?;
        self.copy_on_write(p, &residual_steps)?;
        self.embed(p)?;
        for l in 0..self.weights.layers.len() {
            let residual = residual_steps.get(self.layer_group[l]);
            self.attention_block(p, l, residual)?;
            self.feed_forward_block(l, p.n_tokens)?;
        }
        self.last_token_logits(p)
    }

    /// Grows the workspace to the step's rows and uploads its packed metadata to `meta`.
    ///
    /// # Errors
    /// Driver errors; out of memory.
    fn upload(&mut self, p: &PackedStep) -> Result<()> {
        let stream = self.dev.stream.clone();
        self.ws
            .ensure(&stream, &self.config, p.n_tokens, p.logits_indices.len())?;
        if self.meta.len() < p.ints.len() {
            self.meta = stream.alloc_zeros::<i32>(p.ints.len().next_power_of_two())?;
        }
        stream.memcpy_htod(&p.ints, &mut self.meta.slice_mut(0..p.ints.len()))?;
        Ok(())
    }

    /// The step's copy-on-write copies, all of them before any write of the step, in every layer
    /// of each group; int4 first closes the blocks whose residuals it takes back, and after the
    /// copies opens the complete blocks the step writes again (`residual_steps`, one per group).
    ///
    /// # Errors
    /// Launch errors; pair lists outside `meta` or `res_meta`.
    fn copy_on_write(&self, p: &PackedStep, residual_steps: &[ResidualRanges]) -> Result<()> {
        let (c, ops) = (&self.config, &self.ops);
        let (meta, res_meta) = (ops.dev(&self.meta), ops.dev(&self.res_meta));
        let (residuals, bs) = (self.pool.residual_count(), self.pool.plan.block_size);
        for (g, gm) in p.groups.iter().enumerate() {
            let layers = (0..c.n_layers).filter(|&l| self.layer_group[l] == g);
            for l in layers {
                if let Some(r) = residual_steps.get(g) {
                    let keys = self.pool.int4_args(ops, l)?;
                    let (early, n) = (
                        res_meta.range(r.close_early.clone())?,
                        r.close_early.len() / 2,
                    );
                    ops.int4_keys(Int4Op::Close, keys, early, n)?;
                }
                if gm.n_copies > 0 {
                    let pairs = meta.range(gm.copies.clone())?;
                    self.pool.copy_blocks(ops, l, pairs, gm.n_copies)?;
                }
                if let Some(r) = residual_steps.get(g) {
                    let keys = self.pool.int4_args(ops, l)?;
                    let (copies, n) = (res_meta.range(r.copies.clone())?, r.copies.len() / 2);
                    let kr = ops.dev(&self.pool.k_residual[l]);
                    ops.copy_blocks(kr, None, copies, n, residuals, bs * c.kv_dim())?;
                    let (open, n) = (res_meta.range(r.open.clone())?, r.open.len() / 2);
                    ops.int4_keys(Int4Op::Open, keys, open, n)?;
                }
            }
        }
        Ok(())
    }

    /// x (n_tokens, dim) = embedding[input_ids] · embed_scale.
    ///
    /// # Errors
    /// Launch errors.
    fn embed(&self, p: &PackedStep) -> Result<()> {
        let (c, ops) = (&self.config, &self.ops);
        let ids = ops.dev(&self.meta).range(p.input_ids.clone())?;
        let table = ops.dev(&self.weights.token_embedding);
        let (t, d) = (p.n_tokens, c.dim);
        ops.embedding(
            ops.dev(&self.ws.x),
            table,
            ids,
            t,
            c.vocab_size,
            d,
            c.embed_scale,
        )
    }

    /// Attention block of layer `l`: x += [post_norm] Wo · attention(RoPE(q), RoPE(k), v), with
    /// q, k, v for the step's new rows only, k and v written to the pool first. `residual` is
    /// int4's pair lists of the layer's group.
    ///
    /// # Errors
    /// Launch, cuBLAS and driver errors.
    fn attention_block(
        &self,
        p: &PackedStep,
        l: usize,
        residual: Option<&ResidualRanges>,
    ) -> Result<()> {
        let (c, ops, ws, lw) = (&self.config, &self.ops, &self.ws, &self.weights.layers[l]);
        let (t, d, hd, qd, kvd) = (p.n_tokens, c.dim, c.head_dim, c.q_dim(), c.kv_dim());
        let (x, xn, q, k, v) = (
            ops.dev(&ws.x),
            ops.dev(&ws.xn),
            ops.dev(&ws.q),
            ops.dev(&ws.k),
            ops.dev(&ws.v),
        );
        // q, k, v for the step's new positions only. (rows, q_dim), (rows, kv_dim) ×2
        ops.rmsnorm::<f32, A>(xn, x, ops.dev(&lw.attn_norm), t, d, c.norm_eps)?;
        ops.linear(q, xn, ops.dev(&lw.wq), t, d, qd)?;
        ops.linear(k, xn, ops.dev(&lw.wk), t, d, kvd)?;
        ops.linear(v, xn, ops.dev(&lw.wv), t, d, kvd)?;
        if let (Some(bq), Some(bk), Some(bv)) = (&lw.bq, &lw.bk, &lw.bv) {
            ops.add_bias(q, ops.dev(bq), t, qd)?;
            ops.add_bias(k, ops.dev(bk), t, kvd)?;
            ops.add_bias(v, ops.dev(bv), t, kvd)?;
        }
        if let (Some(qn), Some(kn)) = (&lw.q_norm, &lw.k_norm) {
            ops.rmsnorm::<A, A>(q, q, ops.dev(qn), t * c.n_heads, hd, c.norm_eps)?;
            ops.rmsnorm::<A, A>(k, k, ops.dev(kn), t * c.n_kv_heads, hd, c.norm_eps)?;
        }
        let r = self.rope.of_layer[l];
        let (cos, sin) = (ops.dev(&self.rope.cos[r]), ops.dev(&self.rope.sin[r]));
        let positions = ops.dev(&self.meta).range(p.positions.clone())?;
        let neox = c.rope_layout == RopeLayout::Neox;
        ops.rope(q, positions, cos, sin, t, c.n_heads, hd, neox)?;
        ops.rope(k, positions, cos, sin, t, c.n_kv_heads, hd, neox)?;
        // Write k, v into the pool at their slots, then attend over every cached position the
        // query may see, the new ones included.
        let (rows, read_map) = self.append_to_pool(p, l, residual)?;
        self.attend(p, l, &rows, read_map)?;
        let o = ops.dev(&ws.o);
        ops.linear(o, ops.dev(&ws.att), ops.dev(&lw.wo), t, qd, d)?;
        if let Some(pn) = &lw.post_attn_norm {
            ops.rmsnorm::<A, A>(o, o, ops.dev(pn), t, d, c.norm_eps)?;
        }
        ops.residual_add(x, o, t * d)
    }

    /// Writes the step's k and v (in `ws`) into layer `l`'s pool at their slots
    /// (`reshape_and_cache`, quantized to C; int4 then closes the blocks `residual` lists), then
    /// reads them back as the pool gives them. Returns the rows and pool of the layer, and int4's
    /// read map (num_blocks,) (else unused).
    ///
    /// # Errors
    /// Launch errors; ranges outside `meta`, `res_meta` or the maps.
    fn append_to_pool(
        &self,
        p: &PackedStep,
        l: usize,
        residual: Option<&ResidualRanges>,
    ) -> Result<(RowsAndPool<A, C>, Dev<i32>)> {
        let (c, ops, pool) = (&self.config, &self.ops, &self.pool);
        let g = self.layer_group[l];
        let num_blocks = pool.plan.num_blocks;
        // int4: (num_blocks,) the write map, then the read map (residual.rs); else unused.
        let maps = ops.dev(&pool.maps[g]);
        let (write_map, read_map) = if C::INT4 {
            (
                maps.range(0..num_blocks)?,
                maps.range(num_blocks..2 * num_blocks)?,
            )
        } else {
            (maps, maps)
        };
        let rows = RowsAndPool {
            k: ops.dev(&self.ws.k),
            v: ops.dev(&self.ws.v),
            k_cache: ops.dev(&pool.k[l]),
            v_cache: ops.dev(&pool.v[l]),
            k_scale: ops.dev(&pool.k_scale[l]),
            v_scale: ops.dev(&pool.v_scale[l]),
            k_residual: ops.dev(&pool.k_residual[l]),
            map: write_map,
            residuals: pool.residual_count(),
            slots: ops
                .dev(&self.meta)
                .range(p.groups[g].slot_mapping.clone())?,
            n_tokens: p.n_tokens,
            n_kv_heads: c.n_kv_heads,
            head_dim: c.head_dim,
            num_slots: pool.plan.num_slots(),
            block_size: pool.plan.block_size,
        };
        ops.reshape_and_cache(&rows)?;
        if let Some(r) = residual {
            let res_meta = ops.dev(&self.res_meta);
            let (close, n) = (res_meta.range(r.close.clone())?, r.close.len() / 2);
            ops.int4_keys(Int4Op::Close, pool.int4_args(ops, l)?, close, n)?;
        }
        // The step's own rows as the pool gives them back, as kvlab-cpu's paged engine
        // reads them: a query sees the same key from this step as from a later one.
        ops.kv_read_back(&RowsAndPool {
            map: read_map,
            ..rows
        })?;
        Ok((rows, read_map))
    }

    /// att (n_tokens, q_dim) = attention of the step's queries over layer `l`'s pool (`rows`,
    /// `read_map`: [`Self::append_to_pool`]): the decode rows by paged_attention v1 or v2, the
    /// prefill rows by prefill_attention.
    ///
    /// # Errors
    /// Launch errors; ranges outside `meta`.
    fn attend(
        &self,
        p: &PackedStep,
        l: usize,
        rows: &RowsAndPool<A, C>,
        read_map: Dev<i32>,
    ) -> Result<()> {
        let (c, ops) = (&self.config, &self.ops);
        let meta = ops.dev(&self.meta);
        let gm = &p.groups[self.layer_group[l]];
        let t = p.n_tokens;
        let args = AttentionArgs {
            out: ops.dev(&self.ws.att),
            q: ops.dev(&self.ws.q),
            k_new: rows.k,
            v_new: rows.v,
            k_cache: rows.k_cache,
            v_cache: rows.v_cache,
            k_scale: rows.k_scale,
            v_scale: rows.v_scale,
            k_residual: rows.k_residual,
            read_map,
            block_tables: meta.range(gm.block_tables.clone())?,
            query_start_loc: meta.range(p.query_start_loc.clone())?,
            context_lens: meta.range(p.context_lens.clone())?,
            token_seq: meta.range(p.token_seq.clone())?,
            n_tokens: t,
            n_seqs: p.n_seqs,
            max_blocks: gm.max_blocks,
            n_heads: c.n_heads,
            n_kv_heads: c.n_kv_heads,
            head_dim: c.head_dim,
            block_size: rows.block_size,
            num_slots: rows.num_slots,
            residuals: rows.residuals,
            window: gm.window.unwrap_or(0),
            scale: c.attn_scale,
        };
        if p.n_decode > 0 {
            let kernel = launch::choose_decode_kernel(
                self.decode_attention,
                p.n_decode,
                c.n_heads,
                gm.max_decode_keys,
                c.head_dim,
                ops.multiprocessors,
                self.v2_workspace.len(),
            );
            match kernel {
                DecodeKernel::V1 => ops.paged_attention_v1(&args, p.n_decode)?,
                DecodeKernel::V2 { max_partitions } => ops.paged_attention_v2(
                    &args,
                    p.n_decode,
                    max_partitions,
                    ops.dev(&self.v2_workspace),
                )?,
            }
        }
        if p.n_decode < t {
            ops.prefill_attention_v1(&args, p.n_decode, t - p.n_decode)?;
        }
        Ok(())
    }

    /// Feed-forward block of layer `l` over the step's `t` rows:
    /// x += [post_norm] W2 (act(W1 x) ⊙ W3 x).
    ///
    /// # Errors
    /// Launch and cuBLAS errors.
    fn feed_forward_block(&self, l: usize, t: usize) -> Result<()> {
        let (c, ops, ws, lw) = (&self.config, &self.ops, &self.ws, &self.weights.layers[l]);
        let (d, hid) = (c.dim, c.hidden_dim);
        let (x, xn, gate, up, o) = (
            ops.dev(&ws.x),
            ops.dev(&ws.xn),
            ops.dev(&ws.gate),
            ops.dev(&ws.up),
            ops.dev(&ws.o),
        );
        ops.rmsnorm::<f32, A>(xn, x, ops.dev(&lw.ffn_norm), t, d, c.norm_eps)?;
        ops.linear(gate, xn, ops.dev(&lw.w1), t, d, hid)?;
        ops.linear(up, xn, ops.dev(&lw.w3), t, d, hid)?;
        ops.glu(gate, up, t * hid, c.activation)?;
        ops.linear(o, gate, ops.dev(&lw.w2), t, hid, d)?;
        if let Some(pn) = &lw.post_ffn_norm {
            ops.rmsnorm::<A, A>(o, o, ops.dev(pn), t, d, c.norm_eps)?;
        }
        ops.residual_add(x, o, t * d)
    }

    /// Logits of the rows `logits_indices` names (each sequence's last token, and its draft
    /// tokens before it): `ws.logits` (n_logits, vocab) f32 = rmsnorm(x[logits_indices]) Wclsᵀ.
    ///
    /// # Errors
    /// Launch and cuBLAS errors.
    fn last_token_logits(&self, p: &PackedStep) -> Result<()> {
        let (c, ops, ws, w) = (&self.config, &self.ops, &self.ws, &self.weights);
        let (s, t, d) = (p.logits_indices.len(), p.n_tokens, c.dim);
        let (last, last_n) = (ops.dev(&ws.last), ops.dev(&ws.last_n));
        let rows = ops.dev(&self.meta).range(p.logits_indices.clone())?;
        ops.gather_rows(last, ops.dev(&ws.x), rows, s, t, d)?;
        ops.rmsnorm::<f32, A>(last_n, last, ops.dev(&w.final_norm), s, d, c.norm_eps)?;
        ops.linear::<A, f32>(
            ops.dev(&ws.logits),
            last_n,
            ops.dev(w.classifier()),
            s,
            d,
            c.vocab_size,
        )
    }

    /// int4: plans each group's residuals for step `p` (`residual.rs`), uploads the write and
    /// read maps to `pool.maps` and the pair lists to `res_meta`, and returns where each
    /// group's lists are in `res_meta` (every range of pairs, two i32 each). If a group's plan
    /// is refused, no group's map changes.
    ///
    /// # Errors
    /// More blocks written in the step than there are residuals; driver errors.
    fn plan_residuals(&mut self, p: &PackedStep) -> Result<Vec<ResidualRanges>> {
        let before = self.pool.residuals.clone();
        let planned = self.plan_residuals_or_fail(p);
        if planned.is_err() {
            self.pool.residuals = before;
        }
        planned
    }

    fn plan_residuals_or_fail(&mut self, p: &PackedStep) -> Result<Vec<ResidualRanges>> {
        let stream = self.dev.stream.clone();
        let mut ints: Vec<i32> = Vec::new();
        let mut push = |pairs: &[[i32; 2]]| {
            let start = ints.len();
            ints.extend(pairs.iter().flatten());
            start..ints.len()
        };
        let mut out = Vec::with_capacity(p.groups.len());
        for (g, gm) in p.groups.iter().enumerate() {
            let copies: Vec<[i32; 2]> = p.ints[gm.copies.clone()]
                .chunks_exact(2)
                .map(|c| [c[0], c[1]])
                .collect();
            let slots: Vec<i64> = p.ints[gm.slot_mapping.clone()]
                .iter()
                .map(|&s| i64::from(s))
                .collect();
            let plan = self.pool.residuals[g].plan_step(&copies, &slots)?;
            if plan.changed {
                let maps = [plan.write_map.as_slice(), &plan.read_map].concat();
                stream.memcpy_htod(&maps, &mut self.pool.maps[g])?;
            }
            out.push(ResidualRanges {
                close_early: push(&plan.close_early),
                copies: push(&plan.copies),
                open: push(&plan.open),
                close: push(&plan.close),
            });
        }
        if self.res_meta.len() < ints.len() {
            self.res_meta = stream.alloc_zeros::<i32>(ints.len().next_power_of_two())?;
        }
        if !ints.is_empty() {
            stream.memcpy_htod(&ints, &mut self.res_meta.slice_mut(0..ints.len()))?;
        }
        Ok(out)
    }

    /// The last step's logits, `n_logits` rows (vocab_size,): one per sequence, and one per
    /// draft token.
    ///
    /// # Errors
    /// Driver errors (including a kernel fault of the step).
    pub fn logits(&self, n_logits: usize) -> Result<Vec<Vec<f32>>> {
        let vocab = self.config.vocab_size;
        let flat = self
            .dev
            .stream
            .clone_dtoh(&self.ws.logits.slice(0..n_logits * vocab))?;
        self.dev.sync()?;
        Ok(flat.chunks_exact(vocab).map(<[f32]>::to_vec).collect())
    }

    /// Greedy tokens of the last step, computed on the device.
    ///
    /// # Errors
    /// Driver errors.
    pub fn greedy(&self, n_seqs: usize) -> Result<Vec<u32>> {
        let ops = &self.ops;
        ops.argmax(
            ops.dev(&self.ws.logits),
            ops.dev(&self.ws.tokens),
            n_seqs,
            self.config.vocab_size,
        )?;
        let ids = self
            .dev
            .stream
            .clone_dtoh(&self.ws.tokens.slice(0..n_seqs))?;
        self.dev.sync()?;
        ids.into_iter()
            .map(|i| {
                u32::try_from(i).map_err(|_| {
                    CudaError::BadInput(format!("argmax returned {i}, not a token id"))
                })
            })
            .collect()
    }
}

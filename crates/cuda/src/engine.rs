//! [`CudaEngine`]: the `Engine` trait (one sequence at a time, as `kvlab generate` drives it) and
//! `StepExecutor` (scheduled batches, as `kvlab_paged::drive` drives it) over the same GPU
//! forward pass.
//!
//! In single-sequence mode the engine keeps its own `BlockAllocator` per KV group (prefix caching
//! off) and a `BlockTable` per group for each sequence (`kvlab_paged::UnscheduledPools`, shared
//! with the paged CPU engine), reserves slots exactly as the
//! scheduler would (trim sliding windows, then `append_slots` with `keep_from = window_start`),
//! and runs the resulting one-sequence `ModelInput`, as a scheduled step is run. In batched mode the
//! scheduler owns the tables.
//! The two modes share one pool, so a run uses one or the other: `execute` refuses to run while
//! single-sequence sequences are alive.

use std::sync::Arc;

use half::{bf16, f16};
use kvlab_model::engine::{check_max_seq_len, check_tokens};
use kvlab_model::{Config, Engine, Error, KvDtype, KvUsage, Model, SeqId, Sequences, TraceStep};
use kvlab_paged::{
    BlockId, KvCacheConfig, ModelInput, PagedError, StepExecutor, UnscheduledPools, UnscheduledSeq,
};

use crate::device::{Device, DeviceInfo};
use crate::dtype::{Int4x2, Precision};
use crate::error::{CudaError, Result};
use crate::forward::{DeviceModel, DeviceModelOptions};
use crate::launch::{DecodeAttention, pack_step};
use crate::ops::Ops;
use crate::pool::{self, PoolPlan};

/// How to build a [`CudaEngine`].
#[derive(Clone, Debug)]
pub struct CudaOptions {
    /// Weights and activations: F32 (parity with the CPU engines) or F16 (fast).
    pub precision: Precision,
    /// How the KV pool stores keys and values: f32, f16, bf16, fp8-e4m3, int8 or int4
    /// (`--kv-dtype`; int4 adds f32 residuals for the keys of blocks still filling,
    /// `residual.rs`).
    pub kv_dtype: KvDtype,
    /// Fraction of the GPU's memory the engine may use in all (weights, activations, KV pool),
    /// like vLLM's `gpu_memory_utilization`. Ignored when `num_blocks` is given.
    pub gpu_memory_utilization: f32,
    /// Tokens per KV block (16, as vLLM).
    pub block_size: usize,
    /// A fixed pool size (blocks per group) instead of sizing from free memory.
    pub num_blocks: Option<usize>,
    /// Tokens per step the activation buffers are sized for up front (0: max(2048,
    /// max_seq_len), the scheduler's default budget); larger steps grow them.
    pub max_batch_tokens: usize,
    /// Sequences per step the buffers are sized for up front.
    pub max_seqs: usize,
    /// Force paged_attention v1 or v2 for decode (benchmarks); `Auto` picks.
    pub decode_attention: DecodeAttention,
    /// CUDA device ordinal.
    pub device: usize,
}

impl Default for CudaOptions {
    fn default() -> Self {
        CudaOptions {
            precision: Precision::F32,
            kv_dtype: KvDtype::F32,
            gpu_memory_utilization: 0.9,
            block_size: kvlab_paged::DEFAULT_BLOCK_SIZE,
            num_blocks: None,
            max_batch_tokens: 0,
            max_seqs: 256,
            decode_attention: DecodeAttention::Auto,
            device: 0,
        }
    }
}

/// The typed device model (and its step) for the chosen precision (activations) and KV dtype
/// (pool); fp8-e4m3 codes are `u8`, int8 codes `i8`.
enum Runner {
    F32F32(Box<DeviceModel<f32, f32>>),
    F32F16(Box<DeviceModel<f32, f16>>),
    F32Bf16(Box<DeviceModel<f32, bf16>>),
    F32Fp8(Box<DeviceModel<f32, u8>>),
    F32I8(Box<DeviceModel<f32, i8>>),
    F32I4(Box<DeviceModel<f32, Int4x2>>),
    F16F32(Box<DeviceModel<f16, f32>>),
    F16F16(Box<DeviceModel<f16, f16>>),
    F16Bf16(Box<DeviceModel<f16, bf16>>),
    F16Fp8(Box<DeviceModel<f16, u8>>),
    F16I8(Box<DeviceModel<f16, i8>>),
    F16I4(Box<DeviceModel<f16, Int4x2>>),
}

macro_rules! with_runner {
    ($runner:expr, $f:ident => $body:expr) => {
        match $runner {
            Runner::F32F32($f) => $body,
            Runner::F32F16($f) => $body,
            Runner::F32Bf16($f) => $body,
            Runner::F32Fp8($f) => $body,
            Runner::F32I8($f) => $body,
            Runner::F32I4($f) => $body,
            Runner::F16F32($f) => $body,
            Runner::F16F16($f) => $body,
            Runner::F16Bf16($f) => $body,
            Runner::F16Fp8($f) => $body,
            Runner::F16I8($f) => $body,
            Runner::F16I4($f) => $body,
        }
    };
}

/// The CUDA paged engine.
pub struct CudaEngine {
    model: Arc<Model>,
    runner: Runner,
    /// Single-sequence mode's pools, one per KV group, and its sequences.
    unscheduled: UnscheduledPools,
    seqs: Sequences<UnscheduledSeq>,
}

impl CudaEngine {
    /// Opens the GPU, compiles the kernels (NVRTC), uploads the weights, sizes and allocates the
    /// KV pool.
    ///
    /// # Errors
    /// `Error::Engine { engine: "cuda", .. }` whose reason says what is missing (no driver, no
    /// GPU, no NVRTC, no headers, not enough memory) or what failed; see
    /// [`CudaEngine::try_new`] for the typed error.
    pub fn new(model: Arc<Model>, opts: CudaOptions) -> Result<CudaEngine, Error> {
        Ok(Self::try_new(model, opts)?)
    }

    /// [`CudaEngine::new`] with the typed error ([`CudaError::is_unavailable`] says "skip").
    ///
    /// # Errors
    /// As [`CudaEngine::new`].
    pub fn try_new(model: Arc<Model>, opts: CudaOptions) -> Result<CudaEngine> {
        let c = &model.config;
        if opts.block_size == 0 {
            return Err(CudaError::Unsupported("block_size 0".into()));
        }
        crate::launch::check_head_dim(c.head_dim)?;
        // The pool's plan is checked before the GPU is opened.
        let per_block = pool::plan(c, 1, opts.block_size, opts.kv_dtype)?.pool_bytes;
        let dev = Device::open(opts.device)?;
        let ops = Ops::new(&dev)?;
        let model_opts = DeviceModelOptions {
            max_batch_tokens: if opts.max_batch_tokens == 0 {
                c.max_seq_len.max(2048)
            } else {
                opts.max_batch_tokens
            },
            max_seqs: opts.max_seqs.max(1),
            decode_attention: opts.decode_attention,
        };
        let (bs, kv) = (opts.block_size, opts.kv_dtype);
        let sizing = |free: usize, total: usize| -> Result<PoolPlan> {
            let n = match opts.num_blocks {
                Some(n) => n,
                None => pool::blocks_for_budget(
                    total,
                    free,
                    opts.gpu_memory_utilization,
                    pool::HEADROOM_BYTES,
                    per_block,
                )?,
            };
            if n == 0 || n.checked_mul(per_block).is_none_or(|b| b > free) {
                return Err(CudaError::OutOfMemory(format!(
                    "a pool of {n} blocks needs {} bytes, {free} are free",
                    n.saturating_mul(per_block)
                )));
            }
            pool::plan(c, n, bs, kv)
        };
        macro_rules! build {
            ($variant:ident) => {
                Runner::$variant(Box::new(DeviceModel::new(
                    dev,
                    ops,
                    &model,
                    &model_opts,
                    sizing,
                )?))
            };
        }
        let runner = match (opts.precision, opts.kv_dtype) {
            (Precision::F32, KvDtype::F32) => build!(F32F32),
            (Precision::F32, KvDtype::F16) => build!(F32F16),
            (Precision::F32, KvDtype::Bf16) => build!(F32Bf16),
            (Precision::F32, KvDtype::Fp8E4m3) => build!(F32Fp8),
            (Precision::F32, KvDtype::Int8) => build!(F32I8),
            (Precision::F16, KvDtype::F32) => build!(F16F32),
            (Precision::F16, KvDtype::F16) => build!(F16F16),
            (Precision::F16, KvDtype::Bf16) => build!(F16Bf16),
            (Precision::F16, KvDtype::Fp8E4m3) => build!(F16Fp8),
            (Precision::F16, KvDtype::Int8) => build!(F16I8),
            (Precision::F32, KvDtype::Int4) => build!(F32I4),
            (Precision::F16, KvDtype::Int4) => build!(F16I4),
        };
        let unscheduled = UnscheduledPools::new(with_runner!(&runner, f => &f.geometry.kv_cache))?;
        Ok(CudaEngine {
            model,
            runner,
            unscheduled,
            seqs: Sequences::default(),
        })
    }

    /// The pool's geometry: (num_blocks per group, block_size).
    pub fn pool(&self) -> (usize, usize) {
        let plan = self.pool_plan();
        (plan.num_blocks, plan.block_size)
    }

    /// The pool's shape, for the scheduler that drives this engine.
    pub fn kv_cache(&self) -> &KvCacheConfig {
        self.unscheduled.kv_cache()
    }

    /// The pool's size report (blocks, bytes per token per group, bytes).
    pub fn pool_plan(&self) -> &PoolPlan {
        with_runner!(&self.runner, f => &f.pool.plan)
    }

    /// The GPU.
    pub fn device_info(&self) -> &DeviceInfo {
        with_runner!(&self.runner, f => &f.dev.info)
    }

    /// Bytes of weights on the device.
    pub fn weight_bytes(&self) -> usize {
        with_runner!(&self.runner, f => f.weights.bytes)
    }

    /// Runs a scheduled step and returns its greedy tokens, computed on the device (one id
    /// per `logits_indices` row comes back to the host).
    ///
    /// # Errors
    /// As [`StepExecutor::execute`].
    pub fn execute_greedy(&mut self, input: &ModelInput) -> Result<Vec<u32>, Error> {
        let n = self.run(input)?;
        Ok(with_runner!(&self.runner, f => f.greedy(n))?)
    }

    /// Waits for the GPU (benchmarks time whole steps).
    ///
    /// # Errors
    /// Driver errors.
    pub fn synchronize(&self) -> Result<(), Error> {
        Ok(with_runner!(&self.runner, f => f.dev.sync())?)
    }

    /// Runs a step; returns its rows of logits (`logits_indices`).
    fn run(&mut self, input: &ModelInput) -> Result<usize> {
        let packed = with_runner!(&self.runner, f => pack_step(input, &f.geometry))?;
        with_runner!(&mut self.runner, f => f.step(&packed))?;
        Ok(packed.logits_indices.len())
    }

    /// One step of a sequence driven through the `Engine` API; the logits of its last token, or
    /// with `all` of every token (a speculative check).
    fn run_unscheduled(
        &mut self,
        seq: SeqId,
        tokens: &[u32],
        all: bool,
    ) -> Result<Vec<Vec<f32>>, Error> {
        let (num_blocks, block_size) = self.pool();
        let st = self.seqs.get_mut(seq)?;
        check_tokens(&self.model.config, seq, st.len, st.max_seq_len, tokens)?;
        let mut input = self.unscheduled.step(st, tokens).map_err(|e| match e {
            PagedError::OutOfBlocks { .. } => CudaError::PoolFull {
                num_blocks,
                block_size,
            },
            e => CudaError::Paged(e),
        })?;
        if all {
            // Every row is a run of the sequence's rows ending at its last: a valid step.
            input.logits_indices = (0..tokens.len()).collect();
        }
        let n = self.run(&input)?;
        let logits = with_runner!(&self.runner, f => f.logits(n))?;
        if let Ok(st) = self.seqs.get_mut(seq) {
            st.len += tokens.len();
        }
        Ok(logits)
    }
}

impl Engine for CudaEngine {
    fn name(&self) -> &'static str {
        "cuda"
    }

    fn config(&self) -> &Config {
        &self.model.config
    }

    fn new_sequence(&mut self, max_seq_len: usize) -> Result<SeqId, Error> {
        check_max_seq_len(&self.model.config, max_seq_len)?;
        let (num_blocks, block_size) = self.pool();
        let needed = max_seq_len.div_ceil(block_size);
        if needed > num_blocks {
            return Err(CudaError::OutOfMemory(format!(
                "a sequence of {max_seq_len} positions needs {needed} blocks of {block_size}, the \
                 pool has {num_blocks}; raise num_blocks or gpu_memory_utilization, or lower \
                 max_seq_len"
            ))
            .into());
        }
        Ok(self.seqs.insert(self.unscheduled.new_seq(max_seq_len)))
    }

    fn prefill(&mut self, seq: SeqId, tokens: &[u32]) -> Result<Vec<f32>, Error> {
        let mut logits = self.run_unscheduled(seq, tokens, false)?;
        logits
            .pop()
            .ok_or_else(|| Error::from(CudaError::BadInput("a step returned no logits".into())))
    }

    /// Every row's logits from one step on the device (the speculative check): the rows'
    /// classifier products are one GEMM.
    fn score(&mut self, seq: SeqId, tokens: &[u32]) -> Result<Vec<Vec<f32>>, Error> {
        self.run_unscheduled(seq, tokens, true)
    }

    /// Cuts the sequence's block tables (kvlab-paged's `UnscheduledPools::truncate`, the
    /// device-independent part cpu-paged tests): the pool's slots past `len` are written again.
    fn truncate(&mut self, seq: SeqId, len: usize) -> Result<bool, Error> {
        let s = self.seqs.get_mut(seq)?;
        Ok(self.unscheduled.truncate(s, len))
    }

    fn free(&mut self, seq: SeqId) {
        if let Some(mut st) = self.seqs.remove(seq) {
            self.unscheduled.free(&mut st);
        }
    }

    fn kv_usage(&self) -> KvUsage {
        let used = self
            .seqs
            .values()
            .map(|s| {
                self.pool_plan()
                    .groups
                    .iter()
                    .map(|g| s.len.min(g.window.unwrap_or(usize::MAX)) * g.bytes_per_token)
                    .sum::<usize>()
            })
            .sum();
        KvUsage {
            used_bytes: used,
            reserved_bytes: self.pool_plan().pool_bytes,
        }
    }

    fn trace(&self, seq: SeqId) -> Option<TraceStep> {
        let st = self.seqs.get(seq)?;
        let (c, plan) = (&self.model.config, self.pool_plan());
        let shape = format!(
            "(num_blocks={}, block_size={}, n_kv_heads={}, head_dim={}) {}",
            plan.num_blocks,
            plan.block_size,
            c.n_kv_heads,
            c.head_dim,
            plan.kv_dtype.name()
        );
        let (block_table, slot_mapping) = st.trace_rows();
        Some(TraceStep {
            len: st.len,
            layer_cache_shapes: vec![shape; c.n_layers],
            block_table: Some(block_table),
            slot_mapping: Some(slot_mapping),
        })
    }
}

impl StepExecutor for CudaEngine {
    type Error = Error;

    fn execute(&mut self, input: &ModelInput) -> Result<Vec<Vec<f32>>, Error> {
        if !self.seqs.is_empty() {
            return Err(CudaError::BadInput(format!(
                "{} single-sequence sequences hold blocks of the pool the scheduler also \
                 manages; free them before running scheduled batches",
                self.seqs.len()
            ))
            .into());
        }
        let n = self.run(input)?;
        Ok(with_runner!(&self.runner, f => f.logits(n))?)
    }

    /// Every layer of `group`, K then V, as the pool stores them (elements or codes, and the
    /// scales of the 8-bit formats), copied to the host. Not yet run on a GPU
    /// (crates/cuda/README.md lists the check).
    fn read_block(&mut self, group: usize, block: BlockId) -> Result<Option<Vec<u8>>, Error> {
        let bytes = with_runner!(&self.runner, f => {
            f.pool.read_block(&f.dev.stream, group, block as usize)
        })?;
        Ok(Some(bytes))
    }

    fn write_block(&mut self, group: usize, block: BlockId, bytes: &[u8]) -> Result<bool, Error> {
        with_runner!(&mut self.runner, f => {
            f.pool.write_block(&f.ops, group, block as usize, bytes)
        })?;
        Ok(true)
    }
}

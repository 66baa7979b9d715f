//! Engines built by kind: [`build`] (the single-sequence engines, a default pool for the paged
//! ones), [`build_for`] (a pool the size of one request), [`build_paged`] (a pool of a given
//! size, batched steps) and the shapes the scheduler driving a paged engine takes.

use std::sync::Arc;

use anyhow::{Result, bail};
use kvlab_model::{Engine, KvDtype, Model};
use kvlab_paged::{KvCacheConfig, SchedulerConfig, StepExecutor};

use crate::EngineKind;

/// Whether an engine can run on this machine: `Err` with the reason when it cannot (the cuda
/// engine without an NVIDIA driver or GPU). Harnesses report such engines as SKIPPED, unless
/// `KVLAB_REQUIRE_CUDA=1` makes a missing GPU a failure.
pub fn availability(engine: EngineKind) -> std::result::Result<(), String> {
    match engine {
        EngineKind::Cuda => kvlab_cuda::probe().map(|_| ()).map_err(|e| e.to_string()),
        _ => Ok(()),
    }
}

/// `KVLAB_REQUIRE_CUDA=1`: a missing GPU fails instead of skipping.
pub fn require_cuda() -> bool {
    kvlab_cuda::require_cuda()
}

/// A paged engine: the single-sequence [`Engine`] trait plus batched scheduled steps.
pub trait PagedEngine: Engine + StepExecutor<Error = kvlab_model::Error> {
    /// The block pool's shape, which the scheduler driving this engine takes
    /// (`SchedulerConfig::new(engine.kv_cache().clone(), max_model_len)`).
    fn kv_cache(&self) -> &KvCacheConfig;
}

impl PagedEngine for kvlab_cpu::paged::PagedCpuEngine {
    fn kv_cache(&self) -> &KvCacheConfig {
        self.kv_cache()
    }
}

impl PagedEngine for kvlab_cuda::CudaEngine {
    fn kv_cache(&self) -> &KvCacheConfig {
        self.kv_cache()
    }
}

/// Size of a paged engine's block pool.
#[derive(Clone, Copy, Debug)]
pub struct PoolOptions {
    /// Blocks per KV group (one group per attention kind: global, sliding-window).
    pub num_blocks: usize,
    /// Token slots per block.
    pub block_size: usize,
    /// The type the pool stores keys and values in.
    pub kv_dtype: KvDtype,
}

impl PoolOptions {
    /// A pool of f32 that holds `sequences` full-length sequences of `max_seq_len` tokens.
    pub fn for_sequences(sequences: usize, max_seq_len: usize, block_size: usize) -> PoolOptions {
        PoolOptions {
            num_blocks: sequences * max_seq_len.div_ceil(block_size),
            block_size,
            kv_dtype: KvDtype::F32,
        }
    }

    /// The same pool with keys and values stored as `kv_dtype`.
    pub fn with_kv_dtype(self, kv_dtype: KvDtype) -> PoolOptions {
        PoolOptions { kv_dtype, ..self }
    }
}

/// Most positions of one sequence the paged engines' pools are sized for by default: the model's
/// context, capped here.
pub const MAX_MODEL_LEN: usize = 8192;

/// Builds `engine` over `model` with an f32 KV cache (paged engines get a pool for two
/// sequences of the model's whole context, capped at [`MAX_MODEL_LEN`] positions).
///
/// # Errors
/// The engine's own (a missing GPU, a pool larger than the machine).
pub fn build(engine: EngineKind, model: Arc<Model>) -> Result<Box<dyn Engine>> {
    build_kv(engine, model, KvDtype::F32)
}

/// [`build`] with keys and values stored as `kv_dtype`.
///
/// # Errors
/// As [`build`], and a dtype the engine does not store (see [`check_kv_dtype`]).
pub fn build_kv(
    engine: EngineKind,
    model: Arc<Model>,
    kv_dtype: KvDtype,
) -> Result<Box<dyn Engine>> {
    check_kv_dtype(engine, kv_dtype)?;
    Ok(match engine {
        EngineKind::Naive => Box::new(kvlab_naive::NaiveEngine::new(model)),
        EngineKind::Cpu => Box::new(kvlab_cpu::CpuEngine::with_kv_dtype(model, kv_dtype)),
        EngineKind::CpuPaged | EngineKind::Cuda => {
            // Room for two sequences of the whole context (at most 8,192 positions each).
            let pool = PoolOptions::for_sequences(
                2,
                model.config.max_seq_len.min(MAX_MODEL_LEN),
                kvlab_paged::DEFAULT_BLOCK_SIZE,
            );
            build_paged(engine, model, pool.with_kv_dtype(kv_dtype))?
        }
    })
}

/// Whether `engine` can keep its keys and values as `kv_dtype`: the CPU caches and the CUDA
/// pool store every dtype; the naive engine keeps no cache.
///
/// # Errors
/// The reason, and the engines that do store it.
pub fn check_kv_dtype(engine: EngineKind, kv_dtype: KvDtype) -> Result<()> {
    match (engine, kv_dtype) {
        (_, KvDtype::F32) | (EngineKind::Cpu | EngineKind::CpuPaged, _) => Ok(()),
        (EngineKind::Naive, _) => bail!(
            "the naive engine keeps no KV cache, so --kv-dtype {kv_dtype} has nothing to store; use --engine cpu or cpu-paged"
        ),
        (EngineKind::Cuda, _) => Ok(()),
    }
}

/// Builds `engine` for one request of `positions` positions, keys and values stored as
/// `kv_dtype`: paged engines get a pool of exactly that (rounded up to whole blocks), so the
/// memory follows the request, not the model's context.
///
/// # Errors
/// The engine's own, a pool larger than the machine, or a dtype it does not store.
pub fn build_for(
    engine: EngineKind,
    model: Arc<Model>,
    positions: usize,
    kv_dtype: KvDtype,
) -> Result<Box<dyn Engine>> {
    if engine.is_paged() {
        let pool = PoolOptions::for_sequences(1, positions, kvlab_paged::DEFAULT_BLOCK_SIZE)
            .with_kv_dtype(kv_dtype);
        return Ok(build_paged(engine, model, pool)?);
    }
    build_kv(engine, model, kv_dtype)
}

/// Builds the paged `engine` with a pool of the given size.
///
/// # Errors
/// A non-paged engine (the message lists the paged ones), or the engine's own.
pub fn build_paged(
    engine: EngineKind,
    model: Arc<Model>,
    pool: PoolOptions,
) -> Result<Box<dyn PagedEngine>> {
    check_kv_dtype(engine, pool.kv_dtype)?;
    // Every KV group holds `num_blocks` blocks for its own layers, so the groups together hold
    // num_blocks × (KV bytes of a block over all layers; the block size is bounded by
    // the CLI's `args::MAX_BLOCK_SIZE`, the model's shape by its loader).
    let pool_bytes = (pool
        .kv_dtype
        .bytes_per_block(&model.config, pool.block_size) as u64)
        .checked_mul(pool.num_blocks as u64);
    match engine {
        EngineKind::CpuPaged => {
            crate::memory::ensure_fits(
                &format!(
                    "a KV pool of {} blocks x {} tokens",
                    pool.num_blocks, pool.block_size
                ),
                pool_bytes,
                "lower --num-blocks or --block-size",
            )?;
            let kv_cache = kv_cache_config(&model, pool);
            let engine =
                kvlab_cpu::paged::PagedCpuEngine::with_kv_dtype(model, kv_cache, pool.kv_dtype)?;
            Ok(Box::new(engine))
        }
        // f32 weights and activations (the parity mode verify needs), the pool in --kv-dtype.
        EngineKind::Cuda => Ok(Box::new(kvlab_cuda::CudaEngine::new(
            model,
            kvlab_cuda::CudaOptions {
                num_blocks: Some(pool.num_blocks),
                block_size: pool.block_size,
                kv_dtype: pool.kv_dtype,
                ..Default::default()
            },
        )?)),
        EngineKind::Naive | EngineKind::Cpu => bail!(
            "{:?} is not a paged engine; paged engines: {}",
            engine.name(),
            EngineKind::paged()
                .iter()
                .map(|e| e.name())
                .collect::<Vec<_>>()
                .join(", ")
        ),
    }
}

/// The shape of `pool` for `model`: one KV group for global layers and one per distinct sliding
/// window, each with `pool.num_blocks` blocks. The paged engines are built with it.
pub fn kv_cache_config(model: &Model, pool: PoolOptions) -> KvCacheConfig {
    KvCacheConfig::new(
        model.config.kv_cache_groups(),
        pool.num_blocks,
        pool.block_size,
    )
}

/// A scheduler config for the engine built from `model` and `pool` (prefix caching on); with
/// the engine at hand, take `engine.kv_cache()` instead.
pub fn scheduler_config(model: &Model, pool: PoolOptions, max_model_len: usize) -> SchedulerConfig {
    SchedulerConfig::new(kv_cache_config(model, pool), max_model_len)
}

//! Engines by name, as the command line and the harness name them.

use std::sync::Arc;

use anyhow::{Result, bail};
use kvlab_model::{Engine, Model};
use kvlab_paged::{KvCacheConfig, SchedulerConfig, StepExecutor};

/// Every engine name kvlab knows, in the order reports list them.
pub const ENGINES: &[&str] = &["naive", "cpu", "cpu-paged", "cuda"];

/// The engines with a paged KV cache, which also run batched steps from the scheduler.
pub const PAGED_ENGINES: &[&str] = &["cpu-paged", "cuda"];

/// Checks engine names given on a command line.
///
/// # Errors
/// The first unknown name (the message lists the known ones).
pub fn check_names(names: &[String]) -> Result<()> {
    match names.iter().find(|n| !ENGINES.contains(&n.as_str())) {
        Some(e) => bail!("unknown engine {e:?}; known: {}", ENGINES.join(", ")),
        None => Ok(()),
    }
}

/// Whether an engine can run on this machine: `Err` with the reason when it cannot (the cuda
/// engine without an NVIDIA driver or GPU). Harnesses report such engines as SKIPPED, unless
/// `KVLAB_REQUIRE_CUDA=1` makes a missing GPU a failure.
pub fn availability(name: &str) -> std::result::Result<(), String> {
    match name {
        "cuda" => kvlab_cuda::probe().map(|_| ()).map_err(|e| e.to_string()),
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
}

impl PoolOptions {
    /// A pool that holds `sequences` full-length sequences of `max_seq_len` tokens.
    pub fn for_sequences(sequences: usize, max_seq_len: usize, block_size: usize) -> PoolOptions {
        PoolOptions {
            num_blocks: sequences * max_seq_len.div_ceil(block_size),
            block_size,
        }
    }
}

/// Builds the engine called `name` over `model` (paged engines get a pool for two sequences of
/// the model's whole context, capped at 8,192 positions).
///
/// # Errors
/// An unknown name (the message lists the known ones).
pub fn build(name: &str, model: Arc<Model>) -> Result<Box<dyn Engine>> {
    Ok(match name {
        "naive" => Box::new(kvlab_naive::NaiveEngine::new(model)),
        "cpu" => Box::new(kvlab_cpu::CpuEngine::new(model)),
        _ if PAGED_ENGINES.contains(&name) => {
            // Room for two sequences of the whole context (at most 8,192 positions each).
            let pool = PoolOptions::for_sequences(
                2,
                model.config.max_seq_len.min(8192),
                kvlab_paged::DEFAULT_BLOCK_SIZE,
            );
            build_paged_inner(name, model, pool)?
        }
        other => bail!(
            "unknown engine {other:?}; choose one of: {}",
            ENGINES.join(", ")
        ),
    })
}

/// Builds the engine called `name` for one request of `positions` positions: paged engines get
/// a pool of exactly that (rounded up to whole blocks), so the memory follows the request, not
/// the model's context.
///
/// # Errors
/// An unknown name (the message lists the known ones), or a pool larger than the machine.
pub fn build_for(name: &str, model: Arc<Model>, positions: usize) -> Result<Box<dyn Engine>> {
    if PAGED_ENGINES.contains(&name) {
        let pool = PoolOptions::for_sequences(1, positions, kvlab_paged::DEFAULT_BLOCK_SIZE);
        let engine: Box<dyn Engine> = build_paged_inner(name, model, pool)?;
        return Ok(engine);
    }
    build(name, model)
}

/// Builds the paged engine called `name` with a pool of the given size.
///
/// # Errors
/// An unknown or non-paged name.
pub fn build_paged(
    name: &str,
    model: Arc<Model>,
    pool: PoolOptions,
) -> Result<Box<dyn PagedEngine>> {
    build_paged_inner(name, model, pool)
}

fn build_paged_inner(
    name: &str,
    model: Arc<Model>,
    pool: PoolOptions,
) -> Result<Box<dyn PagedEngine>> {
    // Every KV group holds `num_blocks` blocks for its own layers, so the groups together hold
    // num_blocks × block_size × (KV bytes per token over all layers).
    let pool_bytes = (pool.num_blocks as u64)
        .checked_mul(pool.block_size as u64)
        .and_then(|slots| slots.checked_mul(model.config.kv_bytes_per_token(4) as u64));
    if name == "cpu-paged" {
        crate::memory::ensure_fits(
            &format!(
                "a KV pool of {} blocks x {} tokens",
                pool.num_blocks, pool.block_size
            ),
            pool_bytes,
            "lower --num-blocks or --block-size",
        )?;
    }
    match name {
        "cpu-paged" => {
            let kv_cache = kv_cache_config(&model, pool);
            let engine = kvlab_cpu::paged::PagedCpuEngine::new(model, kv_cache)?;
            Ok(Box::new(engine))
        }
        // f32 weights, activations and KV pool: the parity mode verify needs.
        "cuda" => Ok(Box::new(kvlab_cuda::CudaEngine::new(
            model,
            kvlab_cuda::CudaOptions {
                num_blocks: Some(pool.num_blocks),
                block_size: pool.block_size,
                ..Default::default()
            },
        )?)),
        other => bail!(
            "{other:?} is not a paged engine; paged engines: {}",
            PAGED_ENGINES.join(", ")
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

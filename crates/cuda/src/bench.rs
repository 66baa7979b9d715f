//! GPU benchmarks (run by `kvlab-cuda-bench` and `cargo xtask bench` on a GPU machine) and the
//! memory-waste comparison (pure, also run on the CPU).
//!
//! * [`copy_bandwidth`]: device-to-device `cuMemcpy`, the achievable bandwidth to compare with.
//! * [`attention_bench`]: paged decode attention alone, batch × context, bytes of K and V read
//!   per second against the copy bandwidth.
//! * [`decode_bench`]: end-to-end decode tokens/s and time per output token through the
//!   scheduler (continuous batching) at a fixed batch.
//! * [`waste_comparison`]: KV memory waste and the batch each scheme sustains for one pool.
//!
//! Every timed region synchronises the device before the clock stops, after a warm-up.

use std::time::Instant;

use cudarc::driver::CudaSlice;
use kvlab_model::Config;
use kvlab_paged::{
    KvCacheConfig, PAD_BLOCK, RequestLen, Reservation, Scheduler, SchedulerConfig, StopConditions,
    Waste, compute_waste,
};
use rand::seq::SliceRandom;
use rand::{Rng, SeedableRng};
use rand_chacha::ChaCha8Rng;
use serde::Serialize;

use crate::device::Device;
use crate::dtype::{CacheElem, DType};
use crate::engine::CudaEngine;
use crate::error::{CudaError, Result};
use crate::launch::{self, DecodeAttention, DecodeKernel};
use crate::ops::{AttentionArgs, Launcher, Ops, cache_sizes};

/// Measured device-to-device copy bandwidth, in bytes per second (read + write counted).
///
/// # Errors
/// Driver errors.
pub fn copy_bandwidth(dev: &Device, bytes: usize, iters: usize) -> Result<f64> {
    let n = bytes / 4;
    let src = dev.stream.alloc_zeros::<f32>(n)?;
    let mut dst = dev.stream.alloc_zeros::<f32>(n)?;
    dev.stream.memcpy_dtod(&src, &mut dst)?;
    dev.sync()?;
    let t = Instant::now();
    for _ in 0..iters {
        dev.stream.memcpy_dtod(&src, &mut dst)?;
    }
    dev.sync()?;
    Ok(2.0 * (n * 4) as f64 * iters as f64 / t.elapsed().as_secs_f64())
}

/// One row of the attention benchmark.
#[derive(Clone, Debug, Serialize)]
pub struct AttentionRow {
    /// Sequences decoding, one query token each.
    pub batch: usize,
    /// Keys each sequence attends to (its context_len).
    pub context: usize,
    /// The pool's element type, as its kernel suffix: "f32", "f16", "bf16", "fp8", "i8" or "i4".
    pub kv_dtype: &'static str,
    /// "v1" or "v2 (P partitions)".
    pub kernel: String,
    /// Mean time of one attention call (v2: both launches), in seconds, after 3 warm-up calls.
    pub seconds_per_call: f64,
    /// K and V bytes read per call: batch · n_kv_heads · `KvDtype::kv_head_bytes` of the context
    /// (2 · context · head_dim elements, plus the scales of fp8-e4m3 and int8, or int4's).
    pub kv_bytes: usize,
    /// kv_bytes / seconds_per_call, in bytes per second.
    pub bytes_per_s: f64,
    /// bytes_per_s / copy bandwidth.
    pub fraction_of_copy: f64,
}

/// Times paged decode attention (one layer of `config`'s heads) for `batch` sequences of
/// `context` keys each, blocks of 16 scattered over a shuffled pool, caches of type `C`,
/// activations `A`.
///
/// # Errors
/// Driver errors, or [`CudaError::OutOfMemory`] when the caches would not fit in half the free
/// memory (the caller reports the cell as skipped).
#[allow(clippy::too_many_arguments)]
pub fn attention_bench<A: DType, C: CacheElem>(
    dev: &Device,
    ops: &Ops,
    config: &Config,
    batch: usize,
    context: usize,
    choice: DecodeAttention,
    iters: usize,
    copy_bytes_per_s: f64,
) -> Result<AttentionRow> {
    let bs = 16;
    let (n_heads, n_kv_heads, head_dim) = (config.n_heads, config.n_kv_heads, config.head_dim);
    let kv_dim = n_kv_heads * head_dim;
    let blocks_per_seq = context.div_ceil(bs);
    let num_blocks = batch * blocks_per_seq;
    let [cache_elems, k_scales, v_scales, residual, map] =
        cache_sizes::<C>(num_blocks * bs, bs, (n_kv_heads, head_dim), 0);
    let (free, _) = dev.mem_info()?;
    // K and V of every slot, with their scales.
    let pool_bytes = num_blocks * n_kv_heads * C::KV_DTYPE.kv_head_bytes(head_dim, bs, bs);
    if pool_bytes > free / 2 {
        return Err(CudaError::OutOfMemory(format!(
            "batch {batch} x context {context} needs {} bytes of K/V",
            pool_bytes
        )));
    }
    let s = &dev.stream;
    let k_cache = s.alloc_zeros::<C>(cache_elems)?;
    let v_cache = s.alloc_zeros::<C>(cache_elems)?;
    // Scales of 1 for the 8-bit formats (one per slot and KV head), (s, min) = (1, 1) for
    // int4, whose blocks are all complete (no residual: a read map of -1); one unused element
    // otherwise.
    let k_scale = s.clone_htod(&vec![1.0f32; k_scales.max(1)])?;
    let v_scale = s.clone_htod(&vec![1.0f32; v_scales.max(1)])?;
    let k_residual = s.alloc_zeros::<f32>(residual.max(1))?;
    let read_map = s.clone_htod(&vec![-1i32; map.max(1)])?;
    let mut rng = ChaCha8Rng::seed_from_u64(7);
    let mut random = |n: usize| -> Vec<A> {
        (0..n)
            .map(|_| A::from_f32(rng.random_range(-1.0..1.0)))
            .collect()
    };
    let q = s.clone_htod(&random(batch * n_heads * head_dim))?;
    let k_new = s.clone_htod(&random(batch * kv_dim))?;
    let v_new = s.clone_htod(&random(batch * kv_dim))?;
    let out: CudaSlice<A> = s.alloc_zeros(batch * n_heads * head_dim)?;
    // A shuffled pool: block tables point all over it, as after hours of serving.
    let mut blocks: Vec<i32> = (0..num_blocks as i32).collect();
    blocks.shuffle(&mut rng);
    let mut ints = blocks;
    ints.extend(0..=batch as i32); // query_start_loc
    ints.extend(std::iter::repeat_n(context as i32, batch)); // context_lens
    ints.extend(0..batch as i32); // token_seq
    ints.push(PAD_BLOCK);
    let meta = s.clone_htod(&ints)?;
    let m = ops.dev(&meta);
    let tb = num_blocks;
    let args = AttentionArgs {
        out: ops.dev(&out),
        q: ops.dev(&q),
        k_new: ops.dev(&k_new),
        v_new: ops.dev(&v_new),
        k_cache: ops.dev(&k_cache),
        v_cache: ops.dev(&v_cache),
        k_scale: ops.dev(&k_scale),
        v_scale: ops.dev(&v_scale),
        k_residual: ops.dev(&k_residual),
        read_map: ops.dev(&read_map),
        block_tables: m.range(0..tb)?,
        query_start_loc: m.range(tb..tb + batch + 1)?,
        context_lens: m.range(tb + batch + 1..tb + 2 * batch + 1)?,
        token_seq: m.range(tb + 2 * batch + 1..tb + 3 * batch + 1)?,
        n_tokens: batch,
        n_seqs: batch,
        max_blocks: blocks_per_seq,
        n_heads,
        n_kv_heads,
        head_dim,
        block_size: bs,
        num_slots: num_blocks * bs,
        residuals: 0,
        window: 0,
        scale: config.attn_scale,
    };
    let parts = launch::num_partitions(context, launch::PARTITION_SIZE);
    let ws_floats = launch::v2_workspace_floats(batch, n_heads, parts, head_dim);
    let workspace = s.alloc_zeros::<f32>(ws_floats.max(1))?;
    let kernel = launch::choose_decode_kernel(
        choice,
        batch,
        n_heads,
        context,
        head_dim,
        ops.multiprocessors,
        ws_floats,
    );
    let run = || -> Result<()> {
        match kernel {
            DecodeKernel::V1 => ops.paged_attention_v1(&args, batch),
            DecodeKernel::V2 { max_partitions } => {
                ops.paged_attention_v2(&args, batch, max_partitions, ops.dev(&workspace))
            }
        }
    };
    for _ in 0..3 {
        run()?;
    }
    dev.sync()?;
    let t = Instant::now();
    for _ in 0..iters {
        run()?;
    }
    dev.sync()?;
    let seconds_per_call = t.elapsed().as_secs_f64() / iters as f64;
    let kv_bytes = batch * n_kv_heads * C::KV_DTYPE.kv_head_bytes(head_dim, context, bs);
    let bytes_per_s = kv_bytes as f64 / seconds_per_call;
    Ok(AttentionRow {
        batch,
        context,
        kv_dtype: C::NAME,
        kernel: match kernel {
            DecodeKernel::V1 => "v1".into(),
            DecodeKernel::V2 { max_partitions } => format!("v2 ({max_partitions} partitions)"),
        },
        seconds_per_call,
        kv_bytes,
        bytes_per_s,
        fraction_of_copy: bytes_per_s / copy_bytes_per_s,
    })
}

/// One row of the end-to-end decode benchmark.
#[derive(Clone, Debug, Serialize)]
pub struct DecodeRow {
    /// Sequences decoding at once (the scheduler's max_num_seqs).
    pub batch: usize,
    /// Random tokens in each prompt.
    pub prompt_len: usize,
    /// Decode steps timed (every sequence running, no prefill in the step).
    pub decode_steps: usize,
    /// Wall time of the timed decode steps, in seconds (each ends with a device sync).
    pub decode_seconds: f64,
    /// batch · decode_steps / decode_seconds.
    pub tokens_per_s: f64,
    /// Time per output token of one sequence: decode_seconds / decode_steps, in ms.
    pub tpot_ms: f64,
    /// Wall time of the other steps (prefills, partial batches), in seconds; the first full
    /// decode step, a warm-up, counts in neither.
    pub prefill_seconds: f64,
    /// Preemptions during the run (0 unless the pool is too small for the batch).
    pub num_preemptions: u64,
}

/// Runs `batch` requests of `prompt_len` random tokens, `gen_tokens` new tokens each, through
/// the scheduler and the engine with greedy sampling on the device; times the steps where all
/// `batch` sequences decode.
///
/// # Errors
/// Engine or scheduler errors.
pub fn decode_bench(
    engine: &mut CudaEngine,
    batch: usize,
    prompt_len: usize,
    gen_tokens: usize,
) -> Result<DecodeRow, kvlab_model::Error> {
    let vocab = kvlab_model::Engine::config(engine).vocab_size;
    let mut cfg = SchedulerConfig::new(engine.kv_cache().clone(), prompt_len + gen_tokens + 1);
    cfg.max_num_seqs = batch;
    cfg.enable_prefix_caching = false;
    let paged = |e: kvlab_paged::PagedError| kvlab_model::Error::from(CudaError::from(e));
    let mut sched = Scheduler::new(cfg).map_err(paged)?;
    let mut rng = ChaCha8Rng::seed_from_u64(11);
    for _ in 0..batch {
        let prompt: Vec<u32> = (0..prompt_len)
            .map(|_| rng.random_range(0..vocab as u32))
            .collect();
        sched
            .add_request(prompt, StopConditions::max_tokens(gen_tokens))
            .map_err(paged)?;
    }
    let (mut decode_seconds, mut prefill_seconds, mut decode_steps) = (0.0, 0.0, 0);
    let mut warm = false;
    while sched.has_unfinished() {
        let b = sched.schedule().map_err(paged)?;
        if b.is_empty() {
            break;
        }
        let all_decode = b.num_prefills() == 0 && b.seqs.len() == batch;
        engine.synchronize()?;
        let t = Instant::now();
        let tokens = engine.execute_greedy(&b.model_input())?;
        engine.synchronize()?;
        let dt = t.elapsed().as_secs_f64();
        if all_decode && warm {
            decode_seconds += dt;
            decode_steps += 1;
        } else if all_decode {
            warm = true; // the first full decode step warms up and is not counted
        } else {
            prefill_seconds += dt;
        }
        let sampled = b.seqs.iter().zip(tokens).filter(|(s, _)| s.samples);
        let out: Vec<_> = sampled.map(|(s, t)| (s.seq_id, t)).collect();
        sched.update(&out).map_err(paged)?;
    }
    Ok(DecodeRow {
        batch,
        prompt_len,
        decode_steps,
        decode_seconds,
        tokens_per_s: (batch * decode_steps) as f64 / decode_seconds.max(f64::MIN_POSITIVE),
        tpot_ms: 1e3 * decode_seconds / decode_steps.max(1) as f64,
        prefill_seconds,
        num_preemptions: sched.metrics().num_preemptions,
    })
}

/// Paging versus max-length preallocation for one pool and one workload.
#[derive(Clone, Debug, Serialize)]
pub struct WasteComparison {
    /// Token slots in the pool: num_blocks · block_size.
    pub pool_slots: usize,
    /// Slots per block of the paged scheme.
    pub block_size: usize,
    /// Longest sequence: what the max-length scheme reserves for every request.
    pub max_seq_len: usize,
    /// Waste of paging: each request reserves whole blocks as it grows.
    pub paged: Waste,
    /// Waste of reserving max_seq_len slots per request up front.
    pub max_length: Waste,
    /// Sequences a max-length scheme holds at once: floor(pool_slots / max_seq_len).
    pub max_length_batch: usize,
    /// Sequences paging holds at once when every request is at its final length:
    /// floor(pool_slots / mean reserved slots per request).
    pub paged_batch_at_final_length: usize,
    /// The most sequences the scheduler actually ran at once over the workload with this pool
    /// (a simulation of the scheduler alone: no model runs).
    pub paged_batch_scheduled: usize,
}

/// Compares the schemes for `requests` on a pool of `num_blocks` × `block_size` slots.
///
/// # Errors
/// Invalid workloads or a pool too small for one `max_seq_len` sequence.
pub fn waste_comparison(
    num_blocks: usize,
    block_size: usize,
    max_seq_len: usize,
    requests: &[RequestLen],
) -> Result<WasteComparison> {
    let paged = compute_waste(requests, max_seq_len, Reservation::Paged { block_size })?;
    let max_length = compute_waste(requests, max_seq_len, Reservation::MaxLength)?;
    let pool_slots = num_blocks * block_size;
    let mean_reserved = paged.reserved_slots as f64 / requests.len() as f64;
    let mut cfg = SchedulerConfig::new(
        KvCacheConfig::new([None], num_blocks, block_size),
        max_seq_len,
    );
    cfg.max_num_seqs = requests.len().max(1);
    cfg.max_num_batched_tokens = usize::MAX / 4;
    cfg.enable_prefix_caching = false;
    let mut sched = Scheduler::new(cfg)?;
    for (i, r) in requests.iter().enumerate() {
        let prompt = vec![(i % 1000) as u32 + 1; r.prompt_len];
        let out = r.output_len.min(max_seq_len - r.prompt_len).max(1);
        sched.add_request(prompt, StopConditions::max_tokens(out))?;
    }
    let mut most = 0;
    while sched.has_unfinished() {
        let b = sched.schedule()?;
        most = most.max(b.seqs.len());
        let sampled = b.seqs.iter().filter(|s| s.samples);
        let out: Vec<_> = sampled.map(|s| (s.seq_id, 7)).collect();
        sched.update(&out)?;
    }
    Ok(WasteComparison {
        pool_slots,
        block_size,
        max_seq_len,
        paged,
        max_length,
        max_length_batch: pool_slots / max_seq_len,
        paged_batch_at_final_length: (pool_slots as f64 / mean_reserved) as usize,
        paged_batch_scheduled: most,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn paging_sustains_a_larger_batch_on_the_same_pool() {
        let requests = kvlab_paged::uniform_requests(64, 1);
        let c = waste_comparison(8 * 2048 / 16, 16, 2048, &requests).unwrap();
        assert_eq!(c.pool_slots, 8 * 2048);
        assert_eq!(c.max_length_batch, 8);
        assert!(c.paged.final_waste_frac < 0.05, "{:?}", c.paged);
        assert!(c.max_length.final_waste_frac > c.paged.final_waste_frac);
        assert!(c.paged_batch_at_final_length > c.max_length_batch);
        assert!(c.paged_batch_scheduled > c.max_length_batch, "{c:?}");
    }
}

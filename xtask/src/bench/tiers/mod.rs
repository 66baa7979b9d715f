//! `cargo xtask bench --tiers`: the time to first token of a returning request whose prefix
//! was evicted from the pool, computed again versus restored from host memory or from disk
//! (LMCache's claim: restoring beats recomputing, by more the longer the prefix).
//!
//! Per context length L and repetition, three runs of the paged CPU engine, interleaved, each
//! on a fresh engine whose pool holds one sequence of L + 1 tokens:
//!
//! 1. request A (a prompt of L tokens, one token generated) fills the pool and its full blocks
//!    enter the prefix cache;
//! 2. request B (another prompt, as long as the pool allows) needs the whole pool, so all of
//!    A's blocks are evicted — dropped
//!    (`recompute`), spilled to host memory (`host`), or spilled through host memory to files
//!    (`disk`: no host blocks, every spill written with its checksum);
//! 3. request A again: its time to first token is timed (wall clock, from submission to the
//!    sampled token: scheduling, reading files back, the restores, the prefill of what is
//!    left, sampling). The token must equal step 1's.
//!
//! A file just written is usually read back from the page cache, so `disk` measures the tier's
//! format, checksums and copies more than the device; the JSON says so.

mod plot;

use std::sync::Arc;
use std::time::Instant;

use anyhow::{Context, Result, bail};
use kvlab_engines::{EngineKind, PoolOptions, build_paged};
use kvlab_model::sampler::argmax;
use kvlab_model::{KvDtype, Model};
use kvlab_paged::{
    DEFAULT_BLOCK_SIZE, Request, Scheduler, SchedulerConfig, StopConditions, TierConfig, drive,
};
use rand::{Rng, SeedableRng};
use serde::Serialize;

use super::stats::Summary as Stat;

/// How the returning request's prefix comes back.
const MODES: [&str; 3] = ["recompute", "host", "disk"];

pub struct TierOpts {
    /// The side bench's common options.
    pub side: super::Side,
    pub contexts: Vec<usize>,
}

#[derive(Serialize)]
pub struct TierReport {
    pub model: String,
    pub machine: String,
    pub threads: usize,
    pub block_size: usize,
    /// KV bytes of one block over all layers (f32), what a spill or a restore moves.
    pub kv_bytes_per_block: usize,
    pub reps: usize,
    pub note: String,
    pub rows: Vec<TierRow>,
    /// Per mode: the shortest context whose restore is faster than recomputing (None: none).
    pub crossover: Vec<(String, Option<usize>)>,
    /// The restore cost model fitted to these rows (`kvlab ... --restore-cost`): each rate the
    /// slope between the shortest and the longest context. `None` if a slope is not positive.
    pub restore_cost: Option<kvlab_paged::RestoreCost>,
    pub plots: Vec<String>,
    pub wall_seconds: f64,
}

#[derive(Serialize)]
pub struct TierRow {
    /// Prompt tokens of the returning request.
    pub context: usize,
    pub mode: String,
    /// Time to first token of the returning request, ms (min, median, max over repetitions).
    pub ttft_ms: Stat,
    /// The same, divided by the recompute median of this context.
    pub ttft_vs_recompute: f64,
    /// Prompt tokens the prefix cache served (restored) in the returning request.
    pub restored_tokens: u64,
    /// Bytes restored into the pool, and of those read back from files.
    pub bytes_restored: u64,
    pub bytes_read_from_disk: u64,
    /// Wall time of request B (whose evictions spill A's blocks), ms, median.
    pub evicting_request_ms: f64,
}

/// One timed run: (TTFT ms, the returning request's token, its metrics, request B's ms).
fn one_run(
    model: &Arc<Model>,
    prompts: (&[u32], &[u32]),
    ctx: usize,
    tiers: Option<TierConfig>,
) -> Result<(f64, u32, u32, kvlab_paged::Metrics, f64)> {
    let bs = DEFAULT_BLOCK_SIZE;
    let max_model_len = (ctx + 1).next_multiple_of(bs);
    let pool = PoolOptions {
        num_blocks: max_model_len / bs,
        block_size: bs,
        kv_dtype: KvDtype::F32,
    };
    let mut engine = build_paged(EngineKind::CpuPaged, model.clone(), pool)?;
    let config = SchedulerConfig {
        tiers,
        ..SchedulerConfig::new(engine.kv_cache().clone(), max_model_len)
    };
    let mut sched = Scheduler::new(config)?;
    let request = |p: &[u32]| Request {
        prompt: p.to_vec(),
        stop: StopConditions::max_tokens(1),
        arrival_step: 0,
        tenant: 0,
        resumes: false,
    };
    let e = engine.as_mut();
    let a = drive(e, &mut sched, &[request(prompts.0)], argmax, |_, _, _| {})?;
    let t = Instant::now();
    drive(e, &mut sched, &[request(prompts.1)], argmax, |_, _, _| {})?;
    let evicting_ms = t.elapsed().as_secs_f64() * 1e3;
    let before = sched.metrics();
    let t = Instant::now();
    let again = drive(e, &mut sched, &[request(prompts.0)], argmax, |_, _, _| {})?;
    let ttft = t.elapsed().as_secs_f64() * 1e3;
    let mut m = again.metrics.clone();
    m.prefix_cache_hits -= before.prefix_cache_hits;
    m.tier_store.bytes_restored -= before.tier_store.bytes_restored;
    m.tier_store.bytes_read_from_disk -= before.tier_store.bytes_read_from_disk;
    let first = |r: &kvlab_paged::DriveReport| r.outputs[0].0.first().copied().unwrap_or(u32::MAX);
    Ok((ttft, first(&a), first(&again), m, evicting_ms))
}

pub fn run(o: &TierOpts) -> Result<TierReport> {
    let started = Instant::now();
    let (name, loaded) = super::side_model(&o.side.model, o.side.quick)?;
    let model = Arc::new(loaded.model);
    let max = model.config.max_seq_len - 1;
    let contexts: Vec<usize> = if !o.contexts.is_empty() {
        o.contexts.clone()
    } else if o.side.quick {
        vec![32, 64, 128, 256, 511]
    } else {
        vec![32, 64, 128, 256, 512, 1024, 2048, 4096, 8192]
    };
    let bs = DEFAULT_BLOCK_SIZE;
    if let Some(&c) = contexts.iter().find(|&&c| c <= bs) {
        bail!(
            "context {c}: a returning prompt of at most {bs} tokens (one block) has no full block to restore before its last token; choose --context values above {bs}"
        );
    }
    if let Some(&c) = contexts.iter().find(|&&c| c > max) {
        bail!("context {c} is beyond {name}'s {max} positions; choose shorter --context values");
    }
    let vocab = model.config.vocab_size as u32;
    let mut rng = rand_chacha::ChaCha8Rng::seed_from_u64(o.side.seed);
    let disk_dir = o.side.out.join("tier-files");
    std::fs::create_dir_all(&disk_dir)
        .with_context(|| format!("creating {}", disk_dir.display()))?;
    let kv_bytes_per_block = KvDtype::F32.bytes_per_block(&model.config, bs);
    let progress = indicatif::ProgressBar::new((contexts.len() * o.side.reps * MODES.len()) as u64);
    let mut rows = Vec::new();
    for &ctx in &contexts {
        let mut prompt = |len: usize| -> Vec<u32> {
            std::iter::once(model.config.bos_id)
                .chain((1..len).map(|_| rng.random_range(0..vocab)))
                .collect()
        };
        // B fills every block of the pool (max_model_len = (L + 1) rounded up to blocks).
        let (a, b) = (prompt(ctx), prompt((ctx + 1).next_multiple_of(bs) - 1));
        let blocks = ctx.div_ceil(bs) + 1;
        let tiers = |mode: &str| match mode {
            "host" => Some(TierConfig::host(blocks)),
            "disk" => Some(TierConfig::host(0).with_disk(&disk_dir, blocks)),
            _ => None,
        };
        let mut ttft: Vec<Vec<f64>> = vec![Vec::new(); MODES.len()];
        let mut evicting: Vec<Vec<f64>> = vec![Vec::new(); MODES.len()];
        let mut last: Vec<Option<kvlab_paged::Metrics>> = vec![None; MODES.len()];
        for _ in 0..o.side.reps {
            for (i, mode) in MODES.iter().enumerate() {
                progress.set_message(format!("{name}, context {ctx}, {mode}"));
                let (t, first, again, m, ev) = one_run(&model, (&a, &b), ctx, tiers(mode))?;
                if first != again {
                    bail!(
                        "context {ctx}, {mode}: the returning request sampled {again}, the first run {first}; a restored prefix must give the same token"
                    );
                }
                if *mode != "recompute" && m.num_restores == 0 {
                    bail!("context {ctx}, {mode}: nothing was restored; the run measured nothing");
                }
                ttft[i].push(t);
                evicting[i].push(ev);
                last[i] = Some(m);
                progress.inc(1);
            }
        }
        let recompute = Stat::of(&ttft[0]).median;
        for (i, mode) in MODES.iter().enumerate() {
            let s = Stat::of(&ttft[i]);
            let m = last[i].clone().unwrap_or_else(|| unreachable!("reps >= 1"));
            rows.push(TierRow {
                context: ctx,
                mode: mode.to_string(),
                ttft_vs_recompute: s.median / recompute,
                ttft_ms: s,
                restored_tokens: m.prefix_cache_hits,
                bytes_restored: m.tier_store.bytes_restored,
                bytes_read_from_disk: m.tier_store.bytes_read_from_disk,
                evicting_request_ms: Stat::of(&evicting[i]).median,
            });
        }
    }
    progress.finish_and_clear();
    let _ = std::fs::remove_dir_all(&disk_dir);
    let crossover = MODES[1..]
        .iter()
        .map(|mode| {
            let c = rows
                .iter()
                .filter(|r| r.mode == *mode && r.ttft_vs_recompute < 1.0)
                .map(|r| r.context)
                .min();
            (mode.to_string(), c)
        })
        .collect();
    let restore_cost = fit_cost(&rows);
    let mut report = TierReport {
        model: name,
        machine: o.side.machine.clone(),
        threads: kvlab_cpu::threads::num_threads(),
        block_size: bs,
        kv_bytes_per_block,
        reps: o.side.reps,
        note: "disk: files written then read back by the same process, so mostly from the page \
               cache; the tier's format, checksum and copies are measured more than the device"
            .into(),
        rows,
        crossover,
        restore_cost,
        plots: Vec::new(),
        wall_seconds: 0.0,
    };
    report.plots = super::plot::draw_if(o.side.plots, || plot::figure(&o.side.out, &report))?;
    report.wall_seconds = started.elapsed().as_secs_f64();
    Ok(report)
}

/// The cost model's three rates from the rows: prefill nanoseconds per token (recompute TTFT
/// against context), and bytes per second restored from memory and from files (restore TTFT
/// against bytes restored), each the slope between the shortest and the longest context.
fn fit_cost(rows: &[TierRow]) -> Option<kvlab_paged::RestoreCost> {
    let slope = |mode: &str, x: &dyn Fn(&TierRow) -> f64| -> Option<f64> {
        let of: Vec<&TierRow> = rows.iter().filter(|r| r.mode == mode).collect();
        let (a, b) = (of.first()?, of.last()?);
        let (dx, dy) = (x(b) - x(a), (b.ttft_ms.median - a.ttft_ms.median) * 1e-3);
        (dx > 0.0 && dy > 0.0).then_some(dy / dx)
    };
    let prefill = slope("recompute", &|r| r.context as f64)?;
    let host = slope("host", &|r| r.bytes_restored as f64)?;
    let disk = slope("disk", &|r| r.bytes_restored as f64)?;
    Some(kvlab_paged::RestoreCost {
        prefill_ns_per_token: (prefill * 1e9).round() as u64,
        host_bytes_per_s: (1.0 / host).round() as u64,
        disk_bytes_per_s: (1.0 / disk).round() as u64,
    })
}

pub fn print(r: &TierReport) {
    println!(
        "{}: TTFT of a returning request whose prefix was evicted, {} threads, blocks of {} tokens ({} of f32 KV each), median of {}",
        r.model, r.threads, r.block_size, r.kv_bytes_per_block, r.reps
    );
    println!(
        "{:>8} {:<10} {:>12} {:>13} {:>16} {:>15} {:>14}",
        "context",
        "mode",
        "TTFT, ms",
        "vs recompute",
        "restored tokens",
        "restored, MiB",
        "evicting, ms"
    );
    for row in &r.rows {
        println!(
            "{:>8} {:<10} {:>12.1} {:>12.2}x {:>16} {:>15.2} {:>14.1}",
            row.context,
            row.mode,
            row.ttft_ms.median,
            row.ttft_vs_recompute,
            row.restored_tokens,
            row.bytes_restored as f64 / (1 << 20) as f64,
            row.evicting_request_ms
        );
    }
    for (mode, c) in &r.crossover {
        match c {
            Some(c) => println!("{mode}: restoring beats recomputing from context {c} on"),
            None => println!("{mode}: restoring never beat recomputing here"),
        }
    }
    if let Some(c) = &r.restore_cost {
        println!(
            "cost model fitted here: prefill {:.2} ms/token, restores {:.0} MB/s from memory and {:.0} MB/s from files: --restore-cost {},{},{}",
            c.prefill_ns_per_token as f64 * 1e-6,
            c.host_bytes_per_s as f64 * 1e-6,
            c.disk_bytes_per_s as f64 * 1e-6,
            c.prefill_ns_per_token,
            c.host_bytes_per_s,
            c.disk_bytes_per_s
        );
    }
}

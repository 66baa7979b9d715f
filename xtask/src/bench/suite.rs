//! Runs every workload of one model on every engine, alternating engines within each
//! repetition so that the machine's drifting load falls on all of them alike.

use anyhow::{Context, Result};
use indicatif::ProgressBar;
use kvlab_engines::{EngineKind, PagedEngine, PoolOptions, build, build_paged};
use kvlab_model::Engine;
use serde::Serialize;

use super::batch::{self, BatchRow, ContinuousRow};
use super::decode::{self, DecodeRun};
use super::memory::{self, KvRow, RssRow};
use super::models::BenchModel;
use super::plan::{ModelPlan, SEED, prefill_lens};
use super::prefill::{self, LatencyRow, PrefillRow};

/// Everything measured, accumulated over models: bench.json's sections of that name.
#[derive(Default, Serialize)]
pub struct Results {
    pub decode: Vec<DecodeRun>,
    pub prefill: Vec<PrefillRow>,
    pub latency: Vec<LatencyRow>,
    pub batch: Vec<BatchRow>,
    pub continuous: Vec<ContinuousRow>,
    pub kv_memory: Vec<KvRow>,
    pub peak_rss: Vec<RssRow>,
    /// What went wrong or was skipped; the report's notes.
    #[serde(skip)]
    pub notes: Vec<String>,
}

/// Seeded token ids: BOS, then `len − 1` ids uniform in 0..vocab (splitmix64).
pub fn prompt(len: usize, vocab: usize, bos: u32, stream: u64) -> Vec<u32> {
    let mut s = SEED ^ stream.wrapping_mul(0x9E37_79B9_7F4A_7C15);
    let mut next = || {
        s = s.wrapping_add(0x9E37_79B9_7F4A_7C15);
        let mut z = s;
        z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
        z ^ (z >> 31)
    };
    std::iter::once(bos)
        .chain((1..len).map(|_| (next() % vocab as u64) as u32))
        .collect()
}

/// The phases of one model, for the progress bar.
pub const PHASES: u64 = 7;

/// Every engine of one model, built once and warmed up.
type Engines = Vec<(EngineKind, Box<dyn Engine>)>;

/// One workload over every engine of a model.
type Stage = fn(&Ctx, &mut Engines, &mut Results) -> Result<()>;

/// Runs every workload of one model, one function per workload (the progress bar's phases).
pub fn run_model(
    m: &BenchModel,
    plan: &ModelPlan,
    engines: &[EngineKind],
    warmup: usize,
    bar: &ProgressBar,
    out: &mut Results,
) -> Result<()> {
    let c = Ctx {
        m,
        plan,
        name: m.info.name.as_str(),
        ctx: m.info.context,
        bar,
    };
    let mut built = c.warm_up(engines, warmup, out);
    let stages: [Stage; PHASES as usize] = [
        decode_latency,
        prefill_throughput,
        request_latency,
        batch_throughput,
        continuous_trace,
        kv_memory,
        peak_rss,
    ];
    for stage in stages {
        stage(&c, &mut built, out)?;
        bar.inc(1);
    }
    Ok(())
}

/// `naive` for the naive engine (whose generation costs O(N²)), `other` for the rest.
fn naive_or<T>(e: EngineKind, naive: T, other: T) -> T {
    if e == EngineKind::Naive { naive } else { other }
}

/// What every workload of one model needs.
struct Ctx<'a> {
    m: &'a BenchModel,
    plan: &'a ModelPlan,
    name: &'a str,
    /// The context the model runs at.
    ctx: usize,
    bar: &'a ProgressBar,
}

impl Ctx<'_> {
    fn note(&self, out: &mut Results, s: String) {
        self.bar.println(format!("note: {s}"));
        out.notes.push(s);
    }

    fn prompt(&self, len: usize, stream: u64) -> Vec<u32> {
        let c = &self.m.model.config;
        prompt(len, c.vocab_size, c.bos_id, stream)
    }

    /// Positions of the per-position decode generation (the naive engine's O(N²) run is shorter).
    fn decode_positions(&self, e: EngineKind) -> usize {
        let p = self.plan;
        naive_or(e, p.naive_decode_positions, p.decode_positions).min(self.ctx)
    }

    /// Builds every engine once and warms it up (page faults, rayon's pool, RoPE tables).
    fn warm_up(&self, engines: &[EngineKind], warmup: usize, out: &mut Results) -> Engines {
        let mut built = Engines::new();
        for &e in engines {
            let cap = naive_or(e, self.plan.naive_decode_positions, self.ctx);
            if e == EngineKind::Naive && cap == 0 {
                continue;
            }
            self.bar.set_message(format!("{}: warm-up {e}", self.name));
            let warmed = build(e, self.m.model.clone()).and_then(|mut eng| {
                decode::generate(
                    eng.as_mut(),
                    warmup.min(cap).max(2),
                    self.m.model.config.bos_id,
                )?;
                Ok(eng)
            });
            match warmed {
                Ok(eng) => built.push((e, eng)),
                Err(err) => self.note(out, format!("{}: engine {e} skipped: {err:#}", self.name)),
            }
        }
        built
    }

    /// Repetition r of every engine back to back, for r in 0..reps, so that the machine's load
    /// falls on all of them alike. `step(i, engine, rep)` is `None` where engine i sits the
    /// repetition out; a failure becomes a note. Returns the samples of each engine that has
    /// any.
    fn interleaved<T>(
        &self,
        engines: &mut Engines,
        out: &mut Results,
        reps: usize,
        mut step: impl FnMut(usize, EngineKind, &mut dyn Engine, usize) -> Option<Result<T>>,
    ) -> Vec<(EngineKind, Vec<T>)> {
        let mut samples: Vec<(EngineKind, Vec<T>)> =
            engines.iter().map(|(e, _)| (*e, Vec::new())).collect();
        for r in 0..reps {
            for (i, (e, eng)) in engines.iter_mut().enumerate() {
                match step(i, *e, eng.as_mut(), r) {
                    Some(Ok(x)) => samples[i].1.push(x),
                    Some(Err(err)) => self.note(out, format!("{err:#}")),
                    None => {}
                }
            }
        }
        samples.retain(|(_, s)| !s.is_empty());
        samples
    }
}

/// 1. Decode latency per position; repetition r of every engine back to back.
fn decode_latency(c: &Ctx, engines: &mut Engines, out: &mut Results) -> Result<()> {
    let reps = |e| naive_or(e, c.plan.naive_decode_reps, c.plan.decode_reps);
    let max_reps = engines.iter().map(|(e, _)| reps(*e)).max().unwrap_or(0);
    let gens = c.interleaved(engines, out, max_reps, |_, e, eng, r| {
        (r < reps(e)).then(|| {
            let msg = format!(
                "{}: decode per position, {e}, rep {}/{}",
                c.name,
                r + 1,
                reps(e)
            );
            c.bar.set_message(msg);
            decode::generate(eng, c.decode_positions(e), c.m.model.config.bos_id)
                .with_context(|| format!("{}: {e} decode failed", c.name))
        })
    });
    for (e, g) in gens {
        out.decode.push(decode::summarize(c.name, e.name(), &g));
    }
    Ok(())
}

/// 2. Prefill throughput by prompt length.
fn prefill_throughput(c: &Ctx, engines: &mut Engines, out: &mut Results) -> Result<()> {
    for len in prefill_lens(c.plan.prefill_max.min(c.ctx)) {
        let p = c.prompt(len, len as u64);
        let secs = c.interleaved(engines, out, c.plan.prefill_reps, |_, e, eng, _| {
            if e == EngineKind::Naive && len > c.plan.naive_prefill_max {
                return None;
            }
            c.bar
                .set_message(format!("{}: prefill {len} tokens, {e}", c.name));
            Some(
                prefill::time_prefill(eng, &p)
                    .with_context(|| format!("{}: {e} prefill {len} failed", c.name)),
            )
        });
        for (e, s) in secs {
            out.prefill
                .push(prefill::prefill_row(c.name, e.name(), len, &s));
        }
    }
    Ok(())
}

/// 3. Request latency: TTFT and TPOT percentiles.
fn request_latency(c: &Ctx, engines: &mut Engines, out: &mut Results) -> Result<()> {
    let plan = c.plan;
    let (lp, lg) = (
        plan.latency_prompt.min(c.ctx / 2),
        plan.latency_generate.min(c.ctx / 2),
    );
    let p = c.prompt(lp, 1_000_001);
    let samples = c.interleaved(engines, out, plan.latency_reps, |_, e, eng, r| {
        if e == EngineKind::Naive && lp + lg > plan.naive_decode_positions {
            return None;
        }
        let msg = format!(
            "{}: TTFT/TPOT, {e}, rep {}/{}",
            c.name,
            r + 1,
            plan.latency_reps
        );
        c.bar.set_message(msg);
        Some(
            prefill::time_request(eng, &p, lg)
                .with_context(|| format!("{}: {e} request failed", c.name)),
        )
    });
    for (e, s) in samples {
        out.latency
            .push(prefill::latency_row(c.name, e.name(), lp, lg, &s));
    }
    Ok(())
}

/// 4. Batched decode throughput: paged engines in scheduled steps, the others round-robin.
fn batch_throughput(c: &Ctx, engines: &mut Engines, out: &mut Results) -> Result<()> {
    let (bp, bg) = (c.plan.batch_prompt, c.plan.batch_generate);
    for &b in &c.plan.batch_sizes {
        let prompts: Vec<Vec<u32>> = (0..b).map(|i| c.prompt(bp, 2_000_000 + i as u64)).collect();
        let pool = PoolOptions::for_sequences(b, bp + bg + 1, kvlab_paged::DEFAULT_BLOCK_SIZE);
        let mut paged: Vec<Option<Box<dyn PagedEngine>>> = engines
            .iter()
            .map(|(e, _)| {
                e.is_paged()
                    .then(|| build_paged(*e, c.m.model.clone(), pool).ok())
                    .flatten()
            })
            .collect();
        let runs = c.interleaved(engines, out, c.plan.batch_reps, |i, e, eng, _| {
            if e == EngineKind::Naive && b > c.plan.naive_batch_max {
                return None;
            }
            c.bar.set_message(format!("{}: batch {b}, {e}", c.name));
            let r = match paged[i].as_mut() {
                Some(p) => batch::paged(p.as_mut(), &c.m.model, pool, &prompts, bg),
                None if e.is_paged() => return None,
                None => batch::contiguous(eng, &prompts, bg),
            };
            Some(r.with_context(|| format!("{}: {e} batch {b} failed", c.name)))
        });
        // A paged engine whose batched engine could not be built has no runs.
        for (e, runs) in runs {
            let row = batch::batch_row(c.name, e.name(), b, e.is_paged(), bp, bg, &runs);
            out.batch.push(row);
        }
    }
    Ok(())
}

/// 5. Continuous batching over an arrival trace (paged engines), and the cpu engine serving the
///    same trace one request at a time.
fn continuous_trace(c: &Ctx, engines: &mut Engines, out: &mut Results) -> Result<()> {
    let (n, ctx) = (c.plan.continuous_requests, c.ctx);
    if n == 0 {
        return Ok(());
    }
    let lt = kvlab_paged::workload::LongTail {
        prompt_median: (ctx / 16).max(4) as f64,
        prompt_sigma: 0.8,
        output_median: (ctx / 8).max(4) as f64,
        output_sigma: 0.8,
        max_seq_len: ctx,
    };
    let lens = kvlab_paged::workload::long_tail_requests(n, SEED, lt)?;
    let prompts: Vec<Vec<u32>> = lens
        .iter()
        .enumerate()
        .map(|(i, l)| c.prompt(l.prompt_len, 3_000_000 + i as u64))
        .collect();
    let outputs: Vec<usize> = lens
        .iter()
        .map(|l| l.output_len.min(ctx - l.prompt_len))
        .collect();
    // Arrivals every half step on average: requests pile up, and the batch grows.
    let requests = batch::trace(prompts, &outputs, 0.5);
    // A pool for a quarter of the trace at full length: enough to batch, small enough to make
    // the scheduler wait or preempt at the peak.
    let pool = PoolOptions::for_sequences((n / 4).max(2), ctx, kvlab_paged::DEFAULT_BLOCK_SIZE);
    let name = c.name;
    for (e, eng) in engines.iter_mut() {
        c.bar
            .set_message(format!("{name}: continuous batching trace, {e}"));
        let r = if e.is_paged() {
            build_paged(*e, c.m.model.clone(), pool).and_then(|mut p| {
                let model = &c.m.model;
                batch::continuous_paged(name, e.name(), p.as_mut(), model, pool, ctx, &requests)
            })
        } else if *e == EngineKind::Cpu {
            batch::continuous_sequential(name, eng.as_mut(), &requests)
        } else {
            continue;
        };
        match r {
            Ok(row) => out.continuous.push(row),
            Err(err) => c.note(out, format!("{name}: {e} continuous trace failed: {err:#}")),
        }
    }
    Ok(())
}

/// 6. KV bytes held against the formula, at growing lengths in a sequence of `ctx`: 1, 17, 33,
///    65, … (one past a 16-token block boundary, where a paged sequence holds the most unused
///    slots) and the whole context.
fn kv_memory(c: &Ctx, engines: &mut Engines, out: &mut Results) -> Result<()> {
    let ctx = c.ctx;
    let mut lens: Vec<usize> = std::iter::once(1)
        .chain((4..).map(|k| (1usize << k) + 1).take_while(|&l| l < ctx))
        .collect();
    lens.push(ctx);
    for len in lens {
        let p = c.prompt(len, 4_000_000 + len as u64);
        for (e, eng) in engines.iter_mut() {
            if *e == EngineKind::Naive && len > c.plan.naive_prefill_max {
                continue;
            }
            c.bar
                .set_message(format!("{}: KV memory at {len} positions, {e}", c.name));
            match memory::kv_row(c.name, eng.as_mut(), &p, ctx) {
                Ok(r) => out.kv_memory.push(r),
                Err(err) => c.note(
                    out,
                    format!("{}: {e} KV usage at {len} failed: {err:#}", c.name),
                ),
            }
        }
    }
    Ok(())
}

/// 7. Peak RSS per engine, each in its own child process.
fn peak_rss(c: &Ctx, engines: &mut Engines, out: &mut Results) -> Result<()> {
    if !c.plan.rss_per_engine {
        return Ok(());
    }
    for &(e, _) in engines.iter() {
        c.bar.set_message(format!("{}: peak RSS, {e}", c.name));
        // The naive engine's generation costs O(N²): its peak is taken over a shorter one.
        let n = naive_or(e, c.decode_positions(e).min(256), c.decode_positions(e));
        match memory::rss_in_child(c.name, e, c.ctx, n) {
            Ok(r) => out.peak_rss.push(r),
            Err(err) => c.note(out, format!("{}: {e} peak RSS failed: {err:#}", c.name)),
        }
    }
    Ok(())
}

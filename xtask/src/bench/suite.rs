//! Runs every workload of one model on every engine, alternating engines within each
//! repetition so that the machine's drifting load falls on all of them alike.

use anyhow::Result;
use indicatif::ProgressBar;
use kvlab_cli::engines::{self, PoolOptions};
use kvlab_model::Engine;

use super::batch::{self, BatchRow, ContinuousRow, Timed};
use super::decode::{self, DecodeRun, Generation};
use super::memory::{self, KvRow, RssRow};
use super::models::BenchModel;
use super::plan::{ModelPlan, SEED, prefill_lens};
use super::prefill::{self, LatencyRow, PrefillRow};

/// Everything measured, accumulated over models.
#[derive(Default)]
pub struct Results {
    pub decode: Vec<DecodeRun>,
    pub prefill: Vec<PrefillRow>,
    pub latency: Vec<LatencyRow>,
    pub batch: Vec<BatchRow>,
    pub continuous: Vec<ContinuousRow>,
    pub kv: Vec<KvRow>,
    pub rss: Vec<RssRow>,
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

pub fn run_model(
    m: &BenchModel,
    plan: &ModelPlan,
    engine_names: &[&str],
    warmup: usize,
    bar: &ProgressBar,
    out: &mut Results,
) -> Result<()> {
    let name = m.info.name.as_str();
    let (vocab, bos) = (m.model.config.vocab_size, m.model.config.bos_id);
    let ctx = m.info.context;
    let naive_ok = |e: &str, cap: usize| e != "naive" || cap > 0;
    let note = |out: &mut Results, s: String| {
        bar.println(format!("note: {s}"));
        out.notes.push(s);
    };

    // Build every engine once and warm it up (page faults, rayon's pool, RoPE tables).
    let mut engines: Vec<(String, Box<dyn Engine>)> = Vec::new();
    for &e in engine_names {
        let cap = if e == "naive" {
            plan.naive_decode_positions
        } else {
            ctx
        };
        if !naive_ok(e, cap) {
            continue;
        }
        bar.set_message(format!("{name}: warm-up {e}"));
        let built = engines::build(e, m.model.clone()).and_then(|mut eng| {
            decode::generate(eng.as_mut(), warmup.min(cap).max(2), bos)?;
            Ok(eng)
        });
        match built {
            Ok(eng) => engines.push((e.to_string(), eng)),
            Err(err) => note(out, format!("{name}: engine {e} skipped: {err:#}")),
        }
    }

    // 1. Decode latency per position; repetition r of every engine back to back.
    let positions = |e: &str| {
        if e == "naive" {
            plan.naive_decode_positions.min(ctx)
        } else {
            plan.decode_positions.min(ctx)
        }
    };
    let reps = |e: &str| {
        if e == "naive" {
            plan.naive_decode_reps
        } else {
            plan.decode_reps
        }
    };
    let mut gens: Vec<Vec<Generation>> = engines.iter().map(|_| Vec::new()).collect();
    let max_reps = engines.iter().map(|(e, _)| reps(e)).max().unwrap_or(0);
    for r in 0..max_reps {
        for (i, (e, eng)) in engines.iter_mut().enumerate() {
            if r >= reps(e) {
                continue;
            }
            bar.set_message(format!(
                "{name}: decode per position, {e}, rep {}/{}",
                r + 1,
                reps(e)
            ));
            match decode::generate(eng.as_mut(), positions(e), bos) {
                Ok(g) => gens[i].push(g),
                Err(err) => note(out, format!("{name}: {e} decode failed: {err:#}")),
            }
        }
    }
    for ((e, _), g) in engines.iter().zip(&gens) {
        if !g.is_empty() {
            out.decode.push(decode::summarize(name, e, g));
        }
    }
    bar.inc(1);

    // 2. Prefill throughput by prompt length.
    for len in prefill_lens(plan.prefill_max.min(ctx)) {
        let p = prompt(len, vocab, bos, len as u64);
        let mut secs: Vec<Vec<f64>> = engines.iter().map(|_| Vec::new()).collect();
        for _ in 0..plan.prefill_reps {
            for (i, (e, eng)) in engines.iter_mut().enumerate() {
                if e == "naive" && len > plan.naive_prefill_max {
                    continue;
                }
                bar.set_message(format!("{name}: prefill {len} tokens, {e}"));
                match prefill::time_prefill(eng.as_mut(), &p) {
                    Ok(s) => secs[i].push(s),
                    Err(err) => note(out, format!("{name}: {e} prefill {len} failed: {err:#}")),
                }
            }
        }
        for ((e, _), s) in engines.iter().zip(&secs) {
            if !s.is_empty() {
                out.prefill.push(prefill::prefill_row(name, e, len, s));
            }
        }
    }
    bar.inc(1);

    // 3. Request latency: TTFT and TPOT percentiles.
    let (lp, lg) = (
        plan.latency_prompt.min(ctx / 2),
        plan.latency_generate.min(ctx / 2),
    );
    let p = prompt(lp, vocab, bos, 1_000_001);
    let mut samples: Vec<Vec<(f64, f64)>> = engines.iter().map(|_| Vec::new()).collect();
    for r in 0..plan.latency_reps {
        for (i, (e, eng)) in engines.iter_mut().enumerate() {
            if e == "naive" && lp + lg > plan.naive_decode_positions {
                continue;
            }
            bar.set_message(format!(
                "{name}: TTFT/TPOT, {e}, rep {}/{}",
                r + 1,
                plan.latency_reps
            ));
            match prefill::time_request(eng.as_mut(), &p, lg) {
                Ok(s) => samples[i].push(s),
                Err(err) => note(out, format!("{name}: {e} request failed: {err:#}")),
            }
        }
    }
    for ((e, _), s) in engines.iter().zip(&samples) {
        if !s.is_empty() {
            out.latency.push(prefill::latency_row(name, e, lp, lg, s));
        }
    }
    bar.inc(1);

    // 4. Batched decode throughput.
    let (bp, bg) = (plan.batch_prompt, plan.batch_generate);
    for &b in &plan.batch_sizes {
        let prompts: Vec<Vec<u32>> = (0..b)
            .map(|i| prompt(bp, vocab, bos, 2_000_000 + i as u64))
            .collect();
        let pool = PoolOptions::for_sequences(b, bp + bg + 1, kvlab_paged::DEFAULT_BLOCK_SIZE);
        let mut paged: Vec<Option<Box<dyn engines::PagedEngine>>> = engines
            .iter()
            .map(|(e, _)| {
                engines::PAGED_ENGINES
                    .contains(&e.as_str())
                    .then(|| engines::build_paged(e, m.model.clone(), pool).ok())
                    .flatten()
            })
            .collect();
        let mut runs: Vec<Vec<Timed>> = engines.iter().map(|_| Vec::new()).collect();
        for _ in 0..plan.batch_reps {
            for (i, (e, eng)) in engines.iter_mut().enumerate() {
                if e == "naive" && b > plan.naive_batch_max {
                    continue;
                }
                bar.set_message(format!("{name}: batch {b}, {e}"));
                let r = match paged[i].as_mut() {
                    Some(p) => batch::paged(p.as_mut(), &m.model, pool, &prompts, bg),
                    None if engines::PAGED_ENGINES.contains(&e.as_str()) => continue,
                    None => batch::contiguous(eng.as_mut(), &prompts, bg),
                };
                match r {
                    Ok(t) => runs[i].push(t),
                    Err(err) => note(out, format!("{name}: {e} batch {b} failed: {err:#}")),
                }
            }
        }
        for (i, (e, _)) in engines.iter().enumerate() {
            if !runs[i].is_empty() {
                out.batch.push(batch::batch_row(
                    name,
                    e,
                    b,
                    paged[i].is_some(),
                    bp,
                    bg,
                    &runs[i],
                ));
            }
        }
    }
    bar.inc(1);

    // 5. Continuous batching over an arrival trace (paged engines), and the cpu engine serving
    //    the same trace one request at a time.
    if plan.continuous_requests > 0 {
        let n = plan.continuous_requests;
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
            .map(|(i, l)| prompt(l.prompt_len, vocab, bos, 3_000_000 + i as u64))
            .collect();
        let outputs: Vec<usize> = lens
            .iter()
            .map(|l| l.output_len.min(ctx - l.prompt_len))
            .collect();
        // Arrivals every half step on average: requests pile up, and the batch grows.
        let requests = batch::trace(prompts, &outputs, 0.5);
        // A pool for a quarter of the trace at full length: enough to batch, small enough to
        // make the scheduler wait or preempt at the peak.
        let pool = PoolOptions::for_sequences((n / 4).max(2), ctx, kvlab_paged::DEFAULT_BLOCK_SIZE);
        for (e, eng) in engines.iter_mut() {
            bar.set_message(format!("{name}: continuous batching trace, {e}"));
            let r = if engines::PAGED_ENGINES.contains(&e.as_str()) {
                engines::build_paged(e, m.model.clone(), pool).and_then(|mut p| {
                    batch::continuous_paged(name, e, p.as_mut(), &m.model, pool, ctx, &requests)
                })
            } else if e == "cpu" {
                batch::continuous_sequential(name, eng.as_mut(), &requests)
            } else {
                continue;
            };
            match r {
                Ok(row) => out.continuous.push(row),
                Err(err) => note(out, format!("{name}: {e} continuous trace failed: {err:#}")),
            }
        }
    }
    bar.inc(1);

    // 6. KV bytes held against the formula, at growing lengths in a sequence of `ctx`.
    // Lengths 1, 17, 33, 65, … (one past a 16-token block boundary, where a paged sequence
    // holds the most unused slots) and the whole context.
    let mut lens: Vec<usize> = std::iter::once(1)
        .chain((4..).map(|k| (1usize << k) + 1).take_while(|&l| l < ctx))
        .collect();
    lens.push(ctx);
    for len in lens {
        let p = prompt(len, vocab, bos, 4_000_000 + len as u64);
        for (e, eng) in engines.iter_mut() {
            if e == "naive" && len > plan.naive_prefill_max {
                continue;
            }
            bar.set_message(format!("{name}: KV memory at {len} positions, {e}"));
            match memory::kv_row(name, eng.as_mut(), &p, ctx) {
                Ok(r) => out.kv.push(r),
                Err(err) => note(
                    out,
                    format!("{name}: {e} KV usage at {len} failed: {err:#}"),
                ),
            }
        }
    }
    bar.inc(1);

    // 7. Peak RSS per engine, each in its own child process.
    if plan.rss_per_engine {
        for (e, _) in &engines {
            bar.set_message(format!("{name}: peak RSS, {e}"));
            // The naive engine's generation costs O(N²): its peak is taken over a shorter one.
            let n = if e == "naive" {
                positions(e).min(256)
            } else {
                positions(e)
            };
            match memory::rss_in_child(name, e, ctx, n) {
                Ok(r) => out.rss.push(r),
                Err(err) => note(out, format!("{name}: {e} peak RSS failed: {err:#}")),
            }
        }
    }
    bar.inc(1);
    Ok(())
}

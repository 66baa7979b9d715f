//! Batched verify: every fixture prompt of a model (plus prompts sharing a long prefix and
//! duplicates, arriving at different steps) through the continuous-batching scheduler and a
//! paged engine, with a block pool small enough to force preemption. Every sequence's greedy
//! tokens must equal its solo naive run: batch invariance, whatever else is in the batch, whatever
//! is shared through the prefix cache, and whether or not the sequence was preempted.
//!
//! The same requests then run with chunked prefill under budgets of 1 token a step, of less than
//! a block and of a few blocks: every prompt is computed in chunks, each over the chunks already
//! cached, and at budget 1 decodes wait their turn; the tokens must not change.
//!
//! Then with speculative decoding, every decode checking draft tokens from prompt lookup or a
//! draft model (the model's first half of layers, on the cpu engine) at k = 1, 4 and 8: drafts
//! kept, rejected and rolled back in the paged pool, mixed with preemption and prefix hits,
//! and still every token the solo naive run's.
//!
//! A last run sends every request twice, the second wave after the first, through the same
//! small pool with tiers below it (a few blocks of host memory, then files): the first wave's
//! evicted prefixes are spilled, the second wave restores them, and every token must still be
//! the solo naive run's.

use std::sync::Arc;
use std::time::Instant;

use anyhow::{Context, Result};
use kvlab_engines::{EngineKind, GreedyDrafting, PoolOptions, build_paged};
use kvlab_model::registry::ModelEntry;
use kvlab_model::sampler::argmax;
use kvlab_model::{DraftModel, Drafter, Model, NgramProposer, Proposer, Speculative, Tokenizer};
use kvlab_paged::{
    DriveReport, Request, Scheduler, SchedulerConfig, StopConditions, TierConfig, drive, drive_with,
};

use super::{BatchInfo, Divergence, Reference, Row, reference_run};

/// Tokens each request generates in the batched run (fewer if the context ends first).
const MAX_NEW: usize = 48;

/// `max_num_batched_tokens` of the chunked-prefill runs: one token a step, less than a block
/// (16 tokens), and a few blocks and then some.
const CHUNK_BUDGETS: [usize; 3] = [1, 7, 53];

/// The speculative runs: (draft model rather than prompt lookup, num_speculative_tokens).
const SPEC_RUNS: [(bool, usize); 3] = [(false, 1), (true, 4), (false, 8)];

pub(super) fn run(
    entry: &ModelEntry,
    (model, draft): (&Arc<Model>, &Arc<Model>),
    tok: &Tokenizer,
    refs: &[Option<Reference>],
    engine: EngineKind,
) -> Result<Vec<Row>> {
    let t = Instant::now();
    let ctx = entry
        .verify_max_seq_len
        .unwrap_or(model.config.max_seq_len)
        .min(model.config.max_seq_len);
    // (prompt, expected tokens) of every request. The scheduler counts the last generated token
    // against the context too (a sequence stops at max_model_len tokens in all), so a request
    // gets at most ctx − prompt tokens.
    let mut cases: Vec<(Vec<u32>, Vec<u32>)> = refs
        .iter()
        .flatten()
        .map(|r| {
            (
                r.prompt.clone(),
                r.tokens[..r.tokens.len().min(MAX_NEW).min(ctx - r.prompt.len())].to_vec(),
            )
        })
        .filter(|(_, expected)| !expected.is_empty())
        .collect();
    anyhow::ensure!(!cases.is_empty(), "no solo reference to compare with");
    // Duplicates of the first two prompts.
    cases.extend(cases[..2.min(cases.len())].to_vec());
    // Prompts sharing a long common prefix: the longest fixture prompt that leaves room to
    // generate, cut to half the context, then different endings (references checked by the naive
    // engine like every verify case).
    let longest = refs
        .iter()
        .flatten()
        .filter(|r| r.prompt.len() + MAX_NEW < ctx)
        .max_by_key(|r| r.prompt.len())
        .context("no prompt fits")?;
    let common = &longest.prompt[..longest.prompt.len().min(ctx / 2)];
    for ending in [" and then", " but the", " So they", " The end"] {
        let mut p = common.to_vec();
        p.extend(tok.encode(ending, false, false));
        p.truncate(ctx - 1);
        let n = MAX_NEW.min(ctx - p.len());
        cases.push((p.clone(), reference_run(model, &p, n)?));
    }

    let block_size = kvlab_paged::DEFAULT_BLOCK_SIZE;
    let demand: usize = cases
        .iter()
        .map(|(p, e)| (p.len() + e.len()).div_ceil(block_size))
        .sum();
    // The smallest pool the scheduler accepts holds one whole-context sequence. Start at a
    // quarter of the peak demand; the scheduler admits only what fits, so if that forced no
    // preemption (short outputs finish before the pool runs dry), halve the pool and run again.
    let min_blocks = ctx.div_ceil(block_size) + 1;
    let mut num_blocks = min_blocks.max(demand / 4);
    let requests: Vec<Request> = cases
        .iter()
        .enumerate()
        .map(|(i, (p, e))| Request {
            prompt: p.clone(),
            stop: StopConditions::max_tokens(e.len()),
            arrival_step: (i % 4) * 3,
            tenant: 0,
            resumes: false,
        })
        .collect();
    let pool = |num_blocks| PoolOptions {
        num_blocks,
        block_size,
        kv_dtype: kvlab_model::KvDtype::F32,
    };
    let report = loop {
        let mut exec = build_paged(engine, model.clone(), pool(num_blocks))?;
        let mut sched = Scheduler::new(SchedulerConfig::new(exec.kv_cache().clone(), ctx))?;
        let report = drive(exec.as_mut(), &mut sched, &requests, argmax, |_, _, _| {})?;
        if report.metrics.num_preemptions > 0 || num_blocks == min_blocks {
            break report;
        }
        num_blocks = min_blocks.max(num_blocks / 2);
    };
    let batched = row(
        entry,
        engine,
        "batched",
        &cases,
        &report,
        (num_blocks, block_size),
        t,
    );
    let mut rows = vec![batched];

    for budget in CHUNK_BUDGETS {
        let t = Instant::now();
        let mut exec = build_paged(engine, model.clone(), pool(num_blocks))?;
        let config = SchedulerConfig {
            max_num_batched_tokens: budget,
            enable_chunked_prefill: true,
            ..SchedulerConfig::new(exec.kv_cache().clone(), ctx)
        };
        let mut sched = Scheduler::new(config)?;
        let mut num_chunks = 0;
        let report = drive(exec.as_mut(), &mut sched, &requests, argmax, |_, b, _| {
            num_chunks += b.seqs.iter().filter(|s| !s.samples).count();
        })?;
        let label = format!("batched, chunked prefill at {budget} tokens a step");
        let mut r = row(
            entry,
            engine,
            &label,
            &cases,
            &report,
            (num_blocks, block_size),
            t,
        );
        if num_chunks == 0 {
            r.status = "MISMATCH".into();
            r.note = format!("no prompt was chunked; {}", r.note);
        }
        rows.push(r);
    }

    for (with_draft, k) in SPEC_RUNS {
        let t = Instant::now();
        let proposer = if with_draft {
            let vocab = draft.config.vocab_size;
            let engine = kvlab_engines::build(EngineKind::Cpu, draft.clone())?;
            Proposer::Draft(DraftModel::new(engine, vocab)?)
        } else {
            Proposer::Ngram(NgramProposer::default())
        };
        let spec = Speculative {
            proposer,
            num_speculative_tokens: k,
        };
        let mut sampler = GreedyDrafting {
            drafter: Some(Drafter::new(spec, ctx)),
        };
        let method = sampler.drafter.as_ref().map_or("", Drafter::method);
        let mut exec = build_paged(engine, model.clone(), pool(num_blocks))?;
        let mut sched = Scheduler::new(SchedulerConfig::new(exec.kv_cache().clone(), ctx))?;
        let report = drive_with(
            exec.as_mut(),
            &mut sched,
            &requests,
            &mut sampler,
            |_, _, _| {},
        )?;
        let m = &report.metrics;
        let label = format!(
            "batched, speculative {method} k={k} ({} of {} drafts kept, {} preemptions)",
            m.spec_decode_num_accepted_tokens, m.spec_decode_num_draft_tokens, m.num_preemptions
        );
        let mut r = row(
            entry,
            engine,
            &label,
            &cases,
            &report,
            (num_blocks, block_size),
            t,
        );
        let failed = sampler
            .drafter
            .as_ref()
            .map_or((0, None), Drafter::failures);
        // A random synthetic model's text may never repeat, so prompt lookup has nothing to
        // propose; a real checkpoint's stories do, and a draft model always proposes.
        let must_draft = with_draft || entry.model.is_some();
        if (must_draft && m.spec_decode_num_draft_tokens == 0) || failed.0 > 0 {
            r.status = "MISMATCH".into();
            r.note = format!(
                "no draft was checked, or drafting failed ({failed:?}); {}",
                r.note
            );
        }
        rows.push(r);
    }

    // The same requests twice, the second wave arriving once the first has run, over tiers of
    // a quarter of the pool in host memory and the rest of the demand on disk. The first wave
    // is a paused session the second resumes: its blocks are offloaded on purpose as each
    // request ends, on top of what eviction spills.
    let t = Instant::now();
    let wave = report.steps.len() + 1;
    let twice: Vec<Request> = requests
        .iter()
        .map(|r| Request {
            resumes: true,
            ..r.clone()
        })
        .chain(requests.iter().map(|r| Request {
            arrival_step: r.arrival_step + wave,
            ..r.clone()
        }))
        .collect();
    let cases2 = [&cases[..], &cases[..]].concat();
    let tiers = TierConfig::host(num_blocks / 4 + 1)
        .with_disk(std::env::temp_dir(), 2 * demand)
        .with_offload_paused(true);
    let mut exec = build_paged(engine, model.clone(), pool(num_blocks))?;
    let config = SchedulerConfig {
        tiers: Some(tiers),
        ..SchedulerConfig::new(exec.kv_cache().clone(), ctx)
    };
    let mut sched = Scheduler::new(config)?;
    let report = drive(exec.as_mut(), &mut sched, &twice, argmax, |_, _, _| {})?;
    rows.push(row(
        entry,
        engine,
        "batched, tiers and offload",
        &cases2,
        &report,
        (num_blocks, block_size),
        t,
    ));
    Ok(rows)
}

/// The verify row of a batched run of `cases` (prompt, expected tokens): identical tokens, and
/// the preemptions, prefix hits (and with tiers, restores) the run is meant to exercise.
fn row(
    entry: &ModelEntry,
    engine: EngineKind,
    label: &str,
    cases: &[(Vec<u32>, Vec<u32>)],
    report: &DriveReport,
    (num_blocks, block_size): (usize, usize),
    t: Instant,
) -> Row {
    let mut first: Option<(usize, Divergence)> = None;
    let mut compared = 0;
    for (i, ((_, expected), (got, _))) in cases.iter().zip(&report.outputs).enumerate() {
        compared += expected.len();
        if let Some(step) = (0..expected.len()).find(|&s| got.get(s) != expected.get(s)) {
            first.get_or_insert((
                i,
                Divergence {
                    step,
                    reference: expected[step],
                    got: got.get(step).copied().unwrap_or(u32::MAX),
                    reference_top2_margin: f32::NAN,
                },
            ));
        }
    }
    let m = &report.metrics;
    let mut problems = Vec::new();
    if let Some((i, d)) = &first {
        problems.push(format!(
            "request {i} diverges from its solo naive run at step {}",
            d.step
        ));
    }
    // Chunked runs admit less at once (a budget of 1 runs one sequence at a time), and
    // speculative ones finish in fewer steps, so only the others must have been preempted.
    if m.num_preemptions == 0 && !label.contains("chunked") && !label.contains("speculative") {
        problems.push("the pool forced no preemption".into());
    }
    if m.prefix_cache_hits == 0 {
        problems.push("no prefix-cache hit".into());
    }
    let with_tiers = label.contains("tiers");
    if with_tiers
        && (m.num_restores == 0
            || m.tier_store.bytes_read_from_disk == 0
            || m.num_offloaded_blocks == 0)
    {
        problems.push(format!(
            "the tiers restored {} blocks, {} bytes from disk, after offloading {} blocks of \
             paused requests; all three should be > 0",
            m.num_restores, m.tier_store.bytes_read_from_disk, m.num_offloaded_blocks
        ));
    }
    let note = problems.join("; ");
    Row {
        prompt: format!("{label}: {} requests", cases.len()),
        prompt_tokens: cases.iter().map(|(p, _)| p.len()).sum(),
        status: if problems.is_empty() {
            "ok"
        } else {
            "MISMATCH"
        }
        .into(),
        tokens_compared: compared,
        identical: first.is_none(),
        first_divergence: first.map(|(_, d)| d),
        min_top2_margin: f32::INFINITY,
        ms: t.elapsed().as_secs_f64() * 1e3,
        note,
        batch: Some(BatchInfo {
            requests: cases.len(),
            steps: report.steps.len(),
            num_blocks,
            block_size,
            num_preemptions: m.num_preemptions,
            prefix_cache_hits: m.prefix_cache_hits,
            num_recomputed_tokens: m.num_recomputed_tokens,
            num_spills: m.num_spills,
            num_offloaded_blocks: m.num_offloaded_blocks,
            num_restores: m.num_restores,
        }),
        ..Row::empty(&entry.name, engine.name())
    }
}

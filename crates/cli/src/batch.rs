//! `kvlab batch`: several prompts at once through the continuous-batching scheduler and a paged
//! engine. `--trace` prints every step's batch (positions, slot_mapping, block tables); `--svg`
//! draws which sequence owns which block of the pool at a chosen step.

use std::fmt::Write as _;
use std::path::PathBuf;
use std::sync::Arc;

use anyhow::{Context, Result, bail};
use clap::Args as ClapArgs;
use kvlab_cli::args::{MAX_ARRIVAL_GAP, MAX_BLOCK_SIZE, MAX_NUM_BLOCKS, MAX_POSITIONS, usize_in};
use kvlab_engines::{self as engines, EngineKind, GreedyDrafting, PoolOptions, build_paged};
use kvlab_model::Drafter;
use kvlab_paged::{
    BlockState, DriveReport, PoolView, Request, ScheduledBatch, Scheduler, SchedulerConfig,
    StepKind, StopConditions, TierOp, drive_with,
};

use crate::bytes;

#[derive(ClapArgs)]
pub struct Args {
    #[command(flatten)]
    run: crate::RunArgs,
    /// A prompt (repeat the flag for several); default: four stories sharing an opening.
    #[arg(long, short = 'p')]
    prompt: Vec<String>,
    /// New tokens per sequence (llama.cpp's -n).
    #[arg(long = "n-predict", short = 'n', visible_alias = "max-tokens", default_value_t = 48,
          value_parser = usize_in(1, MAX_POSITIONS))]
    max_tokens: usize,
    /// Paged engine.
    #[arg(long, short = 'e', default_value_t = EngineKind::CpuPaged,
          value_parser = engines::value_parser(&EngineKind::paged()))]
    engine: EngineKind,
    /// Blocks in the pool (default: enough for every sequence at once).
    #[arg(long, value_parser = usize_in(1, MAX_NUM_BLOCKS))]
    num_blocks: Option<usize>,
    /// Token slots per block.
    #[arg(long, default_value_t = 16, value_parser = usize_in(1, MAX_BLOCK_SIZE))]
    block_size: usize,
    /// Which cached prefix block goes first when the pool runs out: lru, lfu, clock or
    /// leaf-first.
    #[arg(long, default_value = "lru", value_parser = kvlab_cli::args::eviction_parser())]
    eviction: kvlab_paged::EvictionPolicy,
    /// Turn the prefix cache off (vLLM's flag of this name): every prompt is prefilled in
    /// full, and no block is shared between sequences. The tiers hold evicted prefix-cache
    /// blocks, so they need it on.
    #[arg(long, conflicts_with_all = ["host_tier_blocks", "disk_tier"])]
    no_enable_prefix_caching: bool,
    /// Tenants the prompts belong to: prompt i is tenant i mod N's (their prefix-cache hit
    /// rates are printed apart when N > 1).
    #[arg(long, default_value_t = 1, value_parser = usize_in(1, 1_000))]
    tenants: usize,
    /// Cached blocks each tenant keeps safe from other tenants' demand (default: no quotas).
    #[arg(long, value_parser = usize_in(0, MAX_NUM_BLOCKS))]
    tenant_quota: Option<usize>,
    /// Each prompt arrives this many steps after the previous one.
    #[arg(long, default_value_t = 2, value_parser = usize_in(0, MAX_ARRIVAL_GAP))]
    arrival_gap: usize,
    #[command(flatten)]
    kv: crate::KvArgs,
    #[command(flatten)]
    budget: crate::BudgetArgs,
    #[command(flatten)]
    tiers: crate::TierArgs,
    #[command(flatten)]
    spec: crate::speculative::SpecArgs,
    /// Print every step's batch (positions, slot_mapping, block tables) to stderr, as
    /// `generate --trace` does; stdout keeps the outputs.
    #[arg(long)]
    trace: bool,
    /// Write an SVG of the pool's block ownership at --svg-step.
    #[arg(long)]
    svg: Option<PathBuf>,
    /// The engine step --svg draws (the first step after it if the run skips it).
    #[arg(long, default_value_t = 12)]
    svg_step: usize,
    /// Print special tokens (`<|im_end|>`, `<start_of_turn>`) in the outputs as their text;
    /// without it they print nothing (llama.cpp's flag).
    #[arg(long)]
    special: bool,
    /// Print the stats as one JSON object on stderr instead of text (stdout keeps the outputs).
    #[arg(long)]
    json: bool,
}

const DEFAULT_PROMPTS: [&str; 4] = [
    "Once upon a time, there was a little girl named Lily. She loved to play outside",
    "Once upon a time, there was a little girl named Lily. She had a big red ball",
    "Once upon a time, there was a little boy named Tom",
    "The dog ran to the park",
];

pub fn run(a: Args) -> Result<()> {
    let loaded = a.run.start()?;
    let tok = crate::tokenizer_of(&loaded.tokenizer, &loaded.name)?;
    let model = Arc::new(loaded.model);
    let texts: Vec<String> = if a.prompt.is_empty() {
        DEFAULT_PROMPTS.iter().map(|s| s.to_string()).collect()
    } else {
        a.prompt.clone()
    };
    let prompts: Vec<Vec<u32>> = texts
        .iter()
        .map(|t| tok.encode_special(t, true, false))
        .collect();
    // Both terms are at most MAX_POSITIONS (the prompt fits the context or is refused below).
    let longest = prompts.iter().map(Vec::len).max().unwrap_or(1) + a.max_tokens;
    if longest > model.config.max_seq_len {
        bail!(
            "a sequence would need {longest} positions (its prompt plus --n-predict {}); the model holds {}: lower --n-predict or shorten the prompt",
            a.max_tokens,
            model.config.max_seq_len
        );
    }
    let max_model_len = longest.next_multiple_of(a.block_size);
    let num_blocks = a.num_blocks.unwrap_or_else(|| {
        prompts
            .iter()
            .map(|p| (p.len() + a.max_tokens).div_ceil(a.block_size))
            .sum::<usize>()
            + 1
    });
    let pool = PoolOptions {
        num_blocks,
        block_size: a.block_size,
        kv_dtype: a.kv.kv_dtype,
    };
    let mut engine = build_paged(a.engine, model.clone(), pool)?;
    let tiers = a.tiers.config(false, || {
        let (name, files) = (loaded.name.as_str(), loaded.files.as_slice());
        let (weights, dtype) = (a.run.model.weights, a.kv.kv_dtype);
        crate::tiers::remote_namespace((name, files), weights, a.engine.name(), dtype, a.block_size)
    })?;
    let show_tiers = tiers.is_some();
    let cfg = a.budget.apply(SchedulerConfig {
        eviction_policy: a.eviction,
        tenant_quota: a.tenant_quota,
        tiers,
        enable_prefix_caching: !a.no_enable_prefix_caching,
        ..SchedulerConfig::new(engine.kv_cache().clone(), max_model_len)
    });
    let mut sched = Scheduler::new(cfg)?;
    let requests: Vec<Request> = prompts
        .iter()
        .enumerate()
        .map(|(i, p)| Request {
            prompt: p.clone(),
            stop: StopConditions::max_tokens(a.max_tokens)
                .with_stop_tokens(model.config.stop_ids.clone()),
            arrival_step: i * a.arrival_gap,
            // At most 1,000 tenants (the flag's bound).
            tenant: (i % a.tenants) as kvlab_paged::Tenant,
            resumes: false,
        })
        .collect();
    // Draft models run on the cpu engine, one cache of max_model_len positions per sequence.
    let drafter = match a.spec.plan(&a.run.model, &model.config)? {
        Some(plan) => {
            let spec = plan.build(EngineKind::Cpu, max_model_len, a.kv.kv_dtype)?;
            Some(Drafter::new(spec, max_model_len))
        }
        None => None,
    };
    let mut sampler = GreedyDrafting { drafter };
    let mut picture = None;
    let report = drive_with(
        engine.as_mut(),
        &mut sched,
        &requests,
        &mut sampler,
        |step, batch, s| {
            if a.trace {
                print_step(step, batch, s.kv_cache_manager().pending_tier_ops());
            }
            if step == a.svg_step || (picture.is_none() && a.svg.is_some() && step > a.svg_step) {
                picture = Some(block_svg(step, s));
            }
        },
    )?;
    for (i, (out, reason)) in report.outputs.iter().enumerate() {
        let all = [prompts[i].as_slice(), out].concat();
        println!("[{i}] ({:?}) {}", reason, tok.decode_all(&all, a.special));
    }
    let stats = Stats {
        report: &report,
        sched: &sched,
        drafter: sampler.drafter.as_ref(),
        requests: requests.len(),
        num_blocks,
        kv_bytes_per_block: a.kv.kv_dtype.bytes_per_block(&model.config, a.block_size),
        show_tiers,
    };
    if a.json {
        eprintln!("{}", stats.json(&a));
    } else {
        stats.print(&a);
    }
    if let Some(path) = &a.svg {
        let svg = picture.with_context(|| format!("the run ended before step {}", a.svg_step))?;
        std::fs::write(path, svg).with_context(|| format!("writing {}", path.display()))?;
        eprintln!("block picture written to {}", path.display());
    }
    Ok(())
}

/// What `kvlab batch` reports of a run.
struct Stats<'a> {
    report: &'a DriveReport,
    sched: &'a Scheduler,
    drafter: Option<&'a Drafter>,
    requests: usize,
    num_blocks: usize,
    /// Bytes of KV one block holds across layers.
    kv_bytes_per_block: usize,
    show_tiers: bool,
}

impl Stats<'_> {
    /// Tokens the engine computed over the run, and per second of engine time.
    fn tokens_computed(&self) -> (usize, f64) {
        let r = self.report;
        let tokens: usize = r.steps.iter().map(|s| s.num_batched_tokens).sum();
        (
            tokens,
            tokens as f64 / r.engine_time.as_secs_f64().max(1e-9),
        )
    }

    /// The `--json` line.
    fn json(&self, a: &Args) -> serde_json::Value {
        let (report, m) = (self.report, &self.report.metrics);
        let (tokens, tokens_per_s) = self.tokens_computed();
        let (decode_tokens, decode_s) = report.decode_only();
        let (num_blocks, kv_bytes_per_block) = (self.num_blocks, self.kv_bytes_per_block);
        serde_json::json!({
            "engine": a.engine.name(),
            "requests": self.requests,
            "steps": report.steps.len(),
            "tokens_computed": tokens,
            "engine_s": report.engine_time.as_secs_f64(),
            // engine_s plus scheduling, sampling and updating: the whole run
            "wall_s": report.wall_time.as_secs_f64(),
            "tokens_per_s": tokens_per_s,
            // decode steps alone (those that prefilled nothing): generated tokens per second
            "decode_tokens_per_s": decode_tokens as f64 / decode_s.max(1e-9),
            "num_blocks": num_blocks,
            "block_size": a.block_size,
            "kv_bytes_per_block": kv_bytes_per_block,
            "preemptions": m.num_preemptions,
            "prefix_cache_hits": m.prefix_cache_hits,
            "prefix_cache_queries": m.prefix_cache_queries,
            "prefix_cache_hits_by_tier": m.prefix_cache_hits_by_tier,
            "recomputed_tokens": m.num_recomputed_tokens,
            "tier_spills": m.num_spills,
            "tier_restores": m.num_restores,
            "tier_drops": m.tier_drops,
            "tier_store": m.tier_store,
            "tenant_quota": a.tenant_quota,
            // tenant → [prompt tokens queried, tokens served by the prefix cache]
            "tenant_prefix_hits": self.sched.tenant_prefix_hits(),
            // --speculative: decode steps that checked drafts, drafts checked, drafts kept
            "speculative": self.drafter.map(|d| serde_json::json!({
                "method": d.method(),
                "num_speculative_tokens": a.spec.num_speculative_tokens,
                "num_drafts": m.spec_decode_num_drafts,
                "num_draft_tokens": m.spec_decode_num_draft_tokens,
                "num_accepted_tokens": m.spec_decode_num_accepted_tokens,
                "failed_proposals": d.failures().0,
            })),
        })
    }

    /// The human-readable summary (stderr).
    fn print(&self, a: &Args) {
        let (report, m) = (self.report, &self.report.metrics);
        let (tokens, tokens_per_s) = self.tokens_computed();
        let (num_blocks, kv_bytes_per_block) = (self.num_blocks, self.kv_bytes_per_block);
        eprintln!(
            "{} steps, {tokens} tokens computed in {:.2} s of engine time ({:.0} tok/s; {:.2} s in all with scheduling and sampling); pool {num_blocks} blocks x {} tokens ({} of KV per block across layers); preemptions {}, prefix-cache hits {} of {} queried tokens, recomputed {} tokens",
            report.steps.len(),
            report.engine_time.as_secs_f64(),
            tokens_per_s,
            report.wall_time.as_secs_f64(),
            a.block_size,
            bytes(kv_bytes_per_block),
            m.num_preemptions,
            m.prefix_cache_hits,
            m.prefix_cache_queries,
            m.num_recomputed_tokens
        );
        if self.show_tiers {
            eprintln!("{}", crate::tier_summary(m));
        }
        if let Some(d) = self.drafter {
            eprintln!(
                "speculative ({}): {} drafts checked in {} decode steps, {} kept ({:.1}%)",
                d.method(),
                m.spec_decode_num_draft_tokens,
                m.spec_decode_num_drafts,
                m.spec_decode_num_accepted_tokens,
                100.0 * m.spec_decode_acceptance_rate()
            );
            if let (n @ 1.., Some(e)) = d.failures() {
                eprintln!("warning: the draft model failed {n} times, last: {e}");
            }
        }
        if a.tenants > 1 {
            for (t, (queried, hit)) in self.sched.tenant_prefix_hits() {
                eprintln!(
                    "tenant {t}: prefix-cache hits {hit} of {queried} queried tokens ({:.1}%)",
                    100.0 * *hit as f64 / (*queried).max(1) as f64
                );
            }
        }
    }
}

fn print_step(step: usize, batch: &ScheduledBatch, tier_ops: &[TierOp]) {
    eprintln!(
        "step {step}: {}, {}{}",
        kvlab_cli::plural(batch.seqs.len(), "sequence"),
        kvlab_cli::plural(batch.num_batched_tokens(), "token"),
        if batch.preempted.is_empty() {
            String::new()
        } else {
            format!(
                ", preempted {:?}",
                batch.preempted.iter().map(|s| s.0).collect::<Vec<_>>()
            )
        }
    );
    for s in &batch.seqs {
        let kind = match s.kind {
            StepKind::Prefill {
                num_cached_tokens,
                is_recompute,
            } => format!(
                "prefill ({num_cached_tokens} positions already cached{})",
                if is_recompute {
                    ", recompute after preemption"
                } else {
                    ""
                }
            ),
            StepKind::Decode if s.num_draft_tokens > 0 => format!(
                "decode checking {} draft tokens {:?}",
                s.num_draft_tokens,
                s.draft_token_ids()
            ),
            StepKind::Decode => "decode".into(),
        };
        let kind = if s.samples {
            kind
        } else {
            format!("{kind}, a chunk: its prompt continues next step, nothing sampled")
        };
        let g = &s.groups[0];
        eprintln!(
            "  {} {kind}: positions {}..={}, context_len {}",
            s.seq_id,
            s.positions[0],
            s.positions[s.positions.len() - 1],
            s.context_len
        );
        eprintln!("    block_table {:?}", g.block_table);
        eprintln!("    slot_mapping {:?}", g.slot_mapping);
        for c in &g.block_copies {
            eprintln!("    copy-on-write: block {} -> {}", c.src, c.dst);
        }
    }
    for op in tier_ops {
        match op {
            TierOp::Spill { key, block } => {
                eprintln!("  tier: spill block {block} (group {}) down", key.group)
            }
            TierOp::Restore { key, block } => {
                eprintln!("  tier: restore into block {block} (group {})", key.group)
            }
            TierOp::Drop { key } => {
                eprintln!("  tier: drop entry {} (group {})", key.entry, key.group)
            }
        }
    }
}

/// An SVG grid of the pool: one cell per block, coloured by the sequence holding it; blocks held
/// by several sequences (a shared prefix) are outlined and labelled with their ref count; free
/// blocks that keep cached content are grey.
fn block_svg(step: usize, s: &Scheduler) -> String {
    let view = PoolView::of(s);
    let group = &view.groups[0];
    let n = group.blocks.len();
    const PALETTE: [&str; 8] = [
        "#4e79a7", "#f28e2b", "#e15759", "#76b7b2", "#59a14f", "#edc948", "#b07aa1", "#ff9da7",
    ];
    let (cols, cell) = (16usize, 40usize);
    let rows = n.div_ceil(cols);
    let (w, h) = (cols * cell + 20, rows * cell + 70);
    let mut svg = format!(
        "<svg xmlns=\"http://www.w3.org/2000/svg\" width=\"{w}\" height=\"{h}\" font-family=\"sans-serif\" font-size=\"11\">\n"
    );
    let _ = writeln!(
        svg,
        "<text x=\"10\" y=\"18\" font-size=\"14\">KV block pool at step {step}: {n} blocks of {} tokens; colour = owning sequence</text>",
        group.block_size
    );
    for (b, state) in group.blocks.iter().enumerate() {
        let (x, y) = (10 + (b % cols) * cell, 30 + (b / cols) * cell);
        let (fill, label, stroke) = match state {
            BlockState::Held { seqs } if seqs.len() > 1 => (
                PALETTE[seqs[0] as usize % PALETTE.len()],
                format!("x{}", seqs.len()),
                "#000",
            ),
            BlockState::Held { seqs } => (
                PALETTE[seqs[0] as usize % PALETTE.len()],
                format!("s{}", seqs[0]),
                "#fff",
            ),
            BlockState::Cached => ("#cccccc", "cached".into(), "#fff"),
            BlockState::Free => ("#f4f4f4", String::new(), "#fff"),
        };
        let width = if stroke == "#000" { 3 } else { 1 };
        let _ = writeln!(
            svg,
            "<rect x=\"{x}\" y=\"{y}\" width=\"{}\" height=\"{}\" fill=\"{fill}\" stroke=\"{stroke}\" stroke-width=\"{width}\"/>",
            cell - 2,
            cell - 2
        );
        for (dy, text) in [(12, b.to_string()), (30, label)] {
            let (tx, ty) = (x + 3, y + dy);
            let _ = writeln!(
                svg,
                "<text x=\"{tx}\" y=\"{ty}\" fill=\"#222\">{text}</text>"
            );
        }
    }
    let _ = writeln!(
        svg,
        "<text x=\"10\" y=\"{}\">sN: held by sequence N; xK: shared by K sequences (prefix cache / fork); cached: free, content kept for reuse</text>",
        h - 12
    );
    svg.push_str("</svg>\n");
    svg
}

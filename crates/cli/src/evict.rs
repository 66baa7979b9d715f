//! `kvlab evict`: the prefix-cache eviction policies side by side on a chat-like workload (shared
//! system prompts, multi-turn sessions that send the whole conversation again), at several pool
//! sizes: prefix hit rate, prefill tokens computed, evictions, time to first token. Every policy
//! must give every request the same tokens (eviction changes what is recomputed, never what is
//! generated); the command checks it.

use std::sync::Arc;

use anyhow::{Context, Result, bail};
use clap::Args as ClapArgs;
use kvlab_cli::args::{MAX_BLOCK_SIZE, MAX_NUM_BLOCKS, eviction_parser, usize_in};
use kvlab_engines::{EngineKind, PoolOptions, build_paged};
use kvlab_model::sampler::argmax;
use kvlab_paged::{
    DriveReport, EvictionPolicy, Request, Scheduler, SchedulerConfig, Sessions, StopConditions,
    drive, session_turns,
};
use serde::Serialize;

#[derive(ClapArgs)]
pub struct Args {
    #[command(flatten)]
    run: crate::RunArgs,
    /// Pool sizes in blocks (repeat the flag; default: the largest prompt's blocks × 2, 4 and 8).
    #[arg(long = "num-blocks", value_parser = usize_in(1, MAX_NUM_BLOCKS))]
    pools: Vec<usize>,
    /// Policies to compare (repeat the flag; default: all of lru, lfu, clock, leaf-first).
    #[arg(long = "eviction", value_parser = eviction_parser())]
    policies: Vec<EvictionPolicy>,
    /// Chat sessions.
    #[arg(long, default_value_t = Sessions::default().num_sessions, value_parser = usize_in(1, 10_000))]
    sessions: usize,
    /// Turns per session.
    #[arg(long, default_value_t = Sessions::default().turns_per_session, value_parser = usize_in(1, 64))]
    turns: usize,
    /// Distinct system prompts shared by the sessions.
    #[arg(long, default_value_t = Sessions::default().num_system_prompts, value_parser = usize_in(1, 10_000))]
    system_prompts: usize,
    /// Tenants the sessions are spread over (session i belongs to tenant i mod N).
    #[arg(long, default_value_t = 1, value_parser = usize_in(1, 1_000))]
    tenants: usize,
    /// Sessions of one more, noisy tenant: each with a system prompt nobody shares, filling the
    /// prefix cache with blocks nobody reuses.
    #[arg(long, default_value_t = 0, value_parser = usize_in(0, 10_000))]
    noisy_sessions: usize,
    /// Cached blocks per tenant safe from other tenants' demand (repeat the flag to compare;
    /// each run is also made without a quota).
    #[arg(long = "tenant-quota", value_parser = usize_in(0, MAX_NUM_BLOCKS))]
    quotas: Vec<usize>,
    #[command(flatten)]
    tiers: crate::TierArgs,
    /// Also run the tiers offloading paused sessions on purpose: when a turn that a later
    /// turn continues ends, its blocks go down at once instead of when the pool needs them
    /// (needs --host-tier-blocks or --disk-tier).
    #[arg(long)]
    offload_paused: bool,
    /// New tokens per turn (llama.cpp's -n).
    #[arg(long = "n-predict", short = 'n', default_value_t = 8, value_parser = usize_in(1, 4096))]
    max_tokens: usize,
    /// Token slots per block.
    #[arg(long, default_value_t = 16, value_parser = usize_in(1, MAX_BLOCK_SIZE))]
    block_size: usize,
    /// Seed of the chat workload (the sessions' prompts and turn order; the same seed gives
    /// the same table).
    #[arg(long, short, default_value_t = 0)]
    seed: u64,
    /// Print JSON instead of a table.
    #[arg(long)]
    json: bool,
}

/// One (pool, policy) run.
#[derive(Serialize)]
struct Row {
    num_blocks: usize,
    policy: &'static str,
    /// Cached blocks per tenant kept safe from the others (None: no quota).
    tenant_quota: Option<usize>,
    /// Blocks per pool the tiers below hold (None: no tiers; evicted blocks are dropped).
    tier_blocks: Option<usize>,
    /// Whether paused sessions were offloaded on purpose.
    offload_paused: bool,
    /// Whether a remote tier in Redis (`--remote-tier`) was below the others, and the blocks
    /// restored from it.
    remote_tier: bool,
    remote_restores: u64,
    /// Evicted blocks spilled to the tiers (offloaded ones included), the blocks of paused
    /// sessions offloaded on purpose, and levels restored from the tiers.
    spills: u64,
    offloaded: u64,
    restores: u64,
    /// Hit rate of the noisy tenant's requests and of everyone else's (with --noisy-sessions).
    noisy_hit_rate: Option<f64>,
    others_hit_rate: Option<f64>,
    /// Prompt tokens served by the prefix cache / prompt tokens looked up (admissions).
    prefix_hit_rate: f64,
    /// Prefill tokens computed (prompt tokens not served by the cache, recomputation included).
    prefill_tokens: usize,
    evictions: u64,
    preemptions: u64,
    /// Time to first token, from the arrival step to the step that sampled it, in ms of
    /// engine time (mean and 90th percentile over requests).
    ttft_ms_mean: f64,
    ttft_ms_p90: f64,
    /// Engine time of the whole run, in seconds.
    engine_s: f64,
}

pub fn run(a: Args) -> Result<()> {
    let loaded = a.run.start()?;
    let model = Arc::new(loaded.model);
    let vocab = u32::try_from(model.config.vocab_size).context("vocabulary too large")?;
    let workload = Sessions {
        num_system_prompts: a.system_prompts,
        num_sessions: a.sessions,
        turns_per_session: a.turns,
        vocab_size: vocab,
        num_tenants: a.tenants,
        noisy_sessions: a.noisy_sessions,
        ..Sessions::default()
    };
    // With --remote-tier, one more run per pool and policy: the tiers plus Redis, under a
    // namespace of the run's own, so that every run starts from an empty store (a store shared
    // by the runs would carry blocks from one to the next).
    let remote_tiers = match a.tiers.remote_tier {
        Some(_) => a.tiers.config(false, || {
            let (name, files) = (loaded.name.as_str(), loaded.files.as_slice());
            let dtype = kvlab_model::KvDtype::F32;
            let engine = EngineKind::CpuPaged.name();
            crate::tiers::remote_namespace(
                (name, files),
                a.run.model.weights,
                engine,
                dtype,
                a.block_size,
            )
        })?,
        None => None,
    };
    if a.offload_paused && a.tiers.local().is_none() {
        bail!(
            "--offload-paused moves paused sessions to the tiers; give them with --host-tier-blocks N or --disk-tier DIR"
        );
    }
    let turns = session_turns(a.seed, workload)?;
    let bos = model.config.bos_id;
    let requests: Vec<Request> = turns
        .iter()
        .map(|t| Request {
            prompt: std::iter::once(bos)
                .chain(t.prompt.iter().copied())
                .collect(),
            // Stop tokens would end turns at different lengths under different pools; the
            // comparison wants the same work everywhere, so only the length stops.
            stop: StopConditions::max_tokens(a.max_tokens),
            arrival_step: t.arrival_step,
            tenant: t.tenant,
            resumes: t.resumes,
        })
        .collect();
    let longest = requests.iter().map(|r| r.prompt.len()).max().unwrap_or(1) + a.max_tokens;
    if longest > model.config.max_seq_len {
        bail!(
            "the longest turn needs {longest} positions; {} holds {}: use fewer --turns or a model with a longer context",
            loaded.name,
            model.config.max_seq_len
        );
    }
    let max_model_len = longest.next_multiple_of(a.block_size);
    let seq_blocks = max_model_len / a.block_size;
    let pools = if a.pools.is_empty() {
        vec![2 * seq_blocks, 4 * seq_blocks, 8 * seq_blocks]
    } else {
        a.pools.clone()
    };
    let noisy = (a.noisy_sessions > 0).then_some(a.tenants as kvlab_paged::Tenant);
    let runs = Runs {
        model: &model,
        requests: &requests,
        max_model_len,
        remote_tiers,
        noisy,
    };
    let rows = runs.measure(&a, &pools)?;
    if a.json {
        println!("{}", serde_json::to_string_pretty(&rows)?);
        return Ok(());
    }
    println!(
        "{} on cpu-paged: {} turns ({} sessions x {}, {} system prompts of {} tokens), {} new tokens each, blocks of {} tokens (one sequence: {} blocks)",
        loaded.name,
        requests.len(),
        a.sessions,
        a.turns,
        a.system_prompts,
        workload.system_len,
        a.max_tokens,
        a.block_size,
        seq_blocks
    );
    if a.tenants > 1 || a.noisy_sessions > 0 {
        println!(
            "tenants: {} ({} sessions each, round robin){}",
            a.tenants,
            a.sessions.div_ceil(a.tenants),
            noisy.map_or(String::new(), |t| format!(
                ", plus noisy tenant {t}: {} sessions with system prompts of their own",
                a.noisy_sessions
            ))
        );
    }
    print_table(&a, &rows, noisy.is_some());
    Ok(())
}

/// The runs `kvlab evict` compares: one workload over pools, policies, quotas and tiers.
struct Runs<'a> {
    model: &'a Arc<kvlab_model::Model>,
    requests: &'a [Request],
    max_model_len: usize,
    /// The tiers plus Redis, for one more run per pool and policy (`--remote-tier`).
    remote_tiers: Option<kvlab_paged::TierConfig>,
    /// The noisy tenant, when there is one.
    noisy: Option<kvlab_paged::Tenant>,
}

impl Runs<'_> {
    /// Runs every configuration on `pools` blocks, checking that each generates the first's
    /// tokens.
    ///
    /// # Errors
    /// When an engine or scheduler cannot be built or fails, or a run's tokens differ.
    fn measure(&self, a: &Args, pools: &[usize]) -> Result<Vec<Row>> {
        let policies = if a.policies.is_empty() {
            EvictionPolicy::ALL.to_vec()
        } else {
            a.policies.clone()
        };
        let run_id = format!(
            "evict-run={}.{}",
            std::process::id(),
            std::time::SystemTime::now()
                .duration_since(std::time::UNIX_EPOCH)
                .map_or(0, |d| d.as_nanos())
        );
        let quotas: Vec<Option<usize>> = std::iter::once(None)
            .chain(a.quotas.iter().copied().map(Some))
            .collect();
        let mut rows = Vec::new();
        let mut reference: Option<Vec<Vec<u32>>> = None;
        for &num_blocks in pools {
            let tiers: Vec<_> = std::iter::once(None)
                .chain(a.tiers.local().map(Some))
                .chain(
                    a.tiers
                        .local()
                        .filter(|_| a.offload_paused)
                        .map(|t| Some(t.with_offload_paused(true))),
                )
                .chain(self.remote_tiers.clone().map(Some))
                .collect();
            for ((&policy, &tenant_quota), tiers) in policies
                .iter()
                .flat_map(|p| quotas.iter().map(move |q| (p, q)))
                .flat_map(|pq| tiers.iter().map(move |t| (pq, t)))
            {
                let pool = PoolOptions {
                    num_blocks,
                    block_size: a.block_size,
                    kv_dtype: kvlab_model::KvDtype::F32,
                };
                let mut engine = build_paged(EngineKind::CpuPaged, self.model.clone(), pool)?;
                let mut tiers = tiers.clone();
                if let Some(r) = tiers.as_mut().and_then(|t| t.remote.as_mut()) {
                    r.namespace = format!("{} {run_id}.{}", r.namespace, rows.len());
                    // Each run's blocks are of no use after it: let Redis drop them.
                    r.ttl_secs = r.ttl_secs.or(Some(3600));
                }
                let config = SchedulerConfig {
                    eviction_policy: policy,
                    tenant_quota,
                    tiers: tiers.clone(),
                    ..SchedulerConfig::new(engine.kv_cache().clone(), self.max_model_len)
                };
                let mut sched = Scheduler::new(config)?;
                let report = drive(
                    engine.as_mut(),
                    &mut sched,
                    self.requests,
                    argmax,
                    |_, _, _| {},
                )?;
                let outputs: Vec<Vec<u32>> =
                    report.outputs.iter().map(|(t, _)| t.clone()).collect();
                match &reference {
                    None => reference = Some(outputs),
                    Some(r) if *r != outputs => bail!(
                        "{} blocks, {}, quota {:?}, tiers {:?}: the generated tokens differ from the first run's; eviction and tiers must never change them",
                        num_blocks,
                        policy.name(),
                        tenant_quota,
                        tiers.as_ref().map(|t| t.capacity())
                    ),
                    Some(_) => {}
                }
                let mut r = row(num_blocks, policy, self.requests, &report);
                r.tenant_quota = tenant_quota;
                r.tier_blocks = tiers.as_ref().map(|t| t.capacity());
                r.offload_paused = tiers.as_ref().is_some_and(|t| t.offload_paused);
                r.remote_tier = tiers.as_ref().is_some_and(|t| t.remote.is_some());
                r.remote_restores = report.metrics.tier_store.blocks_restored_from_remote;
                if let Some(noisy) = self.noisy {
                    let rate = |(q, h): (u64, u64)| h as f64 / q.max(1) as f64;
                    let hits = sched.tenant_prefix_hits();
                    let others = hits
                        .iter()
                        .filter(|(t, _)| **t != noisy)
                        .fold((0, 0), |(q, h), (_, &(q2, h2))| (q + q2, h + h2));
                    r.noisy_hit_rate = Some(rate(hits.get(&noisy).copied().unwrap_or_default()));
                    r.others_hit_rate = Some(rate(others));
                }
                rows.push(r);
            }
        }
        Ok(rows)
    }
}

/// The rows as a table, the tenant columns when a tenant is noisy or quotas are set, the tier
/// columns when tiers are given.
fn print_table(a: &Args, rows: &[Row], noisy: bool) {
    let tenant_cols = noisy || !a.quotas.is_empty();
    let tier_cols = a.tiers.local().is_some() || a.tiers.remote_tier.is_some();
    print!(
        "{:>7} {:<11} {:>9} {:>15} {:>10} {:>12} {:>15} {:>14} {:>9}",
        "blocks",
        "eviction",
        "hit rate",
        "prefill tokens",
        "evictions",
        "preemptions",
        "TTFT mean, ms",
        "TTFT p90, ms",
        "engine s"
    );
    if tenant_cols {
        print!(" {:>6} {:>11} {:>10}", "quota", "others hit", "noisy hit");
    }
    if tier_cols {
        print!(" {:>11} {:>7} {:>9}", "tier blocks", "spills", "restores");
        if a.offload_paused {
            print!(" {:>9}", "offloaded");
        }
    }
    println!();
    let percent = |x: Option<f64>| x.map_or("-".into(), |x| format!("{:.1}%", 100.0 * x));
    for r in rows {
        print!(
            "{:>7} {:<11} {:>8.1}% {:>15} {:>10} {:>12} {:>15.2} {:>14.2} {:>9.3}",
            r.num_blocks,
            r.policy,
            100.0 * r.prefix_hit_rate,
            r.prefill_tokens,
            r.evictions,
            r.preemptions,
            r.ttft_ms_mean,
            r.ttft_ms_p90,
            r.engine_s
        );
        if tenant_cols {
            let quota = r.tenant_quota.map_or("none".into(), |q| q.to_string());
            print!(
                " {quota:>6} {:>11} {:>10}",
                percent(r.others_hit_rate),
                percent(r.noisy_hit_rate)
            );
        }
        if tier_cols {
            let blocks = match (r.tier_blocks, r.remote_tier) {
                (Some(b), true) => format!("{b}+Redis"),
                (Some(b), false) => b.to_string(),
                (None, _) => "none".into(),
            };
            print!(" {blocks:>11} {:>7} {:>9}", r.spills, r.restores);
            if a.offload_paused {
                let offloaded = if r.offload_paused {
                    r.offloaded.to_string()
                } else {
                    "-".into()
                };
                print!(" {offloaded:>9}");
            }
        }
        println!();
    }
    println!(
        "every policy{} gave every turn the same tokens",
        match (tier_cols, a.offload_paused) {
            (true, true) => ", without tiers, with them, and offloading paused sessions,",
            (true, false) => ", with and without tiers,",
            _ => "",
        }
    );
}

fn row(num_blocks: usize, policy: EvictionPolicy, requests: &[Request], r: &DriveReport) -> Row {
    let m = &r.metrics;
    let decode_tokens: usize = r.steps.iter().map(|s| s.num_seqs - s.num_prefills).sum();
    let computed: usize = r.steps.iter().map(|s| s.num_batched_tokens).sum();
    // Engine seconds of every executed step from a request's arrival to its first token.
    let mut ttft_ms: Vec<f64> = requests
        .iter()
        .zip(&r.first_token_steps)
        .filter_map(|(req, first)| {
            let first = (*first)?;
            let s: f64 = r
                .steps
                .iter()
                .filter(|s| (req.arrival_step..=first).contains(&s.step))
                .map(|s| s.seconds)
                .sum();
            Some(s * 1e3)
        })
        .collect();
    ttft_ms.sort_by(f64::total_cmp);
    let mean = ttft_ms.iter().sum::<f64>() / ttft_ms.len().max(1) as f64;
    let p90 = ttft_ms
        .get((ttft_ms.len() * 9 / 10).min(ttft_ms.len().saturating_sub(1)))
        .copied()
        .unwrap_or(0.0);
    Row {
        num_blocks,
        policy: policy.name(),
        tenant_quota: None,
        tier_blocks: None,
        offload_paused: false,
        remote_tier: false,
        remote_restores: 0,
        spills: m.num_spills,
        offloaded: m.num_offloaded_blocks,
        restores: m.num_restores,
        noisy_hit_rate: None,
        others_hit_rate: None,
        prefix_hit_rate: m.prefix_cache_hit_rate(),
        prefill_tokens: computed - decode_tokens,
        evictions: m.num_evictions,
        preemptions: m.num_preemptions,
        ttft_ms_mean: mean,
        ttft_ms_p90: p90,
        engine_s: r.engine_time.as_secs_f64(),
    }
}

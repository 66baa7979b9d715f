//! `cargo xtask bench --cluster`: several `kvlab serve` instances behind a real load balancer
//! (HAProxy), with and without a shared remote tier in a real Redis, on the multi-turn chat
//! sessions `kvlab evict` generates.
//!
//! On Gemma 3 270M (stories260K when quick), for N = 1, 2, 4 instances (1 and 2 when quick) and each routing — round robin, and session
//! affinity (a consistent hash of an `X-Session-Id` header) — with and without `--remote-tier`,
//! fresh processes serve the same sessions: each session sends its turns one after another
//! (each turn's prompt is the last one's plus a reply and a new user message), streamed, as
//! token ids, the sessions started a little apart. Recorded per configuration: the prefix-cache
//! hit rate (prompt tokens served from cache over prompt tokens, summed over the instances'
//! `/metrics`), the tokens restored from Redis, the prompt tokens prefilled, TTFT p50/p99, and
//! output tokens per second. Every streamed text must equal its solo run on a lone instance
//! (greedy), or the bench fails. Every instance gets the same host-memory tier, so that "with
//! Redis" adds only the shared tier.

mod plot;
mod procs;

use std::time::{Duration, Instant};

use anyhow::{Context, Result, anyhow, bail};
use kvlab_paged::{SessionTurn, Sessions, session_turns};
use serde::Serialize;
use serde_json::{Value, json};

use super::serve::client::{Client, Outcome, metric, stream_one};
use super::serve::server::Server;
use super::stats::Summary;
pub use procs::Routing;
use procs::{Haproxy, Redis};

pub struct ClusterOpts {
    /// The side bench's common options.
    pub side: super::Side,
    /// Instance counts to measure (default 1, 2, 4; --quick 1, 2).
    pub instances: Vec<usize>,
}

/// Tokens each turn generates.
const MAX_TOKENS: usize = 16;
/// Blocks per KV cache group every instance keeps in host memory below its pool.
const HOST_TIER_BLOCKS: usize = 64;
/// Pool blocks per instance: room for a few sessions, so that one instance alone must evict.
const POOL_BLOCKS: usize = 96;
/// Time between two sessions' first turns.
const SESSION_GAP: Duration = Duration::from_millis(40);

/// One configuration's run.
#[derive(Serialize)]
pub struct ClusterRow {
    pub instances: usize,
    pub routing: Routing,
    /// Whether the instances shared a remote tier in Redis.
    pub remote_tier: bool,
    pub requests: usize,
    /// Prompt tokens the instances looked up in their prefix caches (every admission's).
    pub prompt_tokens: u64,
    /// Of those, served from cache (pool, host memory or Redis).
    pub cached_tokens: u64,
    /// Of the cached ones, restored from Redis (computed by another instance, or by this one
    /// and evicted since).
    pub remote_tokens: u64,
    /// Blocks fetched from Redis and verified (every KV cache group's), and their bytes.
    pub remote_blocks: u64,
    pub remote_bytes: u64,
    /// Time the instances spent fetching from Redis (round trips and checks), ms in all.
    pub remote_fetch_ms: f64,
    /// prompt_tokens − cached_tokens: what was prefilled.
    pub prefill_tokens: u64,
    /// cached_tokens / prompt_tokens.
    pub hit_rate: f64,
    /// Time to first token through the load balancer, ms.
    pub ttft_ms: Summary,
    /// Output tokens per second over the run (first send to last token).
    pub output_tok_per_s: f64,
    pub wall_s: f64,
}

#[derive(Serialize)]
pub struct ClusterReport {
    pub format_version: u32,
    pub kind: String,
    pub mode: String,
    pub machine: String,
    pub model: String,
    pub sessions: usize,
    pub turns_per_session: usize,
    pub max_tokens: usize,
    pub pool_blocks: usize,
    pub host_tier_blocks: usize,
    pub load_balancer: String,
    pub redis: String,
    pub rows: Vec<ClusterRow>,
    pub plots: Vec<String>,
    pub wall_seconds: f64,
}

/// The sessions' turns (with BOS when the model has one), their solo texts, and the context
/// every instance is given (`-c`: the longest turn and its output, in whole blocks).
struct Workload {
    turns: Vec<SessionTurn>,
    prompts: Vec<Vec<u32>>,
    solo: Vec<String>,
    ctx: usize,
}

/// Runs the bench.
///
/// # Errors
/// HAProxy or Redis missing (with the command that installs it), a process that fails to
/// start, a request that fails, or a streamed text unlike its solo run.
pub fn run(o: &ClusterOpts) -> Result<ClusterReport> {
    let started = Instant::now();
    procs::require("haproxy", "haproxy")?;
    procs::require("redis-server", "redis-server")?;
    let (model, loaded) = super::side_model(&o.side.model, o.side.quick)?;
    let config = &loaded.model.config;
    let sessions = Sessions {
        num_sessions: if o.side.quick { 8 } else { 24 },
        turns_per_session: if o.side.quick { 3 } else { 4 },
        vocab_size: u32::try_from(config.vocab_size)?,
        ..Sessions::default()
    };
    let turns = session_turns(o.side.seed, sessions)?;
    let bos = config.bos_id;
    let prompts: Vec<Vec<u32>> = turns
        .iter()
        .map(|t| {
            std::iter::once(bos)
                .chain(t.prompt.iter().copied())
                .collect()
        })
        .collect();
    let instances = match (o.instances.is_empty(), o.side.quick) {
        (false, _) => o.instances.clone(),
        (true, true) => vec![1, 2],
        (true, false) => vec![1, 2, 4],
    };
    let kvlab = super::peers::build_kvlab()?;
    let rt = super::serve::client::runtime()?;
    println!(
        "kvlab bench --cluster ({} mode): {} sessions x {} turns on {model}, {} instances behind HAProxy, with and without a Redis tier, on {}",
        if o.side.quick { "quick" } else { "full" },
        sessions.num_sessions,
        sessions.turns_per_session,
        instances
            .iter()
            .map(usize::to_string)
            .collect::<Vec<_>>()
            .join(", "),
        o.side.machine
    );
    let longest = prompts.iter().map(Vec::len).max().unwrap_or(1) + MAX_TOKENS;
    let ctx = longest.next_multiple_of(16);
    let solo = {
        let flags = instance_flags(ctx, None);
        let server = Server::start(&kvlab, &model, POOL_BLOCKS, true, &flags)?;
        rt.block_on(solo_texts(&server.base, &prompts))?
    };
    let work = Workload {
        turns,
        prompts,
        solo,
        ctx,
    };
    let mut rows = Vec::new();
    for &n in &instances {
        for routing in [Routing::RoundRobin, Routing::Affinity] {
            for remote in [false, true] {
                let row = run_one(&kvlab, &model, &work, &rt, (n, routing, remote))?;
                println!(
                    "  {n} instance(s), {:16}, {:11}: hit rate {:5.1}% ({} of {} prompt tokens; {} from Redis), TTFT p50 {:.1} ms p99 {:.1} ms, {:.0} output tok/s",
                    routing.name(),
                    if remote { "Redis tier" } else { "no Redis" },
                    100.0 * row.hit_rate,
                    row.cached_tokens,
                    row.prompt_tokens,
                    row.remote_tokens,
                    row.ttft_ms.median,
                    row.ttft_ms.p99,
                    row.output_tok_per_s
                );
                rows.push(row);
            }
        }
    }
    let mut report = ClusterReport {
        format_version: 1,
        kind: "kvlab-bench-cluster".into(),
        mode: if o.side.quick { "quick" } else { "full" }.into(),
        machine: o.side.machine.clone(),
        model,
        sessions: sessions.num_sessions,
        turns_per_session: sessions.turns_per_session,
        max_tokens: MAX_TOKENS,
        pool_blocks: POOL_BLOCKS,
        host_tier_blocks: HOST_TIER_BLOCKS,
        load_balancer: version("haproxy"),
        redis: version("redis-server"),
        rows,
        plots: Vec::new(),
        wall_seconds: 0.0,
    };
    report.plots = super::plot::draw_if(o.side.plots, || plot::figure(&o.side.out, &report))?;
    report.wall_seconds = started.elapsed().as_secs_f64();
    Ok(report)
}

/// The flags every instance runs with: a context of `ctx` positions, one thread (N instances
/// share the machine), the same host tier, and the remote tier when one is given.
fn instance_flags(ctx: usize, remote: Option<&str>) -> Vec<String> {
    let mut flags: Vec<String> = vec!["-c".into(), ctx.to_string(), "-t".into(), "1".into()];
    flags.extend(["--host-tier-blocks".into(), HOST_TIER_BLOCKS.to_string()]);
    if let Some(url) = remote {
        flags.extend(["--remote-tier".to_string(), url.to_string()]);
    }
    flags
}

/// The first line `what -v` prints (its version), or "unknown".
fn version(what: &str) -> String {
    std::process::Command::new(what)
        .arg("-v")
        .output()
        .ok()
        .and_then(|o| {
            String::from_utf8_lossy(&o.stdout)
                .lines()
                .next()
                .map(str::to_string)
        })
        .unwrap_or_else(|| "unknown".into())
}

fn body(prompt: &[u32], stream: bool) -> Value {
    json!({"prompt": prompt, "max_tokens": MAX_TOKENS, "temperature": 0, "stream": stream})
}

/// Every prompt alone on one instance, not streamed: the texts every run must give.
async fn solo_texts(base: &str, prompts: &[Vec<u32>]) -> Result<Vec<String>> {
    let c = Client::connect(base).await?;
    let mut texts = Vec::new();
    for (i, p) in prompts.iter().enumerate() {
        let r = c
            .http
            .post(format!("{base}/v1/completions"))
            .json(&body(p, false))
            .send()
            .await
            .with_context(|| format!("turn {i} alone"))?;
        let status = r.status();
        let v: Value = r.json().await?;
        if !status.is_success() {
            bail!("turn {i} alone: HTTP {status}: {v}");
        }
        texts.push(v["choices"][0]["text"].as_str().unwrap_or("").to_string());
    }
    Ok(texts)
}

/// One configuration on fresh processes: `n` instances (sharing a fresh Redis when `remote`)
/// behind HAProxy routing by `routing`.
fn run_one(
    kvlab: &std::path::Path,
    model: &str,
    work: &Workload,
    rt: &tokio::runtime::Runtime,
    (n, routing, remote): (usize, Routing, bool),
) -> Result<ClusterRow> {
    let redis = if remote { Some(Redis::start()?) } else { None };
    let flags = instance_flags(work.ctx, redis.as_ref().map(|r| r.url.as_str()));
    let servers = (0..n)
        .map(|_| Server::start(kvlab, model, POOL_BLOCKS, true, &flags))
        .collect::<Result<Vec<_>>>()?;
    let bases: Vec<String> = servers.iter().map(|s| s.base.clone()).collect();
    let lb = Haproxy::start(&bases, routing)?;
    let (outcomes, wall) = rt.block_on(send_sessions(&lb.base, work))?;
    let mut ttft = Vec::new();
    let mut output_tokens = 0u64;
    for (i, outcome) in outcomes.into_iter().enumerate() {
        let t = &work.turns[i];
        match outcome {
            Outcome::Done(timing) => {
                if timing.text != work.solo[i] {
                    bail!(
                        "session {} turn {} ({n} instances, {}, remote tier {remote}): streamed {:?}, alone {:?}",
                        t.session,
                        t.turn,
                        routing.name(),
                        timing.text,
                        work.solo[i]
                    );
                }
                ttft.push(timing.ttft_ms);
            }
            Outcome::Refused => bail!("session {} turn {} refused (429/503)", t.session, t.turn),
            Outcome::Lost(e) => bail!("session {} turn {} lost: {e}", t.session, t.turn),
        }
    }
    let (mut queries, mut hits, mut from_remote) = (0.0, 0.0, 0.0);
    let (mut remote_blocks, mut remote_bytes, mut fetch_s) = (0.0, 0.0, 0.0);
    for base in &bases {
        let text = rt.block_on(async {
            let c = Client::connect(base).await?;
            c.metrics().await
        })?;
        queries += metric(&text, "vllm:prefix_cache_queries_total");
        hits += metric(&text, "vllm:prefix_cache_hits_total");
        output_tokens += metric(&text, "vllm:generation_tokens_total") as u64;
        from_remote += labelled(
            &text,
            "kvlab:prefix_cache_hits_by_tier_total{tier=\"remote\"",
        );
        remote_blocks += labelled(
            &text,
            "kvlab:kv_tier_lookups_total{result=\"hit\",tier=\"remote\"",
        );
        remote_bytes += labelled(
            &text,
            "kvlab:kv_tier_bytes_moved_total{direction=\"read\",tier=\"remote\"",
        );
        fetch_s += labelled(&text, "kvlab:kv_tier_fetch_seconds_total{tier=\"remote\"");
    }
    drop(lb);
    drop(servers);
    Ok(ClusterRow {
        instances: n,
        routing,
        remote_tier: remote,
        requests: work.prompts.len(),
        prompt_tokens: queries as u64,
        cached_tokens: hits as u64,
        remote_tokens: from_remote as u64,
        remote_blocks: remote_blocks as u64,
        remote_bytes: remote_bytes as u64,
        remote_fetch_ms: fetch_s * 1e3,
        prefill_tokens: (queries - hits) as u64,
        hit_rate: if queries > 0.0 { hits / queries } else { 0.0 },
        ttft_ms: Summary::of(&ttft),
        output_tok_per_s: output_tokens as f64 / wall.max(1e-9),
        wall_s: wall,
    })
}

/// The sum of the Prometheus lines that start with `prefix` (a metric and its first labels).
fn labelled(text: &str, prefix: &str) -> f64 {
    text.lines()
        .filter(|l| l.starts_with(prefix))
        .filter_map(|l| l.rsplit(' ').next()?.parse::<f64>().ok())
        .sum()
}

/// Every session at once (each starting `SESSION_GAP` after the last), each sending its turns
/// in order, streamed, through the load balancer at `lb`. Returns each turn's outcome, in
/// `work.turns`'s order, and the seconds from the first send to the last token.
async fn send_sessions(lb: &str, work: &Workload) -> Result<(Vec<Outcome>, f64)> {
    let c = Client::connect(lb).await?;
    let t0 = Instant::now();
    let num_sessions = work.turns.iter().map(|t| t.session + 1).max().unwrap_or(0);
    let tasks: Vec<_> = (0..num_sessions)
        .map(|s| {
            let mine: Vec<(usize, Vec<u32>)> = (work.turns.iter().enumerate())
                .filter(|(_, t)| t.session == s)
                .map(|(i, _)| (i, work.prompts[i].clone()))
                .collect();
            let (http, url) = (c.http.clone(), format!("{lb}/v1/completions"));
            tokio::spawn(async move {
                tokio::time::sleep(SESSION_GAP * s as u32).await;
                let mut out = Vec::new();
                for (i, prompt) in mine {
                    let req = (http.post(&url))
                        .header("X-Session-Id", format!("session-{s}"))
                        .json(&body(&prompt, true));
                    out.push((i, stream_one(req, t0).await));
                }
                out
            })
        })
        .collect();
    let mut outcomes: Vec<Option<Outcome>> = (0..work.turns.len()).map(|_| None).collect();
    for t in tasks {
        for (i, o) in t.await.map_err(|e| anyhow!("session task: {e}"))? {
            outcomes[i] = Some(o);
        }
    }
    let wall = t0.elapsed().as_secs_f64();
    let outcomes = outcomes
        .into_iter()
        .map(|o| o.context("a turn was never sent"))
        .collect::<Result<Vec<_>>>()?;
    Ok((outcomes, wall))
}

/// The table.
pub fn print(r: &ClusterReport) {
    println!(
        "\n{} ({}): {} sessions x {} turns, {} tokens each, pool {} blocks + {} host-tier blocks per instance",
        r.model,
        r.machine,
        r.sessions,
        r.turns_per_session,
        r.max_tokens,
        r.pool_blocks,
        r.host_tier_blocks
    );
    println!(
        "{:>9}  {:16}  {:10}  {:>8}  {:>9}  {:>9}  {:>8}  {:>8}  {:>8}",
        "instances",
        "routing",
        "tier",
        "hit rate",
        "prefilled",
        "from Redis",
        "TTFT p50",
        "TTFT p99",
        "out tok/s"
    );
    for x in &r.rows {
        println!(
            "{:>9}  {:16}  {:10}  {:>7.1}%  {:>9}  {:>9}  {:>6.1}ms  {:>6.1}ms  {:>8.0}",
            x.instances,
            x.routing.name(),
            if x.remote_tier { "Redis" } else { "none" },
            100.0 * x.hit_rate,
            x.prefill_tokens,
            x.remote_tokens,
            x.ttft_ms.median,
            x.ttft_ms.p99,
            x.output_tok_per_s
        );
    }
}

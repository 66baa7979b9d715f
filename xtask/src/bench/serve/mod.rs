//! `cargo xtask load` (also spelled `cargo xtask bench --serve`): a load test of `kvlab serve` with a real HTTP client, the method
//! of vLLM's `benchmarks/benchmark_serving.py`: the same prompts sent at several request rates
//! with Poisson arrivals (exponential gaps between sends, from a seeded RNG), and once all at
//! once (rate "inf"); every request streamed (`stream: true`), greedy (temperature 0).
//!
//! Per request it measures (all in milliseconds):
//! * TTFT, time to first token: from sending the request to the first chunk with non-empty text;
//! * TPOT, time per output token after the first: (e2e − TTFT) / (completion tokens − 1);
//! * e2e: from sending the request to `data: [DONE]`.
//!
//! Per rate it reports the requests that completed, were refused (429 or 503: the server said
//! "not now", which is allowed) and were lost (anything else: a transport error, another status,
//! an error object in the stream, a stream without `[DONE]`, or a text that differs from the
//! same prompt's text run alone); output tokens/s (completion tokens of the completed requests
//! over the time from the first send to the last `[DONE]`); TTFT/TPOT/e2e p50/p90/p99; and the
//! prefix-cache hit rate and preemptions (deltas of `/metrics` counters over the rate's window).
//! A lost request fails the run, naming the prompt.
//!
//! The reference: `kvlab batch` on the same prompts and max tokens, all arriving at step 0, with
//! the same block pool: the same scheduler, engine and sampler without HTTP. Its throughput is
//! completion tokens over its whole run (scheduling, engine steps, greedy sampling, updates; no
//! model load), as vLLM's `benchmark_throughput.py` times `LLM.generate`: the work the server
//! does too, so that the ratio server / batch is what the server adds. The strict ratio, over
//! `kvlab batch`'s engine time alone, is reported beside it. The server and `kvlab batch` never
//! run at the same time. On a shared machine the load changes from one minute to the next (a
//! factor of 3 between two runs here), so the verdict is not the sweep against one batch run:
//! after the sweep, `pairs` times the server at saturation (all at once, a fresh server) and
//! `kvlab batch` back to back, in alternating order, and the median of those pairs' ratios is
//! judged.
//!
//! The pairs run with the prefix cache off on both sides (`--no-enable-prefix-caching`), so both
//! do the same work. With it on they would not: `kvlab batch` admits every prompt in its first
//! step, where no prompt can hit another's blocks (they are computed in that same step), while
//! the server admits the first arrival alone and the rest hit its opening (0% against 46% of
//! prompt tokens with 32 requests here), and the ratio would flatter the server.
//!
//! The prompt set is fixed: TinyStories-like openings shared by several prompts (so the prefix
//! cache has something to share) and different continuations, combined and ordered by a seeded
//! RNG. The solo runs (the reference texts) have a server of their own; each rate then gets a
//! fresh `kvlab serve` process, so it starts, like `kvlab batch`, from a cold prefix cache: its
//! hits are the prompts sharing openings within the rate. The pool holds every request at once
//! on both sides (as `kvlab batch` sizes it by default), so preemptions should be 0.
//!
//! Files in data-flow order: this one (options, the plan, the run), [`prompts`], [`server`] (a
//! `kvlab serve` process), [`client`] (streamed requests, their timings, a rate's summary),
//! [`batch`] (the `kvlab batch` reference), [`print`] (the table), [`plot`] (the figure).

mod batch;
pub(super) mod client;
pub mod peer;
mod plot;
mod print;
mod prompts;
pub(super) mod server;

use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use anyhow::{Context, Result, bail};
use indicatif::{ProgressBar, ProgressStyle};
use serde::Serialize;

use kvlab_cli::args::usize_in;

use super::machine;
use super::stats::Summary;
use crate::paths;

use batch::run_batch;
use client::Client;
pub use print::print;
use prompts::{pool_blocks, prompts};
use server::Server;

/// The goal: the server's best throughput at least this fraction of `kvlab batch`'s.
pub const GOAL_RATIO: f64 = 0.90;

/// Tokens per KV block, on both sides (vLLM's and kvlab's default).
const BLOCK_SIZE: usize = 16;

/// `cargo xtask load`'s options (`cargo xtask bench --serve` forwards its own).
#[derive(clap::Args)]
#[command(
    after_help = "env: KVLAB_BIN (the kvlab binary to measure; default: target/release/kvlab, \
                  built beforehand)"
)]
pub struct LoadArgs {
    /// CI smoke run: stories260K, few requests and rates, one pair
    #[arg(long)]
    pub quick: bool,
    /// The model [default: stories15M-shape, --quick: stories260K]
    #[arg(long, value_name = "NAME")]
    pub model: Option<String>,
    /// Requests per rate [default: 32, --quick 6]
    #[arg(long, value_name = "N", value_parser = usize_in(1, 100_000))]
    pub requests: Option<usize>,
    /// Completion tokens per request [default: 64, --quick 24]
    #[arg(long, value_name = "N", value_parser = usize_in(1, 1 << 20))]
    pub max_tokens: Option<usize>,
    /// A request rate in requests/s, or "inf" for all at once (repeatable)
    /// [default: 4 8 16 32 64 inf (the knee of 32 requests on 2 cores), --quick 8 inf]
    #[arg(long = "rate", value_name = "REQ/S", value_parser = parse_rate)]
    pub rates: Vec<f64>,
    /// Back-to-back pairs (all requests at once on the server, then kvlab batch, or the other
    /// way round) whose median ratio is the throughput verdict [default: 7, --quick 1]
    #[arg(long, value_name = "N", value_parser = usize_in(1, 1000))]
    pub pairs: Option<usize>,
    /// Seed of the prompt order and the arrival times
    #[arg(long, value_name = "N", default_value_t = 0)]
    pub seed: u64,
    /// Where serve.json and the plots go [default: target/kvlab-bench]
    #[arg(long, value_name = "DIR")]
    pub out: Option<PathBuf>,
    /// Skip the SVG/PNG plots
    #[arg(long)]
    pub no_plots: bool,
    /// A note to store in serve.json (repeatable), e.g. how busy the machine was
    #[arg(long = "note", value_name = "TEXT")]
    pub notes: Vec<String>,
    /// Instead: kvlab serve against this peer's server under the same load, same GGUF, same
    /// threads, interleaved (default model gemma-3-270m; a model without a GGUF is exported as
    /// one); writes serve_peer.json and serve_peer.svg/.png
    #[arg(long, value_enum, value_name = "PEER")]
    pub peer: Option<Peer>,
    /// --peer: threads of each server [default: physical cores]
    #[arg(short = 't', long, value_name = "N", value_parser = usize_in(1, 1024))]
    pub threads: Option<usize>,
    /// --peer: concurrent streams, requests sent at once (repeatable) [default: 1 8 16 32 64]
    #[arg(long = "streams", value_name = "N", value_parser = usize_in(1, 4096))]
    pub streams: Vec<usize>,
    /// --peer: kvlab serve's `--activations`: f32 (kvlab's reference path) or q8 (8-bit
    /// activations and integer dot products, as llama.cpp computes)
    #[arg(long, default_value_t = kvlab_model::Activations::F32,
          value_parser = kvlab_cli::args::activations())]
    pub activations: kvlab_model::Activations,
}

/// A peer's server for `--peer`.
#[derive(Clone, Copy, Debug, clap::ValueEnum)]
pub enum Peer {
    /// llama.cpp's `llama-server` (KVLAB_LLAMA_SERVER, or on the PATH)
    LlamaServer,
}

/// `--rate`: a positive number of requests/s, or "inf".
///
/// # Errors
/// Anything else, quoted.
pub fn parse_rate(s: &str) -> Result<f64, String> {
    if s.eq_ignore_ascii_case("inf") {
        return Ok(f64::INFINITY);
    }
    match s.parse::<f64>() {
        Ok(r) if r > 0.0 && r.is_finite() => Ok(r),
        _ => Err(format!(
            "{s:?} is not a positive rate (requests/s) or \"inf\""
        )),
    }
}

/// `cargo xtask load`: the load test, its table, serve.json and the plot.
///
/// # Errors
/// A server that does not start, a lost request, an unwritable output folder.
pub fn command(a: &LoadArgs) -> Result<()> {
    let m = machine::detect();
    let out = a.out.clone().unwrap_or_else(paths::bench_out);
    std::fs::create_dir_all(&out).with_context(|| format!("creating {}", out.display()))?;
    let s = ServeOpts {
        quick: a.quick,
        model: a.model.clone(),
        requests: a.requests,
        max_tokens: a.max_tokens,
        rates: a.rates.clone(),
        pairs: a.pairs,
        seed: a.seed,
        out: out.clone(),
        plots: !a.no_plots,
        notes: a.notes.clone(),
        machine: machine::line(&m),
        threads: a.threads.unwrap_or_else(kvlab_cpu::threads::physical_cores),
        streams: a.streams.clone(),
        activations: a.activations,
    };
    if let Some(Peer::LlamaServer) = a.peer {
        let report = peer::run(&s, None)?;
        peer::print(&report);
        let plots = (report.plots.len(), report.wall_seconds);
        return write_report(&out, "serve_peer.json", &report, plots);
    }
    let report = run(&s)?;
    print(&report);
    let plots = (report.plots.len(), report.wall_seconds);
    write_report(&out, "serve.json", &report, plots)
}

/// Writes `report` as `out/file` and says so, with its `plots` count and wall time (seconds).
fn write_report(
    out: &Path,
    file: &str,
    report: &impl Serialize,
    (plots, wall_s): (usize, f64),
) -> Result<()> {
    let json = out.join(file);
    std::fs::write(&json, serde_json::to_string_pretty(report)?)?;
    println!(
        "wrote {} and {plots} plots in {} ({wall_s:.0} s); schema: {}",
        json.display(),
        out.display(),
        paths::bench_schema().display()
    );
    Ok(())
}

/// What `cargo xtask load` was asked for, defaults not yet applied.
pub struct ServeOpts {
    pub quick: bool,
    /// Model name (default: stories15M-shape, or stories260K with `quick`).
    pub model: Option<String>,
    /// Prompts per rate (default: 32, quick 6).
    pub requests: Option<usize>,
    /// Completion tokens per request (default: 64, quick 24).
    pub max_tokens: Option<usize>,
    /// Request rates in requests/s, `f64::INFINITY` for all at once (default per mode).
    pub rates: Vec<f64>,
    /// Back-to-back pairs (server at saturation, `kvlab batch`) for the ratio (default: 7,
    /// quick 1).
    pub pairs: Option<usize>,
    pub seed: u64,
    pub out: PathBuf,
    pub plots: bool,
    pub notes: Vec<String>,
    pub machine: String,
    /// `--peer`: threads of each server.
    pub threads: usize,
    /// `--peer`: concurrent streams (default [`peer::STREAMS`]).
    pub streams: Vec<usize>,
    /// `--peer`: kvlab serve's `--activations`.
    pub activations: kvlab_model::Activations,
}

/// One prompt of the set, and its reference completion (run alone).
#[derive(Clone, Debug, Serialize)]
pub struct PromptRef {
    pub index: usize,
    pub text: String,
    pub prompt_tokens: usize,
    pub completion_tokens: usize,
    pub finish_reason: String,
    /// The greedy completion of the prompt run alone; every completion under load must equal it.
    pub completion: String,
}

/// One request rate's results. Times in ms, throughput in tokens/s.
#[derive(Debug, Serialize)]
pub struct RateRow {
    /// "inf" (all at once) or the rate in requests/s.
    pub rate: String,
    /// Requests/s; `null` for "inf".
    pub rate_req_per_s: Option<f64>,
    pub ok: usize,
    /// Answered 429 or 503 (not an error: the client may retry).
    pub refused: usize,
    /// Failed or wrong (always 0 in a written report: a lost request fails the run).
    pub lost: usize,
    /// Completed with a text other than its solo run's: counted where the run does not fail on
    /// it (a peer's server, `--peer`); 0 for kvlab's load test, where it is lost.
    pub differs_from_solo: usize,
    /// From the first send to the last `[DONE]`, seconds.
    pub duration_s: f64,
    /// Completion tokens of the completed requests.
    pub output_tokens: usize,
    /// output_tokens / duration_s.
    pub output_tok_per_s: f64,
    /// Completed requests / duration_s.
    pub req_per_s: f64,
    pub ttft_ms: Summary,
    pub tpot_ms: Summary,
    pub e2e_ms: Summary,
    /// Δ vllm:prefix_cache_hits_total / Δ vllm:prefix_cache_queries_total over the rate's window
    /// (`null` when nothing was queried).
    pub prefix_cache_hit_rate: Option<f64>,
    pub prefix_cache_queries: f64,
    pub prefix_cache_hits: f64,
    /// Δ vllm:num_preemptions_total.
    pub preemptions: f64,
}

/// `kvlab batch` on the same prompts: the reference throughput.
#[derive(Debug, Serialize)]
pub struct BatchRef {
    /// The command as run (prompts elided).
    pub command: String,
    /// Engine time of the run (its steps only), seconds.
    pub engine_s: f64,
    /// The whole run: engine time plus scheduling, sampling and updates, seconds.
    pub wall_s: f64,
    /// Completion tokens (the solo runs' counts: greedy, so the same completions).
    pub output_tokens: usize,
    /// output_tokens / wall_s.
    pub output_tok_per_s: f64,
    /// output_tokens / engine_s.
    pub output_tok_per_s_engine: f64,
    /// Every token computed (prompt and completion) per engine second, as `kvlab batch` prints.
    pub tokens_per_s_all: f64,
    pub preemptions: f64,
    /// Prompt tokens served by the prefix cache.
    pub prefix_cache_hits: f64,
    /// Completions whose text (after the prompt) equals the solo text.
    pub same_text: usize,
}

/// One back-to-back pair at saturation: every request at once on a fresh server, and `kvlab
/// batch`, in alternating order, so that a change in the machine's load hits both sides of the
/// ratio alike (as `--peers` interleaves its reps).
#[derive(Debug, Serialize)]
pub struct Pair {
    pub server_first: bool,
    /// Output tokens/s of the server (all at once).
    pub server_output_tok_per_s: f64,
    /// Output tokens/s of `kvlab batch` over its whole run.
    pub batch_output_tok_per_s: f64,
    /// Output tokens/s of `kvlab batch` over its engine time alone.
    pub batch_engine_output_tok_per_s: f64,
    /// server / batch: what the goal is judged on.
    pub ratio: f64,
    /// server / batch over its engine time (stricter: the server is charged for its sampling
    /// and scheduling, `kvlab batch` is not).
    pub ratio_engine: f64,
}

#[derive(Debug, Serialize)]
pub struct ServeReport {
    pub format_version: u32,
    pub kind: String,
    pub mode: String,
    pub machine: String,
    pub notes: Vec<String>,
    pub model: String,
    pub server: String,
    pub requests: usize,
    pub max_tokens: usize,
    pub num_blocks: usize,
    pub block_size: usize,
    pub seed: u64,
    pub prompts: Vec<PromptRef>,
    pub rates: Vec<RateRow>,
    /// The first `kvlab batch` run (of the first pair).
    pub batch: BatchRef,
    /// Median output tokens/s of the pairs' `kvlab batch` runs (whole runs).
    pub batch_output_tok_per_s_median: f64,
    pub pairs: Vec<Pair>,
    /// The median of the pairs' ratios: the number the goal is judged on.
    pub paired_ratio_median: f64,
    /// The median of the pairs' `ratio_engine`.
    pub paired_ratio_engine_median: f64,
    pub goal_ratio: f64,
    pub wall_seconds: f64,
    pub plots: Vec<String>,
}

/// The mode's defaults, with the options applied.
struct Plan {
    model: String,
    requests: usize,
    max_tokens: usize,
    rates: Vec<f64>,
    pairs: usize,
}

impl Plan {
    fn of(o: &ServeOpts) -> Plan {
        let (model, requests, max_tokens, rates, pairs) = if o.quick {
            ("stories260K", 6, 24, vec![8.0, f64::INFINITY], 1)
        } else {
            (
                "stories15M-shape",
                32,
                64,
                vec![4.0, 8.0, 16.0, 32.0, 64.0, f64::INFINITY],
                7,
            )
        };
        Plan {
            model: o.model.clone().unwrap_or_else(|| model.into()),
            requests: o.requests.unwrap_or(requests),
            max_tokens: o.max_tokens.unwrap_or(max_tokens),
            rates: if o.rates.is_empty() {
                rates
            } else {
                o.rates.clone()
            },
            pairs: o.pairs.unwrap_or(pairs),
        }
    }
}

pub fn run(o: &ServeOpts) -> Result<ServeReport> {
    let started = Instant::now();
    let plan = Plan::of(o);
    let kvlab = super::peers::build_kvlab()?;
    let texts = prompts(plan.requests, o.seed);
    let num_blocks = pool_blocks(&texts, plan.max_tokens);
    println!(
        "kvlab bench --serve ({} mode): {} requests of {} tokens per rate, rates {} req/s, {} on {}",
        if o.quick { "quick" } else { "full" },
        plan.requests,
        plan.max_tokens,
        plan.rates
            .iter()
            .map(|r| rate_name(*r))
            .collect::<Vec<_>>()
            .join(", "),
        plan.model,
        o.machine
    );
    let bar = progress((plan.rates.len() + 1 + plan.pairs) as u64 * plan.requests as u64);
    let rt = client::runtime()?;
    // The references on a server of their own; then a fresh server per rate, so every rate (and
    // `kvlab batch`) starts from a cold prefix cache and a new process.
    bar.set_message("solo runs (reference texts)");
    let server = Server::start(&kvlab, &plan.model, num_blocks, true, &[])?;
    let server_line = server.banner.clone();
    let refs = rt.block_on(async {
        let c = Client::connect(&server.base).await?;
        c.solo_all(&texts, plan.max_tokens, &plan.model, &bar).await
    })?;
    drop(server);
    let fresh = Fresh {
        kvlab: &kvlab,
        plan: &plan,
        refs: &refs,
        num_blocks,
        seed: o.seed,
        rt: &rt,
        bar: &bar,
    };
    let mut rates = Vec::new();
    for &rate in &plan.rates {
        bar.set_message(format!("rate {} req/s", rate_name(rate)));
        rates.push(fresh.rate(rate, true)?);
    }
    let (pairs, batches) = saturation_pairs(&fresh)?;
    bar.finish_and_clear();
    let batch_median = Summary::of(
        &batches
            .iter()
            .map(|b| b.output_tok_per_s)
            .collect::<Vec<_>>(),
    )
    .median;
    let paired = Summary::of(&pairs.iter().map(|p| p.ratio).collect::<Vec<_>>()).median;
    let paired_engine =
        Summary::of(&pairs.iter().map(|p| p.ratio_engine).collect::<Vec<_>>()).median;
    let batch = batches
        .into_iter()
        .next()
        .context("no kvlab batch run (--pairs 0?)")?;
    let mut rep = ServeReport {
        format_version: 2,
        kind: "kvlab-bench-serve".into(),
        mode: if o.quick { "quick" } else { "full" }.into(),
        machine: o.machine.clone(),
        notes: o.notes.clone(),
        model: plan.model.clone(),
        server: server_line,
        requests: plan.requests,
        max_tokens: plan.max_tokens,
        num_blocks,
        block_size: BLOCK_SIZE,
        seed: o.seed,
        prompts: refs,
        rates,
        batch,
        batch_output_tok_per_s_median: batch_median,
        pairs,
        paired_ratio_median: paired,
        paired_ratio_engine_median: paired_engine,
        goal_ratio: GOAL_RATIO,
        wall_seconds: 0.0,
        plots: Vec::new(),
    };
    if o.plots {
        rep.plots = plot::report(&rep, &o.out)?;
    }
    rep.wall_seconds = started.elapsed().as_secs_f64();
    Ok(rep)
}

/// What a run on a fresh server needs.
struct Fresh<'a> {
    kvlab: &'a Path,
    plan: &'a Plan,
    refs: &'a [PromptRef],
    num_blocks: usize,
    seed: u64,
    rt: &'a tokio::runtime::Runtime,
    bar: &'a ProgressBar,
}

impl Fresh<'_> {
    /// One rate on a freshly started server (a cold prefix cache, as `kvlab batch` has; or none
    /// without `prefix_caching`).
    fn rate(&self, rate: f64, prefix_caching: bool) -> Result<RateRow> {
        let server = Server::start(
            self.kvlab,
            &self.plan.model,
            self.num_blocks,
            prefix_caching,
            &[],
        )?;
        self.rt.block_on(async {
            let c = Client::connect(&server.base).await?;
            c.sweep(rate, self.refs, self.plan, self.seed, self.bar, true)
                .await
        })
    }
}

/// The pairs at saturation, server and `kvlab batch` back to back in alternating order, the
/// prefix cache off on both sides (see the module's doc); the batch runs in run order.
fn saturation_pairs(f: &Fresh) -> Result<(Vec<Pair>, Vec<BatchRef>)> {
    let (mut pairs, mut batches) = (Vec::new(), Vec::new());
    for i in 0..f.plan.pairs {
        f.bar.set_message(format!(
            "saturation pair {} of {}: all at once vs kvlab batch",
            i + 1,
            f.plan.pairs
        ));
        let server_first = i % 2 == 0;
        let (server, batch) = if server_first {
            let s = f.rate(f64::INFINITY, false)?;
            (s, run_batch(f.kvlab, f.plan, f.refs, f.num_blocks)?)
        } else {
            let b = run_batch(f.kvlab, f.plan, f.refs, f.num_blocks)?;
            (f.rate(f64::INFINITY, false)?, b)
        };
        if server.prefix_cache_hits != 0.0 || batch.prefix_cache_hits != 0.0 {
            bail!(
                "pair {}: the prefix cache served {} prompt tokens on the server and {} in kvlab \
                 batch with --no-enable-prefix-caching: the two sides did not do the same work",
                i + 1,
                server.prefix_cache_hits,
                batch.prefix_cache_hits
            );
        }
        pairs.push(Pair {
            server_first,
            server_output_tok_per_s: server.output_tok_per_s,
            batch_output_tok_per_s: batch.output_tok_per_s,
            batch_engine_output_tok_per_s: batch.output_tok_per_s_engine,
            ratio: server.output_tok_per_s / batch.output_tok_per_s,
            ratio_engine: server.output_tok_per_s / batch.output_tok_per_s_engine,
        });
        batches.push(batch);
    }
    Ok((pairs, batches))
}

fn rate_name(r: f64) -> String {
    if r.is_finite() {
        format!("{r}")
    } else {
        "inf".into()
    }
}

fn progress(len: u64) -> ProgressBar {
    let bar = ProgressBar::new(len);
    bar.set_style(
        ProgressStyle::with_template("{spinner} serve [{bar:30}] {pos}/{len} {elapsed} {wide_msg}")
            .expect("template")
            .progress_chars("=> "),
    );
    bar.enable_steady_tick(Duration::from_millis(200));
    bar
}

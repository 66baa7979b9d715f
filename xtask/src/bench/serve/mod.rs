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

mod plot;

use std::io::{BufRead, BufReader};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use anyhow::{Context, Result, anyhow, bail};
use indicatif::{ProgressBar, ProgressStyle};
use rand::{Rng, SeedableRng};
use rand_chacha::ChaCha8Rng;
use serde::Serialize;
use serde_json::{Value, json};

use kvlab_cli::args::usize_in;

use super::machine;
use super::stats::Summary;
use crate::paths::{self, workspace_root};

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
    };
    let report = run(&s)?;
    print(&report);
    let json = out.join("serve.json");
    std::fs::write(&json, serde_json::to_string_pretty(&report)?)?;
    println!(
        "wrote {} and {} plots in {} ({:.0} s); schema: {}",
        json.display(),
        report.plots.len(),
        out.display(),
        report.wall_seconds,
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
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .context("starting the client's tokio runtime")?;
    // The references on a server of their own; then a fresh server per rate, so every rate (and
    // `kvlab batch`) starts from a cold prefix cache and a new process.
    bar.set_message("solo runs (reference texts)");
    let server = Server::start(&kvlab, &plan.model, num_blocks, true)?;
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
        )?;
        self.rt.block_on(async {
            let c = Client::connect(&server.base).await?;
            c.sweep(rate, self.refs, self.plan, self.seed, self.bar)
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

// ---------------------------------------------------------------------------------------------
// The prompts

/// Openings shared by several prompts: each is longer than a block of the Llama 2 tokenizer's
/// tokens, so a prompt that repeats one can take whole blocks from the prefix cache.
const OPENINGS: [&str; 4] = [
    "Once upon a time, in a small town near the sea, there lived a kind old man who had a little \
     boat. Every morning he went out on the water to catch fish for the children of the town.",
    "One day, a little girl named Lily went to the park with her mom. The sun was shining and the \
     birds were singing in the tall trees.",
    "Tom was a big brown dog who loved to play in the garden. He liked to dig holes and chase the \
     red ball that his friend Sam threw for him.",
    "There was a tiny bird who lived in a nest at the top of an old tree. She wanted to fly far \
     away and see the world.",
];

/// Continuations, one sentence each.
const CONTINUATIONS: [&str; 8] = [
    " One day,",
    " But then something strange happened.",
    " Suddenly, they heard a loud noise.",
    " The next morning,",
    " They were very happy and",
    " She looked around and saw",
    " He did not know what to do, so",
    " It was the best day ever because",
];

/// `n` prompts: openings × continuations in a seeded order, repeating the combinations if `n`
/// is larger than their number.
fn prompts(n: usize, seed: u64) -> Vec<String> {
    let mut all: Vec<String> = OPENINGS
        .iter()
        .flat_map(|o| CONTINUATIONS.iter().map(move |c| format!("{o}{c}")))
        .collect();
    let mut rng = ChaCha8Rng::seed_from_u64(seed);
    // Fisher–Yates with the seeded RNG.
    for i in (1..all.len()).rev() {
        all.swap(i, rng.random_range(0..=i));
    }
    (0..n).map(|i| all[i % all.len()].clone()).collect()
}

/// Blocks for every request at once on both sides: a prompt has at most one token per byte
/// plus BOS (byte fallback), then `max_tokens`; one block spare, as `kvlab batch` keeps.
fn pool_blocks(texts: &[String], max_tokens: usize) -> usize {
    texts
        .iter()
        .map(|t| (t.len() + 1 + max_tokens).div_ceil(BLOCK_SIZE))
        .sum::<usize>()
        + 1
}

// ---------------------------------------------------------------------------------------------
// The server

/// A running `kvlab serve`, killed when dropped.
struct Server {
    child: Child,
    base: String,
    banner: String,
}

impl Server {
    /// Starts `kvlab serve` on a free port and reads its address from the banner on stderr.
    fn start(kvlab: &Path, model: &str, num_blocks: usize, prefix_caching: bool) -> Result<Server> {
        let mut child = Command::new(kvlab)
            .args(["serve", "-m", model, "--port", "0"])
            .args(["--num-blocks", &num_blocks.to_string()])
            .args(["--block-size", &BLOCK_SIZE.to_string()])
            .args((!prefix_caching).then_some("--no-enable-prefix-caching"))
            .current_dir(workspace_root())
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::piped())
            .spawn()
            .with_context(|| format!("starting {} serve", kvlab.display()))?;
        let stderr = child.stderr.take().expect("piped");
        let (tx, rx) = std::sync::mpsc::channel();
        let log = Arc::new(Mutex::new(Vec::<String>::new()));
        let log2 = log.clone();
        // Reads stderr to the end (so the server never blocks on a full pipe), sends the banner.
        std::thread::spawn(move || {
            for line in BufReader::new(stderr).lines().map_while(Result::ok) {
                if line.contains(" at http://") {
                    let _ = tx.send(line.clone());
                }
                log2.lock().expect("log").push(line);
            }
        });
        let mut server = Server {
            child,
            base: String::new(),
            banner: String::new(),
        };
        let banner = rx.recv_timeout(Duration::from_secs(300)).map_err(|_| {
            let tail = log.lock().expect("log").join("\n");
            anyhow!("kvlab serve printed no address within 300 s; its stderr:\n{tail}")
        })?;
        let addr = banner
            .rsplit(" at ")
            .next()
            .context("banner without an address")?
            .trim();
        server.base = addr.to_string();
        server.banner = banner.clone();
        Ok(server)
    }
}

impl Drop for Server {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

// ---------------------------------------------------------------------------------------------
// The client

struct Client {
    http: reqwest::Client,
    base: String,
}

/// How one streamed request ended.
enum Outcome {
    Done(Timing),
    /// 429 or 503.
    Refused,
    Lost(String),
}

/// A completed streamed request: times from its send, in ms.
struct Timing {
    ttft_ms: f64,
    e2e_ms: f64,
    text: String,
    /// Since the rate's start, seconds.
    end_s: f64,
}

impl Client {
    /// A client of the server at `base`, once its `/health` answers 200.
    async fn connect(base: &str) -> Result<Client> {
        let c = Client {
            http: reqwest::Client::builder()
                .timeout(Duration::from_secs(900))
                .build()?,
            base: base.trim_end_matches('/').to_string(),
        };
        c.wait_healthy(Duration::from_secs(300)).await?;
        Ok(c)
    }

    async fn wait_healthy(&self, limit: Duration) -> Result<()> {
        let t = Instant::now();
        loop {
            if let Ok(r) = self.http.get(format!("{}/health", self.base)).send().await
                && r.status().is_success()
            {
                return Ok(());
            }
            if t.elapsed() > limit {
                bail!("{}/health did not answer 200 within {limit:?}", self.base);
            }
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
    }

    fn body(model: &str, prompt: &str, max_tokens: usize, stream: bool) -> Value {
        json!({
            "model": model,
            "prompt": prompt,
            "max_tokens": max_tokens,
            "temperature": 0.0,
            "stream": stream,
        })
    }

    /// Every prompt alone, one after another, not streamed: the reference texts and the token
    /// counts (`usage`).
    async fn solo_all(
        &self,
        texts: &[String],
        max_tokens: usize,
        model: &str,
        bar: &ProgressBar,
    ) -> Result<Vec<PromptRef>> {
        let mut refs = Vec::new();
        for (i, t) in texts.iter().enumerate() {
            let r = self
                .http
                .post(format!("{}/v1/completions", self.base))
                .json(&Self::body(model, t, max_tokens, false))
                .send()
                .await
                .with_context(|| format!("prompt {i} alone"))?;
            let status = r.status();
            let v: Value = r
                .json()
                .await
                .with_context(|| format!("prompt {i} alone"))?;
            if !status.is_success() {
                bail!("prompt {i} alone: HTTP {status}: {v}");
            }
            let choice = &v["choices"][0];
            refs.push(PromptRef {
                index: i,
                text: t.clone(),
                prompt_tokens: v["usage"]["prompt_tokens"].as_u64().unwrap_or(0) as usize,
                completion_tokens: v["usage"]["completion_tokens"]
                    .as_u64()
                    .with_context(|| format!("prompt {i} alone: no usage in {v}"))?
                    as usize,
                finish_reason: choice["finish_reason"].as_str().unwrap_or("").into(),
                completion: choice["text"].as_str().unwrap_or("").into(),
            });
            bar.inc(1);
        }
        Ok(refs)
    }

    /// `/metrics`, as Prometheus text.
    async fn metrics(&self) -> Result<String> {
        Ok(self
            .http
            .get(format!("{}/metrics", self.base))
            .send()
            .await?
            .text()
            .await?)
    }

    /// One rate: every prompt sent at its Poisson arrival time, streamed; the results checked
    /// against the solo texts and summarised.
    async fn sweep(
        &self,
        rate: f64,
        refs: &[PromptRef],
        plan: &Plan,
        seed: u64,
        bar: &ProgressBar,
    ) -> Result<RateRow> {
        let before = self.metrics().await?;
        let arrivals = arrival_times(refs.len(), rate, seed);
        let t0 = Instant::now();
        let tasks: Vec<_> = refs
            .iter()
            .zip(arrivals)
            .map(|(r, at)| {
                let body = Self::body(&plan.model, &r.text, plan.max_tokens, true);
                let req = self
                    .http
                    .post(format!("{}/v1/completions", self.base))
                    .json(&body);
                let bar = bar.clone();
                tokio::spawn(async move {
                    tokio::time::sleep_until((t0 + Duration::from_secs_f64(at)).into()).await;
                    let out = stream_one(req, t0).await;
                    bar.inc(1);
                    out
                })
            })
            .collect();
        let mut outcomes = Vec::new();
        for t in tasks {
            outcomes.push(t.await.map_err(|e| anyhow!("client task: {e}"))?);
        }
        let after = self.metrics().await?;
        summarise(rate, refs, outcomes, &before, &after)
    }
}

/// Send times in seconds from the start: exponential gaps of mean 1/rate (a Poisson process, as
/// benchmark_serving.py's `np.random.exponential(1.0 / request_rate)`), the first request at 0;
/// all at 0 for an infinite rate.
fn arrival_times(n: usize, rate: f64, seed: u64) -> Vec<f64> {
    if !rate.is_finite() {
        return vec![0.0; n];
    }
    let mut rng = ChaCha8Rng::seed_from_u64(seed ^ rate.to_bits());
    let mut t = 0.0;
    (0..n)
        .map(|i| {
            if i > 0 {
                // Inverse transform: −ln(1 − U) / rate, U uniform in [0, 1).
                let u: f64 = rng.random();
                t += -(1.0 - u).ln() / rate;
            }
            t
        })
        .collect()
}

/// Sends one streamed request and reads its server-sent events to `data: [DONE]`.
async fn stream_one(req: reqwest::RequestBuilder, t0: Instant) -> Outcome {
    let sent = Instant::now();
    let mut resp = match req.send().await {
        Ok(r) => r,
        Err(e) => return Outcome::Lost(format!("send: {e}")),
    };
    let status = resp.status().as_u16();
    if status == 429 || status == 503 {
        return Outcome::Refused;
    }
    if status != 200 {
        let body = resp.text().await.unwrap_or_default();
        return Outcome::Lost(format!("HTTP {status}: {body}"));
    }
    let mut sse = Sse::default();
    loop {
        match resp.chunk().await {
            Ok(Some(bytes)) => {
                if let Err(e) = sse.feed(&bytes) {
                    return Outcome::Lost(e);
                }
                if sse.done {
                    break;
                }
            }
            Ok(None) => break,
            Err(e) => return Outcome::Lost(format!("reading the stream: {e}")),
        }
    }
    if !sse.done {
        return Outcome::Lost("the stream ended before data: [DONE]".into());
    }
    let now = Instant::now();
    Outcome::Done(Timing {
        ttft_ms: sse.first.map_or(f64::NAN, |f| ms(f - sent)),
        e2e_ms: ms(now - sent),
        text: sse.text,
        end_s: (now - t0).as_secs_f64(),
    })
}

fn ms(d: Duration) -> f64 {
    d.as_secs_f64() * 1e3
}

/// A server-sent event stream being read: the text so far, when its first text came.
#[derive(Default)]
struct Sse {
    /// Bytes after the last complete line.
    pending: Vec<u8>,
    text: String,
    first: Option<Instant>,
    done: bool,
}

impl Sse {
    /// Takes the next bytes; handles every complete `data:` line. An error object in the stream
    /// is an error.
    fn feed(&mut self, bytes: &[u8]) -> Result<(), String> {
        self.pending.extend_from_slice(bytes);
        while let Some(nl) = self.pending.iter().position(|&b| b == b'\n') {
            let line: Vec<u8> = self.pending.drain(..=nl).collect();
            let line = String::from_utf8(line).map_err(|e| format!("not UTF-8: {e}"))?;
            let Some(data) = line.trim_end().strip_prefix("data:") else {
                continue;
            };
            let data = data.trim_start();
            if data == "[DONE]" {
                self.done = true;
                return Ok(());
            }
            let v: Value =
                serde_json::from_str(data).map_err(|e| format!("bad chunk {data:?}: {e}"))?;
            if let Some(err) = v.get("error") {
                return Err(format!("error in the stream: {err}"));
            }
            let text = v["choices"][0]["text"].as_str().unwrap_or("");
            if !text.is_empty() && self.first.is_none() {
                self.first = Some(Instant::now());
            }
            self.text.push_str(text);
        }
        Ok(())
    }
}

/// Prometheus text: the sum of `name`'s samples (any labels).
fn metric(text: &str, name: &str) -> f64 {
    text.lines()
        .filter(|l| !l.starts_with('#'))
        .filter(|l| {
            l.strip_prefix(name)
                .is_some_and(|rest| rest.starts_with('{') || rest.starts_with(' '))
        })
        .filter_map(|l| l.rsplit(' ').next()?.parse::<f64>().ok())
        .sum()
}

/// One rate's outcomes checked and summarised; a lost request fails with every loss listed.
fn summarise(
    rate: f64,
    refs: &[PromptRef],
    outcomes: Vec<Outcome>,
    before: &str,
    after: &str,
) -> Result<RateRow> {
    let (mut ttft, mut tpot, mut e2e) = (Vec::new(), Vec::new(), Vec::new());
    let (mut refused, mut lost, mut tokens, mut end) = (0, Vec::new(), 0, 0.0f64);
    for (r, o) in refs.iter().zip(outcomes) {
        match o {
            Outcome::Refused => refused += 1,
            Outcome::Lost(why) => lost.push(format!("prompt {}: {why}", r.index)),
            Outcome::Done(t) if t.text != r.completion => lost.push(format!(
                "prompt {}: text differs from its solo run\n  solo:   {:?}\n  loaded: {:?}",
                r.index, r.completion, t.text
            )),
            Outcome::Done(t) => {
                ttft.push(t.ttft_ms);
                e2e.push(t.e2e_ms);
                if r.completion_tokens > 1 {
                    tpot.push((t.e2e_ms - t.ttft_ms) / (r.completion_tokens - 1) as f64);
                }
                tokens += r.completion_tokens;
                end = end.max(t.end_s);
            }
        }
    }
    if !lost.is_empty() {
        bail!(
            "rate {} req/s: {} of {} requests LOST:\n{}",
            rate_name(rate),
            lost.len(),
            refs.len(),
            lost.join("\n")
        );
    }
    let delta = |name: &str| metric(after, name) - metric(before, name);
    let queries = delta("vllm:prefix_cache_queries_total");
    let hits = delta("vllm:prefix_cache_hits_total");
    let ok = e2e.len();
    Ok(RateRow {
        rate: rate_name(rate),
        rate_req_per_s: rate.is_finite().then_some(rate),
        ok,
        refused,
        lost: 0,
        duration_s: end,
        output_tokens: tokens,
        output_tok_per_s: tokens as f64 / end.max(1e-9),
        req_per_s: ok as f64 / end.max(1e-9),
        ttft_ms: Summary::of(&ttft),
        tpot_ms: Summary::of(&tpot),
        e2e_ms: Summary::of(&e2e),
        prefix_cache_hit_rate: (queries > 0.0).then(|| hits / queries),
        prefix_cache_queries: queries,
        prefix_cache_hits: hits,
        preemptions: delta("vllm:num_preemptions_total"),
    })
}

// ---------------------------------------------------------------------------------------------
// The reference: kvlab batch

/// `kvlab batch` on the same prompts, all at step 0, the same pool, no prefix cache; its JSON
/// stats (stderr).
fn run_batch(kvlab: &Path, plan: &Plan, refs: &[PromptRef], num_blocks: usize) -> Result<BatchRef> {
    let fixed = [
        "batch".to_string(),
        "-m".into(),
        plan.model.clone(),
        "-n".into(),
        plan.max_tokens.to_string(),
        "--arrival-gap".into(),
        "0".into(),
        "--num-blocks".into(),
        num_blocks.to_string(),
        "--block-size".into(),
        BLOCK_SIZE.to_string(),
        "--no-enable-prefix-caching".into(),
        "--json".into(),
    ];
    let mut cmd = Command::new(kvlab);
    cmd.args(&fixed).current_dir(workspace_root());
    for r in refs {
        cmd.args(["-p", &r.text]);
    }
    let out = cmd
        .output()
        .with_context(|| format!("running {} batch", kvlab.display()))?;
    let stderr = String::from_utf8_lossy(&out.stderr);
    if !out.status.success() {
        bail!("kvlab batch failed ({}):\n{stderr}", out.status);
    }
    let v: Value = stderr
        .lines()
        .rev()
        .find_map(|l| serde_json::from_str::<Value>(l.trim()).ok())
        .context("kvlab batch printed no JSON stats on stderr")?;
    let engine_s = v["engine_s"].as_f64().context("no engine_s")?;
    let wall_s = v["wall_s"].as_f64().context("no wall_s")?;
    let output_tokens: usize = refs.iter().map(|r| r.completion_tokens).sum();
    // stdout: "[i] (reason) prompt+completion", one line per prompt (a completion may hold
    // newlines, so each entry runs to the next "[i+1] (").
    let stdout = String::from_utf8_lossy(&out.stdout);
    let same_text = refs
        .iter()
        .filter(|r| {
            let start = stdout.find(&format!("[{}] (", r.index));
            let end = stdout.find(&format!("\n[{}] (", r.index + 1));
            start.is_some_and(|s| {
                let entry = &stdout[s..end.unwrap_or(stdout.len())];
                entry.trim_end().ends_with(r.completion.trim_end())
            })
        })
        .count();
    Ok(BatchRef {
        command: format!(
            "{} {} -p <the {} prompts>",
            kvlab.display(),
            fixed.join(" "),
            refs.len()
        ),
        engine_s,
        wall_s,
        output_tokens,
        output_tok_per_s: output_tokens as f64 / wall_s.max(1e-9),
        output_tok_per_s_engine: output_tokens as f64 / engine_s.max(1e-9),
        tokens_per_s_all: v["tokens_per_s"].as_f64().unwrap_or(f64::NAN),
        preemptions: v["preemptions"].as_f64().unwrap_or(0.0),
        prefix_cache_hits: v["prefix_cache_hits"].as_f64().unwrap_or(f64::NAN),
        same_text,
    })
}

// ---------------------------------------------------------------------------------------------
// Output

/// The table, on stdout.
pub fn print(r: &ServeReport) {
    println!(
        "== kvlab serve under load: {} requests x {} tokens, {} ({} blocks x {}) ==",
        r.requests, r.max_tokens, r.model, r.num_blocks, r.block_size
    );
    let p = |s: &Summary| {
        let f = |v: f64| {
            if v < 10.0 {
                format!("{v:.1}")
            } else {
                format!("{v:.0}")
            }
        };
        format!("{} / {} / {}", f(s.median), f(s.p90), f(s.p99))
    };
    crate::table::columns(
        &r.rates,
        &[
            ("rate req/s", &|x| x.rate.clone()),
            ("ok", &|x| x.ok.to_string()),
            ("refused", &|x| x.refused.to_string()),
            ("lost", &|x| x.lost.to_string()),
            ("out tok/s", &|x| format!("{:.0}", x.output_tok_per_s)),
            ("TTFT ms p50/p90/p99", &|x| p(&x.ttft_ms)),
            ("TPOT ms p50/p90/p99", &|x| p(&x.tpot_ms)),
            ("e2e ms p50/p90/p99", &|x| p(&x.e2e_ms)),
            ("prefix hit", &|x| {
                x.prefix_cache_hit_rate
                    .map_or_else(|| "-".into(), |h| format!("{:.0}%", h * 100.0))
            }),
            ("preempt", &|x| format!("{:.0}", x.preemptions)),
        ],
    );
    let b = &r.batch;
    println!(
        "saturation pairs, the prefix cache off on both sides so that both do the same work: \
         every request at once on a fresh server, and kvlab batch (same prompts, all at step 0, \
         same pool), back to back"
    );
    println!(
        "  kvlab batch: {:.0} output tok/s median of {} runs over the whole run (the first: {} \
         tokens in {:.2} s, {:.2} s of it engine time; {:.0} tok/s counting prompt tokens; {} \
         of {} texts as solo)",
        r.batch_output_tok_per_s_median,
        r.pairs.len(),
        b.output_tokens,
        b.wall_s,
        b.engine_s,
        b.tokens_per_s_all,
        b.same_text,
        r.requests
    );
    let list = |f: &dyn Fn(&Pair) -> f64| {
        r.pairs
            .iter()
            .map(|p| format!("{:.2}", f(p)))
            .collect::<Vec<_>>()
            .join(" ")
    };
    println!(
        "  server / kvlab batch: {} -> median {:.2} (goal >= {:.2}: {})",
        list(&|p| p.ratio),
        r.paired_ratio_median,
        r.goal_ratio,
        if r.mode == "quick" {
            "not judged in quick mode: stories260K's run is a few ms"
        } else if r.paired_ratio_median >= r.goal_ratio {
            "met"
        } else {
            "NOT met"
        },
    );
    println!(
        "  server / kvlab batch's engine time alone (strict: batch's sampling and scheduling \
         not counted): {} -> median {:.2}",
        list(&|p| p.ratio_engine),
        r.paired_ratio_engine_median
    );
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn arrivals_are_seeded_poisson() {
        let a = arrival_times(2000, 4.0, 7);
        assert_eq!(a, arrival_times(2000, 4.0, 7));
        assert_eq!(a[0], 0.0);
        assert!(a.windows(2).all(|w| w[1] >= w[0]));
        // Mean gap 1/rate = 0.25 s, within a few standard errors.
        let mean = a[1999] / 1999.0;
        assert!((mean - 0.25).abs() < 0.03, "{mean}");
        assert_eq!(arrival_times(3, f64::INFINITY, 7), vec![0.0; 3]);
    }

    #[test]
    fn sse_lines_split_anywhere() {
        let body = "data: {\"choices\":[{\"text\":\"Hel\"}]}\n\ndata: {\"choices\":[{\"text\":\
                    \"lo\"}]}\n\ndata: [DONE]\n\n";
        let mut s = Sse::default();
        for chunk in body.as_bytes().chunks(7) {
            s.feed(chunk).unwrap();
        }
        assert!(s.done);
        assert_eq!(s.text, "Hello");
        let mut e = Sse::default();
        assert!(e.feed(b"data: {\"error\":{\"message\":\"x\"}}\n").is_err());
    }

    fn reference(index: usize, completion: &str) -> PromptRef {
        PromptRef {
            index,
            text: "Once".into(),
            prompt_tokens: 2,
            completion_tokens: 3,
            finish_reason: "length".into(),
            completion: completion.into(),
        }
    }

    fn done(text: &str) -> Outcome {
        Outcome::Done(Timing {
            ttft_ms: 10.0,
            e2e_ms: 30.0,
            text: text.into(),
            end_s: 0.5,
        })
    }

    #[test]
    fn a_different_text_or_a_failure_is_lost_a_refusal_is_not() {
        let refs = [reference(0, " upon"), reference(1, " a time")];
        let row = summarise(1.0, &refs, vec![done(" upon"), Outcome::Refused], "", "").unwrap();
        assert_eq!((row.ok, row.refused, row.output_tokens), (1, 1, 3));
        assert_eq!(row.tpot_ms.median, 10.0);
        let e = summarise(1.0, &refs, vec![done(" upon"), done(" a tim")], "", "")
            .unwrap_err()
            .to_string();
        assert!(e.contains("prompt 1: text differs"), "{e}");
        let e = summarise(
            f64::INFINITY,
            &refs,
            vec![Outcome::Lost("x".into()), done(" a time")],
            "",
            "",
        )
        .unwrap_err()
        .to_string();
        assert!(e.contains("rate inf") && e.contains("prompt 0: x"), "{e}");
    }

    #[test]
    fn metrics_sum_over_labels() {
        let t = "# TYPE vllm:x counter\nvllm:x{model_name=\"a\"} 3\nvllm:x_other 9\nvllm:x 2\n";
        assert_eq!(metric(t, "vllm:x"), 5.0);
    }

    #[test]
    fn prompts_are_fixed_and_share_openings() {
        let p = prompts(8, 1);
        assert_eq!(p, prompts(8, 1));
        assert!(p.iter().all(|t| OPENINGS.iter().any(|o| t.starts_with(o))));
    }
}

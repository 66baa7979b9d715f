//! `cargo xtask bench`: latency, throughput, memory and the roofline of every engine on real
//! and synthetic models; a terminal table, JSON under `target/kvlab-bench/` (schema:
//! `xtask/src/bench/schema.md`), SVG and PNG plots, and a comparison with a stored baseline.
//!
//! Honest timing: every engine is warmed up before it is timed; prompts come from a fixed seed
//! and decoding is greedy, so every repetition does the same work; each workload is repeated and
//! reported as min / median / max; within a repetition the engines run back to back, so the
//! ratios between them (ratios.rs) are measured under the same load. Absolute numbers on a
//! shared 2-core machine move by tens of percent; the ratios are what a baseline compares.
//!
//! Files in run order: [`plan`] (what is measured), [`machine`], [`bandwidth`], [`models`],
//! [`suite`] (drives [`decode`], [`prefill`], [`batch`], [`memory`] per model), [`roofline`],
//! [`ratios`], [`baseline`], [`report`] (table and JSON), [`plot`].

mod bandwidth;
mod baseline;
mod batch;
mod chunked;
mod cluster;
mod decode;
pub mod depth;
mod eviction;
pub mod machine;
mod memory;
mod models;
pub mod peers;
mod plan;
mod plot;
mod prefill;
mod ratios;
mod report;
mod roofline;
pub mod serve;
mod speculative;
mod stats;
mod suite;
mod tiers;

use std::path::PathBuf;
use std::time::Instant;

use anyhow::{Context, Result, bail};
use indicatif::{ProgressBar, ProgressStyle};
use kvlab_cli::args::usize_in;
use kvlab_engines::{self as engines, EngineKind};

use crate::paths;

/// `cargo xtask bench`: latency, throughput, memory and roofline of every engine.
#[derive(clap::Args)]
#[command(
    after_help = "env: KVLAB_MODELS (folder of real checkpoints such as stories260K.bin); for \
                  --peers KVLAB_RUNC (llama2.c's run.c binary), KVLAB_PYTHON (a python with \
                  llama-cpp-python) and KVLAB_BIN (the kvlab binary to measure; default: cargo \
                  build --release -p kvlab-cli; for --serve: target/release/kvlab, built \
                  beforehand)"
)]
pub struct Opts {
    /// CI smoke run: stories260K and the stories15M shape at short contexts, few repetitions
    /// (under 2 minutes on a 2-core machine); default: the full run
    #[arg(long, overrides_with = "full")]
    quick: bool,
    /// The full run (the default)
    #[arg(long, overrides_with = "quick", hide = true)]
    full: bool,
    /// Only this model of the mode's list (repeatable)
    #[arg(long = "model", value_name = "NAME")]
    models: Vec<String>,
    /// Only this engine (repeatable; naive is the reference of every speedup)
    #[arg(long = "engine", value_name = "NAME", value_parser = |s: &str| s.parse::<EngineKind>())]
    engines: Vec<EngineKind>,
    /// Where bench.json and the plots go [default: target/kvlab-bench]
    #[arg(long, value_name = "DIR")]
    out: Option<PathBuf>,
    /// Compare engine speedups with a stored bench.json of the same mode (benches/baseline.json
    /// is a full run's; for --quick, a --quick run's bench.json); exits non-zero when one fell
    /// by more than the measured noise
    #[arg(long, value_name = "FILE")]
    baseline: Option<PathBuf>,
    /// Skip the SVG/PNG plots
    #[arg(long)]
    no_plots: bool,
    /// A note to store in bench.json (repeatable), e.g. how busy the machine was
    #[arg(long = "note", value_name = "TEXT")]
    notes: Vec<String>,
    /// Instead: kvlab generate against llama2.c's run.c (decode: stories260K, the stories15M
    /// and 42M shapes, kvlab in f32 and bf16) and llama.cpp (decode: Gemma 3 270M GGUF; prefill:
    /// the 15M and 42M shapes in f32) on the same weights, interleaved; writes peers.json
    #[arg(long)]
    peers: bool,
    /// --peers, --serve --peer: threads of both sides [default: physical cores]
    #[arg(long, value_name = "N", value_parser = usize_in(1, 1 << 16))]
    threads: Option<usize>,
    /// --peers, --serve --peer: kvlab's `--activations`: f32 (kvlab's reference path) or q8
    /// (8-bit activations and integer dot products, as llama.cpp computes)
    #[arg(long, default_value_t = kvlab_model::Activations::F32,
          value_parser = kvlab_cli::args::activations())]
    activations: kvlab_model::Activations,
    /// --peers: positions per run
    #[arg(long, value_name = "N", default_value_t = 256, value_parser = usize_in(1, 1 << 20))]
    steps: usize,
    /// --peers: repetitions
    #[arg(long, value_name = "N", default_value_t = 3, value_parser = usize_in(1, 1 << 20))]
    reps: usize,
    /// Instead: load-test `kvlab serve` over HTTP (streamed completions at Poisson request
    /// rates, as vLLM's benchmark_serving.py) against `kvlab batch` on the same prompts; --model
    /// picks the model (default stories15M-shape, --quick: stories260K); writes serve.json and
    /// serve_load.svg/.png
    #[arg(long, conflicts_with = "peers")]
    serve: bool,
    /// --serve: requests per rate [default: 32, --quick 6]
    #[arg(long, value_name = "N", value_parser = usize_in(1, 100_000))]
    requests: Option<usize>,
    /// --serve: completion tokens per request [default: 64, --quick 24]
    #[arg(long, value_name = "N", value_parser = usize_in(1, 1 << 20))]
    max_tokens: Option<usize>,
    /// --serve: a request rate in requests/s, or "inf" for all at once (repeatable)
    /// [default: 4 8 16 32 64 inf (the knee of 32 requests on 2 cores), --quick 8 inf]
    #[arg(long = "rate", value_name = "REQ/S", value_parser = serve::parse_rate)]
    rates: Vec<f64>,
    /// --serve: back-to-back pairs (all requests at once on the server, then kvlab batch, or
    /// the other way round) whose median ratio is the throughput verdict [default: 7, --quick 1]
    #[arg(long, value_name = "N", value_parser = usize_in(1, 1000))]
    pairs: Option<usize>,
    /// --serve: seed of the prompt order and the arrival times
    #[arg(long, value_name = "N", default_value_t = 0)]
    seed: u64,
    /// --serve: instead of kvlab batch, this peer's server under the same load (1-64
    /// concurrent streams and the Poisson rates, same GGUF and threads, interleaved); writes
    /// serve_peer.json and serve_peer.svg/.png
    #[arg(long, value_enum, value_name = "PEER", requires = "serve")]
    peer: Option<serve::Peer>,
    /// Instead: the TTFT of a returning request whose evicted prefix is recomputed, or restored
    /// from host memory or disk (default Gemma 3 270M at 32..8192 tokens, --quick:
    /// stories260K); writes tiers.json and tiers_ttft.svg/.png
    #[arg(long, conflicts_with_all = ["peers", "serve"])]
    tiers: bool,
    /// --tiers: a context length in tokens (repeatable)
    #[arg(long = "context", value_name = "N", value_parser = usize_in(1, 1 << 20))]
    contexts: Vec<usize>,
    /// Instead: prefix-cache hit rate, prefill tokens, evictions and TTFT of each eviction
    /// policy at three pool sizes on multi-turn chat sessions (stories260K), without tiers,
    /// with tiers, and offloading paused sessions; then a noisy tenant against quotas (not with
    /// --quick); runs `kvlab evict --json`, writes eviction.json and eviction_hit_rate.svg/.png
    #[arg(long, conflicts_with_all = ["peers", "serve", "tiers"])]
    eviction: bool,
    /// Instead: a long prompt arriving among running decodes, prefilled whole and in chunks
    /// under each --budget: the decodes' inter-token latency p50/p99, the prompt's TTFT and
    /// the throughput each costs (default Gemma 3 270M, a 2,000-token prompt among 16 decodes;
    /// --quick: stories260K, 400 tokens); writes chunked_prefill.json and .svg/.png
    #[arg(long, conflicts_with_all = ["peers", "serve", "tiers", "eviction"])]
    chunked_prefill: bool,
    /// --chunked-prefill: tokens of the long prompt [default: 2000, --quick 400]
    #[arg(long, value_name = "N", value_parser = usize_in(2, 1 << 20))]
    prompt_len: Option<usize>,
    /// --chunked-prefill: running decodes the prompt arrives among
    #[arg(long, value_name = "N", default_value_t = 16, value_parser = usize_in(1, 4096))]
    decodes: usize,
    /// --chunked-prefill: a max_num_batched_tokens to chunk under (repeatable) [default: 512
    /// 256 128, --quick 128 64]
    #[arg(long = "budget", value_name = "N", value_parser = usize_in(1, 1 << 20))]
    budgets: Vec<usize>,
    /// Instead: prompt-lookup speculative decoding against plain greedy decoding on prompts
    /// whose answer copies them and prompts whose answer does not, with the checkpoint's
    /// weights and f32: speed-up, acceptance rate, tokens per step against k (default Gemma 3
    /// 270M, --quick: stories260K); writes speculative.json and .svg/.png
    #[arg(long, conflicts_with_all = ["peers", "serve", "tiers", "eviction", "chunked_prefill"])]
    speculative: bool,
    /// --speculative: guesses per step to measure (repeatable) [default: 1 2 3 4 8, --quick 2 4]
    #[arg(long = "k", value_name = "N", value_parser = usize_in(1, 63))]
    ks: Vec<usize>,
    /// Instead: N `kvlab serve` instances behind HAProxy on multi-turn chat sessions, round
    /// robin against session affinity, each with and without a shared Redis tier: prefix hit
    /// rate, prefill tokens, TTFT p50/p99, throughput, every text checked against its solo run
    /// (default Gemma 3 270M, --quick: stories260K; needs Debian's haproxy and redis-server);
    /// writes cluster.json and cluster.svg/.png
    #[arg(long, conflicts_with_all = ["peers", "serve", "tiers", "eviction", "chunked_prefill", "speculative"])]
    cluster: bool,
    /// --cluster: instance counts to run (repeatable) [default: 1 2 4, --quick 1 2]
    #[arg(long = "instances", value_name = "N", value_parser = usize_in(1, 16))]
    instances: Vec<usize>,
    /// Instead: decode speed against context depth (512 to 32,768 positions), `kvlab depth`
    /// against llama.cpp without and with flash attention on the same GGUF (default Gemma 3
    /// 270M); one repetition; writes depth.json and depth.svg/.png (= `cargo xtask depth`)
    #[arg(long, conflicts_with_all = ["peers", "serve", "tiers", "eviction", "chunked_prefill", "speculative", "cluster"])]
    depth: bool,
}

impl Opts {
    fn out(&self) -> PathBuf {
        self.out.clone().unwrap_or_else(paths::bench_out)
    }
}

/// `--peers`: forwarded to `cargo xtask peers` (peers.rs), which owns the comparison.
fn run_peers(o: &Opts) -> Result<()> {
    peers::command(&peers::PeersArgs {
        models: o.models.clone(),
        threads: o.threads,
        steps: o.steps,
        reps: o.reps,
        out: Some(o.out()),
        activations: o.activations,
    })
}

/// `--depth`: forwarded to `cargo xtask depth` (depth.rs), which owns the comparison.
fn run_depth(o: &Opts) -> Result<()> {
    if o.models.len() > 1 {
        bail!("--depth takes one --model");
    }
    depth::command(&depth::DepthArgs {
        model: o
            .models
            .first()
            .cloned()
            .unwrap_or_else(|| depth::DEFAULT_MODEL.into()),
        threads: o.threads,
        depths: Vec::new(),
        n_gen: 32,
        kv_dtype: kvlab_model::KvDtype::F16,
        fill: depth::Fill::Text,
        reps: 1,
        out: Some(o.out()),
    })
}

/// `--serve`: forwarded to `cargo xtask load` (serve.rs), which owns the load test.
fn run_serve(o: &Opts) -> Result<()> {
    if o.models.len() > 1 {
        bail!("--serve takes one --model");
    }
    serve::command(&serve::LoadArgs {
        quick: o.quick && !o.full,
        model: o.models.first().cloned(),
        requests: o.requests,
        max_tokens: o.max_tokens,
        rates: o.rates.clone(),
        pairs: o.pairs,
        seed: o.seed,
        out: Some(o.out()),
        no_plots: o.no_plots,
        notes: o.notes.clone(),
        peer: o.peer,
        threads: o.threads,
        streams: Vec::new(),
        activations: o.activations,
    })
}

/// What every side bench (`--tiers`, `--chunked-prefill`, `--speculative`, `--cluster`) takes
/// from the command line.
pub struct Side {
    /// `--quick`: fewer, smaller runs.
    pub quick: bool,
    /// `--model` (one at most); `None`: Gemma 3 270M, stories260K when quick ([`side_model`]).
    pub model: Option<String>,
    /// Repetitions of each measurement (1 when quick).
    pub reps: usize,
    /// `--seed`: of the workload's prompts and arrivals.
    pub seed: u64,
    /// The output folder (created).
    pub out: PathBuf,
    /// Whether to draw the plots.
    pub plots: bool,
    /// This machine's line.
    pub machine: String,
}

/// Checks that `flag`'s run was given at most one --model (and no --engine unless `engines`),
/// and creates the output folder.
fn side(o: &Opts, flag: &str, engines: bool) -> Result<Side> {
    if o.models.len() > 1 || (!engines && !o.engines.is_empty()) {
        bail!(
            "{flag} takes one --model{}",
            if engines {
                ""
            } else {
                " and chooses its engine; drop --engine"
            }
        );
    }
    let out = o.out();
    std::fs::create_dir_all(&out).with_context(|| format!("creating {}", out.display()))?;
    let quick = o.quick && !o.full;
    Ok(Side {
        quick,
        model: o.models.first().cloned(),
        reps: if quick { 1 } else { o.reps },
        seed: o.seed,
        out,
        plots: !o.no_plots,
        machine: machine::line(&machine::detect()),
    })
}

/// A side bench's model: the one named, else Gemma 3 270M (stories260K when quick), loaded by
/// name; returns its name too.
fn side_model(
    model: &Option<String>,
    quick: bool,
) -> Result<(String, kvlab_model::registry::Loaded)> {
    let name = model
        .clone()
        .unwrap_or_else(|| if quick { "stories260K" } else { "gemma-3-270m" }.to_string());
    let loaded = kvlab_cli::fetch::load(&name, None, false)
        .with_context(|| format!("loading {name}; set KVLAB_MODELS to the folder holding it"))?;
    Ok((name, loaded))
}

/// `--tiers`: restore versus recompute (tiers.rs), table, tiers.json and the plot.
fn run_tiers(o: &Opts) -> Result<()> {
    let side = side(o, "--tiers", true)?;
    let out = side.out.clone();
    let report = tiers::run(&tiers::TierOpts {
        side,
        contexts: o.contexts.clone(),
    })?;
    tiers::print(&report);
    let plots = report.plots.len();
    write_json(&out, "tiers.json", &report, plots, report.wall_seconds)
}

/// Writes a mode's report as `out/name` (pretty JSON) and says where, with its plots.
fn write_json(
    out: &std::path::Path,
    name: &str,
    report: &impl serde::Serialize,
    plots: usize,
    wall_seconds: f64,
) -> Result<()> {
    let json = out.join(name);
    std::fs::write(&json, serde_json::to_string_pretty(report)? + "\n")
        .with_context(|| format!("writing {}", json.display()))?;
    println!(
        "wrote {} and {plots} plots in {} ({wall_seconds:.0} s)",
        json.display(),
        out.display(),
    );
    Ok(())
}

/// `--eviction`: the eviction policies on chat sessions (eviction.rs), table, eviction.json and
/// the plot.
fn run_eviction(o: &Opts) -> Result<()> {
    if !o.models.is_empty() || !o.engines.is_empty() {
        bail!("--eviction runs stories260K on cpu-paged; drop --model and --engine");
    }
    let m = machine::detect();
    let out = o.out();
    std::fs::create_dir_all(&out).with_context(|| format!("creating {}", out.display()))?;
    let e = eviction::EvictionOpts {
        quick: o.quick && !o.full,
        out: out.clone(),
        plots: !o.no_plots,
        machine: machine::line(&m),
        notes: o.notes.clone(),
    };
    let report = eviction::run(&e)?;
    eviction::print(&report);
    let plots = report.plots.len();
    write_json(&out, "eviction.json", &report, plots, report.wall_seconds)
}

/// `--chunked-prefill`: a long prompt among running decodes, whole and chunked (chunked/),
/// table, chunked_prefill.json and the plot.
fn run_chunked(o: &Opts) -> Result<()> {
    let side = side(o, "--chunked-prefill", false)?;
    let out = side.out.clone();
    let report = chunked::run(&chunked::ChunkedOpts {
        side,
        prompt_len: o.prompt_len,
        decodes: o.decodes,
        budgets: o.budgets.clone(),
    })?;
    chunked::print(&report);
    let plots = report.plots.len();
    write_json(
        &out,
        "chunked_prefill.json",
        &report,
        plots,
        report.wall_seconds,
    )
}

/// `--speculative`: prompt lookup against plain decoding (speculative/), table,
/// speculative.json and the plot.
fn run_speculative(o: &Opts) -> Result<()> {
    let side = side(o, "--speculative", false)?;
    let out = side.out.clone();
    let ks = o.ks.clone();
    let report = speculative::run(&speculative::SpecOpts { side, ks })?;
    speculative::print(&report);
    let plots = report.plots.len();
    write_json(
        &out,
        "speculative.json",
        &report,
        plots,
        report.wall_seconds,
    )
}

/// `--cluster`: instances behind HAProxy with and without Redis (cluster/), table,
/// cluster.json and the plot.
fn run_cluster(o: &Opts) -> Result<()> {
    let side = side(o, "--cluster", false)?;
    let out = side.out.clone();
    let instances = o.instances.clone();
    let report = cluster::run(&cluster::ClusterOpts { side, instances })?;
    cluster::print(&report);
    let plots = report.plots.len();
    write_json(&out, "cluster.json", &report, plots, report.wall_seconds)
}

/// The peak-RSS child process (memory.rs), `cargo xtask __rss MODEL ENGINE CONTEXT POSITIONS`.
///
/// # Errors
/// Bad arguments, a model that does not load, or the engine's own.
pub fn rss_child(args: &[String]) -> Result<()> {
    memory::rss_child(args)
}

/// `cargo xtask bench` with its parsed options; `args` are the words it was given, recorded in
/// bench.json.
///
/// # Errors
/// A model or engine that fails, an unwritable output folder, or a speedup that fell below the
/// baseline's.
pub fn run(o: Opts, args: &[String]) -> Result<()> {
    if o.peers {
        return run_peers(&o);
    }
    if o.serve {
        return run_serve(&o);
    }
    if o.tiers {
        return run_tiers(&o);
    }
    if o.eviction {
        return run_eviction(&o);
    }
    if o.chunked_prefill {
        return run_chunked(&o);
    }
    if o.speculative {
        return run_speculative(&o);
    }
    if o.cluster {
        return run_cluster(&o);
    }
    if o.depth {
        return run_depth(&o);
    }
    let started = Instant::now();
    plot::register_font();
    let machine = machine::detect();
    let plan = plan_for(&o, &machine)?;
    if let Some(file) = &o.baseline {
        // Before minutes of measuring: a baseline of the other mode has no key in common.
        baseline::check_mode(file, &plan.mode)?;
    }
    let (bw, infos, results) = measure(&o, &plan, &machine)?;
    let rep = analyse(&o, &plan, args, machine, bw, infos, results)?;
    write(rep, &o, started)
}

/// The mode's plan, narrowed to the models asked for.
fn plan_for(o: &Opts, machine: &machine::Machine) -> Result<plan::Plan> {
    let mut plan = if o.quick && !o.full {
        plan::Plan::quick()
    } else {
        plan::Plan::full(!machine.gpus.is_empty())
    };
    if !o.models.is_empty() {
        plan.models
            .retain(|m| o.models.iter().any(|n| n.eq_ignore_ascii_case(&m.name)));
        if plan.models.is_empty() {
            bail!("no model of the {} plan matches {:?}", plan.mode, o.models);
        }
    }
    println!(
        "kvlab bench ({} mode): {} on {} ({} logical CPUs, {}), load {:.1}",
        plan.mode,
        plan.models
            .iter()
            .map(|m| m.name.as_str())
            .collect::<Vec<_>>()
            .join(", "),
        machine.cpu_model,
        machine.logical_cpus,
        machine.kvlab_simd,
        machine.loadavg_start.map_or(0.0, |l| l[0]),
    );
    Ok(plan)
}

/// Everything measured: the memory bandwidth before and after, and every model's workloads on
/// every engine (suite.rs), under a progress bar.
fn measure(
    o: &Opts,
    plan: &plan::Plan,
    machine: &machine::Machine,
) -> Result<(bandwidth::Bandwidth, Vec<Info>, suite::Results)> {
    let bar = ProgressBar::new(1 + plan.models.len() as u64 * (suite::PHASES + 1));
    bar.set_style(
        ProgressStyle::with_template("{spinner} bench [{bar:30}] {pos}/{len} {elapsed} {wide_msg}")
            .expect("template")
            .progress_chars("=> "),
    );
    bar.enable_steady_tick(std::time::Duration::from_millis(200));
    bar.set_message("memory bandwidth");
    let bw_bytes = bandwidth::buffer_bytes(plan.bandwidth_buffer_bytes, machine.llc_bytes);
    let bw = bandwidth::measure(bw_bytes, plan.bandwidth_passes, "start");
    bar.inc(1);

    let mut results = suite::Results::default();
    results.notes.extend(o.notes.iter().cloned());
    if cfg!(debug_assertions) {
        let s = "xtask was built without optimizations (debug): the timings are meaningless; \
                 run `cargo xtask bench` (the alias builds --release)"
            .to_string();
        eprintln!("warning: {s}");
        results.notes.push(s);
    }
    let engine_names = engines::selected(&o.engines);
    let mut infos = Vec::new();
    for mp in &plan.models {
        bar.set_message(format!("{}: loading", mp.name));
        let engines: Vec<EngineKind> = engine_names
            .iter()
            .copied()
            .filter(|e| e.on_cpu() != mp.gpu_only)
            .collect();
        let m = match models::load(&mp.name, mp.context)? {
            Ok(m) => m,
            Err(why) => {
                let s = format!("{}: SKIPPED: {why}", mp.name);
                bar.println(format!("note: {s}"));
                results.notes.push(s);
                bar.inc(suite::PHASES + 1);
                continue;
            }
        };
        bar.inc(1);
        suite::run_model(&m, mp, &engines, plan.warmup_positions, &bar, &mut results)?;
        infos.push((m.info.clone(), m.model.config.clone()));
    }
    bar.set_message("memory bandwidth, again");
    let end = bandwidth::measure(bw_bytes, plan.bandwidth_passes, "end");
    bar.finish_and_clear();
    Ok((bandwidth::merge(bw, end), infos, results))
}

/// A model as measured, and its configuration.
type Info = (models::ModelInfo, kvlab_model::Config);

/// What the measurements say: paging waste, the roofline, the speedups, the baseline
/// comparison; the whole report.
fn analyse(
    o: &Opts,
    plan: &plan::Plan,
    args: &[String],
    machine: machine::Machine,
    bw: bandwidth::Bandwidth,
    infos: Vec<Info>,
    mut results: suite::Results,
) -> Result<report::Report> {
    let waste = memory::waste()?;
    let roofline = roofline::rows(
        &infos,
        &results.decode,
        &results.batch,
        bw.peak_gb_per_s,
        machine.llc_bytes,
    );
    let context = |m: &str| {
        infos
            .iter()
            .find(|(i, _)| i.name == m)
            .map_or(0, |(i, _)| i.context)
    };
    let ratios = ratios::derive(&results.decode, &results.prefill, &results.batch, &context);
    let baseline = o
        .baseline
        .as_ref()
        .map(|f| baseline::compare(f, &ratios, &machine))
        .transpose()?;
    let headline = report::headline_of(&results.decode, &ratios, &roofline, bw.peak_gb_per_s);
    Ok(report::Report {
        format_version: report::FORMAT_VERSION,
        kind: "kvlab-bench".into(),
        mode: plan.mode.clone(),
        args: args.to_vec(),
        wall_seconds: 0.0,
        notes: report::notes(&machine, std::mem::take(&mut results.notes)),
        machine,
        loadavg_end: machine::load_now(),
        plan: plan.clone(),
        bandwidth: bw,
        models: infos.into_iter().map(|(i, _)| i).collect(),
        results,
        process_peak_rss_bytes: machine::status_bytes("VmHWM:"),
        gpu_memory: None,
        waste,
        roofline,
        ratios,
        headline,
        baseline,
        plots: Vec::new(),
    })
}

/// The plots, the tables, bench.json; then the baseline's verdict.
fn write(mut rep: report::Report, o: &Opts, started: Instant) -> Result<()> {
    let out = o.out();
    std::fs::create_dir_all(&out).with_context(|| format!("creating {}", out.display()))?;
    if !o.no_plots {
        rep.plots = plot::all(&rep, &out)?;
    }
    rep.wall_seconds = started.elapsed().as_secs_f64();
    report::print(&rep);
    let json = out.join("bench.json");
    std::fs::write(&json, serde_json::to_string_pretty(&rep)?)?;
    println!(
        "\nwrote {} and {} plots in {} ({:.0} s); schema: {}",
        json.display(),
        rep.plots.len(),
        out.display(),
        rep.wall_seconds,
        paths::bench_schema().display()
    );
    if let Some(b) = &rep.baseline {
        b.verdict()?;
    }
    Ok(())
}

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
mod decode;
mod machine;
mod memory;
mod models;
mod peers;
mod plan;
mod plot;
mod prefill;
mod ratios;
mod report;
mod roofline;
mod stats;
mod suite;

use std::path::PathBuf;
use std::time::Instant;

use anyhow::{Context, Result, bail};
use indicatif::{ProgressBar, ProgressStyle};
use kvlab_cli::engines::{self, EngineKind};

use crate::verify::{target_dir, workspace_root};

const USAGE: &str = "\
cargo xtask bench [--quick] [--model NAME]... [--engine NAME]... [--out DIR] [--baseline FILE]
                  [--no-plots] [--note TEXT]...
cargo xtask bench --peers [--model NAME]... [--threads N] [--steps N] [--reps N] [--out DIR]

  --quick          CI smoke run: stories260K and the stories15M shape at short contexts, few
                   repetitions (under 2 minutes on a 2-core machine); default: the full run
  --model NAME     only this model of the mode's list (repeatable)
  --engine NAME    only this engine (repeatable; naive is the reference of every speedup)
  --out DIR        where bench.json and the plots go (default target/kvlab-bench)
  --baseline FILE  compare engine speedups with a stored bench.json (e.g. benches/baseline.json);
                   exits non-zero when one fell by more than the measured noise
  --no-plots       skip the SVG/PNG plots
  --note TEXT      a note to store in bench.json (repeatable), e.g. how busy the machine was
  --peers          instead: kvlab generate against llama2.c's run.c (stories260K, the stories15M
                   shape) and llama.cpp (Gemma 3 270M GGUF) on the same weights, interleaved, with
                   --threads N (default: physical cores), --steps N positions (default 256) and
                   --reps N (default 3); writes peers.json
env: KVLAB_MODELS (folder of real checkpoints such as stories260K.bin); for --peers KVLAB_RUNC
     (llama2.c's run.c binary), KVLAB_PYTHON (a python with llama-cpp-python) and KVLAB_BIN
     (the kvlab binary to measure; default: cargo build --release -p kvlab-cli)";

struct Opts {
    quick: bool,
    models: Vec<String>,
    engines: Vec<EngineKind>,
    out: PathBuf,
    baseline: Option<PathBuf>,
    plots: bool,
    notes: Vec<String>,
    peers: Option<peers::PeerOpts>,
}

fn parse(args: &[String]) -> Result<Opts> {
    let mut o = Opts {
        quick: false,
        models: vec![],
        engines: vec![],
        out: target_dir().join("kvlab-bench"),
        baseline: None,
        plots: true,
        notes: vec![],
        peers: None,
    };
    let mut peer = peers::PeerOpts {
        models: vec![],
        threads: kvlab_cpu::threads::physical_cores(),
        steps: 256,
        reps: 3,
    };
    let mut want_peers = false;
    let mut it = args.iter();
    while let Some(a) = it.next() {
        let mut val = || {
            it.next()
                .cloned()
                .with_context(|| format!("{a} needs a value\n\n{USAGE}"))
        };
        match a.as_str() {
            "--quick" => o.quick = true,
            "--full" => o.quick = false,
            "--model" => o.models.push(val()?),
            "--engine" => o.engines.push(val()?.parse()?),
            "--out" => o.out = val()?.into(),
            "--baseline" => o.baseline = Some(val()?.into()),
            "--no-plots" => o.plots = false,
            "--note" => o.notes.push(val()?),
            "--peers" => want_peers = true,
            "--threads" => peer.threads = positive(a, &val()?)?,
            "--steps" => peer.steps = positive(a, &val()?)?,
            "--reps" => peer.reps = positive(a, &val()?)?,
            "-h" | "--help" => {
                println!("{USAGE}");
                std::process::exit(0);
            }
            other => bail!("unknown option {other:?}\n\n{USAGE}"),
        }
    }
    if want_peers {
        peer.models = o.models.clone();
        o.peers = Some(peer);
    }
    Ok(o)
}

fn positive(flag: &str, v: &str) -> Result<usize> {
    match v.parse::<usize>() {
        Ok(n) if n > 0 => Ok(n),
        _ => bail!("{flag} needs a positive integer, not {v:?}"),
    }
}

/// `--peers`: the comparison with run.c and llama.cpp, table and peers.json.
fn run_peers(o: &Opts, p: &peers::PeerOpts) -> Result<()> {
    let m = machine::detect();
    let machine = format!(
        "{} ({} logical CPUs, {}), load {:.1} at the start, {}",
        m.cpu_model,
        m.logical_cpus,
        m.kvlab_simd,
        m.loadavg_start.map_or(0.0, |l| l[0]),
        m.date_utc
    );
    let report = peers::run(p, machine)?;
    peers::print(&report);
    std::fs::create_dir_all(&o.out).with_context(|| format!("creating {}", o.out.display()))?;
    let json = o.out.join("peers.json");
    std::fs::write(&json, serde_json::to_string_pretty(&report)?)?;
    println!("wrote {}", json.display());
    if report.rows.is_empty() {
        bail!("no peer ran (see the missing lines above)");
    }
    Ok(())
}

pub fn run(args: &[String]) -> Result<()> {
    // Hidden: the peak-RSS child process (memory.rs).
    if args.first().map(String::as_str) == Some("__rss") {
        return memory::rss_child(&args[1..]);
    }
    let o = parse(args)?;
    if let Some(p) = &o.peers {
        return run_peers(&o, p);
    }
    let started = Instant::now();
    plot::register_font();
    let machine = machine::detect();
    let mut plan = if o.quick {
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
    let engine_names = engines::selected(&o.engines);
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
    let bw = bandwidth::merge(
        bw,
        bandwidth::measure(bw_bytes, plan.bandwidth_passes, "end"),
    );
    bar.finish_and_clear();

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
    let mut rep = report::Report::new(
        &plan,
        args,
        machine,
        bw,
        infos.into_iter().map(|(i, _)| i).collect(),
        results,
        waste,
        roofline,
        ratios,
        baseline,
    );
    std::fs::create_dir_all(&o.out).with_context(|| format!("creating {}", o.out.display()))?;
    if o.plots {
        rep.plots = plot::all(&rep, &o.out)?;
    }
    rep.wall_seconds = started.elapsed().as_secs_f64();
    report::print(&rep);
    let json = o.out.join("bench.json");
    std::fs::write(&json, serde_json::to_string_pretty(&rep)?)?;
    println!(
        "\nwrote {} and {} plots in {} ({:.0} s); schema: {}",
        json.display(),
        rep.plots.len(),
        o.out.display(),
        rep.wall_seconds,
        workspace_root().join("xtask/src/bench/schema.md").display()
    );
    if let Some(b) = &rep.baseline {
        b.verdict()?;
    }
    Ok(())
}

//! The run's report: the JSON document (schema.md) and the terminal tables.

use kvlab_paged::waste::WasteRow;
use serde::Serialize;

use super::bandwidth::Bandwidth;
use super::baseline::BaselineReport;
use super::batch::{BatchRow, ContinuousRow};
use super::decode::DecodeRun;
use super::machine::{self, Machine};
use super::memory::{KvRow, RssRow};
use super::models::ModelInfo;
use super::plan::Plan;
use super::prefill::{LatencyRow, PrefillRow};
use super::ratios::Ratio;
use super::roofline::RooflineRow;
use super::suite::Results;
use crate::table;

/// Version of the JSON layout; bumped on any incompatible change.
pub const FORMAT_VERSION: u32 = 1;

/// The generation speedup of a cached engine over naive at one length.
#[derive(Clone, Debug, Serialize)]
pub struct Speedup {
    pub model: String,
    pub engine: String,
    pub positions: usize,
    pub value: f64,
    pub min: f64,
    pub max: f64,
    pub reps: usize,
}

/// The CPU engine's achieved bandwidth fraction over a batch-1 generation.
#[derive(Clone, Debug, Serialize)]
pub struct BandwidthFraction {
    pub model: String,
    pub engine: String,
    pub fraction: f64,
    pub achieved_gb_per_s: f64,
    pub peak_gb_per_s: f64,
    pub cache_resident: bool,
}

/// Decode tokens/s of one engine on one model (batch 1, whole generation).
#[derive(Clone, Debug, Serialize)]
pub struct DecodeSpeed {
    pub model: String,
    pub engine: String,
    pub positions: usize,
    pub tok_per_s_median: f64,
    pub tok_per_s_min: f64,
    pub tok_per_s_max: f64,
}

/// The numbers the README quotes, taken from this run.
#[derive(Clone, Debug, Serialize)]
pub struct Headline {
    /// Total generation time naive ÷ engine, at 256 and 1,024 positions where measured.
    pub generation_speedup_vs_naive: Vec<Speedup>,
    pub bandwidth_fraction_batch1: Vec<BandwidthFraction>,
    pub decode_tok_per_s: Vec<DecodeSpeed>,
}

/// The whole JSON document.
#[derive(Serialize)]
pub struct Report {
    pub format_version: u32,
    /// Always "kvlab-bench".
    pub kind: String,
    pub mode: String,
    /// The arguments after `cargo xtask bench`.
    pub args: Vec<String>,
    /// Seconds the whole run took.
    pub wall_seconds: f64,
    pub machine: Machine,
    /// Load average (1 min) at the end: compare with `machine.loadavg_start`.
    pub loadavg_end: Option<f64>,
    pub plan: Plan,
    pub notes: Vec<String>,
    pub bandwidth: Bandwidth,
    pub models: Vec<ModelInfo>,
    pub decode: Vec<DecodeRun>,
    pub prefill: Vec<PrefillRow>,
    pub latency: Vec<LatencyRow>,
    pub batch: Vec<BatchRow>,
    pub continuous: Vec<ContinuousRow>,
    pub kv_memory: Vec<KvRow>,
    pub peak_rss: Vec<RssRow>,
    /// VmHWM of the bench process itself (every model and engine of the run), bytes.
    pub process_peak_rss_bytes: Option<u64>,
    /// GPU memory per engine: null without a GPU engine.
    pub gpu_memory: Option<serde_json::Value>,
    pub waste: Vec<WasteRow>,
    pub roofline: Vec<RooflineRow>,
    pub ratios: Vec<Ratio>,
    pub headline: Headline,
    pub baseline: Option<BaselineReport>,
    /// Plot files written, relative to the output folder.
    pub plots: Vec<String>,
}

impl Report {
    #[allow(clippy::too_many_arguments)]
    pub fn new(
        plan: &Plan,
        args: &[String],
        machine: Machine,
        bandwidth: Bandwidth,
        models: Vec<ModelInfo>,
        r: Results,
        waste: Vec<WasteRow>,
        roofline: Vec<RooflineRow>,
        ratios: Vec<Ratio>,
        baseline: Option<BaselineReport>,
    ) -> Report {
        let headline = headline(&r.decode, &ratios, &roofline, bandwidth.peak_gb_per_s);
        let mut notes = vec![format!(
            "contiguous engines (naive, cpu) have no batched step: their batch-B throughput is B \
             sequences decoded round-robin through the Engine trait"
        )];
        // Busy when the run started (1-minute load average). The load at the end is no
        // evidence: the bench's own threads keep every core busy.
        let load = machine.loadavg_start.map_or(0.0, |l| l[0]);
        if load > machine.logical_cpus as f64 * 0.5 {
            notes.push(format!(
                "the machine was busy when the run started (1-minute load average {load:.1} on \
                 {} logical CPUs): absolute times are noisy; compare ratios",
                machine.logical_cpus
            ));
        }
        notes.extend(r.notes);
        Report {
            format_version: FORMAT_VERSION,
            kind: "kvlab-bench".into(),
            mode: plan.mode.clone(),
            args: args.to_vec(),
            wall_seconds: 0.0,
            machine,
            loadavg_end: machine::load_now(),
            plan: plan.clone(),
            notes,
            bandwidth,
            models,
            decode: r.decode,
            prefill: r.prefill,
            latency: r.latency,
            batch: r.batch,
            continuous: r.continuous,
            kv_memory: r.kv,
            peak_rss: r.rss,
            process_peak_rss_bytes: machine::peak_rss_bytes(),
            gpu_memory: None,
            waste,
            roofline,
            ratios,
            headline,
            baseline,
            plots: Vec::new(),
        }
    }
}

fn headline(
    decode: &[DecodeRun],
    ratios: &[Ratio],
    roofline: &[RooflineRow],
    peak: f64,
) -> Headline {
    let generation_speedup_vs_naive = ratios
        .iter()
        .filter(|r| {
            r.what == "decode generation" && r.reference == "naive" && [256, 1024].contains(&r.at)
        })
        .map(|r| Speedup {
            model: r.model.clone(),
            engine: r.engine.clone(),
            positions: r.at,
            value: r.value,
            min: r.min,
            max: r.max,
            reps: r.n,
        })
        .collect();
    let bandwidth_fraction_batch1 = roofline
        .iter()
        .filter(|r| r.batch == 1 && r.what.starts_with("decode positions") && r.engine != "naive")
        .map(|r| BandwidthFraction {
            model: r.model.clone(),
            engine: r.engine.clone(),
            fraction: r.bandwidth_fraction,
            achieved_gb_per_s: r.achieved_gb_per_s,
            peak_gb_per_s: peak,
            cache_resident: r.cache_resident,
        })
        .collect();
    let decode_tok_per_s = decode
        .iter()
        .map(|d| DecodeSpeed {
            model: d.model.clone(),
            engine: d.engine.clone(),
            positions: d.positions,
            tok_per_s_median: d.decode_tok_per_s.median,
            tok_per_s_min: d.decode_tok_per_s.min,
            tok_per_s_max: d.decode_tok_per_s.max,
        })
        .collect();
    Headline {
        generation_speedup_vs_naive,
        bandwidth_fraction_batch1,
        decode_tok_per_s,
    }
}

fn mib(b: u64) -> String {
    format!("{:.2}", b as f64 / (1024.0 * 1024.0))
}

fn f(x: f64) -> String {
    if !x.is_finite() {
        "-".into()
    } else if x.abs() >= 100.0 {
        format!("{x:.0}")
    } else if x.abs() >= 10.0 {
        format!("{x:.1}")
    } else {
        format!("{x:.2}")
    }
}

fn mmm(s: &super::stats::Summary) -> String {
    format!("{} / {} / {}", f(s.min), f(s.median), f(s.max))
}

/// Prints every table of the report.
pub fn print(r: &Report) {
    let m = &r.machine;
    println!(
        "\nmachine: {}, {} logical CPUs, SIMD {}, LLC {} MiB, {} | {} | commit {} | {}",
        m.cpu_model,
        m.logical_cpus,
        m.kvlab_simd,
        m.llc_bytes.map_or("?".into(), mib),
        m.rustc,
        m.os,
        m.git_commit,
        m.date_utc
    );
    println!(
        "memory bandwidth, GB/s (best pass): {}; roofline limit {:.1} GB/s ({})",
        r.bandwidth
            .rows
            .iter()
            .map(|b| format!("{} {} {}T {:.1}", b.when, b.kind, b.threads, b.gb_per_s.max))
            .collect::<Vec<_>>()
            .join(", "),
        r.bandwidth.peak_gb_per_s,
        r.bandwidth.peak_from
    );

    println!(
        "\n== decode latency per position (batch 1; ms per step: min / median / max over reps) =="
    );
    let rows: Vec<Vec<String>> = r
        .decode
        .iter()
        .map(|d| {
            let at = |p: usize| d.step_ms.median.get(p).map_or("-".into(), |x| f(*x));
            let last = d.cumulative.last();
            vec![
                d.model.clone(),
                d.engine.clone(),
                format!("{}", d.positions),
                format!("{}", d.reps),
                at(1),
                at(d.positions / 2),
                at(d.positions - 1),
                last.map_or("-".into(), |c| mmm(&c.total_ms)),
                mmm(&d.decode_tok_per_s),
                format!("{:016x}", d.tokens_fnv),
            ]
        })
        .collect();
    table::print(
        &[
            "model",
            "engine",
            "positions",
            "reps",
            "ms @1",
            "ms @mid",
            "ms @last",
            "total ms",
            "decode tok/s",
            "tokens fnv",
        ],
        &rows,
    );

    println!(
        "\n== generation speedup (total time of the reference ÷ engine, same run, per-rep pairs) =="
    );
    let rows: Vec<Vec<String>> = r
        .ratios
        .iter()
        .filter(|x| x.what == "decode generation")
        .map(|x| {
            vec![
                x.model.clone(),
                format!("{} vs {}", x.engine, x.reference),
                format!("{}", x.at),
                format!("{}×", f(x.value)),
                format!("{}–{}", f(x.min), f(x.max)),
                format!("{:.1} %", 100.0 * x.noise),
                format!("{}", x.n),
            ]
        })
        .collect();
    table::print(
        &[
            "model",
            "engines",
            "positions",
            "speedup",
            "range",
            "noise",
            "n",
        ],
        &rows,
    );

    println!("\n== prefill (prompt tokens/s: min / median / max) ==");
    let rows: Vec<Vec<String>> = r
        .prefill
        .iter()
        .map(|p| {
            vec![
                p.model.clone(),
                p.engine.clone(),
                format!("{}", p.prompt_len),
                mmm(&p.tok_per_s),
                f(p.ms.median),
            ]
        })
        .collect();
    table::print(
        &["model", "engine", "prompt", "tok/s", "ms (median)"],
        &rows,
    );

    println!("\n== request latency (TTFT and TPOT, ms: p50 / p90 / p99 over reps) ==");
    let rows: Vec<Vec<String>> = r
        .latency
        .iter()
        .map(|l| {
            let p = |s: &super::stats::Summary| {
                format!("{} / {} / {}", f(s.median), f(s.p90), f(s.p99))
            };
            vec![
                l.model.clone(),
                l.engine.clone(),
                format!("{}+{}", l.prompt_len, l.generate),
                format!("{}", l.ttft_ms.n),
                p(&l.ttft_ms),
                p(&l.tpot_ms),
            ]
        })
        .collect();
    table::print(
        &[
            "model",
            "engine",
            "prompt+gen",
            "reps",
            "TTFT ms",
            "TPOT ms",
        ],
        &rows,
    );

    println!("\n== batched decode throughput (decode tok/s, all sequences: min / median / max) ==");
    let rows: Vec<Vec<String>> = r
        .batch
        .iter()
        .map(|b| {
            vec![
                b.model.clone(),
                b.engine.clone(),
                b.mode.clone(),
                format!("{}", b.batch),
                mmm(&b.tok_per_s),
            ]
        })
        .collect();
    table::print(&["model", "engine", "mode", "batch", "tok/s"], &rows);

    if !r.continuous.is_empty() {
        println!("\n== arrival trace (continuous batching vs one request at a time) ==");
        let rows: Vec<Vec<String>> = r
            .continuous
            .iter()
            .map(|c| {
                vec![
                    c.model.clone(),
                    c.engine.clone(),
                    c.mode.clone(),
                    format!("{}", c.num_requests),
                    format!("{}+{}", c.prompt_tokens, c.generated_tokens),
                    f(c.engine_seconds),
                    f(c.total_tok_per_s),
                    c.mean_batch.map_or("-".into(), f),
                    c.preemptions.map_or("-".into(), |p| p.to_string()),
                ]
            })
            .collect();
        table::print(
            &[
                "model",
                "engine",
                "mode",
                "requests",
                "prompt+gen tokens",
                "s",
                "tok/s",
                "mean batch",
                "preempt",
            ],
            &rows,
        );
    }

    println!(
        "\n== KV cache bytes (MiB) vs the formula 2 × n_layers × n_kv_heads × head_dim × 4 B × positions =="
    );
    let rows: Vec<Vec<String>> = r
        .kv_memory
        .iter()
        .map(|k| {
            let ok = if k.used_bytes == 0 && k.reserved_bytes == 0 {
                "no cache"
            } else if k.used_bytes == k.formula_used_bytes {
                "used = formula"
            } else if k.used_bytes > k.formula_used_bytes
                && k.used_bytes
                    % (k.formula_used_bytes / k.positions as u64
                        * kvlab_paged::DEFAULT_BLOCK_SIZE as u64)
                    == 0
            {
                "formula rounded up to 16-token blocks"
            } else {
                "used ≠ formula"
            };
            vec![
                k.model.clone(),
                k.engine.clone(),
                format!("{}/{}", k.positions, k.max_seq_len),
                mib(k.used_bytes),
                mib(k.reserved_bytes),
                mib(k.formula_used_bytes),
                mib(k.formula_max_len_bytes),
                ok.into(),
            ]
        })
        .collect();
    table::print(
        &[
            "model",
            "engine",
            "positions/max",
            "used",
            "reserved",
            "formula used",
            "formula max-len",
            "check",
        ],
        &rows,
    );

    if !r.peak_rss.is_empty() {
        println!("\n== peak resident memory per engine (child process; MiB) ==");
        let rows: Vec<Vec<String>> = r
            .peak_rss
            .iter()
            .map(|x| {
                vec![
                    x.model.clone(),
                    x.engine.clone(),
                    format!("{}", x.positions),
                    mib(x.rss_after_load_bytes),
                    mib(x.peak_rss_bytes),
                    mib(x.engine_peak_extra_bytes),
                ]
            })
            .collect();
        table::print(
            &[
                "model",
                "engine",
                "positions",
                "after load",
                "peak",
                "peak − load",
            ],
            &rows,
        );
    }
    if let Some(p) = r.process_peak_rss_bytes {
        println!(
            "bench process peak RSS (all models and engines): {} MiB",
            mib(p)
        );
    }

    println!(
        "\n== paging waste (reserved KV slots holding no token; 1,000 requests, max_seq_len 2,048) =="
    );
    let rows: Vec<Vec<String>> = r
        .waste
        .iter()
        .map(|w| {
            vec![
                w.workload.clone(),
                w.scheme.clone(),
                w.block_size.map_or("-".into(), |b| b.to_string()),
                f(w.mean_reserved_slots),
                format!("{:.1} %", 100.0 * w.final_waste_frac),
                format!("{:.1} %", 100.0 * w.time_avg_waste_frac),
            ]
        })
        .collect();
    table::print(
        &[
            "workload",
            "scheme",
            "block",
            "mean reserved slots",
            "waste at end",
            "waste over time",
        ],
        &rows,
    );

    println!(
        "\n== roofline (must-move bytes = weights once + KV read; limit {:.1} GB/s measured) ==",
        r.bandwidth.peak_gb_per_s
    );
    let rows: Vec<Vec<String>> = r
        .roofline
        .iter()
        .map(|x| {
            vec![
                x.model.clone(),
                x.engine.clone(),
                x.what.clone(),
                mib(x.bytes_per_step as u64),
                f(x.flops_per_step / 1e6),
                f(x.seconds_per_step * 1e3),
                f(x.achieved_gb_per_s),
                f(x.achieved_gflop_per_s),
                format!(
                    "{:.1} %{}",
                    100.0 * x.bandwidth_fraction,
                    if x.cache_resident { " (in cache)" } else { "" }
                ),
            ]
        })
        .collect();
    table::print(
        &[
            "model",
            "engine",
            "measured",
            "MiB/step",
            "MFLOP/step",
            "ms/step",
            "GB/s",
            "GFLOP/s",
            "of bandwidth",
        ],
        &rows,
    );

    println!("\n== headline ==");
    for s in &r.headline.generation_speedup_vs_naive {
        println!(
            "{}: {} is {:.1}× faster than naive over a {}-position generation (range {:.1}–{:.1}, {} reps)",
            s.model, s.engine, s.value, s.positions, s.min, s.max, s.reps
        );
    }
    for b in r
        .headline
        .bandwidth_fraction_batch1
        .iter()
        .filter(|b| b.engine == "cpu")
    {
        println!(
            "{}: the cpu engine at batch 1 moves {:.1} GB/s, {:.0} % of the measured {:.1} GB/s{}",
            b.model,
            b.achieved_gb_per_s,
            100.0 * b.fraction,
            b.peak_gb_per_s,
            if b.cache_resident {
                " (weights fit in the last-level cache: not DRAM-bound)"
            } else {
                ""
            }
        );
    }

    if let Some(b) = &r.baseline {
        println!(
            "\n== against baseline {} ({}, commit {}, {}){} ==",
            b.file,
            b.baseline_machine,
            b.baseline_commit,
            b.baseline_date,
            if b.same_cpu_model {
                ""
            } else {
                " — another CPU model: only ratios compare"
            }
        );
        if !b.machine_differences.is_empty() {
            println!(
                "another machine ({}): absolute times do not compare, and speedups move with \
                 core counts and SIMD width",
                b.machine_differences.join("; ")
            );
        }
        let rows: Vec<Vec<String>> = b
            .comparisons
            .iter()
            .map(|c| {
                vec![
                    c.key.clone(),
                    f(c.baseline),
                    f(c.now),
                    format!("{:+.1} %", 100.0 * c.change),
                    format!("±{:.1} %", 100.0 * c.tolerance),
                    c.verdict.clone(),
                ]
            })
            .collect();
        table::print(
            &[
                "speedup",
                "baseline",
                "now",
                "change",
                "tolerance",
                "verdict",
            ],
            &rows,
        );
        if b.comparisons.is_empty() {
            println!(
                "no ratio in common: keys carry the model's context, so compare a full run with a \
                 full baseline and a --quick run with a --quick one"
            );
        }
        if !b.only_in_baseline.is_empty() {
            println!("not measured now: {}", b.only_in_baseline.join(", "));
        }
        println!("{} regression(s)", b.regressions);
    }
    for n in &r.notes {
        println!("note: {n}");
    }
}

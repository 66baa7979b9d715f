//! The run's report: the JSON document (schema.md) and the terminal tables.

use kvlab_engines::EngineKind;
use kvlab_paged::waste::WasteRow;
use serde::Serialize;

use super::bandwidth::Bandwidth;
use super::baseline::BaselineReport;
use super::decode::DecodeRun;
use super::machine::Machine;
use super::memory::KvRow;
use super::models::ModelInfo;
use super::plan::Plan;
use super::ratios::Ratio;
use super::roofline::RooflineRow;
use super::stats::Summary;
use super::suite::Results;
use crate::table::{self, Column};

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
    #[serde(flatten)]
    pub results: Results,
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

/// The run's notes: the contiguous engines' batching, a machine busy at the start, then the
/// run's own (`extra`).
pub fn notes(machine: &Machine, extra: Vec<String>) -> Vec<String> {
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
    notes.extend(extra);
    notes
}

/// The numbers the README quotes, from the decode runs, the ratios and the roofline.
pub fn headline_of(
    decode: &[DecodeRun],
    ratios: &[Ratio],
    roofline: &[RooflineRow],
    peak: f64,
) -> Headline {
    let generation_speedup_vs_naive = ratios
        .iter()
        .filter(|r| {
            r.what == "decode generation"
                && r.reference == EngineKind::REFERENCE
                && [256, 1024].contains(&r.at)
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
        .filter(|r| {
            r.batch == 1
                && r.what.starts_with("decode positions")
                && r.engine != EngineKind::REFERENCE
        })
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

fn mmm(s: &Summary) -> String {
    format!("{} / {} / {}", f(s.min), f(s.median), f(s.max))
}

fn percent(x: f64) -> String {
    format!("{:.1} %", 100.0 * x)
}

/// Prints every table of the report, in run order.
pub fn print(r: &Report) {
    machine(r);
    decode(r);
    speedups(r);
    prefill(r);
    latency(r);
    batch(r);
    continuous(r);
    kv_memory(r);
    peak_rss(r);
    waste(r);
    roofline(r);
    headline(r);
    if let Some(b) = &r.baseline {
        baseline(b);
    }
    for n in &r.notes {
        println!("note: {n}");
    }
}

/// A titled table.
fn section<T>(title: &str, items: &[T], columns: &[Column<T>]) {
    println!("\n== {title} ==");
    table::columns(items, columns);
}

fn machine(r: &Report) {
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
    let passes: Vec<String> = r
        .bandwidth
        .rows
        .iter()
        .map(|b| format!("{} {} {}T {:.1}", b.when, b.kind, b.threads, b.gb_per_s.max))
        .collect();
    println!(
        "memory bandwidth, GB/s (best pass): {}; roofline limit {:.1} GB/s ({})",
        passes.join(", "),
        r.bandwidth.peak_gb_per_s,
        r.bandwidth.peak_from
    );
}

fn decode(r: &Report) {
    let at = |d: &DecodeRun, p: usize| d.step_ms.median.get(p).map_or("-".into(), |x| f(*x));
    section(
        "decode latency per position (batch 1; ms per step: min / median / max over reps)",
        &r.results.decode,
        &[
            ("model", &|d| d.model.clone()),
            ("engine", &|d| d.engine.clone()),
            ("positions", &|d| d.positions.to_string()),
            ("reps", &|d| d.reps.to_string()),
            ("ms @1", &|d| at(d, 1)),
            ("ms @mid", &|d| at(d, d.positions / 2)),
            ("ms @last", &|d| at(d, d.positions - 1)),
            ("total ms", &|d| {
                d.cumulative.last().map_or("-".into(), |c| mmm(&c.total_ms))
            }),
            ("decode tok/s", &|d| mmm(&d.decode_tok_per_s)),
            ("growth last/16", &|d| {
                d.growth
                    .as_ref()
                    .map_or("-".into(), |g| format!("{}×", f(g.last_vs_16)))
            }),
            ("avg/avg64", &|d| {
                d.growth
                    .as_ref()
                    .map_or("-".into(), |g| format!("{}×", f(g.run_avg_vs_64)))
            }),
            ("tokens fnv", &|d| format!("{:016x}", d.tokens_fnv)),
        ],
    );
}

fn speedups(r: &Report) {
    let rows: Vec<&Ratio> = r
        .ratios
        .iter()
        .filter(|x| x.what == "decode generation")
        .collect();
    section(
        "generation speedup (total time of the reference ÷ engine, same run, per-rep pairs)",
        &rows,
        &[
            ("model", &|x| x.model.clone()),
            ("engines", &|x| format!("{} vs {}", x.engine, x.reference)),
            ("positions", &|x| x.at.to_string()),
            ("speedup", &|x| format!("{}×", f(x.value))),
            ("range", &|x| format!("{}–{}", f(x.min), f(x.max))),
            ("noise", &|x| percent(x.noise)),
            ("n", &|x| x.n.to_string()),
        ],
    );
}

fn prefill(r: &Report) {
    section(
        "prefill (prompt tokens/s: min / median / max)",
        &r.results.prefill,
        &[
            ("model", &|p| p.model.clone()),
            ("engine", &|p| p.engine.clone()),
            ("prompt", &|p| p.prompt_len.to_string()),
            ("tok/s", &|p| mmm(&p.tok_per_s)),
            ("ms (median)", &|p| f(p.ms.median)),
        ],
    );
}

fn latency(r: &Report) {
    let p = |s: &Summary| format!("{} / {} / {}", f(s.median), f(s.p90), f(s.p99));
    section(
        "request latency (TTFT and TPOT, ms: p50 / p90 / p99 over reps)",
        &r.results.latency,
        &[
            ("model", &|l| l.model.clone()),
            ("engine", &|l| l.engine.clone()),
            ("prompt+gen", &|l| {
                format!("{}+{}", l.prompt_len, l.generate)
            }),
            ("reps", &|l| l.ttft_ms.n.to_string()),
            ("TTFT ms", &|l| p(&l.ttft_ms)),
            ("TPOT ms", &|l| p(&l.tpot_ms)),
        ],
    );
}

fn batch(r: &Report) {
    section(
        "batched decode throughput (decode tok/s, all sequences: min / median / max)",
        &r.results.batch,
        &[
            ("model", &|b| b.model.clone()),
            ("engine", &|b| b.engine.clone()),
            ("mode", &|b| b.mode.clone()),
            ("batch", &|b| b.batch.to_string()),
            ("tok/s", &|b| mmm(&b.tok_per_s)),
        ],
    );
}

fn continuous(r: &Report) {
    if r.results.continuous.is_empty() {
        return;
    }
    section(
        "arrival trace (continuous batching vs one request at a time)",
        &r.results.continuous,
        &[
            ("model", &|c| c.model.clone()),
            ("engine", &|c| c.engine.clone()),
            ("mode", &|c| c.mode.clone()),
            ("requests", &|c| c.num_requests.to_string()),
            ("prompt+gen tokens", &|c| {
                format!("{}+{}", c.prompt_tokens, c.generated_tokens)
            }),
            ("s", &|c| f(c.engine_seconds)),
            ("tok/s", &|c| f(c.total_tok_per_s)),
            ("mean batch", &|c| c.mean_batch.map_or("-".into(), f)),
            ("preempt", &|c| {
                c.preemptions.map_or("-".into(), |p| p.to_string())
            }),
        ],
    );
}

/// How a KV row's bytes relate to the formula.
fn kv_check(k: &KvRow) -> &'static str {
    let block = kvlab_paged::DEFAULT_BLOCK_SIZE as u64;
    if k.used_bytes == 0 && k.reserved_bytes == 0 {
        "no cache"
    } else if k.used_bytes == k.formula_used_bytes {
        "used = formula"
    } else if k.used_bytes > k.formula_used_bytes
        && k.used_bytes
            .is_multiple_of(k.formula_used_bytes / k.positions as u64 * block)
    {
        "formula rounded up to 16-token blocks"
    } else {
        "used ≠ formula"
    }
}

fn kv_memory(r: &Report) {
    section(
        "KV cache bytes (MiB) vs the formula 2 × n_layers × n_kv_heads × head_dim × 4 B × positions",
        &r.results.kv_memory,
        &[
            ("model", &|k| k.model.clone()),
            ("engine", &|k| k.engine.clone()),
            ("positions/max", &|k| {
                format!("{}/{}", k.positions, k.max_seq_len)
            }),
            ("used", &|k| mib(k.used_bytes)),
            ("reserved", &|k| mib(k.reserved_bytes)),
            ("formula used", &|k| mib(k.formula_used_bytes)),
            ("formula max-len", &|k| mib(k.formula_max_len_bytes)),
            ("check", &|k| kv_check(k).into()),
        ],
    );
}

fn peak_rss(r: &Report) {
    if !r.results.peak_rss.is_empty() {
        section(
            "peak resident memory per engine (child process; MiB)",
            &r.results.peak_rss,
            &[
                ("model", &|x| x.model.clone()),
                ("engine", &|x| x.engine.clone()),
                ("positions", &|x| x.positions.to_string()),
                ("after load", &|x| mib(x.rss_after_load_bytes)),
                ("peak", &|x| mib(x.peak_rss_bytes)),
                ("peak − load", &|x| mib(x.engine_peak_extra_bytes)),
            ],
        );
    }
    if let Some(p) = r.process_peak_rss_bytes {
        println!(
            "bench process peak RSS (all models and engines): {} MiB",
            mib(p)
        );
    }
}

fn waste(r: &Report) {
    section(
        "paging waste (reserved KV slots holding no token; 1,000 requests, max_seq_len 2,048)",
        &r.waste,
        &[
            ("workload", &|w| w.workload.clone()),
            ("scheme", &|w| w.scheme.clone()),
            ("block", &|w| {
                w.block_size.map_or("-".into(), |b| b.to_string())
            }),
            ("mean reserved slots", &|w| f(w.mean_reserved_slots)),
            ("waste at end", &|w| percent(w.final_waste_frac)),
            ("waste over time", &|w| percent(w.time_avg_waste_frac)),
        ],
    );
}

fn roofline(r: &Report) {
    section(
        &format!(
            "roofline (must-move bytes = weights once + KV read; limit {:.1} GB/s measured)",
            r.bandwidth.peak_gb_per_s
        ),
        &r.roofline,
        &[
            ("model", &|x| x.model.clone()),
            ("engine", &|x| x.engine.clone()),
            ("measured", &|x| x.what.clone()),
            ("MiB/step", &|x| mib(x.bytes_per_step as u64)),
            ("MFLOP/step", &|x| f(x.flops_per_step / 1e6)),
            ("ms/step", &|x| f(x.seconds_per_step * 1e3)),
            ("GB/s", &|x| f(x.achieved_gb_per_s)),
            ("GFLOP/s", &|x| f(x.achieved_gflop_per_s)),
            ("of bandwidth", &|x| {
                let cache = if x.cache_resident { " (in cache)" } else { "" };
                format!("{}{cache}", percent(x.bandwidth_fraction))
            }),
        ],
    );
}

fn headline(r: &Report) {
    println!("\n== headline ==");
    for s in &r.headline.generation_speedup_vs_naive {
        println!(
            "{}: {} is {:.1}× faster than naive over a {}-position generation (range {:.1}–{:.1}, {} reps)",
            s.model, s.engine, s.value, s.positions, s.min, s.max, s.reps
        );
    }
    for b in r.headline.bandwidth_fraction_batch1.iter() {
        if b.engine != EngineKind::Cpu {
            continue;
        }
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
}

fn baseline(b: &BaselineReport) {
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
            "another machine ({}): absolute times do not compare, and speedups move with core \
             counts and SIMD width",
            b.machine_differences.join("; ")
        );
    }
    table::columns(
        &b.comparisons,
        &[
            ("speedup", &|c| c.key.clone()),
            ("baseline", &|c| f(c.baseline)),
            ("now", &|c| f(c.now)),
            ("change", &|c| format!("{:+.1} %", 100.0 * c.change)),
            ("tolerance", &|c| format!("±{:.1} %", 100.0 * c.tolerance)),
            ("verdict", &|c| c.verdict.clone()),
        ],
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

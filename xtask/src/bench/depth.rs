//! `cargo xtask depth` (also `cargo xtask bench --depth`): decode speed against context depth,
//! kvlab against llama.cpp with and without flash attention, on the same GGUF and threads.
//!
//! Each side fills one sequence with the same text to each depth in turn and times `n_gen` greedy
//! decode steps there (`kvlab depth --json`; `scripts/peers/llama_cpp_depth.py` through
//! llama-cpp-python, with llama.cpp's default f16 cache and its tools' sliding-window cache). A
//! decode step at position `pos` reads the weights and the keys and values it attends to, so
//! beside tokens/s each depth carries the bytes a step reads (weights + `kv_read_bytes`), and the
//! verdict asks whether kvlab's per-token time grows no faster than those bytes. Writes
//! depth.json (schema.md) and depth.svg/.png (per-token time against position); for another
//! model than the default, depth_MODEL.json, .svg and .png.
//!
//! `--fill random` fills each depth without computing on both sides (`kvlab depth --fill
//! random`; the script loads a saved sequence state of random f16 keys and values): a 1B
//! model's prefill to 32,768 positions takes ~10 minutes a side on 2 cores, its decode steps
//! seconds. The decoded ids then follow different random caches and are not compared. A
//! synthetic model without a tokenizer (the Llama-3.2-1B shape) gets Llama 2's, padded to its
//! vocabulary (`peers::llama2c_tokenizer_of`).

use std::path::{Path, PathBuf};
use std::process::Command;

use anyhow::{Context, Result, bail};
use plotters::prelude::{Color, SeriesLabelPosition};
use serde::{Deserialize, Serialize};

use kvlab_cli::args::usize_in;
pub use kvlab_cli::fill::{FILL_TEXT, Fill};

use super::machine;
use super::peers::{build_kvlab, gguf_of, llama_cpp_python, output};
use super::plot::{Line, Panel, Series, axis, color, draw_if, write_pair};
use super::serve::peer::{arch_usize, context_length};
use super::stats::Summary;
use crate::paths::{self, workspace_root};

/// The model measured by default; its record is depth.json, another model's depth_MODEL.json.
pub const DEFAULT_MODEL: &str = "gemma-3-270m";

/// The depths measured by default (those within the model's context).
const DEPTHS: [usize; 8] = [512, 1024, 2048, 4096, 8192, 16384, 24576, 32768];

/// The goal at the deepest point: kvlab's decode tokens/s over llama.cpp's, both modes.
const GOAL: f64 = 1.2;

#[derive(clap::Args)]
#[command(
    after_help = "env: KVLAB_MODELS (folder of real checkpoints), KVLAB_PYTHON (a python \
                        with llama-cpp-python), KVLAB_BIN (the kvlab binary to measure)"
)]
pub struct DepthArgs {
    /// The model (a manifest GGUF, or one exported as an f32 GGUF)
    #[arg(long, value_name = "NAME", default_value = DEFAULT_MODEL)]
    pub model: String,
    /// Threads of both sides [default: physical cores]
    #[arg(long, short = 't', value_name = "N", value_parser = usize_in(1, 1 << 16))]
    pub threads: Option<usize>,
    /// A depth in positions (repeatable) [default: 512 ... 32768 within the model's context]
    #[arg(long = "depth", short = 'd', value_name = "N", value_parser = usize_in(64, 1 << 20))]
    pub depths: Vec<usize>,
    /// Greedy tokens decoded and timed at each depth
    #[arg(long, short = 'n', value_name = "N", default_value_t = 32,
          value_parser = usize_in(1, 1024))]
    pub n_gen: usize,
    /// kvlab's KV cache type (llama.cpp keeps its default, f16)
    #[arg(long, default_value_t = kvlab_model::KvDtype::F16,
          value_parser = kvlab_cli::args::kv_dtype())]
    pub kv_dtype: kvlab_model::KvDtype,
    /// How both sides fill each depth: `text` (prefill the fill text) or `random` (random
    /// keys and values written without computing; models with one KV cache, no sliding windows)
    #[arg(long, value_enum, default_value_t = Fill::Text)]
    pub fill: Fill,
    /// Repetitions; each runs the three sides, in a rotated order
    #[arg(long, value_name = "N", default_value_t = 1, value_parser = usize_in(1, 100))]
    pub reps: usize,
    /// Where depth.json and the figure go [default: target/kvlab-bench]
    #[arg(long, value_name = "DIR")]
    pub out: Option<PathBuf>,
}

/// One depth of one side's run, as `kvlab depth --json` and the script print it.
#[derive(Debug, Clone, Deserialize, Serialize)]
pub struct DepthPoint {
    pub depth: usize,
    pub fill_tokens_per_s: f64,
    pub median_step_ms: f64,
    pub decode_tokens_per_s: f64,
    pub ids: Vec<u32>,
    /// KV bytes the step at this depth reads (kvlab's side only).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub kv_read_bytes: Option<u64>,
}

/// One side's run as printed.
#[derive(Debug, Deserialize)]
struct SideRun {
    fill_ids: Vec<u32>,
    /// The weights' bytes (kvlab's side only).
    #[serde(default)]
    weight_bytes: Option<u64>,
    depths: Vec<DepthPoint>,
}

/// One side over the reps: each depth's median over the reps.
#[derive(Debug, Serialize)]
pub struct Side {
    /// "kvlab", "llama.cpp", "llama.cpp (flash attention)".
    pub name: String,
    /// The KV cache's reserved bytes at the deepest context.
    pub kv_reserved_bytes: Option<u64>,
    pub points: Vec<DepthPoint>,
}

/// One depth's comparison.
#[derive(Debug, Serialize)]
pub struct Ratio {
    pub depth: usize,
    /// KV bytes kvlab's step reads at this depth (sliding windows at their window).
    pub kv_read_bytes: u64,
    /// kvlab's decode tokens/s over llama.cpp's, without and with flash attention.
    pub vs_llama_cpp: f64,
    pub vs_llama_cpp_fa: f64,
    /// kvlab's median step time over the first depth's, and (weights + KV read) over the first
    /// depth's: the first no larger than the second is "growing no faster than the bytes read".
    pub time_growth: f64,
    pub bytes_growth: f64,
}

#[derive(Debug, Serialize)]
pub struct DepthReport {
    pub format_version: u32,
    pub kind: &'static str,
    pub machine: String,
    pub model: String,
    pub threads: usize,
    pub n_gen: usize,
    pub reps: usize,
    pub kv_dtype: String,
    pub llama_cpp_python: String,
    /// How each depth was filled (absent in records before random fill: text).
    pub fill: Fill,
    /// Both sides tokenized the fill text to the same ids.
    pub same_fill_ids: bool,
    /// Decoded ids equal between kvlab and llama.cpp (no flash attention), out of all; not
    /// compared (null) after a random fill, whose caches differ.
    pub same_decoded_ids: Option<(usize, usize)>,
    pub weight_bytes: u64,
    pub sides: Vec<Side>,
    pub ratios: Vec<Ratio>,
    /// At the deepest point: both ratios ≥ the goal, and time growth ≤ bytes growth.
    pub goal_met: bool,
}

/// `cargo xtask depth`: runs the comparison, prints its table, writes depth.json and the figure.
///
/// # Errors
/// A peer or model that is missing (with how to get it), a side that fails, an unwritable
/// output folder.
pub fn command(a: &DepthArgs) -> Result<()> {
    let threads = a.threads.unwrap_or_else(kvlab_cpu::threads::physical_cores);
    let kvlab = build_kvlab()?;
    let (python, version) = llama_cpp_python()?;
    let out = a.out.clone().unwrap_or_else(paths::bench_out);
    std::fs::create_dir_all(&out).with_context(|| format!("creating {}", out.display()))?;
    let (gguf, tokenizer) = gguf_of(&kvlab, &out, &a.model)?;
    if a.fill == Fill::Random
        && let Some(window) = sliding_window(&gguf)?
    {
        bail!(
            "{} has sliding-window layers (window {window}), which llama.cpp keeps in a second KV cache that the random fill does not write; use --fill text",
            a.model
        );
    }
    // An exported model is given the tokenizer its GGUF was written with (a synthetic model has
    // none of its own: Llama 2's, padded).
    let tokenizer: Vec<std::ffi::OsString> = match tokenizer {
        Some(t) => vec!["--tokenizer".into(), t.into()],
        None => Vec::new(),
    };
    let depths = plan(&a.depths, a.n_gen, Some(context_length(&gguf)?))?;
    let m = machine::detect();
    let d = depths
        .iter()
        .map(ToString::to_string)
        .collect::<Vec<_>>()
        .join(",");
    let (t, n) = (threads.to_string(), a.n_gen.to_string());
    let mut runs: [Vec<(SideRun, Option<u64>)>; 3] = Default::default();
    for rep in 0..a.reps {
        for k in 0..3 {
            let side = (k + rep) % 3;
            eprintln!(
                "rep {}/{}: {} to depth {}",
                rep + 1,
                a.reps,
                SIDE_NAMES[side],
                depths[depths.len() - 1]
            );
            let run = if side == 0 {
                let (so, _) = output(
                    Command::new(&kvlab)
                        .args(["depth", "-m", &a.model, "-t", &t, "-n", &n, "-d", &d])
                        .args(["--kv-dtype", &a.kv_dtype.to_string(), "-p", FILL_TEXT])
                        .args(["--fill", a.fill.arg()])
                        .args(&tokenizer)
                        .arg("--json"),
                    "kvlab depth",
                )?;
                let v: serde_json::Value = serde_json::from_str(last_line(&so))?;
                let reserved = v["kv_reserved_bytes"].as_u64();
                (serde_json::from_value(v)?, reserved)
            } else {
                let script = workspace_root().join("scripts/peers/llama_cpp_depth.py");
                let mut cmd = Command::new(&python);
                cmd.arg(&script)
                    .arg(&gguf)
                    .args(["--threads", &t, "--depths", &d, "--n-gen", &n])
                    .args(["--prompt", FILL_TEXT, "--fill", a.fill.arg()]);
                if side == 2 {
                    cmd.arg("--flash-attn");
                }
                let (so, se) = output(&mut cmd, "llama_cpp_depth.py")?;
                (
                    serde_json::from_str(last_line(&so))?,
                    llama_cpp_kv_bytes(&se),
                )
            };
            runs[side].push(run);
        }
    }
    let report = report(a, &runs, &depths, threads, version, machine::line(&m))?;
    print(&report);
    let stem = match a.model.as_str() {
        DEFAULT_MODEL => "depth".to_string(),
        model => format!("depth_{model}"),
    };
    let json = out.join(format!("{stem}.json"));
    std::fs::write(&json, serde_json::to_string_pretty(&report)?)?;
    println!("wrote {}", json.display());
    for f in draw_if(true, || figure(&out, &stem, &report))? {
        println!("wrote {}", out.join(f).display());
    }
    Ok(())
}

const SIDE_NAMES: [&str; 3] = ["kvlab", "llama.cpp", "llama.cpp (flash attention)"];

/// The window of a GGUF's sliding-window layers, if it has any (`ARCH.attention.sliding_window`).
///
/// # Errors
/// As [`arch_usize`].
fn sliding_window(gguf: &Path) -> Result<Option<usize>> {
    arch_usize(gguf, "attention.sliding_window")
}

/// The last line of a side's stdout (its JSON; llama-cpp-python may print before it).
fn last_line(s: &str) -> &str {
    s.lines().rev().find(|l| !l.trim().is_empty()).unwrap_or("")
}

/// The depths to run: the given ones, or the defaults within `context`, sorted.
fn plan(given: &[usize], n_gen: usize, context: Option<usize>) -> Result<Vec<usize>> {
    let cap = context.unwrap_or(usize::MAX);
    let mut d: Vec<usize> = if given.is_empty() {
        DEPTHS.iter().copied().filter(|&x| x <= cap).collect()
    } else {
        given.to_vec()
    };
    d.sort_unstable();
    d.dedup();
    match d.iter().find(|&&x| x > cap || x <= n_gen) {
        Some(bad) => bail!(
            "depth {bad} is outside (n_gen, context] = ({n_gen}, {}]",
            context.map_or("?".into(), |c| c.to_string())
        ),
        None if d.is_empty() => bail!("no depth fits the model's context"),
        None => Ok(d),
    }
}

/// The KV cache bytes llama.cpp's log names: the sum of its `llama_kv_cache: size = X MiB`
/// lines (one per cache: global layers and sliding-window layers).
fn llama_cpp_kv_bytes(log: &str) -> Option<u64> {
    let mib: Vec<f64> = log
        .lines()
        .filter_map(|l| l.strip_prefix("llama_kv_cache: size ="))
        .filter_map(|r| r.split_whitespace().next()?.parse().ok())
        .collect();
    (!mib.is_empty()).then(|| (mib.iter().sum::<f64>() * f64::from(1 << 20)).round() as u64)
}

/// One side's reps folded into each depth's medians (the first rep's ids).
fn fold(name: &str, runs: &[(SideRun, Option<u64>)]) -> Side {
    let first = &runs[0].0;
    let points = (first.depths.iter().enumerate())
        .map(|(i, p)| {
            let at = |f: &dyn Fn(&DepthPoint) -> f64| {
                Summary::of(
                    &runs
                        .iter()
                        .map(|(r, _)| f(&r.depths[i]))
                        .collect::<Vec<_>>(),
                )
                .median
            };
            DepthPoint {
                depth: p.depth,
                fill_tokens_per_s: at(&|x| x.fill_tokens_per_s),
                median_step_ms: at(&|x| x.median_step_ms),
                decode_tokens_per_s: at(&|x| x.decode_tokens_per_s),
                ids: p.ids.clone(),
                kv_read_bytes: p.kv_read_bytes,
            }
        })
        .collect();
    Side {
        name: name.into(),
        kv_reserved_bytes: runs[0].1,
        points,
    }
}

fn report(
    a: &DepthArgs,
    runs: &[Vec<(SideRun, Option<u64>)>; 3],
    depths: &[usize],
    threads: usize,
    llama_cpp_python: String,
    machine: String,
) -> Result<DepthReport> {
    let sides: Vec<Side> = (0..3).map(|s| fold(SIDE_NAMES[s], &runs[s])).collect();
    if sides.iter().any(|s| s.points.len() != depths.len()) {
        bail!("a side measured other depths than {depths:?}");
    }
    // kvlab's run names the bytes a step reads: its weights, and each depth's KV.
    let kvlab_run = &runs[0][0].0;
    let weight_bytes = kvlab_run
        .weight_bytes
        .context("kvlab depth printed no weight_bytes")?;
    let kv_read = |i: usize| kvlab_run.depths[i].kv_read_bytes.unwrap_or(0);
    let first = &sides[0].points[0];
    let ratios: Vec<Ratio> = (0..depths.len())
        .map(|i| Ratio {
            depth: depths[i],
            kv_read_bytes: kv_read(i),
            vs_llama_cpp: sides[0].points[i].decode_tokens_per_s
                / sides[1].points[i].decode_tokens_per_s,
            vs_llama_cpp_fa: sides[0].points[i].decode_tokens_per_s
                / sides[2].points[i].decode_tokens_per_s,
            time_growth: sides[0].points[i].median_step_ms / first.median_step_ms,
            bytes_growth: (weight_bytes + kv_read(i)) as f64 / (weight_bytes + kv_read(0)) as f64,
        })
        .collect();
    let last = ratios.last().context("no depth")?;
    let decoded = (sides[0].points.iter().zip(&sides[1].points))
        .flat_map(|(k, l)| k.ids.iter().zip(&l.ids))
        .fold((0, 0), |(same, all), (x, y)| {
            (same + usize::from(x == y), all + 1)
        });
    Ok(DepthReport {
        format_version: 1,
        kind: "kvlab-bench-depth",
        machine,
        model: a.model.clone(),
        threads,
        n_gen: a.n_gen,
        reps: a.reps,
        kv_dtype: a.kv_dtype.to_string(),
        llama_cpp_python,
        fill: a.fill,
        same_fill_ids: runs[0][0].0.fill_ids == runs[1][0].0.fill_ids,
        same_decoded_ids: (a.fill == Fill::Text).then_some(decoded),
        weight_bytes,
        goal_met: last.vs_llama_cpp >= GOAL
            && last.vs_llama_cpp_fa >= GOAL
            && last.time_growth <= last.bytes_growth,
        sides,
        ratios,
    })
}

fn print(r: &DepthReport) {
    println!(
        "decode at depth, {} ({} threads a side, n_gen {}, kvlab KV {}; {})",
        r.model, r.threads, r.n_gen, r.kv_dtype, r.machine
    );
    let tps = |s: usize, i: &usize| format!("{:.1}", r.sides[s].points[*i].decode_tokens_per_s);
    let x = |i: &usize| &r.ratios[*i];
    let rows: Vec<usize> = (0..r.ratios.len()).collect();
    crate::table::columns(
        &rows,
        &[
            ("depth", &|i| x(i).depth.to_string()),
            ("kvlab tok/s", &|i| tps(0, i)),
            ("llama.cpp", &|i| tps(1, i)),
            ("llama.cpp FA", &|i| tps(2, i)),
            ("× llama.cpp", &|i| format!("{:.2}", x(i).vs_llama_cpp)),
            ("× FA", &|i| format!("{:.2}", x(i).vs_llama_cpp_fa)),
            ("KV read/token", &|i| {
                format!("{:.1} MiB", x(i).kv_read_bytes as f64 / 1048576.0)
            }),
            ("time growth", &|i| format!("{:.2}", x(i).time_growth)),
            ("bytes growth", &|i| format!("{:.2}", x(i).bytes_growth)),
        ],
    );
    let mib = |b: Option<u64>| b.map_or("?".into(), |b| format!("{:.1} MiB", b as f64 / 1048576.0));
    println!(
        "KV cache reserved: kvlab {}, llama.cpp {}, with flash attention {}; fill ids {}; {}",
        mib(r.sides[0].kv_reserved_bytes),
        mib(r.sides[1].kv_reserved_bytes),
        mib(r.sides[2].kv_reserved_bytes),
        if r.same_fill_ids {
            "the same"
        } else {
            "DIFFER"
        },
        match r.same_decoded_ids {
            Some((same, all)) => format!("decoded ids equal {same}/{all}"),
            None => "random fill: decoded ids not compared".into(),
        }
    );
    println!(
        "goal at the deepest point (≥ {GOAL}× llama.cpp with and without flash attention, time growing no faster than bytes read): {}",
        if r.goal_met { "met" } else { "NOT met" }
    );
}

/// Per-token time against position, one line per side; the bytes-read line scaled to kvlab's
/// first point (dashed) shows where time would be if it grew as the bytes do.
fn figure(dir: &Path, stem: &str, r: &DepthReport) -> Result<Vec<String>> {
    let style = |s: usize| {
        let c = match s {
            0 => color("cpu"),
            1 => color("naive"),
            _ => color("cpu-paged"),
        };
        c.stroke_width(2)
    };
    let mut series: Vec<Series> = (0..3)
        .map(|s| {
            let pts = (r.sides[s].points.iter())
                .map(|p| (p.depth as f64, p.median_step_ms))
                .collect();
            Series::new(pts, style(s), Line::Circles).key(r.sides[s].name.clone(), style(s))
        })
        .collect();
    let t0 = r.sides[0].points[0].median_step_ms;
    let bytes: Vec<(f64, f64)> = (r.ratios.iter())
        .map(|x| (x.depth as f64, t0 * x.bytes_growth))
        .collect();
    series.push(
        Series::new(bytes, style(0), Line::Dashed(6, 4))
            .key("kvlab if time grew as bytes read".into(), style(0)),
    );
    let xs = r.ratios.iter().map(|x| x.depth as f64);
    let (xlo, xhi) = (
        xs.clone().fold(f64::INFINITY, f64::min) / 1.2,
        xs.fold(0.0, f64::max) * 1.2,
    );
    let ys = (r.sides.iter())
        .flat_map(|s| s.points.iter().map(|p| p.median_step_ms))
        .chain(r.ratios.iter().map(|x| t0 * x.bytes_growth));
    let yhi = ys.fold(0.0, f64::max) * 1.15;
    let panel = Panel {
        title: format!("decode at depth: {} ({} threads)", r.model, r.threads),
        x: axis(xlo..xhi, Some(2.0), "position of the decoded token (log)"),
        y: axis(0.0..yhi, None, "median decode step, ms"),
        legend: SeriesLabelPosition::UpperLeft,
        series,
    };
    write_pair(dir, stem, &[panel])
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn depths_default_to_those_within_the_context() {
        assert_eq!(plan(&[], 32, Some(2048)).unwrap(), vec![512, 1024, 2048]);
        assert_eq!(plan(&[900, 100], 32, None).unwrap(), vec![100, 900]);
        assert!(plan(&[4096], 32, Some(2048)).is_err());
        assert!(plan(&[], 32, Some(100)).is_err());
    }

    #[test]
    fn llama_cpp_kv_bytes_sum_both_caches() {
        let log = "llama_kv_cache:        CPU KV buffer size =    12.00 MiB\n\
                   llama_kv_cache: size =   12.00 MiB (  4096 cells,   3 layers,  1/1 seqs), K (f16):    6.00 MiB\n\
                   llama_kv_cache: size =   15.00 MiB (  1024 cells,  15 layers,  1/1 seqs)\n";
        assert_eq!(llama_cpp_kv_bytes(log), Some(27 << 20));
        assert_eq!(llama_cpp_kv_bytes("nothing"), None);
    }
}

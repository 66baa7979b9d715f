//! `kvlab-cuda-bench`: the CUDA engine's benchmarks, as one prebuilt binary that runs on a GPU
//! machine without a Rust toolchain (see crates/cuda/README.md).
//!
//! ```text
//! kvlab-cuda-bench [copy|attention|decode|waste|all]... [--quick] [--model NAME] [--out FILE]
//! kvlab-cuda-bench smoke [--out FILE]
//! ```
//! `smoke` is the first thing to run on a new GPU machine: it opens the device, names the CUDA
//! libraries this process actually mapped (and NVRTC's version), loads every kernel module
//! (cubin or PTX, timed) and runs one kernel whose answer it checks.
//! Prints a line per measurement on stderr and one JSON document on stdout (or into --out).
//! Without a GPU it prints SKIPPED and exits 0, unless KVLAB_REQUIRE_CUDA=1 (then exit 1).

use std::sync::Arc;

use kvlab_cuda::bench;
use kvlab_cuda::device::Device;
use kvlab_cuda::ops::{Launcher, Ops};
use kvlab_cuda::{CudaEngine, CudaOptions, DecodeAttention, Precision};
use serde_json::{Value, json};

struct Args {
    what: Vec<String>,
    quick: bool,
    model: String,
    out: Option<String>,
}

fn parse() -> Result<Args, String> {
    let mut a = Args {
        what: Vec::new(),
        quick: false,
        model: "llama-3-8b-shape".into(),
        out: None,
    };
    let mut it = std::env::args().skip(1);
    while let Some(s) = it.next() {
        match s.as_str() {
            "--quick" => a.quick = true,
            "--model" => a.model = it.next().ok_or("--model needs a name")?,
            "--out" => a.out = Some(it.next().ok_or("--out needs a file")?),
            "copy" | "attention" | "decode" | "waste" | "all" | "smoke" => a.what.push(s),
            "-h" | "--help" => return Err(String::new()),
            other => return Err(format!("unknown argument {other:?}")),
        }
    }
    if a.what.is_empty() || a.what.iter().any(|w| w == "all") {
        a.what = ["copy", "attention", "decode", "waste"]
            .map(String::from)
            .to_vec();
    }
    Ok(a)
}

impl Args {
    /// `quick` under --quick, else `full`.
    fn sizes<'a>(&self, quick: &'a [usize], full: &'a [usize]) -> &'a [usize] {
        if self.quick { quick } else { full }
    }
}

const USAGE: &str = "kvlab-cuda-bench smoke | [copy|attention|decode|waste|all]... [--quick] \
                     [--model NAME (a synthetic model of fixtures/models.json, default \
                     llama-3-8b-shape)] [--out FILE]";

fn main() {
    let args = match parse() {
        Ok(a) => a,
        Err(e) => {
            eprintln!("{e}\nusage: {USAGE}");
            std::process::exit(2);
        }
    };
    match kvlab_cuda::probe() {
        Ok(info) => eprintln!("{info}"),
        Err(e) if e.is_unavailable() && !kvlab_cuda::require_cuda() => {
            eprintln!("SKIPPED: {e}");
            write_report(&args, &json!({ "skipped": e.to_string() }));
            return;
        }
        Err(e) => {
            eprintln!("error: {e}");
            std::process::exit(1);
        }
    }
    match run(&args) {
        Ok(report) => write_report(&args, &report),
        Err(e) => {
            eprintln!("error: {e}");
            std::process::exit(1);
        }
    }
}

/// The JSON report to --out, or stdout.
fn write_report(args: &Args, report: &Value) {
    let text = serde_json::to_string_pretty(report).unwrap_or_default();
    match &args.out {
        Some(path) => {
            if let Err(e) = std::fs::write(path, text) {
                eprintln!("error: cannot write {path}: {e}");
                std::process::exit(1);
            }
            eprintln!("wrote {path}");
        }
        None => println!("{text}"),
    }
}

fn run(args: &Args) -> Result<Value, Box<dyn std::error::Error>> {
    if args.what.iter().any(|w| w == "smoke") {
        return smoke();
    }
    let mut report = serde_json::Map::new();
    let dev = Device::open(0)?;
    report.insert("device".into(), serde_json::to_value(&dev.info)?);
    let copy = bench::copy_bandwidth(&dev, 1 << 30, if args.quick { 5 } else { 20 })?;
    eprintln!("device-to-device copy: {:.0} GB/s", copy / 1e9);
    report.insert("copy_bytes_per_s".into(), json!(copy));

    if args.what.iter().any(|w| w == "attention") {
        let ops = Ops::new(&dev)?;
        // Llama-3-8B's attention: 32 query heads, 8 KV heads, head_dim 128; f16 K/V.
        let shape = synthetic_spec("llama-3-8b-shape")?.config();
        let batches = args.sizes(&[1, 64], &[1, 4, 16, 64, 256]);
        let contexts = args.sizes(&[512, 8192], &[512, 2048, 8192, 32768]);
        let mut rows = Vec::new();
        for &batch in batches {
            for &ctx in contexts {
                for choice in [
                    DecodeAttention::V1,
                    DecodeAttention::V2,
                    DecodeAttention::Auto,
                ] {
                    let r = bench::attention_bench::<half::f16, half::f16>(
                        &dev, &ops, &shape, batch, ctx, choice, 20, copy,
                    );
                    match r {
                        Ok(row) => {
                            eprintln!(
                                "attention batch {batch:>3} ctx {ctx:>5} {choice:?} -> {}: \
                                 {:.1} us, {:.0} GB/s ({:.0}% of copy)",
                                row.kernel,
                                row.seconds_per_call * 1e6,
                                row.bytes_per_s / 1e9,
                                100.0 * row.fraction_of_copy
                            );
                            rows.push(json!({ "choice": format!("{choice:?}"), "row": row }));
                        }
                        Err(e) => {
                            eprintln!("attention batch {batch} ctx {ctx}: SKIPPED ({e})");
                            rows.push(
                                json!({ "batch": batch, "context": ctx, "skipped": e.to_string() }),
                            );
                        }
                    }
                }
            }
        }
        report.insert("attention".into(), Value::Array(rows));
    }
    drop(dev);

    if args.what.iter().any(|w| w == "decode" || w == "waste") {
        let spec = synthetic_spec(&args.model)?;
        eprintln!(
            "building {} (synthetic, seed {}) on the host ...",
            args.model, spec.seed
        );
        let model = Arc::new(spec.build()?);
        let opts = CudaOptions {
            precision: Precision::F16,
            kv_dtype: kvlab_model::KvDtype::F16,
            ..CudaOptions::default()
        };
        let mut engine = CudaEngine::new(model.clone(), opts)?;
        eprintln!("{}", engine.pool_plan());
        report.insert("model".into(), json!(args.model));
        report.insert("pool".into(), serde_json::to_value(engine.pool_plan())?);
        report.insert("weight_bytes".into(), json!(engine.weight_bytes()));

        if args.what.iter().any(|w| w == "decode") {
            let (prompt, gen_tokens) = if args.quick { (128, 16) } else { (128, 128) };
            let batches = args.sizes(&[1, 64], &[1, 16, 64, 256]);
            let mut rows = Vec::new();
            for &batch in batches {
                let row = bench::decode_bench(&mut engine, batch, prompt, gen_tokens)?;
                eprintln!(
                    "decode batch {batch:>3}: {:.0} tokens/s, {:.2} ms/token per sequence \
                     ({} steps, {} preemptions)",
                    row.tokens_per_s, row.tpot_ms, row.decode_steps, row.num_preemptions
                );
                rows.push(row);
            }
            report.insert("decode".into(), serde_json::to_value(rows)?);
        }
        if args.what.iter().any(|w| w == "waste") {
            let (num_blocks, block_size) = engine.pool();
            // The standard uniform workload's context (prompts and outputs of 100..=1024
            // tokens), whatever the model's own: the comparison is of two reservation
            // policies over this pool, not of the model (stories42M's 1,024 is too short).
            let max_seq_len = 2048;
            let requests = kvlab_paged::uniform_requests(1000, 1);
            let w = bench::waste_comparison(num_blocks, block_size, max_seq_len, &requests)?;
            eprintln!(
                "waste at {} slots: paged {:.1}% (batch {} scheduled), max-length {:.1}% \
                 (batch {})",
                w.pool_slots,
                100.0 * w.paged.time_avg_waste_frac,
                w.paged_batch_scheduled,
                100.0 * w.max_length.time_avg_waste_frac,
                w.max_length_batch
            );
            report.insert("waste".into(), serde_json::to_value(w)?);
        }
    }
    Ok(Value::Object(report))
}

/// Opens the GPU, loads every module, runs `argmax` on known rows; reports what it loaded.
fn smoke() -> Result<Value, Box<dyn std::error::Error>> {
    let t = std::time::Instant::now();
    let dev = Device::open(0)?;
    eprintln!("opened {} in {:.2} s", dev.info, t.elapsed().as_secs_f64());
    let nvrtc = kvlab_cuda::nvrtc::check_nvrtc_version()?;
    eprintln!("NVRTC {}.{}", nvrtc.0, nvrtc.1);
    let t = std::time::Instant::now();
    let ops = Ops::new(&dev)?;
    let load_s = t.elapsed().as_secs_f64();
    eprintln!(
        "compiled and loaded {} kernel files in {load_s:.2} s (a 'loading PTX' warning above \
         means a file fell back from its cubin)",
        kvlab_cuda::kernels::FILES.len()
    );
    let libs = mapped_cuda_libraries();
    for l in &libs {
        eprintln!("mapped: {l}");
    }
    // argmax over 3 rows of 1,000 with a known winner in each.
    let (rows, vocab) = (3, 1000);
    let mut logits = vec![0.0f32; rows * vocab];
    let want = [7, 999, 500];
    for (r, &w) in want.iter().enumerate() {
        for v in 0..vocab {
            logits[r * vocab + v] = ((v * 37 + r) % 101) as f32 * 0.01;
        }
        logits[r * vocab + w] = 2.0;
    }
    let d_logits = ops.stream.clone_htod(&logits)?;
    let d_out = ops.stream.clone_htod(&[-1i32; 3])?;
    ops.argmax(ops.dev(&d_logits), ops.dev(&d_out), rows, vocab)?;
    let got = ops.stream.clone_dtoh(&d_out)?;
    dev.sync()?;
    let ok = got == want.map(|w| w as i32);
    eprintln!(
        "argmax kernel: got {got:?}, want {want:?}: {}",
        if ok { "ok" } else { "WRONG" }
    );
    if !ok {
        return Err(format!("argmax smoke test gave {got:?}, want {want:?}").into());
    }
    Ok(json!({
        "device": dev.info,
        "nvrtc": format!("{}.{}", nvrtc.0, nvrtc.1),
        "module_load_s": load_s,
        "mapped_libraries": libs,
        "argmax_ok": ok,
    }))
}

/// The CUDA libraries mapped into this process (from /proc/self/maps): which libcuda, libnvrtc
/// and libcublas the loader actually picked.
fn mapped_cuda_libraries() -> Vec<String> {
    let maps = std::fs::read_to_string("/proc/self/maps").unwrap_or_default();
    let mut libs: Vec<String> = maps
        .lines()
        .filter_map(|l| l.split_whitespace().nth(5))
        .filter(|p| {
            ["libcuda", "libnvrtc", "libcublas"]
                .iter()
                .any(|n| p.contains(n))
        })
        .map(String::from)
        .collect();
    libs.sort();
    libs.dedup();
    libs
}

/// The synthetic model `name` of fixtures/models.json.
fn synthetic_spec(name: &str) -> Result<&'static kvlab_model::SyntheticSpec, String> {
    let entry = kvlab_model::registry::entry(name)
        .ok_or_else(|| format!("no model {name:?} in fixtures/models.json"))?;
    entry
        .synthetic
        .as_ref()
        .ok_or_else(|| format!("{name} is not a synthetic model"))
}

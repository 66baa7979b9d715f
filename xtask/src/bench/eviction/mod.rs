//! `cargo xtask bench --eviction`: what the prefix cache keeps under each eviction policy (LRU,
//! LFU, CLOCK, leaf-first) at three pool sizes — hit rate, prefill tokens (recomputation
//! included), evictions, preemptions and time to first token — on `kvlab evict`'s multi-turn
//! chat sessions over shared system prompts (stories260K), each run three ways: no tiers, tiers
//! below the pool (64 blocks in host memory, 4,096 in files), and those tiers with paused
//! sessions offloaded on purpose; then a noisy tenant against the others, without and with a
//! per-tenant quota.
//!
//! It runs the `kvlab` binary (`kvlab evict --json`, built in release), so it records what a
//! user runs. Hit rates, token counts and evictions are set by the schedule alone (the same on
//! every machine); TTFT is engine time from a turn's arrival step to its first token, measured,
//! so only ratios within one run mean anything.

mod plot;

use std::path::PathBuf;
use std::process::Command;
use std::time::Instant;

use anyhow::{Context, Result, bail};
use serde::Serialize;
use serde_json::Value;

/// Tiers of the sessions runs: host blocks, and files for 4,096 more (`kvlab evict`'s default).
const HOST_TIER_BLOCKS: usize = 64;

pub struct EvictionOpts {
    pub quick: bool,
    pub out: PathBuf,
    pub plots: bool,
    pub machine: String,
    pub notes: Vec<String>,
}

#[derive(Serialize)]
pub struct EvictionReport {
    pub model: String,
    pub machine: String,
    pub note: String,
    /// `--note`s given on the command line (how busy the machine was, say).
    pub notes: Vec<String>,
    /// The `kvlab` command lines run (arguments after the binary).
    pub commands: Vec<String>,
    /// `kvlab evict --json` rows of the sessions runs: per pool size and policy, no tiers,
    /// tiers, and tiers offloading paused sessions (`tier_blocks`, `offload_paused`).
    pub sessions: Vec<Value>,
    /// Rows of the noisy-tenant runs (`tenant_quota`, `others_hit_rate`, `noisy_hit_rate`);
    /// empty with `--quick`.
    pub tenants: Vec<Value>,
    pub plots: Vec<String>,
    pub wall_seconds: f64,
}

/// Runs the sessions (and, unless quick, the tenants) through `kvlab evict --json`.
///
/// # Errors
/// Building or running `kvlab`, or JSON it did not print.
pub fn run(o: &EvictionOpts) -> Result<EvictionReport> {
    let started = Instant::now();
    let bin = super::peers::build_kvlab()?;
    let files = o.out.join("eviction-tier-files");
    std::fs::create_dir_all(&files).with_context(|| format!("creating {}", files.display()))?;
    let host = HOST_TIER_BLOCKS.to_string();
    let sessions_args: Vec<String> = [
        "evict",
        "--json",
        "--host-tier-blocks",
        &host,
        "--disk-tier",
        &files.to_string_lossy(),
        "--offload-paused",
    ]
    .map(String::from)
    .to_vec();
    let tenants_args: Vec<String> = [
        "evict",
        "--json",
        "--eviction",
        "lru",
        "--eviction",
        "leaf-first",
        "--tenants",
        "4",
        "--noisy-sessions",
        "24",
        "--tenant-quota",
        "8",
    ]
    .map(String::from)
    .to_vec();
    // Command lines as recorded: the tier directory relative to the output folder.
    let shown = |args: &[String]| args.join(" ").replace(&*o.out.to_string_lossy(), "<out>");
    let mut commands = vec![shown(&sessions_args)];
    eprintln!("bench --eviction: kvlab {}", commands[0]);
    let sessions = evict_rows(&bin, &sessions_args)?;
    let tenants = if o.quick {
        Vec::new()
    } else {
        commands.push(shown(&tenants_args));
        eprintln!("bench --eviction: kvlab {}", commands[1]);
        evict_rows(&bin, &tenants_args)?
    };
    let _ = std::fs::remove_dir_all(&files);
    let mut report = EvictionReport {
        model: "stories260K".into(),
        machine: o.machine.clone(),
        note: "kvlab evict's sessions: 24 chat sessions of 4 turns over 4 shared system prompts \
               of 48 tokens, 8 new tokens a turn, blocks of 16 tokens, cpu-paged, f32 KV. Hit \
               rates, prefill tokens and evictions follow from the schedule alone; TTFT is \
               engine time from a turn's arrival step to its first token, measured on this \
               machine."
            .into(),
        notes: o.notes.clone(),
        commands,
        sessions,
        tenants,
        plots: Vec::new(),
        wall_seconds: 0.0,
    };
    report.plots = super::plot::draw_if(o.plots, || plot::figure(&o.out, &report))?;
    report.wall_seconds = started.elapsed().as_secs_f64();
    Ok(report)
}

/// The rows `kvlab <args>` prints as a JSON array.
fn evict_rows(bin: &PathBuf, args: &[String]) -> Result<Vec<Value>> {
    let out = Command::new(bin)
        .args(args)
        .output()
        .with_context(|| format!("starting {}", bin.display()))?;
    if !out.status.success() {
        bail!(
            "kvlab {} failed ({}): {}",
            args.join(" "),
            out.status,
            String::from_utf8_lossy(&out.stderr).trim()
        );
    }
    let rows: Value = serde_json::from_slice(&out.stdout).context("kvlab evict --json output")?;
    match rows {
        Value::Array(rows) if !rows.is_empty() => Ok(rows),
        other => bail!("kvlab evict --json printed {other}, not an array of rows"),
    }
}

/// How a sessions row was run: "no tiers", "tiers" or "offload".
pub fn mode(row: &Value) -> &'static str {
    match (
        row["tier_blocks"].is_null(),
        row["offload_paused"].as_bool(),
    ) {
        (true, _) => "no tiers",
        (false, Some(true)) => "offload",
        (false, _) => "tiers",
    }
}

/// The table: one line per pool and policy, hit rate and prefill tokens in each mode.
pub fn print(r: &EvictionReport) {
    println!(
        "{:>6} {:<11} {:>23} {:>26} {:>18} {:>21}",
        "blocks",
        "eviction",
        "hit rate none/tier/off",
        "prefill tokens none/tier/off",
        "evictions none/off",
        "TTFT p90 ms none/tier"
    );
    let key = |v: &Value| {
        (
            v["num_blocks"].as_u64(),
            v["policy"].as_str().map(String::from),
        )
    };
    let mut seen = Vec::new();
    for row in &r.sessions {
        let k = key(row);
        if seen.contains(&k) {
            continue;
        }
        seen.push(k.clone());
        let of = |m: &str| r.sessions.iter().find(|x| key(x) == k && mode(x) == m);
        let f = |m: &str, field: &str| of(m).map_or(Value::Null, |x| x[field].clone());
        let pct = |v: Value| {
            v.as_f64()
                .map_or("-".into(), |x| format!("{:.1}%", 100.0 * x))
        };
        let ms = |v: Value| v.as_f64().map_or("-".into(), |x| format!("{x:.2}"));
        println!(
            "{:>6} {:<11} {:>23} {:>26} {:>18} {:>21}",
            k.0.unwrap_or(0),
            k.1.clone().unwrap_or_default(),
            format!(
                "{}/{}/{}",
                pct(f("no tiers", "prefix_hit_rate")),
                pct(f("tiers", "prefix_hit_rate")),
                pct(f("offload", "prefix_hit_rate"))
            ),
            format!(
                "{}/{}/{}",
                f("no tiers", "prefill_tokens"),
                f("tiers", "prefill_tokens"),
                f("offload", "prefill_tokens")
            ),
            format!(
                "{}/{}",
                f("no tiers", "evictions"),
                f("offload", "evictions")
            ),
            format!(
                "{}/{}",
                ms(f("no tiers", "ttft_ms_p90")),
                ms(f("tiers", "ttft_ms_p90"))
            ),
        );
    }
    for row in &r.tenants {
        println!(
            "tenants: {} blocks, {}, quota {}: others' hit rate {:.1}%, the noisy tenant's {:.1}%",
            row["num_blocks"],
            row["policy"].as_str().unwrap_or("?"),
            row["tenant_quota"]
                .as_u64()
                .map_or("none".into(), |q| q.to_string()),
            100.0 * row["others_hit_rate"].as_f64().unwrap_or(f64::NAN),
            100.0 * row["noisy_hit_rate"].as_f64().unwrap_or(f64::NAN)
        );
    }
}

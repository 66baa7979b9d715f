//! KV-cache memory: what each engine allocates against the formula, reserved against used,
//! peak resident memory per engine, and the paging waste table.
//!
//! The formula (ARCHITECTURE.md): KV bytes per token = 2 (K and V) × n_layers × n_kv_heads × head_dim
//! × bytes per element (4, f32). A contiguous engine reserves `max_seq_len` positions when the
//! sequence starts; a paged engine holds whole blocks as positions arrive; the naive engine
//! keeps no cache at all (and pays for it in time).

use std::process::Command;

use anyhow::{Context, Result, bail};
use kvlab_engines::EngineKind;
use kvlab_model::{Engine, KvUsage};
use kvlab_paged::waste::{TABLE_BLOCK_SIZES, WasteRow, waste_table};
use kvlab_paged::workload::{LongTail, long_tail_requests, uniform_requests};
use serde::{Deserialize, Serialize};

use super::machine;

/// KV bytes of one engine holding one sequence of `positions` tokens.
#[derive(Clone, Debug, Serialize, Deserialize)]
pub struct KvRow {
    pub model: String,
    pub engine: String,
    /// The sequence's max_seq_len (what a contiguous engine reserves for).
    pub max_seq_len: usize,
    /// Positions computed (by one prefill).
    pub positions: usize,
    /// `Engine::kv_usage` after the prefill, bytes.
    pub used_bytes: u64,
    pub reserved_bytes: u64,
    /// kv_bytes_per_token(4) × positions: what the tokens need.
    pub formula_used_bytes: u64,
    /// kv_bytes_per_token(4) × max_seq_len: what a max-length reservation takes.
    pub formula_max_len_bytes: u64,
}

/// Prefills `positions` tokens into a sequence of `max_seq_len` and reads the engine's usage.
pub fn kv_row(
    model: &str,
    engine: &mut dyn Engine,
    prompt: &[u32],
    max_seq_len: usize,
) -> Result<KvRow> {
    let per_token = engine.config().kv_bytes_per_token(4) as u64;
    let seq = engine.new_sequence(max_seq_len)?;
    let r = engine.prefill(seq, prompt);
    let u: KvUsage = engine.kv_usage();
    engine.free(seq);
    r?;
    Ok(KvRow {
        model: model.into(),
        engine: engine.name().into(),
        max_seq_len,
        positions: prompt.len(),
        used_bytes: u.used_bytes as u64,
        reserved_bytes: u.reserved_bytes as u64,
        formula_used_bytes: per_token * prompt.len() as u64,
        formula_max_len_bytes: per_token * max_seq_len as u64,
    })
}

/// Peak resident memory of one engine generating one sequence, measured in a child process.
#[derive(Clone, Debug, Serialize, Deserialize)]
pub struct RssRow {
    pub model: String,
    pub engine: String,
    /// Positions generated.
    pub positions: usize,
    /// VmRSS after loading the model, before building the engine, bytes.
    pub rss_after_load_bytes: u64,
    /// VmHWM at the end: the child's peak, bytes.
    pub peak_rss_bytes: u64,
    /// peak − after-load: what the engine and its cache added at their worst, bytes.
    pub engine_peak_extra_bytes: u64,
}

/// Re-runs this binary as `__rss MODEL ENGINE CONTEXT POSITIONS` and parses its report.
pub fn rss_in_child(
    model: &str,
    engine: EngineKind,
    context: usize,
    positions: usize,
) -> Result<RssRow> {
    let exe = std::env::current_exe()?;
    let out = Command::new(exe)
        .args([
            "__rss",
            model,
            engine.name(),
            &context.to_string(),
            &positions.to_string(),
        ])
        .output()
        .context("starting the peak-RSS child")?;
    if !out.status.success() {
        bail!(
            "peak-RSS child for {model}/{engine} failed: {}",
            String::from_utf8_lossy(&out.stderr).trim()
        );
    }
    let stdout = String::from_utf8_lossy(&out.stdout);
    let line = stdout
        .lines()
        .last()
        .context("peak-RSS child printed nothing")?;
    Ok(serde_json::from_str(line)?)
}

/// The child's side: load, measure, generate, print one JSON line.
pub fn rss_child(args: &[String]) -> Result<()> {
    let [model, engine, context, positions] = args else {
        bail!("usage: __rss MODEL ENGINE CONTEXT POSITIONS");
    };
    let (context, positions): (usize, usize) = (context.parse()?, positions.parse()?);
    let m = match super::models::load(model, Some(context))? {
        Ok(m) => m,
        Err(why) => bail!("{why}"),
    };
    let after_load = machine::status_bytes("VmRSS:").unwrap_or(0);
    let mut e = kvlab_engines::build(engine.parse()?, m.model.clone())?;
    let bos = m.model.config.bos_id;
    super::decode::generate(e.as_mut(), positions, bos)?;
    let peak = machine::status_bytes("VmHWM:").unwrap_or(0);
    let row = RssRow {
        model: model.clone(),
        engine: engine.clone(),
        positions,
        rss_after_load_bytes: after_load,
        peak_rss_bytes: peak,
        engine_peak_extra_bytes: peak.saturating_sub(after_load),
    };
    println!("{}", serde_json::to_string(&row)?);
    Ok(())
}

/// Seed of the waste table's workloads.
pub const WASTE_SEED: u64 = 7;

/// The waste table of kvlab-paged's standard workloads (1,000 requests each, max_seq_len
/// 2,048): max-length preallocation against paging with 8-, 16- and 32-token blocks.
pub fn waste() -> Result<Vec<WasteRow>> {
    let n = 1000;
    let mut rows = waste_table(
        "uniform",
        &uniform_requests(n, WASTE_SEED),
        2048,
        &TABLE_BLOCK_SIZES,
    )?;
    let lt = long_tail_requests(n, WASTE_SEED, LongTail::default())?;
    rows.extend(waste_table("long-tail", &lt, 2048, &TABLE_BLOCK_SIZES)?);
    Ok(rows)
}

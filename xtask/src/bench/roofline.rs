//! How far each measured decode is from this machine's memory-bandwidth limit.
//!
//! A decode step must at least read every weight it uses once and the keys and values of every
//! earlier position once (models.rs: `decode_bytes`); at batch 1 its FLOPs are ~2 per weight
//! byte / 4, an arithmetic intensity of ~0.5 FLOP/byte, far below any CPU's ridge point, so the
//! step is memory-bound and its floor is bytes / bandwidth. The achieved fraction is
//! (must-move bytes / measured time) / measured peak bandwidth (bandwidth.rs). The naive engine
//! is charged the same must-move bytes: the work it repeats is the distance it keeps from the
//! limit. When the weights fit in the last-level cache the DRAM limit does not bind (the
//! fraction may exceed 1); such rows say so.

use serde::{Deserialize, Serialize};

use super::batch::BatchRow;
use super::decode::DecodeRun;
use super::models::{ModelInfo, decode_bytes, decode_flops};
use kvlab_model::Config;

/// One roofline line.
#[derive(Clone, Debug, Serialize, Deserialize)]
pub struct RooflineRow {
    pub model: String,
    pub engine: String,
    /// Sequences per step (1 for the per-position decode runs).
    pub batch: usize,
    /// What was measured, e.g. "decode positions 1..=255 (whole generation)".
    pub what: String,
    /// Must-move bytes per decode step (mean over the measured steps), bytes.
    pub bytes_per_step: f64,
    /// FLOPs per decode step (mean), FLOP.
    pub flops_per_step: f64,
    /// Measured seconds per step (median repetition), s.
    pub seconds_per_step: f64,
    /// bytes / seconds, GB/s (1e9 B/s).
    pub achieved_gb_per_s: f64,
    /// flops / seconds, GFLOP/s.
    pub achieved_gflop_per_s: f64,
    /// achieved_gb_per_s / the measured peak.
    pub bandwidth_fraction: f64,
    /// The weights (bytes) fit in the last-level cache: DRAM bandwidth is not the limit.
    pub cache_resident: bool,
}

/// Lines for every batch-1 decode run and every batch row.
pub fn rows(
    cfgs: &[(ModelInfo, Config)],
    decode: &[DecodeRun],
    batch: &[BatchRow],
    peak_gb_per_s: f64,
    llc_bytes: Option<u64>,
) -> Vec<RooflineRow> {
    let cfg = |m: &str| cfgs.iter().find(|(i, _)| i.name == m);
    // One line: must-move bytes, FLOPs and measured seconds per step.
    let line =
        |info: &ModelInfo, engine: &str, batch, what, (bytes, flops, secs): (f64, f64, f64)| {
            let gbs = bytes / secs / 1e9;
            RooflineRow {
                model: info.name.clone(),
                engine: engine.into(),
                batch,
                what,
                bytes_per_step: bytes,
                flops_per_step: flops,
                seconds_per_step: secs,
                achieved_gb_per_s: gbs,
                achieved_gflop_per_s: flops / secs / 1e9,
                bandwidth_fraction: gbs / peak_gb_per_s,
                cache_resident: llc_bytes.is_some_and(|l| info.weight_bytes <= l),
            }
        };
    let mut out = Vec::new();
    for d in decode {
        let Some((info, c)) = cfg(&d.model) else {
            continue;
        };
        let n = d.positions;
        if n < 2 {
            continue;
        }
        let steps = (n - 1) as f64;
        let bytes: f64 = (1..n).map(|p| decode_bytes(c, p) as f64).sum::<f64>() / steps;
        let flops: f64 = (1..n).map(|p| decode_flops(c, p) as f64).sum::<f64>() / steps;
        let secs = d.step_ms.median[1..].iter().sum::<f64>() / 1e3 / steps;
        out.push(line(
            info,
            &d.engine,
            1,
            format!("decode positions 1..={} (whole generation)", n - 1),
            (bytes, flops, secs),
        ));
    }
    for b in batch {
        let Some((info, c)) = cfg(&b.model) else {
            continue;
        };
        // Mean position of a decode token: prompt_len + (generate − 1) / 2.
        let pos = b.prompt_len + b.generate.saturating_sub(1) / 2;
        let kv = c.kv_bytes_per_token(4) as f64 * (pos + 1) as f64;
        let weights = decode_bytes(c, 0) as f64 - c.kv_bytes_per_token(4) as f64;
        // A batched step reads the weights once for all B; round-robin reads them per token.
        let per_step_bytes = if b.mode == "batched" {
            weights + b.batch as f64 * kv
        } else {
            b.batch as f64 * (weights + kv)
        };
        let flops = b.batch as f64 * decode_flops(c, pos) as f64;
        let secs = b.batch as f64 / b.tok_per_s.median;
        out.push(line(
            info,
            &b.engine,
            b.batch,
            format!("{} decode, batch {}", b.mode, b.batch),
            (per_step_bytes, flops, secs),
        ));
    }
    out
}

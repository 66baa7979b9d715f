//! Ratios between engines measured in the same run: the numbers that survive a noisy, shared
//! machine (absolute times move by tens of percent with the neighbours' load; two engines
//! measured alternately in one run move together), and the numbers a baseline compares.
//!
//! Every ratio is a speedup, `time(reference) / time(engine)`, so higher is better. Where the
//! repetitions were interleaved (decode: repetition r of every engine runs back to back), the
//! ratio is taken repetition by repetition and summarised; elsewhere it is the ratio of medians
//! and its spread combines both sides' spreads.

use serde::{Deserialize, Serialize};

use super::batch::BatchRow;
use super::decode::DecodeRun;
use super::prefill::PrefillRow;
use super::stats::Summary;

/// One speedup.
#[derive(Clone, Debug, Serialize, Deserialize)]
pub struct Ratio {
    /// Stable identifier, e.g. "decode/stories15M-shape@1024/cpu÷naive@256" (the model at the
    /// context it ran at): baseline comparisons match on it.
    pub key: String,
    pub model: String,
    /// The faster-is-higher engine and the reference it is divided by.
    pub engine: String,
    pub reference: String,
    /// "decode generation" (total time of a generation to `at` positions), "prefill" (prompt of
    /// `at` tokens), or "batch decode" (decode throughput at batch `at`).
    pub what: String,
    pub at: usize,
    /// Median speedup, and the smallest and largest of its samples.
    pub value: f64,
    pub min: f64,
    pub max: f64,
    /// Relative half-spread of the samples (0 with one sample: unknown, see `n`).
    pub noise: f64,
    /// Samples behind it (paired repetitions, or the smaller side's repetitions).
    pub n: usize,
    /// Median time of the engine's side, ms (the generation, the prefill, or one batch run's
    /// decode): below a millisecond a ratio is too short to judge on a shared machine.
    pub engine_ms: f64,
}

/// Every ratio a run can state.
///
/// `context` gives the context a model ran at: it is part of every key, so that only runs of
/// the same model at the same context compare.
pub fn derive(
    decode: &[DecodeRun],
    prefill: &[PrefillRow],
    batch: &[BatchRow],
    context: &dyn Fn(&str) -> usize,
) -> Vec<Ratio> {
    let mut out = Vec::new();
    // Generation time: every engine against naive, and every paged engine against cpu.
    for d in decode {
        for r in decode
            .iter()
            .filter(|r| r.model == d.model && reference_of(&d.engine, &r.engine))
        {
            for c in &d.cumulative {
                let Some(rc) = r.cumulative.iter().find(|x| x.positions == c.positions) else {
                    continue;
                };
                let per: Vec<f64> = rc
                    .per_rep_ms
                    .iter()
                    .zip(&c.per_rep_ms)
                    .map(|(a, b)| a / b)
                    .collect();
                out.push(paired(
                    &format!("{}@{}", d.model, context(&d.model)),
                    c.total_ms.median,
                    &d.model,
                    &d.engine,
                    &r.engine,
                    "decode generation",
                    "decode",
                    c.positions,
                    &per,
                ));
            }
        }
    }
    for p in prefill {
        for r in prefill.iter().filter(|r| {
            r.model == p.model && r.prompt_len == p.prompt_len && reference_of(&p.engine, &r.engine)
        }) {
            out.push(unpaired(
                &format!("{}@{}", p.model, context(&p.model)),
                p.ms.median,
                &p.model,
                &p.engine,
                &r.engine,
                "prefill",
                "prefill",
                p.prompt_len,
                &r.ms,
                &p.ms,
            ));
        }
    }
    for b in batch {
        for r in batch.iter().filter(|r| {
            r.model == b.model
                && r.batch == b.batch
                && r.engine == "cpu"
                && b.engine != "cpu"
                && b.engine != "naive"
        }) {
            // Throughputs: speedup = tok/s(engine) / tok/s(reference) = time(ref) / time(engine).
            let ms = 1e3 * (b.batch * b.generate) as f64 / b.tok_per_s.median;
            out.push(unpaired(
                &format!("{}@{}", b.model, context(&b.model)),
                ms,
                &b.model,
                &b.engine,
                &r.engine,
                "batch decode",
                "batch",
                b.batch,
                &b.tok_per_s,
                &r.tok_per_s,
            ));
        }
    }
    out
}

/// `reference` is what `engine` is compared with: naive for every other engine, and cpu for
/// the paged engines.
fn reference_of(engine: &str, reference: &str) -> bool {
    engine != reference && (reference == "naive" || (reference == "cpu" && engine != "naive"))
}

fn key(kind: &str, model: &str, engine: &str, reference: &str, at: usize) -> String {
    format!("{kind}/{model}/{engine}÷{reference}@{at}")
}

#[allow(clippy::too_many_arguments)]
fn paired(
    label: &str,
    engine_ms: f64,
    model: &str,
    engine: &str,
    reference: &str,
    what: &str,
    kind: &str,
    at: usize,
    per: &[f64],
) -> Ratio {
    let s = Summary::of(per);
    Ratio {
        key: key(kind, label, engine, reference, at),
        model: model.into(),
        engine: engine.into(),
        reference: reference.into(),
        what: what.into(),
        at,
        value: s.median,
        min: s.min,
        max: s.max,
        noise: s.rel_noise(),
        n: s.n,
        engine_ms,
    }
}

/// Speedup num.median / den.median, with the extremes num.min/den.max .. num.max/den.min.
#[allow(clippy::too_many_arguments)]
fn unpaired(
    label: &str,
    engine_ms: f64,
    model: &str,
    engine: &str,
    reference: &str,
    what: &str,
    kind: &str,
    at: usize,
    num: &Summary,
    den: &Summary,
) -> Ratio {
    Ratio {
        key: key(kind, label, engine, reference, at),
        model: model.into(),
        engine: engine.into(),
        reference: reference.into(),
        what: what.into(),
        at,
        value: num.median / den.median,
        min: num.min / den.max,
        max: num.max / den.min,
        noise: num.rel_noise() + den.rel_noise(),
        n: num.n.min(den.n),
        engine_ms,
    }
}

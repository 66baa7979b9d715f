//! Ratios between engines measured in the same run: the numbers that survive a noisy, shared
//! machine (absolute times move by tens of percent with the neighbours' load; two engines
//! measured alternately in one run move together), and the numbers a baseline compares.
//!
//! Every ratio is a speedup, `time(reference) / time(engine)`, so higher is better. Where the
//! repetitions were interleaved (decode: repetition r of every engine runs back to back), the
//! ratio is taken repetition by repetition and summarised; elsewhere it is the ratio of medians
//! and its spread combines both sides' spreads.

use kvlab_engines::EngineKind;
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
                let of = Of {
                    model: &d.model,
                    context: context(&d.model),
                    engine: &d.engine,
                    reference: &r.engine,
                    what: ("decode generation", "decode"),
                    at: c.positions,
                    engine_ms: c.total_ms.median,
                };
                out.push(of.paired(&per));
            }
        }
    }
    for p in prefill {
        for r in prefill.iter().filter(|r| {
            r.model == p.model && r.prompt_len == p.prompt_len && reference_of(&p.engine, &r.engine)
        }) {
            let of = Of {
                model: &p.model,
                context: context(&p.model),
                engine: &p.engine,
                reference: &r.engine,
                what: ("prefill", "prefill"),
                at: p.prompt_len,
                engine_ms: p.ms.median,
            };
            out.push(of.unpaired(&r.ms, &p.ms));
        }
    }
    for b in batch {
        for r in batch.iter().filter(|r| {
            r.model == b.model
                && r.batch == b.batch
                && r.engine == EngineKind::Cpu
                && reference_of(&b.engine, &r.engine)
        }) {
            // Throughputs: speedup = tok/s(engine) / tok/s(reference) = time(ref) / time(engine).
            let of = Of {
                model: &b.model,
                context: context(&b.model),
                engine: &b.engine,
                reference: &r.engine,
                what: ("batch decode", "batch"),
                at: b.batch,
                engine_ms: 1e3 * (b.batch * b.generate) as f64 / b.tok_per_s.median,
            };
            out.push(of.unpaired(&b.tok_per_s, &r.tok_per_s));
        }
    }
    out
}

/// `reference` is what `engine` is compared with ([`EngineKind::compared_with`]).
fn reference_of(engine: &str, reference: &str) -> bool {
    match (
        EngineKind::from_name(engine),
        EngineKind::from_name(reference),
    ) {
        (Some(e), Some(r)) => e.compared_with().contains(&r),
        _ => false,
    }
}

/// What a ratio is of: a model at a context, two engines, a workload (its `what` and its key's
/// kind) at a size, and the engine side's median time.
struct Of<'a> {
    model: &'a str,
    context: usize,
    engine: &'a str,
    reference: &'a str,
    what: (&'a str, &'a str),
    at: usize,
    engine_ms: f64,
}

impl Of<'_> {
    fn ratio(&self, value: f64, min: f64, max: f64, noise: f64, n: usize) -> Ratio {
        let (what, kind) = self.what;
        Ratio {
            key: format!(
                "{kind}/{}@{}/{}÷{}@{}",
                self.model, self.context, self.engine, self.reference, self.at
            ),
            model: self.model.into(),
            engine: self.engine.into(),
            reference: self.reference.into(),
            what: what.into(),
            at: self.at,
            value,
            min,
            max,
            noise,
            n,
            engine_ms: self.engine_ms,
        }
    }

    /// The median of per-repetition speedups.
    fn paired(&self, per: &[f64]) -> Ratio {
        let s = Summary::of(per);
        self.ratio(s.median, s.min, s.max, s.rel_noise(), s.n)
    }

    /// Speedup num.median / den.median, with the extremes num.min/den.max .. num.max/den.min.
    fn unpaired(&self, num: &Summary, den: &Summary) -> Ratio {
        self.ratio(
            num.median / den.median,
            num.min / den.max,
            num.max / den.min,
            num.rel_noise() + den.rel_noise(),
            num.n.min(den.n),
        )
    }
}

//! Decode latency per position: one sequence, BOS prefilled at position 0, then greedy decode
//! steps at positions 1, 2, …, context − 1, each timed on its own.
//!
//! The naive engine recomputes the whole prefix at every step, so its step time grows linearly
//! with the position (and a generation of N tokens costs O(N²)); a cached engine computes one
//! position, so its line stays flat but for attention's O(pos) reads. The timed region is the
//! `Engine::decode` call: it returns the logits on the host, so a GPU engine has synchronised
//! inside it. Greedy argmax picks the next token outside the timed region.

use std::time::Instant;

use anyhow::Result;
use kvlab_model::Engine;
use kvlab_model::sampler::argmax;
use serde::{Deserialize, Serialize};

use super::stats::Summary;

/// One timed generation: seconds of the prefill of BOS (index 0) and of each decode step
/// (index p = the position it computed), and the tokens it produced.
pub struct Generation {
    /// (positions,) seconds
    pub step_s: Vec<f64>,
    pub tokens: Vec<u32>,
}

/// Runs one greedy generation to `positions` positions (BOS included) and times every step.
pub fn generate(engine: &mut dyn Engine, positions: usize, bos: u32) -> Result<Generation> {
    let seq = engine.new_sequence(positions)?;
    let out = (|| -> Result<Generation> {
        let mut step_s = Vec::with_capacity(positions);
        let mut tokens = Vec::with_capacity(positions);
        let t = Instant::now();
        let mut logits = engine.prefill(seq, &[bos])?;
        step_s.push(t.elapsed().as_secs_f64());
        for _ in 1..positions {
            let next = argmax(&logits);
            tokens.push(next);
            let t = Instant::now();
            logits = engine.decode(seq, next)?;
            step_s.push(t.elapsed().as_secs_f64());
        }
        Ok(Generation { step_s, tokens })
    })();
    engine.free(seq);
    out
}

/// Per-position statistics over repetitions, milliseconds.
#[derive(Clone, Debug, Default, Serialize, Deserialize)]
pub struct PerPosition {
    /// (positions,) each
    pub min: Vec<f64>,
    pub median: Vec<f64>,
    pub max: Vec<f64>,
}

/// Total generation time up to a number of positions.
#[derive(Clone, Debug, Serialize, Deserialize)]
pub struct Cumulative {
    /// Positions generated (BOS prefill + positions − 1 decode steps).
    pub positions: usize,
    /// Milliseconds, over repetitions.
    pub total_ms: Summary,
    /// The same per repetition, in repetition order (for ratios rep by rep).
    pub per_rep_ms: Vec<f64>,
}

/// The decode-latency result of one (model, engine).
#[derive(Clone, Debug, Serialize, Deserialize)]
pub struct DecodeRun {
    pub model: String,
    pub engine: String,
    /// Positions of each generation (BOS at 0 … positions − 1).
    pub positions: usize,
    pub reps: usize,
    /// Step time at each position 0..positions (index 0 is the BOS prefill), ms.
    pub step_ms: PerPosition,
    /// Totals at checkpoints (16, 32, 64, … and `positions`).
    pub cumulative: Vec<Cumulative>,
    /// Decode steps per second over the whole generation (positions − 1 steps / their time).
    pub decode_tok_per_s: Summary,
    /// The greedy tokens of the first repetition (all repetitions are deterministic).
    pub tokens_head: Vec<u32>,
    /// FNV-1a of all generated tokens, to see at a glance that engines agree.
    pub tokens_fnv: u64,
    /// How the step time grows with the position (absent in records older than the field).
    #[serde(default)]
    pub growth: Option<Growth>,
}

/// How a cached engine's decode step grows with the position: attention reads every cached
/// position, the rest of the step does not depend on it. From the median step times.
#[derive(Clone, Debug, Serialize, Deserialize)]
pub struct Growth {
    /// Mean step over the last 32 positions ÷ mean step over positions 16..48.
    pub last_vs_16: f64,
    /// Mean step over the whole generation ÷ mean over its first 64 positions: the average
    /// token's time of a `positions`-token run against a 64-token one.
    pub run_avg_vs_64: f64,
}

impl Growth {
    /// From the median step times (index 0 the BOS prefill, left out); `None` for runs too
    /// short to have positions 16..48 and a last 32 apart from them.
    fn of(step_ms: &[f64]) -> Option<Growth> {
        let n = step_ms.len();
        if n < 80 {
            return None;
        }
        let mean = |xs: &[f64]| xs.iter().sum::<f64>() / xs.len() as f64;
        Some(Growth {
            last_vs_16: mean(&step_ms[n - 32..]) / mean(&step_ms[16..48]),
            run_avg_vs_64: mean(&step_ms[1..]) / mean(&step_ms[1..64]),
        })
    }
}

/// Summarises the repetitions of one (model, engine).
pub fn summarize(model: &str, engine: &str, gens: &[Generation]) -> DecodeRun {
    let positions = gens[0].step_s.len();
    let mut step_ms = PerPosition::default();
    for p in 0..positions {
        let xs: Vec<f64> = gens.iter().map(|g| g.step_s[p] * 1e3).collect();
        let s = Summary::of(&xs);
        step_ms.min.push(s.min);
        step_ms.median.push(s.median);
        step_ms.max.push(s.max);
    }
    let mut checkpoints: Vec<usize> = (4..)
        .map(|k| 1usize << k)
        .take_while(|&n| n < positions)
        .collect();
    checkpoints.push(positions);
    let cumulative = checkpoints
        .into_iter()
        .map(|n| {
            let per_rep_ms: Vec<f64> = gens
                .iter()
                .map(|g| g.step_s[..n].iter().sum::<f64>() * 1e3)
                .collect();
            Cumulative {
                positions: n,
                total_ms: Summary::of(&per_rep_ms),
                per_rep_ms,
            }
        })
        .collect();
    let tps: Vec<f64> = gens
        .iter()
        .map(|g| (positions - 1) as f64 / g.step_s[1..].iter().sum::<f64>())
        .collect();
    let tokens = &gens[0].tokens;
    let growth = Growth::of(&step_ms.median);
    DecodeRun {
        model: model.into(),
        engine: engine.into(),
        positions,
        reps: gens.len(),
        step_ms,
        cumulative,
        decode_tok_per_s: Summary::of(&tps),
        tokens_head: tokens.iter().take(16).copied().collect(),
        tokens_fnv: fnv1a(tokens),
        growth,
    }
}

fn fnv1a(tokens: &[u32]) -> u64 {
    let mut h: u64 = 0xcbf2_9ce4_8422_2325;
    for t in tokens {
        for b in t.to_le_bytes() {
            h ^= b as u64;
            h = h.wrapping_mul(0x100_0000_01b3);
        }
    }
    h
}

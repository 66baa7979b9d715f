//! Prefill throughput and request latency.
//!
//! * prefill: a prompt of L seeded random tokens (BOS first) run by one `Engine::prefill` call,
//!   L = 16, 32, 64, … up to the context; tokens/s = L / time.
//! * latency: a request of a P-token prompt and G generated tokens, repeated: time to first
//!   token (TTFT, the prefill plus picking the token) and time per output token (TPOT, the mean
//!   decode step after it), each summarised with p50/p90/p99 over the repetitions.

use std::time::Instant;

use anyhow::Result;
use kvlab_model::Engine;
use kvlab_model::sampler::argmax;
use serde::{Deserialize, Serialize};

use super::stats::Summary;

/// Seconds of one prefill of `prompt` in a fresh sequence of `prompt.len()` positions.
pub fn time_prefill(engine: &mut dyn Engine, prompt: &[u32]) -> Result<f64> {
    let seq = engine.new_sequence(prompt.len())?;
    let t = Instant::now();
    let r = engine.prefill(seq, prompt);
    let s = t.elapsed().as_secs_f64();
    engine.free(seq);
    r?;
    Ok(s)
}

/// Prefill of one prompt length on one engine.
#[derive(Clone, Debug, Serialize, Deserialize)]
pub struct PrefillRow {
    pub model: String,
    pub engine: String,
    pub prompt_len: usize,
    /// Milliseconds per prefill, over repetitions.
    pub ms: Summary,
    /// Prompt tokens per second, from each repetition's time.
    pub tok_per_s: Summary,
}

pub fn prefill_row(model: &str, engine: &str, prompt_len: usize, seconds: &[f64]) -> PrefillRow {
    let ms: Vec<f64> = seconds.iter().map(|s| s * 1e3).collect();
    let tps: Vec<f64> = seconds.iter().map(|s| prompt_len as f64 / s).collect();
    PrefillRow {
        model: model.into(),
        engine: engine.into(),
        prompt_len,
        ms: Summary::of(&ms),
        tok_per_s: Summary::of(&tps),
    }
}

/// TTFT and TPOT of one request, seconds.
pub fn time_request(
    engine: &mut dyn Engine,
    prompt: &[u32],
    generate: usize,
) -> Result<(f64, f64)> {
    let seq = engine.new_sequence(prompt.len() + generate)?;
    let out = (|| -> Result<(f64, f64)> {
        let t = Instant::now();
        let logits = engine.prefill(seq, prompt)?;
        let mut next = argmax(&logits);
        let ttft = t.elapsed().as_secs_f64();
        let t = Instant::now();
        for _ in 1..generate {
            next = argmax(&engine.decode(seq, next)?);
        }
        std::hint::black_box(next);
        let tpot = t.elapsed().as_secs_f64() / (generate - 1).max(1) as f64;
        Ok((ttft, tpot))
    })();
    engine.free(seq);
    out
}

/// Request latency of one (model, engine).
#[derive(Clone, Debug, Serialize, Deserialize)]
pub struct LatencyRow {
    pub model: String,
    pub engine: String,
    pub prompt_len: usize,
    /// Tokens generated per request (the first by the prefill, the rest by decode steps).
    pub generate: usize,
    /// Time to first token, ms, over repetitions (p50 = median).
    pub ttft_ms: Summary,
    /// Time per output token after the first, ms, over repetitions.
    pub tpot_ms: Summary,
}

pub fn latency_row(
    model: &str,
    engine: &str,
    prompt_len: usize,
    generate: usize,
    samples: &[(f64, f64)],
) -> LatencyRow {
    let ttft: Vec<f64> = samples.iter().map(|s| s.0 * 1e3).collect();
    let tpot: Vec<f64> = samples.iter().map(|s| s.1 * 1e3).collect();
    LatencyRow {
        model: model.into(),
        engine: engine.into(),
        prompt_len,
        generate,
        ttft_ms: Summary::of(&ttft),
        tpot_ms: Summary::of(&tpot),
    }
}

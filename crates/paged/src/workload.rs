//! Seeded request-length generators for the waste table and scheduler experiments.
//!
//! Both use ChaCha8 seeded from a `u64`, so a seed names a workload. The uniform generator uses
//! integer sampling only and is bit-identical on every platform; the long-tail one goes through
//! `ln`, `cos` and `exp`, which are reproducible on one platform but could in principle round
//! differently elsewhere.

use rand::{Rng, SeedableRng};
use rand_chacha::ChaCha8Rng;

use crate::{PagedError, RequestLen, Result};

/// The range of the standard uniform workload, for prompts and outputs alike.
pub const UNIFORM_RANGE: std::ops::RangeInclusive<usize> = 100..=1024;

/// `n` requests with prompt and output lengths uniform in `100..=1024` each (fits
/// `max_seq_len = 2048`).
pub fn uniform_requests(n: usize, seed: u64) -> Vec<RequestLen> {
    let mut rng = ChaCha8Rng::seed_from_u64(seed);
    (0..n)
        .map(|_| RequestLen {
            prompt_len: rng.random_range(UNIFORM_RANGE),
            output_len: rng.random_range(UNIFORM_RANGE),
        })
        .collect()
}

/// Parameters of the long-tail workload: log-normal lengths, as measured request traces look
/// (most requests short, a few very long). A log-normal with median `m` and shape `σ` is
/// `m · exp(σ · z)` with `z` standard normal; its mean is `m · exp(σ² / 2)`.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct LongTail {
    pub prompt_median: f64,
    pub prompt_sigma: f64,
    pub output_median: f64,
    pub output_sigma: f64,
    /// Longest request (prompt + output); prompts are cut to `max_seq_len - 1` and outputs to
    /// the room left, as a length stop would.
    pub max_seq_len: usize,
}

impl Default for LongTail {
    /// Prompts: median 256, σ = 1.0 (mean ≈ 422); outputs: median 128, σ = 1.2 (mean ≈ 263);
    /// `max_seq_len = 2048`.
    fn default() -> Self {
        Self {
            prompt_median: 256.0,
            prompt_sigma: 1.0,
            output_median: 128.0,
            output_sigma: 1.2,
            max_seq_len: 2048,
        }
    }
}

/// `n` requests drawn from the [`LongTail`] log-normal lengths.
///
/// # Errors
/// [`PagedError::InvalidWorkload`] if `max_seq_len < 2`, or a median is not positive and
/// finite, or a σ is negative or not finite.
pub fn long_tail_requests(n: usize, seed: u64, shape: LongTail) -> Result<Vec<RequestLen>> {
    let ok = |m: f64, s: f64| m.is_finite() && m > 0.0 && s.is_finite() && s >= 0.0;
    if shape.max_seq_len < 2
        || !ok(shape.prompt_median, shape.prompt_sigma)
        || !ok(shape.output_median, shape.output_sigma)
    {
        return Err(PagedError::InvalidWorkload(format!(
            "long-tail shape {shape:?} needs max_seq_len >= 2, positive finite medians and \
             non-negative finite sigmas"
        )));
    }
    let mut rng = ChaCha8Rng::seed_from_u64(seed);
    let mut draw = |median: f64, sigma: f64, max: usize| -> usize {
        let x = median * (sigma * standard_normal(&mut rng)).exp();
        // `as` saturates for huge or NaN floats; the clamp keeps at least one token.
        (x.round() as usize).clamp(1, max)
    };
    Ok((0..n)
        .map(|_| {
            let prompt_len = draw(
                shape.prompt_median,
                shape.prompt_sigma,
                shape.max_seq_len - 1,
            );
            let room = shape.max_seq_len - prompt_len;
            let output_len = draw(shape.output_median, shape.output_sigma, room);
            RequestLen {
                prompt_len,
                output_len,
            }
        })
        .collect())
}

/// A standard normal sample by Box–Muller: `sqrt(-2 ln u1) · cos(2π u2)` with `u1` in `(0, 1]`
/// (so the log is finite) and `u2` in `[0, 1)`.
fn standard_normal(rng: &mut ChaCha8Rng) -> f64 {
    let u1 = 1.0 - rng.random::<f64>();
    let u2 = rng.random::<f64>();
    (-2.0 * u1.ln()).sqrt() * (std::f64::consts::TAU * u2).cos()
}

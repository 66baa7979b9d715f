//! Comparing an engine's logits with a reference's, position by position: the one comparison
//! `cargo xtask verify` applies to f32 engines (within tolerance at every position) and the CUDA
//! engine's f16 modes report (top-1 agreement, max |Δlogit|). Teacher forcing
//! ([`crate::teacher_force`]) makes the positions comparable even where the engines' greedy
//! choices would differ.

use serde::Serialize;

use crate::sampler::argmax;

/// Per position: max_j |got_j − ref_j| ≤ `abs` + `rel` · max_j |ref_j|. The relative part is taken
/// against the position's largest reference logit, not entry by entry: a logit near zero is the
/// sum of terms as large as the others, so it carries the same absolute rounding error.
#[derive(Clone, Copy, Debug, PartialEq, Serialize)]
pub struct Tolerance {
    /// Absolute part, in logit units.
    pub abs: f32,
    /// Relative part, a fraction of the position's largest |ref| logit.
    pub rel: f32,
}

impl Tolerance {
    /// Every f32 engine against the naive engine (ARCHITECTURE.md, invariants).
    pub const F32: Tolerance = Tolerance {
        abs: 1e-4,
        rel: 1e-4,
    };
}

/// How two lists of logits rows compare.
#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct LogitComparison {
    /// Positions compared: the shorter list's length.
    pub positions: usize,
    /// Largest |got − ref| over every logit of every position; NaN if any difference is NaN.
    pub max_abs_dlogit: f32,
    /// Every position within the tolerance, and both lists (and each pair of rows) of one
    /// length. NaN never passes.
    pub within_tolerance: bool,
    /// Fraction of positions whose argmax (top-1 token) is the same; 1 for no positions.
    pub top1_agreement: f64,
    /// First position whose top-1 differs, if any.
    pub first_top1_mismatch: Option<usize>,
}

/// Compares `got` with `reference`, row by row (one row of logits per position).
pub fn compare_logits(got: &[Vec<f32>], reference: &[Vec<f32>], tol: Tolerance) -> LogitComparison {
    let mut max = 0.0f32;
    let mut within = got.len() == reference.len();
    let (mut same, mut first_top1_mismatch) = (0, None);
    for (i, (g, r)) in got.iter().zip(reference).enumerate() {
        let scale = r.iter().fold(0.0f32, |m, v| m.max(v.abs()));
        let worst = g
            .iter()
            .zip(r)
            .map(|(a, b)| (a - b).abs())
            .fold(0.0, nan_max);
        if worst.is_nan() || worst > tol.abs + tol.rel * scale || g.len() != r.len() {
            within = false;
        }
        max = nan_max(max, worst);
        if argmax(g) == argmax(r) {
            same += 1;
        } else if first_top1_mismatch.is_none() {
            first_top1_mismatch = Some(i);
        }
    }
    let positions = got.len().min(reference.len());
    LogitComparison {
        positions,
        max_abs_dlogit: max,
        within_tolerance: within,
        top1_agreement: if positions == 0 {
            1.0
        } else {
            same as f64 / positions as f64
        },
        first_top1_mismatch,
    }
}

/// How one model's next-token distributions compare with a reference's over a teacher-forced
/// text: the quality measures of a quantized KV cache (KIVI, KVQuant and llama.cpp's
/// `perplexity --kl-divergence` report the same three).
#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct DistributionComparison {
    /// Positions compared.
    pub positions: usize,
    /// Fraction of positions whose argmax is the reference's.
    pub top1_agreement: f64,
    /// Mean over positions of KL(P_ref ‖ P) = Σ_i p_ref,i (ln p_ref,i − ln p_i), in nats.
    pub mean_kl: f64,
    /// Largest per-position KL, in nats; NaN if any logit is.
    pub max_kl: f64,
    /// exp(−mean ln p(next token)) under the reference.
    pub perplexity_reference: f64,
    /// The same under `got`.
    pub perplexity: f64,
}

/// Compares `got` with `reference` at every position where `next` gives the token that
/// followed (rows and `next` are cut to the shortest of the three). Softmax in f64.
pub fn compare_distributions(
    got: &[Vec<f32>],
    reference: &[Vec<f32>],
    next: &[u32],
) -> DistributionComparison {
    let n = got.len().min(reference.len()).min(next.len());
    let (mut same, mut kl_sum, mut kl_max) = (0usize, 0.0f64, 0.0f64);
    let (mut nll_ref, mut nll) = (0.0f64, 0.0f64);
    for ((g, r), &t) in got.iter().zip(reference).zip(next).take(n) {
        let (lg, lr) = (log_softmax(g), log_softmax(r));
        let kl: f64 = lr
            .iter()
            .zip(&lg)
            .map(|(a, b)| {
                if *a == f64::NEG_INFINITY {
                    0.0
                } else {
                    a.exp() * (a - b)
                }
            })
            .sum();
        kl_sum += kl;
        kl_max = if kl.is_nan() || kl_max.is_nan() {
            f64::NAN
        } else {
            kl_max.max(kl)
        };
        nll_ref -= lr.get(t as usize).copied().unwrap_or(f64::NAN);
        nll -= lg.get(t as usize).copied().unwrap_or(f64::NAN);
        same += usize::from(argmax(g) == argmax(r));
    }
    let mean = |x: f64| if n == 0 { 0.0 } else { x / n as f64 };
    DistributionComparison {
        positions: n,
        top1_agreement: if n == 0 { 1.0 } else { same as f64 / n as f64 },
        mean_kl: mean(kl_sum),
        max_kl: kl_max,
        perplexity_reference: mean(nll_ref).exp(),
        perplexity: mean(nll).exp(),
    }
}

/// ln softmax(x), in f64.
fn log_softmax(x: &[f32]) -> Vec<f64> {
    let max = x.iter().fold(f64::NEG_INFINITY, |m, &v| m.max(v as f64));
    let lse = max + x.iter().map(|&v| (v as f64 - max).exp()).sum::<f64>().ln();
    x.iter().map(|&v| v as f64 - lse).collect()
}

/// The larger of two differences, NaN if either is (f32::max would drop a NaN).
fn nan_max(m: f32, d: f32) -> f32 {
    if m.is_nan() || d.is_nan() {
        f32::NAN
    } else {
        m.max(d)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn counts_top1_and_the_largest_difference() {
        let reference = vec![vec![0.0, 1.0, 0.5], vec![2.0, 0.0, 0.0]];
        let got = vec![vec![0.1, 1.0, 0.5], vec![0.0, 0.5, 0.0]];
        let c = compare_logits(&got, &reference, Tolerance::F32);
        assert_eq!(c.positions, 2);
        assert_eq!(c.top1_agreement, 0.5);
        assert_eq!(c.first_top1_mismatch, Some(1));
        assert!((c.max_abs_dlogit - 2.0).abs() < 1e-6);
        assert!(!c.within_tolerance);
        let same = compare_logits(&reference, &reference, Tolerance::F32);
        assert_eq!((same.max_abs_dlogit, same.within_tolerance), (0.0, true));
        assert_eq!((same.top1_agreement, same.first_top1_mismatch), (1.0, None));
    }

    #[test]
    fn the_tolerance_is_relative_to_the_largest_reference_logit() {
        let tol = Tolerance { abs: 0.0, rel: 0.1 };
        // |Δ| = 0.5 on a logit of 0 passes: the position's largest logit is 10.
        assert!(compare_logits(&[vec![0.5, 10.0]], &[vec![0.0, 10.0]], tol).within_tolerance);
        assert!(!compare_logits(&[vec![1.5, 10.0]], &[vec![0.0, 10.0]], tol).within_tolerance);
    }

    /// KL of two known distributions, perplexity of a uniform one, and NaN kept.
    #[test]
    fn distributions_compare_by_kl_top1_and_perplexity() {
        // p = (1/2, 1/2), q = (1/4... ): logits ln 1, ln 3 give q = (1/4, 3/4).
        let (r, g) = (vec![vec![0.0f32, 0.0]], vec![vec![0.0f32, 3f32.ln()]]);
        let c = compare_distributions(&g, &r, &[1]);
        let kl = 0.5 * (0.5f64 / 0.25).ln() + 0.5 * (0.5f64 / 0.75).ln();
        assert!(
            (c.mean_kl - kl).abs() < 1e-6 && (c.max_kl - kl).abs() < 1e-6,
            "{c:?}"
        );
        assert!(
            (c.perplexity_reference - 2.0).abs() < 1e-9,
            "uniform over 2: {c:?}"
        );
        assert!((c.perplexity - 4.0 / 3.0).abs() < 1e-6, "{c:?}");
        assert_eq!(c.top1_agreement, 0.0, "argmax 0 (a tie, lowest id) vs 1");
        let same = compare_distributions(&r, &r, &[0]);
        assert_eq!((same.mean_kl, same.top1_agreement), (0.0, 1.0));
        let nan = compare_distributions(&[vec![f32::NAN, 0.0]], &r, &[0]);
        assert!(nan.max_kl.is_nan() && nan.mean_kl.is_nan());
    }

    #[test]
    fn nan_and_length_mismatches_never_pass() {
        let nan = compare_logits(&[vec![1.0, f32::NAN]], &[vec![1.0, 2.0]], Tolerance::F32);
        assert!(nan.max_abs_dlogit.is_nan() && !nan.within_tolerance);
        let later = compare_logits(
            &[vec![f32::NAN], vec![1.0]],
            &[vec![1.0], vec![3.0]],
            Tolerance::F32,
        );
        assert!(later.max_abs_dlogit.is_nan(), "a NaN stays the maximum");
        let short = compare_logits(&[vec![1.0]], &[vec![1.0], vec![2.0]], Tolerance::F32);
        assert_eq!(short.positions, 1);
        assert!(!short.within_tolerance);
        let narrow = compare_logits(&[vec![1.0]], &[vec![1.0, 2.0]], Tolerance::F32);
        assert!(!narrow.within_tolerance);
        let empty = compare_logits(&[], &[], Tolerance::F32);
        assert_eq!((empty.positions, empty.top1_agreement), (0, 1.0));
    }
}

//! Softmax over attention scores with an exp the compiler can vectorize. libm's `expf` is one
//! call per score; at long context attention computes n_heads × pos of them per layer and token
//! (stories260K at position 511: 20k per token), which made decode slow down with position.
//!
//! exp(x) = 2ⁿ · eʳ with n = round(x / ln 2) and r = x − n·ln 2 ∈ [−ln2/2, ln2/2]; eʳ from Cephes'
//! `expf` minimax polynomial (relative error ≈ 1 ulp over that range), 2ⁿ built in the exponent
//! bits. The reference is `kvlab_model::ops::softmax` (libm exp); the tests bound the difference.

const LOG2E: f32 = std::f32::consts::LOG2_E;
/// ln 2 split in a part exact in f32 and the rest (Cody–Waite), as Cephes does.
const LN2_HI: f32 = 0.693_359_4;
const LN2_LO: f32 = -2.121_944_4e-4;
/// Adding and subtracting 1.5·2²³ rounds an f32 of magnitude < 2²² to the nearest integer.
const ROUND: f32 = 12_582_912.0;

/// e^x for x ≤ 0 (scores after subtracting their max). Below −87 the result is clamped to
/// e^−87 ≈ 1.6e−38 (a softmax weight of 0 in f32 sums); NaN stays NaN.
#[inline(always)]
pub fn exp_nonpositive(x: f32) -> f32 {
    // Comparisons, not f32::max, so a NaN passes through.
    let x = if x < -87.0 { -87.0 } else { x };
    // t = 1.5·2²³ + round(x / ln 2): its low mantissa bits are n (two's complement), which is
    // how 2ⁿ is built below without a float → int conversion (Rust's saturating `as` does not
    // vectorize).
    let t = x * LOG2E + ROUND;
    let n = t - ROUND;
    let r = x - n * LN2_HI - n * LN2_LO;
    let p = ((((1.987_569_1e-4 * r + 1.398_199_9e-3) * r + 8.333_452e-3) * r + 4.166_579_6e-2) * r
        + 1.666_666_5e-1)
        * r
        + 0.5;
    let e_r = p * r * r + r + 1.0;
    // n ∈ [−126, 0] here, so n + 127 is a normal exponent; a NaN x makes e_r NaN whatever
    // these bits are.
    let two_n = f32::from_bits((t.to_bits().wrapping_sub(ROUND.to_bits()).wrapping_add(127)) << 23);
    e_r * two_n
}

/// x ← softmax(x) = e^(x_i − max) / Σ_j e^(x_j − max). A NaN anywhere makes every output NaN.
#[inline(always)]
pub fn softmax(x: &mut [f32]) {
    const L: usize = 8; // lanes: independent accumulators the compiler keeps in one vector
    let mut m = [f32::NEG_INFINITY; L];
    let chunks = x.chunks_exact(L);
    for v in chunks.remainder() {
        m[0] = if *v > m[0] { *v } else { m[0] };
    }
    for c in chunks {
        for i in 0..L {
            m[i] = if c[i] > m[i] { c[i] } else { m[i] };
        }
    }
    let max = m
        .iter()
        .fold(f32::NEG_INFINITY, |a, &b| if b > a { b } else { a });
    let mut s = [0.0f32; L];
    let mut chunks = x.chunks_exact_mut(L);
    for c in &mut chunks {
        for i in 0..L {
            c[i] = exp_nonpositive(c[i] - max);
            s[i] += c[i];
        }
    }
    for v in chunks.into_remainder() {
        *v = exp_nonpositive(*v - max);
        s[0] += *v;
    }
    let inv = 1.0 / s.iter().sum::<f32>();
    x.iter_mut().for_each(|v| *v *= inv);
}

#[cfg(test)]
mod tests {
    use super::*;
    use rand::{Rng, SeedableRng};

    #[test]
    fn exp_is_within_two_ulp_of_libm_over_the_softmax_range() {
        let mut worst = 0.0f64;
        let mut x = -87.0f32;
        while x <= 0.0 {
            let (got, want) = (exp_nonpositive(x) as f64, (x as f64).exp());
            worst = worst.max((got - want).abs() / want);
            x += 0.000_37;
        }
        assert!(worst < 2.5e-7, "max relative error {worst}");
        assert_eq!(exp_nonpositive(0.0), 1.0);
        assert!(exp_nonpositive(-1e30) < 2e-38);
        assert!(exp_nonpositive(f32::NAN).is_nan());
    }

    #[test]
    fn softmax_matches_the_reference_on_random_scores() {
        let mut rng = rand_chacha::ChaCha8Rng::seed_from_u64(11);
        for n in [1, 2, 7, 8, 9, 31, 64, 100, 513, 4096] {
            let x: Vec<f32> = (0..n).map(|_| rng.random_range(-30.0..30.0)).collect();
            let (mut got, mut want) = (x.clone(), x.clone());
            softmax(&mut got);
            kvlab_model::ops::softmax(&mut want);
            for (i, (a, b)) in got.iter().zip(&want).enumerate() {
                assert!(
                    (a - b).abs() <= 1e-6 * b.abs() + 1e-9,
                    "n={n} i={i}: {a} vs {b}"
                );
            }
        }
    }

    #[test]
    fn a_nan_score_never_passes() {
        for n in [3, 8, 17] {
            let mut x: Vec<f32> = (0..n).map(|i| i as f32).collect();
            x[n / 2] = f32::NAN;
            softmax(&mut x);
            assert!(x.iter().all(|v| v.is_nan()), "n={n}: {x:?}");
        }
    }
}

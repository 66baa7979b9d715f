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

/// How the exp polynomial multiplies and adds: [`Fused`] (one FMA instruction, one rounding) in
/// kernels compiled for FMA, [`Unfused`] elsewhere (where `mul_add` would be a slow libm call).
pub trait MulAdd {
    /// a·b + c.
    fn mul_add(a: f32, b: f32, c: f32) -> f32;
}

/// a·b + c rounded once (`f32::mul_add`).
pub struct Fused;

impl MulAdd for Fused {
    #[inline(always)]
    fn mul_add(a: f32, b: f32, c: f32) -> f32 {
        a.mul_add(b, c)
    }
}

/// a·b + c rounded twice.
pub struct Unfused;

impl MulAdd for Unfused {
    #[inline(always)]
    fn mul_add(a: f32, b: f32, c: f32) -> f32 {
        a * b + c
    }
}

/// e^x for x ≤ 0 (scores after subtracting their max). Below −87 the result is clamped to
/// e^−87 ≈ 1.6e−38 (a softmax weight of 0 in f32 sums); NaN stays NaN.
#[inline(always)]
pub fn exp_nonpositive<M: MulAdd>(x: f32) -> f32 {
    // Comparisons, not f32::max, so a NaN passes through.
    let x = if x < -87.0 { -87.0 } else { x };
    // t = 1.5·2²³ + round(x / ln 2): its low mantissa bits are n (two's complement), which is
    // how 2ⁿ is built below without a float → int conversion (Rust's saturating `as` does not
    // vectorize).
    let t = M::mul_add(x, LOG2E, ROUND);
    let n = t - ROUND;
    let r = M::mul_add(-n, LN2_LO, M::mul_add(-n, LN2_HI, x));
    let p = [
        1.398_199_9e-3,
        8.333_452e-3,
        4.166_579_6e-2,
        1.666_666_5e-1,
        0.5,
    ]
    .iter()
    .fold(1.987_569_1e-4, |p, &c| M::mul_add(p, r, c));
    let e_r = M::mul_add(p, r * r, r + 1.0);
    // n ∈ [−126, 0] here, so n + 127 is a normal exponent; a NaN x makes e_r NaN whatever
    // these bits are.
    let two_n = f32::from_bits((t.to_bits().wrapping_sub(ROUND.to_bits()).wrapping_add(127)) << 23);
    e_r * two_n
}

/// x ← softmax(x) = e^(x_i − max) / Σ_j e^(x_j − max). A NaN anywhere makes every output NaN.
#[inline(always)]
pub fn softmax<M: MulAdd>(x: &mut [f32]) {
    let inv = 1.0 / exp_shifted::<M>(x).1;
    x.iter_mut().for_each(|v| *v *= inv);
}

/// x ← e^(x_i − max), returning (max, Σ_i e^(x_i − max)): softmax without its division, for a
/// caller that divides something shorter instead (attention divides its head_dim outputs, not
/// its scores) or merges softmaxes over parts of the scores. A NaN anywhere makes the sum NaN.
#[inline(always)]
pub fn exp_shifted<M: MulAdd>(x: &mut [f32]) -> (f32, f32) {
    // Lanes: independent accumulators the compiler keeps in one AVX-512 register (two AVX2 ones).
    const L: usize = 16;
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
    let max = reduce(m, |a, b| if b > a { b } else { a });
    let mut s = [0.0f32; L];
    let mut chunks = x.chunks_exact_mut(L);
    for c in &mut chunks {
        for i in 0..L {
            c[i] = exp_nonpositive::<M>(c[i] - max);
            s[i] += c[i];
        }
    }
    for v in chunks.into_remainder() {
        *v = exp_nonpositive::<M>(*v - max);
        s[0] += *v;
    }
    (max, reduce(s, |a, b| a + b))
}

/// Folds 16 lanes pairwise, halves onto halves (four vector steps, not fifteen dependent
/// scalar ones: at short contexts the fold cost as much as the exps).
#[inline(always)]
fn reduce(v: [f32; 16], f: impl Fn(f32, f32) -> f32) -> f32 {
    let h8: [f32; 8] = std::array::from_fn(|i| f(v[i], v[i + 8]));
    let h4: [f32; 4] = std::array::from_fn(|i| f(h8[i], h8[i + 4]));
    f(f(h4[0], h4[2]), f(h4[1], h4[3]))
}

#[cfg(test)]
mod tests {
    use super::*;
    use rand::{Rng, SeedableRng};

    /// Runs `check::<M>` for both ways of multiplying and adding.
    macro_rules! both {
        ($check:ident) => {
            $check::<Fused>();
            $check::<Unfused>();
        };
    }

    #[test]
    fn exp_is_within_two_ulp_of_libm_over_the_softmax_range() {
        fn check<M: MulAdd>() {
            let mut worst = 0.0f64;
            let mut x = -87.0f32;
            while x <= 0.0 {
                let (got, want) = (exp_nonpositive::<M>(x) as f64, (x as f64).exp());
                worst = worst.max((got - want).abs() / want);
                x += 0.000_37;
            }
            assert!(worst < 2.5e-7, "max relative error {worst}");
            assert_eq!(exp_nonpositive::<M>(0.0), 1.0);
            assert!(exp_nonpositive::<M>(-1e30) < 2e-38);
            assert!(exp_nonpositive::<M>(f32::NAN).is_nan());
        }
        both!(check);
    }

    #[test]
    fn softmax_matches_the_reference_on_random_scores() {
        // Against softmax in f64 (exact to f32's precision): kvlab_model::ops::softmax, the f32
        // reference, sums in another order and is itself ~1e-6 off at n = 4096.
        fn check<M: MulAdd>() {
            let mut rng = rand_chacha::ChaCha8Rng::seed_from_u64(11);
            for n in [1, 2, 7, 8, 9, 15, 16, 17, 31, 64, 100, 513, 4096] {
                let x: Vec<f32> = (0..n).map(|_| rng.random_range(-30.0..30.0)).collect();
                let mut got = x.clone();
                softmax::<M>(&mut got);
                let max = x.iter().fold(f64::NEG_INFINITY, |m, &v| m.max(v as f64));
                let e: Vec<f64> = x.iter().map(|&v| (v as f64 - max).exp()).collect();
                let sum: f64 = e.iter().sum();
                let mut f32_ref = x.clone();
                kvlab_model::ops::softmax(&mut f32_ref);
                for (i, (a, e)) in got.iter().zip(&e).enumerate() {
                    let want = e / sum;
                    assert!(
                        (*a as f64 - want).abs() <= 1e-6 * want + 1e-12,
                        "n={n} i={i}: {a} vs {want}"
                    );
                    assert!((a - f32_ref[i]).abs() <= 3e-6 * f32_ref[i] + 1e-9);
                }
            }
        }
        both!(check);
    }

    #[test]
    fn a_nan_score_never_passes() {
        fn check<M: MulAdd>() {
            for n in [3, 8, 17] {
                let mut x: Vec<f32> = (0..n).map(|i| i as f32).collect();
                x[n / 2] = f32::NAN;
                softmax::<M>(&mut x);
                assert!(x.iter().all(|v| v.is_nan()), "n={n}: {x:?}");
            }
        }
        both!(check);
    }
}

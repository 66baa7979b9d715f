//! Elementwise steps of the cached forward pass over all of a step's rows, split across the
//! engine's threads when the step is large enough to pay for it (a prompt, a big batch), on the
//! calling thread otherwise (a decode token). The maths is `kvlab_model::ops`'.
//!
//! In a 100-token prefill the gated activation is 100 × hidden_dim exps between two matrix
//! products; on one thread it kept the other one waiting, long enough to park. A decode batch of
//! 32 sequences normalises 32 rows 13 times a step (stories15M's 6 layers), which on one thread
//! kept the other waiting too.
//!
//! GeGLU's tanh is the one step that is not `ops`' to the bit: libm's `tanhf` is a call per
//! element (Gemma 3 270M: 36,864 a token, ~11% of a 1,000-token prefill and ~4% of a decode step
//! on the 2-core AMD EPYC), so [`glu`] computes tanh(u) = sign(u)·(1 − e)/(1 + e) with
//! e = e^(−2|u|) from [`crate::softmax::exp_nonpositive`], which the compiler vectorizes. Its
//! error is a few units of f32's last place of 1 + tanh(u) (tested against `ops::gelu_tanh`).

use kvlab_model::{Activation, ops};

use crate::simd::{Isa, isa};
use crate::softmax::{Fused, MulAdd, Unfused, exp_nonpositive};
use crate::threads;

/// Below this many elements a step's elementwise work runs on the calling thread.
const PAR_MIN_ELEMENTS: usize = 1 << 14;

/// gate ← act(gate) ⊙ up (SwiGLU / GeGLU), gate and up (rows, hidden_dim) row-major.
pub fn glu(gate: &mut [f32], up: &[f32], act: Activation) {
    if gate.len() < PAR_MIN_ELEMENTS {
        glu_share(gate, up, act);
        return;
    }
    // One contiguous share per thread, a multiple of 16 elements.
    let per = gate
        .len()
        .div_ceil(threads::num_threads())
        .next_multiple_of(16);
    threads::for_each_chunk_mut(gate, per, |i, g| glu_share(g, &up[i * per..], act));
}

/// One thread's share of [`glu`]: SiLU by `ops` (bit for bit), GELU by [`gelu_tanh`] compiled
/// for the widest level this CPU runs.
fn glu_share(gate: &mut [f32], up: &[f32], act: Activation) {
    if act == Activation::Silu {
        ops::glu(gate, up, act);
        return;
    }
    geglu_at(isa(), gate, up);
}

/// gate ← gelu_tanh(gate) ⊙ up compiled for `level`, or for the scalar level where this CPU
/// lacks what `level` needs.
fn geglu_at(level: Isa, gate: &mut [f32], up: &[f32]) {
    #[cfg(target_arch = "x86_64")]
    let (avx512, avx2) = {
        let fma = is_x86_feature_detected!("fma");
        (
            fma && is_x86_feature_detected!("avx512f"),
            fma && is_x86_feature_detected!("avx2"),
        )
    };
    match level {
        #[cfg(target_arch = "x86_64")]
        // SAFETY: AVX-512F and FMA checked just above.
        Isa::Avx512 if avx512 => unsafe { geglu_avx512(gate, up) },
        #[cfg(target_arch = "x86_64")]
        // SAFETY: AVX2 and FMA checked just above.
        Isa::Avx2Fma if avx2 => unsafe { geglu_avx2(gate, up) },
        _ => geglu::<Unfused>(gate, up),
    }
}

/// gate ← gelu_tanh(gate) ⊙ up, compiled for AVX-512F.
///
/// # Safety
/// The CPU has AVX-512F and FMA.
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx512f,fma")]
unsafe fn geglu_avx512(gate: &mut [f32], up: &[f32]) {
    geglu::<Fused>(gate, up)
}

/// gate ← gelu_tanh(gate) ⊙ up, compiled for AVX2 and FMA.
///
/// # Safety
/// The CPU has AVX2 and FMA.
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2,fma")]
unsafe fn geglu_avx2(gate: &mut [f32], up: &[f32]) {
    geglu::<Fused>(gate, up)
}

/// gate ← gelu_tanh(gate) ⊙ up, inlined into the caller's features.
#[inline(always)]
fn geglu<M: MulAdd>(gate: &mut [f32], up: &[f32]) {
    for (g, &u) in gate.iter_mut().zip(up) {
        *g = gelu_tanh::<M>(*g) * u;
    }
}

/// GELU, tanh approximation, as `ops::gelu_tanh` (Hendrycks & Gimpel 2016), with
/// tanh(u) = sign(u)·(1 − e)/(1 + e), e = e^(−2|u|) ∈ (0, 1]. NaN stays NaN, ±∞ gives what
/// `ops::gelu_tanh` gives (∞ and NaN).
#[inline(always)]
fn gelu_tanh<M: MulAdd>(x: f32) -> f32 {
    const SQRT_2_OVER_PI: f32 = 0.797_884_6;
    let u = SQRT_2_OVER_PI * (x + 0.044_715 * x * x * x);
    let e = exp_nonpositive::<M>(-2.0 * u.abs());
    let tanh = ((1.0 - e) / (1.0 + e)).copysign(u);
    0.5 * x * (1.0 + tanh)
}

/// RMSNorm of each row of x (rows, d) into out (rows, d), the rows shared among the engine's
/// threads when there are enough of them (a batch of 32 sequences normalises 13 times a step).
pub fn rmsnorm_rows(out: &mut [f32], x: &[f32], w: &[f32], d: usize, eps: f32) {
    let rows = out.len() / d;
    let norm = |o: &mut [f32], x: &[f32]| {
        for (o, r) in o.chunks_exact_mut(d).zip(x.chunks_exact(d)) {
            ops::rmsnorm(o, r, w, eps);
        }
    };
    if rows < PAR_NORM_MIN_ROWS {
        norm(out, x);
        return;
    }
    let per = rows.div_ceil(threads::num_threads());
    threads::for_each_chunk_mut(out, per * d, |i, o| norm(o, &x[i * per * d..]));
}

/// Rows from which [`rmsnorm_rows`] shares them among threads.
const PAR_NORM_MIN_ROWS: usize = 8;

#[cfg(test)]
mod tests {
    use super::*;
    use rand::{Rng, SeedableRng};

    #[test]
    fn equals_the_reference_at_every_size_silu_to_the_bit() {
        for n in [
            1,
            100,
            PAR_MIN_ELEMENTS - 1,
            PAR_MIN_ELEMENTS,
            3 * PAR_MIN_ELEMENTS + 5,
        ] {
            let gate: Vec<f32> = (0..n).map(|i| (i as f32 * 0.37).sin() * 4.0).collect();
            let up: Vec<f32> = (0..n).map(|i| (i as f32 * 0.11).cos()).collect();
            for act in [Activation::Silu, Activation::GeluTanh] {
                let (mut got, mut want) = (gate.clone(), gate.clone());
                glu(&mut got, &up, act);
                ops::glu(&mut want, &up, act);
                if act == Activation::Silu {
                    assert_eq!(got, want, "n={n} {act:?}");
                } else {
                    for (i, (g, w)) in got.iter().zip(&want).enumerate() {
                        let bound = 4e-7 * (w.abs() + up[i].abs() * gate[i].abs());
                        assert!((g - w).abs() <= bound, "n={n} {act:?} [{i}]: {g} vs {w}");
                    }
                }
            }
        }
    }

    /// GELU at every level this CPU runs, over 0, subnormals, the whole range where tanh is
    /// neither 0 nor ±1 and beyond, infinities and NaN: within a few ulp of 1 + tanh(u) of the
    /// libm reference (relative to |x|, the scale of the result), the same at ±∞, NaN for NaN.
    #[test]
    fn gelu_tanh_is_within_a_few_ulp_of_libm_at_every_level() {
        let mut xs: Vec<f32> = vec![0.0, -0.0, 1e-40, -1e-40, 1e-20, -1e-20, 3e38, -3e38];
        xs.extend((-40_000..=40_000).map(|i| i as f32 * 2.5e-4));
        let mut rng = rand_chacha::ChaCha8Rng::seed_from_u64(13);
        xs.extend((0..100_000).map(|_| rng.random_range(-12.0f32..12.0)));
        let up = vec![1.0; xs.len()];
        for level in Isa::available() {
            let mut got = xs.clone();
            geglu_at(level, &mut got, &up);
            for (&x, &g) in xs.iter().zip(&got) {
                let want = ops::gelu_tanh(x);
                let ok = (g - want).abs() <= 4e-7 * x.abs().max(f32::MIN_POSITIVE)
                    || g.to_bits() == want.to_bits();
                assert!(
                    ok,
                    "{level:?} gelu_tanh({x:e}) = {g:e}, libm gives {want:e}"
                );
            }
            let mut special = [f32::INFINITY, f32::NEG_INFINITY, f32::NAN];
            geglu::<Unfused>(&mut special, &[1.0; 3]);
            assert_eq!(special[0], f32::INFINITY);
            assert!(special[1].is_nan() && special[2].is_nan());
        }
    }

    #[test]
    fn rmsnorm_rows_equals_the_reference_row_by_row() {
        let mut rng = rand_chacha::ChaCha8Rng::seed_from_u64(12);
        let d = 48;
        let w: Vec<f32> = (0..d).map(|_| rng.random_range(0.5..1.5)).collect();
        for rows in [1, PAR_NORM_MIN_ROWS - 1, PAR_NORM_MIN_ROWS, 33] {
            let x: Vec<f32> = (0..rows * d).map(|_| rng.random_range(-2.0..2.0)).collect();
            let mut got = vec![f32::NAN; rows * d];
            rmsnorm_rows(&mut got, &x, &w, d, 1e-5);
            for (r, row) in got.chunks_exact(d).enumerate() {
                let mut want = vec![0.0; d];
                ops::rmsnorm(&mut want, &x[r * d..(r + 1) * d], &w, 1e-5);
                assert_eq!(row, &want[..], "rows={rows} row {r}");
            }
        }
    }
}

//! The decode hot loops, dot and axpy, hand-written for AVX-512 and AVX2+FMA with a scalar
//! fallback, chosen once at run time from the CPU's features (no `-C target-cpu=native` needed).
//! `KVLAB_SIMD=scalar|avx2|avx512` forces a lower level (for tests and benchmarks).
//!
//! Each kernel is tested against the scalar reference in `kvlab_model::ops` on random inputs.

use std::sync::OnceLock;

/// An instruction-set level.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Isa {
    Scalar,
    /// AVX2 with FMA: 8 f32 lanes.
    Avx2Fma,
    /// AVX-512F: 16 f32 lanes.
    Avx512,
}

impl Isa {
    /// Every level this CPU can run, lowest first.
    pub fn available() -> Vec<Isa> {
        let mut v = vec![Isa::Scalar];
        #[cfg(target_arch = "x86_64")]
        {
            if is_x86_feature_detected!("avx2") && is_x86_feature_detected!("fma") {
                v.push(Isa::Avx2Fma);
            }
            if is_x86_feature_detected!("avx512f") {
                v.push(Isa::Avx512);
            }
        }
        v
    }

    pub fn name(self) -> &'static str {
        match self {
            Isa::Scalar => "scalar",
            Isa::Avx2Fma => "avx2+fma",
            Isa::Avx512 => "avx512f",
        }
    }
}

/// The level used by [`dot`] and [`axpy`]: the best available, or lower if `KVLAB_SIMD` says so.
pub fn isa() -> Isa {
    static ISA: OnceLock<Isa> = OnceLock::new();
    *ISA.get_or_init(|| {
        let avail = Isa::available();
        let best = *avail.last().expect("scalar is always available");
        let wanted = match std::env::var("KVLAB_SIMD").as_deref() {
            Ok("scalar") => Isa::Scalar,
            Ok("avx2") => Isa::Avx2Fma,
            _ => best,
        };
        if avail.contains(&wanted) {
            wanted
        } else {
            best
        }
    })
}

/// Σ a_i b_i over the common length.
#[inline]
pub fn dot(a: &[f32], b: &[f32]) -> f32 {
    dot_with(isa(), a, b)
}

/// Lanes of [`dot_head`] and [`axpy_head`]: independent accumulators the compiler keeps in one
/// vector register (8 × f32 = 256 bits).
const HEAD_LANES: usize = 8;

/// Σ a_i b_i for one attention head (head_dim of 8 to 256): a plain loop over 8 lanes, inlined
/// into the attention kernel and vectorized there for the instruction set that kernel is compiled
/// for; a call into [`dot`] per key would cost more than the arithmetic of a small head.
#[inline(always)]
pub fn dot_head(a: &[f32], b: &[f32]) -> f32 {
    let n = a.len().min(b.len());
    let (a, b) = (&a[..n], &b[..n]);
    let mut acc = [0.0f32; HEAD_LANES];
    let (ca, cb) = (a.chunks_exact(HEAD_LANES), b.chunks_exact(HEAD_LANES));
    let tail: f32 = ca
        .remainder()
        .iter()
        .zip(cb.remainder())
        .map(|(x, y)| x * y)
        .sum();
    for (x, y) in ca.zip(cb) {
        for i in 0..HEAD_LANES {
            acc[i] += x[i] * y[i];
        }
    }
    let pairs = [
        acc[0] + acc[4],
        acc[1] + acc[5],
        acc[2] + acc[6],
        acc[3] + acc[7],
    ];
    (pairs[0] + pairs[2]) + (pairs[1] + pairs[3]) + tail
}

/// y ← y + alpha·x for one attention head; see [`dot_head`].
#[inline(always)]
pub fn axpy_head(y: &mut [f32], alpha: f32, x: &[f32]) {
    for (y, x) in y.iter_mut().zip(x) {
        *y += alpha * x;
    }
}

/// y ← y + alpha·x over the common length.
#[inline]
pub fn axpy(y: &mut [f32], alpha: f32, x: &[f32]) {
    axpy_with(isa(), y, alpha, x)
}

/// [`dot`] at a given level; a level the CPU lacks falls back to scalar.
#[inline]
pub fn dot_with(isa: Isa, a: &[f32], b: &[f32]) -> f32 {
    let n = a.len().min(b.len());
    let (a, b) = (&a[..n], &b[..n]);
    match isa {
        #[cfg(target_arch = "x86_64")]
        Isa::Avx512 if is_x86_feature_detected!("avx512f") => {
            // SAFETY: the CPU supports AVX-512F (checked just above); the kernel reads only
            // within `a[..n]` and `b[..n]`.
            unsafe { x86::dot_avx512(a, b) }
        }
        #[cfg(target_arch = "x86_64")]
        Isa::Avx2Fma if is_x86_feature_detected!("avx2") && is_x86_feature_detected!("fma") => {
            // SAFETY: the CPU supports AVX2 and FMA (checked just above); reads stay in bounds.
            unsafe { x86::dot_avx2(a, b) }
        }
        _ => kvlab_model::ops::dot(a, b),
    }
}

/// [`axpy`] at a given level; a level the CPU lacks falls back to scalar.
#[inline]
pub fn axpy_with(isa: Isa, y: &mut [f32], alpha: f32, x: &[f32]) {
    let n = y.len().min(x.len());
    let (y, x) = (&mut y[..n], &x[..n]);
    match isa {
        #[cfg(target_arch = "x86_64")]
        Isa::Avx512 if is_x86_feature_detected!("avx512f") => {
            // SAFETY: AVX-512F is present (checked above); reads and writes stay in `[..n]`.
            unsafe { x86::axpy_avx512(y, alpha, x) }
        }
        #[cfg(target_arch = "x86_64")]
        Isa::Avx2Fma if is_x86_feature_detected!("avx2") && is_x86_feature_detected!("fma") => {
            // SAFETY: AVX2 and FMA are present (checked above); accesses stay in `[..n]`.
            unsafe { x86::axpy_avx2(y, alpha, x) }
        }
        _ => kvlab_model::ops::axpy(y, alpha, x),
    }
}

/// out (rows,) = W (rows, cols) @ x (cols,) at the current level, the level chosen once for all
/// rows and several rows computed per pass so each load of x serves them all. Every output equals
/// [`dot`] of its row bit for bit (same accumulators, same order).
pub fn gemv_rows(out: &mut [f32], w: &[f32], x: &[f32]) {
    let cols = x.len();
    assert_eq!(
        w.len(),
        out.len() * cols,
        "gemv_rows: W must be (rows, cols)"
    );
    match isa() {
        #[cfg(target_arch = "x86_64")]
        // SAFETY: isa() returns only levels the CPU supports; the assert above makes every row
        // of `w` exactly `cols` long, which is what the kernel reads.
        Isa::Avx512 => unsafe { x86::gemv_avx512(out, w, x) },
        #[cfg(target_arch = "x86_64")]
        // SAFETY: as above, for AVX2 + FMA.
        Isa::Avx2Fma => unsafe { x86::gemv_avx2(out, w, x) },
        _ => {
            for (o, row) in out.iter_mut().zip(w.chunks_exact(cols)) {
                *o = kvlab_model::ops::dot(row, x);
            }
        }
    }
}

#[cfg(target_arch = "x86_64")]
mod x86 {
    use std::arch::x86_64::*;

    /// GEMV, 4 rows per pass sharing each load of x; every row keeps dot_avx512's 4
    /// accumulators and summation order, so each output is bit-identical to `dot_avx512(row, x)`.
    ///
    /// # Safety
    /// The CPU must support AVX-512F; `w` must hold `out.len()` rows of `x.len()` floats.
    // k indexes both x's offset and each row's accumulator: a range loop says that best.
    #[allow(clippy::needless_range_loop)]
    #[target_feature(enable = "avx512f")]
    pub unsafe fn gemv_avx512(out: &mut [f32], w: &[f32], x: &[f32]) {
        const R: usize = 4;
        let n = x.len();
        let px = x.as_ptr();
        let rows = out.len();
        let mut r = 0;
        while r + R <= rows {
            // SAFETY (every raw load below): row r + q < rows starts at (r + q)·n inside w, and
            // i + lanes ≤ n, so each load reads inside its row and inside x.
            let pw: [*const f32; R] =
                std::array::from_fn(|k| unsafe { w.as_ptr().add((r + k) * n) });
            let mut acc = [[_mm512_setzero_ps(); 4]; R];
            let mut i = 0;
            while i + 64 <= n {
                for k in 0..4 {
                    let xv = unsafe { _mm512_loadu_ps(px.add(i + 16 * k)) };
                    for q in 0..R {
                        acc[q][k] = unsafe {
                            _mm512_fmadd_ps(_mm512_loadu_ps(pw[q].add(i + 16 * k)), xv, acc[q][k])
                        };
                    }
                }
                i += 64;
            }
            while i + 16 <= n {
                let xv = unsafe { _mm512_loadu_ps(px.add(i)) };
                for q in 0..R {
                    acc[q][0] =
                        unsafe { _mm512_fmadd_ps(_mm512_loadu_ps(pw[q].add(i)), xv, acc[q][0]) };
                }
                i += 16;
            }
            for q in 0..R {
                let a = &acc[q];
                let sum = _mm512_add_ps(_mm512_add_ps(a[0], a[1]), _mm512_add_ps(a[2], a[3]));
                let mut s = _mm512_reduce_add_ps(sum);
                let row = &w[(r + q) * n..(r + q + 1) * n];
                for j in i..n {
                    s += row[j] * x[j];
                }
                out[r + q] = s;
            }
            r += R;
        }
        for q in r..rows {
            out[q] = unsafe { dot_avx512(&w[q * n..(q + 1) * n], x) };
        }
    }

    /// GEMV, 2 rows per pass, each bit-identical to `dot_avx2(row, x)`.
    ///
    /// # Safety
    /// The CPU must support AVX2 and FMA; `w` must hold `out.len()` rows of `x.len()` floats.
    #[allow(clippy::needless_range_loop)]
    #[target_feature(enable = "avx2,fma")]
    pub unsafe fn gemv_avx2(out: &mut [f32], w: &[f32], x: &[f32]) {
        const R: usize = 2;
        let n = x.len();
        let px = x.as_ptr();
        let rows = out.len();
        let mut r = 0;
        while r + R <= rows {
            // SAFETY (every raw load below): row r + q < rows starts at (r + q)·n inside w, and
            // i + lanes ≤ n, so each load reads inside its row and inside x.
            let pw: [*const f32; R] =
                std::array::from_fn(|k| unsafe { w.as_ptr().add((r + k) * n) });
            let mut acc = [[_mm256_setzero_ps(); 4]; R];
            let mut i = 0;
            while i + 32 <= n {
                for k in 0..4 {
                    let xv = unsafe { _mm256_loadu_ps(px.add(i + 8 * k)) };
                    for q in 0..R {
                        acc[q][k] = unsafe {
                            _mm256_fmadd_ps(_mm256_loadu_ps(pw[q].add(i + 8 * k)), xv, acc[q][k])
                        };
                    }
                }
                i += 32;
            }
            while i + 8 <= n {
                let xv = unsafe { _mm256_loadu_ps(px.add(i)) };
                for q in 0..R {
                    acc[q][0] =
                        unsafe { _mm256_fmadd_ps(_mm256_loadu_ps(pw[q].add(i)), xv, acc[q][0]) };
                }
                i += 8;
            }
            for q in 0..R {
                let a = &acc[q];
                let v = _mm256_add_ps(_mm256_add_ps(a[0], a[1]), _mm256_add_ps(a[2], a[3]));
                let v = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
                let v = _mm_add_ps(v, _mm_movehl_ps(v, v));
                let v = _mm_add_ss(v, _mm_shuffle_ps(v, v, 1));
                let mut s = _mm_cvtss_f32(v);
                let row = &w[(r + q) * n..(r + q + 1) * n];
                for j in i..n {
                    s += row[j] * x[j];
                }
                out[r + q] = s;
            }
            r += R;
        }
        for q in r..rows {
            out[q] = unsafe { dot_avx2(&w[q * n..(q + 1) * n], x) };
        }
    }

    /// Four 16-lane accumulators hide the FMA latency; the tail is scalar.
    ///
    /// # Safety
    /// The CPU must support AVX-512F; `a` and `b` must have the same length.
    #[target_feature(enable = "avx512f")]
    pub unsafe fn dot_avx512(a: &[f32], b: &[f32]) -> f32 {
        let n = a.len();
        let (pa, pb) = (a.as_ptr(), b.as_ptr());
        let mut acc = [_mm512_setzero_ps(); 4];
        let mut i = 0;
        // SAFETY (all loads below): i + 64 ≤ n, resp. i + 16 ≤ n, so every lane is in bounds.
        while i + 64 <= n {
            for (k, acc) in acc.iter_mut().enumerate() {
                let off = i + 16 * k;
                *acc = unsafe {
                    _mm512_fmadd_ps(
                        _mm512_loadu_ps(pa.add(off)),
                        _mm512_loadu_ps(pb.add(off)),
                        *acc,
                    )
                };
            }
            i += 64;
        }
        while i + 16 <= n {
            acc[0] = unsafe {
                _mm512_fmadd_ps(
                    _mm512_loadu_ps(pa.add(i)),
                    _mm512_loadu_ps(pb.add(i)),
                    acc[0],
                )
            };
            i += 16;
        }
        let sum = _mm512_add_ps(_mm512_add_ps(acc[0], acc[1]), _mm512_add_ps(acc[2], acc[3]));
        let mut s = _mm512_reduce_add_ps(sum);
        while i < n {
            s += a[i] * b[i];
            i += 1;
        }
        s
    }

    /// # Safety
    /// The CPU must support AVX2 and FMA; `a` and `b` must have the same length.
    #[target_feature(enable = "avx2,fma")]
    pub unsafe fn dot_avx2(a: &[f32], b: &[f32]) -> f32 {
        let n = a.len();
        let (pa, pb) = (a.as_ptr(), b.as_ptr());
        let mut acc = [_mm256_setzero_ps(); 4];
        let mut i = 0;
        // SAFETY (all loads below): i + 32 ≤ n, resp. i + 8 ≤ n.
        while i + 32 <= n {
            for (k, acc) in acc.iter_mut().enumerate() {
                let off = i + 8 * k;
                *acc = unsafe {
                    _mm256_fmadd_ps(
                        _mm256_loadu_ps(pa.add(off)),
                        _mm256_loadu_ps(pb.add(off)),
                        *acc,
                    )
                };
            }
            i += 32;
        }
        while i + 8 <= n {
            acc[0] = unsafe {
                _mm256_fmadd_ps(
                    _mm256_loadu_ps(pa.add(i)),
                    _mm256_loadu_ps(pb.add(i)),
                    acc[0],
                )
            };
            i += 8;
        }
        let v = _mm256_add_ps(_mm256_add_ps(acc[0], acc[1]), _mm256_add_ps(acc[2], acc[3]));
        // Horizontal sum of 8 lanes: fold 256 → 128 → 64 → 32 bits.
        let v = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
        let v = _mm_add_ps(v, _mm_movehl_ps(v, v));
        let v = _mm_add_ss(v, _mm_shuffle_ps(v, v, 1));
        let mut s = _mm_cvtss_f32(v);
        while i < n {
            s += a[i] * b[i];
            i += 1;
        }
        s
    }

    /// # Safety
    /// The CPU must support AVX-512F; `y` and `x` must have the same length.
    #[target_feature(enable = "avx512f")]
    pub unsafe fn axpy_avx512(y: &mut [f32], alpha: f32, x: &[f32]) {
        let n = y.len();
        let (py, px) = (y.as_mut_ptr(), x.as_ptr());
        let a = _mm512_set1_ps(alpha);
        let mut i = 0;
        while i + 16 <= n {
            // SAFETY: i + 16 ≤ n for both slices.
            unsafe {
                _mm512_storeu_ps(
                    py.add(i),
                    _mm512_fmadd_ps(a, _mm512_loadu_ps(px.add(i)), _mm512_loadu_ps(py.add(i))),
                )
            };
            i += 16;
        }
        while i < n {
            y[i] += alpha * x[i];
            i += 1;
        }
    }

    /// # Safety
    /// The CPU must support AVX2 and FMA; `y` and `x` must have the same length.
    #[target_feature(enable = "avx2,fma")]
    pub unsafe fn axpy_avx2(y: &mut [f32], alpha: f32, x: &[f32]) {
        let n = y.len();
        let (py, px) = (y.as_mut_ptr(), x.as_ptr());
        let a = _mm256_set1_ps(alpha);
        let mut i = 0;
        while i + 8 <= n {
            // SAFETY: i + 8 ≤ n for both slices.
            unsafe {
                _mm256_storeu_ps(
                    py.add(i),
                    _mm256_fmadd_ps(a, _mm256_loadu_ps(px.add(i)), _mm256_loadu_ps(py.add(i))),
                )
            };
            i += 8;
        }
        while i < n {
            y[i] += alpha * x[i];
            i += 1;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use rand::{Rng, SeedableRng};
    use rand_chacha::ChaCha8Rng;

    fn rand_vec(rng: &mut ChaCha8Rng, n: usize) -> Vec<f32> {
        (0..n).map(|_| rng.random_range(-2.0f32..2.0)).collect()
    }

    const LENS: [usize; 12] = [0, 1, 7, 8, 15, 16, 17, 63, 64, 65, 288, 1031];

    #[test]
    fn dot_matches_the_scalar_reference_at_every_level() {
        let mut rng = ChaCha8Rng::seed_from_u64(1);
        for isa in Isa::available() {
            for n in LENS {
                let (a, b) = (rand_vec(&mut rng, n), rand_vec(&mut rng, n));
                let fast = dot_with(isa, &a, &b);
                let reference: f64 = a.iter().zip(&b).map(|(x, y)| *x as f64 * *y as f64).sum();
                let scale: f64 = a
                    .iter()
                    .zip(&b)
                    .map(|(x, y)| (*x as f64 * *y as f64).abs())
                    .sum::<f64>()
                    .max(1e-30);
                let rel = (fast as f64 - reference).abs() / scale;
                assert!(
                    rel < 1e-6,
                    "{} n={n}: {fast} vs {reference} (rel {rel})",
                    isa.name()
                );
            }
        }
    }

    #[test]
    fn axpy_matches_the_scalar_reference_at_every_level() {
        let mut rng = ChaCha8Rng::seed_from_u64(2);
        for isa in Isa::available() {
            for n in LENS {
                let (x, y0) = (rand_vec(&mut rng, n), rand_vec(&mut rng, n));
                let mut fast = y0.clone();
                axpy_with(isa, &mut fast, 0.37, &x);
                let mut reference = y0.clone();
                kvlab_model::ops::axpy(&mut reference, 0.37, &x);
                for (f, r) in fast.iter().zip(&reference) {
                    assert!(
                        (f - r).abs() <= 1e-6 * r.abs().max(1.0),
                        "{} n={n}: {f} vs {r}",
                        isa.name()
                    );
                }
            }
        }
    }

    #[test]
    fn gemv_rows_equals_dot_per_row_bit_for_bit() {
        let mut rng = ChaCha8Rng::seed_from_u64(3);
        for (rows, cols) in [(1, 5), (3, 64), (4, 65), (7, 288), (9, 1031), (13, 8)] {
            let (w, x) = (rand_vec(&mut rng, rows * cols), rand_vec(&mut rng, cols));
            let mut out = vec![f32::NAN; rows];
            gemv_rows(&mut out, &w, &x);
            for (r, o) in out.iter().enumerate() {
                assert_eq!(
                    o.to_bits(),
                    dot(&w[r * cols..(r + 1) * cols], &x).to_bits(),
                    "row {r} of ({rows}, {cols})"
                );
            }
        }
    }

    #[test]
    fn nan_propagates_and_never_passes() {
        for isa in Isa::available() {
            let mut a = vec![1.0f32; 100];
            a[70] = f32::NAN;
            assert!(dot_with(isa, &a, &a).is_nan(), "{}", isa.name());
        }
    }

    #[test]
    fn head_kernels_match_the_scalar_reference() {
        let mut rng = ChaCha8Rng::seed_from_u64(21);
        for n in [1, 7, 8, 9, 16, 48, 64, 128, 256, 257] {
            let (a, b) = (rand_vec(&mut rng, n), rand_vec(&mut rng, n));
            let (got, want) = (dot_head(&a, &b), kvlab_model::ops::dot(&a, &b));
            let scale: f32 = a.iter().zip(&b).map(|(x, y)| (x * y).abs()).sum();
            assert!(
                (got - want).abs() <= 1e-6 * scale,
                "dot n={n}: {got} vs {want}"
            );
            let (mut y, mut y_ref) = (b.clone(), b.clone());
            axpy_head(&mut y, 0.37, &a);
            kvlab_model::ops::axpy(&mut y_ref, 0.37, &a);
            assert_eq!(y, y_ref, "axpy n={n}");
        }
        let mut a = vec![1.0f32; 48];
        a[40] = f32::NAN;
        assert!(dot_head(&a, &a).is_nan());
    }
}

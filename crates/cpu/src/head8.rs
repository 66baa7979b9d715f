//! Attention kernels for heads of 8 dimensions (stories260K: 8 query heads on 4 KV heads,
//! head_dim 8) on AVX-512: two query heads that share a KV head fill one 16-lane register.
//!
//! With head_dim 8 a key row fills half a register, so the AVX2 kernels
//! ([`crate::simd::HeadKernels`]) spend most of their time folding 8-lane products into scores,
//! once per query head. Here the key row is loaded once into both halves of a register,
//! `[k_b | k_b]`, and multiplied by `[q_0 | q_1]`; one fold of eight such registers gives 16
//! scores (8 keys × 2 heads). The weighted sum likewise keeps `[o_0 | o_1]` in one register and
//! adds `[a_0[b]·v_b | a_1[b]·v_b]` per value row.
//!
//! Both produce the same bits as the AVX2 kernels (same products, same folding order), which the
//! tests check, beside the scalar reference.

#[cfg(target_arch = "x86_64")]
use std::arch::x86_64::*;

/// The head dimension these kernels are for.
pub const HEAD_DIM: usize = 8;

/// s_m\[b\] = q_m · x_b for the two query heads m = 0, 1 and b in 0..s_0.len(), where
/// x_b = x\[b·stride..\]\[..8\] (one KV head of consecutive positions).
///
/// # Safety
/// The CPU must support AVX-512F.
///
/// # Panics
/// If the heads are not 8 long, the score rows differ in length, or x holds fewer rows.
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx512f")]
pub unsafe fn dot_rows2(s: [&mut [f32]; 2], q: [&[f32]; 2], x: &[f32], stride: usize) {
    let [s0, s1] = s;
    let nb = s0.len();
    assert!(q[0].len() == HEAD_DIM && q[1].len() == HEAD_DIM && s1.len() == nb);
    if nb == 0 {
        return;
    }
    assert!(
        x.len() >= (nb - 1) * stride + HEAD_DIM,
        "dot_rows2: x holds fewer rows than s"
    );
    let px = x.as_ptr();
    // SAFETY: q_0 and q_1 hold 8 floats each (asserted above).
    let qq = unsafe { pair(q[0].as_ptr(), q[1].as_ptr()) }; // [q_0 | q_1]
    // Lane indices of the final fold, see below: 0..16 pick from u0, 16..32 from u1.
    let lo = _mm512_setr_epi32(0, 1, 2, 3, 16, 17, 18, 19, 8, 9, 10, 11, 24, 25, 26, 27);
    let hi = _mm512_setr_epi32(4, 5, 6, 7, 20, 21, 22, 23, 12, 13, 14, 15, 28, 29, 30, 31);
    let mut b = 0;
    while b + 8 <= nb {
        // p[r] = [q_0 ⊙ k_{b+r} | q_1 ⊙ k_{b+r}]
        // SAFETY: row b + r < nb starts at (b + r)·stride, and (nb − 1)·stride + 8 ≤ x.len().
        let p: [__m512; 8] =
            std::array::from_fn(|r| _mm512_mul_ps(unsafe { twice(px.add((b + r) * stride)) }, qq));
        // hadd per 128-bit lane: [a0+a1, a2+a3, b0+b1, b2+b3], as AVX2's _mm256_hadd_ps.
        let hadd = |a: __m512, c: __m512| {
            _mm512_add_ps(
                _mm512_shuffle_ps::<0b10_00_10_00>(a, c),
                _mm512_shuffle_ps::<0b11_01_11_01>(a, c),
            )
        };
        // After two levels, 128-bit lane L of u0 holds rows 0..4's partial sums over dims
        // 4L'..4L'+4 of head L/2 (L' = L mod 2); u1 the same for rows 4..8.
        let u0 = hadd(hadd(p[0], p[1]), hadd(p[2], p[3]));
        let u1 = hadd(hadd(p[4], p[5]), hadd(p[6], p[7]));
        // dims 0..4 + dims 4..8 of each head: [head 0, rows 0..8 | head 1, rows 0..8].
        let s = _mm512_add_ps(
            _mm512_permutex2var_ps(u0, lo, u1),
            _mm512_permutex2var_ps(u0, hi, u1),
        );
        // SAFETY: b + 8 ≤ nb = s0.len() = s1.len().
        unsafe {
            _mm256_storeu_ps(s0.as_mut_ptr().add(b), _mm512_castps512_ps256(s));
            _mm256_storeu_ps(s1.as_mut_ptr().add(b), upper(s));
        }
        b += 8;
    }
    if b < nb {
        // The last 1..8 rows as the AVX2 kernel takes them, so the bits stay the same.
        use crate::simd::{Avx2Heads, HeadKernels};
        Avx2Heads::dot_rows(&mut s0[b..], q[0], &x[b * stride..], stride);
        Avx2Heads::dot_rows(&mut s1[b..], q[1], &x[b * stride..], stride);
    }
}

/// y_m ← y_m + Σ_b a_m\[b\] x_b for the two query heads m = 0, 1 and b in 0..a_0.len(), where
/// x_b = x\[b·stride..\]\[..8\]. Four accumulators take the rows in turn, as the AVX2 kernel's do.
///
/// # Safety
/// The CPU must support AVX-512F.
///
/// # Panics
/// If the outputs are not 8 long, the weight rows differ in length, or x holds fewer rows.
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx512f")]
pub unsafe fn axpy_rows2(y: [&mut [f32]; 2], a: [&[f32]; 2], x: &[f32], stride: usize) {
    let [y0, y1] = y;
    let nb = a[0].len();
    assert!(y0.len() == HEAD_DIM && y1.len() == HEAD_DIM && a[1].len() == nb);
    if nb == 0 {
        return;
    }
    assert!(
        x.len() >= (nb - 1) * stride + HEAD_DIM,
        "axpy_rows2: x holds fewer rows than a"
    );
    let px = x.as_ptr();
    // [a_0[b] × 8 | a_1[b] × 8]
    let w =
        |b: usize| _mm512_mask_broadcastss_ps(_mm512_set1_ps(a[0][b]), 0xff00, _mm_set_ss(a[1][b]));
    // SAFETY: y_0 and y_1 hold 8 floats each (asserted above).
    let mut acc = [
        unsafe { pair(y0.as_ptr(), y1.as_ptr()) },
        _mm512_setzero_ps(),
        _mm512_setzero_ps(),
        _mm512_setzero_ps(),
    ];
    // SAFETY: (the loads below) row b < nb starts at b·stride, (nb − 1)·stride + 8 ≤ x.len().
    let v = |b: usize| unsafe { twice(px.add(b * stride)) };
    let mut b = 0;
    while b + 4 <= nb {
        for (r, acc) in acc.iter_mut().enumerate() {
            *acc = _mm512_fmadd_ps(w(b + r), v(b + r), *acc);
        }
        b += 4;
    }
    while b < nb {
        acc[0] = _mm512_fmadd_ps(w(b), v(b), acc[0]);
        b += 1;
    }
    let sum = _mm512_add_ps(_mm512_add_ps(acc[0], acc[1]), _mm512_add_ps(acc[2], acc[3]));
    // SAFETY: y_0 and y_1 hold 8 floats each.
    unsafe {
        _mm256_storeu_ps(y0.as_mut_ptr(), _mm512_castps512_ps256(sum));
        _mm256_storeu_ps(y1.as_mut_ptr(), upper(sum));
    }
}

/// `[p[0..8] | p[0..8]]`.
///
/// # Safety
/// AVX-512F; p must point to 8 readable floats.
#[cfg(target_arch = "x86_64")]
#[inline]
#[target_feature(enable = "avx512f")]
unsafe fn twice(p: *const f32) -> __m512 {
    // The f64×4 broadcast moves the same 256 bits as an f32×8 one and needs only AVX-512F.
    // SAFETY: the caller guarantees 8 floats (32 bytes) at p; loadu has no alignment needs.
    _mm512_castpd_ps(_mm512_broadcast_f64x4(unsafe { _mm256_loadu_pd(p.cast()) }))
}

/// `[a[0..8] | b[0..8]]`.
///
/// # Safety
/// AVX-512F; a and b must each point to 8 readable floats.
#[cfg(target_arch = "x86_64")]
#[inline]
#[target_feature(enable = "avx512f")]
unsafe fn pair(a: *const f32, b: *const f32) -> __m512 {
    // SAFETY: the caller guarantees 8 floats at each pointer.
    unsafe {
        let lo = _mm512_castpd256_pd512(_mm256_loadu_pd(a.cast()));
        _mm512_castpd_ps(_mm512_insertf64x4::<1>(lo, _mm256_loadu_pd(b.cast())))
    }
}

/// Lanes 8..16.
#[cfg(target_arch = "x86_64")]
#[inline]
#[target_feature(enable = "avx512f")]
fn upper(v: __m512) -> __m256 {
    _mm256_castpd_ps(_mm512_extractf64x4_pd::<1>(_mm512_castps_pd(v)))
}

#[cfg(all(test, target_arch = "x86_64"))]
mod tests {
    use super::*;
    use crate::simd::{HeadKernels, PlainHeads};
    use rand::{Rng, SeedableRng};

    fn random(n: usize, rng: &mut impl Rng) -> Vec<f32> {
        (0..n).map(|_| rng.random_range(-2.0..2.0)).collect()
    }

    /// Against the scalar reference (relative error) and the AVX2 kernels (bit for bit), for
    /// runs of 0 to 70 rows at the strides of stories260K (4 KV heads) and of one KV head.
    #[test]
    fn pairs_match_the_reference_and_the_avx2_kernels() {
        if !is_x86_feature_detected!("avx512f") {
            eprintln!("SKIPPED: this CPU has no AVX-512F");
            return;
        }
        let mut rng = rand_chacha::ChaCha8Rng::seed_from_u64(8);
        for stride in [8, 32] {
            for nb in [0, 1, 7, 8, 9, 16, 23, 64, 70] {
                let x = random(nb.max(1) * stride, &mut rng);
                let (q0, q1) = (random(8, &mut rng), random(8, &mut rng));
                let (mut s0, mut s1) = (vec![0.0; nb], vec![0.0; nb]);
                // SAFETY: AVX-512F is present (checked above).
                unsafe { dot_rows2([&mut s0, &mut s1], [&q0, &q1], &x, stride) };
                for (q, s) in [(&q0, &s0), (&q1, &s1)] {
                    let mut want = vec![0.0; nb];
                    PlainHeads::dot_rows(&mut want, q, &x, stride);
                    let mut avx2 = vec![0.0; nb];
                    crate::simd::Avx2Heads::dot_rows(&mut avx2, q, &x, stride);
                    for b in 0..nb {
                        assert!((s[b] - want[b]).abs() <= 1e-5 * (1.0 + want[b].abs()));
                        assert_eq!(s[b].to_bits(), avx2[b].to_bits(), "nb {nb} row {b}");
                    }
                }
                let (a0, a1) = (random(nb, &mut rng), random(nb, &mut rng));
                let (mut y0, mut y1) = (random(8, &mut rng), random(8, &mut rng));
                let (want0, want1) = (y0.clone(), y1.clone());
                // SAFETY: as above.
                unsafe { axpy_rows2([&mut y0, &mut y1], [&a0, &a1], &x, stride) };
                for (a, start, got) in [(&a0, want0, &y0), (&a1, want1, &y1)] {
                    let mut want = start.clone();
                    PlainHeads::axpy_rows(&mut want, a, &x, stride);
                    let mut avx2 = start;
                    crate::simd::Avx2Heads::axpy_rows(&mut avx2, a, &x, stride);
                    for i in 0..8 {
                        assert!((got[i] - want[i]).abs() <= 1e-5 * (1.0 + want[i].abs()));
                        assert_eq!(got[i].to_bits(), avx2[i].to_bits(), "nb {nb} dim {i}");
                    }
                }
            }
        }
    }

    #[test]
    fn a_nan_never_passes() {
        if !is_x86_feature_detected!("avx512f") {
            eprintln!("SKIPPED: this CPU has no AVX-512F");
            return;
        }
        let mut x = vec![1.0f32; 16 * 8];
        x[5 * 8 + 3] = f32::NAN;
        let q = [0.5f32; 8];
        let (mut s0, mut s1) = (vec![0.0; 16], vec![0.0; 16]);
        // SAFETY: AVX-512F is present (checked above).
        unsafe { dot_rows2([&mut s0, &mut s1], [&q, &q], &x, 8) };
        assert!(s0[5].is_nan() && s1[5].is_nan() && !s0[4].is_nan());
        let a = [0.25f32; 16];
        let (mut y0, mut y1) = ([0.0f32; 8], [0.0f32; 8]);
        // SAFETY: as above.
        unsafe { axpy_rows2([&mut y0, &mut y1], [&a, &a], &x, 8) };
        assert!(y0[3].is_nan() && y1[3].is_nan() && !y0[2].is_nan());
    }
}

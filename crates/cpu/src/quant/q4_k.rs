//! Q4_K: super-blocks of 256 weights in 8 sub-blocks of 32, each sub-block with a 6-bit scale
//! and a 6-bit min.
//!
//! # Block layout (`block_q4_K` in ggml-common.h, 144 bytes)
//!
//! | bytes    | field        | meaning                                                      |
//! | -------- | ------------ | ------------------------------------------------------------ |
//! | 0..2     | `d: f16`     | super-block scale of the scales                              |
//! | 2..4     | `dmin: f16`  | super-block scale of the mins                                |
//! | 4..16    | `scales[12]` | 8 six-bit scales `sc_j` and 8 six-bit mins `m_j`, packed     |
//! | 16..144  | `qs[128]`    | 256 four-bit quants                                          |
//!
//! The packing of `scales` (`get_scale_min_k4` in ggml-quants.c): for j < 4, `sc_j` is the
//! low 6 bits of byte j and `m_j` those of byte j + 4; for j ≥ 4 the low 4 bits of `sc_j` and
//! `m_j` are the low and high nibble of byte j + 4, and their top 2 bits the spare top bits of
//! bytes j − 4 and j. Sub-blocks 2c and 2c + 1 share the 32 bytes `qs[32c..32c + 32]`: weight
//! 64c + l is the low nibble of `qs[32c + l]` and weight 64c + 32 + l its high nibble. A weight
//! is `d·sc_j·q − dmin·m_j`.
//!
//! # The kernel
//!
//! x stays f32 (it is never quantized); the quants are zero-extended from bytes to 32-bit lanes
//! and turned into f32 in registers. AVX-512 (16 lanes): a sub-block's 16 possible weights
//! `d·sc_j·q − dmin·m_j` (q = 0..16) fit one register, built with one FMA, and `vpermps`,
//! which reads only the low 4 bits of each index lane, looks the low nibbles up in it directly
//! (a shift by 4 first for the high nibbles); each lookup is FMA'd with x. AVX2 (8 lanes,
//! where `vpermps` has only 8 entries) uses Σ value·x = d·sc_j·Σ q·x − dmin·m_j·Σ x instead:
//! nibbles by `and` and shift, converted and multiplied with x into one sum per sub-block,
//! scaled by `d·sc_j`; the sums Σ x over every 32 weights depend on x alone, so they are
//! computed once per call and shared by every row, and a super-block's min term is one 8-lane
//! product (its 8 mins × its 8 sums of x). Both go four rows per pass, so each load of x serves
//! all four, and prefetch blocks ~16 KiB ahead. AVX-512 and AVX2 + FMA are chosen at run time
//! ([`crate::simd::isa`]); the scalar level is the reference.

use super::BlockFormat;
#[cfg(target_arch = "x86_64")]
use super::prefetch;
use kvlab_model::GgmlType;
#[cfg(target_arch = "x86_64")]
use std::arch::x86_64::*;

/// Weights per super-block.
const QK: usize = 256;
/// Bytes per super-block.
const BLOCK: usize = 144;

/// out (rows,) = W (rows, cols) @ x (cols,) for W's rows stored as Q4_K.
///
/// # Panics
/// If `x.len()` is not a whole number of super-blocks or `w` is not `out.len()` such rows.
pub fn gemv_rows(out: &mut [f32], w: &[u8], x: &[f32]) {
    super::gemv_blocks::<Q4K>(out, w, x);
}

/// The Q4_K kernels, for [`super::gemv_blocks`].
struct Q4K;

// SAFETY: the kernels enable AVX-512F, AVX2, FMA and F16C (AVX-512) and AVX2, FMA and F16C
// (AVX2): has_avx512 tests all four, the default has_avx2 (with AVX2_F16C) the three.
unsafe impl BlockFormat for Q4K {
    const TYPE: GgmlType = GgmlType::Q4_K;
    const BLOCK: usize = QK;
    const BLOCK_BYTES: usize = BLOCK;
    #[cfg(target_arch = "x86_64")]
    const AVX2_F16C: bool = true;
    #[cfg(target_arch = "x86_64")]
    type Shared = Vec<f32>;

    /// AVX2's sums of x over every 32 weights ([`sub_block_sums`]); AVX-512 needs none.
    #[cfg(target_arch = "x86_64")]
    fn shared(isa: crate::simd::Isa, x: &[f32]) -> Vec<f32> {
        if isa == crate::simd::Isa::Avx2Fma {
            sub_block_sums(x)
        } else {
            Vec::new()
        }
    }

    #[cfg(target_arch = "x86_64")]
    fn has_avx512() -> bool {
        is_x86_feature_detected!("avx512f") && Self::has_avx2()
    }

    /// N rows (`w` is N rows of `rb` bytes) dotted with x: each sub-block's 16 possible
    /// values `d·sc_j·q − dmin·m_j` (q = 0..16) are one register, and `vpermps`, which reads
    /// only the low 4 bits of each index lane, looks the nibbles up in it.
    ///
    /// # Safety
    /// As [`super::BlockFormat::rows_avx512`]; `w.len() == N * rb` and `rb == x.len() / 256 * 144`.
    #[cfg(target_arch = "x86_64")]
    #[target_feature(enable = "avx512f,avx2,fma,f16c")]
    #[inline]
    unsafe fn rows_avx512<const N: usize>(out: &mut [f32], w: &[u8], x: &[f32], _: &Self::Shared) {
        let rb = x.len() / QK * BLOCK;
        debug_assert!(w.len() == N * rb && out.len() == N);
        let (pw, px) = (w.as_ptr(), x.as_ptr());
        let iota = _mm512_setr_ps(
            0.0, 1.0, 2.0, 3.0, 4.0, 5.0, 6.0, 7.0, 8.0, 9.0, 10.0, 11.0, 12.0, 13.0, 14.0, 15.0,
        );
        let mut acc = [[_mm512_setzero_ps(); 2]; N];
        let mut scl = [[0.0f32; 16]; N];
        let pf = super::prefetch_distance(N * rb);
        for sb in 0..x.len() / QK {
            // SAFETY: (every raw access below) block `sb` of row q starts at q·rb + 144·sb and
            // its 144 bytes are inside `w`; x[256·sb..256·sb + 256] is inside x; scl[q] is 16
            // floats.
            for q in 0..N {
                prefetch(pw.wrapping_add(pf + q * rb + sb * BLOCK), BLOCK);
                let b = &w[q * rb + sb * BLOCK..][..BLOCK];
                let dm = _mm_cvtph_ps(_mm_cvtsi32_si128(i32::from_le_bytes([
                    b[0], b[1], b[2], b[3],
                ])));
                let d = _mm512_broadcastss_ps(dm);
                let dmin = _mm512_broadcastss_ps(_mm_movehdup_ps(dm));
                let coef =
                    _mm512_mask_blend_ps(0xFF00, d, _mm512_sub_ps(_mm512_setzero_ps(), dmin));
                let u = unpack_scales(&b[4..16]);
                let bytes = _mm_set_epi32(u[3] as i32, u[2] as i32, u[1] as i32, u[0] as i32);
                // [d·sc_0..d·sc_8, −dmin·m_0..−dmin·m_8]
                let s = _mm512_mul_ps(_mm512_cvtepi32_ps(_mm512_cvtepu8_epi32(bytes)), coef);
                // SAFETY: scl[q] holds 16 floats.
                unsafe { _mm512_storeu_ps(scl[q].as_mut_ptr(), s) };
            }
            for c in 0..4 {
                // SAFETY: x[256·sb + 64·c..][..64] is inside x (sb < x.len() / 256, c < 4).
                let xp = unsafe { px.add(QK * sb + 64 * c) };
                // SAFETY: xp points at 64 floats of x (above).
                let (x0, x1, x2, x3) = unsafe {
                    (
                        _mm512_loadu_ps(xp),
                        _mm512_loadu_ps(xp.add(16)),
                        _mm512_loadu_ps(xp.add(32)),
                        _mm512_loadu_ps(xp.add(48)),
                    )
                };
                for (q, acc) in acc.iter_mut().enumerate() {
                    let table = |j: usize| {
                        let (s, m) = (scl[q][j], scl[q][8 + j]);
                        _mm512_fmadd_ps(iota, _mm512_set1_ps(s), _mm512_set1_ps(m))
                    };
                    let (t_lo, t_hi) = (table(2 * c), table(2 * c + 1));
                    // SAFETY: quant bytes 16 + 32c..16 + 32c + 32 of row q's block sb lie inside w.
                    let qp = unsafe { pw.add(q * rb + sb * BLOCK + 16 + 32 * c) };
                    // SAFETY: qp points at 32 bytes inside w (above).
                    let (v0, v1) = unsafe {
                        (
                            _mm512_cvtepu8_epi32(_mm_loadu_si128(qp.cast())),
                            _mm512_cvtepu8_epi32(_mm_loadu_si128(qp.add(16).cast())),
                        )
                    };
                    let look = |v, t| _mm512_permutexvar_ps(v, t);
                    acc[0] = _mm512_fmadd_ps(look(v0, t_lo), x0, acc[0]);
                    acc[1] = _mm512_fmadd_ps(look(v1, t_lo), x1, acc[1]);
                    acc[0] = _mm512_fmadd_ps(look(_mm512_srli_epi32::<4>(v0), t_hi), x2, acc[0]);
                    acc[1] = _mm512_fmadd_ps(look(_mm512_srli_epi32::<4>(v1), t_hi), x3, acc[1]);
                }
            }
        }
        for (o, [a, b]) in out.iter_mut().zip(acc) {
            *o = _mm512_reduce_add_ps(_mm512_add_ps(a, b));
        }
    }

    /// N rows dotted with x, 8 lanes: one vector of q·x per sub-block scaled by `d·sc_j`, and
    /// each super-block's min term from the sums of x, `xs` ([`sub_block_sums`]).
    ///
    /// # Safety
    /// As [`Self::rows_avx512`], for AVX2 + FMA + F16C; `xs.len() == x.len() / 32`.
    #[cfg(target_arch = "x86_64")]
    #[target_feature(enable = "avx2,fma,f16c")]
    #[inline]
    unsafe fn rows_avx2<const N: usize>(out: &mut [f32], w: &[u8], x: &[f32], xs: &Self::Shared) {
        let rb = x.len() / QK * BLOCK;
        debug_assert!(w.len() == N * rb && out.len() == N && xs.len() == x.len() / 32);
        let (pw, px) = (w.as_ptr(), x.as_ptr());
        let m4 = _mm256_set1_epi32(0x0F);
        let mut acc = [_mm256_setzero_ps(); N];
        let mut scl = [[0.0f32; 8]; N];
        let pf = super::prefetch_distance(N * rb);
        for sb in 0..x.len() / QK {
            // SAFETY: (every raw access below) as in rows_avx512; the 8 sums of super-block
            // sb are xs[8·sb..8·sb + 8].
            // SAFETY: xs holds 8 sums per super-block: xs[8·sb..][..8] is inside it.
            let xsv = unsafe { _mm256_loadu_ps(xs.as_ptr().add(8 * sb)) };
            for q in 0..N {
                prefetch(pw.wrapping_add(pf + q * rb + sb * BLOCK), BLOCK);
                let b = &w[q * rb + sb * BLOCK..][..BLOCK];
                let dm = _mm_cvtph_ps(_mm_cvtsi32_si128(i32::from_le_bytes([
                    b[0], b[1], b[2], b[3],
                ])));
                let d = _mm256_broadcastss_ps(dm);
                let ndmin = _mm256_sub_ps(
                    _mm256_setzero_ps(),
                    _mm256_broadcastss_ps(_mm_movehdup_ps(dm)),
                );
                let u = unpack_scales(&b[4..16]);
                let sc = _mm_set_epi32(0, 0, u[1] as i32, u[0] as i32);
                let mn = _mm_set_epi32(0, 0, u[3] as i32, u[2] as i32);
                let s = _mm256_mul_ps(_mm256_cvtepi32_ps(_mm256_cvtepu8_epi32(sc)), d);
                let m = _mm256_mul_ps(_mm256_cvtepi32_ps(_mm256_cvtepu8_epi32(mn)), ndmin);
                acc[q] = _mm256_fmadd_ps(m, xsv, acc[q]);
                // SAFETY: scl[q] is 8 floats.
                unsafe { _mm256_storeu_ps(scl[q].as_mut_ptr(), s) };
            }
            for c in 0..4 {
                // SAFETY: x[256·sb + 64·c..][..64] is inside x (sb < x.len() / 256, c < 4).
                let xp = unsafe { px.add(QK * sb + 64 * c) };
                let xv: [__m256; 8] =
                    // SAFETY: xp points at 64 floats of x, read 8 at a time (k < 8).
                    std::array::from_fn(|k| unsafe { _mm256_loadu_ps(xp.add(8 * k)) });
                for q in 0..N {
                    // SAFETY: quant bytes 16 + 32c..16 + 32c + 32 of row q's block sb lie inside w.
                    let qp = unsafe { pw.add(q * rb + sb * BLOCK + 16 + 32 * c) };
                    // SAFETY: qp points at 32 bytes inside w, read 8 at a time (k < 4).
                    let v: [__m256i; 4] = std::array::from_fn(|k| unsafe {
                        _mm256_cvtepu8_epi32(_mm_loadl_epi64(qp.add(8 * k).cast()))
                    });
                    let f = _mm256_cvtepi32_ps;
                    let lo_a = _mm256_mul_ps(f(_mm256_and_si256(v[0], m4)), xv[0]);
                    let lo_b = _mm256_mul_ps(f(_mm256_and_si256(v[1], m4)), xv[1]);
                    let lo_a = _mm256_fmadd_ps(f(_mm256_and_si256(v[2], m4)), xv[2], lo_a);
                    let lo_b = _mm256_fmadd_ps(f(_mm256_and_si256(v[3], m4)), xv[3], lo_b);
                    let hi_a = _mm256_mul_ps(f(_mm256_srli_epi32::<4>(v[0])), xv[4]);
                    let hi_b = _mm256_mul_ps(f(_mm256_srli_epi32::<4>(v[1])), xv[5]);
                    let hi_a = _mm256_fmadd_ps(f(_mm256_srli_epi32::<4>(v[2])), xv[6], hi_a);
                    let hi_b = _mm256_fmadd_ps(f(_mm256_srli_epi32::<4>(v[3])), xv[7], hi_b);
                    let lo = _mm256_add_ps(lo_a, lo_b);
                    let hi = _mm256_add_ps(hi_a, hi_b);
                    acc[q] = _mm256_fmadd_ps(lo, _mm256_set1_ps(scl[q][2 * c]), acc[q]);
                    acc[q] = _mm256_fmadd_ps(hi, _mm256_set1_ps(scl[q][2 * c + 1]), acc[q]);
                }
            }
        }
        for (o, a) in out.iter_mut().zip(acc) {
            *o = super::hsum256(a);
        }
    }
}

/// The 16 bytes `[sc_0..sc_8, m_0..m_8]` of a block's 12 packed scale bytes `p` (ggml's
/// `utmp` shuffle of `get_scale_min_k4`, four bytes at a time).
#[cfg(target_arch = "x86_64")]
#[inline(always)]
fn unpack_scales(p: &[u8]) -> [u32; 4] {
    const K1: u32 = 0x3f3f_3f3f;
    const K2: u32 = 0x0f0f_0f0f;
    const K3: u32 = 0x0303_0303;
    let u = |i: usize| u32::from_le_bytes([p[i], p[i + 1], p[i + 2], p[i + 3]]);
    let (u0, u1, u2) = (u(0), u(4), u(8));
    [
        u0 & K1,
        (u2 & K2) | (((u0 >> 6) & K3) << 4),
        u1 & K1,
        ((u2 >> 4) & K2) | (((u1 >> 6) & K3) << 4),
    ]
}

/// Σ x over every 32 weights: 8 floats per super-block.
#[cfg(target_arch = "x86_64")]
fn sub_block_sums(x: &[f32]) -> Vec<f32> {
    x.chunks_exact(32).map(|s| s.iter().sum()).collect()
}

#[cfg(test)]
mod tests {
    use super::super::testing::{check, f16_bytes, rng};
    use super::*;
    use rand::Rng;

    /// `rows × cols` of random valid Q4_K blocks: d and dmin in a typical range, every scale
    /// byte and quant random.
    fn random_q4_k(rows: usize, cols: usize, seed: u64) -> Vec<u8> {
        let mut r = rng(seed);
        let mut w = Vec::with_capacity(rows * cols / QK * BLOCK);
        for _ in 0..rows * cols / QK {
            w.extend_from_slice(&f16_bytes(&mut r, 1e-4, 2e-2));
            w.extend_from_slice(&f16_bytes(&mut r, 0.0, 1e-2));
            w.extend((0..BLOCK - 4).map(|_| r.random::<u8>()));
        }
        w
    }

    #[test]
    fn matches_the_reference_on_random_blocks() {
        let mut seed = 40;
        for rows in [1, 3, 4, 5, 17] {
            for cols in [256, 512, 1024, 2048] {
                seed += 1;
                let w = random_q4_k(rows, cols, seed);
                check(GgmlType::Q4_K, &w, rows, cols, seed);
            }
        }
    }

    #[test]
    fn extreme_scales_and_quants() {
        // Every scale, min and quant at its largest (all bits set), then all zero.
        for byte in [0xFF, 0x00] {
            let mut w = Vec::new();
            for _ in 0..5 * 2 {
                w.extend_from_slice(&half::f16::from_f32(0.01).to_le_bytes());
                w.extend_from_slice(&half::f16::from_f32(0.02).to_le_bytes());
                w.extend(std::iter::repeat_n(byte, BLOCK - 4));
            }
            check(GgmlType::Q4_K, &w, 5, 512, 7);
        }
    }

    #[test]
    fn no_columns_give_zeros() {
        let mut out = vec![f32::NAN; 3];
        gemv_rows(&mut out, &[], &[]);
        assert_eq!(out, [0.0; 3]);
    }
}

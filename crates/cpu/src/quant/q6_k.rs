//! Q6_K: super-blocks of 256 weights in 16 sub-blocks of 16, each with an int8 scale.
//!
//! # Block layout (`block_q6_K` in ggml-common.h, 210 bytes)
//!
//! | bytes    | field            | meaning                                  |
//! | -------- | ---------------- | ---------------------------------------- |
//! | 0..128   | `ql[128]`        | low 4 bits of the 256 quants             |
//! | 128..192 | `qh[64]`         | high 2 bits of the quants, four per byte |
//! | 192..208 | `scales: [i8; 16]` | one scale per 16 consecutive weights   |
//! | 208..210 | `d: f16`         | super-block scale (last!)                |
//!
//! In half h (weights 128h..128h + 128), weight 128h + 32t + l (t = 0..4, l = 0..32) has its
//! low 4 bits in `ql[64h + l + 32(t & 1)]` (the low nibble for t < 2, the high one for t ≥ 2)
//! and its high 2 bits in bits 2t..2t + 2 of `qh[32h + l]`; it is `d·scales[8h + 2t + l/16]·(q −
//! 32)` (ggml-quants.c `dequantize_row_q6_K`).
//!
//! # The kernel
//!
//! Sixteen consecutive weights share one scale, which is exactly one 16-lane AVX-512 vector
//! (two AVX2 vectors), so each vector of products is scaled once, by `d·scale`, into the row's
//! accumulator; x stays f32 (it is never quantized). AVX-512 first assembles a half block's
//! 128 quants as bytes with a few 512-bit bitwise operations (nibbles of `ql` and bit pairs of
//! `qh` brought into place by whole-register shifts and merged by `vpternlogd`), stored as
//! `4·(q − 32)` (the 6-bit quant shifted to the top of the byte with its sign bit flipped), then
//! sign-extends 16 of them at a time to 32-bit lanes, converts and multiplies with x; the 1/4
//! is folded into the scale (exact). AVX2 does the same with 256-bit byte operations (no
//! `vpternlogd`: `and`/`or`, then a byte subtraction of 32), 8 lanes at a time.
//! Four rows go per pass so each load of x serves all four, and blocks are prefetched ~16 KiB
//! ahead. AVX-512 and AVX2 + FMA are chosen at run time ([`crate::simd::isa`]); the scalar
//! level is the reference.

use super::BlockFormat;
#[cfg(target_arch = "x86_64")]
use super::prefetch;
use kvlab_model::GgmlType;
#[cfg(target_arch = "x86_64")]
use std::arch::x86_64::*;

/// Weights per super-block.
const QK: usize = 256;
/// Bytes per super-block.
const BLOCK: usize = 210;

/// out (rows,) = W (rows, cols) @ x (cols,) for W's rows stored as Q6_K.
///
/// # Panics
/// If `x.len()` is not a whole number of super-blocks or `w` is not `out.len()` such rows.
pub fn gemv_rows(out: &mut [f32], w: &[u8], x: &[f32]) {
    super::gemv_blocks::<Q6K>(out, w, x);
}

/// The Q6_K kernels, for [`super::gemv_blocks`].
struct Q6K;

// SAFETY: the kernels enable AVX-512F, AVX2, FMA and F16C (AVX-512) and AVX2, FMA and F16C
// (AVX2): has_avx512 tests all four, the default has_avx2 (with AVX2_F16C) the three.
unsafe impl BlockFormat for Q6K {
    const TYPE: GgmlType = GgmlType::Q6_K;
    const BLOCK: usize = QK;
    const BLOCK_BYTES: usize = BLOCK;
    #[cfg(target_arch = "x86_64")]
    const AVX2_F16C: bool = true;
    #[cfg(target_arch = "x86_64")]
    type Shared = ();

    #[cfg(target_arch = "x86_64")]
    fn shared(_: crate::simd::Isa, _: &[f32]) {}

    #[cfg(target_arch = "x86_64")]
    fn has_avx512() -> bool {
        is_x86_feature_detected!("avx512f") && Self::has_avx2()
    }

    /// N rows (`w` is N rows of `rb` bytes) dotted with x.
    ///
    /// # Safety
    /// As [`super::BlockFormat::rows_avx512`]; `w.len() == N * rb` and `rb == x.len() / 256 * 210`.
    #[cfg(target_arch = "x86_64")]
    #[target_feature(enable = "avx512f,avx2,fma,f16c")]
    #[inline]
    unsafe fn rows_avx512<const N: usize>(out: &mut [f32], w: &[u8], x: &[f32], _: &Self::Shared) {
        let rb = x.len() / QK * BLOCK;
        debug_assert!(w.len() == N * rb && out.len() == N);
        let (pw, px) = (w.as_ptr(), x.as_ptr());
        let lo_nibble = _mm512_set1_epi8(0x0F);
        let (keep, flip) = (
            _mm512_set1_epi8(0xFCu8 as i8),
            _mm512_set1_epi8(0x80u8 as i8),
        );
        // qh broadcast to both 256-bit halves; per 64-bit lane, the shift that brings the high
        // bits of t = 0 | 1 (resp. t = 2 | 3) to bits 4..6 of each byte.
        let (shl, shr) = (
            _mm512_set_epi64(2, 2, 2, 2, 4, 4, 4, 4),
            _mm512_set_epi64(2, 2, 2, 2, 0, 0, 0, 0),
        );
        let mut acc = [_mm512_setzero_ps(); N];
        let mut scl = [[0.0f32; 16]; N];
        let mut q8 = [[0u8; 128]; N];
        let pf = super::prefetch_distance(N * rb);
        for sb in 0..x.len() / QK {
            // SAFETY: (every raw access below) block `sb` of row q is the 210 bytes from
            // q·rb + 210·sb, inside `w`; the loads read ql[64h..64h + 64], qh[32h..32h + 32]
            // and the scales at 192..208 of it; x[256·sb..256·sb + 256] is inside x; each
            // row's q8 is 128 bytes and scl[q] 16 floats.
            for q in 0..N {
                prefetch(pw.wrapping_add(pf + q * rb + sb * BLOCK), BLOCK);
                let b = &w[q * rb + sb * BLOCK..][..BLOCK];
                // d·scale / 4: the quants below come out as 4·(q − 32).
                let d = _mm512_mul_ps(_mm512_broadcastss_ps(block_d(b)), _mm512_set1_ps(0.25));
                // SAFETY: the 16 scale bytes at 192..208 of block b (210 bytes) are inside it.
                let sc = unsafe { _mm_loadu_si128(b.as_ptr().add(192).cast()) };
                let s = _mm512_mul_ps(_mm512_cvtepi32_ps(_mm512_cvtepi8_epi32(sc)), d);
                // SAFETY: scl[q] holds 16 floats.
                unsafe { _mm512_storeu_ps(scl[q].as_mut_ptr(), s) };
            }
            for h in 0..2 {
                // Each row's 128 quants of this half as bytes 4·(q − 32), in weight order: the
                // 64 bytes of ql hold the low nibbles of t = 0, 1 (low nibble, l = 0..32 each)
                // and of t = 2, 3 (high nibble), qh their 2 high bits. Shifts of whole 64-bit
                // lanes carry bits across bytes; the masks drop them.
                for (q, q8) in q8.iter_mut().enumerate() {
                    // SAFETY: row q's block sb, 210 bytes from q·rb + 210·sb, is inside w.
                    let bp = unsafe { pw.add(q * rb + sb * BLOCK) };
                    // SAFETY: ql[64h..64h + 64] of the block (h < 2) is inside it.
                    let ql = unsafe { _mm512_loadu_si512(bp.add(64 * h).cast()) };
                    // SAFETY: qh[32h..32h + 32], bytes 128 + 32h.. of the block, is inside it.
                    let qh = unsafe {
                        _mm512_broadcast_i64x4(_mm256_loadu_si256(bp.add(128 + 32 * h).cast()))
                    };
                    let halves = [
                        (ql, _mm512_sllv_epi64(qh, shl)),
                        (_mm512_srli_epi64::<4>(ql), _mm512_srlv_epi64(qh, shr)),
                    ];
                    for (k, (l4, h2)) in halves.into_iter().enumerate() {
                        // Bits 0..4 from the nibble, 4..6 the high bits (6..8 junk): (A & C) |
                        // (B & !C) = (0xF0 & 0xAA) | (0xCC & 0x55) = 0xE4.
                        let q6 = _mm512_ternarylogic_epi32::<0xE4>(l4, h2, lo_nibble);
                        // q << 2 with bit 7 (q's bit 5) flipped: the byte, read as i8, is
                        // 4·(q − 32). (A & B) ^ C = (0xF0 & 0xCC) ^ 0xAA = 0x6A.
                        let v = _mm512_ternarylogic_epi32::<0x6A>(
                            _mm512_slli_epi64::<2>(q6),
                            keep,
                            flip,
                        );
                        // SAFETY: q8 is 128 bytes: 64k + 64 ≤ 128 (k < 2).
                        unsafe { _mm512_storeu_si512(q8.as_mut_ptr().add(64 * k).cast(), v) };
                    }
                }
                for k in 0..8 {
                    // Weights 128h + 16k .. +16: one sub-block, one scale.
                    // SAFETY: x[256·sb + 128h + 16k..][..16] is inside x (h < 2, k < 8).
                    let xv = unsafe { _mm512_loadu_ps(px.add(QK * sb + 128 * h + 16 * k)) };
                    for q in 0..N {
                        // SAFETY: q8[q] is 128 bytes: 16k + 16 ≤ 128 (k < 8).
                        let v = unsafe { _mm_loadu_si128(q8[q].as_ptr().add(16 * k).cast()) };
                        let p = _mm512_mul_ps(_mm512_cvtepi32_ps(_mm512_cvtepi8_epi32(v)), xv);
                        let s = _mm512_set1_ps(scl[q][8 * h + k]);
                        acc[q] = _mm512_fmadd_ps(p, s, acc[q]);
                    }
                }
            }
        }
        for (o, a) in out.iter_mut().zip(acc) {
            *o = _mm512_reduce_add_ps(a);
        }
    }

    /// [`Self::rows_avx512`] with 8 lanes (each sub-block of 16 is two vectors): the 128 quants of
    /// a half block are assembled as bytes `q − 32` with 256-bit byte operations.
    ///
    /// # Safety
    /// As [`Self::rows_avx512`], for AVX2 + FMA + F16C.
    #[cfg(target_arch = "x86_64")]
    #[target_feature(enable = "avx2,fma,f16c")]
    #[inline]
    unsafe fn rows_avx2<const N: usize>(out: &mut [f32], w: &[u8], x: &[f32], _: &Self::Shared) {
        let rb = x.len() / QK * BLOCK;
        debug_assert!(w.len() == N * rb && out.len() == N);
        let (pw, px) = (w.as_ptr(), x.as_ptr());
        let (m0f, m30) = (_mm256_set1_epi8(0x0F), _mm256_set1_epi8(0x30));
        let m32 = _mm256_set1_epi8(32);
        let mut acc = [_mm256_setzero_ps(); N];
        let mut scl = [[0.0f32; 16]; N];
        let mut q8 = [[0u8; 128]; N];
        let pf = super::prefetch_distance(N * rb);
        for sb in 0..x.len() / QK {
            // SAFETY: (every raw access below) block `sb` of row q is the 210 bytes from
            // q·rb + 210·sb, inside `w`; the loads read ql[64h..64h + 64], qh[32h..32h + 32]
            // and the scales at 192..208 of it; x[256·sb..256·sb + 256] is inside x; each
            // row's q8 is 128 bytes and scl[q] 16 floats.
            for q in 0..N {
                prefetch(pw.wrapping_add(pf + q * rb + sb * BLOCK), BLOCK);
                let b = &w[q * rb + sb * BLOCK..][..BLOCK];
                let d = _mm256_broadcastss_ps(block_d(b));
                // SAFETY: the 16 scale bytes at 192..208 of block b (210 bytes) are inside it.
                let sc = unsafe { _mm_loadu_si128(b.as_ptr().add(192).cast()) };
                let s0 = _mm256_mul_ps(_mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(sc)), d);
                let s1 = _mm256_mul_ps(
                    _mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(_mm_srli_si128::<8>(sc))),
                    d,
                );
                // SAFETY: scl[q] holds 16 floats: two stores of 8.
                unsafe {
                    _mm256_storeu_ps(scl[q].as_mut_ptr(), s0);
                    _mm256_storeu_ps(scl[q].as_mut_ptr().add(8), s1);
                }
            }
            for h in 0..2 {
                // Each row's 128 quants of this half as bytes q − 32, in weight order t = 0..4
                // (32 each). 16-bit shifts carry bits across bytes; the masks drop them.
                for (q, q8) in q8.iter_mut().enumerate() {
                    // SAFETY: row q's block sb, 210 bytes from q·rb + 210·sb, is inside w.
                    let bp = unsafe { pw.add(q * rb + sb * BLOCK) };
                    // SAFETY: ql[64h..64h + 64] and qh[32h..32h + 32] (bytes 128 + 32h..) of the block are inside it.
                    let (la, lb, qh) = unsafe {
                        (
                            _mm256_loadu_si256(bp.add(64 * h).cast()),
                            _mm256_loadu_si256(bp.add(64 * h + 32).cast()),
                            _mm256_loadu_si256(bp.add(128 + 32 * h).cast()),
                        )
                    };
                    let nib = |v| _mm256_and_si256(v, m0f);
                    let hi2 = |v| _mm256_and_si256(v, m30);
                    let q6 = [
                        (nib(la), hi2(_mm256_slli_epi16::<4>(qh))),
                        (nib(lb), hi2(_mm256_slli_epi16::<2>(qh))),
                        (nib(_mm256_srli_epi16::<4>(la)), hi2(qh)),
                        (
                            nib(_mm256_srli_epi16::<4>(lb)),
                            hi2(_mm256_srli_epi16::<2>(qh)),
                        ),
                    ];
                    for (t, (l4, h2)) in q6.into_iter().enumerate() {
                        let v = _mm256_sub_epi8(_mm256_or_si256(l4, h2), m32);
                        // SAFETY: q8 is 128 bytes: 32t + 32 ≤ 128 (t < 4).
                        unsafe { _mm256_storeu_si256(q8.as_mut_ptr().add(32 * t).cast(), v) };
                    }
                }
                for k in 0..16 {
                    // Weights 128h + 8k .. +8, of sub-block 8h + k/2.
                    // SAFETY: x[256·sb + 128h + 8k..][..8] is inside x (h < 2, k < 16).
                    let xv = unsafe { _mm256_loadu_ps(px.add(QK * sb + 128 * h + 8 * k)) };
                    for q in 0..N {
                        // SAFETY: q8[q] is 128 bytes: 8k + 8 ≤ 128 (k < 16).
                        let v = unsafe { _mm_loadl_epi64(q8[q].as_ptr().add(8 * k).cast()) };
                        let p = _mm256_mul_ps(_mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(v)), xv);
                        let s = _mm256_set1_ps(scl[q][8 * h + k / 2]);
                        acc[q] = _mm256_fmadd_ps(p, s, acc[q]);
                    }
                }
            }
        }
        for (o, a) in out.iter_mut().zip(acc) {
            *o = super::hsum256(a);
        }
    }
}

/// `d` of a block (the f16 in its last two bytes) as f32.
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2,f16c")]
#[inline]
fn block_d(b: &[u8]) -> __m128 {
    _mm_cvtph_ps(_mm_cvtsi32_si128(i32::from(u16::from_le_bytes([
        b[208], b[209],
    ]))))
}

#[cfg(test)]
mod tests {
    use super::super::testing::{check, f16_bytes, rng};
    use super::*;
    use rand::Rng;

    /// `rows × cols` of random valid Q6_K blocks: every quant and int8 scale random, d in a
    /// typical range.
    fn random_q6_k(rows: usize, cols: usize, seed: u64) -> Vec<u8> {
        let mut r = rng(seed);
        let mut w = Vec::with_capacity(rows * cols / QK * BLOCK);
        for _ in 0..rows * cols / QK {
            w.extend((0..BLOCK - 2).map(|_| r.random::<u8>()));
            w.extend_from_slice(&f16_bytes(&mut r, 1e-4, 2e-3));
        }
        w
    }

    #[test]
    fn matches_the_reference_on_random_blocks() {
        let mut seed = 60;
        for rows in [1, 3, 4, 5, 17] {
            for cols in [256, 512, 1024, 2048] {
                seed += 1;
                let w = random_q6_k(rows, cols, seed);
                check(GgmlType::Q6_K, &w, rows, cols, seed);
            }
        }
    }

    #[test]
    fn extreme_scales_and_quants() {
        // All bits set (quants 63, scales −1), 0x80 (scales −128, quants 8 + 32·2 = 40 and
        // 32), and all zero (quants 0: x·(−32)).
        for byte in [0xFF, 0x80, 0x00] {
            let mut w = Vec::new();
            for _ in 0..5 * 2 {
                w.extend(std::iter::repeat_n(byte, BLOCK - 2));
                w.extend_from_slice(&half::f16::from_f32(0.001).to_le_bytes());
            }
            check(GgmlType::Q6_K, &w, 5, 512, 9);
        }
    }

    #[test]
    fn no_columns_give_zeros() {
        let mut out = vec![f32::NAN; 3];
        gemv_rows(&mut out, &[], &[]);
        assert_eq!(out, [0.0; 3]);
    }
}

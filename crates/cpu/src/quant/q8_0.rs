//! Q8_0: blocks of 32 weights, an f16 scale `d` and 32 int8 quants; weight j = d·qs\[j\].
//!
//! Layout (`block_q8_0` in ggml's ggml-common.h, 34 bytes, no padding):
//!
//! ```text
//! offset 0  d      f16, little-endian
//! offset 2  qs[32] i8, weight j = d · qs[j]
//! ```
//!
//! The kernel: `block32.rs`'s loop (four rows per pass, x loaded once per block, the scale
//! `d` from a table, a software prefetch), with this block's Σ q·x: the 32 int8 quants widened
//! to i32 lanes (`vpmovsxbd`), converted to f32 and multiplied into x lane by lane, 16 at a time
//! with AVX-512, 8 with AVX2.

use super::block32::Block32;
use kvlab_model::GgmlType;
#[cfg(target_arch = "x86_64")]
use std::arch::x86_64::*;

/// Bytes per block: d (2) + qs (32).
const BLOCK_BYTES: usize = 34;

/// out (rows,) = W (rows, cols) @ x (cols,) for W's rows stored as Q8_0.
///
/// # Panics
/// If `x.len()` is not whole blocks or `w` is not `out.len()` rows of them.
pub fn gemv_rows(out: &mut [f32], w: &[u8], x: &[f32]) {
    super::gemv_blocks::<Q8_0>(out, w, x);
}

/// The Q8_0 block, for [`Block32`]'s loop.
struct Q8_0;

// SAFETY: dot_avx512 enables AVX-512F only, dot_avx2 AVX2 and FMA only.
unsafe impl Block32 for Q8_0 {
    const TYPE: GgmlType = GgmlType::Q8_0;
    const BLOCK_BYTES: usize = BLOCK_BYTES;

    #[cfg(target_arch = "x86_64")]
    #[inline]
    #[target_feature(enable = "avx512f")]
    unsafe fn dot_avx512(blk: *const u8, x0: __m512, x1: __m512) -> __m512 {
        // SAFETY: qs[32] is bytes 2..34 of the block, readable (the caller's contract).
        let (q0, q1) = unsafe {
            (
                _mm_loadu_si128(blk.add(2).cast()),
                _mm_loadu_si128(blk.add(18).cast()),
            )
        };
        let q0 = _mm512_cvtepi32_ps(_mm512_cvtepi8_epi32(q0));
        let q1 = _mm512_cvtepi32_ps(_mm512_cvtepi8_epi32(q1));
        _mm512_fmadd_ps(q1, x1, _mm512_mul_ps(q0, x0))
    }

    /// Four widenings of 8 quants.
    #[cfg(target_arch = "x86_64")]
    #[inline]
    #[target_feature(enable = "avx2,fma")]
    unsafe fn dot_avx2(blk: *const u8, x: &[__m256; 4]) -> __m256 {
        let q = |k: usize| {
            // SAFETY: each 8-byte load lies within the block's qs[32] (bytes 2..34).
            let v = unsafe { _mm_loadl_epi64(blk.add(2 + 8 * k).cast()) };
            _mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(v))
        };
        let s0 = _mm256_fmadd_ps(q(1), x[1], _mm256_mul_ps(q(0), x[0]));
        let s1 = _mm256_fmadd_ps(q(3), x[3], _mm256_mul_ps(q(2), x[2]));
        _mm256_add_ps(s0, s1)
    }
}

#[cfg(test)]
mod tests {
    use super::super::block32::BLOCK;
    use super::super::testing;
    use super::*;
    use rand::Rng;

    /// `rows × cols` of random valid Q8_0 blocks: scales of either sign, any quant (−128 too).
    fn random_q8_0(rows: usize, cols: usize, seed: u64) -> Vec<u8> {
        let mut rng = testing::rng(seed);
        let mut w = Vec::with_capacity(rows * cols / BLOCK * BLOCK_BYTES);
        for _ in 0..rows * cols / BLOCK {
            let d = if rng.random_bool(0.5) {
                testing::f16_bytes(&mut rng, 1e-4, 0.05)
            } else {
                testing::f16_bytes(&mut rng, -0.05, -1e-4)
            };
            w.extend_from_slice(&d);
            w.extend((0..BLOCK).map(|_| rng.random::<u8>()));
        }
        w
    }

    #[test]
    fn matches_reference_on_random_blocks() {
        for (i, &rows) in [1, 3, 4, 5, 17].iter().enumerate() {
            for (j, &cols) in [32, 64, 640, 2048].iter().enumerate() {
                let seed = (10 * i + j) as u64;
                let w = random_q8_0(rows, cols, seed);
                testing::check(GgmlType::Q8_0, &w, rows, cols, seed + 1000);
            }
        }
    }

    #[test]
    fn no_rows_or_no_columns_is_fine() {
        let mut out: [f32; 0] = [];
        gemv_rows(&mut out, &[], &[0.0; 64]);
        let mut out = [f32::NAN; 3];
        gemv_rows(&mut out, &[], &[]);
        assert_eq!(out, [0.0; 3]);
    }
}

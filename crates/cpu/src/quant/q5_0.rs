//! Q5_0: blocks of 32 weights, an f16 scale `d`, 32 high bits and 32 low nibbles; weight j =
//! d·(q_j − 16) with the 5-bit q_j = nibble_j | (bit j of qh) << 4.
//!
//! Layout (`block_q5_0` in ggml's ggml-common.h, 22 bytes, no padding):
//!
//! ```text
//! offset 0  d       f16, little-endian
//! offset 2  qh[4]   u32, little-endian: bit j is the 5th bit of weight j
//! offset 6  qs[16]  the low nibble of qs[i] is weight i's low 4 bits, the high nibble weight i + 16's
//! ```
//!
//! The kernel: `block32.rs`'s loop (four rows per pass, x loaded once per block, the scale
//! `d` from a table, a software prefetch), with this block's Σ (q − 16)·x, the quants decoded as
//! i32 lanes q − 16, converted to f32 and multiplied into x lane by lane.
//! The decode, AVX-512: widen the 16 bytes of `qs` to i32 lanes once; `& 15` gives weights
//! 0..16 and `>> 4` weights 16..32; a masked OR of 0xFFFF_FFF0 (that is, − 16), with the
//! complement of `qh`'s low and high halves as the lane masks, finishes q − 16. AVX2: ggml's
//! `bytes_from_bits_32` spreads `qh` to one byte mask per weight, and OR-ing 0xF0 into the
//! nibbles whose bit is clear gives q − 16 as signed bytes, widened 8 at a time.

use super::block32::Block32;
use kvlab_model::GgmlType;
#[cfg(target_arch = "x86_64")]
use std::arch::x86_64::*;

/// Bytes per block: d (2) + qh (4) + qs (16).
const BLOCK_BYTES: usize = 22;

/// out (rows,) = W (rows, cols) @ x (cols,) for W's rows stored as Q5_0.
///
/// # Panics
/// If `x.len()` is not whole blocks or `w` is not `out.len()` rows of them.
pub fn gemv_rows(out: &mut [f32], w: &[u8], x: &[f32]) {
    super::gemv_blocks::<Q5_0>(out, w, x);
}

/// The Q5_0 block, for [`Block32`]'s loop.
struct Q5_0;

// SAFETY: dot_avx512 enables AVX-512F only, dot_avx2 AVX2 and FMA only.
unsafe impl Block32 for Q5_0 {
    const TYPE: GgmlType = GgmlType::Q5_0;
    const BLOCK_BYTES: usize = BLOCK_BYTES;

    #[cfg(target_arch = "x86_64")]
    #[inline]
    #[target_feature(enable = "avx512f")]
    unsafe fn dot_avx512(blk: *const u8, x0: __m512, x1: __m512) -> __m512 {
        let low4 = _mm512_set1_epi32(0x0F);
        let minus16 = _mm512_set1_epi32(-16);
        // SAFETY: qh is bytes 2..6 of the block and qs bytes 6..22, readable (the caller's
        // contract).
        let (qh, qs) = unsafe {
            (
                blk.add(2).cast::<u32>().read_unaligned(),
                _mm_loadu_si128(blk.add(6).cast()),
            )
        };
        let v = _mm512_cvtepu8_epi32(qs);
        let lo = _mm512_and_si512(v, low4);
        let hi = _mm512_srli_epi32::<4>(v);
        // nibble − 16 (= nibble | !15) where the 5th bit is clear, and nibble where it is set
        // (q = nibble + 16 there): q − 16 either way.
        let lo = _mm512_mask_or_epi32(lo, !qh as u16, lo, minus16);
        let hi = _mm512_mask_or_epi32(hi, !(qh >> 16) as u16, hi, minus16);
        _mm512_fmadd_ps(
            _mm512_cvtepi32_ps(hi),
            x1,
            _mm512_mul_ps(_mm512_cvtepi32_ps(lo), x0),
        )
    }

    /// The 32 quants built as signed bytes q − 16 in one 256-bit register (ggml's
    /// `bytes_from_bits_32` for the 5th bits), then widened 8 at a time.
    #[cfg(target_arch = "x86_64")]
    #[inline]
    #[target_feature(enable = "avx2,fma")]
    unsafe fn dot_avx2(blk: *const u8, x: &[__m256; 4]) -> __m256 {
        let low4 = _mm256_set1_epi8(0x0F);
        let high4 = _mm256_set1_epi8(0xF0u8 as i8);
        // Byte j of the broadcast qh gets byte j / 8 of qh; OR-ing every bit but bit j % 8 then
        // comparing with all-ones leaves 0xFF exactly where bit j of qh is set.
        let spread = _mm256_setr_epi8(
            0, 0, 0, 0, 0, 0, 0, 0, 1, 1, 1, 1, 1, 1, 1, 1, //
            2, 2, 2, 2, 2, 2, 2, 2, 3, 3, 3, 3, 3, 3, 3, 3,
        );
        let others = _mm256_set1_epi64x(0x7fbf_dfef_f7fb_fdfe);
        let ones = _mm256_set1_epi64x(-1);
        // SAFETY: as in dot_avx512.
        let (qh, qs) = unsafe {
            (
                blk.add(2).cast::<i32>().read_unaligned(),
                _mm_loadu_si128(blk.add(6).cast()),
            )
        };
        let nib = _mm256_and_si256(_mm256_set_m128i(_mm_srli_epi16::<4>(qs), qs), low4);
        let bits = _mm256_or_si256(_mm256_shuffle_epi8(_mm256_set1_epi32(qh), spread), others);
        let set = _mm256_cmpeq_epi8(bits, ones);
        // Signed bytes q − 16: the nibble where the 5th bit is set, nibble | 0xF0 where not.
        let q = _mm256_or_si256(nib, _mm256_andnot_si256(set, high4));
        let (q01, q23) = (_mm256_castsi256_si128(q), _mm256_extracti128_si256::<1>(q));
        let f = |v: __m128i| _mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(v));
        let s0 = _mm256_fmadd_ps(
            f(_mm_unpackhi_epi64(q01, q01)),
            x[1],
            _mm256_mul_ps(f(q01), x[0]),
        );
        let s1 = _mm256_fmadd_ps(
            f(_mm_unpackhi_epi64(q23, q23)),
            x[3],
            _mm256_mul_ps(f(q23), x[2]),
        );
        _mm256_add_ps(s0, s1)
    }
}

#[cfg(test)]
mod tests {
    use super::super::block32::BLOCK;
    use super::super::testing;
    use super::*;
    use rand::Rng;

    /// `rows × cols` of random valid Q5_0 blocks: scales of either sign, any qh and nibbles.
    fn random_q5_0(rows: usize, cols: usize, seed: u64) -> Vec<u8> {
        let mut rng = testing::rng(seed);
        let mut w = Vec::with_capacity(rows * cols / BLOCK * BLOCK_BYTES);
        for _ in 0..rows * cols / BLOCK {
            let d = if rng.random_bool(0.5) {
                testing::f16_bytes(&mut rng, 1e-4, 0.05)
            } else {
                testing::f16_bytes(&mut rng, -0.05, -1e-4)
            };
            w.extend_from_slice(&d);
            w.extend((0..BLOCK_BYTES - 2).map(|_| rng.random::<u8>()));
        }
        w
    }

    #[test]
    fn matches_reference_on_random_blocks() {
        for (i, &rows) in [1, 3, 4, 5, 17].iter().enumerate() {
            for (j, &cols) in [32, 64, 640, 2048].iter().enumerate() {
                let seed = (10 * i + j) as u64;
                let w = random_q5_0(rows, cols, seed);
                testing::check(GgmlType::Q5_0, &w, rows, cols, seed + 2000);
            }
        }
    }

    /// Every 5-bit quant in every lane: qh all ones, all zeros and alternating, against all
    /// nibble patterns (random blocks hit these only by chance).
    #[test]
    fn every_quant_in_every_lane() {
        let mut w = Vec::new();
        let mut rows = 0;
        for qh in [
            0u32,
            u32::MAX,
            0x5555_5555,
            0xAAAA_AAAA,
            0x0000_FFFF,
            0xFFFF_0000,
        ] {
            for nib in 0..16u8 {
                for _ in 0..2 {
                    w.extend_from_slice(&half::f16::from_f32(0.03125).to_le_bytes());
                    w.extend_from_slice(&qh.to_le_bytes());
                    w.extend((0..16u8).map(|i| ((i + nib) & 15) | (((i + 3 * nib) & 15) << 4)));
                }
                rows += 1;
            }
        }
        testing::check(GgmlType::Q5_0, &w, rows, 64, 7);
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

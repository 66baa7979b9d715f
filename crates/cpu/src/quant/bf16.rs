//! bfloat16 weights: each element is a little-endian u16 holding the top 16 bits of an f32 (sign,
//! the same 8-bit exponent, 7 bits of mantissa), so decoding is exact: `f32::from_bits(b << 16)`.
//!
//! Layout (GGUF `BF16`, ggml's `ggml_bf16_t`): a row of `cols` elements is `2·cols` bytes, no
//! blocks, no scales.
//!
//! The kernel ([`gemv_rows`]): four rows per pass share each load of x, and x stays in f32.
//!
//! * AVX-512F, 32 columns per step: one 512-bit load brings 32 bf16 of a row, two per 32-bit
//!   lane (element 2j in the low half, 2j+1 in the high half, little-endian). Shifting each lane
//!   left by 16 (`vpslld`) makes the even elements f32s; masking off the low half (`vpandd`) makes
//!   the odd ones f32s, with no widening shuffle. x's 32 floats are split once per step into its
//!   even and odd halves (two `vpermt2ps`, shared by the four rows), and each row's two f32
//!   vectors go into two accumulators by FMA: 8 independent accumulators for 4 rows.
//! * AVX2 + FMA, 16 columns per step: two 128-bit loads of 8 bf16, each zero-extended to 32-bit
//!   lanes (`vpmovzxwd`) and shifted left by 16, then FMA with x's 8 floats.
//!
//! While it reads a group's columns it prefetches the same columns of the next group
//! (`crate::quant::prefetch`).
//!
//! A row's last `cols mod 32` (16) columns are copied into zero-padded buffers, x's too, and run
//! through the same step: zero weights times zero activations add nothing, and a NaN in x's tail
//! still reaches the sum. One horizontal sum per row at the end; rows left over (rows mod 4) go
//! one at a time. The result differs from "decode the row, then dot" only in the order of the
//! additions. Without AVX2 the plain reference runs.
//!
//! Tried and left out: AVX-512 BF16's `vdpbf16ps` (32 bf16 products per instruction, no
//! conversion). It needs x rounded to bf16 too (a relative error up to 2⁻⁹ per activation: on
//! random rows 2.6–4.5·10⁻⁴ of Σ|wᵢxᵢ| against the f32-activation reference, where this kernel
//! stays at 1–2·10⁻⁷), and on a Xeon with AVX-512 BF16, one thread, it was 15–20% faster only
//! on matrices already hot in L2 (768×288, 1376×512) and 20–25% slower on the ones streamed
//! from memory (the 32000-row classifiers), which is where a decode step reads most of its bytes. The conversion here
//! costs two single-cycle integer operations per 32 weights; the loads dominate either way.

use super::BlockFormat;
use kvlab_model::GgmlType;
#[cfg(target_arch = "x86_64")]
use std::arch::x86_64::*;

/// out (rows,) = W (rows, cols) @ x (cols,) for W's rows stored as BF16, x kept in f32.
///
/// # Panics
/// If `w` is not `out.len()` rows of `2·x.len()` bytes.
pub fn gemv_rows(out: &mut [f32], w: &[u8], x: &[f32]) {
    super::gemv_blocks::<Bf16>(out, w, x);
}

/// The BF16 kernels, for [`super::gemv_blocks`]: a block is one element of two bytes.
struct Bf16;

// SAFETY: the default feature checks test what the kernels enable: AVX-512F; AVX2 and FMA.
unsafe impl BlockFormat for Bf16 {
    const TYPE: GgmlType = GgmlType::BF16;
    const BLOCK: usize = 1;
    const BLOCK_BYTES: usize = 2;
    two_byte_kernels!(avx2 = "avx2,fma");
}

/// One step of 32 columns: `px` points at 32 floats of x, `pw[q]` at 32 bf16 of row q.
///
/// # Safety
/// AVX-512F; 32 floats readable at `px`, 64 bytes at every `pw[q]`.
#[cfg(target_arch = "x86_64")]
#[inline]
#[target_feature(enable = "avx512f")]
unsafe fn step_avx512<const N: usize>(
    acc: &mut [[__m512; 2]; N],
    pw: [*const u8; N],
    px: *const f32,
) {
    let even = _mm512_setr_epi32(0, 2, 4, 6, 8, 10, 12, 14, 16, 18, 20, 22, 24, 26, 28, 30);
    let odd = _mm512_setr_epi32(1, 3, 5, 7, 9, 11, 13, 15, 17, 19, 21, 23, 25, 27, 29, 31);
    let hi = _mm512_set1_epi32(0xFFFF_0000u32 as i32);
    // SAFETY: the caller guarantees 32 floats at px.
    let (a, b) = unsafe { (_mm512_loadu_ps(px), _mm512_loadu_ps(px.add(16))) };
    let (xe, xo) = (
        _mm512_permutex2var_ps(a, even, b),
        _mm512_permutex2var_ps(a, odd, b),
    );
    for q in 0..N {
        // SAFETY: the caller guarantees 64 bytes at pw[q].
        let v = unsafe { _mm512_loadu_si512(pw[q].cast::<__m512i>()) };
        let we = _mm512_castsi512_ps(_mm512_slli_epi32::<16>(v));
        let wo = _mm512_castsi512_ps(_mm512_and_si512(v, hi));
        acc[q][0] = _mm512_fmadd_ps(we, xe, acc[q][0]);
        acc[q][1] = _mm512_fmadd_ps(wo, xo, acc[q][1]);
    }
}

/// One step of 16 columns: `px` points at 16 floats of x, `pw[q]` at 16 bf16 of row q.
///
/// # Safety
/// AVX2 + FMA; 16 floats readable at `px`, 32 bytes at every `pw[q]`.
#[cfg(target_arch = "x86_64")]
#[inline]
#[target_feature(enable = "avx2,fma")]
unsafe fn step_avx2<const N: usize>(
    acc: &mut [[__m256; 2]; N],
    pw: [*const u8; N],
    px: *const f32,
) {
    // SAFETY: the caller guarantees 16 floats at px.
    let xv = unsafe { [_mm256_loadu_ps(px), _mm256_loadu_ps(px.add(8))] };
    for q in 0..N {
        for (k, &xk) in xv.iter().enumerate() {
            // SAFETY: the caller guarantees 32 bytes at pw[q]; this reads bytes 16k..16k+16.
            let h = unsafe { _mm_loadu_si128(pw[q].add(16 * k).cast::<__m128i>()) };
            let wv = _mm256_castsi256_ps(_mm256_slli_epi32::<16>(_mm256_cvtepu16_epi32(h)));
            acc[q][k] = _mm256_fmadd_ps(wv, xk, acc[q][k]);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::quant::testing::{check, rng};
    use rand::Rng;

    const ROWS: [usize; 5] = [1, 3, 4, 5, 17];
    const COLS: [usize; 6] = [1, 7, 16, 33, 288, 768];

    fn random_w(rows: usize, cols: usize, seed: u64) -> Vec<u8> {
        let mut r = rng(seed);
        (0..rows * cols)
            .flat_map(|_| half::bf16::from_f32(r.random_range(-2.0..2.0)).to_le_bytes())
            .collect()
    }

    #[test]
    fn no_rows_or_no_columns() {
        gemv_rows(&mut [], &[], &[1.0; 5]);
        let mut out = [f32::NAN; 3];
        gemv_rows(&mut out, &[], &[]);
        assert_eq!(out, [0.0; 3]);
    }

    #[test]
    fn kernel_matches_the_reference_on_random_rows() {
        for (k, rows) in ROWS.into_iter().enumerate() {
            for (j, cols) in COLS.into_iter().enumerate() {
                let seed = (k * 16 + j) as u64;
                check(
                    GgmlType::BF16,
                    &random_w(rows, cols, seed),
                    rows,
                    cols,
                    seed + 100,
                );
            }
        }
    }
}

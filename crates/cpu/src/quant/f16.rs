//! IEEE 754 half-precision weights: each element is a little-endian u16 (1 sign bit, 5 exponent
//! bits, 10 mantissa bits), which converts to f32 exactly (subnormals, infinities and NaNs
//! included).
//!
//! Layout (GGUF `F16`, ggml's `ggml_fp16_t`): a row of `cols` elements is `2·cols` bytes, no
//! blocks, no scales.
//!
//! The kernel ([`gemv_rows`]): four rows per pass share each load of x, and x stays in f32. The
//! conversion is one instruction per vector, `vcvtph2ps`:
//!
//! * AVX-512F, 32 columns per step: x's 32 floats in two vectors; for each of the four rows two
//!   256-bit loads of 16 halves, each widened to 16 f32 (`_mm512_cvtph_ps`) and added by FMA
//!   into one of the row's two accumulators (8 independent accumulators for 4 rows).
//! * AVX2 + FMA + F16C, 16 columns per step: the same with 128-bit loads of 8 halves
//!   (`_mm256_cvtph_ps`). F16C is checked at run time; without it (or without AVX2) the plain
//!   reference runs.
//!
//! While it reads a group's columns it prefetches the same columns of the next group
//! (`crate::quant::prefetch`).
//!
//! A row's last `cols mod 32` (16) columns are copied into zero-padded buffers, x's too, and run
//! through the same step: zero weights times zero activations add nothing, and a NaN in x's tail
//! still reaches the sum. One horizontal sum per row at the end; rows left over (rows mod 4) go
//! one at a time. The result differs from "decode the row, then dot" only in the order of the
//! additions.

use super::BlockFormat;
use kvlab_model::GgmlType;
#[cfg(target_arch = "x86_64")]
use std::arch::x86_64::*;

/// out (rows,) = W (rows, cols) @ x (cols,) for W's rows stored as F16, x kept in f32.
///
/// # Panics
/// If `w` is not `out.len()` rows of `2·x.len()` bytes.
pub fn gemv_rows(out: &mut [f32], w: &[u8], x: &[f32]) {
    super::gemv_blocks::<F16>(out, w, x);
}

/// The F16 kernels, for [`super::gemv_blocks`]: a block is one element of two bytes.
struct F16;

// SAFETY: the default feature checks test what the kernels enable: AVX-512F; AVX2, FMA and
// F16C (AVX2_F16C).
unsafe impl BlockFormat for F16 {
    const TYPE: GgmlType = GgmlType::F16;
    const BLOCK: usize = 1;
    const BLOCK_BYTES: usize = 2;
    #[cfg(target_arch = "x86_64")]
    const AVX2_F16C: bool = true;
    two_byte_kernels!(avx2 = "avx2,fma,f16c");
}

/// One step of 32 columns: `px` points at 32 floats of x, `pw[q]` at 32 halves of row q.
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
    // SAFETY: the caller guarantees 32 floats at px.
    let xv = unsafe { [_mm512_loadu_ps(px), _mm512_loadu_ps(px.add(16))] };
    for q in 0..N {
        for (k, &xk) in xv.iter().enumerate() {
            // SAFETY: the caller guarantees 64 bytes at pw[q]; this reads bytes 32k..32k+32.
            let h = unsafe { _mm256_loadu_si256(pw[q].add(32 * k).cast::<__m256i>()) };
            acc[q][k] = _mm512_fmadd_ps(_mm512_cvtph_ps(h), xk, acc[q][k]);
        }
    }
}

/// One step of 16 columns: `px` points at 16 floats of x, `pw[q]` at 16 halves of row q.
///
/// # Safety
/// AVX2 + FMA + F16C; 16 floats readable at `px`, 32 bytes at every `pw[q]`.
#[cfg(target_arch = "x86_64")]
#[inline]
#[target_feature(enable = "avx2,fma,f16c")]
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
            acc[q][k] = _mm256_fmadd_ps(_mm256_cvtph_ps(h), xk, acc[q][k]);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::quant::testing::{check, rng};
    use rand::Rng;

    #[test]
    fn no_rows_or_no_columns() {
        gemv_rows(&mut [], &[], &[1.0; 5]);
        let mut out = [f32::NAN; 3];
        gemv_rows(&mut out, &[], &[]);
        assert_eq!(out, [0.0; 3]);
    }

    #[test]
    fn kernel_matches_the_reference_on_random_rows() {
        for (k, rows) in [1, 3, 4, 5, 17].into_iter().enumerate() {
            for (j, cols) in [1, 7, 16, 33, 288, 768].into_iter().enumerate() {
                let seed = (k * 16 + j) as u64;
                let mut r = rng(seed);
                let w: Vec<u8> = (0..rows * cols)
                    .flat_map(|_| half::f16::from_f32(r.random_range(-2.0..2.0)).to_le_bytes())
                    .collect();
                check(GgmlType::F16, &w, rows, cols, seed + 100);
            }
        }
    }

    /// Subnormal, zero and the largest finite halves decode exactly in the kernel too.
    #[test]
    fn special_halves_decode_exactly() {
        let specials = [
            0x0001u16, 0x03FF, 0x8001, 0x0000, 0x8000, 0x7BFF, 0xFBFF, 0x3C00,
        ];
        let cols = 40;
        let w: Vec<u8> = (0..cols)
            .flat_map(|j| specials[j % specials.len()].to_le_bytes())
            .collect();
        for j in 0..cols {
            let mut x = vec![0.0f32; cols];
            x[j] = 1.0;
            let mut got = [f32::NAN];
            gemv_rows(&mut got, &w, &x);
            let want = half::f16::from_bits(specials[j % specials.len()]).to_f32();
            assert_eq!(got[0], want, "column {j}");
        }
    }
}

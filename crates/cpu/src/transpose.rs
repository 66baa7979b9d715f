//! Matrix transposes for the GEMM's operands ([`crate::linear`]): gemm works down columns, the
//! engine's activations are rows. 8 × 8 tiles are transposed in AVX registers (eight loads, 24
//! shuffles, eight stores), the ragged edges and CPUs without AVX2 by a plain loop, which is
//! also the reference of the tests.

use crate::simd::{Isa, isa};

/// dst[c·dst_stride + r] = src[r·src_stride + c] for r < rows, c < cols.
///
/// # Safety
/// `src` must be readable at every `r·src_stride + c` and `dst` writable at every
/// `c·dst_stride + r` for r < rows, c < cols, and no other thread may access those dst
/// elements during the call (callers write disjoint blocks of a shared buffer through it).
pub unsafe fn transpose(
    src: *const f32,
    src_stride: usize,
    dst: *mut f32,
    dst_stride: usize,
    rows: usize,
    cols: usize,
) {
    let (full_r, full_c) = (rows - rows % 8, cols - cols % 8);
    #[cfg(target_arch = "x86_64")]
    if matches!(isa(), Isa::Avx2Fma | Isa::Avx512) {
        for r0 in (0..full_r).step_by(8) {
            for c0 in (0..full_c).step_by(8) {
                // SAFETY: isa() found AVX2; the tile's rows r0..r0 + 8 and columns c0..c0 + 8
                // are inside the ranges the caller vouches for.
                unsafe {
                    x86::tile8(
                        src.add(r0 * src_stride + c0),
                        src_stride,
                        dst.add(c0 * dst_stride + r0),
                        dst_stride,
                    )
                };
            }
        }
        // SAFETY: the ragged edges, same ranges.
        unsafe {
            plain(src, src_stride, dst, dst_stride, 0..rows, full_c..cols);
            plain(src, src_stride, dst, dst_stride, full_r..rows, 0..full_c);
        }
        return;
    }
    // SAFETY: as the caller guarantees.
    unsafe { plain(src, src_stride, dst, dst_stride, 0..rows, 0..cols) };
}

/// The element-by-element transpose of the rows × cols block, 8 columns at a time.
///
/// # Safety
/// As [`transpose`], for these row and column ranges.
unsafe fn plain(
    src: *const f32,
    src_stride: usize,
    dst: *mut f32,
    dst_stride: usize,
    rows: std::ops::Range<usize>,
    cols: std::ops::Range<usize>,
) {
    for c0 in cols.clone().step_by(8) {
        for r in rows.clone() {
            for c in c0..(c0 + 8).min(cols.end) {
                // SAFETY: r < rows, c < cols, inside what the caller vouches for.
                unsafe { *dst.add(c * dst_stride + r) = *src.add(r * src_stride + c) };
            }
        }
    }
}

#[cfg(target_arch = "x86_64")]
mod x86 {
    use std::arch::x86_64::*;

    /// One 8 × 8 tile: the rows' pairs interleaved (unpack), then quadruples (shuffle), then
    /// the 128-bit halves exchanged (permute2f128): row r of the tile becomes column r.
    ///
    /// # Safety
    /// AVX2; 8 rows of 8 floats readable at src (`src_stride` apart) and writable at dst.
    #[inline]
    #[target_feature(enable = "avx2")]
    pub unsafe fn tile8(src: *const f32, src_stride: usize, dst: *mut f32, dst_stride: usize) {
        // SAFETY: the caller guarantees 8 readable rows of 8 floats.
        let r: [__m256; 8] =
            std::array::from_fn(|i| unsafe { _mm256_loadu_ps(src.add(i * src_stride)) });
        let t: [__m256; 8] = std::array::from_fn(|i| {
            let (a, b) = (r[i / 2 * 2], r[i / 2 * 2 + 1]);
            if i % 2 == 0 {
                _mm256_unpacklo_ps(a, b)
            } else {
                _mm256_unpackhi_ps(a, b)
            }
        });
        // s[4h + q]: quadruple q of rows 4h..4h + 4, [column q | column q + 4] of those rows.
        let s: [__m256; 8] = std::array::from_fn(|i| {
            let (h, q) = (i / 4, i % 4);
            let (a, b) = (t[4 * h + q / 2], t[4 * h + q / 2 + 2]);
            if q % 2 == 0 {
                _mm256_shuffle_ps::<0x44>(a, b)
            } else {
                _mm256_shuffle_ps::<0xEE>(a, b)
            }
        });
        for c in 0..8 {
            let (lo, hi) = (s[c % 4], s[4 + c % 4]);
            let col = if c < 4 {
                _mm256_permute2f128_ps::<0x20>(lo, hi)
            } else {
                _mm256_permute2f128_ps::<0x31>(lo, hi)
            };
            // SAFETY: the caller guarantees 8 writable rows of 8 floats at dst.
            unsafe { _mm256_storeu_ps(dst.add(c * dst_stride), col) };
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Against the definition, at every ragged shape and with strides wider than the block.
    #[test]
    fn transposes_every_shape() {
        for rows in [0, 1, 7, 8, 9, 16, 23, 102] {
            for cols in [0, 1, 5, 8, 15, 24, 37] {
                let (ss, ds) = (cols + 3, rows + 5);
                let src: Vec<f32> = (0..rows * ss).map(|i| i as f32).collect();
                let mut dst = vec![f32::NAN; cols * ds];
                // SAFETY: src holds rows × ss ≥ rows × cols, dst cols × ds ≥ cols × rows.
                unsafe { transpose(src.as_ptr(), ss, dst.as_mut_ptr(), ds, rows, cols) };
                for r in 0..rows {
                    for c in 0..cols {
                        assert_eq!(dst[c * ds + r], src[r * ss + c], "{rows}x{cols} at {r},{c}");
                    }
                }
                // Padding between the rows of dst is left alone.
                for c in 0..cols {
                    assert!(dst[c * ds + rows..(c + 1) * ds].iter().all(|v| v.is_nan()));
                }
            }
        }
    }
}

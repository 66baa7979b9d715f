//! Q8_0: blocks of 32 weights, an f16 scale `d` and 32 int8 quants; weight j = d·qs[j].
//!
//! Layout (`block_q8_0` in ggml's ggml-common.h, 34 bytes, no padding):
//!
//! ```text
//! offset 0  d      f16, little-endian
//! offset 2  qs[32] i8, weight j = d · qs[j]
//! ```
//!
//! The kernel: four rows per pass share each load of x. For each block it loads x's 32 floats
//! once (two 16-lane vectors with AVX-512, four 8-lane ones with AVX2); for each of the four
//! rows it widens the block's 32 int8 quants to i32 lanes (`vpmovsxbd`), converts them to f32,
//! multiplies them into x lane by lane (`Σ q·x` still as a vector, no horizontal add), and adds
//! that vector times the block's `d` (f16 → f32 by a load from a 64 Ki-entry table,
//! `quant::f16_table`) into the row's f32 accumulator. One horizontal sum per row at the end; rows
//! left over (rows mod 4) go one at a time. A software prefetch a few rows ahead keeps the loads
//! streaming (W is read once and is far larger than the caches). The activations never leave
//! f32: the result differs from "decode the row, then dot" only in the order of the additions.

use super::BlockFormat;
use kvlab_model::GgmlType;
#[cfg(target_arch = "x86_64")]
use std::arch::x86_64::*;

/// Weights per block.
const BLOCK: usize = 32;
/// Bytes per block: d (2) + qs (32).
const BLOCK_BYTES: usize = 34;
/// Prefetch distance, in rows: while reading a block of row r, ask for the same block of row
/// r + PF_ROWS (without it, the loop waits on memory for a large W: 31 ms → 20 ms for the
/// 262144 × 640 classifier).
#[cfg(target_arch = "x86_64")]
const PF_ROWS: usize = 4;

/// out (rows,) = W (rows, cols) @ x (cols,) for W's rows stored as Q8_0.
///
/// # Panics
/// If `x.len()` is not whole blocks or `w` is not `out.len()` rows of them.
pub fn gemv_rows(out: &mut [f32], w: &[u8], x: &[f32]) {
    super::gemv_blocks::<Q8_0>(out, w, x);
}

/// The Q8_0 kernels, for [`super::gemv_blocks`].
struct Q8_0;

// SAFETY: the default feature checks test what the kernels enable: AVX-512F; AVX2 and FMA.
unsafe impl BlockFormat for Q8_0 {
    const TYPE: GgmlType = GgmlType::Q8_0;
    const BLOCK: usize = BLOCK;
    const BLOCK_BYTES: usize = BLOCK_BYTES;
    #[cfg(target_arch = "x86_64")]
    type Shared = &'static [f32; 1 << 16];

    #[cfg(target_arch = "x86_64")]
    fn shared(_: crate::simd::Isa, _: &[f32]) -> Self::Shared {
        super::f16_table()
    }

    /// out[..N] for the N rows in `w` (N·rb bytes, rb = x.len() / 32 · 34).
    ///
    /// # Safety
    /// The CPU must support AVX-512F; `w.len()` = N · x.len() / 32 · 34, `out.len()` = N.
    #[cfg(target_arch = "x86_64")]
    #[inline]
    #[target_feature(enable = "avx512f")]
    unsafe fn rows_avx512<const N: usize>(
        out: &mut [f32],
        w: &[u8],
        x: &[f32],
        f16: &Self::Shared,
    ) {
        let nb = x.len() / BLOCK;
        let rb = nb * BLOCK_BYTES;
        debug_assert!(w.len() == N * rb && out.len() == N);
        let (pw, px) = (w.as_ptr(), x.as_ptr());
        let mut acc = [_mm512_setzero_ps(); N];
        for b in 0..nb {
            // SAFETY (every raw read below): block b < nb of row r < N starts at r·rb + 34·b,
            // inside `w`, and its 34 bytes end inside the row; x[32b..32b + 32] is inside x.
            let (x0, x1) = unsafe {
                (
                    _mm512_loadu_ps(px.add(b * BLOCK)),
                    _mm512_loadu_ps(px.add(b * BLOCK + 16)),
                )
            };
            for (r, acc) in acc.iter_mut().enumerate() {
                let blk = pw.wrapping_add(r * rb + b * BLOCK_BYTES);
                // A prefetch never faults, so its address may lie past the end of `w`.
                _mm_prefetch::<_MM_HINT_T0>(blk.wrapping_add(PF_ROWS * rb).cast());
                let (d, q0, q1) = unsafe {
                    (
                        blk.cast::<u16>().read_unaligned(),
                        _mm_loadu_si128(blk.add(2).cast()),
                        _mm_loadu_si128(blk.add(18).cast()),
                    )
                };
                let d = _mm512_set1_ps(f16[usize::from(d)]);
                let q0 = _mm512_cvtepi32_ps(_mm512_cvtepi8_epi32(q0));
                let q1 = _mm512_cvtepi32_ps(_mm512_cvtepi8_epi32(q1));
                let s = _mm512_fmadd_ps(q1, x1, _mm512_mul_ps(q0, x0));
                *acc = _mm512_fmadd_ps(s, d, *acc);
            }
        }
        for (o, a) in out.iter_mut().zip(acc) {
            *o = _mm512_reduce_add_ps(a);
        }
    }

    /// The AVX2 twin of [`Self::rows_avx512`]: 8 lanes, so four widenings per block.
    ///
    /// # Safety
    /// The CPU must support AVX2 and FMA; `w.len()` = N · x.len() / 32 · 34,
    /// `out.len()` = N.
    #[cfg(target_arch = "x86_64")]
    #[inline]
    #[target_feature(enable = "avx2,fma")]
    unsafe fn rows_avx2<const N: usize>(out: &mut [f32], w: &[u8], x: &[f32], f16: &Self::Shared) {
        let nb = x.len() / BLOCK;
        let rb = nb * BLOCK_BYTES;
        debug_assert!(w.len() == N * rb && out.len() == N);
        let (pw, px) = (w.as_ptr(), x.as_ptr());
        let mut acc = [_mm256_setzero_ps(); N];
        for b in 0..nb {
            // SAFETY (every raw read below): as in rows_avx512; each 8-byte quant load lies
            // within the block's qs[32], each x load within x[32b..32b + 32].
            let xv: [__m256; 4] =
                std::array::from_fn(|k| unsafe { _mm256_loadu_ps(px.add(b * BLOCK + 8 * k)) });
            for (r, acc) in acc.iter_mut().enumerate() {
                let blk = pw.wrapping_add(r * rb + b * BLOCK_BYTES);
                _mm_prefetch::<_MM_HINT_T0>(blk.wrapping_add(PF_ROWS * rb).cast());
                let d = unsafe { blk.cast::<u16>().read_unaligned() };
                let q = |k: usize| {
                    let v = unsafe { _mm_loadl_epi64(blk.add(2 + 8 * k).cast()) };
                    _mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(v))
                };
                let s0 = _mm256_fmadd_ps(q(1), xv[1], _mm256_mul_ps(q(0), xv[0]));
                let s1 = _mm256_fmadd_ps(q(3), xv[3], _mm256_mul_ps(q(2), xv[2]));
                let d = _mm256_set1_ps(f16[usize::from(d)]);
                *acc = _mm256_fmadd_ps(_mm256_add_ps(s0, s1), d, *acc);
            }
        }
        for (o, a) in out.iter_mut().zip(acc) {
            *o = super::hsum256(a);
        }
    }
}

#[cfg(test)]
mod tests {
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

//! The formats of blocks of 32 weights led by an f16 scale `d`, weight j = d·q_j (Q8_0, Q5_0):
//! their per-block loop, written once; each format gives only its Σ q_j·x_j of one block
//! ([`Block32`]).
//!
//! The loop: N rows per pass (four, then the rest one at a time) share each load of x. For
//! each block it loads x's 32 floats once (two 16-lane vectors with AVX-512, four 8-lane ones
//! with AVX2); for each row it asks for the same block [`PF_ROWS`] rows on (a software
//! prefetch: W is read once and is far larger than the caches), takes the format's Σ q_j·x_j
//! still as a vector (no horizontal add), and adds that vector times the block's `d` (f16 → f32
//! by a load from a 64 Ki-entry table, `quant::f16_table`) into the row's f32 accumulator. One
//! horizontal sum per row at the end. The activations never leave f32: the result differs from
//! "decode the row, then dot" only in the order of the additions.

use super::BlockFormat;
use kvlab_model::GgmlType;
#[cfg(target_arch = "x86_64")]
use std::arch::x86_64::*;

/// Weights per block.
pub(crate) const BLOCK: usize = 32;

/// Prefetch distance, in rows: while reading a block of row r, ask for the same block of row
/// r + PF_ROWS (without it, the Q8_0 loop waits on memory for a large W: 31 ms → 20 ms for the
/// 262144 × 640 classifier).
#[cfg(target_arch = "x86_64")]
const PF_ROWS: usize = 4;

/// A format of 32-weight blocks whose first two bytes are the f16 scale `d`.
///
/// # Safety
/// `dot_avx512` may enable no target feature beyond AVX-512F, and `dot_avx2` none beyond AVX2
/// and FMA: the loop runs them where the CPU has just those.
pub(crate) unsafe trait Block32 {
    /// The GGUF type of the rows.
    const TYPE: GgmlType;
    /// Bytes per block, `d`'s two included.
    const BLOCK_BYTES: usize;

    /// Σ q_j·x_j of the block at `blk` (its quants, not yet scaled by `d`) as 16 lanes to be
    /// summed; `x0`, `x1` are the block's 32 floats of x.
    ///
    /// # Safety
    /// The CPU has AVX-512F; `BLOCK_BYTES` bytes are readable at `blk`.
    #[cfg(target_arch = "x86_64")]
    unsafe fn dot_avx512(blk: *const u8, x0: __m512, x1: __m512) -> __m512;

    /// [`Self::dot_avx512`] with 8 lanes; `x` is the block's 32 floats of x.
    ///
    /// # Safety
    /// The CPU has AVX2 and FMA; `BLOCK_BYTES` bytes are readable at `blk`.
    #[cfg(target_arch = "x86_64")]
    unsafe fn dot_avx2(blk: *const u8, x: &[__m256; 4]) -> __m256;
}

// SAFETY: the loops enable AVX-512F, and AVX2 and FMA, which the default checks test, and
// Block32's contract keeps the dot products within them.
unsafe impl<F: Block32> BlockFormat for F {
    const TYPE: GgmlType = <F as Block32>::TYPE;
    const BLOCK: usize = BLOCK;
    const BLOCK_BYTES: usize = <F as Block32>::BLOCK_BYTES;
    #[cfg(target_arch = "x86_64")]
    type Shared = &'static [f32; 1 << 16];

    #[cfg(target_arch = "x86_64")]
    fn shared(_: crate::simd::Isa, _: &[f32]) -> Self::Shared {
        super::f16_table()
    }

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
        let rb = nb * F::BLOCK_BYTES;
        debug_assert!(w.len() == N * rb && out.len() == N);
        let (pw, px) = (w.as_ptr(), x.as_ptr());
        let mut acc = [_mm512_setzero_ps(); N];
        for b in 0..nb {
            // SAFETY: (every raw read below) block b < nb of row r < N starts at
            // r·rb + b·BLOCK_BYTES, inside `w`, and its bytes end inside the row;
            // x[32b..32b + 32] is inside x.
            // SAFETY: x[32b..32b + 32] is inside x (b < nb = x.len() / 32).
            let (x0, x1) = unsafe {
                (
                    _mm512_loadu_ps(px.add(b * BLOCK)),
                    _mm512_loadu_ps(px.add(b * BLOCK + 16)),
                )
            };
            for (r, acc) in acc.iter_mut().enumerate() {
                let blk = pw.wrapping_add(r * rb + b * F::BLOCK_BYTES);
                // A prefetch never faults, so its address may lie past the end of `w`.
                _mm_prefetch::<_MM_HINT_T0>(blk.wrapping_add(PF_ROWS * rb).cast());
                // SAFETY: block b of row r, BLOCK_BYTES from r·rb + b·BLOCK_BYTES, is inside w; it starts with its f16 scale.
                let (d, s) = unsafe {
                    (
                        blk.cast::<u16>().read_unaligned(),
                        F::dot_avx512(blk, x0, x1),
                    )
                };
                *acc = _mm512_fmadd_ps(s, _mm512_set1_ps(f16[usize::from(d)]), *acc);
            }
        }
        for (o, a) in out.iter_mut().zip(acc) {
            *o = _mm512_reduce_add_ps(a);
        }
    }

    #[cfg(target_arch = "x86_64")]
    #[inline]
    #[target_feature(enable = "avx2,fma")]
    unsafe fn rows_avx2<const N: usize>(out: &mut [f32], w: &[u8], x: &[f32], f16: &Self::Shared) {
        let nb = x.len() / BLOCK;
        let rb = nb * F::BLOCK_BYTES;
        debug_assert!(w.len() == N * rb && out.len() == N);
        let (pw, px) = (w.as_ptr(), x.as_ptr());
        let mut acc = [_mm256_setzero_ps(); N];
        for b in 0..nb {
            // SAFETY: (every raw read below) as in rows_avx512.
            let xv: [__m256; 4] =
                // SAFETY: x[32b + 8k..][..8] is inside x (b < nb, k < 4).
                std::array::from_fn(|k| unsafe { _mm256_loadu_ps(px.add(b * BLOCK + 8 * k)) });
            for (r, acc) in acc.iter_mut().enumerate() {
                let blk = pw.wrapping_add(r * rb + b * F::BLOCK_BYTES);
                _mm_prefetch::<_MM_HINT_T0>(blk.wrapping_add(PF_ROWS * rb).cast());
                // SAFETY: block b of row r is inside w and starts with its f16 scale; xv is its 32 x values.
                let (d, s) = unsafe { (blk.cast::<u16>().read_unaligned(), F::dot_avx2(blk, &xv)) };
                *acc = _mm256_fmadd_ps(s, _mm256_set1_ps(f16[usize::from(d)]), *acc);
            }
        }
        for (o, a) in out.iter_mut().zip(acc) {
            *o = super::hsum256(a);
        }
    }
}

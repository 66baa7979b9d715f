//! Q5_0 weights times 8-bit activations for steps of a few tokens, with `vpdpbusd` but the
//! AMX kernel's formula ([`super::amx`]): each 32-weight block's sum exact in i32, then one
//! FMA per block in block order,
//!
//! ```text
//! S_b = Σ_{κ in block b} (u[j][κ] − 16) · q_x[i][κ]          (exact, in i32)
//! y   = Σ_b f32(S_b) · (d_w[j][b] · d_x[i][b])               (b in order, from 0.0)
//! ```
//!
//! so it gives the tile kernel's bits exactly (tested against [`super::amx::reference`]), and a
//! call may take either by its token count without a row's bits depending on its batch: the
//! tiles for many tokens (prefill, batched decode), this for at most [`MAX_TOKENS`] (a decode
//! step), where the tiles would first rewrite every 16 rows as Q8_0 for one token's products.
//!
//! 16 W rows go together: each row's 64 codes of a chunk (two blocks) through one `vpdpbusd`
//! per token, the lane sums started at −16·Σq so that they hold Σ (u − 16)·q, then the 16
//! rows' lanes summed into two vectors, block 2c and block 2c + 1 over the 16 rows
//! (`block_sums`), scaled and added 16 rows at a time.

use std::arch::x86_64::*;

use super::amx::Q5_0_BLOCK_BYTES as BLOCK_BYTES;
use super::vnni::{self, Format};
use super::{Q8Rows, QK};

/// W rows per stripe (a vector of sums per block).
const ROWS: usize = 16;
/// Most tokens of a call this kernel takes (the tile kernel's token-by-token scaling limit).
pub const MAX_TOKENS: usize = 4;
/// How many stripes ahead W is prefetched.
const PREFETCH_STRIPES: usize = 2;

/// y[i·ldy + j] for i < t ≤ [`MAX_TOKENS`], j < n: the n Q5_0 rows of `w` (`rb` = x.k / 32 · 22
/// bytes each) against x, by the module's formula.
///
/// # Safety
/// AVX-512F/BW/VNNI and F16C; `w` holds n rows of rb bytes of Q5_0 blocks; `y` is valid to
/// write at i·ldy + j, and no other thread accesses those elements during the call.
///
/// # Panics
/// If x has more than [`MAX_TOKENS`] rows or its k is not rb / 22 blocks.
#[target_feature(enable = "avx512f,avx512bw,avx512vnni,f16c")]
pub unsafe fn rows_q5_0(y: *mut f32, ldy: usize, x: &Q8Rows, w: *const u8, rb: usize, n: usize) {
    let (t, blocks) = (x.t, x.k / QK);
    assert!(
        t <= MAX_TOKENS && rb == blocks * BLOCK_BYTES && ROWS * rb < i32::MAX as usize,
        "block_sums::rows_q5_0: shape"
    );
    let chunks = x.kp / 64;
    let mut dw = vec![0.0f32; 2 * chunks * ROWS];
    let mut pad = [[0u8; 2 * BLOCK_BYTES]; ROWS];
    for j0 in (0..n).step_by(ROWS) {
        let m = ROWS.min(n - j0);
        let stripe = w.wrapping_add(j0 * rb);
        // SAFETY: rows j0..j0 + m < n of w, whole Q5_0 blocks; 16·rb < 2³¹ (asserted).
        unsafe { super::amx::stripe_scales(stripe, rb, m, (BLOCK_BYTES, blocks), &mut dw) };
        let mut acc = [_mm512_setzero_ps(); MAX_TOKENS];
        for c in 0..chunks {
            // Codes of the chunk's two blocks for each row (a lone last block beside zeros).
            let mut u = [_mm512_setzero_si512(); ROWS];
            for (r, u) in u.iter_mut().enumerate().take(m) {
                let at = r * rb + c * 2 * BLOCK_BYTES;
                let b = if 2 * c + 2 <= blocks {
                    let ahead = PREFETCH_STRIPES * ROWS * rb;
                    crate::quant::prefetch(stripe.wrapping_add(at + ahead), 2 * BLOCK_BYTES);
                    stripe.wrapping_add(at)
                } else {
                    // SAFETY: the row's last block, inside it.
                    let last = unsafe { std::slice::from_raw_parts(stripe.add(at), BLOCK_BYTES) };
                    pad[r][..BLOCK_BYTES].copy_from_slice(last);
                    pad[r].as_ptr()
                };
                // SAFETY: 44 readable bytes at b (two blocks of the row, or the pad).
                *u = unsafe { vnni::Q5_0::chunk(b, &(), 0).0 };
            }
            for (i, acc) in acc.iter_mut().enumerate().take(t) {
                let piece = c * t + i; // chunk c of token i in x's arrays
                // SAFETY: piece < (kp / 64)·t: 64 codes, 16 lane sums and scales.
                let (q, init, dx) = unsafe {
                    (
                        _mm512_loadu_si512(x.qs[64 * piece..].as_ptr().cast()),
                        _mm512_slli_epi32::<4>(_mm512_loadu_si512(
                            x.nls[16 * piece..].as_ptr().cast(),
                        )),
                        [x.dl[16 * piece], x.dl[16 * piece + 8]],
                    )
                };
                let p = |r: usize| _mm512_dpbusd_epi32(init, u[r], q);
                let [s0, s1] = block_sums(p);
                for (h, s) in [s0, s1].into_iter().enumerate().take(blocks - 2 * c) {
                    // SAFETY: 16 scales of block 2c + h < blocks.
                    let dwv = unsafe { _mm512_loadu_ps(dw[(2 * c + h) * ROWS..].as_ptr()) };
                    let scale = _mm512_mul_ps(dwv, _mm512_set1_ps(dx[h]));
                    *acc = _mm512_fmadd_ps(_mm512_cvtepi32_ps(s), scale, *acc);
                }
            }
        }
        let mask = ((1u32 << m) - 1) as __mmask16;
        for (i, acc) in acc.iter().enumerate().take(t) {
            // SAFETY: y[i·ldy + j0 + r] for r < m: the caller's elements.
            unsafe { _mm512_mask_storeu_ps(y.add(i * ldy + j0), mask, *acc) };
        }
    }
}

/// The block sums of 16 rows' lane sums p(r) (16 i32 lanes each, lanes 0..8 of the first
/// block, 8..16 of the second): [S of the first block, S of the second], each over the 16 rows
/// in its lanes. Integer adds, so any order gives the same sums.
#[inline]
#[target_feature(enable = "avx512f")]
fn block_sums(p: impl Fn(usize) -> __m512i) -> [__m512i; 2] {
    // Pairs of rows: per 128-bit quarter [a0 + a2, b0 + b2, a1 + a3, b1 + b3].
    let t: [__m512i; 8] = std::array::from_fn(|i| {
        let (a, b) = (p(2 * i), p(2 * i + 1));
        _mm512_add_epi32(_mm512_unpacklo_epi32(a, b), _mm512_unpackhi_epi32(a, b))
    });
    // Fours: quarter q of u[g] = the quarter sums of rows 4g..4g + 4.
    let u: [__m512i; 4] = std::array::from_fn(|g| {
        let (a, b) = (
            _mm512_castsi512_ps(t[2 * g]),
            _mm512_castsi512_ps(t[2 * g + 1]),
        );
        _mm512_add_epi32(
            _mm512_castps_si512(_mm512_shuffle_ps::<0x44>(a, b)),
            _mm512_castps_si512(_mm512_shuffle_ps::<0xEE>(a, b)),
        )
    });
    // Halves: w[h] = [block 0 of rows 8h..8h + 4, block 1 of them, block 0 of rows
    // 8h + 4..8h + 8, block 1 of them] (quarters 0 + 1 are block 0, 2 + 3 block 1).
    let w: [__m512i; 2] = std::array::from_fn(|h| {
        let (a, b) = (u[2 * h], u[2 * h + 1]);
        _mm512_add_epi32(
            _mm512_shuffle_i32x4::<0x88>(a, b),
            _mm512_shuffle_i32x4::<0xDD>(a, b),
        )
    });
    [
        _mm512_shuffle_i32x4::<0x88>(w[0], w[1]),
        _mm512_shuffle_i32x4::<0xDD>(w[0], w[1]),
    ]
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::quant::testing::{random_rows, rng};
    use kvlab_model::GgmlType;
    use rand::Rng;

    /// The kernel gives the tile kernel's plain loop's bits (so the tiles' own bits) for every
    /// token count it takes, ragged row counts and an odd block count; a NaN stays in its token.
    #[test]
    fn a_few_tokens_get_the_tile_kernels_bits() {
        if !(std::arch::is_x86_feature_detected!("avx512vnni")
            && std::arch::is_x86_feature_detected!("avx512bw")
            && std::arch::is_x86_feature_detected!("f16c"))
        {
            eprintln!("q8_act::block_sums: no AVX-512 VNNI here; not tested on this CPU");
            return;
        }
        let mut rng = rng(24);
        for k in [32, 96, 640, 2048] {
            for (t, n) in [(1, 1), (1, 17), (2, 16), (3, 33), (4, 40)] {
                let w = random_rows(GgmlType::Q5_0, n, k, &mut rng);
                let mut x: Vec<f32> = (0..t * k).map(|_| rng.random_range(-2.0..2.0)).collect();
                if t == 3 {
                    x[k + 5] = f32::NAN; // token 1, block 0
                }
                let mut q = Q8Rows::default();
                q.quantize(&x, t, k);
                let ldy = n + 2;
                let (mut got, mut want) = (vec![f32::NAN; t * ldy], vec![f32::NAN; t * ldy]);
                // SAFETY: the features are checked; w is n rows of Q5_0; got holds t rows of
                // ldy ≥ n.
                unsafe { rows_q5_0(got.as_mut_ptr(), ldy, &q, w.as_ptr(), w.len() / n, n) };
                let mut w8 = vec![0u8; n * k / QK * super::super::amx::BLOCK_BYTES];
                super::super::amx::q5_0_as_q8_0(&w, &mut w8);
                super::super::amx::reference(&mut want, ldy, &q, &w8, n);
                for i in 0..t {
                    for j in 0..n {
                        let (g, e) = (got[i * ldy + j], want[i * ldy + j]);
                        assert!(
                            g.to_bits() == e.to_bits() || (g.is_nan() && e.is_nan()),
                            "k {k} t {t} n {n}: ({i}, {j}) {g} vs {e}"
                        );
                        assert_eq!(g.is_nan(), t == 3 && i == 1, "k {k} ({i}, {j}): {g}");
                    }
                    for j in n..ldy {
                        assert!(got[i * ldy + j].is_nan(), "wrote ({i}, {j})");
                    }
                }
            }
        }
    }
}

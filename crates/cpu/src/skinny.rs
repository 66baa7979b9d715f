//! `y (t, n) = x (t, k) @ Wᵀ` for a decode batch: few token rows (t ≤ [`MAX_T`]), many weight
//! rows, W (n, k) read in place, row-major, once per call.
//!
//! A batch of 32 sequences decoding is this shape at every linear layer: the weights are large
//! (the stories15M classifier is 32000 × 288 floats, 37 MB) and x is small (32 × 288 floats,
//! 36 KiB, which stays in L1). A general GEMM (the `gemm` crate, which [`crate::linear`] uses for
//! prompts) packs x, writes C column-major for us to transpose afterwards, and pays its setup at
//! every call; here the register tile is the whole problem's natural one:
//!
//! * x is transposed once per call into x_t: blocks of 32 tokens, each (k, 32), zero past t, so
//!   16 tokens are one 512-bit vector per k and a block (36 KiB at k = 288) stays in L1;
//! * a tile is [`ROWS`] = 8 rows of W × 32 tokens in 16 zmm accumulators: per k, two vector
//!   loads of x_t, 8 broadcasts from W's rows (read in place, in order), 16 FMAs;
//! * the next tile's rows are prefetched while this one computes: the classifier's W comes from
//!   memory once per step (on the 2-core AMD EPYC, one thread went from 172 to 246 GFLOP/s with
//!   it, the FMA peak of the cache-resident shapes);
//! * the finished tile (8, 32) goes through an L1 buffer and an 8 × 8 register transpose into
//!   y's rows, so no (n, t) buffer is written and read again.
//!
//! AVX-512 only ([`available`]); elsewhere `linear` keeps the `gemm` path. [`reference()`] is the
//! plain loop the kernel is tested against.

use crate::transpose::transpose;

/// Most token rows a call takes (x_t of the widest layer, 768 × 64 floats, is 192 KiB: L2).
pub const MAX_T: usize = 64;
/// W rows per register tile.
pub const ROWS: usize = 8;
/// Tokens per register tile (two 512-bit vectors).
const TOKENS: usize = 32;

/// Whether this CPU runs the kernel (AVX-512F).
pub fn available() -> bool {
    #[cfg(target_arch = "x86_64")]
    {
        std::arch::is_x86_feature_detected!("avx512f")
    }
    #[cfg(not(target_arch = "x86_64"))]
    {
        false
    }
}

/// Floats of x_t for t tokens of k: blocks of 32 tokens, each (k, 32).
pub fn x_t_len(t: usize, k: usize) -> usize {
    t.div_ceil(TOKENS) * k * TOKENS
}

/// x (t, k) row-major into x_t: block b (k, 32) holds tokens 32b .. 32b + 32 transposed, zero
/// past t.
pub fn transpose_x(x: &[f32], t: usize, k: usize, x_t: &mut Vec<f32>) {
    assert!(
        x.len() >= t * k,
        "skinny::transpose_x: x is shorter than t rows of k"
    );
    x_t.clear();
    x_t.resize(x_t_len(t, k), 0.0);
    for (b, block) in x_t.chunks_exact_mut(k * TOKENS).enumerate() {
        let tb = TOKENS.min(t - b * TOKENS);
        // SAFETY: x holds rows 32b .. 32b + tb of k floats (asserted); the block holds k rows
        // of 32 ≥ tb floats.
        unsafe {
            transpose(
                x[b * TOKENS * k..].as_ptr(),
                k,
                block.as_mut_ptr(),
                TOKENS,
                tb,
                k,
            )
        };
    }
}

/// y\[i·ldy + j\] = Σ_κ x\[i\]\[κ\] · w\[j·k + κ\] for i < t, j < n: the n rows of `w` (each k floats)
/// against t tokens given transposed ([`transpose_x`]).
///
/// # Panics
/// If t is 0 or above [`MAX_T`], the CPU lacks AVX-512F, or a slice is too short for these
/// shapes (`y` must span (t − 1)·ldy + n floats).
pub fn rows(y: &mut [f32], ldy: usize, x_t: &[f32], t: usize, w: &[f32], k: usize, n: usize) {
    assert!(
        y.len() >= t.saturating_sub(1) * ldy + n,
        "skinny::rows: shape mismatch"
    );
    // SAFETY: y spans every i·ldy + j it writes (asserted), is borrowed mutably, and `rows_raw`
    // asserts the rest.
    unsafe { rows_raw(y.as_mut_ptr(), ldy, x_t, t, w, k, n) }
}

/// [`rows`] with y given as a raw pointer, for tasks that write disjoint column blocks of one
/// shared y.
///
/// # Safety
/// As [`rows`]' assertions, for `y` valid to write at i·ldy + j (i < t, j < n), and no other
/// thread accesses those elements during the call.
pub unsafe fn rows_raw(
    y: *mut f32,
    ldy: usize,
    x_t: &[f32],
    t: usize,
    w: &[f32],
    k: usize,
    n: usize,
) {
    assert!(
        (1..=MAX_T).contains(&t) && available(),
        "skinny::rows: t out of range or no AVX-512"
    );
    assert!(
        x_t.len() >= x_t_len(t, k) && w.len() >= n * k && ldy >= n,
        "skinny::rows: shape mismatch"
    );
    // SAFETY: as the caller guarantees, and asserted above.
    #[cfg(target_arch = "x86_64")]
    unsafe {
        x86::rows(y, ldy, x_t.as_ptr(), t, w.as_ptr(), k, n)
    }
}

/// The plain loop: y (t, n) = x (t, k) @ wᵀ, x row-major, y rows of stride ldy.
pub fn reference(y: &mut [f32], ldy: usize, x: &[f32], t: usize, w: &[f32], k: usize, n: usize) {
    for i in 0..t {
        for j in 0..n {
            y[i * ldy + j] = (0..k).map(|kk| x[i * k + kk] * w[j * k + kk]).sum();
        }
    }
}

#[cfg(target_arch = "x86_64")]
mod x86 {
    use super::{ROWS, TOKENS, transpose};
    use std::arch::x86_64::*;

    /// See [`super::rows`].
    ///
    /// # Safety
    /// AVX-512F present; x_t readable for `x_t_len(t, k)` floats, w for n · k, y writable at
    /// i·ldy + j for i < t, j < n.
    #[target_feature(enable = "avx512f")]
    pub unsafe fn rows(
        y: *mut f32,
        ldy: usize,
        x_t: *const f32,
        t: usize,
        w: *const f32,
        k: usize,
        n: usize,
    ) {
        // One finished register tile, (ROWS, TOKENS), on its way to y.
        let mut tile = [0f32; ROWS * TOKENS];
        let mut j0 = 0;
        while j0 < n {
            let r = ROWS.min(n - j0);
            // SAFETY: rows j0..j0 + r < n of w, (n, k) row-major, exist.
            let wj = unsafe { w.add(j0 * k) };
            let mut i0 = 0;
            while i0 < t {
                let tb = TOKENS.min(t - i0);
                // SAFETY: x_t's block i0 / 32 of (k, 32) floats exists: i0 < t.
                let xi = unsafe { x_t.add(i0 * k) }; // block i0 / 32
                let (ldx, tp) = (TOKENS, tile.as_mut_ptr());
                // SAFETY: rows j0..j0 + r of w and x_t's block i0 / 32, (k, 32), exist.
                unsafe {
                    match (r, tb > 16) {
                        (8, true) => tile_rv::<8, 2>(wj, k, xi, ldx, tp),
                        (8, false) => tile_rv::<8, 1>(wj, k, xi, ldx, tp),
                        (r, true) => {
                            for q in 0..r {
                                tile_rv::<1, 2>(wj.add(q * k), k, xi, ldx, tp.add(q * TOKENS));
                            }
                        }
                        (r, false) => {
                            for q in 0..r {
                                tile_rv::<1, 1>(wj.add(q * k), k, xi, ldx, tp.add(q * TOKENS));
                            }
                        }
                    }
                    // y[i0 + c][j0 + q] = tile[q][c] for q < r, c < tb.
                    transpose(tp, TOKENS, y.add(i0 * ldy + j0), ldy, r, tb);
                }
                i0 += TOKENS;
            }
            j0 += ROWS;
        }
    }

    /// tile (R, 16·V) = w (R rows of k, stride k) · x_t (k, 16·V of stride ldx).
    ///
    /// # Safety
    /// AVX-512F; the ranges above readable, `tile` writable for R · TOKENS floats.
    #[target_feature(enable = "avx512f")]
    #[inline]
    unsafe fn tile_rv<const R: usize, const V: usize>(
        w: *const f32,
        k: usize,
        x_t: *const f32,
        ldx: usize,
        tile: *mut f32,
    ) {
        let mut acc = [[_mm512_setzero_ps(); V]; R];
        // The next tile's rows (the R · k floats after these) are fetched into L1 while this
        // one computes, R/8 of a line every other k: W comes from memory once per step, and the
        // hardware prefetcher alone left the classifier's FMAs waiting on it.
        let next = w.wrapping_add(R * k).cast::<u8>();
        for kk in 0..k {
            if kk % 2 == 0 {
                crate::quant::prefetch(next.wrapping_add(kk / 2 * 8 * R), 8 * R);
            }
            // SAFETY: kk < k, so row kk of x_t and element kk of each of the R rows of w exist.
            unsafe {
                let xr = x_t.add(kk * ldx);
                let mut xv = [_mm512_setzero_ps(); V];
                for (v, xv) in xv.iter_mut().enumerate() {
                    *xv = _mm512_loadu_ps(xr.add(16 * v));
                }
                for (q, acc) in acc.iter_mut().enumerate() {
                    let b = _mm512_set1_ps(*w.add(q * k + kk));
                    for v in 0..V {
                        acc[v] = _mm512_fmadd_ps(xv[v], b, acc[v]);
                    }
                }
            }
        }
        for (q, acc) in acc.iter().enumerate() {
            for (v, a) in acc.iter().enumerate() {
                // SAFETY: q < R, 16·v + 16 ≤ TOKENS.
                unsafe { _mm512_storeu_ps(tile.add(q * TOKENS + 16 * v), *a) };
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use rand::{Rng, SeedableRng};

    fn rand_vec(rng: &mut rand_chacha::ChaCha8Rng, n: usize) -> Vec<f32> {
        (0..n).map(|_| rng.random_range(-1.0..1.0)).collect()
    }

    #[test]
    fn rows_match_the_plain_loop_at_every_shape() {
        if !available() {
            eprintln!("skipping: this CPU has no AVX-512F");
            return;
        }
        let mut rng = rand_chacha::ChaCha8Rng::seed_from_u64(7);
        for &(t, k, n) in &[
            (1, 8, 1),
            (9, 288, 288),
            (16, 33, 17),
            (17, 288, 768),
            (32, 288, 100),
            (33, 768, 41),
            (48, 64, 9),
            (64, 288, 64),
            (31, 5, 7),
        ] {
            let x = rand_vec(&mut rng, t * k);
            let w = rand_vec(&mut rng, n * k);
            let ldy = n + 3;
            let mut want = vec![0.0; t * ldy];
            reference(&mut want, ldy, &x, t, &w, k, n);
            let mut x_t = Vec::new();
            transpose_x(&x, t, k, &mut x_t);
            let mut got = vec![f32::NAN; t * ldy];
            rows(&mut got, ldy, &x_t, t, &w, k, n);
            for i in 0..t {
                for j in 0..n {
                    let (g, e) = (got[i * ldy + j], want[i * ldy + j]);
                    assert!(
                        (g - e).abs() <= 1e-4 * (1.0 + e.abs()),
                        "t={t} k={k} n={n} y[{i}][{j}] = {g}, want {e}"
                    );
                }
                // The padding between rows is never written.
                for j in n..ldy {
                    assert!(
                        got[i * ldy + j].is_nan(),
                        "t={t} k={k} n={n}: wrote y[{i}][{j}]"
                    );
                }
            }
        }
    }

    #[test]
    fn nan_in_x_or_w_reaches_only_its_outputs() {
        if !available() {
            eprintln!("skipping: this CPU has no AVX-512F");
            return;
        }
        let (t, k, n) = (20, 40, 12);
        let mut rng = rand_chacha::ChaCha8Rng::seed_from_u64(8);
        let mut x = rand_vec(&mut rng, t * k);
        let mut w = rand_vec(&mut rng, n * k);
        x[3 * k + 5] = f32::NAN; // token 3
        w[7 * k + 1] = f32::NAN; // row 7
        let mut x_t = Vec::new();
        transpose_x(&x, t, k, &mut x_t);
        let mut y = vec![0.0; t * n];
        rows(&mut y, n, &x_t, t, &w, k, n);
        for i in 0..t {
            for j in 0..n {
                assert_eq!(y[i * n + j].is_nan(), i == 3 || j == 7, "y[{i}][{j}]");
            }
        }
    }
}

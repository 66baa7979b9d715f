//! `y (t, n) = x (t, k) @ Wᵀ` for a few token rows against quantized W (Q8_0, Q5_0, Q4_K,
//! Q6_K): a short prompt, a speculative step of `k + 1` rows, a decode batch of a few sequences.
//!
//! The GEMV kernels ([`super::gemv_rows`]) decode W in registers but for one token: t rows
//! decode every block t times. The skinny kernel ([`crate::skinny`]) takes W as f32, so an
//! encoded W is first decoded to memory ([`super::decode_rows`]), and its tiles of 32 tokens
//! leave lanes empty below 32 rows: on the 2-core AMD EPYC a Q5_0 640 × 2048 matrix took as long
//! at 5 rows as at 16. Here each block of W is decoded **once**, in registers, 32 weights at a
//! time (`Chunks`: the reference's values, bit for bit), and multiplied into the accumulators
//! of up to [`TOKENS`] tokens, for [`ROWS`] rows of W at once so each load of x serves both:
//!
//! * a pass is (`ROWS` rows of W) × (`TOKENS` tokens), 16 zmm accumulators, each summing its
//!   (row, token) dot product over 16 lanes of k;
//! * per 32 weights of a row: the decode (a load, widening, conversion, the scale), then two
//!   FMAs per token; x's rows (`TOKENS` × k floats) stay in L1 or L2 for the whole pass;
//! * the passes of a call go over W's rows in order, each reading its two rows once per
//!   `TOKENS` tokens, with the next pass's blocks prefetched.
//!
//! A row's output does not depend on the other tokens of the call (each token has its own
//! accumulators, summed in the same order whatever t is). [`reference()`] is the plain loop the
//! kernel is tested against.

use kvlab_model::GgmlType;

#[cfg(target_arch = "x86_64")]
use super::decode::avx512::{Chunks, Q4K, Q5_0, Q6K, Q8_0};
#[cfg(target_arch = "x86_64")]
use std::arch::x86_64::*;

/// W rows per pass.
pub const ROWS: usize = 2;
/// Tokens per pass (a call of more runs several passes over W).
pub const TOKENS: usize = 8;

/// The most token rows a call of `linear` gives this kernel for `ty`, beyond which decoding W
/// to f32 once for the skinny kernel costs less. Measured on the 2-core AMD EPYC, 2 threads,
/// through `linear`: a Q5_0 640 × 2048 matrix took 100 µs at 5 rows (skinny: 260), 220 at 10
/// (256) and 327 at 16 (264), Q8_0 likewise (190 at 10 against 243, 308 at 16); the K-quants,
/// whose skinny path decodes more per weight, gain further: Q6_K 2048 × 640 took 758 µs at 32
/// rows against 922 at 33 by the skinny kernel and 1,114 at 64, Q4_K 1024 × 640 343 at 32
/// against 450 and 541. From 2 rows it is the faster path too: the row kernels decode every
/// block once per token (Q5_0: 181 µs at 4 rows).
pub fn max_rows(ty: GgmlType) -> usize {
    match ty {
        GgmlType::Q4_K | GgmlType::Q6_K => 40,
        _ => 12,
    }
}

/// Whether this CPU runs the kernel for `ty` (AVX-512F, and a format it decodes).
pub fn available(ty: GgmlType) -> bool {
    #[cfg(target_arch = "x86_64")]
    {
        kvlab_model::weights::QUANTIZED.contains(&ty)
            && std::arch::is_x86_feature_detected!("avx512f")
    }
    #[cfg(not(target_arch = "x86_64"))]
    {
        let _ = ty;
        false
    }
}

/// y\[i·ldy + j\] = Σ_κ x\[i·k + κ\] · W\[j\]\[κ\] for i < t, j < n: the n rows of `w` = (type, bytes),
/// each k weights, against t tokens, x row-major (t, k).
///
/// # Safety
/// `y` is valid to write at i·ldy + j for i < t, j < n, and no other thread accesses those
/// elements during the call.
///
/// # Panics
/// If [`available`] is false for `ty`, k is not whole blocks of `ty`, `w` is not n rows of them,
/// x is shorter than t rows, or ldy < n.
pub unsafe fn rows_raw(
    y: *mut f32,
    ldy: usize,
    x: &[f32],
    t: usize,
    (ty, w): (GgmlType, &[u8]),
    k: usize,
    n: usize,
) {
    assert!(available(ty), "few_rows: no kernel for {ty} on this CPU");
    let whole = k.is_multiple_of(ty.block_size());
    let rb = k / ty.block_size() * ty.type_size();
    assert!(
        whole && w.len() == n * rb && x.len() >= t * k && ldy >= n,
        "few_rows: shape mismatch"
    );
    #[cfg(target_arch = "x86_64")]
    // SAFETY: AVX-512F and the format are checked (available), the shapes asserted, and y is
    // the caller's to write.
    unsafe {
        let p = (y, ldy, x.as_ptr(), t, w.as_ptr(), k, n);
        match ty {
            GgmlType::Q8_0 => rows::<Q8_0>(p),
            GgmlType::Q5_0 => rows::<Q5_0>(p),
            GgmlType::Q4_K => rows::<Q4K>(p),
            _ => rows::<Q6K>(p),
        }
    }
}

/// The plain loop: W's rows decoded by the reference, then each (token, row) dot product.
pub fn reference(ty: GgmlType, y: &mut [f32], ldy: usize, x: &[f32], t: usize, w: &[u8], n: usize) {
    let rb = w.len().checked_div(n).unwrap_or(0); // bytes per row
    let k = rb / ty.type_size() * ty.block_size();
    let mut row = vec![0.0; k];
    for j in 0..n {
        super::decode_rows_reference(ty, &w[j * rb..][..rb], &mut row);
        for i in 0..t {
            y[i * ldy + j] = kvlab_model::ops::dot(&row, &x[i * k..][..k]);
        }
    }
}

/// (y, ldy, x, t, w, k, n) of [`rows_raw`].
#[cfg(target_arch = "x86_64")]
type Call = (*mut f32, usize, *const f32, usize, *const u8, usize, usize);

/// Every pass over `F`'s rows: ROWS rows (or the one left) × TOKENS tokens (or those left).
///
/// # Safety
/// As [`rows_raw`], its asserts holding.
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx512f")]
unsafe fn rows<F: Chunks>((y, ldy, x, t, w, k, n): Call) {
    let rb = k / F::BLOCK * F::BLOCK_BYTES;
    /// One pass of R rows and T tokens, R and T as constants.
    macro_rules! pass {
        ($r:literal, $t:expr, $j0:expr, $i0:expr) => {{
            // SAFETY: rows j0..j0 + R < n of w and tokens i0..i0 + T < t of x exist; y's
            // elements of those rows and tokens are the caller's.
            unsafe {
                pass::<F, $r, { $t }>(
                    w.add($j0 * rb),
                    rb,
                    x.add($i0 * k),
                    k,
                    y.add($i0 * ldy + $j0),
                    ldy,
                )
            }
        }};
    }
    /// Dispatches the token count of the pass to its constant.
    macro_rules! tokens {
        ($r:literal, $tt:expr, $j0:expr, $i0:expr) => {
            match $tt {
                1 => pass!($r, 1, $j0, $i0),
                2 => pass!($r, 2, $j0, $i0),
                3 => pass!($r, 3, $j0, $i0),
                4 => pass!($r, 4, $j0, $i0),
                5 => pass!($r, 5, $j0, $i0),
                6 => pass!($r, 6, $j0, $i0),
                7 => pass!($r, 7, $j0, $i0),
                _ => pass!($r, 8, $j0, $i0),
            }
        };
    }
    const _: () = assert!(
        ROWS == 2 && TOKENS == 8,
        "the dispatch below is written for 2 × 8"
    );
    for j0 in (0..n).step_by(ROWS) {
        for i0 in (0..t).step_by(TOKENS) {
            let tt = TOKENS.min(t - i0);
            if n - j0 >= 2 {
                tokens!(2, tt, j0, i0);
            } else {
                tokens!(1, tt, j0, i0);
            }
        }
    }
}

/// y[i·ldy + r] = row r of w · token i of x, for r < R, i < T.
///
/// # Safety
/// AVX-512F; R rows of `rb` bytes at w (whole blocks of F, k weights each), T rows of k floats
/// at x (stride k), y writable at i·ldy + r.
#[cfg(target_arch = "x86_64")]
#[inline]
#[target_feature(enable = "avx512f")]
// The register tile acc[r][i] is indexed from two loops, x's rows by i.
#[allow(clippy::needless_range_loop)]
unsafe fn pass<F: Chunks, const R: usize, const T: usize>(
    w: *const u8,
    rb: usize,
    x: *const f32,
    k: usize,
    y: *mut f32,
    ldy: usize,
) {
    let mut acc = [[_mm512_setzero_ps(); T]; R];
    for b in 0..k / F::BLOCK {
        // Plain loops, not closures, below: a closure is not inlined into this function's
        // features, and per 32 weights its call cost as much as the FMAs.
        let mut blk = [w; R];
        for (r, p) in blk.iter_mut().enumerate() {
            *p = w.wrapping_add(r * rb + b * F::BLOCK_BYTES);
            // The same block of the next pass's rows (W is far larger than the caches, and a
            // pass reads R interleaved streams).
            super::prefetch(p.wrapping_add(R * rb), F::BLOCK_BYTES);
        }
        // SAFETY: block b of each of the R rows lies inside w (the caller's contract).
        let mut prep = [unsafe { F::prep(blk[0]) }; R];
        for r in 1..R {
            // SAFETY: as above.
            prep[r] = unsafe { F::prep(blk[r]) };
        }
        for c in 0..F::BLOCK / 32 {
            let mut vals = [[_mm512_setzero_ps(); 2]; R];
            for r in 0..R {
                // SAFETY: as above; c < BLOCK / 32.
                vals[r] = unsafe { F::chunk(blk[r], &prep[r], c) };
            }
            let kk = b * F::BLOCK + 32 * c;
            for i in 0..T {
                // SAFETY: token i < T's floats kk..kk + 32 < k are inside x.
                let (x0, x1) = unsafe {
                    (
                        _mm512_loadu_ps(x.add(i * k + kk)),
                        _mm512_loadu_ps(x.add(i * k + kk + 16)),
                    )
                };
                for r in 0..R {
                    acc[r][i] = _mm512_fmadd_ps(vals[r][0], x0, acc[r][i]);
                    acc[r][i] = _mm512_fmadd_ps(vals[r][1], x1, acc[r][i]);
                }
            }
        }
    }
    for (r, acc) in acc.iter().enumerate() {
        for (i, a) in acc.iter().enumerate() {
            // SAFETY: the caller's contract for i < T, r < R.
            unsafe { *y.add(i * ldy + r) = _mm512_reduce_add_ps(*a) };
        }
    }
}

#[cfg(test)]
mod tests {
    use super::super::testing::random_rows;
    use super::*;
    use rand::Rng;

    #[test]
    fn rows_match_the_plain_loop_at_every_shape() {
        let mut rng = super::super::testing::rng(31);
        for ty in [
            GgmlType::Q8_0,
            GgmlType::Q5_0,
            GgmlType::Q4_K,
            GgmlType::Q6_K,
        ] {
            if !available(ty) {
                eprintln!("skipping {ty}: this CPU has no AVX-512F");
                continue;
            }
            for (t, k, n) in [
                (1, 256, 1),
                (5, 256, 3),
                (8, 512, 2),
                (9, 768, 5),
                (17, 256, 8),
                (32, 512, 33),
            ] {
                let w = random_rows(ty, n, k, &mut rng);
                let x: Vec<f32> = (0..t * k).map(|_| rng.random_range(-1.0..1.0)).collect();
                let ldy = n + 2;
                let mut want = vec![0.0; t * ldy];
                reference(ty, &mut want, ldy, &x, t, &w, n);
                let mut got = vec![f32::NAN; t * ldy];
                // SAFETY: got holds t rows of ldy ≥ n floats, written by this call only.
                unsafe { rows_raw(got.as_mut_ptr(), ldy, &x, t, (ty, &w), k, n) };
                let (rb, mut row) = (w.len() / n, vec![0.0; k]);
                for j in 0..n {
                    super::super::decode_rows_reference(ty, &w[j * rb..][..rb], &mut row);
                    for i in 0..t {
                        let (g, e) = (got[i * ldy + j], want[i * ldy + j]);
                        let scale: f32 = row
                            .iter()
                            .zip(&x[i * k..][..k])
                            .map(|(a, b)| (a * b).abs())
                            .sum();
                        assert!(
                            (g - e).abs() <= 1e-5 * scale.max(1e-6),
                            "{ty} t={t} k={k} n={n} y[{i}][{j}] = {g}, want {e}"
                        );
                    }
                }
                for i in 0..t {
                    for j in n..ldy {
                        assert!(got[i * ldy + j].is_nan(), "{ty}: wrote y[{i}][{j}]");
                    }
                }
            }
        }
    }

    #[test]
    fn a_token_gives_the_same_bits_in_every_call_and_nan_stays_in_its_row() {
        let mut rng = super::super::testing::rng(32);
        let (k, n) = (256, 6);
        for ty in [GgmlType::Q5_0, GgmlType::Q4_K] {
            if !available(ty) {
                continue;
            }
            let w = random_rows(ty, n, k, &mut rng);
            let token: Vec<f32> = (0..k).map(|_| rng.random_range(-1.0..1.0)).collect();
            let mut first: Option<Vec<f32>> = None;
            for (t, at) in [(1, 0), (5, 4), (8, 3), (9, 8), (20, 11)] {
                let mut x: Vec<f32> = (0..t * k).map(|_| rng.random_range(-1.0..1.0)).collect();
                x[at * k..(at + 1) * k].copy_from_slice(&token);
                if t == 20 {
                    x[2 * k + 7] = f32::NAN; // token 2 only
                }
                let mut y = vec![0.0; t * n];
                // SAFETY: y holds t rows of n floats.
                unsafe { rows_raw(y.as_mut_ptr(), n, &x, t, (ty, &w), k, n) };
                let got = y[at * n..(at + 1) * n].to_vec();
                let want = first.get_or_insert_with(|| got.clone());
                let same = got
                    .iter()
                    .zip(want.iter())
                    .all(|(a, b)| a.to_bits() == b.to_bits());
                assert!(same, "{ty} t={t}: token {at} changed with its batch");
                for i in 0..t {
                    let nan = y[i * n..(i + 1) * n].iter().any(|v| v.is_nan());
                    assert_eq!(nan, t == 20 && i == 2, "{ty} t={t} token {i}");
                }
            }
        }
    }
}

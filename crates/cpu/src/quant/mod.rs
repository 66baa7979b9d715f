//! GEMV kernels over **encoded** weight rows: bf16, f16 and ggml's quantized blocks, read as
//! stored instead of decoded to f32 at load, so each token reads 2–8× fewer bytes of weights.
//!
//! One file per format, each with its block layout (from ggml-common.h), the decode-and-dot of
//! its rows (or, for Q8_0 and Q5_0, of one block: `block32.rs` holds their per-block loop) for
//! AVX-512 and for AVX2, as a `BlockFormat`, and tests against the plain reference below on
//! random blocks. What every format shares is written once here: the shape asserts, the choice
//! of level at run time ([`crate::simd::isa`]) with the reference as the fallback, the passes of
//! four rows (`gemv_blocks`), the software prefetch, and the two-byte formats' row pass. The
//! kernels keep the activations in f32: a block's values are decoded in registers and
//! multiplied into f32 accumulators, so a kernel differs from "decode the row, then dot" only in
//! the order of the additions (llama.cpp instead quantizes the activations to 8 bits for
//! integer dot products; kvlab keeps f32 as its reference path, and offers llama.cpp's way as
//! `--activations q8`: [`q8_act`]).

/// The [`BlockFormat`] items of a two-byte format (bf16, f16: a row of `cols` elements is
/// `2·cols` bytes, a block is one element), written once for both: no `Shared`, and the row
/// pass of each level, `rows_avx512` (AVX-512F, 32 columns a step) and `rows_avx2` (compiled for
/// `$avx2`, 16 columns a step), around the format's `step_avx512` and `step_avx2`, which must be
/// in scope. A pass runs the step over the whole chunks of N rows, prefetching the same columns
/// of the next N rows ([`prefetch`]), then over their zero-padded tail, and writes each row's
/// horizontal sum of its two accumulators. A macro, not a generic function: the features must
/// be literals, and the step must be inlined into the loop.
macro_rules! two_byte_kernels {
    (avx2 = $avx2:literal) => {
        #[cfg(target_arch = "x86_64")]
        type Shared = ();

        #[cfg(target_arch = "x86_64")]
        fn shared(_: crate::simd::Isa, _: &[f32]) {}

        two_byte_kernels!(@rows rows_avx512, "avx512f", step_avx512,
            |a: &[__m512; 2]| _mm512_reduce_add_ps(_mm512_add_ps(a[0], a[1])),
            _mm512_setzero_ps(), 32);
        two_byte_kernels!(@rows rows_avx2, $avx2, step_avx2,
            |a: &[__m256; 2]| crate::quant::hsum256(_mm256_add_ps(a[0], a[1])),
            _mm256_setzero_ps(), 16);
    };
    (@rows $name:ident, $features:literal, $step:ident, $hsum:expr, $zero:expr, $STEP:expr) => {
        #[cfg(target_arch = "x86_64")]
        #[inline]
        #[target_feature(enable = $features)]
        unsafe fn $name<const N: usize>(out: &mut [f32], w: &[u8], x: &[f32], _: &()) {
            const STEP: usize = $STEP;
            let n = x.len();
            assert!(w.len() == N * 2 * n && out.len() == N);
            let mut acc = [[$zero; 2]; N];
            let mut i = 0;
            // The same columns of the next group of rows (see quant::prefetch).
            let ahead = N * 2 * n;
            while i + STEP <= n {
                // SAFETY: i + STEP ≤ n, so STEP floats of x and STEP two-byte elements of every
                // row lie in bounds.
                unsafe {
                    let pw: [*const u8; N] =
                        std::array::from_fn(|q| w.as_ptr().add(2 * (q * n + i)));
                    pw.iter()
                        .for_each(|p| crate::quant::prefetch(p.wrapping_add(ahead), 64));
                    $step::<N>(&mut acc, pw, x.as_ptr().add(i));
                }
                i += STEP;
            }
            if i < n {
                let t = n - i;
                let mut xt = [0.0f32; STEP];
                xt[..t].copy_from_slice(&x[i..]);
                let mut wt = [[0u8; 2 * STEP]; N];
                for (q, wt) in wt.iter_mut().enumerate() {
                    wt[..2 * t].copy_from_slice(&w[2 * (q * n + i)..2 * (q + 1) * n]);
                }
                // SAFETY: the padded buffers (borrowed, not moved) hold exactly one step.
                unsafe { $step::<N>(&mut acc, wt.each_ref().map(|b| b.as_ptr()), xt.as_ptr()) };
            }
            for (o, a) in out.iter_mut().zip(&acc) {
                *o = $hsum(a);
            }
        }
    };
}

pub mod bf16;
mod block32;
mod decode;
pub mod f16;
pub mod few_rows;
pub mod q4_k;
pub mod q5_0;
pub mod q6_k;
pub mod q8_0;
pub mod q8_act;

pub use decode::decode_rows;
use kvlab_model::GgmlType;

/// Bytes of one row of `cols` elements of `ty`.
///
/// # Panics
/// If `cols` is not a whole number of `ty`'s blocks (the loader checked this).
pub fn row_bytes(ty: GgmlType, cols: usize) -> usize {
    ty.bytes_for(cols as u64).expect("a row is whole blocks") as usize
}

/// out (rows,) = W (rows, cols) @ x (cols,) for W stored as `ty` (one of
/// [`kvlab_model::weights::ENCODINGS`]): `w` is `out.len()` rows of [`row_bytes`] each.
///
/// # Panics
/// If `w` is not `out.len()` whole rows, or `ty` has no kernel.
pub fn gemv_rows(ty: GgmlType, out: &mut [f32], w: &[u8], x: &[f32]) {
    assert_eq!(
        w.len(),
        out.len() * row_bytes(ty, x.len()),
        "quant::gemv_rows: W must be (rows, cols) of {ty}"
    );
    match ty {
        GgmlType::BF16 => bf16::gemv_rows(out, w, x),
        GgmlType::F16 => f16::gemv_rows(out, w, x),
        GgmlType::Q8_0 => q8_0::gemv_rows(out, w, x),
        GgmlType::Q5_0 => q5_0::gemv_rows(out, w, x),
        GgmlType::Q4_K => q4_k::gemv_rows(out, w, x),
        GgmlType::Q6_K => q6_k::gemv_rows(out, w, x),
        other => panic!("quant::gemv_rows: no kernel for {other}"),
    }
}

/// Rows per pass of every format's kernels: each load of x serves this many rows.
#[cfg(target_arch = "x86_64")]
const ROWS: usize = 4;

/// One weight format's kernels: what is specific to the format (its block, and the
/// decode-and-dot of N rows for each instruction-set level), under the scaffolding that
/// [`gemv_blocks`] writes once for every format: the shape asserts, the choice of AVX-512,
/// AVX2 + FMA or the reference at run time, and the passes of [`ROWS`] rows ([`row_groups`]).
/// The per-block loops stay inside the format's `rows_*`, statically dispatched and inlined into
/// the row loop, which is compiled for the same features.
///
/// # Safety
/// `has_avx512` may return true only where the CPU has every feature `rows_avx512` enables, and
/// `has_avx2` only where it has AVX2, FMA, F16C if `AVX2_F16C`, and every feature `rows_avx2`
/// enables: [`gemv_blocks`] runs the kernels on their word.
pub(crate) unsafe trait BlockFormat {
    /// The GGUF type of the rows.
    const TYPE: GgmlType;
    /// Weights per block (1 for the two-byte formats, which have no blocks).
    const BLOCK: usize;
    /// Bytes per block.
    const BLOCK_BYTES: usize;
    /// Whether `rows_avx2` enables F16C, so that the row loop around it is compiled with F16C
    /// too (and can inline it).
    #[cfg(target_arch = "x86_64")]
    const AVX2_F16C: bool = false;
    /// What one call computes once from x and shares with every row: the f16 table for the
    /// formats with f16 block scales (`f16_table`), Q4_K's sums of x; `()` for the rest.
    #[cfg(target_arch = "x86_64")]
    type Shared;

    /// The [`Self::Shared`] of x for the kernels of level `isa`.
    #[cfg(target_arch = "x86_64")]
    fn shared(isa: crate::simd::Isa, x: &[f32]) -> Self::Shared;

    /// Whether this CPU runs `rows_avx512` ([`crate::simd::isa`] reported AVX-512F).
    #[cfg(target_arch = "x86_64")]
    fn has_avx512() -> bool {
        is_x86_feature_detected!("avx512f")
    }

    /// Whether this CPU runs `rows_avx2`.
    #[cfg(target_arch = "x86_64")]
    fn has_avx2() -> bool {
        is_x86_feature_detected!("avx2")
            && is_x86_feature_detected!("fma")
            && (!Self::AVX2_F16C || is_x86_feature_detected!("f16c"))
    }

    /// out[..N] = the N rows of `w` dotted with x, 16 lanes.
    ///
    /// # Safety
    /// The CPU has what `has_avx512` checks; `x` is whole blocks and not empty, `out.len()` = N
    /// and `w.len()` = N rows of `x.len() / BLOCK · BLOCK_BYTES` bytes; `shared` is
    /// `shared(Isa::Avx512, x)`.
    #[cfg(target_arch = "x86_64")]
    unsafe fn rows_avx512<const N: usize>(
        out: &mut [f32],
        w: &[u8],
        x: &[f32],
        shared: &Self::Shared,
    );

    /// [`Self::rows_avx512`] with 8 lanes.
    ///
    /// # Safety
    /// As [`Self::rows_avx512`], for what `has_avx2` checks and `shared(Isa::Avx2Fma, x)`.
    #[cfg(target_arch = "x86_64")]
    unsafe fn rows_avx2<const N: usize>(
        out: &mut [f32],
        w: &[u8],
        x: &[f32],
        shared: &Self::Shared,
    );
}

/// out (rows,) = W (rows, cols) @ x (cols,) for W's rows stored as format `F`: the best kernel
/// this CPU runs ([`crate::simd::isa`], then `F`'s own feature checks), else the reference.
///
/// # Panics
/// If `x.len()` is not whole blocks of `F` or `w` is not `out.len()` rows of them.
pub(crate) fn gemv_blocks<F: BlockFormat>(out: &mut [f32], w: &[u8], x: &[f32]) {
    let ty = F::TYPE;
    assert_eq!(x.len() % F::BLOCK, 0, "{ty}: columns must be whole blocks");
    let rb = x.len() / F::BLOCK * F::BLOCK_BYTES;
    assert_eq!(w.len(), out.len() * rb, "{ty}: W must be (rows, cols)");
    if x.is_empty() {
        // Rows of no blocks: empty dot products (and no zero-sized chunks below).
        out.fill(0.0);
        return;
    }
    #[cfg(target_arch = "x86_64")]
    {
        use crate::simd::{Isa, isa};
        match isa() {
            Isa::Avx512 if F::has_avx512() => {
                // SAFETY: has_avx512 vouches for the CPU (the trait's contract); the asserts
                // above make `w` exactly out.len() rows of whole blocks, which is all the kernel
                // reads, and x is not empty.
                unsafe { x86::gemv_avx512::<F>(out, w, x) };
                return;
            }
            Isa::Avx512 | Isa::Avx2Fma if F::has_avx2() => {
                // SAFETY: as above, by has_avx2 (which checked F16C where AVX2_F16C says so).
                unsafe {
                    if F::AVX2_F16C {
                        x86::gemv_avx2_f16c::<F>(out, w, x)
                    } else {
                        x86::gemv_avx2::<F>(out, w, x)
                    }
                };
                return;
            }
            _ => {}
        }
    }
    gemv_rows_reference(ty, out, w, x);
}

/// The row loops of [`gemv_blocks`], one per set of target features.
#[cfg(target_arch = "x86_64")]
mod x86 {
    use super::{BlockFormat, ROWS, row_groups};
    use crate::simd::Isa;

    /// `$name::<F>`: F's `$rows` over every pass of [`ROWS`] rows, then over each row left, all
    /// compiled for `$features` (the closures inherit them), so `$rows` inlines into the loop.
    macro_rules! row_loop {
        ($name:ident, $features:literal, $isa:expr, $rows:ident) => {
            /// # Safety
            /// The CPU has every feature F's kernel enables; `x` is whole blocks of F and not
            /// empty, and `w` is `out.len()` rows of them.
            #[target_feature(enable = $features)]
            pub unsafe fn $name<F: BlockFormat>(out: &mut [f32], w: &[u8], x: &[f32]) {
                let shared = F::shared($isa, x);
                row_groups::<ROWS>(
                    out,
                    w,
                    x.len() / F::BLOCK * F::BLOCK_BYTES,
                    // SAFETY: `w` is ROWS whole rows and `o` their outputs; the caller vouched
                    // for the CPU and x.
                    |o, w| unsafe { F::$rows::<ROWS>(o, w, x, &shared) },
                    // SAFETY: as above, one row.
                    |o, w| unsafe { F::$rows::<1>(o, w, x, &shared) },
                );
            }
        };
    }

    row_loop!(gemv_avx512, "avx512f", Isa::Avx512, rows_avx512);
    row_loop!(gemv_avx2, "avx2,fma", Isa::Avx2Fma, rows_avx2);
    row_loop!(gemv_avx2_f16c, "avx2,fma,f16c", Isa::Avx2Fma, rows_avx2);
}

/// Horizontal sum of 8 lanes: the two-byte formats' AVX2 rows end with it.
#[cfg(target_arch = "x86_64")]
#[inline]
#[target_feature(enable = "avx2,fma")]
pub(crate) fn hsum256(v: std::arch::x86_64::__m256) -> f32 {
    use std::arch::x86_64::*;
    let v = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps::<1>(v));
    let v = _mm_add_ps(v, _mm_movehl_ps(v, v));
    _mm_cvtss_f32(_mm_add_ss(v, _mm_shuffle_ps::<1>(v, v)))
}

/// Every f16 bit pattern's f32 value (the `half` crate's conversion), built on first use
/// (256 KiB), for the Q8_0 and Q5_0 kernels' block scales.
///
/// A block's scale is then one table load broadcast to all lanes, which costs the kernel no
/// shuffle-port work (`vpbroadcastw` + `vcvtph2ps` cost three shuffle/FP uops per block and row,
/// a quarter of the loop). Real weights' scales span a few binades, so a few KiB of it stay hot.
#[cfg_attr(not(target_arch = "x86_64"), allow(dead_code))]
fn f16_table() -> &'static [f32; 1 << 16] {
    static TABLE: std::sync::OnceLock<Box<[f32; 1 << 16]>> = std::sync::OnceLock::new();
    TABLE.get_or_init(|| {
        let mut t = Box::new([0.0f32; 1 << 16]);
        for (h, v) in t.iter_mut().enumerate() {
            *v = half::f16::from_bits(h as u16).to_f32();
        }
        t
    })
}

/// Rows of W decoded to f32 into `out` (`rows × cols`) by kvlab-gguf's scalar port of ggml's
/// `dequantize_row_*`: the reference [`decode_rows`] matches bit for bit.
///
/// # Panics
/// If `w` is not exactly the bytes of `out.len()` elements of `ty`, or `ty` is not a weight type.
pub fn decode_rows_reference(ty: GgmlType, w: &[u8], out: &mut [f32]) {
    kvlab_gguf::dequantize_into(ty, w, out).expect("whole rows of whole blocks");
}

/// The plain reference every kernel is tested against: each row decoded by kvlab-gguf's
/// reference dequantizer (a port of ggml's `dequantize_row_*`), then the scalar dot product.
pub fn gemv_rows_reference(ty: GgmlType, out: &mut [f32], w: &[u8], x: &[f32]) {
    let rb = row_bytes(ty, x.len());
    if rb == 0 {
        out.fill(0.0); // no columns: every dot product is empty
        return;
    }
    let mut row = vec![0.0f32; x.len()];
    for (o, bytes) in out.iter_mut().zip(w.chunks_exact(rb)) {
        decode_rows_reference(ty, bytes, &mut row);
        *o = kvlab_model::ops::dot(&row, x);
    }
}

/// Asks the CPU to start loading the cache lines of `bytes` bytes from `p` into L1
/// (`prefetcht0`, one per 64-byte line), ahead of their use. The row kernels read a pass of R
/// rows as R short interleaved streams, which the hardware prefetcher alone picks up too late:
/// Q4_K and Q6_K prefetch each block ~16 KiB ahead; bf16 and f16 the same columns one pass of
/// rows on. On the 2-core AMD EPYC (AVX-512), bf16 decode of the stories42M shape went from
/// ~490 to ~580 tok/s with it (41 to 49 GB/s of weights: what the f32 kernel, whose rows are
/// twice as long, reaches without it and did not gain from it). `p` may point anywhere, past
/// the end of the weights included.
#[inline(always)]
pub(crate) fn prefetch(p: *const u8, bytes: usize) {
    #[cfg(target_arch = "x86_64")]
    for line in (0..bytes).step_by(64) {
        // SAFETY: PREFETCHT0 is a hint: it never faults and changes no architectural state,
        // whatever the address (Intel SDM vol. 2, "PREFETCHh"); the SSE it needs is part of
        // x86-64.
        unsafe {
            std::arch::x86_64::_mm_prefetch::<{ std::arch::x86_64::_MM_HINT_T0 }>(
                p.wrapping_add(line).cast(),
            );
        }
    }
    #[cfg(not(target_arch = "x86_64"))]
    let _ = (p, bytes);
}

/// How far ahead Q4_K and Q6_K prefetch, in bytes: at least 16 KiB (far enough to cover the
/// memory latency, near enough to stay in L1), rounded to whole passes of `pass_bytes` (N rows).
#[cfg(target_arch = "x86_64")]
#[inline(always)]
pub(crate) fn prefetch_distance(pass_bytes: usize) -> usize {
    const PF_BYTES: usize = 16 << 10;
    pass_bytes * (PF_BYTES / pass_bytes.max(1)).max(1)
}

/// The row loop of every format's kernel: `group(out, w)` on R rows at a time (`out` R outputs,
/// `w` R rows of `row_bytes`), so each load of x serves R rows, then `one` on each remaining
/// row. `row_bytes` must not be 0 (the kernels return early on empty rows).
#[inline(always)]
pub(crate) fn row_groups<const R: usize>(
    out: &mut [f32],
    w: &[u8],
    row_bytes: usize,
    mut group: impl FnMut(&mut [f32], &[u8]),
    mut one: impl FnMut(&mut [f32], &[u8]),
) {
    let mut outs = out.chunks_exact_mut(R);
    let mut ws = w.chunks_exact(R * row_bytes);
    for (o, w) in (&mut outs).zip(&mut ws) {
        group(o, w);
    }
    let rest = outs.into_remainder().chunks_exact_mut(1);
    for (o, w) in rest.zip(ws.remainder().chunks_exact(row_bytes)) {
        one(o, w);
    }
}

#[cfg(test)]
mod tests {
    #[test]
    fn the_f16_table_agrees_with_the_reference_decoder() {
        let t = super::f16_table();
        for h in 0..=u16::MAX {
            let mut want = [0.0f32];
            super::decode_rows_reference(kvlab_model::GgmlType::F16, &h.to_le_bytes(), &mut want);
            assert_eq!(
                t[usize::from(h)].to_bits(),
                want[0].to_bits(),
                "f16 bits {h:#06x}"
            );
        }
    }
}

/// Shared by the per-format tests: random activations, and the comparison with the reference.
#[cfg(test)]
pub(crate) mod testing {
    use super::*;
    use rand::{Rng, SeedableRng};

    /// A seeded generator for the tests' random blocks and activations.
    pub fn rng(seed: u64) -> rand_chacha::ChaCha8Rng {
        rand_chacha::ChaCha8Rng::seed_from_u64(seed)
    }

    /// `n` rows of `k` weights of `ty` (Q8_0, Q5_0, Q4_K or Q6_K): random bytes with their f16
    /// scale fields set to finite values in −0.05..0.05, so every quant value occurs.
    pub fn random_rows(ty: GgmlType, n: usize, k: usize, rng: &mut impl Rng) -> Vec<u8> {
        let mut w: Vec<u8> = (0..n * row_bytes(ty, k)).map(|_| rng.random()).collect();
        let scales: &[usize] = match ty {
            GgmlType::Q8_0 | GgmlType::Q5_0 => &[0],
            GgmlType::Q4_K => &[0, 2],
            GgmlType::Q6_K => &[208],
            other => panic!("random_rows: no block layout for {other}"),
        };
        for block in w.chunks_exact_mut(ty.type_size()) {
            for &o in scales {
                block[o..o + 2].copy_from_slice(&f16_bytes(rng, -0.05, 0.05));
            }
        }
        w
    }

    /// An f16 scale in `lo..hi`, as ggml stores `d`, little-endian.
    pub fn f16_bytes(rng: &mut impl Rng, lo: f32, hi: f32) -> [u8; 2] {
        half::f16::from_f32(rng.random_range(lo..hi)).to_le_bytes()
    }

    /// Checks `kernel` against [`gemv_rows_reference`] on `w` (`rows` rows of `cols`) and random
    /// x, within a relative error of 1e-5 of Σ|wᵢxᵢ| per row (the additions' order differs); a
    /// NaN anywhere fails. Then a NaN in x must come out as NaN in every row.
    pub fn check(ty: GgmlType, w: &[u8], rows: usize, cols: usize, seed: u64) {
        let mut r = rng(seed);
        let x: Vec<f32> = (0..cols).map(|_| r.random_range(-1.0..1.0)).collect();
        let mut got = vec![f32::NAN; rows];
        gemv_rows(ty, &mut got, w, &x);
        let mut want = vec![0.0; rows];
        gemv_rows_reference(ty, &mut want, w, &x);
        let mut decoded = vec![0.0; cols];
        for (i, (g, e)) in got.iter().zip(&want).enumerate() {
            decode_rows(
                ty,
                &w[i * row_bytes(ty, cols)..][..row_bytes(ty, cols)],
                &mut decoded,
            );
            let scale: f32 = decoded.iter().zip(&x).map(|(a, b)| (a * b).abs()).sum();
            let ok = (g - e).abs() <= 1e-5 * scale.max(1e-6);
            assert!(
                ok,
                "{ty} row {i} of {rows}x{cols}: kernel {g} vs reference {e}"
            );
        }
        let mut x_nan = x.clone();
        x_nan[cols / 2] = f32::NAN;
        gemv_rows(ty, &mut got, w, &x_nan);
        assert!(
            got.iter().all(|v| v.is_nan()),
            "{ty}: a NaN in x must propagate"
        );
    }
}

//! GEMV kernels over **encoded** weight rows: bf16, f16 and ggml's quantized blocks, read as
//! stored instead of decoded to f32 at load, so each token reads 2–8× fewer bytes of weights.
//!
//! One file per format, each with its block layout (from ggml-common.h), its SIMD kernel
//! (AVX-512 / AVX2 chosen at run time, [`crate::simd::isa`]) and tests against the plain
//! reference below on random blocks. The kernels keep the activations in f32: a block's values
//! are decoded in registers and multiplied into f32 accumulators, so a kernel differs from
//! "decode the row, then dot" only in the order of the additions (llama.cpp instead quantizes
//! the activations to 8 bits for integer dot products; kvlab trades that speed for accuracy).

/// The row pass of the two-byte formats' x86 kernels (bf16, f16: a row of `cols` elements is
/// `2·cols` bytes): runs `step` over the whole `STEP`-column chunks of N rows, prefetching the
/// same columns of the next N rows ([`prefetch`]), then over their zero-padded tail, and writes
/// each row's horizontal sum (`hsum`) of its two accumulators.
#[cfg(target_arch = "x86_64")]
macro_rules! rows_body {
    ($step:ident, $hsum:expr, $zero:expr, $STEP:expr, $N:ident, $out:ident, $w:ident, $x:ident) => {{
        const STEP: usize = $STEP;
        let n = $x.len();
        assert!($w.len() == $N * 2 * n && $out.len() == $N);
        let mut acc = [[$zero; 2]; $N];
        let mut i = 0;
        // The same columns of the next group of rows (see quant::prefetch).
        let ahead = $N * 2 * n;
        while i + STEP <= n {
            // SAFETY: i + STEP ≤ n, so STEP floats of x and STEP two-byte elements of every
            // row lie in bounds.
            unsafe {
                let pw: [*const u8; $N] = std::array::from_fn(|q| $w.as_ptr().add(2 * (q * n + i)));
                pw.iter()
                    .for_each(|p| crate::quant::prefetch(p.wrapping_add(ahead), 64));
                $step::<$N>(&mut acc, pw, $x.as_ptr().add(i));
            }
            i += STEP;
        }
        if i < n {
            let t = n - i;
            let mut xt = [0.0f32; STEP];
            xt[..t].copy_from_slice(&$x[i..]);
            let mut wt = [[0u8; 2 * STEP]; $N];
            for (q, wt) in wt.iter_mut().enumerate() {
                wt[..2 * t].copy_from_slice(&$w[2 * (q * n + i)..2 * (q + 1) * n]);
            }
            // SAFETY: the padded buffers (borrowed, not moved) hold exactly one step.
            unsafe { $step::<$N>(&mut acc, wt.each_ref().map(|b| b.as_ptr()), xt.as_ptr()) };
        }
        for (o, a) in $out.iter_mut().zip(&acc) {
            *o = $hsum(a);
        }
    }};
}

pub mod bf16;
pub mod f16;
pub mod q4_k;
pub mod q5_0;
pub mod q6_k;
pub mod q8_0;

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

/// Rows of W decoded to f32 into `out` (`rows × cols`), for the matrix-matrix path (prefill),
/// which decodes a block of rows once and reuses it for every token.
pub fn decode_rows(ty: GgmlType, w: &[u8], out: &mut [f32]) {
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
        decode_rows(ty, bytes, &mut row);
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
            super::decode_rows(kvlab_model::GgmlType::F16, &h.to_le_bytes(), &mut want);
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

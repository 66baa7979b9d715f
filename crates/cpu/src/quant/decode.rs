//! Encoded rows decoded to f32 with AVX-512, bit for bit what the reference dequantizer gives
//! (kvlab-gguf's port of ggml's `dequantize_row_*`, [`super::decode_rows_reference`]).
//!
//! The matrix-matrix paths of [`crate::linear`] (a prompt, a decode batch of 5 or more rows)
//! decode a tile of W's rows once and reuse it for every token. With the scalar reference that
//! decode cost more than the product at short prompts: Gemma 3 270M Q4_K_M took 56–68 ms for a
//! 4-token prompt (the row kernels, which decode in registers) and 172–196 ms for 5 tokens.
//! Here a block's quants are widened to 32-bit lanes, converted and scaled 16 at a time, with
//! the reference's operations in the reference's order (a multiply, then a subtraction for the
//! K-quants' minimum; no fused multiply-add), so every weight has the same bits either way and
//! the paths' results do not change.
//!
//! Formats without a kernel here, and CPUs without AVX-512F, take the reference.

use kvlab_model::GgmlType;
#[cfg(target_arch = "x86_64")]
use std::arch::x86_64::*;

/// Rows of W decoded to f32 into `out` (`rows × cols`, row-major), for the matrix-matrix paths,
/// which decode a block of rows once and reuse it for every token.
///
/// # Panics
/// If `w` is not exactly the bytes of `out.len()` elements of `ty` (whole blocks).
pub fn decode_rows(ty: GgmlType, w: &[u8], out: &mut [f32]) {
    #[cfg(target_arch = "x86_64")]
    if is_x86_feature_detected!("avx512f") {
        let bs = ty.block_size();
        let whole = out.len().is_multiple_of(bs) && w.len() == out.len() / bs * ty.type_size();
        assert!(
            whole,
            "quant::decode_rows: {} bytes are not {} {ty} weights",
            w.len(),
            out.len()
        );
        // SAFETY: the CPU has AVX-512F (checked); `w` holds exactly out.len() / bs blocks of
        // type_size bytes (asserted), which is what each decoder reads and writes.
        let done = unsafe { avx512::decode(ty, w, out) };
        if done {
            return;
        }
    }
    super::decode_rows_reference(ty, w, out);
}

/// IEEE binary16 bytes (little-endian) widened to f32, as the reference does it.
#[cfg(target_arch = "x86_64")]
#[inline(always)]
fn f16(lo: u8, hi: u8) -> f32 {
    half::f16::from_bits(u16::from_le_bytes([lo, hi])).to_f32()
}

#[cfg(target_arch = "x86_64")]
mod avx512 {
    use super::*;

    /// Decodes every block of `w` into `out`; false (nothing written) for a format without a
    /// decoder here.
    ///
    /// # Safety
    /// The CPU has AVX-512F; `w` is exactly the blocks of `out.len()` elements of `ty`.
    #[target_feature(enable = "avx512f")]
    pub unsafe fn decode(ty: GgmlType, w: &[u8], out: &mut [f32]) -> bool {
        // SAFETY: the caller's contract, for every arm; each block reads its own bytes and
        // writes its own elements.
        unsafe {
            match ty {
                GgmlType::Q8_0 => blocks::<34, 32>(w, out, q8_0),
                GgmlType::Q5_0 => blocks::<22, 32>(w, out, q5_0),
                GgmlType::Q4_K => blocks::<144, 256>(w, out, q4_k),
                GgmlType::Q6_K => blocks::<210, 256>(w, out, q6_k),
                GgmlType::BF16 => two_byte(w, out, bf16x16, |b| {
                    f32::from_bits(u32::from(u16::from_le_bytes(b)) << 16)
                }),
                GgmlType::F16 => two_byte(w, out, f16x16, |b| f16(b[0], b[1])),
                _ => return false,
            }
        }
        true
    }

    /// `block(b, y)` on every block of `BYTES` bytes and its `N` elements.
    ///
    /// # Safety
    /// `w` is out.len() / N blocks of BYTES bytes; `block` may read BYTES bytes at b and write
    /// N floats at y, and needs only AVX-512F.
    #[inline(always)]
    unsafe fn blocks<const BYTES: usize, const N: usize>(
        w: &[u8],
        out: &mut [f32],
        block: unsafe fn(*const u8, *mut f32),
    ) {
        for (b, y) in w.chunks_exact(BYTES).zip(out.chunks_exact_mut(N)) {
            // SAFETY: b is BYTES bytes, y N floats (chunks_exact).
            unsafe { block(b.as_ptr(), y.as_mut_ptr()) };
        }
    }

    /// The two-byte formats: `x16` on each 16 elements, `one` on the rest.
    ///
    /// # Safety
    /// `w` is 2·out.len() bytes; `x16` reads 32 bytes and writes 16 floats, AVX-512F only.
    #[inline(always)]
    unsafe fn two_byte(
        w: &[u8],
        out: &mut [f32],
        x16: unsafe fn(*const u8, *mut f32),
        one: impl Fn([u8; 2]) -> f32,
    ) {
        let mut ys = out.chunks_exact_mut(16);
        let mut bs = w.chunks_exact(32);
        for (y, b) in (&mut ys).zip(&mut bs) {
            // SAFETY: b is 32 bytes, y 16 floats (chunks_exact).
            unsafe { x16(b.as_ptr(), y.as_mut_ptr()) };
        }
        for (y, b) in ys
            .into_remainder()
            .iter_mut()
            .zip(bs.remainder().chunks_exact(2))
        {
            *y = one([b[0], b[1]]);
        }
    }

    /// 16 bf16 values: the top halves of 16 f32s.
    ///
    /// # Safety
    /// 32 bytes readable at b, 16 floats writable at y.
    #[target_feature(enable = "avx512f")]
    unsafe fn bf16x16(b: *const u8, y: *mut f32) {
        // SAFETY: the caller's contract.
        unsafe {
            let h = _mm512_cvtepu16_epi32(_mm256_loadu_si256(b.cast()));
            _mm512_storeu_ps(y, _mm512_castsi512_ps(_mm512_slli_epi32::<16>(h)));
        }
    }

    /// 16 f16 values (`vcvtph2ps`, exact).
    ///
    /// # Safety
    /// 32 bytes readable at b, 16 floats writable at y.
    #[target_feature(enable = "avx512f")]
    unsafe fn f16x16(b: *const u8, y: *mut f32) {
        // SAFETY: the caller's contract.
        unsafe { _mm512_storeu_ps(y, _mm512_cvtph_ps(_mm256_loadu_si256(b.cast()))) }
    }

    /// 16 unsigned bytes as f32 lanes.
    #[inline(always)]
    fn u8x16_ps(q: __m128i) -> __m512 {
        // SAFETY: only ever inlined into the decoders below, which enable AVX-512F.
        unsafe { _mm512_cvtepi32_ps(_mm512_cvtepu8_epi32(q)) }
    }

    /// Q8_0 (34 bytes: `d: f16`, `qs: [i8; 32]`): weight j = qs[j]·d.
    ///
    /// # Safety
    /// 34 bytes readable at b, 32 floats writable at y.
    #[target_feature(enable = "avx512f")]
    unsafe fn q8_0(b: *const u8, y: *mut f32) {
        // SAFETY: the caller's contract; the loads are bytes 2..18 and 18..34.
        unsafe {
            let d = _mm512_set1_ps(f16(*b, *b.add(1)));
            for h in 0..2 {
                let q = _mm512_cvtepi8_epi32(_mm_loadu_si128(b.add(2 + 16 * h).cast()));
                _mm512_storeu_ps(y.add(16 * h), _mm512_mul_ps(_mm512_cvtepi32_ps(q), d));
            }
        }
    }

    /// Q5_0 (22 bytes: `d: f16`, `qh: u32`, `qs[16]`): weight j < 16 is the low nibble of qs[j]
    /// plus 16 if bit j of qh is set, weight j + 16 the high nibble and bit j + 16; then
    /// (q − 16)·d.
    ///
    /// # Safety
    /// 22 bytes readable at b, 32 floats writable at y.
    #[target_feature(enable = "avx512f")]
    unsafe fn q5_0(b: *const u8, y: *mut f32) {
        // SAFETY: the caller's contract; qs is bytes 6..22.
        unsafe {
            let d = _mm512_set1_ps(f16(*b, *b.add(1)));
            let qh = u32::from_le_bytes([*b.add(2), *b.add(3), *b.add(4), *b.add(5)]);
            let qs = _mm_loadu_si128(b.add(6).cast());
            let nib = _mm_set1_epi8(0x0F);
            let halves = [
                (_mm_and_si128(qs, nib), qh as u16),
                (
                    _mm_and_si128(_mm_srli_epi16::<4>(qs), nib),
                    (qh >> 16) as u16,
                ),
            ];
            let sixteen = _mm512_set1_epi32(16);
            for (h, (q, bits)) in halves.into_iter().enumerate() {
                let q = _mm512_cvtepu8_epi32(q);
                let q = _mm512_mask_add_epi32(q, bits, q, sixteen);
                let q = _mm512_cvtepi32_ps(_mm512_sub_epi32(q, sixteen));
                _mm512_storeu_ps(y.add(16 * h), _mm512_mul_ps(q, d));
            }
        }
    }

    /// The 6-bit scale and min of Q4_K sub-block j (ggml's `get_scale_min_k4`; see q4_k.rs).
    #[inline(always)]
    fn scale_min_k4(j: usize, q: &[u8; 12]) -> (u8, u8) {
        if j < 4 {
            (q[j] & 63, q[j + 4] & 63)
        } else {
            (
                (q[j + 4] & 0x0F) | ((q[j - 4] >> 6) << 4),
                (q[j + 4] >> 4) | ((q[j] >> 6) << 4),
            )
        }
    }

    /// Q4_K (144 bytes: `d`, `dmin`, `scales[12]`, `qs[128]`; see q4_k.rs): in 64-weight chunk
    /// c, weight l is the low nibble of qs[32c + l] and weight 32 + l its high nibble, of
    /// sub-blocks 2c and 2c + 1; x = (d·sc)·q − dmin·m.
    ///
    /// # Safety
    /// 144 bytes readable at b, 256 floats writable at y.
    #[target_feature(enable = "avx512f")]
    unsafe fn q4_k(b: *const u8, y: *mut f32) {
        // SAFETY: the caller's contract; scales are bytes 4..16, qs 16..144.
        unsafe {
            let (d, dmin) = (f16(*b, *b.add(1)), f16(*b.add(2), *b.add(3)));
            let scales: [u8; 12] = std::ptr::read_unaligned(b.add(4).cast());
            let nib = _mm_set1_epi8(0x0F);
            for c in 0..4 {
                let sub = [2 * c, 2 * c + 1].map(|j| {
                    let (sc, m) = scale_min_k4(j, &scales);
                    (
                        _mm512_set1_ps(d * f32::from(sc)),
                        _mm512_set1_ps(dmin * f32::from(m)),
                    )
                });
                for h in 0..2 {
                    let qs = _mm_loadu_si128(b.add(16 + 32 * c + 16 * h).cast());
                    let lo = u8x16_ps(_mm_and_si128(qs, nib));
                    let hi = u8x16_ps(_mm_and_si128(_mm_srli_epi16::<4>(qs), nib));
                    for (k, q) in [lo, hi].into_iter().enumerate() {
                        let (d1, m1) = sub[k];
                        let v = _mm512_sub_ps(_mm512_mul_ps(d1, q), m1);
                        _mm512_storeu_ps(y.add(64 * c + 32 * k + 16 * h), v);
                    }
                }
            }
        }
    }

    /// Q6_K (210 bytes: `ql[128]`, `qh[64]`, `scales: [i8; 16]`, `d: f16`; see q6_k.rs): in
    /// half h, weight 32t + l takes its low 4 bits from ql[64h + l + 32(t & 1)] (low nibble for
    /// t < 2, high for t ≥ 2) and its top 2 from bits 2t..2t + 2 of qh[32h + l];
    /// x = (d·scale)·(q − 32), one scale per 16 weights.
    ///
    /// # Safety
    /// 210 bytes readable at b, 256 floats writable at y.
    #[target_feature(enable = "avx512f")]
    unsafe fn q6_k(b: *const u8, y: *mut f32) {
        // SAFETY: the caller's contract; ql is bytes 0..128, qh 128..192, scales 192..208,
        // d 208..210.
        unsafe {
            let d = f16(*b.add(208), *b.add(209));
            let (nib, two) = (_mm_set1_epi8(0x0F), _mm_set1_epi8(3));
            let thirty_two = _mm512_set1_epi32(32);
            for h in 0..2 {
                let (ql, qh, sc) = (b.add(64 * h), b.add(128 + 32 * h), b.add(192 + 8 * h));
                for g in 0..2 {
                    let la = _mm_loadu_si128(ql.add(16 * g).cast());
                    let lb = _mm_loadu_si128(ql.add(32 + 16 * g).cast());
                    let hb = _mm_loadu_si128(qh.add(16 * g).cast());
                    // Bits 2t..2t + 2 of qh, moved to bits 4..6 of each byte.
                    let top = |t: i32| {
                        let bits = match t {
                            0 => hb,
                            1 => _mm_srli_epi16::<2>(hb),
                            2 => _mm_srli_epi16::<4>(hb),
                            _ => _mm_srli_epi16::<6>(hb),
                        };
                        _mm_slli_epi16::<4>(_mm_and_si128(bits, two))
                    };
                    let quants = [
                        _mm_or_si128(_mm_and_si128(la, nib), top(0)),
                        _mm_or_si128(_mm_and_si128(lb, nib), top(1)),
                        _mm_or_si128(_mm_and_si128(_mm_srli_epi16::<4>(la), nib), top(2)),
                        _mm_or_si128(_mm_and_si128(_mm_srli_epi16::<4>(lb), nib), top(3)),
                    ];
                    for (t, q) in quants.into_iter().enumerate() {
                        let s = d * f32::from(*sc.add(g + 2 * t) as i8);
                        let q = _mm512_sub_epi32(_mm512_cvtepu8_epi32(q), thirty_two);
                        let v = _mm512_mul_ps(_mm512_set1_ps(s), _mm512_cvtepi32_ps(q));
                        _mm512_storeu_ps(y.add(128 * h + 32 * t + 16 * g), v);
                    }
                }
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use rand::Rng;

    /// Every decoder against the reference on random bytes (any scale, infinities and NaNs
    /// included, any quant), at lengths with and without a two-byte tail: the same bits, and
    /// NaN where the reference gives NaN.
    #[test]
    fn decoding_gives_the_reference_bits_for_every_format() {
        let mut rng = super::super::testing::rng(77);
        for ty in [
            GgmlType::Q8_0,
            GgmlType::Q5_0,
            GgmlType::Q4_K,
            GgmlType::Q6_K,
            GgmlType::BF16,
            GgmlType::F16,
        ] {
            let bs = ty.block_size();
            for blocks in [1, 2, 3, 40] {
                for tail in [0, 5] {
                    let n = blocks * bs + if bs == 1 { tail } else { 0 };
                    let w: Vec<u8> = (0..n / bs * ty.type_size()).map(|_| rng.random()).collect();
                    let mut got = vec![f32::NAN; n];
                    let mut want = vec![0.0; n];
                    decode_rows(ty, &w, &mut got);
                    super::super::decode_rows_reference(ty, &w, &mut want);
                    for (i, (g, e)) in got.iter().zip(&want).enumerate() {
                        let same = g.to_bits() == e.to_bits() || (g.is_nan() && e.is_nan());
                        assert!(same, "{ty} element {i} of {n}: {g} vs reference {e}");
                    }
                }
            }
        }
    }

    #[test]
    fn a_wrong_length_is_refused() {
        let r = std::panic::catch_unwind(|| {
            let mut out = vec![0.0; 32];
            decode_rows(GgmlType::Q8_0, &[0u8; 33], &mut out);
        });
        assert!(r.is_err());
    }
}

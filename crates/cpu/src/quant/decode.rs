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
pub(super) mod avx512 {
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
                GgmlType::Q8_0 => chunked::<Q8_0>(w, out),
                GgmlType::Q5_0 => chunked::<Q5_0>(w, out),
                GgmlType::Q4_K => chunked::<Q4K>(w, out),
                GgmlType::Q6_K => chunked::<Q6K>(w, out),
                GgmlType::BF16 => two_byte(w, out, bf16x16, |b| {
                    f32::from_bits(u32::from(u16::from_le_bytes(b)) << 16)
                }),
                GgmlType::F16 => two_byte(w, out, f16x16, |b| f16(b[0], b[1])),
                _ => return false,
            }
        }
        true
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

    /// A quantized format decoded 32 weights at a time into two 16-lane vectors: the store
    /// decoder above and the few-rows kernel (`super::super::few_rows`) share it.
    ///
    /// # Safety
    /// `prep` and `chunk` need AVX-512F and nothing more; each reads only its block's
    /// `BLOCK_BYTES` bytes.
    pub unsafe trait Chunks {
        /// Weights per block (a multiple of 32).
        const BLOCK: usize;
        /// Bytes per block.
        const BLOCK_BYTES: usize;
        /// What a block's chunks share (its scales), computed once per block.
        type Prep: Copy;
        /// The block's shared part.
        ///
        /// # Safety
        /// AVX-512F; BLOCK_BYTES bytes readable at b.
        unsafe fn prep(b: *const u8) -> Self::Prep;
        /// Weights 32c .. 32c + 32 of the block (c < BLOCK / 32), as the reference decodes
        /// them.
        ///
        /// # Safety
        /// As [`Self::prep`], `prep` being the block's.
        unsafe fn chunk(b: *const u8, prep: &Self::Prep, c: usize) -> [__m512; 2];
    }

    /// Every block of `w` decoded into `out` through `F`'s chunks.
    ///
    /// # Safety
    /// AVX-512F; `w` is out.len() / F::BLOCK blocks.
    #[target_feature(enable = "avx512f")]
    unsafe fn chunked<F: Chunks>(w: &[u8], out: &mut [f32]) {
        for (b, y) in w
            .chunks_exact(F::BLOCK_BYTES)
            .zip(out.chunks_exact_mut(F::BLOCK))
        {
            // SAFETY: b is one block, y its F::BLOCK floats (chunks_exact), c < BLOCK / 32.
            unsafe {
                let prep = F::prep(b.as_ptr());
                for c in 0..F::BLOCK / 32 {
                    let [lo, hi] = F::chunk(b.as_ptr(), &prep, c);
                    _mm512_storeu_ps(y.as_mut_ptr().add(32 * c), lo);
                    _mm512_storeu_ps(y.as_mut_ptr().add(32 * c + 16), hi);
                }
            }
        }
    }

    /// 16 bytes widened to i32 lanes as unsigned, then to f32.
    #[inline]
    #[target_feature(enable = "avx512f")]
    fn u8x16_ps(q: __m128i) -> __m512 {
        _mm512_cvtepi32_ps(_mm512_cvtepu8_epi32(q))
    }

    /// A format of 32 weights led by their f16 scale `d` (Q8_0, Q5_0), whose weight j is
    /// q_j·d: it gives its quants, the blanket [`Chunks`] scales them.
    ///
    /// # Safety
    /// `quants` needs AVX-512F and nothing more and reads only the block's bytes.
    pub unsafe trait Block32 {
        /// Bytes per block, `d`'s two included.
        const BLOCK_BYTES: usize;
        /// The block's 32 quants q_j as f32, weights 0..16 and 16..32.
        ///
        /// # Safety
        /// AVX-512F; BLOCK_BYTES bytes readable at b.
        unsafe fn quants(b: *const u8) -> [__m512; 2];
    }

    // SAFETY: AVX-512F only; `d` is bytes 0..2 and `quants` reads within the block
    // (Block32's contract).
    unsafe impl<F: Block32> Chunks for F {
        const BLOCK: usize = 32;
        const BLOCK_BYTES: usize = F::BLOCK_BYTES;
        /// `d` in every lane.
        type Prep = __m512;

        #[inline]
        #[target_feature(enable = "avx512f")]
        unsafe fn prep(b: *const u8) -> __m512 {
            // SAFETY: d is bytes 0..2 (the caller's contract).
            unsafe { _mm512_set1_ps(f16(*b, *b.add(1))) }
        }

        #[inline]
        #[target_feature(enable = "avx512f")]
        unsafe fn chunk(b: *const u8, d: &__m512, _: usize) -> [__m512; 2] {
            // SAFETY: the caller's contract.
            let [q0, q1] = unsafe { F::quants(b) };
            [_mm512_mul_ps(q0, *d), _mm512_mul_ps(q1, *d)]
        }
    }

    /// Q8_0 (34 bytes: `d: f16`, `qs: [i8; 32]`): weight j = qs[j]·d.
    pub struct Q8_0;

    // SAFETY: AVX-512F only; the loads are bytes 2..34 of the block.
    unsafe impl Block32 for Q8_0 {
        const BLOCK_BYTES: usize = 34;

        #[inline]
        #[target_feature(enable = "avx512f")]
        unsafe fn quants(b: *const u8) -> [__m512; 2] {
            // SAFETY: qs is bytes 2..34 (the caller's contract).
            let (q0, q1) = unsafe {
                (
                    _mm_loadu_si128(b.add(2).cast()),
                    _mm_loadu_si128(b.add(18).cast()),
                )
            };
            [
                _mm512_cvtepi32_ps(_mm512_cvtepi8_epi32(q0)),
                _mm512_cvtepi32_ps(_mm512_cvtepi8_epi32(q1)),
            ]
        }
    }

    /// Q5_0 (22 bytes: `d: f16`, `qh: u32`, `qs[16]`): weight j < 16 is the low nibble of qs[j]
    /// plus 16 if bit j of qh is set, weight j + 16 the high nibble and bit j + 16; then
    /// (q − 16)·d.
    pub struct Q5_0;

    // SAFETY: AVX-512F only; the loads are bytes 2..22 of the block.
    unsafe impl Block32 for Q5_0 {
        const BLOCK_BYTES: usize = 22;

        #[inline]
        #[target_feature(enable = "avx512f")]
        unsafe fn quants(b: *const u8) -> [__m512; 2] {
            // SAFETY: qh is bytes 2..6, qs 6..22 (the caller's contract).
            let (qh, qs) = unsafe {
                (
                    b.add(2).cast::<u32>().read_unaligned(),
                    _mm_loadu_si128(b.add(6).cast()),
                )
            };
            let nib = _mm_set1_epi8(0x0F);
            let sixteen = _mm512_set1_epi32(16);
            let lo = _mm512_cvtepu8_epi32(_mm_and_si128(qs, nib));
            let hi = _mm512_cvtepu8_epi32(_mm_and_si128(_mm_srli_epi16::<4>(qs), nib));
            let lo = _mm512_mask_add_epi32(lo, qh as u16, lo, sixteen);
            let hi = _mm512_mask_add_epi32(hi, (qh >> 16) as u16, hi, sixteen);
            [
                _mm512_cvtepi32_ps(_mm512_sub_epi32(lo, sixteen)),
                _mm512_cvtepi32_ps(_mm512_sub_epi32(hi, sixteen)),
            ]
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
    /// sub-blocks 2c and 2c + 1; x = (d·sc)·q − dmin·m. Chunk j (32 weights) is sub-block j.
    pub struct Q4K;

    // SAFETY: AVX-512F only; the loads are bytes 0..144 of the block.
    unsafe impl Chunks for Q4K {
        const BLOCK: usize = 256;
        const BLOCK_BYTES: usize = 144;
        /// (d·sc_j, dmin·m_j) of the 8 sub-blocks.
        type Prep = [(f32, f32); 8];

        #[inline]
        #[target_feature(enable = "avx512f")]
        unsafe fn prep(b: *const u8) -> [(f32, f32); 8] {
            // SAFETY: d, dmin and scales are bytes 0..16 (the caller's contract).
            let (d, dmin, scales) = unsafe {
                (
                    f16(*b, *b.add(1)),
                    f16(*b.add(2), *b.add(3)),
                    std::ptr::read_unaligned::<[u8; 12]>(b.add(4).cast()),
                )
            };
            let mut prep = [(0.0, 0.0); 8];
            for (j, p) in prep.iter_mut().enumerate() {
                let (sc, m) = scale_min_k4(j, &scales);
                *p = (d * f32::from(sc), dmin * f32::from(m));
            }
            prep
        }

        #[inline]
        #[target_feature(enable = "avx512f")]
        unsafe fn chunk(b: *const u8, prep: &[(f32, f32); 8], j: usize) -> [__m512; 2] {
            let c = j / 2;
            let (d1, m1) = (_mm512_set1_ps(prep[j].0), _mm512_set1_ps(prep[j].1));
            // SAFETY: qs is bytes 16..144; these are qs[32c..][..32].
            let (q0, q1) = unsafe {
                (
                    _mm_loadu_si128(b.add(16 + 32 * c).cast()),
                    _mm_loadu_si128(b.add(32 + 32 * c).cast()),
                )
            };
            let (q0, q1) = if j.is_multiple_of(2) {
                (q0, q1)
            } else {
                (_mm_srli_epi16::<4>(q0), _mm_srli_epi16::<4>(q1))
            };
            let nib = _mm_set1_epi8(0x0F);
            let q0 = u8x16_ps(_mm_and_si128(q0, nib));
            let q1 = u8x16_ps(_mm_and_si128(q1, nib));
            [
                _mm512_sub_ps(_mm512_mul_ps(d1, q0), m1),
                _mm512_sub_ps(_mm512_mul_ps(d1, q1), m1),
            ]
        }
    }

    /// Q6_K (210 bytes: `ql[128]`, `qh[64]`, `scales: [i8; 16]`, `d: f16`; see q6_k.rs): in
    /// half h, weight 32t + l takes its low 4 bits from ql[64h + l + 32(t & 1)] (low nibble for
    /// t < 2, high for t ≥ 2) and its top 2 from bits 2t..2t + 2 of qh[32h + l];
    /// x = (d·scale)·(q − 32), one scale per 16 weights. Chunk 4h + t is weights 128h + 32t...
    pub struct Q6K;

    // SAFETY: AVX-512F only; the loads are bytes 0..210 of the block.
    unsafe impl Chunks for Q6K {
        const BLOCK: usize = 256;
        const BLOCK_BYTES: usize = 210;
        /// d·scale of each 16 weights.
        type Prep = [f32; 16];

        #[inline]
        #[target_feature(enable = "avx512f")]
        unsafe fn prep(b: *const u8) -> [f32; 16] {
            // SAFETY: scales are bytes 192..208, d 208..210 (the caller's contract).
            let (d, scales) = unsafe {
                (
                    f16(*b.add(208), *b.add(209)),
                    std::ptr::read_unaligned::<[u8; 16]>(b.add(192).cast()),
                )
            };
            let mut prep = [0.0; 16];
            for (p, &s) in prep.iter_mut().zip(&scales) {
                *p = d * f32::from(s as i8);
            }
            prep
        }

        #[inline]
        #[target_feature(enable = "avx512f")]
        unsafe fn chunk(b: *const u8, scale: &[f32; 16], j: usize) -> [__m512; 2] {
            let (h, t) = (j / 4, j % 4);
            // SAFETY: ql is bytes 0..128, qh 128..192: these are ql[64h + 32(t & 1)..][..32]
            // and qh[32h..][..32].
            let (l0, l1, h0, h1) = unsafe {
                let ql = b.add(64 * h + 32 * (t & 1));
                let qh = b.add(128 + 32 * h);
                (
                    _mm_loadu_si128(ql.cast()),
                    _mm_loadu_si128(ql.add(16).cast()),
                    _mm_loadu_si128(qh.cast()),
                    _mm_loadu_si128(qh.add(16).cast()),
                )
            };
            let (l0, l1) = if t < 2 {
                (l0, l1)
            } else {
                (_mm_srli_epi16::<4>(l0), _mm_srli_epi16::<4>(l1))
            };
            // Bits 2t..2t + 2 of qh, moved to bits 4..6 of each byte.
            let (h0, h1) = match t {
                0 => (h0, h1),
                1 => (_mm_srli_epi16::<2>(h0), _mm_srli_epi16::<2>(h1)),
                2 => (_mm_srli_epi16::<4>(h0), _mm_srli_epi16::<4>(h1)),
                _ => (_mm_srli_epi16::<6>(h0), _mm_srli_epi16::<6>(h1)),
            };
            let (nib, two) = (_mm_set1_epi8(0x0F), _mm_set1_epi8(3));
            let q0 = _mm_or_si128(
                _mm_and_si128(l0, nib),
                _mm_slli_epi16::<4>(_mm_and_si128(h0, two)),
            );
            let q1 = _mm_or_si128(
                _mm_and_si128(l1, nib),
                _mm_slli_epi16::<4>(_mm_and_si128(h1, two)),
            );
            let thirty_two = _mm512_set1_epi32(32);
            let q0 = _mm512_cvtepi32_ps(_mm512_sub_epi32(_mm512_cvtepu8_epi32(q0), thirty_two));
            let q1 = _mm512_cvtepi32_ps(_mm512_sub_epi32(_mm512_cvtepu8_epi32(q1), thirty_two));
            // Weights 128h + 32t + 16g.. share scale 8h + 2t + g.
            let s = 8 * h + 2 * t;
            [
                _mm512_mul_ps(_mm512_set1_ps(scale[s]), q0),
                _mm512_mul_ps(_mm512_set1_ps(scale[s + 1]), q1),
            ]
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

    /// The two-byte formats give the `half` crate's f32 for every one of the 65,536 bit
    /// patterns (infinities, subnormals, both zeros bit for bit; a NaN as a NaN: the bf16
    /// widening keeps a signalling NaN's bits where `half` quiets it), at lengths that leave a
    /// tail after the 16-wide passes: what an f16 or bf16 KV cache's rows decode through
    /// (`crate::kv_store`).
    #[test]
    fn two_byte_formats_decode_every_bit_pattern_as_the_half_crate() {
        let all: Vec<u16> = (0..=u16::MAX).collect();
        for len in [all.len(), 17, 5] {
            let bits = &all[all.len() - len..];
            let bytes: &[u8] = bytemuck::cast_slice(bits);
            let mut out = vec![0.0f32; len];
            decode_rows(GgmlType::F16, bytes, &mut out);
            for (b, o) in bits.iter().zip(&out) {
                let want = half::f16::from_bits(*b).to_f32();
                assert_eq!(o.to_bits(), want.to_bits(), "f16 {b:#06x}");
            }
            decode_rows(GgmlType::BF16, bytes, &mut out);
            for (b, o) in bits.iter().zip(&out) {
                let want = half::bf16::from_bits(*b).to_f32();
                if want.is_nan() {
                    assert!(o.is_nan(), "bf16 {b:#06x}");
                } else {
                    assert_eq!(o.to_bits(), want.to_bits(), "bf16 {b:#06x}");
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

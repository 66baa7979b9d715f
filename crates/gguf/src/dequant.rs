//! Dequantization of ggml blocks to f32, one function per block format.
//!
//! Each `block_*` function below is a line-by-line port of the matching `dequantize_row_*` in
//! llama.cpp's `ggml/src/ggml-quants.c`, over the block layouts of `ggml/src/ggml-common.h`.
//! Every multi-byte field is little-endian (GGUF files are little-endian; ggml reads the structs
//! in place on little-endian hosts). The float operations are done in the same order as the C
//! code (e.g. Q6_K's `d * sc * q` is `(d * sc) * q`), so results agree with ggml's scalar path
//! bit for bit unless the C compiler contracts a multiply-add into an FMA.
//!
//! Layout convention: a tensor of ne = [ne0, ne1, ...] is ne1·... rows of ne0 elements, and
//! each row is a sequence of blocks; dequantized values come out in the same order, so the
//! result is row-major with the row (`ne0`, fastest-varying) axis last.

use rayon::prelude::*;

use crate::error::{GgufError, Result};
use crate::types::{GgmlType, QK_K};

/// Dequantizes `bytes` (whole blocks of `ty`) into a new vector of `n_elements` f32.
pub fn dequantize(ty: GgmlType, bytes: &[u8], n_elements: usize) -> Result<Vec<f32>> {
    let mut out = vec![0f32; checked_len(ty, bytes, n_elements, "<buffer>")?];
    dequantize_into(ty, bytes, &mut out)?;
    Ok(out)
}

/// Dequantizes `bytes` (whole blocks of `ty`) into `out`; `out.len()` must be a whole number of
/// blocks and `bytes.len()` exactly the bytes those blocks take.
pub fn dequantize_into(ty: GgmlType, bytes: &[u8], out: &mut [f32]) -> Result<()> {
    dequantize_named(ty, bytes, out, "<buffer>")
}

/// Checks that `bytes` holds exactly `n_elements` elements of `ty` and returns `n_elements`.
fn checked_len(ty: GgmlType, bytes: &[u8], n_elements: usize, name: &str) -> Result<usize> {
    let bad = |reason: String| GgufError::BadShape {
        tensor: name.to_string(),
        reason,
    };
    let need = ty.bytes_for(n_elements as u64).ok_or_else(|| {
        bad(format!(
            "{n_elements} elements is not a whole number of {ty} blocks of {}",
            ty.block_size()
        ))
    })?;
    if need != bytes.len() as u64 {
        return Err(bad(format!(
            "{n_elements} {ty} elements take {need} bytes but {} were given",
            bytes.len()
        )));
    }
    Ok(n_elements)
}

/// [`dequantize_into`] with the tensor's name for error messages.
pub(crate) fn dequantize_named(
    ty: GgmlType,
    bytes: &[u8],
    out: &mut [f32],
    name: &str,
) -> Result<()> {
    checked_len(ty, bytes, out.len(), name)?;
    let ts = ty.type_size();
    match ty {
        GgmlType::F32 => for_blocks(bytes, out, 1, ts, |b, y| {
            y[0] = f32::from_le_bytes([b[0], b[1], b[2], b[3]])
        }),
        GgmlType::F16 => for_blocks(bytes, out, 1, ts, |b, y| y[0] = f16(b, 0)),
        GgmlType::BF16 => for_blocks(bytes, out, 1, ts, |b, y| {
            // bf16 is the top half of an f32.
            y[0] = f32::from_bits(u32::from(u16::from_le_bytes([b[0], b[1]])) << 16)
        }),
        GgmlType::Q4_0 => for_blocks(bytes, out, 32, ts, block_q4_0),
        GgmlType::Q4_1 => for_blocks(bytes, out, 32, ts, block_q4_1),
        GgmlType::Q5_0 => for_blocks(bytes, out, 32, ts, block_q5_0),
        GgmlType::Q5_1 => for_blocks(bytes, out, 32, ts, block_q5_1),
        GgmlType::Q8_0 => for_blocks(bytes, out, 32, ts, block_q8_0),
        GgmlType::Q4_K => for_blocks(bytes, out, QK_K, ts, block_q4_k),
        GgmlType::Q5_K => for_blocks(bytes, out, QK_K, ts, block_q5_k),
        GgmlType::Q6_K => for_blocks(bytes, out, QK_K, ts, block_q6_k),
        GgmlType::Q8_K => for_blocks(bytes, out, QK_K, ts, block_q8_k),
        other => {
            return Err(GgufError::UnsupportedTensorType {
                tensor: name.to_string(),
                ggml_type: other,
            });
        }
    }
    Ok(())
}

/// Elements below which dequantization stays on the calling thread.
const PARALLEL_MIN_ELEMENTS: usize = 1 << 16;
/// Elements per parallel work item (rounded to whole blocks).
const CHUNK_ELEMENTS: usize = 1 << 14;

/// Runs `f(block_bytes, block_out)` over every block; in parallel (rayon) for large tensors.
/// `bytes` and `out` have been checked to hold the same number of whole blocks.
fn for_blocks<F>(bytes: &[u8], out: &mut [f32], block: usize, type_size: usize, f: F)
where
    F: Fn(&[u8], &mut [f32]) + Sync,
{
    let serial = |b: &[u8], o: &mut [f32]| {
        for (bb, oo) in b.chunks_exact(type_size).zip(o.chunks_exact_mut(block)) {
            f(bb, oo);
        }
    };
    if out.len() < PARALLEL_MIN_ELEMENTS {
        serial(bytes, out);
    } else {
        let blocks = (CHUNK_ELEMENTS / block).max(1);
        out.par_chunks_mut(blocks * block)
            .zip(bytes.par_chunks(blocks * type_size))
            .for_each(|(o, b)| serial(b, o));
    }
}

/// IEEE binary16 at `b[at..at + 2]` (little-endian) widened to f32 (exact).
#[inline]
fn f16(b: &[u8], at: usize) -> f32 {
    half::f16::from_bits(u16::from_le_bytes([b[at], b[at + 1]])).to_f32()
}

/// The 32 weights of a Q4_0/Q4_1/Q5_0/Q5_1 block, each `x(q)` of its quant q: the low 4 bits
/// of weight j < 16 are the low nibble of qs[j], those of weight j + 16 the high nibble, and its
/// 5th bit is bit j (j + 16) of `qh` (0 for the 4-bit formats).
fn block_32(qs: &[u8], qh: u32, y: &mut [f32], x: impl Fn(u32) -> f32) {
    for j in 0..16 {
        // Bit j moved to bit 4 (value 16), and bit j + 16 moved to bit 4.
        let xh0 = ((qh >> j) << 4) & 0x10;
        let xh1 = (qh >> (j + 12)) & 0x10;
        y[j] = x(u32::from(qs[j] & 0x0F) | xh0);
        y[j + 16] = x(u32::from(qs[j] >> 4) | xh1);
    }
}

/// block_q4_0 (18 bytes, 32 weights): `d: f16`, `qs[16]`; x = (q - 8)·d.
fn block_q4_0(b: &[u8], y: &mut [f32]) {
    let d = f16(b, 0);
    block_32(&b[2..18], 0, y, |q| (q as i32 - 8) as f32 * d);
}

/// block_q4_1 (20 bytes): `d: f16`, `m: f16`, `qs[16]`; x = q·d + m.
fn block_q4_1(b: &[u8], y: &mut [f32]) {
    let (d, m) = (f16(b, 0), f16(b, 2));
    block_32(&b[4..20], 0, y, |q| q as f32 * d + m);
}

/// block_q5_0 (22 bytes): `d: f16`, `qh: [u8; 4]` (a little-endian u32 holding the 5th bit of
/// each weight: bit j for weight j), `qs[16]` (low 4 bits as in Q4_0); x = (q - 16)·d.
fn block_q5_0(b: &[u8], y: &mut [f32]) {
    let d = f16(b, 0);
    let qh = u32::from_le_bytes([b[2], b[3], b[4], b[5]]);
    block_32(&b[6..22], qh, y, |q| (q as i32 - 16) as f32 * d);
}

/// block_q5_1 (24 bytes): `d: f16`, `m: f16`, `qh: [u8; 4]`, `qs[16]`; x = q·d + m.
fn block_q5_1(b: &[u8], y: &mut [f32]) {
    let (d, m) = (f16(b, 0), f16(b, 2));
    let qh = u32::from_le_bytes([b[4], b[5], b[6], b[7]]);
    block_32(&b[8..24], qh, y, |q| q as f32 * d + m);
}

/// block_q8_0 (34 bytes): `d: f16`, `qs: [i8; 32]`; x = q·d.
fn block_q8_0(b: &[u8], y: &mut [f32]) {
    let d = f16(b, 0);
    for (j, &q) in b[2..34].iter().enumerate() {
        y[j] = f32::from(q as i8) * d;
    }
}

/// The 6-bit scale and min of sub-block `j` (0..8) from the 12 packed bytes of Q4_K/Q5_K
/// (`get_scale_min_k4` in ggml-quants.c): sub-blocks 0..4 keep theirs in the low 6 bits of
/// q[j] and q[j + 4]; sub-blocks 4..8 keep 4 low bits in q[j + 4] and their top 2 bits in the
/// spare top bits of q[j - 4] (scale) and q[j] (min).
#[inline]
fn scale_min_k4(j: usize, q: &[u8]) -> (u8, u8) {
    if j < 4 {
        (q[j] & 63, q[j + 4] & 63)
    } else {
        (
            (q[j + 4] & 0x0F) | ((q[j - 4] >> 6) << 4),
            (q[j + 4] >> 4) | ((q[j] >> 6) << 4),
        )
    }
}

/// (d·scale, dmin·min) of sub-blocks 2c and 2c + 1, the two halves of 64-weight chunk c of a
/// Q4_K/Q5_K block (`d: f16`, `dmin: f16`, `scales[12]` first).
fn chunk_scales(b: &[u8], c: usize) -> [(f32, f32); 2] {
    let (d, min) = (f16(b, 0), f16(b, 2));
    [2 * c, 2 * c + 1].map(|j| {
        let (sc, m) = scale_min_k4(j, &b[4..16]);
        (d * f32::from(sc), min * f32::from(m))
    })
}

/// block_q4_K (144 bytes, 256 weights in 8 sub-blocks of 32): `d: f16`, `dmin: f16`,
/// `scales[12]` (8 six-bit scales and 8 six-bit mins), `qs[128]`. For each 64-weight chunk the
/// first 32 weights are the low nibbles of 32 bytes of qs and the next 32 the high nibbles;
/// x = (d·scale)·q − dmin·min.
fn block_q4_k(b: &[u8], y: &mut [f32]) {
    let qs = &b[16..144];
    for c in 0..4 {
        let q = &qs[32 * c..32 * c + 32];
        let [(d1, m1), (d2, m2)] = chunk_scales(b, c);
        let out = &mut y[64 * c..64 * c + 64];
        for l in 0..32 {
            out[l] = d1 * f32::from(q[l] & 0x0F) - m1;
            out[l + 32] = d2 * f32::from(q[l] >> 4) - m2;
        }
    }
}

/// block_q5_K (176 bytes): `d`, `dmin`, `scales[12]` as Q4_K, `qh[32]` (5th bits), `qs[128]`.
/// In chunk c (64 weights) the 5th bit of weight l is bit 2c of qh[l] and of weight l + 32 bit
/// 2c + 1; x = (d·scale)·(nibble + 16·bit) − dmin·min.
fn block_q5_k(b: &[u8], y: &mut [f32]) {
    let qh = &b[16..48];
    let qs = &b[48..176];
    for c in 0..4 {
        let ql = &qs[32 * c..32 * c + 32];
        let (u1, u2) = (1u8 << (2 * c), 2u8 << (2 * c));
        let [(d1, m1), (d2, m2)] = chunk_scales(b, c);
        let out = &mut y[64 * c..64 * c + 64];
        for l in 0..32 {
            let h1 = if qh[l] & u1 != 0 { 16 } else { 0 };
            let h2 = if qh[l] & u2 != 0 { 16 } else { 0 };
            out[l] = d1 * f32::from((ql[l] & 0x0F) + h1) - m1;
            out[l + 32] = d2 * f32::from((ql[l] >> 4) + h2) - m2;
        }
    }
}

/// block_q6_K (210 bytes, 256 weights in 16 groups of 16): `ql[128]` (low 4 bits), `qh[64]`
/// (high 2 bits), `scales: [i8; 16]` (one per 16 consecutive weights), `d: f16` (last!).
/// In each half h (128 weights), weight 32t + l (t = 0..4, l = 0..32) takes its low bits from
/// ql[64h + l + 32(t & 1)] (low nibble for t < 2, high for t >= 2) and its high bits from bits
/// 2t..2t+2 of qh[32h + l]; x = (d·scale)·(q − 32).
fn block_q6_k(b: &[u8], y: &mut [f32]) {
    let d = f16(b, 208);
    for h in 0..2 {
        let ql = &b[64 * h..64 * h + 64];
        let qh = &b[128 + 32 * h..128 + 32 * h + 32];
        let sc = &b[192 + 8 * h..192 + 8 * h + 8];
        let out = &mut y[128 * h..128 * h + 128];
        for l in 0..32 {
            let is = l / 16;
            let q1 = ((ql[l] & 0x0F) | ((qh[l] & 3) << 4)) as i8 - 32;
            let q2 = ((ql[l + 32] & 0x0F) | (((qh[l] >> 2) & 3) << 4)) as i8 - 32;
            let q3 = ((ql[l] >> 4) | (((qh[l] >> 4) & 3) << 4)) as i8 - 32;
            let q4 = ((ql[l + 32] >> 4) | (((qh[l] >> 6) & 3) << 4)) as i8 - 32;
            let s = |k: usize| f32::from(sc[k] as i8);
            out[l] = d * s(is) * f32::from(q1);
            out[l + 32] = d * s(is + 2) * f32::from(q2);
            out[l + 64] = d * s(is + 4) * f32::from(q3);
            out[l + 96] = d * s(is + 6) * f32::from(q4);
        }
    }
}

/// block_q8_K (292 bytes): `d: f32`, `qs: [i8; 256]`, `bsums: [i16; 16]` (unused here);
/// x = d·q.
fn block_q8_k(b: &[u8], y: &mut [f32]) {
    let d = f32::from_le_bytes([b[0], b[1], b[2], b[3]]);
    for (j, &q) in b[4..260].iter().enumerate() {
        y[j] = d * f32::from(q as i8);
    }
}

#[cfg(test)]
mod tests {
    //! Each format is checked on one hand-made block. The expected values are worked out by hand
    //! from the block definition (comments show the arithmetic), never by calling the code under
    //! test. f16 constants: 0x3C00 = 1.0, 0x3800 = 0.5, 0x3400 = 0.25, 0x4000 = 2.0,
    //! 0xBC00 = -1.0.
    use super::*;

    fn deq(ty: GgmlType, bytes: &[u8]) -> Vec<f32> {
        let n = bytes.len() / ty.type_size() * ty.block_size();
        dequantize(ty, bytes, n).unwrap()
    }

    #[test]
    fn f32_f16_bf16() {
        let mut b = Vec::new();
        for v in [1.5f32, -0.0, 3.25e-3] {
            b.extend_from_slice(&v.to_le_bytes());
        }
        assert_eq!(deq(GgmlType::F32, &b), [1.5, -0.0, 3.25e-3]);

        // 0x3C00 = 1.0, 0xC000 = -2.0, 0x7BFF = 65504 (largest f16), 0x0001 = 2^-24 (smallest
        // subnormal), 0x3555 = 0.333251953125.
        let h: Vec<u8> = [0x3C00u16, 0xC000, 0x7BFF, 0x0001, 0x3555]
            .iter()
            .flat_map(|v| v.to_le_bytes())
            .collect();
        assert_eq!(
            deq(GgmlType::F16, &h),
            [1.0, -2.0, 65504.0, 5.960_464_5e-8, 0.333_251_95]
        );

        // bf16: 0x3F80 = 1.0, 0xC040 = -3.0, 0x4049 = 3.140625.
        let h: Vec<u8> = [0x3F80u16, 0xC040, 0x4049]
            .iter()
            .flat_map(|v| v.to_le_bytes())
            .collect();
        assert_eq!(deq(GgmlType::BF16, &h), [1.0, -3.0, 3.140625]);
    }

    #[test]
    fn q8_0_block() {
        // d = 0.5; qs = [0, 1, -1, 127, -128, 2, 0, ...].
        let mut b = vec![0x00, 0x38];
        let mut qs = [0i8; 32];
        qs[1] = 1;
        qs[2] = -1;
        qs[3] = 127;
        qs[4] = -128;
        qs[5] = 2;
        qs[31] = -3;
        b.extend(qs.iter().map(|&q| q as u8));
        let mut e = [0f32; 32];
        e[1] = 0.5;
        e[2] = -0.5;
        e[3] = 63.5; // 127 * 0.5
        e[4] = -64.0; // -128 * 0.5
        e[5] = 1.0;
        e[31] = -1.5;
        assert_eq!(deq(GgmlType::Q8_0, &b), e);
    }

    #[test]
    fn q4_0_block() {
        // d = 2.0; qs[0] = 0x9F: low 15 -> (15-8)*2 = 14 at y[0], high 9 -> (9-8)*2 = 2 at y[16].
        // qs[1] = 0x08: low 8 -> 0 at y[1], high 0 -> (0-8)*2 = -16 at y[17]. Other qs = 0x88 -> 0.
        let mut b = vec![0x00, 0x40];
        let mut qs = [0x88u8; 16];
        qs[0] = 0x9F;
        qs[1] = 0x08;
        b.extend_from_slice(&qs);
        let mut e = [0f32; 32];
        e[0] = 14.0;
        e[16] = 2.0;
        e[1] = 0.0;
        e[17] = -16.0;
        assert_eq!(deq(GgmlType::Q4_0, &b), e);
    }

    #[test]
    fn q4_1_block() {
        // d = 0.5, m = -1.0; qs[0] = 0x1F: y[0] = 15*0.5 - 1 = 6.5, y[16] = 1*0.5 - 1 = -0.5.
        // Other qs = 0 -> -1.0.
        let mut b = vec![0x00, 0x38, 0x00, 0xBC];
        let mut qs = [0u8; 16];
        qs[0] = 0x1F;
        b.extend_from_slice(&qs);
        let mut e = [-1.0f32; 32];
        e[0] = 6.5;
        e[16] = -0.5;
        assert_eq!(deq(GgmlType::Q4_1, &b), e);
    }

    #[test]
    fn q5_0_block() {
        // d = 0.5. qh = 0xFFFE_FFFD (all 5th bits set except bit 1 and bit 16), stored
        // little-endian as FD FF FE FF. With qs = 0 and the 5th bit set, q = 16 -> (16-16)*d = 0.
        // qs[0] = 0x3A: y[0] = ((10 | 16) - 16) * 0.5 = 5.0; y[16] = (3 - 16) * 0.5 = -6.5
        //   (bit 16 clear). qs[1] = 0x00: y[1] = (0 - 16) * 0.5 = -8.0 (bit 1 clear);
        //   y[17] = ((0 | 16) - 16) * 0.5 = 0.
        let mut b = vec![0x00, 0x38, 0xFD, 0xFF, 0xFE, 0xFF];
        let mut qs = [0u8; 16];
        qs[0] = 0x3A;
        b.extend_from_slice(&qs);
        let mut e = [0f32; 32];
        e[0] = 5.0;
        e[16] = -6.5;
        e[1] = -8.0;
        e[17] = 0.0;
        assert_eq!(deq(GgmlType::Q5_0, &b), e);
    }

    #[test]
    fn q5_1_block() {
        // d = 0.25, m = 1.0, qh bytes 01 00 00 80 = bits 0 and 31.
        // y[0] = (0 | 16)*0.25 + 1 = 5.0; qs[15] = 0xF0: y[15] = 0*0.25 + 1 = 1.0 (bit 15 clear),
        // y[31] = (15 | 16)*0.25 + 1 = 8.75 (bit 31 set). Everything else 0*0.25 + 1 = 1.0.
        let mut b = vec![0x00, 0x34, 0x00, 0x3C, 0x01, 0x00, 0x00, 0x80];
        let mut qs = [0u8; 16];
        qs[15] = 0xF0;
        b.extend_from_slice(&qs);
        let mut e = [1.0f32; 32];
        e[0] = 5.0;
        e[31] = 8.75;
        assert_eq!(deq(GgmlType::Q5_1, &b), e);
    }

    #[test]
    fn q4_k_block() {
        // d = 1.0, dmin = 0.5. scales (12 bytes) = [2, 0x41, 0, 1, 3, 0x84, 0, 1, 0x21, 0x13, 0, 0]:
        //   sub 0: sc = 2,  m = 3           sub 4: sc = 0x21&15 = 1, m = 0x21>>4 = 2
        //   sub 1: sc = 0x41&63 = 1, m = 0x84&63 = 4
        //   sub 5: sc = (0x13&15) | (0x41>>6)<<4 = 3|16 = 19, m = (0x13>>4) | (0x84>>6)<<4 = 1|32 = 33
        //   sub 2: sc = 0, m = 0            sub 6: sc = 0, m = 0
        //   sub 3: sc = 1, m = 1            sub 7: sc = 0, m = 0
        // x = (1.0*sc)*q - 0.5*m. With q = 0 each sub-block is -0.5*m:
        //   [-1.5, -2.0, 0, -0.5, -1.0, -16.5, 0, 0].
        // Sub-blocks 2c and 2c+1 are the low and high nibbles of qs[32c..32c+32].
        //   qs[0] = 0x5F:  y[0] = 2*15 - 1.5 = 28.5;  y[32] = 1*5 - 2 = 3.0
        //   qs[63] = 0xF0: y[64+31] = 0*0 - 0 = 0;     y[96+31] = 1*15 - 0.5 = 14.5
        //   qs[65] = 0xA0: y[128+1] = 1*0 - 1 = -1.0;  y[160+1] = 19*10 - 16.5 = 173.5
        let mut b = vec![0x00, 0x3C, 0x00, 0x38];
        b.extend_from_slice(&[2, 0x41, 0, 1, 3, 0x84, 0, 1, 0x21, 0x13, 0, 0]);
        let mut qs = [0u8; 128];
        qs[0] = 0x5F;
        qs[63] = 0xF0;
        qs[65] = 0xA0;
        b.extend_from_slice(&qs);
        let base = [-1.5f32, -2.0, 0.0, -0.5, -1.0, -16.5, 0.0, 0.0];
        let mut e: Vec<f32> = (0..256).map(|i| base[i / 32]).collect();
        e[0] = 28.5;
        e[32] = 3.0;
        e[95] = 0.0;
        e[127] = 14.5;
        e[129] = -1.0;
        e[161] = 173.5;
        assert_eq!(deq(GgmlType::Q4_K, &b), e);
    }

    #[test]
    fn q5_k_block() {
        // d = 1.0, dmin = 0.5; scales: q[0..4] = 1 (sc = 1), q[4..8] = 2 (m = 2),
        // q[8..12] = 0x21 (sub 4..8: sc = 1, m = 2; top bits all 0). So x = q - 1.0 everywhere.
        // Chunk c uses 5th bits u1 = 1 << 2c (first 32) and u2 = 2 << 2c (next 32) of qh[l].
        //   qs[0] = 0x21, qh[0] = 0b10: y[0] = 1 + 0 - 1 = 0;  y[32] = 2 + 16 - 1 = 17
        //   qh[5] = 0x80 (u2 of chunk 3): y[192+32+5] = 0 + 16 - 1 = 15
        //   qs[64+3] = 0x0F: y[128+3] = 15 - 1 = 14
        // Everything else 0 - 1 = -1.
        let mut b = vec![0x00, 0x3C, 0x00, 0x38];
        b.extend_from_slice(&[1, 1, 1, 1, 2, 2, 2, 2, 0x21, 0x21, 0x21, 0x21]);
        let mut qh = [0u8; 32];
        qh[0] = 0b10;
        qh[5] = 0x80;
        b.extend_from_slice(&qh);
        let mut qs = [0u8; 128];
        qs[0] = 0x21;
        qs[67] = 0x0F;
        b.extend_from_slice(&qs);
        let mut e = vec![-1.0f32; 256];
        e[0] = 0.0;
        e[32] = 17.0;
        e[229] = 15.0;
        e[131] = 14.0;
        assert_eq!(deq(GgmlType::Q5_K, &b), e);
    }

    #[test]
    fn q6_k_block() {
        // Layout: ql[128] | qh[64] | scales[16] (i8) | d (f16) = 0.5.
        // scales per 16 consecutive weights g: [-4, 3, 1, 2, 5, -1, 7, -8, 6, 4, -2, -3, 10, -7, 8, 127].
        // With ql = qh = 0, q = 0 - 32 = -32 and x = (0.5*sc)*(-32) = -16*sc[g].
        // ql[0] = 0x3F, ql[32] = 0x00, qh[0] = 0xE4 = 0b11_10_01_00:
        //   y[0]:  (15 | 0<<4) - 32 = -17 -> 0.5*(-4)*(-17) = 34        (g 0)
        //   y[32]: (0 | 1<<4) - 32 = -16  -> 0.5*1*(-16) = -8          (g 2)
        //   y[64]: (3 | 2<<4) - 32 = 3    -> 0.5*5*3 = 7.5             (g 4)
        //   y[96]: (0 | 3<<4) - 32 = 16   -> 0.5*7*16 = 56             (g 6)
        // Second half: ql[64+17] = 0xF0, qh[32+17] = 0x30:
        //   y[128+64+17] = y[209]: (15 | 3<<4) - 32 = 31 -> 0.5*(-7)*31 = -108.5   (g 13)
        //   y[128+17] = y[145]: (0 | 0) - 32 -> -16*4 = -64 (the default for g 9)
        let scales: [i8; 16] = [-4, 3, 1, 2, 5, -1, 7, -8, 6, 4, -2, -3, 10, -7, 8, 127];
        let mut ql = [0u8; 128];
        ql[0] = 0x3F;
        ql[81] = 0xF0;
        let mut qh = [0u8; 64];
        qh[0] = 0xE4;
        qh[49] = 0x30;
        let mut b = Vec::new();
        b.extend_from_slice(&ql);
        b.extend_from_slice(&qh);
        b.extend(scales.iter().map(|&s| s as u8));
        b.extend_from_slice(&[0x00, 0x38]);
        assert_eq!(b.len(), 210);
        let mut e: Vec<f32> = (0..256)
            .map(|i| -16.0 * f32::from(scales[i / 16]))
            .collect();
        e[0] = 34.0;
        e[32] = -8.0;
        e[64] = 7.5;
        e[96] = 56.0;
        e[209] = -108.5;
        e[145] = -64.0;
        assert_eq!(deq(GgmlType::Q6_K, &b), e);
    }

    #[test]
    fn q8_k_block() {
        // d = 0.25 (f32); qs[0] = 4 -> 1.0, qs[255] = -128 -> -32.0; bsums are ignored.
        let mut b = 0.25f32.to_le_bytes().to_vec();
        let mut qs = [0u8; 256];
        qs[0] = 4;
        qs[255] = (-128i8) as u8;
        b.extend_from_slice(&qs);
        b.extend_from_slice(&[0xAB; 32]);
        let mut e = vec![0f32; 256];
        e[0] = 1.0;
        e[255] = -32.0;
        assert_eq!(deq(GgmlType::Q8_K, &b), e);
    }

    #[test]
    fn parallel_path_equals_serial_path() {
        // 4096 Q8_0 blocks (131072 elements, above PARALLEL_MIN_ELEMENTS): block i has d = 1.0
        // and qs[j] = (i + j) mod 256 as i8, so every output is (i + j) mod 256 as i8.
        let n_blocks = 4096;
        let mut b = Vec::with_capacity(n_blocks * 34);
        for i in 0..n_blocks {
            b.extend_from_slice(&[0x00, 0x3C]);
            b.extend((0..32).map(|j| ((i + j) % 256) as u8));
        }
        let y = deq(GgmlType::Q8_0, &b);
        for (k, v) in y.iter().enumerate() {
            let (i, j) = (k / 32, k % 32);
            assert_eq!(*v, f32::from(((i + j) % 256) as u8 as i8), "at {k}");
        }
    }

    #[test]
    fn length_mismatch_and_unsupported_type_are_errors() {
        let e = dequantize(GgmlType::Q8_0, &[0u8; 34], 31).unwrap_err();
        assert!(matches!(e, GgufError::BadShape { .. }), "{e}");
        let e = dequantize(GgmlType::Q8_0, &[0u8; 33], 32).unwrap_err();
        assert!(matches!(e, GgufError::BadShape { .. }), "{e}");
        let e = dequantize(GgmlType::IQ2_XXS, &[0u8; 66], 256).unwrap_err();
        assert!(
            matches!(
                e,
                GgufError::UnsupportedTensorType {
                    ggml_type: GgmlType::IQ2_XXS,
                    ..
                }
            ),
            "{e}"
        );
    }
}

//! ggml tensor types: their ids as stored in GGUF, and their block layout (how many elements one
//! block holds and how many bytes it takes).
//!
//! The ids follow `enum ggml_type` in llama.cpp's `ggml/include/ggml.h`; the sizes follow the
//! `block_*` structs in `ggml/src/ggml-common.h` (mirrored by `GGML_QUANT_SIZES` in
//! `gguf-py/gguf/constants.py`). Ids 4, 5 and 31..=33, 36..=38 were removed from ggml and are
//! rejected like any unknown id.

use std::fmt;

/// QK_K: elements per super-block of the k-quants (Q2_K..Q8_K).
pub const QK_K: usize = 256;

/// A ggml tensor element type.
#[allow(non_camel_case_types)]
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
#[non_exhaustive]
pub enum GgmlType {
    /// id 0: IEEE 754 f32; a block is 1 element in 4 bytes.
    F32,
    /// id 1: IEEE 754 half; 1 element in 2 bytes.
    F16,
    /// id 2: 32 elements in 18 bytes (`block_q4_0`): f16 scale d, 16 bytes of 4-bit quants;
    /// x = d·(q − 8).
    Q4_0,
    /// id 3: 32 elements in 20 bytes (`block_q4_1`): f16 d, f16 min m, 16 bytes of 4-bit quants;
    /// x = d·q + m.
    Q4_1,
    /// id 6: 32 elements in 22 bytes (`block_q5_0`): f16 d, 4 bytes of 5th bits, 16 bytes of low
    /// nibbles; x = d·(q − 16).
    Q5_0,
    /// id 7: 32 elements in 24 bytes (`block_q5_1`): f16 d, f16 m, 4 bytes of 5th bits, 16 bytes of
    /// low nibbles; x = d·q + m.
    Q5_1,
    /// id 8: 32 elements in 34 bytes (`block_q8_0`): f16 d, 32 i8 quants; x = d·q.
    Q8_0,
    /// id 9: 32 elements in 36 bytes (`block_q8_1`): f16 d, f16 s = d·Σq, 32 i8 quants; ggml's
    /// dot-product operand, not dequantized here.
    Q8_1,
    /// id 10: 256 elements in 84 bytes (`block_q2_K`): 16 bytes of 4-bit scales/mins, 64 bytes of
    /// 2-bit quants, f16 d, f16 dmin; not dequantized here.
    Q2_K,
    /// id 11: 256 elements in 110 bytes (`block_q3_K`): 32 bytes of high bits, 64 bytes of low 2
    /// bits, 12 bytes of 6-bit scales, f16 d; not dequantized here.
    Q3_K,
    /// id 12: 256 elements in 144 bytes (`block_q4_K`): f16 d, f16 dmin, 12 bytes of 6-bit
    /// scales/mins for 8 sub-blocks of 32, 128 bytes of 4-bit quants.
    Q4_K,
    /// id 13: 256 elements in 176 bytes (`block_q5_K`): f16 d, f16 dmin, 12 bytes of 6-bit
    /// scales/mins, 32 bytes of 5th bits, 128 bytes of low nibbles.
    Q5_K,
    /// id 14: 256 elements in 210 bytes (`block_q6_K`): 128 bytes of low nibbles, 64 bytes of high
    /// 2 bits, 16 i8 scales (sub-blocks of 16), f16 d.
    Q6_K,
    /// id 15: 256 elements in 292 bytes (`block_q8_K`): f32 d, 256 i8 quants, 16 i16 sums of 16
    /// quants each.
    Q8_K,
    /// id 16: 256 elements in 66 bytes (`block_iq2_xxs`): f16 d, 64 bytes of grid indices and
    /// signs; not dequantized here.
    IQ2_XXS,
    /// id 17: 256 elements in 74 bytes (`block_iq2_xs`): f16 d, 64 bytes of quants, 8 bytes of
    /// scales; not dequantized here.
    IQ2_XS,
    /// id 18: 256 elements in 98 bytes (`block_iq3_xxs`): f16 d, 96 bytes of grid indices, signs
    /// and scales; not dequantized here.
    IQ3_XXS,
    /// id 19: 256 elements in 50 bytes (`block_iq1_s`): f16 d, 32 bytes of grid indices, 16 bytes
    /// of high bits; not dequantized here.
    IQ1_S,
    /// id 20: 32 elements in 18 bytes (`block_iq4_nl`): f16 d, 16 bytes of 4-bit indices into a
    /// non-linear table; not dequantized here.
    IQ4_NL,
    /// id 21: 256 elements in 110 bytes (`block_iq3_s`): f16 d, 64 + 8 bytes of grid indices, 32
    /// bytes of signs, 4 bytes of scales; not dequantized here.
    IQ3_S,
    /// id 22: 256 elements in 82 bytes (`block_iq2_s`): f16 d, 64 bytes of quants and signs, 16
    /// bytes of high bits and scales; not dequantized here.
    IQ2_S,
    /// id 23: 256 elements in 136 bytes (`block_iq4_xs`): f16 d, u16 high scale bits, 4 bytes of
    /// low scale bits, 128 bytes of 4-bit indices; not dequantized here.
    IQ4_XS,
    /// id 24: i8; 1 element in 1 byte; not dequantized here.
    I8,
    /// id 25: i16; 1 element in 2 bytes; not dequantized here.
    I16,
    /// id 26: i32; 1 element in 4 bytes; not dequantized here.
    I32,
    /// id 27: i64; 1 element in 8 bytes; not dequantized here.
    I64,
    /// id 28: IEEE 754 f64; 1 element in 8 bytes; not dequantized here.
    F64,
    /// id 29: 256 elements in 56 bytes (`block_iq1_m`): 32 bytes of grid indices, 16 bytes of high
    /// bits, 8 bytes of scales (d packed in them); not dequantized here.
    IQ1_M,
    /// id 30: bfloat16 (the top half of an f32); 1 element in 2 bytes.
    BF16,
    /// id 34: ternary, 256 elements in 54 bytes (`block_tq1_0`): 52 bytes of base-3 packed trits,
    /// f16 d; not dequantized here.
    TQ1_0,
    /// id 35: ternary, 256 elements in 66 bytes (`block_tq2_0`): 64 bytes of 2-bit trits, f16 d;
    /// not dequantized here.
    TQ2_0,
    /// id 39: OCP microscaling FP4, 32 elements in 17 bytes (`block_mxfp4`): E8M0 shared exponent,
    /// 16 bytes of E2M1 nibbles; not dequantized here.
    MXFP4,
    /// id 40: 64 elements in 36 bytes: 4 bytes of per-16-element scales, 32 bytes of E2M1 nibbles;
    /// not dequantized here.
    NVFP4,
    /// id 41: 128 elements in 18 bytes: f16 d, 16 bytes of 1-bit quants; not dequantized here.
    Q1_0,
    /// id 42: 64 elements in 18 bytes: f16 d, 16 bytes of 2-bit quants; not dequantized here.
    Q2_0,
}

/// (type, ggml id, ggml name, elements per block, bytes per block)
const TABLE: &[(GgmlType, u32, &str, usize, usize)] = {
    use GgmlType::*;
    &[
        (F32, 0, "F32", 1, 4),
        (F16, 1, "F16", 1, 2),
        (Q4_0, 2, "Q4_0", 32, 2 + 16),
        (Q4_1, 3, "Q4_1", 32, 2 + 2 + 16),
        (Q5_0, 6, "Q5_0", 32, 2 + 4 + 16),
        (Q5_1, 7, "Q5_1", 32, 2 + 2 + 4 + 16),
        (Q8_0, 8, "Q8_0", 32, 2 + 32),
        (Q8_1, 9, "Q8_1", 32, 2 + 2 + 32),
        (Q2_K, 10, "Q2_K", QK_K, 2 + 2 + QK_K / 16 + QK_K / 4),
        (Q3_K, 11, "Q3_K", QK_K, 2 + QK_K / 4 + QK_K / 8 + 12),
        (Q4_K, 12, "Q4_K", QK_K, 2 + 2 + 12 + QK_K / 2),
        (Q5_K, 13, "Q5_K", QK_K, 2 + 2 + 12 + QK_K / 8 + QK_K / 2),
        (Q6_K, 14, "Q6_K", QK_K, QK_K / 2 + QK_K / 4 + QK_K / 16 + 2),
        (Q8_K, 15, "Q8_K", QK_K, 4 + QK_K + QK_K / 16 * 2),
        (IQ2_XXS, 16, "IQ2_XXS", QK_K, 2 + QK_K / 4),
        (IQ2_XS, 17, "IQ2_XS", QK_K, 2 + QK_K / 4 + QK_K / 32),
        (IQ3_XXS, 18, "IQ3_XXS", QK_K, 2 + QK_K / 4 + QK_K / 8),
        (IQ1_S, 19, "IQ1_S", QK_K, 2 + QK_K / 8 + QK_K / 16),
        (IQ4_NL, 20, "IQ4_NL", 32, 2 + 16),
        (
            IQ3_S,
            21,
            "IQ3_S",
            QK_K,
            2 + QK_K / 4 + QK_K / 8 + QK_K / 32 + 4,
        ),
        (IQ2_S, 22, "IQ2_S", QK_K, 2 + QK_K / 4 + QK_K / 16),
        (IQ4_XS, 23, "IQ4_XS", QK_K, 2 + 2 + QK_K / 2 + QK_K / 64),
        (I8, 24, "I8", 1, 1),
        (I16, 25, "I16", 1, 2),
        (I32, 26, "I32", 1, 4),
        (I64, 27, "I64", 1, 8),
        (F64, 28, "F64", 1, 8),
        (IQ1_M, 29, "IQ1_M", QK_K, QK_K / 8 + QK_K / 16 + QK_K / 32),
        (BF16, 30, "BF16", 1, 2),
        (TQ1_0, 34, "TQ1_0", QK_K, 2 + 4 * 13),
        (TQ2_0, 35, "TQ2_0", QK_K, 2 + 64),
        (MXFP4, 39, "MXFP4", 32, 1 + 16),
        (NVFP4, 40, "NVFP4", 64, 4 + 32),
        (Q1_0, 41, "Q1_0", 128, 2 + 16),
        (Q2_0, 42, "Q2_0", 64, 2 + 16),
    ]
};

impl GgmlType {
    fn row(self) -> &'static (GgmlType, u32, &'static str, usize, usize) {
        // Every variant has exactly one row (tested below), so the fallback is never taken.
        TABLE.iter().find(|r| r.0 == self).unwrap_or(&TABLE[0])
    }

    /// The type for a ggml type id, or `None` for an id ggml does not (or no longer) define.
    pub fn from_id(id: u32) -> Option<Self> {
        TABLE.iter().find(|r| r.1 == id).map(|r| r.0)
    }

    /// The ggml type id as stored in GGUF tensor infos.
    pub fn id(self) -> u32 {
        self.row().1
    }

    /// ggml's name for the type (`ggml_type_name`), e.g. `"Q4_K"`.
    pub fn name(self) -> &'static str {
        self.row().2
    }

    /// Elements per block (1 for plain types, 32 for Q8_0, 256 for the k-quants).
    pub fn block_size(self) -> usize {
        self.row().3
    }

    /// Bytes per block (`sizeof(block_q8_0)` = 34, ...).
    pub fn type_size(self) -> usize {
        self.row().4
    }

    /// Bytes taken by `n_elements` elements, or `None` when `n_elements` is not a whole number
    /// of blocks or the product overflows.
    pub fn bytes_for(self, n_elements: u64) -> Option<u64> {
        let bs = self.block_size() as u64;
        if n_elements % bs != 0 {
            return None;
        }
        (n_elements / bs).checked_mul(self.type_size() as u64)
    }

    /// All types this crate knows, in id order.
    pub fn all() -> impl Iterator<Item = GgmlType> {
        TABLE.iter().map(|r| r.0)
    }
}

impl fmt::Display for GgmlType {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        // pad (not write_str) so that width and alignment flags apply: `{:<5}`.
        f.pad(self.name())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ids_round_trip_and_are_unique() {
        for t in GgmlType::all() {
            assert_eq!(GgmlType::from_id(t.id()), Some(t));
            assert_eq!(TABLE.iter().filter(|r| r.0 == t).count(), 1, "{t}");
        }
        for removed in [4, 5, 31, 32, 33, 36, 37, 38, 43, 1000] {
            assert_eq!(GgmlType::from_id(removed), None);
        }
    }

    #[test]
    fn block_sizes_match_ggml_common_h() {
        // sizeof(block_*) from ggml-common.h's static_asserts.
        assert_eq!(GgmlType::Q4_0.type_size(), 18);
        assert_eq!(GgmlType::Q5_0.type_size(), 22);
        assert_eq!(GgmlType::Q8_0.type_size(), 34);
        assert_eq!(GgmlType::Q4_K.type_size(), 144);
        assert_eq!(GgmlType::Q5_K.type_size(), 176);
        assert_eq!(GgmlType::Q6_K.type_size(), 210);
        assert_eq!(GgmlType::Q8_K.type_size(), 292);
        assert_eq!(GgmlType::Q6_K.bytes_for(512), Some(420));
        assert_eq!(GgmlType::Q8_0.bytes_for(33), None);
    }
}

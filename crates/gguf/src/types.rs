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
    F32,
    F16,
    Q4_0,
    Q4_1,
    Q5_0,
    Q5_1,
    Q8_0,
    Q8_1,
    Q2_K,
    Q3_K,
    Q4_K,
    Q5_K,
    Q6_K,
    Q8_K,
    IQ2_XXS,
    IQ2_XS,
    IQ3_XXS,
    IQ1_S,
    IQ4_NL,
    IQ3_S,
    IQ2_S,
    IQ4_XS,
    I8,
    I16,
    I32,
    I64,
    F64,
    IQ1_M,
    BF16,
    TQ1_0,
    TQ2_0,
    MXFP4,
    NVFP4,
    Q1_0,
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

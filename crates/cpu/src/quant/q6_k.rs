//! Q6_K: super-blocks of 256 in 16 sub-blocks of 16 with int8 scales.
//!
//! For now the plain reference (decode each row, then dot); the SIMD kernel is to come.

use kvlab_model::GgmlType;

/// out (rows,) = W (rows, cols) @ x (cols,) for W's rows stored as Q6_K.
pub fn gemv_rows(out: &mut [f32], w: &[u8], x: &[f32]) {
    super::gemv_rows_reference(GgmlType::Q6_K, out, w, x);
}

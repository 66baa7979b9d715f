//! Q4_K: super-blocks of 256 in 8 sub-blocks of 32 with 6-bit scales and mins.
//!
//! For now the plain reference (decode each row, then dot); the SIMD kernel is to come.

use kvlab_model::GgmlType;

/// out (rows,) = W (rows, cols) @ x (cols,) for W's rows stored as Q4_K.
pub fn gemv_rows(out: &mut [f32], w: &[u8], x: &[f32]) {
    super::gemv_rows_reference(GgmlType::Q4_K, out, w, x);
}

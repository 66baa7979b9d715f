//! bfloat16: the top 16 bits of an f32.
//!
//! For now the plain reference (decode each row, then dot); the SIMD kernel is to come.

use kvlab_model::GgmlType;

/// out (rows,) = W (rows, cols) @ x (cols,) for W's rows stored as BF16.
pub fn gemv_rows(out: &mut [f32], w: &[u8], x: &[f32]) {
    super::gemv_rows_reference(GgmlType::BF16, out, w, x);
}

//! Q5_0: blocks of 32, an f16 scale d, 32 high bits and 32 low nibbles.
//!
//! For now the plain reference (decode each row, then dot); the SIMD kernel is to come.

use kvlab_model::GgmlType;

/// out (rows,) = W (rows, cols) @ x (cols,) for W's rows stored as Q5_0.
pub fn gemv_rows(out: &mut [f32], w: &[u8], x: &[f32]) {
    super::gemv_rows_reference(GgmlType::Q5_0, out, w, x);
}

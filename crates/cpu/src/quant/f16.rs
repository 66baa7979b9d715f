//! IEEE half precision.
//!
//! For now the plain reference (decode each row, then dot); the SIMD kernel is to come.

use kvlab_model::GgmlType;

/// out (rows,) = W (rows, cols) @ x (cols,) for W's rows stored as F16.
pub fn gemv_rows(out: &mut [f32], w: &[u8], x: &[f32]) {
    super::gemv_rows_reference(GgmlType::F16, out, w, x);
}

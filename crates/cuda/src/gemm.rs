//! Linear layers on cuBLAS: `Y (t, out) = X (t, in) @ Wᵀ` for weights stored row-major
//! `(out, in)`, all tokens of a step in one GEMM.
//!
//! cuBLAS is column-major. A row-major `(r, c)` matrix is the column-major `(c, r)` matrix with
//! leading dimension `c`, so the row-major product `Y = X Wᵀ` is, in cuBLAS's terms,
//! `Yᶜ (out, t) = Wᶜᵀ (out, in) · Xᶜ (in, t)`, where `Wᶜ` is W's memory read column-major,
//! `(in, out)`: `transa = T`, `transb = N`, `m = out`, `n = t`, `k = in`, `lda = in`,
//! `ldb = in`, `ldc = out`. [`linear_shape`] computes exactly these; it is unit-tested.
//!
//! `cublasGemmEx` with `CUBLAS_COMPUTE_32F`: f32 inputs multiply in true f32 (not TF32, which
//! needs `CUBLAS_COMPUTE_32F_FAST_TF32`), f16 inputs on tensor cores with f32 accumulation.

use cudarc::cublas::result as blas;
use cudarc::cublas::sys::{cublasComputeType_t, cublasGemmAlgo_t, cublasOperation_t};

use crate::dtype::DType;
use crate::error::Result;
use crate::launch::i32_of;
use crate::ops::{Dev, Ops};

/// cuBLAS arguments of one linear layer.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct GemmShape {
    /// `T`: W's memory, column-major (in, out), used transposed.
    pub transa: cublasOperation_t,
    /// `N`: X's memory, column-major (in, t), used as is.
    pub transb: cublasOperation_t,
    /// Rows of Yᶜ: out_dim.
    pub m: i32,
    /// Columns of Yᶜ: t, the step's tokens.
    pub n: i32,
    /// The reduced dimension: in_dim.
    pub k: i32,
    /// Leading dimension of W, in elements: in_dim.
    pub lda: i32,
    /// Leading dimension of X, in elements: in_dim.
    pub ldb: i32,
    /// Leading dimension of Y, in elements: out_dim.
    pub ldc: i32,
}

/// The column-major GEMM computing `Y (t, out) = X (t, in) @ Wᵀ`, W row-major `(out, in)`.
///
/// # Errors
/// A dimension beyond i32.
pub fn linear_shape(t: usize, in_dim: usize, out_dim: usize) -> Result<GemmShape> {
    let (t, i, o) = (
        i32_of("tokens", t)?,
        i32_of("in_dim", in_dim)?,
        i32_of("out_dim", out_dim)?,
    );
    Ok(GemmShape {
        transa: cublasOperation_t::CUBLAS_OP_T,
        transb: cublasOperation_t::CUBLAS_OP_N,
        m: o,
        n: t,
        k: i,
        lda: i,
        ldb: i,
        ldc: o,
    })
}

impl Ops {
    /// `y (t, out_dim) = x (t, in_dim) @ w (out_dim, in_dim)ᵀ` on cuBLAS, inputs of type `W`,
    /// output `Y`.
    ///
    /// # Errors
    /// A buffer shorter than its shape, or a cuBLAS error.
    pub fn linear<W: DType, Y: DType>(
        &self,
        y: Dev<Y>,
        x: Dev<W>,
        w: Dev<W>,
        t: usize,
        in_dim: usize,
        out_dim: usize,
    ) -> Result<()> {
        let s = linear_shape(t, in_dim, out_dim)?;
        let y = y.need(t * out_dim, "linear output")?;
        let x = x.need(t * in_dim, "linear input")?;
        let w = w.need(out_dim * in_dim, "linear weight")?;
        let (alpha, beta) = (1.0f32, 0.0f32);
        // SAFETY: the three pointers are live device allocations of this engine's stream, each
        // checked above to hold at least the elements the shape reads or writes (column-major
        // (k, m) for W, (k, n) for X, (m, n) for Y with the leading dimensions of `linear_shape`);
        // alpha and beta are host f32, matching CUBLAS_COMPUTE_32F in the default pointer mode.
        unsafe {
            blas::gemm_ex(
                *self.blas.handle(),
                s.transa,
                s.transb,
                s.m,
                s.n,
                s.k,
                (&alpha as *const f32).cast(),
                w as *const std::ffi::c_void,
                W::CUDA,
                s.lda,
                x as *const std::ffi::c_void,
                W::CUDA,
                s.ldb,
                (&beta as *const f32).cast(),
                y as *mut std::ffi::c_void,
                Y::CUDA,
                s.ldc,
                cublasComputeType_t::CUBLAS_COMPUTE_32F,
                cublasGemmAlgo_t::CUBLAS_GEMM_DEFAULT,
            )?;
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The column-major product the shape describes, evaluated on the host, equals the
    /// row-major `X Wᵀ`.
    #[test]
    fn linear_shape_is_row_major_x_times_w_transposed() {
        let (t, i, o) = (3, 4, 5);
        let x: Vec<f32> = (0..t * i).map(|v| v as f32 * 0.5 - 2.0).collect(); // (t, in)
        let w: Vec<f32> = (0..o * i).map(|v| (v as f32).sin()).collect(); // (out, in)
        let s = linear_shape(t, i, o).unwrap();
        assert_eq!((s.m, s.n, s.k, s.lda, s.ldb, s.ldc), (5, 3, 4, 4, 4, 5));
        assert_eq!(s.transa, cublasOperation_t::CUBLAS_OP_T);
        assert_eq!(s.transb, cublasOperation_t::CUBLAS_OP_N);
        // Column-major: A = Wᶜ with element (kk, mm) at kk + mm·lda; op(A) = Aᵀ is (m, k).
        let (m, n, k) = (s.m as usize, s.n as usize, s.k as usize);
        let mut c = vec![0.0f32; m * n];
        for mm in 0..m {
            for nn in 0..n {
                let mut acc = 0.0;
                for kk in 0..k {
                    acc += w[kk + mm * s.lda as usize] * x[kk + nn * s.ldb as usize];
                }
                c[mm + nn * s.ldc as usize] = acc;
            }
        }
        // c read row-major as (t, out) must be X Wᵀ.
        for r in 0..t {
            for col in 0..o {
                let want: f32 = (0..i).map(|kk| x[r * i + kk] * w[col * i + kk]).sum();
                assert!((c[r * o + col] - want).abs() < 1e-5);
            }
        }
        assert!(linear_shape(1 << 31, 1, 1).is_err());
    }
}

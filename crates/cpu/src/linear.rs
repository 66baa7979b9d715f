//! `Y (T, out) = X (T, in) @ Wᵀ` for a weight W stored (out, in) row-major, in f32 or encoded
//! (bf16, f16, ggml quantized blocks: [`crate::quant`]).
//!
//! One token (decode): a GEMV, each output row a SIMD dot product, rows split across threads.
//! A decode batch of 5 to 64 tokens on AVX-512: [`crate::skinny`]'s kernel, W read in place.
//! Many tokens (prefill, larger batches, CPUs without AVX-512): matrix-matrix products through the `gemm` crate (candle's
//! GEMM, AVX-512 kernels; measured faster than matrixmultiply's sgemm at these shapes, which stays
//! the reference GEMM of the tests and of `benches/benches/sgemm.rs`),
//! one block of output columns per worker thread, so the prompt is not processed token by token;
//! an encoded W is decoded one block of rows at a time into a scratch buffer for it.

use kvlab_model::{GgmlType, Tensor};

use crate::threads;
use crate::transpose::transpose;
use crate::{quant, simd, skinny};

/// A weight matrix (out, in) as the kernels see it.
#[derive(Clone, Copy)]
enum Weight<'a> {
    F32(&'a [f32]),
    /// Rows of `row_bytes` bytes of `ty`'s blocks.
    Encoded {
        ty: GgmlType,
        bytes: &'a [u8],
        row_bytes: usize,
    },
}

impl<'a> Weight<'a> {
    fn of(w: &'a Tensor, d_in: usize) -> Weight<'a> {
        match w.encoded() {
            None => Weight::F32(w),
            Some((ty, bytes)) => Weight::Encoded {
                ty,
                bytes,
                row_bytes: quant::row_bytes(ty, d_in),
            },
        }
    }

    /// out (n,) = W[r0 .. r0 + n] @ x, n = out.len().
    fn gemv_rows(self, out: &mut [f32], r0: usize, x: &[f32]) {
        let n = out.len();
        match self {
            Weight::F32(w) => simd::gemv_rows(out, &w[r0 * x.len()..][..n * x.len()], x),
            Weight::Encoded {
                ty,
                bytes,
                row_bytes,
            } => quant::gemv_rows(ty, out, &bytes[r0 * row_bytes..][..n * row_bytes], x),
        }
    }

    /// Rows r0 .. r0 + n as f32 (n, d_in): W itself, or decoded into `scratch`.
    fn rows_f32<'s>(self, r0: usize, n: usize, d_in: usize, scratch: &'s mut Vec<f32>) -> &'s [f32]
    where
        'a: 's,
    {
        match self {
            Weight::F32(w) => &w[r0 * d_in..][..n * d_in],
            Weight::Encoded {
                ty,
                bytes,
                row_bytes,
            } => {
                scratch.resize(n * d_in, 0.0);
                quant::decode_rows(ty, &bytes[r0 * row_bytes..][..n * row_bytes], scratch);
                scratch
            }
        }
    }
}

/// Below this many multiply-adds a GEMV runs on the calling thread: handing work to the other
/// threads costs a few µs, more than a small matrix takes.
const PAR_GEMV_MIN_WORK: usize = 1 << 15;
/// Rows of W a small-batch task keeps in L1 while it runs every x row over them.
const GEMV_ROWS_PER_TASK: usize = 32;

/// outs[m] (rows_m,) = W_m (rows_m, cols) @ x (cols,) for N matrices of one x (N = 1: a GEMV).
/// The matrices' rows, stacked as one, are split statically, one contiguous block per worker
/// thread (OpenMP's static schedule, as run.c's `#pragma omp parallel for`): one task per
/// thread, nothing to steal, and each thread reads its own part of the W's. Each row's output
/// is the row kernel's over x whatever the split.
///
/// # Panics
/// If an out is shorter than its W's rows (its length decides them) — never from `linear`.
fn gemv_stacked<const N: usize>(outs: [&mut [f32]; N], weights: [Weight; N], x: &[f32]) {
    let outs: [(threads::SendPtr<f32>, usize); N] =
        outs.map(|o| (threads::SendPtr(o.as_mut_ptr()), o.len()));
    let total: usize = outs.iter().map(|&(_, n)| n).sum();
    let threads = threads::num_threads();
    let per = if total * x.len() < PAR_GEMV_MIN_WORK || threads == 1 {
        total.max(1)
    } else {
        // A multiple of 4 rows: the kernel's pass.
        total.div_ceil(threads).next_multiple_of(4)
    };
    // Task i computes the stacked rows i·per .. (i + 1)·per, each matrix's part of them.
    threads::for_each_task(total.div_ceil(per), |i| {
        let (lo, hi) = (i * per, ((i + 1) * per).min(total));
        let mut base = 0;
        for (&(y, n), w) in outs.iter().zip(weights) {
            let (a, b) = (lo.max(base), hi.min(base + n));
            if a < b {
                // SAFETY: rows a − base .. b − base of outs[m], a slice of n ≥ b − base floats;
                // the tasks' stacked ranges are disjoint and each task index runs exactly
                // once, so no other task writes them, and the `&mut` slices this function was
                // given stay borrowed until every task has ended.
                let o = unsafe { std::slice::from_raw_parts_mut(y.get().add(a - base), b - a) };
                w.gemv_rows(o, a - base, x);
            }
            base += n;
        }
    });
}

/// Up to this many rows (where the skinny kernel does not take them), `linear` reads W once
/// and dots each of its rows with every x row (a decode batch, a short prompt); sgemm's packing
/// of W costs more than it saves there. On
/// the 2-core AMD EPYC (AVX-512), `cargo xtask bench`'s 16-sequence decode of the stories15M
/// shape went from 3,326 to 4,843 tok/s when 16 rows left this path for sgemm, and 8 rows were
/// as fast either way (2,721 and 2,830 tok/s); 16 had been chosen on the 2-core Xeon.
pub const SMALL_BATCH: usize = 8;

/// From this many rows, on AVX-512, `linear` uses the skinny kernel instead of the row-by-row
/// dot products. On the 2-core AMD EPYC, `kvlab batch` with 8 sequences went from about 2,500
/// to 3,200 tok/s with it and 6 sequences from about 2,100 to 2,450 (four interleaved runs
/// each); at 4 the two were within noise of each other, so 2 to 4 keep the GEMV's bits.
pub const SKINNY_MIN: usize = 5;

/// y (t, out) = x (t, in) @ Wᵀ with W (out, in). A quantized W whose products round the
/// activations to 8 bits ([`Tensor::activations`], `--activations q8`) takes the integer kernel
/// of [`quant::q8_act`] at every t where the CPU has AVX-512 VNNI. Otherwise: a GEMV for t = 1; on AVX-512, for a quantized W
/// (Q8_0, Q5_0, Q4_K, Q6_K) from 2 rows up to [`quant::few_rows::max_rows`], the few-rows kernel
/// (each block decoded once, in registers, for every row; no f32 copy of W, no empty lanes);
/// otherwise row-by-row dot products below [`SKINNY_MIN`] rows and the skinny kernel up to
/// [`skinny::MAX_T`]; elsewhere,
/// row-by-row dot products up to [`SMALL_BATCH`]; sgemm above. Either way a row's output does
/// not depend on the other rows (batch invariance): the dot products give, bit for bit, the
/// GEMV of that row alone, and the skinny and few-rows kernels give every row the same sum in
/// the same order whatever the other rows are.
pub fn linear(y: &mut [f32], x: &[f32], w: &Tensor, t: usize, d_in: usize, d_out: usize) {
    assert!(
        x.len() >= t * d_in && y.len() >= t * d_out && w.len() == d_out * d_in,
        "linear: shape mismatch"
    );
    if let Some((ty, bytes)) = q8_encoded(w) {
        let row_bytes = quant::row_bytes(ty, d_in);
        return q8_columns(y, &x[..t * d_in], (ty, bytes, row_bytes), t, d_in, d_out);
    }
    let w = Weight::of(w, d_in);
    let few =
        |ty| (2..=quant::few_rows::max_rows(ty)).contains(&t) && quant::few_rows::available(ty);
    if t == 1 {
        gemv_stacked([&mut y[..d_out]], [w], &x[..d_in]);
    } else if let Weight::Encoded {
        ty,
        bytes,
        row_bytes,
    } = w
        && few(ty)
    {
        few_columns(y, &x[..t * d_in], (ty, bytes, row_bytes), t, d_in, d_out);
    } else if (SKINNY_MIN..=skinny::MAX_T).contains(&t) && skinny::available() {
        skinny_columns(y, x, w, t, d_in, d_out);
    } else if t <= SMALL_BATCH {
        small_batch(y, &x[..t * d_in], w, t, d_in, d_out);
    } else {
        sgemm_columns(y, x, w, t, d_in, d_out);
    }
}

/// W's blocks where its products take the 8-bit-activation kernel ([`quant::q8_act`]).
fn q8_encoded(w: &Tensor) -> Option<(GgmlType, &[u8])> {
    let (ty, bytes) = w.encoded()?;
    (w.activations() == kvlab_model::Activations::Q8 && quant::q8_act::available(ty))
        .then_some((ty, bytes))
}

/// [`linear`] of the same x (t, in) through N matrices W_m (out_m, in): ys\[m\] (t, out_m) =
/// x @ W_mᵀ (q, k and v from one normalised x; gate and up). For one row (a decode step) the
/// matrices' rows are split among the threads as if they were stacked into one matrix, so the
/// step hands the team one job where N [`linear`] calls would hand it N, and each row's output
/// is [`linear`]'s, bit for bit (the same GEMV row kernel over the same x). Other steps, and
/// matrices that take the 8-bit-activation kernel, go through [`linear`] one by one.
///
/// # Panics
/// If `d_in` is 0, a W's length is not a multiple of `d_in`, or x or a y is shorter than the
/// shapes say.
pub fn linear_same_x<const N: usize>(
    ys: [&mut [f32]; N],
    x: &[f32],
    ws: [&Tensor; N],
    t: usize,
    d_in: usize,
) {
    assert!(
        d_in > 0 && ws.iter().all(|w| w.len().is_multiple_of(d_in)),
        "linear_same_x: a matrix is not (out, d_in)"
    );
    if t != 1 || ws.iter().any(|w| q8_encoded(w).is_some()) {
        for (y, w) in ys.into_iter().zip(ws) {
            linear(y, x, w, t, d_in, w.len() / d_in);
        }
        return;
    }
    assert!(
        x.len() >= d_in && ys.iter().zip(ws).all(|(y, w)| y.len() >= w.len() / d_in),
        "linear_same_x: shape mismatch"
    );
    let weights: [Weight; N] = std::array::from_fn(|m| Weight::of(ws[m], d_in));
    let mut m = 0;
    let ys = ys.map(|y| {
        let rows = ws[m].len() / d_in;
        m += 1;
        &mut y[..rows]
    });
    gemv_stacked(ys, weights, &x[..d_in]);
}

thread_local! {
    /// [`linear_to_rows`]' product (t, out) of this thread's last call, kept between calls: the
    /// logits of 32 sequences over a 32,000-token vocabulary are 4 MB, which a fresh allocation
    /// zeroed (and faulted in) every step.
    static ROWS_OUT: std::cell::RefCell<Vec<f32>> = const { std::cell::RefCell::new(Vec::new()) };
}

/// [`linear`] with each output row (out,) in a vector of its own, as the logits of a step's
/// sequences are returned: one product into a buffer this thread keeps (every element of which
/// the product writes), then the rows copied out, shared among the engine's threads.
pub fn linear_to_rows(x: &[f32], w: &Tensor, t: usize, d_in: usize, d_out: usize) -> Vec<Vec<f32>> {
    ROWS_OUT.with_borrow_mut(|y| {
        y.resize(t * d_out, 0.0);
        linear(y, x, w, t, d_in, d_out);
        // Allocated here, filled by the threads: a vector allocated on a helper would come from
        // its own malloc arena, which returns freed memory to the system, and every step would
        // fault its pages in again.
        let mut rows: Vec<Vec<f32>> = (0..t).map(|_| Vec::with_capacity(d_out)).collect();
        let per = t.div_ceil(threads::num_threads());
        let each = |i: usize, chunk: &mut [Vec<f32>]| {
            for (j, row) in chunk.iter_mut().enumerate() {
                row.extend_from_slice(&y[(i * per + j) * d_out..][..d_out]);
            }
        };
        if t * d_out < PAR_COPY_MIN {
            each(0, &mut rows);
        } else {
            threads::for_each_chunk_mut(&mut rows, per, each);
        }
        rows
    })
}

/// Below this many floats, [`linear_to_rows`] copies the rows out on the calling thread.
const PAR_COPY_MIN: usize = 1 << 16;

/// Columns of the output one sgemm task computes at least (and a multiple of 16, the widest
/// micro-kernel).
const SGEMM_MIN_COLS: usize = 64;

/// y (t, out) = x (t, in) @ Wᵀ by `gemm` (single-threaded calls), the output's columns (W's rows) split
/// into one contiguous block per worker thread: the engine's own threads do the work, so a
/// prefill step starts no other pool (`gemm_common::Parallelism::None`).
fn sgemm_columns(y: &mut [f32], x: &[f32], w: Weight, t: usize, d_in: usize, d_out: usize) {
    thread_local! {
        /// xᵀ (in, t) of the caller's current call; reused across calls.
        static X_T: std::cell::RefCell<Vec<f32>> = const { std::cell::RefCell::new(Vec::new()) };
    }
    // gemm's micro-kernel works down columns (16 rows of C per vector): it copies a row-major
    // lhs into column panels and stores a row-major C element by element, and those scalar
    // copies took about a fifth of a 100-token prefill. So it gets x transposed once here and
    // writes each task's block of C column-major into scratch, which the task transposes
    // into y (8 × 8 tiles in registers: crate::transpose).
    X_T.with_borrow_mut(|x_t| {
        x_t.resize(d_in * t, 0.0);
        assert!(x.len() >= t * d_in);
        // SAFETY: x holds t rows of d_in floats (asserted), x_t d_in rows of t.
        unsafe { transpose(x.as_ptr(), d_in, x_t.as_mut_ptr(), t, t, d_in) };
        sgemm_columns_t(y, x_t, w, t, d_in, d_out)
    })
}

/// [`sgemm_columns`] with x given transposed: x_t (in, t).
fn sgemm_columns_t(y: &mut [f32], x_t: &[f32], w: Weight, t: usize, d_in: usize, d_out: usize) {
    thread_local! {
        /// One block of W's rows decoded to f32, when W is encoded; reused across calls.
        static DECODED: std::cell::RefCell<Vec<f32>> = const { std::cell::RefCell::new(Vec::new()) };
        /// This task's block of yᵀ (n, t); reused across calls.
        static Y_T: std::cell::RefCell<Vec<f32>> = const { std::cell::RefCell::new(Vec::new()) };
    }
    let threads = threads::num_threads();
    let per = d_out
        .div_ceil(threads)
        .next_multiple_of(16)
        .max(SGEMM_MIN_COLS);
    let y_ptr = threads::SendPtr(y.as_mut_ptr());
    let block = |c0: usize| {
        DECODED.with_borrow_mut(|scratch| {
            Y_T.with_borrow_mut(|y_t| {
                let n = per.min(d_out - c0);
                let w = w.rows_f32(c0, n, d_in, scratch);
                y_t.resize(n * t, 0.0);
                // C (m=t, n) = A (m, k=in) · B (k, n) where B = W[c0..c0+n]ᵀ: B[k][j] = W[c0 + j][k],
                // row stride 1 and column stride `in`; C goes to y_t (n, t), then to columns
                // c0..c0+n of y.
                // SAFETY: x_t holds in·t floats, y_t n·t, linear's assert guarantees y spans t·out, and `w` is the n
                // rows c0..c0+n (n·in floats); this task writes only columns c0..c0+n of y's t rows,
                // which no other task writes (the blocks are disjoint), and `linear` holds `&mut y`.
                unsafe {
                    // gemm computes dst := alpha·dst + beta·lhs·rhs, and with read_dst = false it
                    // never reads dst. lhs = x (t, in) from x_t: column stride t, row stride 1;
                    // rhs = B (in, n): column stride in, row stride 1; dst = C (t, n) in y_t:
                    // column stride t, row stride 1. The f32 kernel itself, as the `gemm`
                    // facade calls it for these strides (all positive, dst's column stride not
                    // below its row stride, so the facade neither transposes nor flips).
                    gemm_f32::gemm::f32::get_gemm_fn()(
                        t,
                        n,
                        d_in,
                        y_t.as_mut_ptr(),
                        t as isize,
                        1,
                        false,
                        x_t.as_ptr(),
                        t as isize,
                        1,
                        w.as_ptr(),
                        d_in as isize,
                        1,
                        0.0,
                        1.0,
                        false,
                        false,
                        false,
                        gemm_common::Parallelism::None,
                    );
                    // y[i][c0 + j] = y_t[j][i]: this task's columns of y, which no other task
                    // writes.
                    transpose(y_t.as_ptr(), t, y_ptr.get().add(c0), d_out, n, t);
                }
            })
        })
    };
    // One block per thread; `for_each_task` runs a single block on the caller.
    threads::for_each_task(d_out.div_ceil(per), |i| block(i * per));
}

/// y (t, out) = x (t, in) @ Wᵀ for a quantized W = (type, bytes, bytes per row) and a few rows
/// by [`quant::few_rows`], W's rows split into one contiguous block per worker thread, each task
/// writing its own columns of y.
fn few_columns(
    y: &mut [f32],
    x: &[f32],
    (ty, bytes, row_bytes): (GgmlType, &[u8], usize),
    t: usize,
    d_in: usize,
    d_out: usize,
) {
    let threads = threads::num_threads();
    let per = d_out
        .div_ceil(threads)
        .next_multiple_of(quant::few_rows::ROWS);
    let y_ptr = threads::SendPtr(y.as_mut_ptr());
    threads::for_each_task(d_out.div_ceil(per), |i| {
        let (c0, n) = (i * per, per.min(d_out - i * per));
        let rows = &bytes[c0 * row_bytes..][..n * row_bytes];
        // SAFETY: `linear` asserted y spans t·out floats; this task writes columns c0..c0 + n
        // of its t rows (stride out), which no other task writes, and `linear` holds `&mut y`.
        unsafe { quant::few_rows::rows_raw(y_ptr.get().add(c0), d_out, x, t, (ty, rows), d_in, n) };
    });
}

/// y (t, out) = x (t, in) @ Wᵀ with x rounded to 8 bits ([`quant::q8_act`], `--activations
/// q8`): x rounded once on the calling thread, then W's rows split into one contiguous block per
/// worker thread, each task writing its own columns of y. Every t takes this path, so a token's
/// row is the same in every batch.
fn q8_columns(
    y: &mut [f32],
    x: &[f32],
    (ty, bytes, row_bytes): (GgmlType, &[u8], usize),
    t: usize,
    d_in: usize,
    d_out: usize,
) {
    thread_local! {
        /// The rounded x of the caller's current call; reused across calls.
        static X_Q8: std::cell::RefCell<quant::q8_act::Q8Rows> =
            std::cell::RefCell::new(quant::q8_act::Q8Rows::default());
    }
    X_Q8.with_borrow_mut(|xq| {
        xq.quantize(x, t, d_in);
        let xq: &quant::q8_act::Q8Rows = xq;
        let threads = if d_out * d_in * t < PAR_GEMV_MIN_WORK {
            1
        } else {
            threads::num_threads()
        };
        let per = d_out
            .div_ceil(threads)
            .next_multiple_of(quant::q8_act::ROWS);
        let y_ptr = threads::SendPtr(y.as_mut_ptr());
        threads::for_each_task(d_out.div_ceil(per), |i| {
            let (c0, n) = (i * per, per.min(d_out - i * per));
            let rows = &bytes[c0 * row_bytes..][..n * row_bytes];
            // SAFETY: `linear` asserted y spans t·out floats; this task writes columns c0..c0 + n
            // of its t rows (stride out), which no other task writes, and `linear` holds `&mut y`.
            unsafe { quant::q8_act::rows_raw(y_ptr.get().add(c0), d_out, xq, (ty, rows), n) };
        });
    })
}

/// W rows an encoded weight is decoded by at a time for [`skinny_columns`] (36 KiB of f32 at
/// in = 288: L1/L2 while the kernel runs over them).
const SKINNY_DECODE_ROWS: usize = 32;

/// y (t, out) = x (t, in) @ Wᵀ for a decode batch ([`SKINNY_MIN`] ≤ t ≤ [`skinny::MAX_T`], on
/// AVX-512) by [`skinny::rows`]: x transposed once, W's rows split into one contiguous block per
/// worker thread and read in place (an encoded W decoded [`SKINNY_DECODE_ROWS`] at a time), each
/// task writing its own columns of y. On the 2-core AMD EPYC the stories15M classifier at t = 32
/// ran at 246 GFLOP/s on one thread this way against 203 through `gemm` (whose packing of x and
/// transposes of C cost more than they save at this size).
fn skinny_columns(y: &mut [f32], x: &[f32], w: Weight, t: usize, d_in: usize, d_out: usize) {
    thread_local! {
        /// x_t of the caller's current call ([`skinny::transpose_x`]); reused across calls.
        static X_T: std::cell::RefCell<Vec<f32>> = const { std::cell::RefCell::new(Vec::new()) };
        /// [`SKINNY_DECODE_ROWS`] rows of an encoded W as f32; reused across calls.
        static DECODED: std::cell::RefCell<Vec<f32>> = const { std::cell::RefCell::new(Vec::new()) };
    }
    X_T.with_borrow_mut(|x_t| {
        skinny::transpose_x(&x[..t * d_in], t, d_in, x_t);
        let x_t: &[f32] = x_t;
        let threads = threads::num_threads();
        let per = d_out.div_ceil(threads).next_multiple_of(skinny::ROWS);
        let y_ptr = threads::SendPtr(y.as_mut_ptr());
        let block = |c0: usize| {
            let n = per.min(d_out - c0);
            DECODED.with_borrow_mut(|scratch| {
                let chunk = match w {
                    Weight::F32(_) => n,
                    Weight::Encoded { .. } => SKINNY_DECODE_ROWS,
                };
                for r0 in (c0..c0 + n).step_by(chunk) {
                    let m = chunk.min(c0 + n - r0);
                    let rows = w.rows_f32(r0, m, d_in, scratch);
                    // SAFETY: `linear` asserted y spans t·out floats; this task writes columns
                    // r0..r0 + m of its t rows (stride out), inside its own block c0..c0 + n,
                    // which no other task writes, and `linear` holds `&mut y`.
                    unsafe { skinny::rows_raw(y_ptr.get().add(r0), d_out, x_t, t, rows, d_in, m) };
                }
            })
        };
        // One block per thread; `for_each_task` runs a single block on the caller.
        threads::for_each_task(d_out.div_ceil(per), |i| block(i * per));
    })
}

/// y (t, out) = x (t, in) @ Wᵀ for a few rows: a task takes [`GEMV_ROWS_PER_TASK`] rows of W
/// and runs the GEMV kernel of every x row over them while they sit in L1, so W is read from
/// memory once per step for the whole batch. Each output is the GEMV's, bit for bit.
fn small_batch(y: &mut [f32], x: &[f32], w: Weight, t: usize, d_in: usize, d_out: usize) {
    const R: usize = GEMV_ROWS_PER_TASK;
    thread_local! {
        /// (ceil(out / R), t, R): task c's outputs for every x row, reused across calls.
        static SCRATCH: std::cell::RefCell<Vec<f32>> = const { std::cell::RefCell::new(Vec::new()) };
    }
    SCRATCH.with_borrow_mut(|scratch| {
        scratch.clear();
        scratch.resize(t * d_out, 0.0);
        let work = |c: usize, out: &mut [f32]| {
            let n = out.len() / t; // W rows of this task (R, or fewer in the last one)
            for (o, xr) in out.chunks_exact_mut(n).zip(x.chunks_exact(d_in)) {
                w.gemv_rows(o, c * R, xr);
            }
        };
        if d_out * d_in * t < PAR_GEMV_MIN_WORK {
            scratch
                .chunks_mut(t * R)
                .enumerate()
                .for_each(|(c, out)| work(c, out));
        } else {
            threads::for_each_chunk_mut(scratch, t * R, work);
        }
        for (c, out) in scratch.chunks(t * R).enumerate() {
            let n = out.len() / t;
            for (r, o) in out.chunks_exact(n).enumerate() {
                y[r * d_out + c * R..][..n].copy_from_slice(o);
            }
        }
    });
}

#[cfg(test)]
mod tests {
    use super::*;
    use rand::{Rng, SeedableRng};

    /// n values drawn uniformly from [−1, 1).
    fn uniform(rng: &mut impl Rng, n: usize) -> Vec<f32> {
        (0..n).map(|_| rng.random_range(-1.0..1.0)).collect()
    }

    /// `got` and `want`, both (t, d_out) products of x (t, d_in) with w (d_out, d_in), agree
    /// within 1e-5 of each product's Σ_k |w[j][k]·x[r][k]| (the size of its rounding).
    fn assert_near_dots(got: &[f32], want: &[f32], w: &[f32], x: &[f32], d_in: usize, what: &str) {
        let d_out = w.len() / d_in;
        for (i, (a, b)) in got.iter().zip(want).enumerate() {
            let (r, j) = (i / d_out, i % d_out);
            let scale: f32 = (0..d_in)
                .map(|k| (w[j * d_in + k] * x[r * d_in + k]).abs())
                .sum();
            assert!(
                (a - b).abs() <= 1e-5 * scale.max(1e-6),
                "{what} y[{r}][{j}]: {a} vs {b}"
            );
        }
    }

    #[test]
    fn a_row_of_a_small_batch_equals_its_gemv_bit_for_bit() {
        // Batch invariance at the bit level: a decode row does not depend on its batch-mates.
        let mut rng = rand_chacha::ChaCha8Rng::seed_from_u64(9);
        let (d_in, d_out) = (288, 1000);
        let w: Tensor = uniform(&mut rng, d_out * d_in).into();
        for t in 2..=SMALL_BATCH {
            if t >= SKINNY_MIN && skinny::available() {
                continue; // the skinny kernel's rows: see the next test
            }
            let x: Vec<f32> = uniform(&mut rng, t * d_in);
            let mut y = vec![f32::NAN; t * d_out];
            linear(&mut y, &x, &w, t, d_in, d_out);
            for r in 0..t {
                let mut alone = vec![0.0; d_out];
                linear(&mut alone, &x[r * d_in..(r + 1) * d_in], &w, 1, d_in, d_out);
                assert!(
                    y[r * d_out..(r + 1) * d_out]
                        .iter()
                        .zip(&alone)
                        .all(|(a, b)| a.to_bits() == b.to_bits()),
                    "t={t} row {r}"
                );
            }
        }
    }

    #[test]
    fn a_row_of_a_skinny_batch_is_the_same_in_every_batch_bit_for_bit() {
        // Batch invariance for the skinny kernel's sizes: a row computed among 5, 17, 32, 33 or
        // 64 rows (one token block or two, first or last) gives the same bits.
        if !skinny::available() {
            eprintln!("skipping: this CPU has no AVX-512F");
            return;
        }
        let mut rng = rand_chacha::ChaCha8Rng::seed_from_u64(10);
        let (d_in, d_out) = (288, 300);
        let w: Tensor = uniform(&mut rng, d_out * d_in).into();
        let row: Vec<f32> = uniform(&mut rng, d_in);
        let mut first: Option<Vec<f32>> = None;
        for (t, at) in [
            (5, 0),
            (5, 4),
            (17, 16),
            (32, 31),
            (33, 32),
            (64, 40),
            (64, 63),
        ] {
            let mut x: Vec<f32> = uniform(&mut rng, t * d_in);
            x[at * d_in..(at + 1) * d_in].copy_from_slice(&row);
            let mut y = vec![f32::NAN; t * d_out];
            linear(&mut y, &x, &w, t, d_in, d_out);
            let got = y[at * d_out..(at + 1) * d_out].to_vec();
            let want = first.get_or_insert_with(|| got.clone());
            assert!(
                got.iter()
                    .zip(want.iter())
                    .all(|(a, b)| a.to_bits() == b.to_bits()),
                "t={t} row {at}"
            );
        }
    }

    #[test]
    fn linear_to_rows_is_linear_row_by_row_at_every_size() {
        // Above PAR_COPY_MIN the rows are copied out by the threads; the kept buffer is reused
        // larger, then smaller, then larger again.
        let mut rng = rand_chacha::ChaCha8Rng::seed_from_u64(11);
        let (d, vocab) = (16, 1000);
        let w: Tensor = uniform(&mut rng, vocab * d).into();
        for b in [70, 1, 3, 70, 20] {
            let xl: Vec<f32> = uniform(&mut rng, b * d);
            let got = linear_to_rows(&xl, &w, b, d, vocab);
            let mut want = vec![f32::NAN; b * vocab];
            linear(&mut want, &xl, &w, b, d, vocab);
            assert_eq!(got.len(), b);
            for (r, row) in got.iter().enumerate() {
                let want = &want[r * vocab..(r + 1) * vocab];
                assert!(
                    row.len() == vocab
                        && row
                            .iter()
                            .zip(want)
                            .all(|(a, b)| a.to_bits() == b.to_bits()),
                    "b={b} row {r}"
                );
            }
        }
    }

    #[test]
    fn linear_matches_the_scalar_reference_for_one_and_many_tokens() {
        let mut rng = rand_chacha::ChaCha8Rng::seed_from_u64(5);
        for (t, d_in, d_out) in [
            (1, 64, 172),
            (1, 288, 32000),
            (3, 64, 172),
            (17, 288, 288),
            (33, 96, 1000), // sgemm split into column blocks, the last one short
            (1, 5, 3),
        ] {
            let x: Vec<f32> = uniform(&mut rng, t * d_in);
            let w: Tensor = uniform(&mut rng, d_out * d_in).into();
            let mut y = vec![f32::NAN; t * d_out]; // poisoned: every element must be written
            linear(&mut y, &x, &w, t, d_in, d_out);
            let mut reference = vec![0.0; t * d_out];
            for (r, reference) in reference.chunks_exact_mut(d_out).enumerate() {
                kvlab_model::ops::matvec(reference, &w, &x[r * d_in..(r + 1) * d_in]);
            }
            assert_near_dots(&y, &reference, &w, &x, d_in, &format!("t={t}"));
        }
    }
    #[test]
    fn matrices_of_one_x_give_what_each_gives_alone_bit_for_bit() {
        // q, k, v of unequal heights (the team's split falls inside a matrix and across
        // matrix boundaries), f32 and encoded, one row and several.
        let mut rng = rand_chacha::ChaCha8Rng::seed_from_u64(5);
        // 37: the second matrix starts, and a task's share of it ends, off the 4-row pass.
        let (d_in, outs) = (256, [100, 37, 44]);
        for ty in [
            GgmlType::F32,
            GgmlType::BF16,
            GgmlType::Q8_0,
            GgmlType::Q4_K,
        ] {
            let ws: Vec<Tensor> = (outs.iter())
                .map(|&n| match ty {
                    GgmlType::F32 | GgmlType::BF16 => {
                        let f: Tensor = uniform(&mut rng, n * d_in).into();
                        f.convert(ty)
                    }
                    _ => {
                        let bytes = quant::testing::random_rows(ty, n, d_in, &mut rng);
                        Tensor::encoded_from_bytes(ty, bytes, n * d_in).expect("whole blocks")
                    }
                })
                .collect();
            for t in [1, 3] {
                let x: Vec<f32> = uniform(&mut rng, t * d_in);
                let mut got: Vec<Vec<f32>> = outs.iter().map(|&n| vec![f32::NAN; t * n]).collect();
                let [a, b, c] = &mut got[..] else {
                    unreachable!()
                };
                linear_same_x([a, b, c], &x, [&ws[0], &ws[1], &ws[2]], t, d_in);
                for (m, (w, got)) in ws.iter().zip(&got).enumerate() {
                    let mut alone = vec![f32::NAN; t * outs[m]];
                    linear(&mut alone, &x, w, t, d_in, outs[m]);
                    let same = got
                        .iter()
                        .zip(&alone)
                        .all(|(a, b)| a.to_bits() == b.to_bits());
                    assert!(same, "{ty} t={t} matrix {m}");
                }
            }
        }
    }

    #[test]
    fn q8_activations_give_a_row_the_same_bits_in_every_batch_and_stay_near_f32() {
        // --activations q8 through `linear`: every t takes the integer kernel (with W split
        // among the threads), so a token's row is what it is alone; and it stays within the
        // rounding of x of the f32 product.
        let mut rng = rand_chacha::ChaCha8Rng::seed_from_u64(9);
        let (d_in, d_out) = (512, 300);
        for ty in kvlab_model::weights::QUANTIZED {
            if !quant::q8_act::available(ty) {
                eprintln!("no AVX-512 VNNI: --activations q8 keeps f32 here, nothing to test");
                return;
            }
            let bytes = quant::testing::random_rows(ty, d_out, d_in, &mut rng);
            let w = Tensor::encoded_from_bytes(ty, bytes, d_out * d_in)
                .expect("whole blocks")
                .with_activations(kvlab_model::Activations::Q8);
            let t = 37;
            let x: Vec<f32> = uniform(&mut rng, t * d_in);
            let mut all = vec![f32::NAN; t * d_out];
            linear(&mut all, &x, &w, t, d_in, d_out);
            let f32_w = w.convert(GgmlType::F32);
            let mut exact = vec![f32::NAN; t * d_out];
            linear(&mut exact, &x, &f32_w, t, d_in, d_out);
            for (t0, n) in [(0, 1), (3, 2), (5, 4), (9, 17)] {
                let mut part = vec![f32::NAN; n * d_out];
                linear(&mut part, &x[t0 * d_in..], &w, n, d_in, d_out);
                for (j, v) in part.iter().enumerate() {
                    let a = all[t0 * d_out + j];
                    assert_eq!(
                        v.to_bits(),
                        a.to_bits(),
                        "{ty}: rows {t0}.. of {n}, element {j}"
                    );
                }
            }
            let scale = exact.iter().fold(0.0f32, |m, v| m.max(v.abs()));
            for (a, e) in all.iter().zip(&exact) {
                assert!(
                    (a - e).abs() <= 0.02 * scale,
                    "{ty}: {a} vs f32 {e} (max {scale})"
                );
            }
        }
    }

    #[test]
    fn the_many_token_paths_match_matrixmultiply() {
        // matrixmultiply's sgemm is the reference GEMM: for the skinny kernel (t ≤ 64 on
        // AVX-512, one or two token blocks) and for the crate the engine uses above.
        let mut rng = rand_chacha::ChaCha8Rng::seed_from_u64(6);
        for (t, d_in, d_out) in [
            (17, 288, 768),
            (40, 96, 1000),
            (64, 64, 203),
            (65, 96, 1000),
            (100, 64, 33),
        ] {
            let x: Vec<f32> = uniform(&mut rng, t * d_in);
            let w: Tensor = uniform(&mut rng, d_out * d_in).into();
            let mut y = vec![f32::NAN; t * d_out];
            linear(&mut y, &x, &w, t, d_in, d_out);
            let mut want = vec![0.0f32; t * d_out];
            // SAFETY: x is (t, in), W (out, in) read as Wᵀ by strides, want (t, out).
            unsafe {
                matrixmultiply::sgemm(
                    t,
                    d_in,
                    d_out,
                    1.0,
                    x.as_ptr(),
                    d_in as isize,
                    1,
                    w.as_ptr(),
                    1,
                    d_in as isize,
                    0.0,
                    want.as_mut_ptr(),
                    d_out as isize,
                    1,
                );
            }
            for (i, (a, b)) in y.iter().zip(&want).enumerate() {
                assert!(
                    (a - b).abs() <= 1e-4 * (1.0 + b.abs()),
                    "t={t} {i}: {a} vs {b}"
                );
            }
        }
    }

    #[test]
    fn quantized_weights_give_what_their_decoded_f32_gives_at_every_row_count() {
        // The few-rows kernel from 2 rows to its per-format maximum, then skinny and sgemm on
        // the decoded rows: every path within rounding of the f32 path on the decoded W.
        let mut rng = rand_chacha::ChaCha8Rng::seed_from_u64(13);
        let (d_in, d_out) = (512, 70);
        for ty in [
            GgmlType::Q8_0,
            GgmlType::Q5_0,
            GgmlType::Q4_K,
            GgmlType::Q6_K,
        ] {
            let bytes = quant::testing::random_rows(ty, d_out, d_in, &mut rng);
            let w = Tensor::encoded_from_bytes(ty, bytes, d_out * d_in).expect("whole blocks");
            let decoded = w.convert(GgmlType::F32);
            for t in [1, 2, 4, 5, 12, 13, 32, 40, 41, 64, 70] {
                let x: Vec<f32> = uniform(&mut rng, t * d_in);
                let (mut got, mut want) = (vec![f32::NAN; t * d_out], vec![f32::NAN; t * d_out]);
                linear(&mut got, &x, &w, t, d_in, d_out);
                linear(&mut want, &x, &decoded, t, d_in, d_out);
                assert_near_dots(&got, &want, &decoded, &x, d_in, &format!("{ty} t={t}"));
            }
        }
    }

    #[test]
    fn encoded_weights_give_what_their_decoded_f32_gives_at_every_path() {
        // An encoded W is decoded a block of rows at a time for the many-token paths; the
        // result must be the f32 path's on the decoded weights (the GEMV has kernels of its
        // own per format, checked against their references in crate::quant).
        let mut rng = rand_chacha::ChaCha8Rng::seed_from_u64(12);
        let (d_in, d_out) = (96, 333);
        let f32_w: Tensor = uniform(&mut rng, d_out * d_in).into();
        for ty in [GgmlType::BF16, GgmlType::F16] {
            let w = f32_w.convert(ty);
            let decoded = Tensor::from(w.to_vec());
            for t in [4, 12, 32, 64, 70] {
                let x: Vec<f32> = uniform(&mut rng, t * d_in);
                let (mut got, mut want) = (vec![f32::NAN; t * d_out], vec![f32::NAN; t * d_out]);
                linear(&mut got, &x, &w, t, d_in, d_out);
                linear(&mut want, &x, &decoded, t, d_in, d_out);
                for (i, (a, b)) in got.iter().zip(&want).enumerate() {
                    assert!(
                        (a - b).abs() <= 1e-5 * (1.0 + b.abs()),
                        "{ty:?} t={t} {i}: {a} vs {b}"
                    );
                }
            }
        }
    }
}

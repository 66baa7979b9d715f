//! Prefill as GEMM: y (t, out) = x (t, in) @ Wᵀ at t = 100 prompt rows, for the weight shapes of
//! the stories15M (dim 288, hidden 768, vocab 32000) and stories42M (dim 512, hidden 1376)
//! models, in kvlab's layout: W stored (out, in) row-major, so B = Wᵀ is read with row stride 1
//! and column stride `in` (no transposed copy of W), x and y row-major.
//!
//! * `sgemm/matrixmultiply`: `matrixmultiply::sgemm`, kvlab-cpu's GEMM (the reference);
//! * `sgemm/gemm`: the `gemm` crate (the GEMM candle uses), f32, `Parallelism::None`, with its
//!   AVX-512 kernels (`x86-v4` feature) where the CPU has them;
//! * `sgemm/kvlab_linear`: kvlab-cpu's `linear`, which calls the same crate on x transposed and
//!   writes C column-major, then transposes it into y (`kvlab_cpu::transpose`), so gemm's own
//!   copies are vector copies (see `linear.rs`).
//!
//! Both on one thread (kvlab splits W's rows across its own threads around the call).
//! Throughput is in elements = multiply-adds (t × in × out), so criterion's "Melem/s" ÷ 500
//! is GFLOP/s (2 FLOP per multiply-add; Gelem/s × 2 likewise). Each output is checked against a plain triple loop
//! before it is timed.
//!
//! Run: `cargo bench -p kvlab-benches --bench sgemm`.

use std::time::Duration;

use criterion::{BenchmarkId, Criterion, Throughput, criterion_group, criterion_main};
use kvlab_benches::{assert_close, data};
use kvlab_model::Tensor;

/// Prompt rows of a prefill.
const T: usize = 100;

/// (label, in, out): W is (out, in).
const SHAPES: [(&str, usize, usize); 5] = [
    ("15M_w1_288to768", 288, 768),
    ("15M_w2_768to288", 768, 288),
    ("15M_cls_288to32000", 288, 32000),
    ("42M_w1_512to1376", 512, 1376),
    ("42M_cls_512to32000", 512, 32000),
];

/// y = x @ Wᵀ by matrixmultiply.
fn mm(y: &mut [f32], x: &[f32], w: &Tensor, t: usize, d_in: usize, d_out: usize) {
    // SAFETY: x is (t, d_in), w (d_out, d_in), y (t, d_out), all row-major and of those lengths
    // (checked by the caller's slicing below); the strides address only inside them.
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
            y.as_mut_ptr(),
            d_out as isize,
            1,
        )
    }
}

/// y = x @ Wᵀ by the gemm crate, one thread.
fn gemm_crate(y: &mut [f32], x: &[f32], w: &Tensor, t: usize, d_in: usize, d_out: usize) {
    // SAFETY: as in `mm`; gemm computes dst := alpha·dst + beta·lhs·rhs and, with
    // read_dst = false, never reads dst.
    unsafe {
        gemm::gemm(
            t,
            d_out,
            d_in,
            y.as_mut_ptr(),
            1,
            d_out as isize,
            false,
            x.as_ptr(),
            1,
            d_in as isize,
            w.as_ptr(),
            d_in as isize,
            1,
            0.0,
            1.0,
            false,
            false,
            false,
            gemm::Parallelism::None,
        )
    }
}

/// y = x @ Wᵀ by kvlab-cpu's `linear` (gemm on x transposed, C column-major, transposed into y),
/// on one thread like the others.
fn kvlab_linear(y: &mut [f32], x: &[f32], w: &Tensor, t: usize, d_in: usize, d_out: usize) {
    kvlab_cpu::linear::linear(y, x, w, t, d_in, d_out)
}

/// The plain triple loop (f64 accumulation) all are checked against.
fn reference(x: &[f32], w: &[f32], t: usize, d_in: usize, d_out: usize) -> Vec<f32> {
    let mut y = vec![0.0; t * d_out];
    for r in 0..t {
        for o in 0..d_out {
            let (xr, wo) = (&x[r * d_in..][..d_in], &w[o * d_in..][..d_in]);
            y[r * d_out + o] = xr
                .iter()
                .zip(wo)
                .map(|(a, b)| *a as f64 * *b as f64)
                .sum::<f64>() as f32;
        }
    }
    y
}

type Gemm = fn(&mut [f32], &[f32], &Tensor, usize, usize, usize);

fn bench(c: &mut Criterion) {
    kvlab_cpu::set_num_threads(1).expect("the first use of kvlab-cpu's threads");
    let kernels: [(&str, Gemm); 3] = [
        ("sgemm/matrixmultiply", mm),
        ("sgemm/gemm", gemm_crate),
        ("sgemm/kvlab_linear", kvlab_linear),
    ];
    for (label, d_in, d_out) in SHAPES {
        let x = data(T * d_in, 21);
        let w: Tensor = data(d_out * d_in, 22).into_iter().collect();
        let want = reference(&x, &w, T, d_in, d_out);
        let mut y = vec![0.0; T * d_out];
        for (name, f) in kernels {
            y.fill(f32::NAN);
            f(&mut y, &x, &w, T, d_in, d_out);
            assert_close(name, &y, &want, 1e-4 * d_in as f32);
        }
        for (name, f) in kernels {
            let mut g = c.benchmark_group(name);
            g.sample_size(10)
                .warm_up_time(Duration::from_millis(300))
                .measurement_time(Duration::from_secs(1))
                .throughput(Throughput::Elements((T * d_in * d_out) as u64));
            g.bench_function(BenchmarkId::from_parameter(label), |b| {
                b.iter(|| f(&mut y, &x, &w, T, d_in, d_out))
            });
            g.finish();
        }
    }
}

criterion_group!(benches, bench);
criterion_main!(benches);

//! GEMV, out (rows,) = W (rows, cols) @ x (cols,): a decode step is a sequence of these, one per
//! weight matrix, and each reads its whole matrix once. Throughput: weight bytes read
//! (rows × cols × 4), directly comparable with the memory bandwidth `cargo xtask bench` measures.
//!
//! * `scalar/gemv`: kvlab-model's `matvec` (one thread, no SIMD);
//! * `cpu/gemv`: kvlab-cpu's SIMD GEMV, rows split across threads;
//! * `simd/dot/<isa>`: the dot kernel at every instruction-set level this CPU has.

use criterion::{BenchmarkId, Criterion, Throughput, criterion_group, criterion_main};
use kvlab_benches::{assert_close, data};
use kvlab_cpu::simd::{Isa, dot_with};

/// (label, rows, cols): the matrices of the stories15M shape (dim 288, hidden 768, vocab 32000)
/// and of the Llama-3.2-1B shape (dim 2048, 8 KV heads of 64, hidden 8192).
const SHAPES: [(&str, usize, usize); 7] = [
    ("stories15M_wq_288x288", 288, 288),
    ("stories15M_w1_768x288", 768, 288),
    ("stories15M_cls_32000x288", 32000, 288),
    ("llama1B_wq_2048x2048", 2048, 2048),
    ("llama1B_wk_512x2048", 512, 2048),
    ("llama1B_w1_8192x2048", 8192, 2048),
    ("llama1B_w2_2048x8192", 2048, 8192),
];

fn bench(c: &mut Criterion) {
    for (label, rows, cols) in SHAPES {
        let w = data(rows * cols, 11); // (rows, cols)
        let x = data(cols, 12); // (cols,)
        let mut want = vec![0.0; rows];
        kvlab_model::ops::matvec(&mut want, &w, &x);
        let mut out = vec![0.0; rows];
        // `linear` with one row of x is the engine's GEMV.
        let wt = kvlab_model::Tensor::from(w.clone());
        kvlab_cpu::linear::linear(&mut out, &x, &wt, 1, cols, rows);
        assert_close("cpu/gemv", &out, &want, 1e-4);
        let bytes = (rows * cols * 4) as u64;
        for (name, simd) in [("scalar/gemv", false), ("cpu/gemv", true)] {
            let mut g = c.benchmark_group(name);
            g.throughput(Throughput::Bytes(bytes));
            g.bench_function(BenchmarkId::from_parameter(label), |b| {
                b.iter(|| {
                    if simd {
                        kvlab_cpu::linear::linear(&mut out, &x, &wt, 1, cols, rows)
                    } else {
                        kvlab_model::ops::matvec(&mut out, &w, &x)
                    }
                })
            });
            g.finish();
        }
    }
    // One dot product of 4,096 elements (a 1B-shape row is 2,048; a hidden row 8,192) per level.
    let n = 4096;
    let (a, b) = (data(n, 13), data(n, 14));
    let want = kvlab_model::ops::dot(&a, &b);
    for isa in Isa::available() {
        let got = dot_with(isa, &a, &b);
        assert!(
            (got - want).abs() <= 1e-3 * (1.0 + want.abs()),
            "{}: {got} vs {want}",
            isa.name()
        );
        let mut g = c.benchmark_group(format!("simd/dot/{}", isa.name()));
        g.throughput(Throughput::Elements(n as u64));
        g.bench_function(BenchmarkId::from_parameter(n), |bch| {
            bch.iter(|| dot_with(isa, std::hint::black_box(&a), &b))
        });
        g.finish();
    }
}

criterion_group! {
    name = benches;
    config = Criterion::default()
        .sample_size(10)
        .warm_up_time(std::time::Duration::from_millis(300))
        .measurement_time(std::time::Duration::from_secs(1));
    targets = bench
}
criterion_main!(benches);

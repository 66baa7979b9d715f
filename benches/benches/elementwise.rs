//! The O(dim) steps of a decode: RoPE on the query heads and RMSNorm of the residual.
//! Throughput: elements processed.
//!
//! * `scalar/rope`: kvlab-model's reference, which computes theta^(−2j/head_dim) and sin/cos
//!   for every pair at every call;
//! * `cpu/rope_table`: kvlab-cpu's precomputed cos/sin table (bit-identical results);
//! * `scalar/rmsnorm`: kvlab-model's RMSNorm, which both engines use (no faster kernel exists:
//!   at O(dim) per token it is not where decode time goes).

use criterion::{BenchmarkId, Criterion, Throughput, criterion_group, criterion_main};
use kvlab_benches::data;
use kvlab_model::rope::RopeTable;
use kvlab_model::{RopeLayout, ops};

/// (label, n_heads, head_dim): the query of stories15M and of the Llama-3.2-1B shape.
const ROPE: [(&str, usize, usize); 2] = [("stories15M_6x48", 6, 48), ("llama1B_32x64", 32, 64)];
const POS: usize = 1000;

fn bench(c: &mut Criterion) {
    for (label, heads, hd) in ROPE {
        let x0 = data(heads * hd, 21); // (n_heads, head_dim)
        let table = RopeTable::new(10_000.0, hd, POS + 1);
        let (mut a, mut b) = (x0.clone(), x0.clone());
        table.apply(&mut a, POS, RopeLayout::Interleaved);
        ops::rope(&mut b, POS, hd, 10_000.0, RopeLayout::Interleaved);
        assert_eq!(a, b, "cpu/rope_table must equal the reference bit for bit");
        let mut x = x0.clone();
        let mut g = c.benchmark_group("scalar/rope");
        g.throughput(Throughput::Elements((heads * hd) as u64));
        g.bench_function(BenchmarkId::from_parameter(label), |bch| {
            bch.iter(|| ops::rope(&mut x, POS, hd, 10_000.0, RopeLayout::Interleaved))
        });
        g.finish();
        let mut g = c.benchmark_group("cpu/rope_table");
        g.throughput(Throughput::Elements((heads * hd) as u64));
        g.bench_function(BenchmarkId::from_parameter(label), |bch| {
            bch.iter(|| table.apply(&mut x, POS, RopeLayout::Interleaved))
        });
        g.finish();
    }
    for dim in [288usize, 2048, 4096] {
        let x = data(dim, 22); // (dim,)
        let w = data(dim, 23); // (dim,)
        let mut out = vec![0.0; dim];
        let mut g = c.benchmark_group("scalar/rmsnorm");
        g.throughput(Throughput::Elements(dim as u64));
        g.bench_function(BenchmarkId::new("dim", dim), |bch| {
            bch.iter(|| ops::rmsnorm(&mut out, &x, &w, 1e-5))
        });
        g.finish();
    }
}

criterion_group! {
    name = benches;
    config = Criterion::default()
        .sample_size(20)
        .warm_up_time(std::time::Duration::from_millis(300))
        .measurement_time(std::time::Duration::from_secs(1));
    targets = bench
}
criterion_main!(benches);

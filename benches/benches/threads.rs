//! The worker team's cost per parallel loop: one `for_each_task` with one empty task per thread,
//! what every parallel GEMV and attention call of a decode step pays before any arithmetic
//! (stories260K's step makes 5 of them at long contexts, the stories15M shape's about 40).
//!
//! * `threads/dispatch`: hand one task to each thread and wait for all of them;
//! * `threads/serial`: the same loop on the calling thread alone, the floor.

use criterion::{Criterion, criterion_group, criterion_main};
use kvlab_cpu::threads::{for_each_task, num_threads};
use std::hint::black_box;
use std::sync::atomic::{AtomicUsize, Ordering::Relaxed};

fn bench(c: &mut Criterion) {
    let n = num_threads();
    let hits = AtomicUsize::new(0);
    c.bench_function(&format!("threads/dispatch/{n}_threads"), |b| {
        b.iter(|| {
            for_each_task(n, |t| {
                hits.fetch_add(black_box(t), Relaxed);
            })
        })
    });
    c.bench_function("threads/serial", |b| {
        b.iter(|| {
            (0..n).for_each(|t| {
                hits.fetch_add(black_box(t), Relaxed);
            })
        })
    });
    black_box(hits.load(Relaxed));
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

//! Picking the next token for a batch of sequences, as `kvlab serve` and `kvlab batch` do after
//! every step: 64 rows of 32,000 logits (the stories15M vocabulary), 8 MB, one greedy pick per
//! row. Throughput: logits read.
//!
//! * `scalar/argmax`: the one-pass branchy reference (the first strict maximum);
//! * `sampler/greedy`: `Sampler::sample` at temperature 0, what a server step pays per row
//!   (the non-finite check included).

use criterion::{BenchmarkId, Criterion, Throughput, criterion_group, criterion_main};
use kvlab_benches::data;
use kvlab_model::sampler::{Sampler, argmax};

/// (rows, vocab): a 64-sequence batch of stories15M / Llama 2 logits.
const ROWS: usize = 64;
const VOCAB: usize = 32_000;

/// The plain argmax: one pass, the first strict maximum.
fn argmax_reference(x: &[f32]) -> u32 {
    let mut best = 0;
    for (i, &v) in x.iter().enumerate() {
        if v > x[best] {
            best = i;
        }
    }
    best as u32
}

fn bench(c: &mut Criterion) {
    let rows: Vec<Vec<f32>> = (0..ROWS).map(|r| data(VOCAB, 40 + r as u64)).collect(); // (rows, vocab)
    let mut sampler = Sampler::greedy();
    for row in &rows {
        let want = argmax_reference(row);
        assert_eq!(argmax(row), want, "argmax must equal the reference");
        assert_eq!(
            sampler.sample(&mut row.clone()),
            Ok(want),
            "greedy must be the argmax"
        );
    }
    let mut g = c.benchmark_group("scalar/argmax");
    g.throughput(Throughput::Bytes((ROWS * VOCAB * 4) as u64));
    g.bench_function(
        BenchmarkId::new("rows_x_vocab", format!("{ROWS}x{VOCAB}")),
        |b| b.iter(|| rows.iter().map(|r| argmax_reference(r)).sum::<u32>()),
    );
    g.finish();
    let mut scratch = rows.clone();
    let mut g = c.benchmark_group("sampler/greedy");
    g.throughput(Throughput::Bytes((ROWS * VOCAB * 4) as u64));
    g.bench_function(
        BenchmarkId::new("rows_x_vocab", format!("{ROWS}x{VOCAB}")),
        |b| {
            b.iter(|| {
                scratch
                    .iter_mut()
                    .map(|r| sampler.sample(r).unwrap_or(0))
                    .sum::<u32>()
            })
        },
    );
    g.finish();
}

criterion_group! {
    name = benches;
    config = Criterion::default()
        .sample_size(20)
        .warm_up_time(std::time::Duration::from_millis(300))
        .measurement_time(std::time::Duration::from_secs(2));
    targets = bench
}
criterion_main!(benches);

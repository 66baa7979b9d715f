//! GEMV over encoded weights, out (rows,) = W (rows, cols) @ x (cols,) with W stored as one of
//! [`kvlab_model::weights::ENCODINGS`] (F16, BF16, Q8_0, Q5_0, Q4_K, Q6_K), one thread.
//! Throughput: weight bytes read, so a format that reads fewer bytes per weight shows it.
//!
//! * `quant/<TYPE>/kernel` and `quant/<TYPE>/reference`: `kvlab_cpu::quant::gemv_rows` (the
//!   SIMD kernel) beside `gemv_rows_reference` (decode each row, then the scalar dot), at
//!   (2048, 2048), random valid blocks;
//! * `quant/F32/simd`: the f32 `kvlab_cpu::simd::gemv_rows` of the same shape, the baseline;
//! * `quant/halves/<shape>`: the bf16 and f16 kernels beside the f32 GEMV at the stories15M and
//!   stories42M matrix shapes (the f32 one reads twice the bytes: compare times, not GiB/s).
//!
//! * `quant/prompt/<TYPE>/<t>x<out>x<in>`: a step's product through `kvlab_cpu::linear::linear`
//!   (the engine's threads) at Gemma 3 270M's shapes, 1 (a decode step), 10 and 100 token rows,
//!   the matrix's products with f32 activations (`f32_activations`) beside `--activations q8`
//!   (`q8_activations`: rows rounded to 8 bits, AVX-512 VNNI integer dot products, and on a CPU
//!   with AMX-INT8 Q8_0 and, above 4 tokens, Q5_0 on the tiles; where the CPU lacks VNNI it is
//!   the f32 path again). Throughput: multiply-adds.
//! * `quant/classifier/Q8_0/<t>x<out>x<in>`: a slice of Gemma 3 270M's Q8_0 classifier with
//!   `--activations q8` for one token (a decode step) and 32 (a batched step): on a CPU with
//!   AMX-INT8 the tile kernel (`quant::q8_act::amx`), else `vpdpbusd`; `KVLAB_AMX=off` measures
//!   the latter there. Throughput: multiply-adds.
//!
//! Every kernel is checked against the reference before it is timed. Run:
//! `cargo bench -p kvlab-benches --bench quant`.

use criterion::{BenchmarkId, Criterion, Throughput, criterion_group, criterion_main};
use kvlab_benches::{assert_close, data};
use kvlab_cpu::quant;
use kvlab_model::GgmlType;
use kvlab_model::weights::ENCODINGS;

/// Deterministic pseudo-random bytes (splitmix64).
fn bytes(n: usize, seed: u64) -> Vec<u8> {
    let mut s = seed;
    (0..n.div_ceil(8))
        .flat_map(|_| {
            s = s.wrapping_add(0x9E37_79B9_7F4A_7C15);
            let mut z = s;
            z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
            z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
            (z ^ (z >> 31)).to_le_bytes()
        })
        .take(n)
        .collect()
}

/// A (rows, cols) matrix of `ty`, valid blocks: f16/bf16 from random f32s in [−1, 1); quantized
/// blocks are random bytes with their f16 scale fields set to small finite values (Q8_0 and
/// Q5_0: `d` at offset 0; Q4_K: `d` and `dmin` at 0 and 2; Q6_K: `d` at 208).
fn matrix(ty: GgmlType, rows: usize, cols: usize, seed: u64) -> Vec<u8> {
    let n = rows * cols;
    match ty {
        GgmlType::F16 => data(n, seed)
            .into_iter()
            .flat_map(|v| half::f16::from_f32(v).to_le_bytes())
            .collect(),
        GgmlType::BF16 => data(n, seed)
            .into_iter()
            .flat_map(|v| half::bf16::from_f32(v).to_le_bytes())
            .collect(),
        _ => {
            let mut w = bytes(quant::row_bytes(ty, cols) * rows, seed);
            let offsets: &[usize] = match ty {
                GgmlType::Q8_0 | GgmlType::Q5_0 => &[0],
                GgmlType::Q4_K => &[0, 2],
                GgmlType::Q6_K => &[208],
                other => panic!("no block layout for {other}"),
            };
            let scales = data(w.len() / ty.type_size() * offsets.len(), seed + 1);
            let mut scales = scales.into_iter();
            for block in w.chunks_exact_mut(ty.type_size()) {
                for &o in offsets {
                    let d = 0.001 + 0.01 * scales.next().expect("one per field").abs();
                    block[o..o + 2].copy_from_slice(&half::f16::from_f32(d).to_le_bytes());
                }
            }
            w
        }
    }
}

/// Max over rows of |got − want| / Σ|wᵢxᵢ| (the row's scale), W decoded by the reference.
fn rel_err(ty: GgmlType, w: &[u8], x: &[f32], got: &[f32], want: &[f32]) -> f32 {
    let rb = quant::row_bytes(ty, x.len());
    let mut row = vec![0.0; x.len()];
    let mut worst = 0.0f32;
    for (i, (g, e)) in got.iter().zip(want).enumerate() {
        quant::decode_rows(ty, &w[i * rb..][..rb], &mut row);
        let scale: f32 = row.iter().zip(x).map(|(a, b)| (a * b).abs()).sum();
        worst = worst.max((g - e).abs() / scale);
    }
    worst
}

fn encodings(c: &mut Criterion) {
    let (rows, cols) = (2048, 2048);
    let x = data(cols, 12);
    let mut out = vec![0.0; rows];
    let mut want = vec![0.0; rows];
    for (k, ty) in ENCODINGS.into_iter().enumerate() {
        let w = matrix(ty, rows, cols, 100 + k as u64);
        quant::gemv_rows(ty, &mut out, &w, &x);
        quant::gemv_rows_reference(ty, &mut want, &w, &x);
        let err = rel_err(ty, &w, &x, &out, &want);
        assert!(
            err <= 1e-5,
            "{ty}: kernel vs reference, relative error {err:e}"
        );
        let mut g = c.benchmark_group(format!("quant/{ty}"));
        g.throughput(Throughput::Bytes(w.len() as u64));
        g.bench_function(BenchmarkId::new("kernel", "2048x2048"), |b| {
            b.iter(|| quant::gemv_rows(ty, &mut out, &w, &x))
        });
        g.bench_function(BenchmarkId::new("reference", "2048x2048"), |b| {
            b.iter(|| quant::gemv_rows_reference(ty, &mut out, &w, &x))
        });
        g.finish();
    }
    let w = data(rows * cols, 11);
    kvlab_model::ops::matvec(&mut want, &w, &x);
    kvlab_cpu::simd::gemv_rows(&mut out, &w, &x);
    assert_close("simd::gemv_rows", &out, &want, 1e-4);
    let mut g = c.benchmark_group("quant/F32");
    g.throughput(Throughput::Bytes((rows * cols * 4) as u64));
    g.bench_function(BenchmarkId::new("simd", "2048x2048"), |b| {
        b.iter(|| kvlab_cpu::simd::gemv_rows(&mut out, &w, &x))
    });
    g.finish();
}

/// (label, rows, cols): stories15M (dim 288, hidden 768, vocab 32000) and stories42M (dim 512,
/// hidden 1376) matrices.
const SHAPES: [(&str, usize, usize); 5] = [
    ("15M_w1_768x288", 768, 288),
    ("15M_w2_288x768", 288, 768),
    ("15M_cls_32000x288", 32000, 288),
    ("42M_w1_1376x512", 1376, 512),
    ("42M_cls_32000x512", 32000, 512),
];

fn halves(c: &mut Criterion) {
    for (label, rows, cols) in SHAPES {
        let x = data(cols, 22);
        let wf = data(rows * cols, 21);
        let wb = matrix(GgmlType::BF16, rows, cols, 21);
        let wh = matrix(GgmlType::F16, rows, cols, 21);
        let mut out = vec![0.0; rows];
        let mut want = vec![0.0; rows];
        for (ty, w) in [(GgmlType::BF16, &wb), (GgmlType::F16, &wh)] {
            quant::gemv_rows(ty, &mut out, w, &x);
            quant::gemv_rows_reference(ty, &mut want, w, &x);
            let err = rel_err(ty, w, &x, &out, &want);
            assert!(err <= 1e-5, "{ty} {label}: relative error {err:e}");
        }

        let mut g = c.benchmark_group(format!("quant/halves/{label}"));
        g.throughput(Throughput::Bytes((rows * cols * 4) as u64));
        g.bench_function("f32_simd", |b| {
            b.iter(|| kvlab_cpu::simd::gemv_rows(&mut out, &wf, &x))
        });
        g.throughput(Throughput::Bytes((rows * cols * 2) as u64));
        g.bench_function("bf16", |b| {
            b.iter(|| quant::gemv_rows(GgmlType::BF16, &mut out, &wb, &x))
        });
        g.bench_function("f16", |b| {
            b.iter(|| quant::gemv_rows(GgmlType::F16, &mut out, &wh, &x))
        });
        g.finish();
    }
}

/// `y8` (q8 activations) differs from `y` (f32) by the rounding of x: well within 2% of the
/// largest output, and never NaN.
fn assert_q8_near_f32(ty: GgmlType, y: &[f32], y8: &[f32]) {
    let scale = y.iter().fold(0.0f32, |m, v| m.max(v.abs()));
    let worst = y
        .iter()
        .zip(y8)
        .map(|(a, b)| (a - b).abs())
        .fold(0.0f32, f32::max);
    assert!(
        worst <= 0.02 * scale && worst.is_finite(),
        "{ty}: q8 vs f32 activations differ by {worst} (largest output {scale})"
    );
}

/// (type, out, in): Gemma 3 270M's gate projection (Q5_0), a Q8_0 attn_v, and its ffn_down in
/// Q4_K and Q6_K.
const PROMPT_SHAPES: [(GgmlType, usize, usize); 4] = [
    (GgmlType::Q5_0, 2048, 640),
    (GgmlType::Q8_0, 256, 640),
    (GgmlType::Q4_K, 640, 2048),
    (GgmlType::Q6_K, 640, 2048),
];

fn prompts(c: &mut Criterion) {
    use kvlab_model::{Activations, Tensor};
    for (k, (ty, d_out, d_in)) in PROMPT_SHAPES.into_iter().enumerate() {
        let bytes = matrix(ty, d_out, d_in, 300 + k as u64);
        let w = Tensor::encoded_from_bytes(ty, bytes, d_out * d_in).expect("whole blocks");
        let w8 = w.clone().with_activations(Activations::Q8);
        for t in [1, 10, 100] {
            let x = data(t * d_in, 31 + t as u64);
            let (mut y, mut y8) = (vec![0.0; t * d_out], vec![0.0; t * d_out]);
            kvlab_cpu::linear::linear(&mut y, &x, &w, t, d_in, d_out);
            kvlab_cpu::linear::linear(&mut y8, &x, &w8, t, d_in, d_out);
            assert_q8_near_f32(ty, &y, &y8);
            let mut g = c.benchmark_group(format!("quant/prompt/{ty}"));
            g.throughput(Throughput::Elements((t * d_out * d_in) as u64));
            let shape = format!("{t}x{d_out}x{d_in}");
            g.bench_function(BenchmarkId::new("f32_activations", &shape), |b| {
                b.iter(|| kvlab_cpu::linear::linear(&mut y, &x, &w, t, d_in, d_out))
            });
            g.bench_function(BenchmarkId::new("q8_activations", &shape), |b| {
                b.iter(|| kvlab_cpu::linear::linear(&mut y8, &x, &w8, t, d_in, d_out))
            });
            g.finish();
        }
    }
}

/// (out, in): 32,768 of the classifier's 262,144 rows (22 MiB of Q8_0, more than L2).
const CLASSIFIER_SLICE: (usize, usize) = (32_768, 640);

fn classifier(c: &mut Criterion) {
    use kvlab_model::{Activations, Tensor};
    let (d_out, d_in) = CLASSIFIER_SLICE;
    let bytes = matrix(GgmlType::Q8_0, d_out, d_in, 400);
    let w = Tensor::encoded_from_bytes(GgmlType::Q8_0, bytes, d_out * d_in).expect("whole blocks");
    let w8 = w.clone().with_activations(Activations::Q8);
    for t in [1, 32] {
        let x = data(t * d_in, 41 + t as u64);
        let (mut y, mut y8) = (vec![0.0; t * d_out], vec![0.0; t * d_out]);
        kvlab_cpu::linear::linear(&mut y, &x, &w, t, d_in, d_out);
        kvlab_cpu::linear::linear(&mut y8, &x, &w8, t, d_in, d_out);
        assert_q8_near_f32(GgmlType::Q8_0, &y, &y8);
        let mut g = c.benchmark_group("quant/classifier/Q8_0");
        g.throughput(Throughput::Elements((t * d_out * d_in) as u64));
        g.bench_function(format!("{t}x{d_out}x{d_in}"), |b| {
            b.iter(|| kvlab_cpu::linear::linear(&mut y8, &x, &w8, t, d_in, d_out))
        });
        g.finish();
    }
}

criterion_group! {
    name = benches;
    config = Criterion::default()
        .sample_size(10)
        .warm_up_time(std::time::Duration::from_millis(200))
        .measurement_time(std::time::Duration::from_millis(700));
    targets = encodings, halves, prompts, classifier
}
criterion_main!(benches);

//! kvlab's criterion micro-benchmarks live in `benches/benches/`:
//!
//! * `attention.rs`: one decode query of one head over a context of 128 … 4,096 keys:
//!   `scalar/attention_decode` (the reference maths), `cpu/attention_decode` (SIMD, contiguous
//!   cache) and `cpu-paged/attention_decode` (the same through a shuffled block table: the
//!   paged gather's cost); throughput in bytes of K and V read. Also all heads of stories260K's
//!   shape (head_dim 8) and a token's attention over the 6 layers of the stories15M shape.
//! * `gemv.rs`: `W (rows, cols) @ x` at the stories15M and Llama-3.2-1B shapes, scalar and
//!   SIMD (threaded), and `simd/dot` per instruction-set level; throughput in weight bytes read,
//!   comparable with `cargo xtask bench`'s measured memory bandwidth.
//! * `elementwise.rs`: RoPE (on-the-fly angles vs the precomputed table) and RMSNorm;
//!   throughput in elements.
//! * `quant.rs`: GEMV rows over encoded weights (bf16, f16, Q8_0, Q5_0, Q4_K, Q6_K) beside the
//!   f32 kernel and the decode-then-dot reference.
//! * `sgemm.rs`: prefill as GEMM at 100 rows: matrixmultiply, the `gemm` crate on row-major
//!   operands, and kvlab-cpu's `linear`; throughput in multiply-adds.
//! * `tokenizer.rs`: encoding 1k to 100k characters (tok512 and Gemma 3's vocabulary).
//! * `threads.rs`: the worker team's cost per parallel loop.
//! * `sampler.rs`: the greedy pick of a 64-sequence step (64 rows of 32,000 logits), the
//!   sampler beside the one-pass reference; throughput in logit bytes read.
//!
//! Run: `cargo bench -p kvlab-benches` (all), `cargo bench -p kvlab-benches --bench gemv`, or a
//! filter such as `cargo bench -p kvlab-benches -- cpu/attention`. Every kernel is checked
//! against its scalar reference before it is timed. End-to-end numbers (engines, models,
//! roofline) come from `cargo xtask bench`; the committed baseline is `benches/baseline.json`.

/// Deterministic pseudo-random f32s in [−1, 1) (splitmix64), so every run times the same data.
pub fn data(n: usize, seed: u64) -> Vec<f32> {
    let mut s = seed;
    (0..n)
        .map(|_| {
            s = s.wrapping_add(0x9E37_79B9_7F4A_7C15);
            let mut z = s;
            z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
            z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
            z ^= z >> 31;
            (z >> 40) as f32 / (1u64 << 23) as f32 - 1.0
        })
        .collect()
}

/// Asserts `got` is within `tol · (1 + |want|)` of `want` elementwise, before timing.
pub fn assert_close(what: &str, got: &[f32], want: &[f32], tol: f32) {
    assert_eq!(got.len(), want.len(), "{what}: length");
    for (i, (a, b)) in got.iter().zip(want).enumerate() {
        assert!(
            (a - b).abs() <= tol * (1.0 + b.abs()),
            "{what}: element {i} is {a}, the scalar reference {b}"
        );
    }
}

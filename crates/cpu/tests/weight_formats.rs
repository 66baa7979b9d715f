//! The CPU engine on encoded weights (bf16, f16 and ggml's quantized blocks) against the naive
//! engine on the same model: the naive engine decodes each tensor to f32 once, the CPU kernels
//! decode blocks in registers, so the weights are the same and the logits must agree as closely
//! as in f32, through every path of `linear`: the GEMV (decode), the small-batch path (a short
//! prompt), the sgemm path that decodes a block of rows at a time (a long prompt), and the
//! embedding lookup of one encoded row.

// Test code may unwrap: a failed unwrap is a failed test (clippy.toml allows it in #[test]
// functions; this covers the helpers too).
#![allow(clippy::unwrap_used)]

mod common;

use std::sync::Arc;

use kvlab_cpu::CpuEngine;
use kvlab_model::{
    GgmlType, Model, SyntheticSpec, Tensor, Tolerance, WeightFormat, compare_logits, teacher_force,
};
use kvlab_naive::NaiveEngine;
use rand::{Rng, SeedableRng};

/// Teacher-forces `prompt_len` prompt tokens and 8 more through both engines.
fn check_parity(model: &Arc<Model>, prompt_len: usize, what: &str) {
    let max = model.config.max_seq_len;
    let v = model.config.vocab_size as u32;
    let prompt: Vec<u32> = (0..prompt_len as u32).map(|i| (i * 7 + 3) % v).collect();
    let forced: Vec<u32> = (0..8).map(|i| (i * 5 + 1) % v).collect();
    let reference =
        teacher_force(&mut NaiveEngine::new(model.clone()), &prompt, &forced, max).unwrap();
    let cached = teacher_force(&mut CpuEngine::new(model.clone()), &prompt, &forced, max).unwrap();
    // verify's f32 tolerance: per position, max|Δ| ≤ 1e-4 + 1e-4·max|ref| (these models' sums
    // are wider than the f32 parity tests', so elementwise bounds would measure rounding noise).
    let c = compare_logits(&cached, &reference, Tolerance::F32);
    assert!(
        c.within_tolerance && c.positions == reference.len() && c.top1_agreement == 1.0,
        "{what}: prompt {prompt_len}: {c:?}"
    );
}

fn check_all_paths(model: Model, what: &str) {
    let model = Arc::new(model);
    // 1: GEMV only; 5: the small-batch path; 24: sgemm over decoded rows.
    for prompt_len in [1, 5, 24] {
        check_parity(&model, prompt_len, what);
    }
}

fn spec(dim: usize, hidden_dim: usize) -> SyntheticSpec {
    SyntheticSpec::new(dim, hidden_dim, 2, 4, 2, 64, 48, 7)
}

#[test]
fn bf16_and_f16_weights_agree_with_the_naive_engine() {
    for format in [WeightFormat::Bf16, WeightFormat::F16] {
        let model = spec(48, 100).build().unwrap().with_weight_format(format);
        assert!(
            model
                .matrix_dtypes()
                .iter()
                .all(|(ty, _)| *ty != GgmlType::F32)
        );
        check_all_paths(model, format.name());
    }
}

/// Random valid blocks of `ty` for `n` elements whose values lie within about ±`a`.
fn random_blocks(ty: GgmlType, n: usize, a: f32, seed: u64) -> Vec<u8> {
    let mut rng = rand_chacha::ChaCha8Rng::seed_from_u64(seed);
    let n_blocks = n / ty.block_size();
    let f16 = |v: f32| half::f16::from_f32(v).to_le_bytes();
    let mut out = Vec::with_capacity(n_blocks * ty.type_size());
    for _ in 0..n_blocks {
        let mut rand_bytes = |n: usize| (0..n).map(|_| rng.random::<u8>()).collect::<Vec<u8>>();
        match ty {
            // d, 32 × i8: values d·q.
            GgmlType::Q8_0 => {
                out.extend(f16(a / 127.0));
                out.extend(rand_bytes(32));
            }
            // d, qh, 16 bytes of nibbles: values d·(q − 16).
            GgmlType::Q5_0 => {
                out.extend(f16(a / 16.0));
                out.extend(rand_bytes(20));
            }
            // d, dmin, 12 bytes of 6-bit scales and mins, 128 bytes of nibbles:
            // values d·sc·q − dmin·m with q < 16, sc, m < 64.
            GgmlType::Q4_K => {
                out.extend(f16(2.0 * a / (15.0 * 63.0)));
                out.extend(f16(a / 63.0));
                out.extend(rand_bytes(140));
            }
            // ql, qh, 16 × i8 scales, d: values d·sc·(q − 32).
            GgmlType::Q6_K => {
                out.extend(rand_bytes(192 + 16));
                out.extend(f16(a / (32.0 * 128.0)));
            }
            other => panic!("no block generator for {other}"),
        }
    }
    out
}

/// `model` with every matrix replaced by random blocks of `ty` of about the same amplitude. A
/// matrix is a run of blocks whatever its row length (rows are whole blocks), so the blocks are
/// generated for the whole tensor at once.
fn quantized(mut model: Model, ty: GgmlType) -> Model {
    for (i, t) in model.weights.matrices_mut().enumerate() {
        let a = t.iter().fold(0.0f32, |m, v| m.max(v.abs()));
        let bytes = random_blocks(ty, t.len(), a, i as u64);
        *t = Tensor::encoded_from_bytes(ty, bytes, t.len()).expect("whole blocks");
    }
    model
}

#[test]
fn quantized_weights_agree_with_the_naive_engine() {
    // Row lengths must be whole blocks: 32 for Q8_0/Q5_0, 256 for the k-quants.
    for (ty, dim, hidden) in [
        (GgmlType::Q8_0, 64, 96),
        (GgmlType::Q5_0, 64, 96),
        (GgmlType::Q4_K, 256, 512),
        (GgmlType::Q6_K, 256, 512),
    ] {
        let model = quantized(spec(dim, hidden).build().unwrap(), ty);
        let n_matrices = 2 * 7 + 1 + usize::from(model.weights.classifier.is_some());
        assert_eq!(model.matrix_dtypes(), vec![(ty, n_matrices)], "{ty}");
        check_all_paths(model, ty.name());
    }
}

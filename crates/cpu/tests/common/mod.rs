//! What the engine tests share: finding the real checkpoints (see
//! `kvlab_model::registry::test_model_file`: a missing file is a loud skip, or a failure when
//! `KVLAB_REQUIRE_MODELS=1`), the logit tolerance, and the engines greedy text is compared on.
//! Each test binary uses a part of it.
#![allow(dead_code)]
// Test code may unwrap: a failed unwrap is a failed test (clippy.toml allows it in #[test]
// functions; this covers the helpers too).
#![allow(clippy::unwrap_used)]

use std::sync::Arc;

use kvlab_cpu::CpuEngine;
use kvlab_model::{Engine, LayerKind, Model, Tokenizer};
use kvlab_naive::NaiveEngine;

pub use kvlab_model::registry::test_model_file as model_file;

/// The shipped stories260K checkpoint and its tokenizer, or `None` after the loud skip.
pub fn stories260k() -> Option<(Arc<Model>, Tokenizer)> {
    let (Some(bin), Some(tok)) = (model_file("stories260K.bin"), model_file("tok512.bin")) else {
        return None;
    };
    let (model, tok) = kvlab_model::registry::load_llama2c(&bin, Some(&tok)).unwrap();
    Some((Arc::new(model), tok.unwrap()))
}

/// The reference and the cached engine, in that order.
pub fn naive_and_cpu(model: &Arc<Model>) -> Vec<Box<dyn Engine>> {
    vec![
        Box::new(NaiveEngine::new(model.clone())),
        Box::new(CpuEngine::new(model.clone())),
    ]
}

/// |a − b| ≤ 1e-4 + 1e-4·|b| elementwise; NaN never passes.
pub fn assert_close(a: &[f32], b: &[f32], what: &str) {
    assert_eq!(a.len(), b.len());
    for (i, (x, y)) in a.iter().zip(b).enumerate() {
        assert!(
            (x - y).abs() <= 1e-4 + 1e-4 * y.abs(),
            "{what}: logit {i}: {x} vs {y}"
        );
    }
}

/// `model` with every other layer local to a `window` (when one is given): exercises the ring
/// buffer or the paged window and the window mask together.
pub fn windowed(mut model: Model, window: Option<usize>) -> Model {
    if let Some(w) = window {
        model.config.layer_kinds = (0..model.config.n_layers)
            .map(|l| {
                if l % 2 == 0 {
                    LayerKind::Local { window: w }
                } else {
                    LayerKind::Global
                }
            })
            .collect();
    }
    model
}

/// The texts of `fixtures/prompts.txt` ([`kvlab_model::fixtures::read_prompts`]).
pub fn fixture_prompts() -> Vec<String> {
    let path = std::path::Path::new(kvlab_model::fixtures::PROMPTS);
    kvlab_model::fixtures::read_prompts(path).unwrap()
}

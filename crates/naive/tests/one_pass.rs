//! The naive engine's one-pass teacher forcing equals its own step-by-step run: the causal mask
//! really hides the future.

use std::sync::Arc;

use kvlab_model::{Engine, LayerKind, SyntheticSpec};
use kvlab_naive::NaiveEngine;
use proptest::prelude::*;

proptest! {
    #![proptest_config(ProptestConfig::with_cases(32))]
    #[test]
    fn one_pass_logits_equal_step_by_step_logits(seed in any::<u64>(), tokens in prop::collection::vec(0u32..30, 2..40), window in prop::option::of(1usize..8)) {
        let mut model = SyntheticSpec::new(16, 40, 2, 4, 2, 30, 64, seed).build().unwrap();
        if let Some(w) = window {
            model.config.layer_kinds = vec![LayerKind::Local { window: w }, LayerKind::Global];
        }
        let mut e = NaiveEngine::new(Arc::new(model));
        let from = tokens.len() / 2;
        let all = e.logits_at_every_position(&tokens, from).unwrap();
        let s = e.new_sequence(64).unwrap();
        let mut step = e.prefill(s, &tokens[..=from]).unwrap();
        for (i, row) in all.iter().enumerate() {
            for (a, b) in row.iter().zip(&step) {
                prop_assert!((a - b).abs() <= 1e-5 + 1e-5 * b.abs(), "position {}: {a} vs {b}", from + i);
            }
            if from + i + 1 < tokens.len() {
                step = e.decode(s, tokens[from + i + 1]).unwrap();
            }
        }
        prop_assert!(e.logits_at_every_position(&tokens, tokens.len()).is_err());
    }
}

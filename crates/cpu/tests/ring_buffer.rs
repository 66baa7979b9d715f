//! Sliding-window layers keep a ring buffer of `window` positions. For random small configs and
//! windows, the ring-buffer cache must give the same logits as attending over the full history
//! with a window mask (the naive engine), including prompts several windows long and decode steps
//! that wrap the ring many times, and prompts longer than one step can append to a ring
//! (`RING_STEP`), which run as several steps.

mod common;

use std::sync::Arc;

use common::assert_close;

use kvlab_cpu::CpuEngine;
use kvlab_cpu::kv_cache::RING_STEP;
use kvlab_model::{Engine, LayerKind, SyntheticSpec, teacher_force};
use kvlab_naive::NaiveEngine;
use proptest::prelude::*;

proptest! {
    #![proptest_config(ProptestConfig::with_cases(48))]

    #[test]
    fn ring_buffer_equals_full_cache_with_window_mask(
        seed in any::<u64>(),
        window in 1usize..12,
        local_every in 1usize..=3,
        prompt in prop::collection::vec(0u32..32, 1..40),
        forced in prop::collection::vec(0u32..32, 1..40),
    ) {
        let mut model = SyntheticSpec::new(16, 40, 3, 4, 1, 32, 96, seed).build().unwrap();
        // Layers l with l % local_every != local_every - 1 are local (Gemma's pattern is 6).
        model.config.layer_kinds = (0..3)
            .map(|l| if l % local_every != local_every - 1 { LayerKind::Local { window } } else { LayerKind::Global })
            .collect();
        let model = Arc::new(model);
        let mut cpu = CpuEngine::new(model.clone());
        let full = teacher_force(&mut NaiveEngine::new(model.clone()), &prompt, &forced, 96).unwrap();
        let ring = teacher_force(&mut cpu, &prompt, &forced, 96).unwrap();
        for (step, (a, b)) in ring.iter().zip(&full).enumerate() {
            for (x, y) in a.iter().zip(b) {
                prop_assert!((x - y).abs() <= 1e-4 + 1e-4 * y.abs(), "step {step}: {x} vs {y}");
            }
        }
        // The ring buffer reserves window − 1 + RING_STEP slots for local layers, not the whole
        // context.
        let s = cpu.new_sequence(96).unwrap();
        let locals = model.config.layer_kinds.iter().filter(|k| matches!(k, LayerKind::Local { .. })).count();
        let ring = (window - 1 + RING_STEP).min(96);
        let expected = 2 * 4 * model.config.kv_dim() * ((3 - locals) * 96 + locals * ring);
        prop_assert_eq!(cpu.kv_usage().reserved_bytes, expected);
        cpu.free(s);
    }
}

/// A prompt of several ring steps (more than RING_STEP + window tokens): the engine runs it in
/// steps that never overwrite a slot a query of the same step still reads.
#[test]
fn a_prompt_longer_than_a_ring_step_runs_in_steps() {
    for window in [1, 5, 64] {
        let spec = SyntheticSpec::new(16, 40, 3, 4, 2, 32, 400, 7);
        let mut model = spec.build().unwrap();
        model.config.layer_kinds = vec![
            LayerKind::Local { window },
            LayerKind::Global,
            LayerKind::Local { window },
        ];
        let model = Arc::new(model);
        let prompt: Vec<u32> = (0..2 * RING_STEP as u32 + window as u32 + 7)
            .map(|i| (i * 7 + 3) % 32)
            .collect();
        let forced: Vec<u32> = (0..20).map(|i| (i * 5 + 1) % 32).collect();
        let full =
            teacher_force(&mut NaiveEngine::new(model.clone()), &prompt, &forced, 400).unwrap();
        let ring =
            teacher_force(&mut CpuEngine::new(model.clone()), &prompt, &forced, 400).unwrap();
        assert_eq!(ring.len(), full.len());
        for (step, (a, b)) in ring.iter().zip(&full).enumerate() {
            assert_close(a, b, &format!("window {window} step {step}"));
        }
    }
}

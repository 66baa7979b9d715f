//! Sliding-window layers keep a ring buffer of `window` positions. For random small configs and
//! windows, the ring-buffer cache must give the same logits as attending over the full history
//! with a window mask (the naive engine), including prompts several windows long and decode steps
//! that wrap the ring many times.

use std::sync::Arc;

use kvlab_cpu::CpuEngine;
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
        // The ring buffer reserves window positions for local layers, not the whole context.
        let s = cpu.new_sequence(96).unwrap();
        let locals = model.config.layer_kinds.iter().filter(|k| matches!(k, LayerKind::Local { .. })).count();
        let expected = 2 * 4 * model.config.kv_dim() * ((3 - locals) * 96 + locals * window.min(96));
        prop_assert_eq!(cpu.kv_usage().reserved_bytes, expected);
        cpu.free(s);
    }
}

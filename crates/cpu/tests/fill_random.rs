//! `Engine::fill_random` (how `kvlab depth --fill random` reaches a deep context without
//! computing it): the positions count as cached, a decode step after them attends over them
//! (its logits depend on the seed, are finite and are the same for the same seed), every KV
//! dtype and a sliding-window ring take them, a fill past the context is refused, and an engine
//! that cannot fill says so.

mod common;

use std::sync::Arc;

use kvlab_cpu::CpuEngine;
use kvlab_model::{Engine, Error, KvDtype};

#[test]
fn random_positions_are_cached_and_attended_over() {
    let Some((model, _)) = common::stories260k() else {
        return;
    };
    for window in [None, Some(16)] {
        let m = Arc::new(common::windowed((*model).clone(), window));
        for kv in KvDtype::ALL {
            let what = format!("{window:?} {kv}");
            let mut engine = CpuEngine::with_kv_dtype(m.clone(), kv);
            let decode_after = |engine: &mut CpuEngine, seed: u64| {
                let seq = engine.new_sequence(256).unwrap();
                assert!(engine.fill_random(seq, 200, seed).unwrap(), "{what}");
                let logits = engine.decode(seq, 7).unwrap();
                assert_eq!(engine.trace(seq).unwrap().len, 201, "{what}");
                engine.free(seq);
                logits
            };
            let a = decode_after(&mut engine, 1);
            assert!(a.iter().all(|x| x.is_finite()), "{what}");
            assert_eq!(a, decode_after(&mut engine, 1), "{what}: same seed");
            assert_ne!(a, decode_after(&mut engine, 2), "{what}: another seed");
            // Not what token 7 alone at position 0 gives: the step read the filled rows.
            let seq = engine.new_sequence(256).unwrap();
            assert_ne!(a, engine.decode(seq, 7).unwrap(), "{what}");
            // After that decode the sequence holds 1 position: 255 more fit, 256 do not.
            assert!(matches!(
                engine.fill_random(seq, 256, 3),
                Err(Error::ContextFull { pos: 256, .. })
            ));
            assert!(engine.fill_random(seq, 255, 3).unwrap(), "{what}");
        }
    }
}

#[test]
fn an_engine_that_cannot_fill_says_so() {
    let Some((model, _)) = common::stories260k() else {
        return;
    };
    let mut naive = kvlab_naive::NaiveEngine::new(model);
    let seq = naive.new_sequence(64).unwrap();
    assert!(!naive.fill_random(seq, 10, 0).unwrap());
}

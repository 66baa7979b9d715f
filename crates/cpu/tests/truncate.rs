//! `Engine::truncate` (how a chat keeps the cached part of a conversation whose end changed):
//! after cutting a sequence back and feeding new tokens, the cpu and naive engines give the
//! logits of a fresh run over the kept prefix plus the new tokens; a sliding-window ring that
//! has overwritten keys the next query needs refuses, rather than attending over wrong ones.

mod common;

use std::sync::Arc;

#[test]
fn a_truncated_sequence_continues_as_a_fresh_one() {
    let Some((model, _)) = common::stories260k() else {
        return;
    };
    let ids: Vec<u32> = (0..140).map(|i| 1 + (i * 37 % 500) as u32).collect();
    let branch: Vec<u32> = vec![7, 99, 300, 42, 5];
    for window in [None, Some(16)] {
        let m = Arc::new(common::windowed((*model).clone(), window));
        for (name, mut engine) in ["naive", "cpu"].into_iter().zip(common::naive_and_cpu(&m)) {
            let seq = engine.new_sequence(256).unwrap();
            engine.prefill(seq, &ids[..100]).unwrap();
            // 40 positions back: within a 16-window ring of 16 − 1 + 64 slots.
            assert!(engine.truncate(seq, 60).unwrap(), "{name} {window:?}");
            let got = engine.prefill(seq, &branch).unwrap();
            let fresh_seq = engine.new_sequence(256).unwrap();
            let fresh = engine
                .prefill(fresh_seq, &[&ids[..60], &branch[..]].concat())
                .unwrap();
            common::assert_close(&got, &fresh, &format!("{name} {window:?}"));
            // Cutting past what the ring still holds is refused by the cpu engine.
            engine.prefill(seq, &ids[..100]).unwrap();
            let far = engine.truncate(seq, 10).unwrap();
            assert_eq!(
                far,
                window.is_none() || name == "naive",
                "{name} {window:?}"
            );
            assert!(!engine.truncate(seq, 10_000).unwrap(), "beyond the end");
            engine.free(seq);
            engine.free(fresh_seq);
        }
    }
}

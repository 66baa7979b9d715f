//! `Engine::truncate` (how a chat keeps the cached part of a conversation whose end changed):
//! after cutting a sequence back and feeding new tokens, the cpu, cpu-paged and naive engines give the
//! logits of a fresh run over the kept prefix plus the new tokens; a sliding-window ring that
//! has overwritten keys the next query needs refuses, rather than attending over wrong ones.

mod common;

use std::sync::Arc;

/// A 140-token prompt and the 5 tokens fed after a cut.
fn prompt_and_branch() -> (Vec<u32>, Vec<u32>) {
    let ids = (0..140).map(|i| 1 + (i * 37 % 500) as u32).collect();
    (ids, vec![7, 99, 300, 42, 5])
}

#[test]
fn a_truncated_sequence_continues_as_a_fresh_one() {
    let Some((model, _)) = common::stories260k() else {
        return;
    };
    let (ids, branch) = prompt_and_branch();
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

#[test]
fn a_ring_that_never_wrapped_cuts_anywhere() {
    use kvlab_model::Engine;
    let Some((model, _)) = common::stories260k() else {
        return;
    };
    // A sequence of 60 positions with a window of 16: its ring is min(16 − 1 + 64, 60) = 60
    // slots, so nothing is ever overwritten and any cut keeps every key.
    let m = Arc::new(common::windowed((*model).clone(), Some(16)));
    let mut engine = kvlab_cpu::CpuEngine::new(m);
    let (ids, branch) = prompt_and_branch();
    let seq = engine.new_sequence(60).unwrap();
    engine.prefill(seq, &ids[..58]).unwrap();
    // 53 back: past what a wrapped ring of 60 would hold for a window of 16 (5 + 1 + 60 < 58
    // + 16), yet nothing was overwritten.
    assert!(engine.truncate(seq, 5).unwrap(), "nothing was overwritten");
    let got = engine.prefill(seq, &branch).unwrap();
    let fresh_seq = engine.new_sequence(60).unwrap();
    let fresh = engine
        .prefill(fresh_seq, &[&ids[..5], &branch[..]].concat())
        .unwrap();
    common::assert_close(&got, &fresh, "cut at 5 of 58");
}

#[test]
fn the_paged_engine_cuts_its_block_tables() {
    use kvlab_cpu::paged::PagedCpuEngine;
    use kvlab_model::Engine;
    let Some((model, _)) = common::stories260k() else {
        return;
    };
    let (ids, branch) = prompt_and_branch();
    for window in [None, Some(16)] {
        let m = Arc::new(common::windowed((*model).clone(), window));
        let kv = kvlab_paged::KvCacheConfig::new(m.config.kv_cache_groups(), 128, 8);
        let mut engine = PagedCpuEngine::new(m.clone(), kv).unwrap();
        let mut contiguous = kvlab_cpu::CpuEngine::new(m.clone());
        let fresh = |engine: &mut kvlab_cpu::CpuEngine, tokens: &[u32]| {
            let seq = engine.new_sequence(256).unwrap();
            let logits = engine.prefill(seq, tokens).unwrap();
            engine.free(seq);
            logits
        };
        let seq = engine.new_sequence(256).unwrap();
        engine.prefill(seq, &ids[..100]).unwrap();
        let used = engine.kv_usage().used_bytes;
        // A windowed prefill of 100 stores only the keys later queries read (85..100), so the
        // query at 60 would miss its keys: refused.
        let cut = engine.truncate(seq, 60).unwrap();
        assert_eq!(cut, window.is_none(), "{window:?}");
        if cut {
            assert!(
                engine.kv_usage().used_bytes < used,
                "blocks past 60 went back"
            );
            let got = engine.prefill(seq, &branch).unwrap();
            let want = fresh(&mut contiguous, &[&ids[..60], &branch[..]].concat());
            common::assert_close(&got, &want, &format!("paged {window:?}"));
        }
        engine.free(seq);
        // Decoded one position at a time, a window keeps the last keys: a cut of 3 positions,
        // mid-block, continues as a fresh run.
        let seq = engine.new_sequence(256).unwrap();
        engine.prefill(seq, &ids[..20]).unwrap();
        for &t in &ids[20..30] {
            engine.decode(seq, t).unwrap();
        }
        assert!(engine.truncate(seq, 27).unwrap(), "{window:?}");
        let got = engine.prefill(seq, &branch).unwrap();
        let want = fresh(&mut contiguous, &[&ids[..27], &branch[..]].concat());
        common::assert_close(&got, &want, &format!("paged decode {window:?}"));
        assert!(!engine.truncate(seq, 10_000).unwrap(), "beyond the end");
        engine.free(seq);
        assert_eq!(engine.kv_usage().used_bytes, 0, "every block is back");
    }
}

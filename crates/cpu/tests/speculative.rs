//! Speculative decoding with prompt lookup gives exactly plain greedy decoding's tokens on the
//! naive, cpu and cpu-paged engines, with full attention and with a sliding window of 16 (the
//! contiguous engine's ring and the paged pool's window blocks roll back), at k = 1, 4 and 8; the
//! cpu engine's one-step `score` matches decoding the same tokens one at a time.

// Test code may unwrap: a failed unwrap is a failed test (clippy.toml allows it in #[test]
// functions; this covers the helpers too).
#![allow(clippy::unwrap_used)]

mod common;

use std::sync::Arc;

use kvlab_cpu::paged::PagedCpuEngine;
use kvlab_model::{
    Engine, GenerateOptions, Model, NgramProposer, Sampler, Speculative, generate_tokens,
};

fn engines(m: &Arc<Model>) -> Vec<Box<dyn Engine>> {
    let kv = kvlab_paged::KvCacheConfig::new(m.config.kv_cache_groups(), 64, 8);
    let mut all = common::naive_and_cpu(m);
    all.push(Box::new(PagedCpuEngine::new(m.clone(), kv).unwrap()));
    all
}

fn run(
    engine: &mut dyn Engine,
    prompt: &[u32],
    spec: Option<Speculative>,
) -> kvlab_model::Generation {
    let opts = GenerateOptions {
        steps: prompt.len() + 80,
        max_seq_len: 0,
        trace: false,
        special: false,
        ubatch: 0,
        speculative: spec,
    };
    generate_tokens(engine, prompt, &opts, &mut Sampler::greedy(), |_| {}).unwrap()
}

#[test]
fn speculative_greedy_is_plain_greedy_on_every_cpu_engine() {
    let Some((model, tok)) = common::stories260k() else {
        return;
    };
    // A text that repeats itself (guesses kept) and one that does not (guesses rejected).
    let repeating = tok.encode(
        "Lily saw a big red ball. Lily saw a big red ball. Lily saw a big red ball. Lily saw",
        true,
        false,
    );
    let other: Vec<u32> = (0..40).map(|i| 1 + (i * 37 % 500) as u32).collect();
    for window in [None, Some(16)] {
        let m = Arc::new(common::windowed((*model).clone(), window));
        for mut engine in engines(&m) {
            let name = engine.name();
            let (mut kept, mut rollbacks) = (0, 0);
            for prompt in [&repeating, &other] {
                let plain = run(engine.as_mut(), prompt, None);
                for k in [1, 4, 8] {
                    let spec = Speculative {
                        ngram: NgramProposer::default(),
                        num_speculative_tokens: k,
                    };
                    let g = run(engine.as_mut(), prompt, Some(spec));
                    assert_eq!(g.tokens, plain.tokens, "{name} {window:?} k={k}");
                    assert_eq!(g.stopped, plain.stopped, "{name} {window:?} k={k}");
                    assert!(g.decode_steps <= plain.decode_steps, "{name}: more steps");
                    kept += g.spec.num_accepted_tokens;
                    rollbacks += g.spec.num_rollbacks;
                }
            }
            assert!(kept > 0, "{name} {window:?}: no guess was ever kept");
            assert!(
                rollbacks > 0,
                "{name} {window:?}: nothing was ever rolled back"
            );
        }
    }
}

#[test]
fn speculative_decoding_refuses_a_temperature() {
    let Some((model, _)) = common::stories260k() else {
        return;
    };
    let mut engine = kvlab_cpu::CpuEngine::new(model);
    let opts = GenerateOptions {
        steps: 20,
        max_seq_len: 0,
        trace: false,
        special: false,
        ubatch: 0,
        speculative: Some(Speculative {
            ngram: NgramProposer::default(),
            num_speculative_tokens: 4,
        }),
    };
    let mut hot = Sampler::new(0.8, 1.0, 1).unwrap();
    let err = generate_tokens(&mut engine, &[1, 2, 3], &opts, &mut hot, |_| {}).unwrap_err();
    assert!(err.to_string().contains("--temp 0"), "{err}");
}

#[test]
fn one_score_step_gives_every_row_a_decode_would() {
    let Some((model, _)) = common::stories260k() else {
        return;
    };
    let ids: Vec<u32> = (0..30).map(|i| 1 + (i * 11 % 400) as u32).collect();
    for window in [None, Some(16)] {
        let m = Arc::new(common::windowed((*model).clone(), window));
        let mut cpu = kvlab_cpu::CpuEngine::new(m.clone());
        let a = cpu.new_sequence(64).unwrap();
        cpu.prefill(a, &ids[..20]).unwrap();
        let rows = cpu.score(a, &ids[20..]).unwrap();
        let b = cpu.new_sequence(64).unwrap();
        cpu.prefill(b, &ids[..20]).unwrap();
        assert_eq!(rows.len(), 10);
        for (i, row) in rows.iter().enumerate() {
            let one = cpu.decode(b, ids[20 + i]).unwrap();
            common::assert_close(row, &one, &format!("{window:?} row {i}"));
        }
    }
}

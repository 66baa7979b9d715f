//! The cached CPU engine against the naive reference: same logits at every position.

// Test code may unwrap: a failed unwrap is a failed test (clippy.toml allows it in #[test]
// functions; this covers the helpers too).
#![allow(clippy::unwrap_used)]

mod common;

use std::sync::Arc;

use common::{assert_close, windowed};
use kvlab_cpu::CpuEngine;
use kvlab_model::{
    Engine, GenerateOptions, Model, Sampler, SyntheticSpec, generate_tokens, teacher_force,
};
use kvlab_naive::NaiveEngine;
use proptest::prelude::*;

fn check_parity(model: Model, prompt: &[u32], forced: &[u32]) {
    let model = Arc::new(model);
    let max = model.config.max_seq_len;
    let reference =
        teacher_force(&mut NaiveEngine::new(model.clone()), prompt, forced, max).unwrap();
    let cached = teacher_force(&mut CpuEngine::new(model.clone()), prompt, forced, max).unwrap();
    for (pos, (a, b)) in cached.iter().zip(&reference).enumerate() {
        assert_close(a, b, &format!("step {pos}"));
    }
    // Token by token (every position a decode) must agree too.
    let mut one = CpuEngine::new(model);
    let seq = one.new_sequence(max).unwrap();
    let mut last = Vec::new();
    for &t in prompt {
        last = one.decode(seq, t).unwrap();
    }
    assert_close(&last, &reference[0], "prompt fed token by token");
}

fn arb_case() -> impl Strategy<Value = (SyntheticSpec, Vec<u32>, Vec<u32>, Option<usize>)> {
    // (n_kv_heads, group): MHA, GQA (an odd group too: heads that pair up and one left over) and
    // MQA.
    (
        1usize..=2,
        prop_oneof![Just(1usize), Just(2), Just(3), Just(4)],
        1usize..=3,
        any::<u64>(),
        1usize..=3,
    )
        .prop_flat_map(|(n_kv, group, layers, seed, hd_mult)| {
            let n_heads = n_kv * group;
            let dim = n_heads * 4 * hd_mult;
            let spec = SyntheticSpec::new(dim, dim * 2 + 4, layers, n_heads, n_kv, 40, 48, seed);
            (
                Just(spec),
                prop::collection::vec(0u32..40, 1..20),
                prop::collection::vec(0u32..40, 0..20),
                prop::option::of(1usize..12),
            )
        })
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(64))]

    /// For random small configs (MHA, GQA, MQA, with and without sliding windows) and random
    /// prompts, the CPU engine's logits match the naive engine's at every position within
    /// relative 1e-4 and absolute 1e-4.
    #[test]
    fn cpu_logits_match_naive_at_every_position((spec, prompt, forced, window) in arb_case()) {
        check_parity(windowed(spec.build().unwrap(), window), &prompt, &forced);
    }
}

#[test]
fn shared_classifier_and_long_prompts_agree() {
    let mut spec = SyntheticSpec::new(32, 72, 2, 4, 2, 64, 300, 9);
    spec.shared_classifier = true;
    let prompt: Vec<u32> = (0..250).map(|i| (i * 7 % 64) as u32).collect();
    check_parity(spec.build().unwrap(), &prompt, &[3, 4, 5]);
}

#[test]
fn stories260k_generates_the_llama2c_reference() {
    let Some((model, tok)) = common::stories260k() else {
        return;
    };
    let prompt = tok.encode("Once upon a time", true, false);
    assert_eq!(prompt, [1, 403, 407, 261, 378]);
    // llama2.c run.c's output on stories260K, temperature 0, 256 positions (the same ids from an
    // unoptimised and an -Ofast build of run.c).
    let expected = [
        432, 383, 286, 261, 376, 298, 315, 421, 395, 317, 426, 338, 401, 396, 267, 337, 410, 408,
        419, 292, 411, 322, 265, 282,
    ];
    let opts = GenerateOptions {
        ubatch: 0,
        speculative: None,
        steps: 256,
        max_seq_len: 0,
        trace: false,
        special: false,
    };
    for e in common::naive_and_cpu(&model).iter_mut() {
        let g =
            generate_tokens(e.as_mut(), &prompt, &opts, &mut Sampler::greedy(), |_| {}).unwrap();
        assert_eq!(&g.tokens[..24], &expected, "{} engine", e.name());
        let text = tok.decode_all(&[&prompt[..], &g.tokens[..]].concat(), false);
        assert!(text.starts_with("Once upon a time, there was a little girl named Lily. She loved to play outside in the park. One day, she saw a big, red ball. She wanted to play with it, but it was too high."), "{}: {text}", e.name());
    }
}

/// Pitfall "wrong mask with a cache": a prompt prefilled in two chunks must equal one prefill —
/// the second chunk's query t sees the cached prefix plus keys up to its own position.
/// Pitfall "forgetting to reset the cache": sequences on one engine, one after the other or
/// interleaved, must each equal a fresh engine's run.
#[test]
fn chunked_prefill_and_reused_engines_agree_with_fresh_runs() {
    let spec = SyntheticSpec::new(32, 72, 2, 4, 1, 64, 128, 21);
    let model = Arc::new(spec.build().unwrap());
    let prompt: Vec<u32> = (0..40).map(|i| (i * 11 % 64) as u32).collect();
    let other: Vec<u32> = (0..25).map(|i| (i * 3 % 64) as u32).collect();
    let fresh = |p: &[u32]| {
        let mut e = CpuEngine::new(model.clone());
        let s = e.new_sequence(128).unwrap();
        e.prefill(s, p).unwrap()
    };
    let (want_a, want_b) = (fresh(&prompt), fresh(&other));
    let kv_cache = kvlab_paged::KvCacheConfig::new(model.config.kv_cache_groups(), 32, 8);
    let engines: Vec<Box<dyn Engine>> = vec![
        Box::new(CpuEngine::new(model.clone())),
        Box::new(kvlab_cpu::paged::PagedCpuEngine::new(model.clone(), kv_cache).unwrap()),
        Box::new(NaiveEngine::new(model.clone())),
    ];
    for mut e in engines {
        // Two chunks.
        let s = e.new_sequence(128).unwrap();
        e.prefill(s, &prompt[..17]).unwrap();
        let chunked = e.prefill(s, &prompt[17..]).unwrap();
        assert_close(&chunked, &want_a, &format!("{}: chunked prefill", e.name()));
        // Interleaved with another sequence, then reused after free.
        let t = e.new_sequence(128).unwrap();
        let b = e.prefill(t, &other).unwrap();
        assert_close(&b, &want_b, &format!("{}: second sequence", e.name()));
        e.free(s);
        e.free(t);
        let u = e.new_sequence(128).unwrap();
        let again = e.prefill(u, &prompt).unwrap();
        assert_close(
            &again,
            &want_a,
            &format!("{}: sequence after free", e.name()),
        );
        assert!(e.kv_usage().used_bytes <= e.kv_usage().reserved_bytes);
    }
}

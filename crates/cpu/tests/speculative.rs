//! Speculative decoding with prompt lookup or a draft model gives exactly plain greedy decoding's
//! tokens on the naive, cpu and cpu-paged engines, with full attention and with a sliding window
//! of 16 (the contiguous engine's ring and the paged pool's window blocks roll back, the draft's
//! cache too), at k = 1, 4 and 8; speculative sampling keeps plain sampling's distribution with
//! either proposer; the cpu engine's one-step `score` matches decoding the same tokens one at a
//! time.

// Test code may unwrap: a failed unwrap is a failed test (clippy.toml allows it in #[test]
// functions; this covers the helpers too).
#![allow(clippy::unwrap_used)]

mod common;

use std::sync::Arc;

use kvlab_cpu::paged::PagedCpuEngine;
use kvlab_model::{
    DraftModel, Engine, GenerateOptions, Model, NgramProposer, Proposer, Sampler, Speculative,
    generate_tokens,
};

fn engines(m: &Arc<Model>) -> Vec<Box<dyn Engine>> {
    let kv = kvlab_paged::KvCacheConfig::new(m.config.kv_cache_groups(), 64, 8);
    let mut all = common::naive_and_cpu(m);
    all.push(Box::new(PagedCpuEngine::new(m.clone(), kv).unwrap()));
    all
}

/// `n_new` tokens after `prompt` by `sampler`, speculatively with `spec`.
fn generate(
    engine: &mut dyn Engine,
    (prompt, n_new): (&[u32], usize),
    spec: Option<Speculative>,
    sampler: &mut Sampler,
) -> kvlab_model::Generation {
    let opts = GenerateOptions {
        steps: prompt.len() + n_new,
        max_seq_len: 0,
        trace: false,
        special: false,
        ubatch: 0,
        speculative: spec,
    };
    generate_tokens(engine, prompt, &opts, sampler, |_| {}).unwrap()
}

/// 80 greedy tokens after `prompt`.
fn run(
    engine: &mut dyn Engine,
    prompt: &[u32],
    spec: Option<Speculative>,
) -> kvlab_model::Generation {
    generate(engine, (prompt, 80), spec, &mut Sampler::greedy())
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
                    let spec = Speculative::ngram(NgramProposer::default(), k);
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

/// A draft for `model`: its first `n_layers` layers and its classifier (an early exit, the draft
/// of LayerSkip's self-speculation), so it shares the tokenizer and often agrees with the whole
/// model; on the cpu engine.
fn early_exit(model: &Model, n_layers: usize) -> Speculative {
    let m = model.early_exit(n_layers).unwrap();
    let vocab = m.config.vocab_size;
    let engine = Box::new(kvlab_cpu::CpuEngine::new(Arc::new(m)));
    Speculative {
        proposer: Proposer::Draft(DraftModel::new(engine, vocab).unwrap()),
        num_speculative_tokens: 4,
    }
}

#[test]
fn a_draft_model_gives_plain_greedy_tokens_on_every_cpu_engine() {
    let Some((model, tok)) = common::stories260k() else {
        return;
    };
    let prompt = tok.encode(
        "Once upon a time, there was a little dog named",
        true,
        false,
    );
    for window in [None, Some(16)] {
        let m = Arc::new(common::windowed((*model).clone(), window));
        for mut engine in engines(&m) {
            let name = engine.name();
            let plain = run(engine.as_mut(), &prompt, None);
            // The whole model as its own draft: (nearly) every guess kept.
            let mut whole = early_exit(&m, m.config.n_layers);
            whole.num_speculative_tokens = 8;
            let g = run(engine.as_mut(), &prompt, Some(whole));
            assert_eq!(
                g.tokens, plain.tokens,
                "{name} {window:?} whole-model draft"
            );
            let rate = g.spec.acceptance_rate();
            assert!(
                rate > 0.9,
                "{name} {window:?}: the model as its own draft kept {rate}"
            );
            assert!(
                g.decode_steps * 3 < plain.decode_steps,
                "{name}: too many steps"
            );
            // Two of five layers: guesses kept and rejected, the draft's cache rolled back.
            for k in [1, 4, 8] {
                let mut spec = early_exit(&m, 2);
                spec.num_speculative_tokens = k;
                let g = run(engine.as_mut(), &prompt, Some(spec));
                assert_eq!(g.tokens, plain.tokens, "{name} {window:?} k={k}");
                assert_eq!(g.stopped, plain.stopped, "{name} {window:?} k={k}");
                assert!(
                    g.spec.num_accepted_tokens > 0,
                    "{name} {window:?} k={k}: none kept"
                );
                assert!(
                    g.spec.num_rollbacks > 0,
                    "{name} {window:?} k={k}: no rollback"
                );
            }
        }
    }
}

#[test]
fn a_draft_with_another_vocabulary_is_refused() {
    let Some((model, _)) = common::stories260k() else {
        return;
    };
    let engine = Box::new(kvlab_cpu::CpuEngine::new(model.clone()));
    let err = DraftModel::new(engine, model.config.vocab_size + 1).unwrap_err();
    assert!(err.to_string().contains("tokenizer"), "{err}");
}

type Histogram = std::collections::BTreeMap<(usize, u32), f64>;

/// Empirical distribution of the 2nd, 3rd and 4th generated token (each on its own) over seeds,
/// and the guesses kept.
fn histogram(
    engine: &mut dyn Engine,
    prompt: &[u32],
    spec: impl Fn() -> Option<Speculative>,
    seeds: std::ops::Range<u64>,
) -> (Histogram, usize) {
    let (mut h, mut kept, n) = (Histogram::new(), 0, seeds.end - seeds.start);
    for seed in seeds {
        let mut sampler = Sampler::new(1.0, 1.0, seed).unwrap().with_top_k(8);
        let g = generate(engine, (prompt, 5), spec(), &mut sampler);
        kept += g.spec.num_accepted_tokens;
        // Tokens 2 to 4: the ones speculative sampling chooses (the first comes from the prefill).
        for (i, &t) in g.tokens.iter().enumerate().skip(1).take(3) {
            *h.entry((i, t)).or_insert(0.0) += 1.0 / n as f64;
        }
    }
    (h, kept)
}

/// The largest total variation distance between the two histograms' distributions of one
/// position.
fn tv(a: &Histogram, b: &Histogram) -> f64 {
    (1..4)
        .map(|i| {
            let keys: std::collections::BTreeSet<u32> = (a.keys().chain(b.keys()))
                .filter(|k| k.0 == i)
                .map(|k| k.1)
                .collect();
            let at = |h: &Histogram, t| *h.get(&(i, t)).unwrap_or(&0.0);
            keys.iter()
                .map(|&t| (at(a, t) - at(b, t)).abs())
                .sum::<f64>()
                / 2.0
        })
        .fold(0.0, f64::max)
}

#[test]
fn speculative_sampling_keeps_the_distribution_of_plain_sampling() {
    let Some((model, tok)) = common::stories260k() else {
        return;
    };
    let prompt = tok.encode(
        "Lily saw a big red ball. Lily saw a big red ball. Lily saw",
        true,
        false,
    );
    let mut engine = kvlab_cpu::CpuEngine::new(model.clone());
    let n = 3000;
    let (plain, _) = histogram(&mut engine, &prompt, || None, 0..n);
    let (plain2, _) = histogram(&mut engine, &prompt, || None, n..2 * n);
    let noise = tv(&plain, &plain2);
    let ngram = || Some(Speculative::ngram(NgramProposer::default(), 4));
    let draft = || Some(early_exit(&model, 2));
    for (i, (what, spec)) in [
        ("prompt lookup", &ngram as &dyn Fn() -> Option<Speculative>),
        ("draft", &draft),
    ]
    .into_iter()
    .enumerate()
    {
        let seeds = (2 + i as u64) * n..(3 + i as u64) * n;
        let (specd, kept) = histogram(&mut engine, &prompt, spec, seeds);
        assert!(
            kept > 0,
            "{what}: no guess was kept: the acceptance path went untested"
        );
        let d = tv(&plain, &specd);
        eprintln!("TV plain vs plain {noise:.4}, plain vs {what} {d:.4}");
        // Two plain samples differ by sampling noise alone; speculative sampling must not
        // differ from plain by more than that noise allows.
        assert!(
            d < 1.5 * noise + 0.02,
            "{what}: TV {d:.4} against noise {noise:.4}"
        );
    }
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

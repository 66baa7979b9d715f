//! The paged CPU engine against the naive reference: solo through the Engine trait, and batched
//! through the scheduler with a pool small enough to force preemption and with shared prefixes.

// Test code may unwrap: a failed unwrap is a failed test (clippy.toml allows it in #[test]
// functions; this covers the helpers too).
#![allow(clippy::unwrap_used)]

mod common;

use std::sync::Arc;

use common::{assert_close, windowed};
use kvlab_cpu::paged::PagedCpuEngine;
use kvlab_model::sampler::argmax;
use kvlab_model::{Engine, Model, SyntheticSpec, teacher_force};
use kvlab_naive::NaiveEngine;
use kvlab_paged::{
    KvCacheConfig, Request, RestoreCost, Scheduler, SchedulerConfig, Sessions, StepExecutor,
    StopConditions, TierConfig, drive, session_turns,
};
use proptest::prelude::*;

/// The model of the batched tests: 2 layers, GQA (4 heads, 2 KV heads), 96 positions.
fn small_model() -> Arc<Model> {
    Arc::new(
        SyntheticSpec::new(32, 64, 2, 4, 2, 64, 96, 5)
            .build()
            .unwrap(),
    )
}

/// Greedy tokens of a solo naive run.
fn naive_greedy(model: &Arc<Model>, prompt: &[u32], n: usize) -> Vec<u32> {
    let mut e = NaiveEngine::new(model.clone());
    let s = e.new_sequence(model.config.max_seq_len).unwrap();
    let mut logits = e.prefill(s, prompt).unwrap();
    let mut out = Vec::new();
    for _ in 0..n {
        let t = argmax(&logits);
        out.push(t);
        if out.len() < n {
            logits = e.decode(s, t).unwrap();
        }
    }
    out
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(32))]

    /// Solo: logits at every position equal the naive engine's, for any block size and window.
    #[test]
    fn paged_solo_matches_naive(seed in any::<u64>(), kv in 1usize..=2, group in 1usize..=2, block_size in 1usize..=8,
                                prompt in prop::collection::vec(0u32..40, 1..24), forced in prop::collection::vec(0u32..40, 0..24),
                                window in prop::option::of(1usize..10)) {
        let heads = kv * group;
        let model = Arc::new(windowed(SyntheticSpec::new(heads * 8, 40, 2, heads, kv, 40, 64, seed).build().unwrap(), window));
        let reference = teacher_force(&mut NaiveEngine::new(model.clone()), &prompt, &forced, 64).unwrap();
        let kv_cache = KvCacheConfig::new(model.config.kv_cache_groups(), 64usize.div_ceil(block_size) + 1, block_size);
        let mut paged = PagedCpuEngine::new(model.clone(), kv_cache).unwrap();
        let got = teacher_force(&mut paged, &prompt, &forced, 64).unwrap();
        for (i, (a, b)) in got.iter().zip(&reference).enumerate() {
            assert_close(a, b, &format!("step {i}"));
        }
        // Everything is given back when the sequence ends.
        prop_assert_eq!(paged.kv_usage().used_bytes, 0);
    }
}

#[test]
fn batched_run_with_preemption_and_prefix_hits_equals_solo_naive_runs() {
    let model = small_model();
    let common: Vec<u32> = (0..40).map(|i| (i * 5 % 64) as u32).collect();
    let mut prompts: Vec<Vec<u32>> = (0..6u32)
        .map(|i| [&common[..], &[i, i + 1, i + 2]].concat())
        .collect();
    prompts.push(prompts[0].clone()); // a duplicate
    prompts.push(vec![7, 8, 9]);
    let n_new = 24;
    let requests: Vec<Request> = prompts
        .iter()
        .enumerate()
        .map(|(i, p)| Request {
            prompt: p.clone(),
            stop: StopConditions::max_tokens(n_new),
            arrival_step: i % 3 * 2,
            tenant: 0,
            resumes: false,
        })
        .collect();
    // 30 blocks of 4: at the peak the 8 sequences want ≈ 66 blocks, even sharing their prefix.
    let kv_cache = KvCacheConfig::new(model.config.kv_cache_groups(), 30, 4);
    let mut engine = PagedCpuEngine::new(model.clone(), kv_cache).unwrap();
    let mut sched = Scheduler::new(SchedulerConfig::new(engine.kv_cache().clone(), 96)).unwrap();
    let report = drive(&mut engine, &mut sched, &requests, argmax, |_, _, _| {}).unwrap();
    assert!(
        report.metrics.num_preemptions > 0,
        "the pool should force preemption: {:?}",
        report.metrics
    );
    assert!(
        report.metrics.prefix_cache_hits > 0,
        "shared prefixes should hit: {:?}",
        report.metrics
    );
    for (i, (p, (out, _))) in prompts.iter().zip(&report.outputs).enumerate() {
        assert_eq!(out, &naive_greedy(&model, p, n_new), "request {i}");
    }
}

/// Prefixes evicted from a small pool go down to host memory and disk, and requests that come
/// back with the same prefixes restore them instead of recomputing: the tokens are the naive
/// engine's, and the same as without tiers.
#[test]
fn spilled_prefixes_restore_from_host_and_disk_and_give_the_same_tokens() {
    let model = small_model();
    let prefixes: Vec<Vec<u32>> = (0..6u32)
        .map(|p| (0..16).map(|i| (p * 11 + i * 7) % 64).collect())
        .collect();
    let n_new = 8;
    let mut requests = Vec::new();
    let mut prompts = Vec::new();
    for (wave, arrival) in [(0u32, 0), (1, 60)] {
        for (i, prefix) in prefixes.iter().enumerate() {
            let prompt = [&prefix[..], &[wave + 1, i as u32 + 2, 3]].concat();
            prompts.push(prompt.clone());
            requests.push(Request {
                prompt,
                stop: StopConditions::max_tokens(n_new),
                arrival_step: arrival + i,
                tenant: 0,
                resumes: false,
            });
        }
    }
    let kv_cache = KvCacheConfig::new(model.config.kv_cache_groups(), 30, 4);
    let run = |tiers: Option<TierConfig>| {
        let mut engine = PagedCpuEngine::new(model.clone(), kv_cache.clone()).unwrap();
        let config = SchedulerConfig {
            tiers,
            ..SchedulerConfig::new(engine.kv_cache().clone(), 96)
        };
        let mut sched = Scheduler::new(config).unwrap();
        drive(&mut engine, &mut sched, &requests, argmax, |_, _, _| {}).unwrap()
    };
    let plain = run(None);
    let tiered = run(Some(
        TierConfig::host(4).with_disk(std::env::temp_dir(), 60),
    ));
    let m = &tiered.metrics;
    assert!(m.num_spills > 0 && m.num_restores > 0, "{m:?}");
    assert!(m.tier_store.bytes_read_from_disk > 0, "{m:?}");
    // The hits by where they came from add up, and both tiers served some.
    let h = m.prefix_cache_hits_by_tier;
    assert_eq!(h.pool + h.host + h.disk, m.prefix_cache_hits, "{m:?}");
    assert!(h.host > 0 && h.disk > 0, "{h:?}");
    let t = &m.tier_store;
    assert_eq!(
        t.blocks_restored_from_host + t.blocks_restored_from_disk,
        m.num_restores
    );
    assert!(t.blocks_restored_from_disk > 0, "{t:?}");
    assert!(
        m.prefix_cache_hits > plain.metrics.prefix_cache_hits,
        "restores add hits: {m:?} vs {:?}",
        plain.metrics
    );
    // A cost model under which recomputing is cheaper (1 ns a token) declines every restore;
    // one under which it is dearer (1 ms a token) restores as before. Same tokens.
    let cost = |prefill_ns_per_token| {
        TierConfig::host(64).with_restore_cost(Some(RestoreCost {
            prefill_ns_per_token,
            host_bytes_per_s: 1 << 30,
            disk_bytes_per_s: 1 << 28,
        }))
    };
    let declined = run(Some(cost(1)));
    assert_eq!(declined.metrics.num_restores, 0, "{:?}", declined.metrics);
    assert!(declined.metrics.num_restores_declined > 0);
    let accepted = run(Some(cost(1_000_000)));
    assert!(accepted.metrics.num_restores > 0, "{:?}", accepted.metrics);
    assert_eq!(accepted.metrics.num_restores_declined, 0);
    for (i, p) in prompts.iter().enumerate() {
        let want = naive_greedy(&model, p, n_new);
        assert_eq!(tiered.outputs[i].0, want, "request {i} with tiers");
        assert_eq!(plain.outputs[i].0, want, "request {i} without");
        assert_eq!(
            declined.outputs[i].0, want,
            "request {i}, restores declined"
        );
        assert_eq!(
            accepted.outputs[i].0, want,
            "request {i}, restores accepted"
        );
    }
}

/// Multi-turn sessions whose paused turns are offloaded to the tiers on purpose as they end
/// (`TierConfig::offload_paused`): their blocks leave the pool at once, the returning turns
/// restore them, and every turn's tokens are still the naive engine's.
#[test]
fn paused_sessions_offloaded_on_purpose_restore_and_give_the_same_tokens() {
    let model = small_model();
    let workload = Sessions {
        num_system_prompts: 2,
        system_len: 16,
        num_sessions: 4,
        turns_per_session: 3,
        user_len: (4, 8),
        reply_len: 8,
        turn_gap_steps: 12,
        session_gap_steps: 2,
        vocab_size: 64,
        ..Sessions::default()
    };
    let n_new = 6;
    let requests: Vec<Request> = session_turns(7, workload)
        .unwrap()
        .into_iter()
        .map(|t| Request {
            prompt: std::iter::once(1).chain(t.prompt).collect(),
            stop: StopConditions::max_tokens(n_new),
            arrival_step: t.arrival_step,
            tenant: 0,
            resumes: t.resumes,
        })
        .collect();
    assert!(requests.iter().any(|r| r.resumes) && requests.iter().any(|r| !r.resumes));
    let run = |offload: bool| {
        let kv_cache = KvCacheConfig::new(model.config.kv_cache_groups(), 20, 4);
        let mut engine = PagedCpuEngine::new(model.clone(), kv_cache).unwrap();
        let config = SchedulerConfig {
            tiers: Some(TierConfig::host(64).with_offload_paused(offload)),
            ..SchedulerConfig::new(engine.kv_cache().clone(), 64)
        };
        let mut sched = Scheduler::new(config).unwrap();
        drive(&mut engine, &mut sched, &requests, argmax, |_, _, _| {}).unwrap()
    };
    let (lazy, eager) = (run(false), run(true));
    assert_eq!(lazy.metrics.num_offloaded_blocks, 0);
    let m = &eager.metrics;
    assert!(m.num_offloaded_blocks > 0 && m.num_restores > 0, "{m:?}");
    assert!(m.num_spills >= m.num_offloaded_blocks, "{m:?}");
    for (i, r) in requests.iter().enumerate() {
        let want = naive_greedy(&model, &r.prompt, n_new);
        assert_eq!(eager.outputs[i].0, want, "turn {i}, offloaded");
        assert_eq!(lazy.outputs[i].0, want, "turn {i}, evicted lazily");
    }

    // One session whose second turn comes after idle steps. An empty step makes no moves, so
    // the first turn's blocks wait for the next step that runs; that is the second turn's, whose
    // admission takes them first: it hits all of them in the pool, and nothing is lost.
    let alone: Vec<Request> = session_turns(7, workload)
        .unwrap()
        .into_iter()
        .filter(|t| t.session == 0 && t.turn < 2)
        .map(|t| Request {
            prompt: std::iter::once(1).chain(t.prompt).collect(),
            stop: StopConditions::max_tokens(n_new),
            arrival_step: 40 * t.turn,
            tenant: 0,
            resumes: t.resumes,
        })
        .collect();
    let kv_cache = KvCacheConfig::new(model.config.kv_cache_groups(), 20, 4);
    let mut engine = PagedCpuEngine::new(model.clone(), kv_cache).unwrap();
    let config = SchedulerConfig {
        tiers: Some(TierConfig::host(64).with_offload_paused(true)),
        ..SchedulerConfig::new(engine.kv_cache().clone(), 64)
    };
    let mut sched = Scheduler::new(config).unwrap();
    let report = drive(&mut engine, &mut sched, &alone, argmax, |_, _, _| {}).unwrap();
    let m = &report.metrics;
    // The second turn's prompt starts with the first one's (not with its generated tokens).
    let shared_blocks = alone[0].prompt.len() / 4;
    assert!(
        m.prefix_cache_hits_by_tier.pool >= 4 * shared_blocks as u64,
        "the second turn should hit the first turn's {shared_blocks} prompt blocks: {m:?}"
    );
    assert!(m.num_offloaded_blocks > 0, "{m:?}");
    for (r, (out, _)) in alone.iter().zip(&report.outputs) {
        assert_eq!(out, &naive_greedy(&model, &r.prompt, n_new));
    }
}

/// A sequence started through the Engine API and a scheduled batch cannot share the pool at
/// once: the scheduler's allocator would hand out blocks the unscheduled sequence holds. The
/// engine refuses the batch until the sequence is freed, then runs it.
#[test]
fn an_unscheduled_sequence_and_a_scheduled_batch_never_overlap_in_one_pool() {
    let model = small_model();
    let kv_cache = KvCacheConfig::new(model.config.kv_cache_groups(), 32, 4);
    let mut engine = PagedCpuEngine::new(model.clone(), kv_cache).unwrap();
    let s = engine.new_sequence(64).unwrap();
    engine.prefill(s, &[1, 2, 3, 4, 5]).unwrap();
    assert!(engine.kv_usage().used_bytes > 0);
    let requests = vec![Request {
        prompt: vec![9, 8, 7],
        stop: StopConditions::max_tokens(4),
        arrival_step: 0,
        tenant: 0,
        resumes: false,
    }];
    let cfg = SchedulerConfig::new(engine.kv_cache().clone(), 96);
    let mut sched = Scheduler::new(cfg.clone()).unwrap();
    let err = drive(&mut engine, &mut sched, &requests, argmax, |_, _, _| {}).unwrap_err();
    assert!(err.to_string().contains("free them"), "{err}");
    engine.free(s);
    assert_eq!(engine.kv_usage().used_bytes, 0);
    let mut sched = Scheduler::new(cfg).unwrap();
    let report = drive(&mut engine, &mut sched, &requests, argmax, |_, _, _| {}).unwrap();
    assert_eq!(report.outputs[0].0, naive_greedy(&model, &[9, 8, 7], 4));
}

/// The engine refuses every malformed step `ModelInput::malformed_variants` builds (the same
/// list the CUDA engine's `pack_step` test refuses), naming the rule, and still runs the valid
/// step afterwards: a refused step touches nothing.
#[test]
fn malformed_steps_are_refused_with_the_reason_and_change_nothing() {
    let model = small_model();
    let kv_cache = KvCacheConfig::new(model.config.kv_cache_groups(), 32, 4);
    let mut engine = PagedCpuEngine::new(model.clone(), kv_cache.clone()).unwrap();
    let mut sched = Scheduler::new(SchedulerConfig::new(kv_cache.clone(), 64)).unwrap();
    sched
        .add_request((1..=9).collect(), StopConditions::max_tokens(3))
        .unwrap();
    sched
        .add_request(vec![3, 4], StopConditions::max_tokens(3))
        .unwrap();
    let mut decode_seen = false;
    while sched.has_unfinished() {
        let batch = sched.schedule().unwrap();
        let input = batch.model_input();
        let variants = input.malformed_variants(&kv_cache, model.config.vocab_size);
        assert!(variants.len() >= 9, "{}", variants.len());
        decode_seen |= variants.iter().any(|(w, _)| *w == "no physical block");
        for (word, bad) in variants {
            let err = engine.execute(&bad).unwrap_err().to_string();
            assert!(err.contains(word), "{word}: {err}");
        }
        let logits = engine.execute(&input).unwrap();
        let seqs = batch.seqs.iter().zip(&logits).filter(|(s, _)| s.samples);
        let sampled: Vec<_> = seqs.map(|(s, l)| (s.seq_id, argmax(l))).collect();
        sched.update(&sampled).unwrap();
    }
    assert!(decode_seen, "no step past a first block was tried");
}

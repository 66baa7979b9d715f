//! Chunked prefill in the scheduler: a prompt longer than the step's remaining budget is computed
//! a chunk per step, decodes first; only its last chunk samples; prefix hits are skipped; the
//! blocks a chunk completes are cached at once; preemption mid-prompt starts it again. The
//! outputs of a stand-in model are the same at every budget as with whole prefills
//! (`tests/props.rs` drives random budgets, windows, tiers and preemptions against a shadow pool).

// Test code may unwrap: a failed unwrap is a failed test (clippy.toml allows it in #[test]
// functions; this covers the helpers too).
#![allow(clippy::unwrap_used)]

use kvlab_paged::{
    EvictionPolicy, FinishedSeq, KvCacheConfig, KvGroupConfig, RequestId, ScheduledBatch,
    Scheduler, SchedulerConfig, StepKind, StopConditions,
};

/// A deterministic stand-in for a model: the next token depends on the whole history.
fn next_token(history: &[u32]) -> u32 {
    let mix = history.iter().enumerate().fold(7u64, |h, (i, &t)| {
        h.wrapping_mul(31)
            .wrapping_add((i as u64 + 1) * (t as u64 + 3))
    });
    (mix % 50) as u32
}

/// One full-attention pool of `num_blocks` blocks of 4 tokens, contexts of 64, prefix caching
/// on, chunked prefill under a budget of `budget` tokens.
fn config(num_blocks: usize, budget: usize) -> SchedulerConfig {
    SchedulerConfig {
        kv_cache: KvCacheConfig::new([None], num_blocks, 4),
        max_num_batched_tokens: budget,
        enable_chunked_prefill: true,
        max_num_seqs: 8,
        max_model_len: 64,
        enable_prefix_caching: true,
        eviction_policy: EvictionPolicy::Lru,
        tenant_quota: None,
        tiers: None,
    }
}

/// Samples the stand-in model's token for every sequence the batch samples.
fn step(s: &mut Scheduler, batch: &ScheduledBatch) -> Vec<FinishedSeq> {
    let next = |id| next_token(s.sequence(id).unwrap().token_ids());
    let outs: Vec<(RequestId, u32)> = (batch.seqs.iter().filter(|q| q.samples))
        .map(|q| (q.seq_id, next(q.seq_id)))
        .collect();
    s.update(&outs).unwrap()
}

/// Runs `prompts` (each for 6 tokens, all arriving at once) to the end; returns the outputs in
/// request order and every batch.
fn run(config: SchedulerConfig, prompts: &[Vec<u32>]) -> (Vec<Vec<u32>>, Vec<ScheduledBatch>) {
    let mut s = Scheduler::new(config).unwrap();
    let ids: Vec<RequestId> = prompts
        .iter()
        .map(|p| {
            s.add_request(p.clone(), StopConditions::max_tokens(6))
                .unwrap()
        })
        .collect();
    let (mut done, mut batches) = (Vec::new(), Vec::new());
    while s.has_unfinished() {
        assert!(batches.len() < 2000, "did not finish");
        let b = s.schedule().unwrap();
        done.extend(step(&mut s, &b));
        batches.push(b);
    }
    let outputs = ids
        .iter()
        .map(|id| {
            let f = done.iter().find(|f| f.seq_id == *id).unwrap();
            f.output_token_ids.clone()
        })
        .collect();
    (outputs, batches)
}

fn prompts() -> Vec<Vec<u32>> {
    let long: Vec<u32> = (0..37).map(|i| (i * 7 % 50) as u32).collect();
    let shared: Vec<u32> = long[..20].iter().copied().chain([9, 9, 9]).collect();
    vec![vec![1, 2, 3], long, shared, vec![4; 11], vec![5]]
}

#[test]
fn every_budget_gives_the_tokens_of_whole_prefills() {
    let whole = SchedulerConfig {
        enable_chunked_prefill: false,
        ..config(64, 64)
    };
    let (expected, batches) = run(whole, &prompts());
    assert!(batches.iter().all(|b| b.seqs.iter().all(|q| q.samples)));
    for budget in [1, 2, 3, 5, 8, 13, 40, 64] {
        let (got, batches) = run(config(64, budget), &prompts());
        assert_eq!(got, expected, "budget {budget}");
        for b in &batches {
            assert!(b.num_batched_tokens() <= budget, "budget {budget} exceeded");
        }
        let mut chunks = batches.iter().flat_map(|b| &b.seqs).filter(|q| !q.samples);
        if budget < 37 {
            assert!(
                chunks.next().is_some(),
                "budget {budget}: 37 tokens unchunked"
            );
        }
    }
}

#[test]
fn decodes_go_first_and_a_long_prompt_takes_what_is_left() {
    let mut s = Scheduler::new(config(64, 8)).unwrap();
    let a = s
        .add_request(vec![1, 2, 3], StopConditions::max_tokens(10))
        .unwrap();
    let b = s.schedule().unwrap();
    step(&mut s, &b);
    let long: Vec<u32> = (0..20).collect();
    let l = s
        .add_request(long.clone(), StopConditions::max_tokens(2))
        .unwrap();
    // Steps: a's decode + 7 prompt tokens, twice, then a's decode + the last 6.
    for (start, n, samples) in [(0, 7, false), (7, 7, false), (14, 6, true)] {
        let b = s.schedule().unwrap();
        assert_eq!(b.seqs.len(), 2);
        assert_eq!(
            (b.seqs[0].seq_id, b.seqs[0].kind),
            (a, StepKind::Decode),
            "the decode comes first"
        );
        let q = &b.seqs[1];
        assert_eq!(q.seq_id, l);
        assert_eq!(q.token_ids, long[start..start + n].to_vec());
        assert_eq!(q.positions, (start..start + n).collect::<Vec<_>>());
        assert_eq!(q.context_len, start + n);
        assert_eq!(q.samples, samples);
        assert_eq!(
            q.kind,
            StepKind::Prefill {
                num_cached_tokens: start,
                is_recompute: false
            }
        );
        step(&mut s, &b);
        let seq = s.sequence(l).unwrap();
        assert_eq!(seq.num_computed_tokens(), start + n);
        assert_eq!(seq.output_token_ids().len(), usize::from(samples));
    }
    let b = s.schedule().unwrap();
    assert!(b.seqs.iter().all(|q| q.kind == StepKind::Decode));
}

#[test]
fn a_budget_of_one_token_runs_one_sequence_a_step_oldest_first() {
    let (_, batches) = run(config(64, 1), &[vec![1, 2], vec![3, 4, 5]]);
    assert!(batches.iter().all(|b| b.num_batched_tokens() == 1));
    let first: Vec<u64> = batches.iter().map(|b| b.seqs[0].seq_id.0).collect();
    assert_eq!(&first[..3], &[0, 0, 0], "the first prompt, then its decode");
}

#[test]
fn chunks_cache_their_blocks_and_a_later_prompt_skips_them() {
    let mut s = Scheduler::new(config(64, 8)).unwrap();
    let long: Vec<u32> = (0..30).collect();
    s.add_request(long.clone(), StopConditions::max_tokens(1))
        .unwrap();
    for _ in 0..3 {
        // 8 tokens a step: two full blocks, registered at once.
        let b = s.schedule().unwrap();
        assert!(!b.seqs[0].samples);
        step(&mut s, &b);
    }
    // The last 6 tokens leave 2 of the budget: the twin's first chunk after its hit.
    let twin = s
        .add_request(long[..20].to_vec(), StopConditions::max_tokens(1))
        .unwrap();
    let b = s.schedule().unwrap();
    let q = b.seqs.iter().find(|q| q.seq_id == twin).unwrap();
    assert_eq!(
        q.kind,
        StepKind::Prefill {
            num_cached_tokens: 16,
            is_recompute: false
        },
        "the blocks the first prompt's chunks completed are hits"
    );
    assert_eq!(q.positions[0], 16);
}

#[test]
fn a_prompt_preempted_mid_prefill_starts_again_and_finishes() {
    // 12 blocks of 4 hold one 48-token sequence: two long prompts cannot both be cached.
    let cfg = SchedulerConfig {
        enable_prefix_caching: false,
        ..config(12, 10)
    };
    let mut cfg = cfg;
    cfg.max_model_len = 48;
    let a: Vec<u32> = (0..30).collect();
    let b: Vec<u32> = (10..40).collect();
    let (got, batches) = run(cfg.clone(), &[a.clone(), b.clone()]);
    assert!(
        batches.iter().any(|b| !b.preempted.is_empty()),
        "the pool forced a preemption"
    );
    let whole = SchedulerConfig {
        enable_chunked_prefill: false,
        max_num_batched_tokens: 64,
        kv_cache: KvCacheConfig::new([None], 64, 4),
        ..cfg
    };
    assert_eq!(got, run(whole, &[a, b]).0);
}

#[test]
fn a_sliding_window_chunk_keeps_the_keys_the_next_chunk_reads() {
    let mut cfg = config(64, 5);
    cfg.kv_cache.groups.push(KvGroupConfig {
        num_blocks: 64,
        sliding_window: Some(6),
    });
    let long: Vec<u32> = (0..23).collect();
    let mut s = Scheduler::new(cfg).unwrap();
    s.add_request(long, StopConditions::max_tokens(2)).unwrap();
    while s.has_unfinished() {
        let b = s.schedule().unwrap();
        for q in &b.seqs {
            let g = &q.groups[1];
            let first_read = (q.positions[0] + 1).saturating_sub(6);
            // Every key the next step's first query reads is either stored now or earlier.
            let next_first = (q.context_len + 1).saturating_sub(6);
            for (i, &pos) in q.positions.iter().enumerate() {
                if pos >= next_first {
                    assert!(g.slot_mapping[i] >= 0, "key {pos} dropped but read next");
                }
            }
            for j in first_read..q.positions[0] {
                assert!(g.block_table[j / 4] >= 0, "cached key {j} freed");
            }
        }
        step(&mut s, &b);
    }
}

#[test]
fn a_chunk_too_big_for_a_one_window_pool_is_halved_not_stuck() {
    // The window group's pool holds exactly one window (4 keys, blocks of 1 token) plus one
    // block: a 5-token chunk after 5 cached tokens would need 3 cached keys and its own 5.
    let cfg = SchedulerConfig {
        kv_cache: KvCacheConfig {
            block_size: 1,
            groups: vec![
                KvGroupConfig {
                    num_blocks: 10,
                    sliding_window: None,
                },
                KvGroupConfig {
                    num_blocks: 5,
                    sliding_window: Some(4),
                },
            ],
        },
        max_num_batched_tokens: 5,
        max_num_seqs: 1,
        max_model_len: 10,
        enable_prefix_caching: false,
        ..config(1, 5)
    };
    let (got, batches) = run(cfg, &[vec![0, 1, 2, 0, 1, 2, 0, 0]]);
    let sizes: Vec<usize> = batches.iter().map(|b| b.num_batched_tokens()).collect();
    assert_eq!(
        sizes,
        [5, 1, 2, 1],
        "5 tokens, a halved chunk of 3, the last 2, a decode"
    );
    assert_eq!(got[0].len(), 2, "the 10-token context ends it");
}

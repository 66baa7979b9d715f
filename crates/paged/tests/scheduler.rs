//! Unit tests of the scheduler: admission under budgets, preemption order and readmission,
//! prefix hits, copy-on-write forks, stop conditions, sliding windows and the flattened batch.

// Test code may unwrap: a failed unwrap is a failed test (clippy.toml allows it in #[test]
// functions; this covers the helpers too).
#![allow(clippy::unwrap_used)]

use kvlab_paged::{
    BlockCopy, BlockHash, DEFAULT_BLOCK_SIZE, EvictionPolicy, FinishReason, FinishedSeq,
    KvCacheConfig, KvGroupConfig, PAD_BLOCK, PAD_SLOT, PagedError, RequestId, ScheduledBatch,
    Scheduler, SchedulerConfig, SequenceStatus, StepKind, StopConditions, max_window_blocks,
};

/// A deterministic stand-in for a model: the next token depends on the whole history.
fn next_token(history: &[u32]) -> u32 {
    let mix = history.iter().enumerate().fold(7u64, |h, (i, &t)| {
        h.wrapping_mul(31)
            .wrapping_add((i as u64 + 1) * (t as u64 + 3))
    });
    (mix % 50) as u32
}

fn config(num_blocks: usize, block_size: usize, max_model_len: usize) -> SchedulerConfig {
    SchedulerConfig {
        kv_cache: KvCacheConfig::new([None], num_blocks, block_size),
        max_num_batched_tokens: max_model_len.max(16),
        // Prompts prefilled whole: these tests pin down the steps that makes
        // (tests/chunked_prefill.rs has the chunked ones).
        enable_chunked_prefill: false,
        max_num_seqs: 8,
        max_model_len,
        enable_prefix_caching: false,
        eviction_policy: EvictionPolicy::Lru,
        tenant_quota: None,
        tiers: None,
    }
}

/// Adds a request that stops after `max_tokens` generated tokens.
fn add(s: &mut Scheduler, prompt: Vec<u32>, max_tokens: usize) -> RequestId {
    s.add_request(prompt, StopConditions::max_tokens(max_tokens))
        .unwrap()
}

/// The kind of a prefill step.
fn prefill(num_cached_tokens: usize, is_recompute: bool) -> StepKind {
    StepKind::Prefill {
        num_cached_tokens,
        is_recompute,
    }
}

/// Runs `batch` with the stand-in model and feeds the samples back.
fn step(s: &mut Scheduler, batch: &ScheduledBatch) -> Vec<FinishedSeq> {
    let next = |id| next_token(s.sequence(id).unwrap().token_ids());
    let outs: Vec<(RequestId, u32)> = batch
        .seqs
        .iter()
        .filter(|q| q.samples)
        .map(|q| (q.seq_id, next(q.seq_id)))
        .collect();
    s.update(&outs).unwrap()
}

/// Runs to completion and returns every finished sequence.
fn drain(s: &mut Scheduler) -> Vec<FinishedSeq> {
    let mut done = Vec::new();
    for _ in 0..1000 {
        if !s.has_unfinished() {
            return done;
        }
        let batch = s.schedule().unwrap();
        done.extend(step(s, &batch));
    }
    panic!("did not finish in 1000 steps");
}

/// Every generated token follows from the history before it.
fn assert_model_consistent(f: &FinishedSeq) {
    let mut history = f.prompt_token_ids.clone();
    for &t in &f.output_token_ids {
        assert_eq!(t, next_token(&history), "{} at {}", f.seq_id, history.len());
        history.push(t);
    }
}

#[test]
fn one_request_prefill_then_decodes() {
    let mut s = Scheduler::new(config(16, 4, 64)).unwrap();
    let id = add(&mut s, vec![10, 11, 12, 13, 14, 15], 3);
    let b = s.schedule().unwrap();
    assert_eq!(b.seqs.len(), 1);
    let q = &b.seqs[0];
    assert_eq!(q.token_ids, vec![10, 11, 12, 13, 14, 15]);
    assert_eq!(q.positions, (0..6).collect::<Vec<_>>());
    assert_eq!(q.context_len, 6);
    assert_eq!(q.kind, prefill(0, false));
    assert_eq!(q.groups[0].slot_mapping, vec![0, 1, 2, 3, 4, 5]);
    assert_eq!(q.groups[0].block_table, vec![0, 1]);
    assert!(s.update(&[(id, 20)]).unwrap().is_empty());

    let b = s.schedule().unwrap();
    let q = &b.seqs[0];
    assert_eq!(
        (q.kind, q.token_ids.clone(), q.positions.clone()),
        (StepKind::Decode, vec![20], vec![6])
    );
    assert_eq!(
        (q.groups[0].slot_mapping.clone(), q.context_len),
        (vec![6], 7)
    );
    s.update(&[(id, 21)]).unwrap();
    s.schedule().unwrap();
    let done = s.update(&[(id, 22)]).unwrap();
    assert_eq!(done.len(), 1);
    assert_eq!(done[0].output_token_ids, vec![20, 21, 22]);
    assert_eq!(done[0].reason, FinishReason::Length);
    assert!(!s.has_unfinished());
    assert_eq!(s.metrics().num_blocks_used, 0);
    assert!(s.schedule().unwrap().is_empty());
}

#[test]
fn admission_respects_token_budget_and_fcfs() {
    let mut c = config(32, 4, 8);
    c.max_num_batched_tokens = 16;
    let mut s = Scheduler::new(c).unwrap();
    for i in 0..3 {
        add(&mut s, vec![i; 6], 2);
    }
    let b = s.schedule().unwrap();
    assert_eq!(b.num_prefills(), 2, "6 + 6 fit 16, a third 6 does not");
    assert_eq!(b.num_batched_tokens(), 12);
    step(&mut s, &b);
    // Next step: two decodes use 2 of the 16, the third prompt fits the remaining 14: mixed.
    let b = s.schedule().unwrap();
    let kinds: Vec<bool> = b.seqs.iter().map(|q| q.is_prefill()).collect();
    assert_eq!(kinds, vec![false, false, true]);
    assert_eq!(b.num_batched_tokens(), 8);
}

#[test]
fn admission_respects_max_num_seqs_and_blocks() {
    let mut c = config(32, 4, 16);
    c.max_num_seqs = 1;
    let mut s = Scheduler::new(c).unwrap();
    add(&mut s, vec![1; 3], 2);
    add(&mut s, vec![2; 3], 2);
    assert_eq!(s.schedule().unwrap().seqs.len(), 1);

    // 4 blocks of 4: a 9-token prompt takes 3, so a second one waits.
    let mut s = Scheduler::new(config(4, 4, 16)).unwrap();
    add(&mut s, vec![1; 9], 1);
    let second = add(&mut s, vec![2; 9], 1);
    let b = s.schedule().unwrap();
    assert_eq!(b.seqs.len(), 1);
    assert_eq!(s.waiting().collect::<Vec<_>>(), vec![second]);
    let mut done = step(&mut s, &b);
    done.extend(drain(&mut s));
    assert_eq!(done.len(), 2);
    done.iter().for_each(assert_model_consistent);
}

#[test]
fn preemption_takes_the_newest_and_recomputes_with_generated_tokens() {
    // 6 blocks of 2 tokens; three 3-token prompts take 2 blocks each and fill the pool.
    let mut s = Scheduler::new(config(6, 2, 12)).unwrap();
    let ids: Vec<RequestId> = (0..3).map(|i| add(&mut s, vec![i, i, i], 4)).collect();
    let b = s.schedule().unwrap();
    assert_eq!(b.num_prefills(), 3);
    step(&mut s, &b); // lengths 4
    let b = s.schedule().unwrap();
    assert!(b.preempted.is_empty(), "position 3 fits each partial block");
    step(&mut s, &b); // lengths 5
    // Position 4 needs a new block for everyone: the newest (ids[2]) is preempted.
    let b = s.schedule().unwrap();
    assert_eq!(b.preempted, vec![ids[2]]);
    assert_eq!(
        b.seqs.iter().map(|q| q.seq_id).collect::<Vec<_>>(),
        ids[..2]
    );
    let victim = s.sequence(ids[2]).unwrap();
    assert_eq!(victim.status(), SequenceStatus::Waiting);
    assert_eq!(
        victim.output_token_ids().len(),
        2,
        "generated tokens are kept"
    );
    assert_eq!(victim.num_computed_tokens(), 0);
    assert_eq!(s.waiting().next(), Some(ids[2]));
    step(&mut s, &b);
    let b = s.schedule().unwrap();
    assert!(b.seqs.iter().all(|q| q.seq_id != ids[2]), "no blocks yet");
    let done = step(&mut s, &b);
    assert_eq!(done.len(), 2);
    // Readmission: the prefill is prompt + generated so far.
    let b = s.schedule().unwrap();
    let q = &b.seqs[0];
    assert_eq!(q.seq_id, ids[2]);
    assert_eq!(q.token_ids.len(), 5);
    assert_eq!(&q.token_ids[..3], &[2, 2, 2]);
    assert_eq!(q.kind, prefill(0, true));
    step(&mut s, &b);
    let done = drain(&mut s);
    assert_eq!(done[0].output_token_ids.len(), 4);
    assert_model_consistent(&done[0]);
    let m = s.metrics();
    assert_eq!((m.num_preemptions, m.num_recomputed_tokens), (1, 4));
    assert_eq!(m.num_blocks_free, 6);
}

#[test]
fn several_victims_are_taken_newest_first_and_requeued_in_order() {
    // Pool of 3 blocks of 2. A holds 1 block, B holds 2; C is a fork of B sharing both.
    let mut s = Scheduler::new(config(3, 2, 6)).unwrap();
    let a = add(&mut s, vec![1, 2], 3);
    let b = add(&mut s, vec![4, 5, 6], 3);
    let batch = s.schedule().unwrap();
    step(&mut s, &batch);
    let c = s.fork(b).unwrap();
    assert_eq!(s.running(), &[a, b, c]);
    // A needs a block for position 2: preempting C frees nothing (shared), then B goes.
    let batch = s.schedule().unwrap();
    assert_eq!(batch.preempted, vec![c, b]);
    assert_eq!(s.waiting().collect::<Vec<_>>(), vec![b, c]);
    step(&mut s, &batch);
    let done = drain(&mut s);
    assert_eq!(done.len(), 3);
    done.iter().for_each(assert_model_consistent);
}

#[test]
fn prefix_hits_skip_cached_tokens() {
    let mut c = config(16, 2, 16);
    c.enable_prefix_caching = true;
    let mut s = Scheduler::new(c).unwrap();
    add(&mut s, vec![1, 2, 3, 4, 5], 1);
    drain(&mut s);
    add(&mut s, vec![1, 2, 3, 4, 9], 1);
    let b = s.schedule().unwrap();
    let q = &b.seqs[0];
    assert_eq!(q.kind, prefill(4, false));
    assert_eq!(
        (q.token_ids.clone(), q.positions.clone(), q.context_len),
        (vec![9], vec![4], 5)
    );
    assert_eq!(q.groups[0].block_table.len(), 3);
    let m = s.metrics();
    assert_eq!((m.prefix_cache_queries, m.prefix_cache_hits), (10, 4));
    assert!((m.prefix_cache_hit_rate() - 0.4).abs() < 1e-12);
}

#[test]
fn forced_collision_in_the_scheduler_only_shortens_the_hit() {
    let mut c = config(16, 2, 16);
    c.enable_prefix_caching = true;
    let mut s = Scheduler::new(c).unwrap().with_hash_fn(|_, _| BlockHash(7));
    add(&mut s, vec![1, 2, 3, 4, 5], 1);
    drain(&mut s);
    add(&mut s, vec![1, 2, 3, 4, 9], 2);
    let b = s.schedule().unwrap();
    assert_eq!(b.seqs[0].kind, prefill(2, false));
    step(&mut s, &b);
    drain(&mut s).iter().for_each(assert_model_consistent);
}

#[test]
fn fork_copies_the_shared_partial_block_once() {
    let mut s = Scheduler::new(config(8, 4, 16)).unwrap();
    let a = add(&mut s, vec![1, 2, 3, 4, 5, 6], 3);
    s.schedule().unwrap();
    s.update(&[(a, 7)]).unwrap();
    let c = s.fork(a).unwrap();
    assert_eq!(s.replace_last_token(c, 99).unwrap(), None);
    let b = s.schedule().unwrap();
    assert_eq!(
        b.seqs[0].groups[0].block_copies,
        vec![BlockCopy { src: 1, dst: 2 }]
    );
    assert!(
        b.seqs[1].groups[0].block_copies.is_empty(),
        "the last holder writes in place"
    );
    assert_eq!(
        (b.seqs[0].token_ids.clone(), b.seqs[1].token_ids.clone()),
        (vec![7], vec![99])
    );
    assert_eq!(b.seqs[0].groups[0].block_table, vec![0, 2]);
    assert_eq!(b.seqs[1].groups[0].block_table, vec![0, 1]);
    assert_eq!(b.block_copies(0).len(), 1);
    assert_eq!(
        b.model_input().groups[0].block_copies,
        vec![BlockCopy { src: 1, dst: 2 }]
    );
    s.update(&[(a, 8), (c, 8)]).unwrap();
    assert_eq!(s.metrics().num_cow_copies, 1);
}

#[test]
fn stop_token_and_max_seq_len_finish() {
    let mut s = Scheduler::new(config(16, 4, 16)).unwrap();
    let a = s
        .add_request(
            vec![1],
            StopConditions::max_tokens(10).with_stop_tokens([42]),
        )
        .unwrap();
    let stop = StopConditions {
        max_seq_len: Some(3),
        ..StopConditions::max_tokens(10)
    };
    let b = s.add_request(vec![1], stop).unwrap();
    s.schedule().unwrap();
    assert!(s.update(&[(a, 5), (b, 5)]).unwrap().is_empty());
    s.schedule().unwrap();
    let mut done = s.update(&[(a, 42), (b, 6)]).unwrap();
    done.sort_by_key(|f| f.seq_id);
    assert_eq!(done[0].reason, FinishReason::Stop);
    assert_eq!(done[0].output_token_ids, vec![5, 42]);
    assert_eq!(done[1].reason, FinishReason::MaxSeqLen);
}

#[test]
fn bad_requests_and_call_order_are_errors() {
    let mut s = Scheduler::new(config(4, 4, 16)).unwrap();
    assert_eq!(
        s.add_request(vec![], StopConditions::max_tokens(1)),
        Err(PagedError::EmptyPrompt)
    );
    assert_eq!(
        s.add_request(vec![0; 17], StopConditions::max_tokens(1)),
        Err(PagedError::PromptTooLong {
            prompt_len: 17,
            max_model_len: 16
        })
    );
    assert!(matches!(
        s.add_request(vec![0], StopConditions::max_tokens(0)),
        Err(PagedError::InvalidRequest(_))
    ));
    assert_eq!(
        s.update(&[(RequestId(0), 1)]),
        Err(PagedError::NoStepInFlight)
    );
    let a = add(&mut s, vec![1, 2], 5);
    let b = add(&mut s, vec![3, 4], 5);
    s.schedule().unwrap();
    assert_eq!(s.schedule(), Err(PagedError::UpdatePending));
    assert_eq!(s.fork(a), Err(PagedError::UpdatePending));
    assert_eq!(s.update(&[(a, 1)]), Err(PagedError::MissingOutput(b)));
    assert_eq!(
        s.update(&[(a, 1), (a, 1)]),
        Err(PagedError::UnexpectedOutput(a))
    );
    assert_eq!(
        s.update(&[(RequestId(9), 1)]),
        Err(PagedError::UnexpectedOutput(RequestId(9)))
    );
    // A failed update changed nothing; aborting in flight makes its token ignored.
    assert_eq!(s.abort(b).unwrap().reason, FinishReason::Aborted);
    s.update(&[(a, 1), (b, 1)]).unwrap();
    assert_eq!(s.sequence(a).unwrap().output_token_ids(), &[1]);
    assert_eq!(s.abort(b), Err(PagedError::UnknownSequence(b)));
}

#[test]
fn config_validation_names_the_problem() {
    let ok = config(4, 4, 16);
    assert_eq!(ok.validate(), Ok(()));
    let too_small = config(3, 4, 16);
    let says = |c: &SchedulerConfig, what: &str| match c.validate() {
        Err(PagedError::InvalidConfig(m)) => m.contains(what),
        _ => false,
    };
    assert!(says(&too_small, "num_blocks"));
    let mut budget = config(4, 4, 16);
    budget.max_num_batched_tokens = 8;
    assert!(says(&budget, "max_num_batched_tokens"));
    budget.enable_chunked_prefill = true;
    assert_eq!(budget.validate(), Ok(()), "chunks fit any budget");
    budget.max_num_batched_tokens = 0;
    assert!(says(&budget, "max_num_batched_tokens"));
    let mut window_cache = config(4, 4, 16);
    window_cache.kv_cache.groups.push(KvGroupConfig {
        num_blocks: 4,
        sliding_window: Some(4),
    });
    window_cache.enable_prefix_caching = true;
    assert_eq!(
        window_cache.validate(),
        Ok(()),
        "hybrid prefix caching is allowed"
    );
    let mut zero = config(4, 4, 16);
    zero.kv_cache.block_size = 0;
    assert!(Scheduler::new(zero).is_err());
    let defaults = SchedulerConfig::new(KvCacheConfig::new([None], 128, DEFAULT_BLOCK_SIZE), 2048);
    assert_eq!(
        (
            defaults.kv_cache.block_size,
            defaults.max_num_batched_tokens
        ),
        (16, 2048)
    );
    assert_eq!(defaults.validate(), Ok(()));
}

#[test]
fn sliding_window_group_stays_bounded() {
    let (bs, w) = (2, 4);
    let mut c = config(8, bs, 16);
    c.kv_cache.groups.push(KvGroupConfig {
        num_blocks: max_window_blocks(w, bs),
        sliding_window: Some(w),
    });
    let mut s = Scheduler::new(c).unwrap();
    add(&mut s, (1..=9).collect(), 6);
    let b = s.schedule().unwrap();
    let local = &b.seqs[0].groups[1];
    // After the prefill the next query (position 9) reads keys 6..=9: 0..6 are never stored.
    assert!(local.slot_mapping[..6].iter().all(|&x| x == PAD_SLOT));
    assert!(local.slot_mapping[6..].iter().all(|&x| x >= 0));
    assert_eq!(&local.block_table[..3], &[PAD_BLOCK; 3]);
    assert!(
        b.seqs[0].groups[0].slot_mapping.iter().all(|&x| x >= 0),
        "global keeps all"
    );
    step(&mut s, &b);
    while s.has_unfinished() {
        let b = s.schedule().unwrap();
        let row = &b.seqs[0].groups[1].block_table;
        assert!(row.iter().filter(|&&x| x != PAD_BLOCK).count() <= max_window_blocks(w, bs));
        assert_eq!(
            row.len(),
            b.seqs[0].groups[0].block_table.len(),
            "same logical indices"
        );
        step(&mut s, &b);
    }
}

#[test]
fn sliding_window_prefix_hit_adopts_only_the_window() {
    // bs 2, window 4: the query at position p reads keys p-3..=p.
    let (bs, w) = (2, 4);
    let mut c = config(16, bs, 16);
    c.kv_cache.groups.push(KvGroupConfig {
        num_blocks: 8,
        sliding_window: Some(w),
    });
    c.enable_prefix_caching = true;
    let mut s = Scheduler::new(c).unwrap();
    let prompt: Vec<u32> = (1..=12).collect();
    add(&mut s, prompt.clone(), 1);
    // With prefix caching, the prefill writes every local key (the pool has room), so that its
    // full blocks can be registered; right after the step, the blocks behind the window (0..4,
    // keys below window_start(12) = 9) are trimmed into the cache.
    let b = s.schedule().unwrap();
    assert!(b.seqs[0].groups[1].slot_mapping.iter().all(|&x| x >= 0));
    assert_eq!(step(&mut s, &b).len(), 1);

    // The same 12 tokens and two more: 6 full blocks match in both groups, and the hit needs
    // local keys from window_start(12) = 9 on, i.e. logical blocks 4 and 5 only.
    let mut longer = prompt.clone();
    longer.extend([40, 41]);
    add(&mut s, longer, 2);
    let b = s.schedule().unwrap();
    let q = &b.seqs[0];
    assert_eq!(q.kind, prefill(12, false));
    assert_eq!(q.positions, vec![12, 13]);
    assert!(q.groups[0].block_table[..6].iter().all(|&x| x >= 0));
    assert_eq!(&q.groups[1].block_table[..4], &[PAD_BLOCK; 4]);
    assert!(q.groups[1].block_table[4..6].iter().all(|&x| x >= 0));
    step(&mut s, &b);
    drain(&mut s);
    assert_eq!(s.metrics().prefix_cache_hits, 12);

    // A prompt sharing only the first 10 tokens: the hit of 5 blocks needs local keys from
    // window_start(10) = 7 on, blocks 3 and 4, which the first prefill wrote although its own
    // later queries never read them. (Written windowed, they would not exist and nothing would
    // hit: an all-sliding-window model, Mistral's, would never reuse a prefix longer than W.)
    let mut branch: Vec<u32> = (1..=10).collect();
    branch.extend([50, 51, 52]);
    add(&mut s, branch, 1);
    let b = s.schedule().unwrap();
    assert_eq!(b.seqs[0].kind, prefill(10, false));
    step(&mut s, &b);
    drain(&mut s);
    assert_eq!(s.metrics().prefix_cache_hits, 22);

    // Evicting every cached block leaves no ghost behind: nothing hangs from them any more.
    for alloc in s.kv_cache_manager().allocators() {
        let mut a = alloc.clone();
        a.allocate(a.num_blocks()).unwrap();
        assert_eq!(a.num_ghost_entries(), 0);
        assert_eq!(a.num_cached_blocks(), 0);
    }
}

#[test]
fn sliding_window_prefill_falls_back_to_the_window_when_the_pool_is_small() {
    // bs 2, window 4, a local pool of 3 blocks: a 12-token prompt cannot be written whole, so
    // its prefill keeps only what later queries read (keys 9..12), caching less instead of
    // waiting forever.
    let (bs, w) = (2, 4);
    let mut c = config(16, bs, 16);
    c.kv_cache.groups.push(KvGroupConfig {
        num_blocks: max_window_blocks(w, bs),
        sliding_window: Some(w),
    });
    c.enable_prefix_caching = true;
    let mut s = Scheduler::new(c).unwrap();
    add(&mut s, (1..=12).collect(), 1);
    let b = s.schedule().unwrap();
    assert_eq!(&b.seqs[0].groups[1].block_table[..4], &[PAD_BLOCK; 4]);
    assert!(
        b.seqs[0].groups[1].slot_mapping[..8]
            .iter()
            .all(|&x| x == PAD_SLOT)
    );
    step(&mut s, &b);
    drain(&mut s);
    assert!(
        s.kv_cache_manager().allocators()[1].num_ghost_entries() > 0,
        "levels stay verified"
    );
}

#[test]
fn model_input_flattens_the_batch() {
    let mut s = Scheduler::new(config(16, 4, 16)).unwrap();
    let a = add(&mut s, vec![1, 2, 3], 4);
    let b = s.schedule().unwrap();
    step(&mut s, &b);
    add(&mut s, vec![4, 5, 6, 7, 8], 4);
    let b = s.schedule().unwrap();
    let m = b.model_input();
    let last = s.sequence(a).unwrap().token_ids()[3];
    assert_eq!(m.input_ids, vec![last, 4, 5, 6, 7, 8]);
    assert_eq!(m.positions, vec![3, 0, 1, 2, 3, 4]);
    assert_eq!(m.query_start_loc, vec![0, 1, 6]);
    assert_eq!(m.context_lens, vec![4, 5]);
    assert_eq!(m.logits_indices, vec![0, 5]);
    assert_eq!(m.groups[0].slot_mapping, vec![3, 4, 5, 6, 7, 8]);
    assert_eq!(m.groups[0].block_tables.data, vec![0, PAD_BLOCK, 1, 2]);
    let json = serde_json::to_string(&s.metrics()).unwrap();
    for key in [
        "num_blocks_total",
        "kv_cache_usage_perc",
        "prefix_cache_hits",
        "num_preemptions",
    ] {
        assert!(json.contains(key), "{key}");
    }
    assert!(serde_json::to_string(&b).is_ok());
}

/// The eviction policy decides which cached prefix survives pressure: a system prompt used by
/// three requests, then a burst of one-off prompts that fills the pool, then the system prompt
/// again. LFU keeps the popular prompt; LRU evicts it.
#[test]
fn eviction_policies_decide_which_prefix_survives() {
    let system = vec![1, 2, 3, 4, 5, 6];
    let hits_on_return = |policy: EvictionPolicy| {
        let mut cfg = config(8, 2, 8);
        cfg.enable_prefix_caching = true;
        cfg.eviction_policy = policy;
        let mut s = Scheduler::new(cfg).unwrap();
        for _ in 0..3 {
            add(&mut s, system.clone(), 1);
            drain(&mut s);
        }
        for base in [10, 20, 30] {
            add(&mut s, (base..base + 6).collect(), 1);
            drain(&mut s);
        }
        let before = s.metrics().prefix_cache_hits;
        add(&mut s, system.clone(), 1);
        drain(&mut s);
        s.metrics().prefix_cache_hits - before
    };
    // LRU: the one-off prompts, released last, push the system prompt's blocks out.
    assert_eq!(hits_on_return(EvictionPolicy::Lru), 0);
    // LFU: the system prompt's blocks were hit twice each; the one-off blocks never were. (The
    // last prompt token is always computed, so 4 of its 6 tokens is every hit possible.)
    assert_eq!(hits_on_return(EvictionPolicy::Lfu), 4);
}

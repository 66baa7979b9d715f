//! Cache salts (vLLM's `cache_salt`): requests share prefix-cache blocks only with requests of
//! the same salt, so one tenant's cached prompt gives another no faster first token to notice.

#![allow(clippy::unwrap_used)]

use kvlab_paged::{
    EvictionPolicy, KvCacheConfig, PagedError, RequestId, Scheduler, SchedulerConfig, StepKind,
    StopConditions,
};

fn scheduler() -> Scheduler {
    Scheduler::new(SchedulerConfig {
        kv_cache: KvCacheConfig::new([None], 64, 4),
        max_num_batched_tokens: 64,
        enable_chunked_prefill: true,
        max_num_seqs: 8,
        max_model_len: 64,
        enable_prefix_caching: true,
        eviction_policy: EvictionPolicy::Lru,
        tenant_quota: None,
        tiers: None,
    })
    .unwrap()
}

/// Runs `prompt` salted with `salt` to completion (2 tokens) and returns how many of its prompt
/// tokens the prefix cache served at admission.
fn cached_tokens(s: &mut Scheduler, prompt: &[u32], salt: u64) -> usize {
    let id = s
        .add_request(prompt.to_vec(), StopConditions::max_tokens(2))
        .unwrap();
    s.set_cache_salt(id, salt).unwrap();
    let mut cached = None;
    while s.sequence(id).is_some() {
        let b = s.schedule().unwrap();
        for q in b.seqs.iter().filter(|q| q.seq_id == id) {
            if let StepKind::Prefill {
                num_cached_tokens, ..
            } = q.kind
            {
                cached.get_or_insert(num_cached_tokens);
            }
        }
        let out: Vec<(RequestId, u32)> = b
            .seqs
            .iter()
            .filter(|q| q.samples)
            .map(|q| (q.seq_id, 7))
            .collect();
        s.update(&out).unwrap();
    }
    cached.unwrap()
}

#[test]
fn requests_share_cached_blocks_only_with_their_own_salt() {
    let mut s = scheduler();
    let prompt: Vec<u32> = (1..=13).collect(); // Three full blocks of 4 before the last token.
    assert_eq!(cached_tokens(&mut s, &prompt, 0), 0);
    assert_eq!(
        cached_tokens(&mut s, &prompt, 0),
        12,
        "unsalted requests share"
    );
    assert_eq!(
        cached_tokens(&mut s, &prompt, 41),
        0,
        "a salt sees no unsalted block"
    );
    assert_eq!(
        cached_tokens(&mut s, &prompt, 41),
        12,
        "the same salt shares"
    );
    assert_eq!(
        cached_tokens(&mut s, &prompt, 42),
        0,
        "another salt sees none"
    );
    assert_eq!(
        cached_tokens(&mut s, &prompt, 0),
        12,
        "unsalted blocks are still there"
    );
    // A salted request does not extend an unsalted chain either: the second level onwards hangs
    // from the salted first entry.
    let mut longer = prompt.clone();
    longer.extend([20, 21, 22, 23]);
    assert_eq!(cached_tokens(&mut s, &longer, 42), 12);
    assert_eq!(cached_tokens(&mut s, &longer, 41), 12);
    assert_eq!(cached_tokens(&mut s, &longer, 0), 12);
}

#[test]
fn a_salt_is_set_while_waiting_and_kept_when_the_blocks_are_freed() {
    let mut s = scheduler();
    let id = s
        .add_request((1..=9).collect(), StopConditions::max_tokens(3))
        .unwrap();
    s.schedule().unwrap();
    s.update(&[(id, 5)]).unwrap();
    let late = s.set_cache_salt(id, 3);
    assert!(
        matches!(late, Err(PagedError::WrongStatus { .. })),
        "{late:?}"
    );
    let waiting = s
        .add_request(vec![1, 2], StopConditions::max_tokens(1))
        .unwrap();
    s.set_cache_salt(waiting, 9).unwrap();
    assert_eq!(s.sequence(waiting).unwrap().block_tables()[0].salt(), 9);
    // A preempted request's tables are freed, and it is readmitted with the same salt.
    let mut alloc = kvlab_paged::BlockAllocator::new(4, 4).unwrap();
    let mut table = kvlab_paged::BlockTable::new(4).with_tenant(2).with_salt(9);
    alloc.append_slots(&mut table, 6, 0).unwrap();
    alloc.free(&mut table).unwrap();
    assert_eq!(
        (table.tenant(), table.salt(), table.num_tokens()),
        (2, 9, 0)
    );
}

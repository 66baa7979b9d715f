//! Unit tests of prefix caching: hash chaining, verified hits, forced collisions, LRU eviction,
//! deduplication, and ghost entries that keep evicted levels verified.

// Test code may unwrap: a failed unwrap is a failed test (clippy.toml allows it in #[test]
// functions; this covers the helpers too).
#![allow(clippy::unwrap_used)]

use kvlab_paged::{
    BlockAllocator, BlockHash, BlockTable, PagedError, chain_hashes, fnv1a, fnv1a_block_hash,
};

/// Allocates and "computes" `tokens` into a fresh table, registering its full blocks.
fn prefill(a: &mut BlockAllocator, tokens: &[u32]) -> BlockTable {
    let mut t = BlockTable::new(a.block_size());
    let m = a.match_prefix(tokens, (tokens.len() - 1) / a.block_size());
    let cached = a.adopt_prefix(&mut t, &m).unwrap();
    a.append_slots(&mut t, tokens.len() - cached, 0).unwrap();
    a.register_full_blocks(&mut t, tokens, tokens.len())
        .unwrap();
    t
}

#[test]
fn fnv1a_is_pinned() {
    // Independent FNV-1a 64 of the bytes [0x00] (tag "no parent") and [0x00] ++ 1u32 LE.
    assert_eq!(
        fnv1a_block_hash(None, &[]),
        BlockHash(0xaf63_bd4c_8601_b7df)
    );
    assert_eq!(
        fnv1a_block_hash(None, &[1]),
        BlockHash(0x44c1_a3d0_cef6_2cbe)
    );
    // FNV-1a 64 of plain bytes: the offset basis for none, the published value for "a".
    assert_eq!(fnv1a(b""), 0xcbf2_9ce4_8422_2325);
    assert_eq!(fnv1a(b"a"), 0xaf63_dc4c_8601_ec8c);
}

#[test]
fn hashes_chain_over_the_prefix() {
    let h = chain_hashes(fnv1a_block_hash, &[1, 2, 3, 4, 5, 6, 7], 2);
    assert_eq!(h.len(), 3, "only full blocks are hashed");
    assert_eq!(h[0], fnv1a_block_hash(None, &[1, 2]));
    assert_eq!(h[1], fnv1a_block_hash(Some(h[0]), &[3, 4]));
    assert_eq!(h[2], fnv1a_block_hash(Some(h[1]), &[5, 6]));
    // The same block after a different prefix has a different hash.
    let other = chain_hashes(fnv1a_block_hash, &[9, 9, 3, 4], 2);
    assert_ne!(other[1], h[1]);
    // No parent is not the same as a parent hash of 0.
    assert_ne!(
        fnv1a_block_hash(None, &[3, 4]),
        fnv1a_block_hash(Some(BlockHash(0)), &[3, 4])
    );
}

#[test]
fn shared_prefix_is_reused_and_counted_once() {
    let mut a = BlockAllocator::new(16, 4).unwrap();
    let first = prefill(&mut a, &[1, 2, 3, 4, 5, 6, 7, 8, 9, 10]);
    assert_eq!(a.num_cached_blocks(), 2);
    let m = a.match_prefix(&[1, 2, 3, 4, 5, 6, 7, 8, 11, 12, 13], 10 / 4);
    assert_eq!(m.blocks(), &first.blocks()[..2]);
    let mut t = BlockTable::new(4);
    assert_eq!(a.adopt_prefix(&mut t, &m), Ok(8));
    assert_eq!(a.ref_count(m.blocks()[0].unwrap()), 2);
    // A different second block matches only the first one.
    let m2 = a.match_prefix(&[1, 2, 3, 4, 0, 0, 0, 0, 1], 2);
    assert_eq!(m2.num_blocks(), 1);
    assert!(!m2.collision_detected());
}

#[test]
fn fully_cached_prompt_recomputes_its_last_block() {
    let mut a = BlockAllocator::new(16, 4).unwrap();
    let prompt = [1, 2, 3, 4, 5, 6, 7, 8];
    prefill(&mut a, &prompt);
    // With max_blocks = (len - 1) / block_size only block 0 is reused: the last token (and its
    // block) is computed again, into a fresh block, to produce logits.
    let m = a.match_prefix(&prompt, (prompt.len() - 1) / 4);
    assert_eq!(m.num_blocks(), 1);
    assert_eq!(a.match_prefix(&prompt, usize::MAX).num_blocks(), 2);
}

#[test]
fn forced_collisions_are_detected_not_reused() {
    // Every block hashes to 42: only the token and parent checks stand between us and reuse.
    let mut a = BlockAllocator::new(16, 2)
        .unwrap()
        .with_hash_fn(|_, _| BlockHash(42));
    let mut first = prefill(&mut a, &[1, 2, 3, 4, 5]);
    // Block 0 registered; block 1 collided with it (same hash, other parent) and stayed private.
    assert_eq!(a.num_cached_blocks(), 1);
    assert_eq!(a.stats().num_hash_collisions, 1);
    // Another first block: the hash hits, the tokens differ, the match stops.
    let m = a.match_prefix(&[7, 7, 3, 4, 0], 2);
    assert_eq!(m.num_blocks(), 0);
    assert!(m.collision_detected());
    // The same prompt: block 0 is a true hit, block 1 is refused.
    let m = a.match_prefix(&[1, 2, 3, 4, 0], 2);
    assert_eq!(m.blocks(), &first.blocks()[..1]);
    assert!(m.collision_detected());
    a.free(&mut first).unwrap();
}

#[test]
fn same_tokens_after_a_different_parent_are_refused() {
    // A hash that ignores the parent: equal blocks collide whatever came before them.
    let mut a = BlockAllocator::new(16, 2)
        .unwrap()
        .with_hash_fn(|_, tokens| fnv1a_block_hash(None, tokens));
    let x = prefill(&mut a, &[1, 1, 5, 5, 0]); // registers [1 1] and [5 5] after it
    let z = prefill(&mut a, &[2, 2, 5, 5, 0]); // [2 2] registers; its [5 5] collides
    assert_eq!(a.stats().num_hash_collisions, 1);
    // [2 2] hits, then [5 5] is cached only after [1 1]: refused, although tokens are equal.
    let m = a.match_prefix(&[2, 2, 5, 5, 0], 2);
    assert_eq!(m.blocks(), &z.blocks()[..1]);
    assert!(m.collision_detected());
    let m = a.match_prefix(&[1, 1, 5, 5, 0], 2);
    assert_eq!(m.blocks(), &x.blocks()[..2]);
}

#[test]
fn freed_cached_blocks_stay_until_evicted_lru_tail_first() {
    let mut a = BlockAllocator::new(4, 2).unwrap();
    let mut s = prefill(&mut a, &[1, 2, 3, 4, 9]); // blocks 0, 1 cached, 2 private
    let (b0, b1) = (s.blocks()[0].unwrap(), s.blocks()[1].unwrap());
    a.free(&mut s).unwrap();
    assert_eq!(a.num_free_blocks(), 4);
    assert_eq!(a.num_evictable_blocks(), 2);
    // The two never-cached blocks go first: no eviction yet.
    let plain = a.allocate(2).unwrap();
    assert!(!plain.contains(&b0) && !plain.contains(&b1));
    assert_eq!(a.stats().num_evictions, 0);
    assert_eq!(a.match_prefix(&[1, 2, 3, 4, 0], 2).num_blocks(), 2);
    // The sequence released its tail first, so the tail is evicted first.
    assert_eq!(a.allocate(1).unwrap(), vec![b1]);
    assert_eq!(a.match_prefix(&[1, 2, 3, 4, 0], 2).num_blocks(), 1);
    assert_eq!(a.allocate(1).unwrap(), vec![b0]);
    assert_eq!(a.match_prefix(&[1, 2, 3, 4, 0], 2).num_blocks(), 0);
    assert_eq!(a.stats().num_evictions, 2);
}

#[test]
fn a_hit_refreshes_lru_order() {
    let mut a = BlockAllocator::new(4, 2).unwrap();
    let mut x = prefill(&mut a, &[1, 1, 0]);
    let x0 = x.blocks()[0].unwrap();
    a.free(&mut x).unwrap();
    let mut y = prefill(&mut a, &[2, 2, 0]);
    let y0 = y.blocks()[0].unwrap();
    a.free(&mut y).unwrap(); // LRU, oldest first: [1 1], [2 2]
    // Reuse [1 1] and release it again: it becomes the youngest.
    let mut again = prefill(&mut a, &[1, 1, 1]);
    assert_eq!(again.blocks()[0], Some(x0));
    a.free(&mut again).unwrap(); // LRU: [2 2], [1 1]
    assert_eq!(a.num_evictable_blocks(), 2);
    // Two never-cached blocks, then one eviction: the least recently used, [2 2].
    let got = a.allocate(3).unwrap();
    assert_eq!(got[2], y0);
    assert_eq!(a.match_prefix(&[2, 2, 0], 1).num_blocks(), 0);
    assert_eq!(a.match_prefix(&[1, 1, 0], 1).blocks(), &[Some(x0)]);
}

#[test]
fn identical_blocks_computed_twice_are_deduplicated() {
    let mut a = BlockAllocator::new(8, 2).unwrap();
    // Both sequences allocate before either registers (as two prompts admitted in one step).
    let mut x = BlockTable::new(2);
    let mut y = BlockTable::new(2);
    a.append_slots(&mut x, 3, 0).unwrap();
    a.append_slots(&mut y, 3, 0).unwrap();
    assert_eq!(a.num_used_blocks(), 4);
    a.register_full_blocks(&mut x, &[5, 6, 7], 3).unwrap();
    a.register_full_blocks(&mut y, &[5, 6, 7], 3).unwrap();
    assert_eq!(x.blocks()[0], y.blocks()[0], "y now uses x's cached block");
    assert_eq!(a.ref_count(x.blocks()[0].unwrap()), 2);
    assert_eq!(a.num_used_blocks(), 3);
    assert_eq!(a.stats().num_dedup_blocks, 1);
}

#[test]
fn stale_match_and_non_empty_table_are_rejected() {
    let mut a = BlockAllocator::new(2, 2).unwrap();
    let mut s = prefill(&mut a, &[1, 1, 0]);
    a.free(&mut s).unwrap();
    let m = a.match_prefix(&[1, 1, 0], 1);
    assert_eq!(m.num_blocks(), 1);
    a.allocate(2).unwrap(); // evicts the matched block
    let mut t = BlockTable::new(2);
    assert!(matches!(
        a.adopt_prefix(&mut t, &m),
        Err(PagedError::StalePrefixMatch { .. })
    ));
    let mut b = BlockAllocator::new(4, 2).unwrap();
    let mut full = BlockTable::new(2);
    b.append_slot(&mut full).unwrap();
    assert_eq!(
        b.adopt_prefix(&mut full, &m),
        Err(PagedError::TableNotEmpty { num_tokens: 1 })
    );
}

#[test]
fn prefix_caching_off_matches_nothing() {
    let mut a = BlockAllocator::new(8, 2)
        .unwrap()
        .with_prefix_caching(false);
    prefill(&mut a, &[1, 1, 2, 2, 0]);
    assert_eq!(a.num_cached_blocks(), 0);
    assert_eq!(a.match_prefix(&[1, 1, 2, 2, 0], 2).num_blocks(), 0);
}

#[test]
fn evicted_levels_stay_verified_as_ghosts_and_reattach_when_recomputed() {
    let mut a = BlockAllocator::new(6, 2).unwrap();
    let tokens = [1, 1, 2, 2, 3, 3, 4, 4];
    let mut long = prefill(&mut a, &tokens);
    // A window of 3 at position 8 keeps keys 6.. only: levels 0..3 leave the table, and taking
    // every free block evicts them. Level 3, still held, hangs from them.
    a.free_outside_window(&mut long, 8, 3).unwrap();
    let taken = a.allocate(5).unwrap();
    assert_eq!(a.num_cached_blocks(), 1);
    assert_eq!(a.num_ghost_entries(), 3);
    let mut query = tokens.to_vec();
    query.push(9);
    let m = a.match_prefix_levels(&query, 4);
    assert_eq!(m.blocks(), &[None, None, None, long.blocks()[3]]);
    assert!(m.holds(4, 3) && !m.holds(4, 2) && !m.holds(4, 0) && m.holds(0, 0));
    assert_eq!(
        a.match_prefix(&query, 4).num_blocks(),
        0,
        "full attention needs all"
    );
    // Computing levels 0..3 again re-attaches them to their entries: the whole chain is
    // cached again, level 3 included.
    taken.into_iter().for_each(|b| a.free_block(b).unwrap());
    let mut again = prefill(&mut a, &[1, 1, 2, 2, 3, 3, 0]);
    assert_eq!(a.num_ghost_entries(), 0);
    let m = a.match_prefix(&query, 4);
    assert_eq!(&m.blocks()[..3], &again.blocks()[..3]);
    assert_eq!(m.blocks()[3], long.blocks()[3]);
    // Once nothing holds them, evicting every block leaves no entry at all.
    a.free(&mut long).unwrap();
    a.free(&mut again).unwrap();
    a.allocate(6).unwrap();
    assert_eq!((a.num_cached_blocks(), a.num_ghost_entries()), (0, 0));
}

/// Allocates and "computes" `tokens` for `tenant`, then releases it: its full blocks stay
/// cached, evictable, owned by `tenant`.
fn cache_for(a: &mut BlockAllocator, tenant: u32, tokens: &[u32]) {
    let mut t = BlockTable::new(a.block_size()).with_tenant(tenant);
    let m = a.match_prefix(tokens, (tokens.len() - 1) / a.block_size());
    let cached = a.adopt_prefix(&mut t, &m).unwrap();
    a.append_slots(&mut t, tokens.len() - cached, 0).unwrap();
    a.register_full_blocks(&mut t, tokens, tokens.len())
        .unwrap();
    a.free(&mut t).unwrap();
}

/// Tenant 0 caches two blocks first (the oldest, LRU's first victims); tenant 1 then caches
/// four. Without quotas LRU evicts tenant 0's blocks for tenant 1's next demand; with a quota
/// of two blocks each, tenant 1 is over its quota and loses its own blocks instead, while
/// tenant 0's stay hits. Every policy obeys the quota.
#[test]
fn a_tenant_over_its_quota_is_evicted_before_one_within_it() {
    for quota in [None, Some(2)] {
        for policy in kvlab_paged::EvictionPolicy::ALL {
            let mut a = BlockAllocator::new(8, 2)
                .unwrap()
                .with_eviction_policy(policy)
                .with_tenant_quota(quota);
            cache_for(&mut a, 0, &[1, 1, 2, 2, 0]); // 2 cached blocks (+1 private, freed)
            for i in 0..2 {
                cache_for(&mut a, 1, &[5 + i, 5, 6, 6, 0]); // 2 cached blocks each
            }
            assert_eq!(
                (a.num_cached_blocks_of(0), a.num_cached_blocks_of(1)),
                (2, 4)
            );
            // 8 blocks: 6 cached, 2 plain free. Ask for 4: two evictions.
            let _held = a.allocate(4).unwrap();
            assert_eq!(a.stats().num_evictions, 2, "{policy:?} {quota:?}");
            let kept0 = a.match_prefix(&[1, 1, 2, 2, 0], 2).num_blocks();
            match quota {
                Some(q) => {
                    assert_eq!(kept0, 2, "{policy:?}: tenant 0 is within its quota");
                    assert_eq!(a.num_cached_blocks_of(1), q, "{policy:?}");
                }
                None if policy == kvlab_paged::EvictionPolicy::Lru => {
                    assert_eq!(kept0, 0, "LRU alone takes the oldest: tenant 0's")
                }
                None => {}
            }
            assert_eq!(a.tenant_quota(), quota);
        }
    }
}

//! Property tests: random operation sequences against a shadow model of the KV memory.
//! The scheduler's runs include speculative decoding: random draft tokens, some right and some
//! wrong, checked and rolled back, must leave every output the model's own.
//!
//! The shadow records, for every physical slot, what the k/v written there depends on: the
//! whole token prefix up to and including that position (attention mixes every earlier token
//! into a position's k and v at every layer above the first). A sequence's *view* (read through
//! its block table) must equal its real history, a
//! write may only land in a block with ref count 1, prefix hits must return blocks whose shadow
//! contents equal the prompt, and everything must return to the pool at the end. Prompts come
//! from a 3-token alphabet with common prefixes so that prefix sharing and (with the weak hash
//! functions) hash collisions happen all the time.

// Test code may unwrap: a failed unwrap is a failed test (clippy.toml allows it in #[test]
// functions; this covers the helpers too).
#![allow(clippy::unwrap_used)]

use kvlab_paged::{
    BlockAllocator, BlockHash, BlockTable, EvictionPolicy, HashFn, KvCacheConfig, KvGroupConfig,
    PAD_BLOCK, PAD_SLOT, RequestId, RestoreCost, Scheduler, SchedulerConfig, StepExecutor,
    StopConditions, TierConfig, fnv1a_block_hash, max_window_blocks, window_start,
};
use proptest::collection::vec;
use proptest::prelude::*;

const BASES: [[u32; 12]; 3] = [
    [0, 1, 2, 0, 1, 2, 0, 1, 2, 0, 1, 2],
    [0, 1, 2, 0, 2, 2, 1, 1, 0, 0, 0, 1],
    [2, 2, 2, 2, 1, 1, 1, 1, 0, 0, 0, 0],
];

/// The real hash, a weak one (collides constantly) and a constant one (always collides).
fn hash_fn(kind: u8) -> HashFn {
    match kind % 3 {
        0 => fnv1a_block_hash,
        1 => |p, t| {
            BlockHash((p.map_or(0, |h| h.0) + t.iter().map(|&x| u64::from(x)).sum::<u64>()) % 4)
        },
        _ => |_, _| BlockHash(1),
    }
}

fn prompt(base: usize, keep: usize, suffix: &[u32]) -> Vec<u32> {
    let mut p: Vec<u32> = BASES[base % 3][..keep.min(12)].to_vec();
    p.extend_from_slice(suffix);
    if p.is_empty() {
        p.push(1);
    }
    p
}

// ---------------------------------------------------------------------------------------------
// Allocator level.

#[derive(Debug, Clone)]
enum Op {
    Add(usize, usize, Vec<u32>),
    Append(usize, u32, usize),
    Fork(usize),
    Free(usize),
    Preempt(usize),
    Trim(usize, usize),
}

fn op() -> impl Strategy<Value = Op> {
    prop_oneof![
        3 => (0..3usize, 0..13usize, vec(0..3u32, 0..5)).prop_map(|(b, k, s)| Op::Add(b, k, s)),
        6 => (any::<usize>(), 0..3u32, 1..4usize).prop_map(|(s, t, n)| Op::Append(s, t, n)),
        1 => any::<usize>().prop_map(Op::Fork),
        2 => any::<usize>().prop_map(Op::Free),
        1 => any::<usize>().prop_map(Op::Preempt),
        1 => (any::<usize>(), 1..7usize).prop_map(|(s, w)| Op::Trim(s, w)),
    ]
}

struct Live {
    table: BlockTable,
    tokens: Vec<u32>,
    /// Positions below this may have been freed by a sliding window.
    live_from: usize,
}

struct World {
    alloc: BlockAllocator,
    seqs: Vec<Live>,
    /// (num_blocks · block_size,) the token prefix whose k/v was last written at each slot.
    shadow: Vec<Option<Vec<u32>>>,
}

impl World {
    fn bs(&self) -> usize {
        self.alloc.block_size()
    }

    /// Writes `tokens[pos]` of sequence `i` at its slot; the block must be held by it alone.
    fn write(&mut self, i: usize, pos: usize) {
        let slot = self.seqs[i].table.slot(pos).expect("reserved slot") as usize;
        let block = (slot / self.bs()) as u32;
        assert_eq!(
            self.alloc.ref_count(block),
            1,
            "write into shared block {block}"
        );
        self.shadow[slot] = Some(self.seqs[i].tokens[..=pos].to_vec());
    }

    fn add(&mut self, tokens: Vec<u32>) {
        let bs = self.bs();
        let m = self.alloc.match_prefix(&tokens, (tokens.len() - 1) / bs);
        for (i, &b) in m.blocks().iter().enumerate() {
            let b = b.expect("match_prefix returns held blocks only");
            for k in 0..bs {
                let got = self.shadow[b as usize * bs + k].as_deref();
                let want = &tokens[..=i * bs + k];
                assert_eq!(got, Some(want), "prefix hit block {b} holds another prefix");
            }
        }
        let need = m.num_blocks_taken() + tokens.len().div_ceil(bs) - m.num_blocks();
        if !self.alloc.can_allocate(need) {
            return;
        }
        let mut table = BlockTable::new(bs);
        let cached = self.alloc.adopt_prefix(&mut table, &m).unwrap();
        let copies = self
            .alloc
            .append_slots(&mut table, tokens.len() - cached, 0)
            .unwrap();
        assert!(copies.is_empty());
        let len = tokens.len();
        self.seqs.push(Live {
            table,
            tokens,
            live_from: 0,
        });
        let i = self.seqs.len() - 1;
        (cached..len).for_each(|p| self.write(i, p));
        let s = &mut self.seqs[i];
        self.alloc
            .register_full_blocks(&mut s.table, &s.tokens, len)
            .unwrap();
    }

    fn append(&mut self, i: usize, token: u32, n: usize) {
        let bs = self.bs();
        let need = self
            .alloc
            .blocks_needed_to_append(&self.seqs[i].table, n, 0)
            .unwrap();
        let can = need <= self.alloc.num_free_blocks();
        if n == 1 {
            assert_eq!(self.alloc.can_append(&self.seqs[i].table), can);
        }
        if !can {
            let before = self.seqs[i].table.clone();
            assert!(
                self.alloc
                    .append_slots(&mut self.seqs[i].table, n, 0)
                    .is_err()
            );
            assert_eq!(
                self.seqs[i].table, before,
                "a failed append changes nothing"
            );
            return;
        }
        let copies = self
            .alloc
            .append_slots(&mut self.seqs[i].table, n, 0)
            .unwrap();
        assert!(
            copies.len() <= 1,
            "only the partial last block can be shared"
        );
        for c in copies {
            let (s, d) = (c.src as usize * bs, c.dst as usize * bs);
            let src: Vec<_> = self.shadow[s..s + bs].to_vec();
            self.shadow[d..d + bs].clone_from_slice(&src);
        }
        let start = self.seqs[i].tokens.len();
        self.seqs[i]
            .tokens
            .extend((0..n).map(|k| (token + k as u32) % 3));
        (start..start + n).for_each(|p| self.write(i, p));
        let s = &mut self.seqs[i];
        let len = s.tokens.len();
        self.alloc
            .register_full_blocks(&mut s.table, &s.tokens, len)
            .unwrap();
    }

    fn check(&self) {
        check_ref_counts(&self.alloc, self.seqs.iter().map(|s| &s.table), 0);
        for s in &self.seqs {
            for p in 0..s.tokens.len() {
                match s.table.slot(p) {
                    Some(slot) => assert_eq!(
                        self.shadow[slot as usize].as_deref(),
                        Some(&s.tokens[..=p]),
                        "view at {p}"
                    ),
                    None => assert!(p < s.live_from, "position {p} lost"),
                }
            }
        }
        assert_eq!(
            self.alloc.num_used_blocks() + self.alloc.num_free_blocks(),
            self.alloc.num_blocks()
        );
    }
}

/// Ref counts equal the `tables`' holdings, an evictable block is held by none, and a block is
/// free exactly when no table holds it.
fn check_ref_counts<'a>(
    alloc: &BlockAllocator,
    tables: impl IntoIterator<Item = &'a BlockTable>,
    group: usize,
) {
    let mut refs = vec![0usize; alloc.num_blocks()];
    for &b in tables.into_iter().flat_map(|t| t.blocks().iter().flatten()) {
        refs[b as usize] += 1;
    }
    for (b, &r) in refs.iter().enumerate() {
        assert_eq!(alloc.ref_count(b as u32), r, "group {group} block {b}");
        if alloc.is_evictable(b as u32) {
            assert_eq!(r, 0, "evictable block {b} is referenced");
        }
    }
    let unreferenced = refs.iter().filter(|&&r| r == 0).count();
    assert_eq!(alloc.num_free_blocks(), unreferenced, "free xor referenced");
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(1000))]

    #[test]
    fn allocator_operations_keep_invariants(
        num_blocks in 3..20usize,
        bs in prop::sample::select(vec![1usize, 2, 4]),
        hash_kind in 0..3u8,
        ops in vec(op(), 1..40),
    ) {
        let alloc = BlockAllocator::new(num_blocks, bs).unwrap().with_hash_fn(hash_fn(hash_kind));
        let mut w = World { alloc, seqs: Vec::new(), shadow: vec![None; num_blocks * bs] };
        for op in ops {
            let live = w.seqs.len();
            match op {
                Op::Add(b, k, s) => w.add(prompt(b, k, &s)),
                _ if live == 0 => {}
                Op::Append(i, t, n) => w.append(i % live, t, n),
                Op::Fork(i) => {
                    let parent = &w.seqs[i % live];
                    let table = w.alloc.fork(&parent.table).unwrap();
                    let (tokens, live_from) = (parent.tokens.clone(), parent.live_from);
                    w.seqs.push(Live { table, tokens, live_from });
                }
                Op::Free(i) => {
                    let mut s = w.seqs.swap_remove(i % live);
                    w.alloc.free(&mut s.table).unwrap();
                }
                Op::Preempt(i) => {
                    let mut s = w.seqs.swap_remove(i % live);
                    w.alloc.free(&mut s.table).unwrap();
                    w.add(s.tokens);
                }
                Op::Trim(i, window) => {
                    let s = &mut w.seqs[i % live];
                    let len = s.tokens.len();
                    w.alloc.free_outside_window(&mut s.table, len, window).unwrap();
                    s.live_from = s.live_from.max(window_start(len, window));
                    for p in s.live_from..len {
                        prop_assert!(s.table.slot(p).is_some(), "key {} in the window freed", p);
                    }
                }
            }
            w.check();
        }
        for mut s in std::mem::take(&mut w.seqs) {
            w.alloc.free(&mut s.table).unwrap();
        }
        prop_assert_eq!(w.alloc.num_free_blocks(), num_blocks, "blocks leaked");
        prop_assert_eq!(w.alloc.num_used_blocks(), 0);
        // Evicting everything must leave no prefix-cache entry behind (no ghost leaks).
        w.alloc.allocate(num_blocks).unwrap();
        prop_assert_eq!(w.alloc.num_ghost_entries(), 0, "ghost entries leaked");
        prop_assert_eq!(w.alloc.num_cached_blocks(), 0);
    }
}

// ---------------------------------------------------------------------------------------------
// Scheduler level: a stand-in engine with a shadow KV cache per group.

/// The stand-in model: the next token (0..4, where 3 is a stop token for some requests) depends
/// on the whole history, so any corruption of a sequence's view changes its outputs.
fn next_token(history: &[u32]) -> u32 {
    let h = history.iter().enumerate().fold(17u64, |h, (i, &t)| {
        h.wrapping_mul(1_000_003)
            .wrapping_add((i as u64 + 1) * (u64::from(t) + 1))
    });
    ((h >> 7) % 4) as u32
}

#[derive(Debug, Clone)]
struct Request {
    arrival: usize,
    prompt: Vec<u32>,
    max_tokens: usize,
    stop_on_3: bool,
}

fn request() -> impl Strategy<Value = Request> {
    (
        0..8usize,
        0..3usize,
        0..11usize,
        vec(0..3u32, 0..4),
        1..12usize,
        any::<bool>(),
    )
        .prop_map(|(arrival, b, k, s, max_tokens, stop_on_3)| Request {
            arrival,
            prompt: prompt(b, k, &s),
            max_tokens,
            stop_on_3,
        })
}

/// The shadow pool's blocks as bytes, for the tiers: per slot a flag, a length and the token
/// history whose k and v the slot holds.
struct ShadowBlocks<'a> {
    shadow: &'a mut [Vec<Option<Vec<u32>>>],
    bs: usize,
}

impl StepExecutor for ShadowBlocks<'_> {
    type Error = String;

    fn execute(&mut self, _: &kvlab_paged::ModelInput) -> Result<Vec<Vec<f32>>, String> {
        Err("only moves blocks".into())
    }

    fn read_block(&mut self, group: usize, block: u32) -> Result<Option<Vec<u8>>, String> {
        let at = block as usize * self.bs;
        let mut out = Vec::new();
        for slot in &self.shadow[group][at..at + self.bs] {
            let words = slot.as_ref().map_or(vec![0], |h| {
                [1, h.len() as u32]
                    .into_iter()
                    .chain(h.iter().copied())
                    .collect()
            });
            out.extend(words.iter().flat_map(|w| w.to_le_bytes()));
        }
        Ok(Some(out))
    }

    fn write_block(&mut self, group: usize, block: u32, bytes: &[u8]) -> Result<bool, String> {
        let words: Vec<u32> = bytes
            .chunks_exact(4)
            .map(|b| u32::from_le_bytes(b.try_into().unwrap()))
            .collect();
        let mut w = words.iter().copied();
        let at = block as usize * self.bs;
        for slot in &mut self.shadow[group][at..at + self.bs] {
            *slot = match w.next() {
                Some(1) => {
                    let n = w.next().unwrap() as usize;
                    Some(w.by_ref().take(n).collect())
                }
                _ => None,
            };
        }
        assert!(w.next().is_none(), "a block's bytes are one block");
        Ok(true)
    }
}

/// One scheduler step run by the stand-in engine; checks every read and write.
fn run_step(
    s: &mut Scheduler,
    shadow: &mut [Vec<Option<Vec<u32>>>],
) -> Vec<kvlab_paged::FinishedSeq> {
    let batch = s.schedule().unwrap();
    assert!(batch.num_batched_tokens() <= s.config().max_num_batched_tokens);
    let bs = s.config().kv_cache.block_size;
    // Tier moves first: spilled blocks read before restores write (see `tier`).
    s.kv_cache_manager_mut()
        .move_tier_blocks(&mut ShadowBlocks { shadow, bs })
        .unwrap();
    let windows: Vec<Option<usize>> = s
        .config()
        .kv_cache
        .groups
        .iter()
        .map(|g| g.sliding_window)
        .collect();
    for q in &batch.seqs {
        for (g, part) in q.groups.iter().enumerate() {
            for c in &part.block_copies {
                let (src, dst) = (c.src as usize * bs, c.dst as usize * bs);
                let data: Vec<_> = shadow[g][src..src + bs].to_vec();
                shadow[g][dst..dst + bs].clone_from_slice(&data);
            }
        }
    }
    let mut outputs = Vec::new();
    for q in &batch.seqs {
        // The sequence's tokens, then the draft tokens the step checks after them.
        let mut history = s.sequence(q.seq_id).unwrap().token_ids().to_vec();
        let len = history.len();
        history.extend_from_slice(q.draft_token_ids());
        assert_eq!(q.samples, q.context_len == history.len());
        assert!(q.context_len <= history.len());
        assert!(q.num_draft_tokens == 0 || q.kind == kvlab_paged::StepKind::Decode);
        let start = q.positions[0];
        for (g, part) in q.groups.iter().enumerate() {
            let keep = windows[g].map_or(0, |w| window_start(q.context_len, w));
            for (i, &slot) in part.slot_mapping.iter().enumerate() {
                let pos = q.positions[i];
                if slot == PAD_SLOT {
                    assert!(pos < keep, "group {g}: position {pos} not stored");
                    continue;
                }
                let block = (slot as usize / bs) as u32;
                assert_eq!(
                    s.kv_cache_manager().allocators()[g].ref_count(block),
                    1,
                    "write into shared block"
                );
                assert_eq!(q.token_ids[i], history[pos]);
                shadow[g][slot as usize] = Some(history[..=pos].to_vec());
            }
            // Attention: every key a query reads from the cache must be the true one.
            for &p in &q.positions {
                let first = windows[g].map_or(0, |w| window_start(p, w));
                for j in first..start.min(p + 1) {
                    let block = part.block_table[j / bs];
                    assert_ne!(block, PAD_BLOCK, "group {g}: key {j} of query {p} freed");
                    let slot = block as usize * bs + j % bs;
                    let got = shadow[g][slot].as_deref();
                    assert_eq!(got, Some(&history[..=j]), "group {g}: key {j}");
                }
            }
        }
        if q.samples {
            // The token after the last one, and after each draft while the drafts are right.
            for i in 0..=q.num_draft_tokens {
                let t = next_token(&history[..len + i]);
                outputs.push((q.seq_id, t));
                if i == q.num_draft_tokens || t != history[len + i] {
                    break;
                }
            }
        }
    }
    s.update(&outputs).unwrap()
}

/// Draft tokens for every decoding sequence: up to `k`, the first `right` of them the model's
/// own continuation and the rest arbitrary (right only by chance), both drawn from `seed`.
fn give_drafts(s: &mut Scheduler, k: usize, seed: u64) {
    let decoding: Vec<(RequestId, Vec<u32>)> =
        s.decoding().map(|(id, t)| (id, t.to_vec())).collect();
    for (id, mut history) in decoding {
        let mix = seed ^ (id.0 + 1).wrapping_mul(0x9e37_79b9_7f4a_7c15) ^ history.len() as u64;
        let (n, right) = (
            (mix % (k as u64 + 1)) as usize,
            ((mix >> 8) % (k as u64 + 1)) as usize,
        );
        let len = history.len();
        for i in 0..n {
            let t = if i < right {
                next_token(&history)
            } else {
                ((mix >> (16 + 2 * i)) % 4) as u32
            };
            history.push(t);
        }
        let max = s.max_draft_tokens(id).unwrap();
        let kept = s.set_spec_token_ids(id, history[len..].to_vec()).unwrap();
        assert_eq!(kept, n.min(max));
    }
}

/// Ref counts equal table holdings, free xor referenced, windows bounded.
fn check_scheduler(s: &Scheduler) {
    let live: Vec<RequestId> = s.running().iter().copied().chain(s.waiting()).collect();
    let bs = s.config().kv_cache.block_size;
    for (g, alloc) in s.kv_cache_manager().allocators().iter().enumerate() {
        let tables: Vec<&BlockTable> = live
            .iter()
            .map(|id| &s.sequence(*id).unwrap().block_tables()[g])
            .collect();
        if let Some(w) = s.config().kv_cache.groups[g].sliding_window {
            assert!(
                tables
                    .iter()
                    .all(|t| t.num_held_blocks() <= max_window_blocks(w, bs))
            );
        }
        check_ref_counts(alloc, tables, g);
    }
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(1000))]

    #[test]
    fn scheduler_runs_match_the_model_and_free_everything(
        bs in prop::sample::select(vec![1usize, 2, 4]),
        max_model_len in 4..20usize,
        extra_blocks in 0..6usize,
        max_num_seqs in 1..5usize,
        extra_budget in 0..10usize,
        chunked in any::<bool>(),
        window in prop::option::of(1..8usize),
        caching in any::<bool>(),
        eviction in prop::sample::select(EvictionPolicy::ALL.to_vec()),
        tenant_quota in prop::option::of(0..4usize),
        tier in prop::option::of((1..4usize, 0..3usize, prop::option::of(1..6u64), prop::option::of(any::<bool>()), any::<bool>())),
        hash_kind in 0..3u8,
        spec in prop::option::of((1..6usize, any::<u64>())),
        requests in vec(request(), 1..10),
        forks in vec((0..16usize, any::<usize>()), 0..4),
        aborts in vec((0..12usize, any::<usize>()), 0..2),
    ) {
        let seq_blocks = max_model_len.div_ceil(bs);
        let full = KvGroupConfig { num_blocks: seq_blocks + extra_blocks, sliding_window: None };
        let mut groups = vec![full];
        if let Some(w) = window {
            let n = seq_blocks.min(max_window_blocks(w, bs)) + extra_blocks / 2;
            groups.push(KvGroupConfig { num_blocks: n, sliding_window: Some(w) });
        }
        let config = SchedulerConfig {
            kv_cache: KvCacheConfig { block_size: bs, groups },
            // With chunked prefill any budget works: 1 token a step included.
            max_num_batched_tokens: if chunked {
                1 + extra_budget
            } else {
                max_model_len.max(max_num_seqs) + extra_budget
            },
            enable_chunked_prefill: chunked,
            max_num_seqs,
            max_model_len,
            enable_prefix_caching: caching,
            eviction_policy: eviction,
            tenant_quota,
            // Host blocks, then files in a temporary directory.
            // A cost model that always restores (prefill dear) or always declines (free).
            // Paused sessions (every other request) offloaded on purpose, or not.
            tiers: tier.filter(|_| caching).map(|(host, disk, ttl, restore, offload)| {
                let cost = restore.map(|r| RestoreCost {
                    prefill_ns_per_token: if r { u64::MAX / 4 } else { 0 },
                    host_bytes_per_s: 1,
                    disk_bytes_per_s: 1,
                });
                TierConfig::host(host)
                    .with_disk(std::env::temp_dir(), disk)
                    .with_ttl_steps(ttl)
                    .with_restore_cost(cost)
                    .with_offload_paused(offload)
            }),
        };
        let mut s = Scheduler::new(config.clone()).unwrap().with_hash_fn(hash_fn(hash_kind));
        let mut shadow: Vec<Vec<Option<Vec<u32>>>> =
            config.kv_cache.groups.iter().map(|g| vec![None; g.num_blocks * bs]).collect();
        let mut finished = Vec::new();
        let last_arrival = requests.iter().map(|r| r.arrival).max().unwrap_or(0);
        for step in 0..500 {
            for (i, r) in requests.iter().enumerate().filter(|(_, r)| r.arrival == step) {
                let mut stop = StopConditions::max_tokens(r.max_tokens);
                if r.stop_on_3 {
                    stop = stop.with_stop_tokens([3]);
                }
                let mut p = r.prompt.clone();
                p.truncate(max_model_len);
                // Three tenants, so that quotas choose between them.
                let id = s.add_request_for(p, stop, (i % 3) as u32).unwrap();
                if i % 2 == 0 {
                    s.offload_when_finished(id).unwrap();
                }
            }
            for &(_, pick) in forks.iter().filter(|f| f.0 == step) {
                if let Some(&parent) = s.running().get(pick % s.running().len().max(1)) {
                    let _ = s.fork(parent); // May refuse at max_num_seqs; that is fine.
                }
            }
            for &(_, pick) in aborts.iter().filter(|a| a.0 == step) {
                let live: Vec<RequestId> = s.running().iter().copied().chain(s.waiting()).collect();
                if let Some(&id) = live.get(pick % live.len().max(1)) {
                    s.abort(id).unwrap();
                }
            }
            if !s.has_unfinished() {
                if step > last_arrival {
                    break;
                }
                continue;
            }
            if let Some((k, seed)) = spec {
                give_drafts(&mut s, k, seed ^ step as u64);
            }
            finished.extend(run_step(&mut s, &mut shadow));
            check_scheduler(&s);
            let m = s.metrics();
            prop_assert_eq!(m.num_blocks_used + m.num_blocks_free, m.num_blocks_total);
            let h = m.prefix_cache_hits_by_tier;
            prop_assert_eq!(h.pool + h.host + h.disk, m.prefix_cache_hits, "hits by tier add up");
        }
        prop_assert!(!s.has_unfinished(), "did not finish in 500 steps");
        for alloc in s.kv_cache_manager().allocators() {
            prop_assert_eq!(alloc.num_free_blocks(), alloc.num_blocks(), "blocks leaked");
            let mut evict_all = alloc.clone();
            evict_all.allocate(alloc.num_blocks()).unwrap();
            // Only the tiers keep ghosts: each tiered level and the levels before it.
            let tiered = evict_all.num_tiered_blocks();
            let capacity = config.tiers.as_ref().map_or(0, TierConfig::capacity);
            prop_assert!(tiered <= capacity, "tiers over capacity");
            prop_assert!(
                evict_all.num_ghost_entries() <= tiered * seq_blocks,
                "ghost entries leaked"
            );
        }
        if let Some(store) = s.kv_cache_manager().tier_store() {
            let st = store.stats();
            let tiered: usize = s.kv_cache_manager().allocators().iter().map(|a| a.num_tiered_blocks()).sum();
            prop_assert_eq!(st.host_blocks + st.disk_blocks, tiered, "store and index agree");
        }
        for f in &finished {
            let mut history = f.prompt_token_ids.clone();
            for &t in &f.output_token_ids {
                let at = history.len();
                prop_assert_eq!(t, next_token(&history), "{} diverged at {}", f.seq_id, at);
                history.push(t);
            }
        }
    }
}

// ---------------------------------------------------------------------------------------------
// Waste calculator: paging wastes less than one block per sequence, at every step.

proptest! {
    #![proptest_config(ProptestConfig::with_cases(1000))]

    #[test]
    fn paged_waste_is_under_one_block_per_sequence(
        lens in vec((1..200usize, 1..200usize), 1..20),
        block_size in 1..40usize,
    ) {
        use kvlab_paged::{Reservation, RequestLen, compute_waste};
        let max_seq_len = 400;
        let requests: Vec<RequestLen> = lens
            .iter()
            .map(|&(prompt_len, output_len)| RequestLen { prompt_len, output_len })
            .collect();
        let paged = compute_waste(&requests, max_seq_len, Reservation::Paged { block_size }).unwrap();
        let fixed = compute_waste(&requests, max_seq_len, Reservation::MaxLength).unwrap();
        let n = requests.len() as u64;
        let steps: u64 = lens.iter().map(|&(_, o)| o as u64).sum();
        let b = block_size as u64;
        prop_assert!(paged.reserved_slots - paged.used_slots <= n * (b - 1));
        prop_assert!(paged.reserved_slot_steps - paged.used_slot_steps <= steps * (b - 1));
        prop_assert_eq!(paged.used_slot_steps, fixed.used_slot_steps);
        prop_assert_eq!(fixed.reserved_slot_steps, steps * max_seq_len as u64);
        prop_assert!((0.0..1.0).contains(&paged.final_waste_frac));
    }
}

//! Which evictable cached block the prefix cache drops first: the eviction policies.
//!
//! A cached block nobody references stays *evictable*: counted as free, still a possible prefix
//! hit. When the pool's never-cached free blocks run out, the allocator asks the
//! [`EvictionQueue`] for one to reuse, and the policy decides whose cached prefix is lost:
//!
//! | policy | evicts first | keeps | source |
//! | --- | --- | --- | --- |
//! | [`EvictionPolicy::Lru`] | the block released longest ago | what was used recently | vLLM's free-block queue (`vllm/v1/core/block_pool.py`) |
//! | [`EvictionPolicy::Lfu`] | the block with the fewest prefix hits (LRU among equals) | shared openings hit again and again | the textbook LFU; hit counts never decay here |
//! | [`EvictionPolicy::Clock`] | the next block on a ring that was not hit since the hand last passed it | like LRU, at O(1) per step | Corbató's CLOCK (second chance), as page caches use |
//! | [`EvictionPolicy::LeafFirst`] | the deepest level of a prefix (LRU among equals) | the first blocks every continuation needs | SGLang's RadixAttention, which evicts radix-tree leaves first |
//!
//! Sequences release their blocks last to first, so under LRU a sequence's tail already goes
//! before its head; LeafFirst makes that a rule across sequences, LFU trades recency for
//! popularity. `kvlab evict` compares them on a workload with shared system prompts and
//! multi-turn sessions.

use std::collections::{BTreeMap, VecDeque};

use serde::Serialize;

use crate::BlockId;

/// How the prefix cache picks the cached block to drop when the pool has no never-cached free
/// block left.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Hash, Serialize)]
#[serde(rename_all = "kebab-case")]
pub enum EvictionPolicy {
    /// Least recently released first (vLLM's; the default).
    #[default]
    Lru,
    /// Fewest prefix hits since the block took its content first; least recently released
    /// among equals.
    Lfu,
    /// CLOCK (second chance): evictable blocks sit on a ring in release order; the hand evicts
    /// the first block not hit since it entered the ring, and gives a hit block one more round.
    Clock,
    /// Deepest prefix level first (level 0 is a prompt's first block); least recently released
    /// among equals.
    LeafFirst,
}

impl EvictionPolicy {
    /// Every policy, in the order tables list them.
    pub const ALL: [EvictionPolicy; 4] = [
        EvictionPolicy::Lru,
        EvictionPolicy::Lfu,
        EvictionPolicy::Clock,
        EvictionPolicy::LeafFirst,
    ];

    /// The flag value: `lru`, `lfu`, `clock`, `leaf-first`.
    pub fn name(self) -> &'static str {
        match self {
            EvictionPolicy::Lru => "lru",
            EvictionPolicy::Lfu => "lfu",
            EvictionPolicy::Clock => "clock",
            EvictionPolicy::LeafFirst => "leaf-first",
        }
    }

    /// The policy named `name` (see [`EvictionPolicy::name`]).
    pub fn from_name(name: &str) -> Option<EvictionPolicy> {
        Self::ALL.into_iter().find(|p| p.name() == name)
    }
}

/// The evictable blocks of one pool, in the order a policy evicts them.
#[derive(Debug, Clone)]
pub(crate) struct EvictionQueue {
    policy: EvictionPolicy,
    /// Lru, Lfu, LeafFirst: evictable blocks by (priority, release tick); smallest key first.
    order: BTreeMap<(u64, u64), BlockId>,
    /// (num_blocks,) each evictable block's key in `order`.
    key: Vec<Option<(u64, u64)>>,
    /// Clock: the ring, oldest release at the front; entries whose generation is stale were
    /// removed (a hit took the block back) and are skipped when the hand reaches them.
    ring: VecDeque<(BlockId, u32)>,
    /// (num_blocks,) Clock: the generation of each block's live ring entry, if it has one.
    in_ring: Vec<Option<u32>>,
    /// (num_blocks,) Clock: hit since it last entered the ring (its second chance).
    referenced: Vec<bool>,
    /// (num_blocks,) prefix hits on each block's current content (Lfu's count).
    hits: Vec<u64>,
    next_tick: u64,
    next_generation: u32,
    len: usize,
}

impl EvictionQueue {
    pub(crate) fn new(num_blocks: usize, policy: EvictionPolicy) -> Self {
        Self {
            policy,
            order: BTreeMap::new(),
            key: vec![None; num_blocks],
            ring: VecDeque::new(),
            in_ring: vec![None; num_blocks],
            referenced: vec![false; num_blocks],
            hits: vec![0; num_blocks],
            next_tick: 0,
            next_generation: 0,
            len: 0,
        }
    }

    pub(crate) fn policy(&self) -> EvictionPolicy {
        self.policy
    }

    /// Number of evictable blocks.
    pub(crate) fn len(&self) -> usize {
        self.len
    }

    pub(crate) fn contains(&self, block: BlockId) -> bool {
        let b = block as usize;
        self.key.get(b).is_some_and(Option::is_some)
            || self.in_ring.get(b).is_some_and(Option::is_some)
    }

    /// A cached block's ref count reached 0; `depth` is its prefix level (0: a first block).
    pub(crate) fn push(&mut self, block: BlockId, depth: usize) {
        if self.contains(block) {
            return;
        }
        let b = block as usize;
        let tick = self.next_tick;
        self.next_tick += 1;
        let priority = match self.policy {
            EvictionPolicy::Lru => 0,
            EvictionPolicy::Lfu => self.hits[b],
            EvictionPolicy::LeafFirst => u64::MAX - depth as u64,
            EvictionPolicy::Clock => {
                let generation = self.next_generation;
                self.next_generation = self.next_generation.wrapping_add(1);
                self.ring.push_back((block, generation));
                self.in_ring[b] = Some(generation);
                self.len += 1;
                return;
            }
        };
        self.order.insert((priority, tick), block);
        self.key[b] = Some((priority, tick));
        self.len += 1;
    }

    /// Someone references `block` again (a prefix hit, or a duplicate found): it leaves the
    /// queue if it was in it, and its content counts one more hit.
    pub(crate) fn hit(&mut self, block: BlockId) {
        let b = block as usize;
        self.remove(block);
        self.hits[b] += 1;
        self.referenced[b] = true;
    }

    /// Takes `block` out of the queue, if it is there.
    pub(crate) fn remove(&mut self, block: BlockId) {
        let b = block as usize;
        if let Some(k) = self.key[b].take() {
            self.order.remove(&k);
            self.len -= 1;
        }
        if self.in_ring[b].take().is_some() {
            self.len -= 1;
        }
    }

    /// The block to evict now, out of the queue, its hit count and second chance reset (its
    /// content is about to be dropped). `None` when nothing is evictable.
    pub(crate) fn pop(&mut self) -> Option<BlockId> {
        self.pop_where(|_| true)
    }

    /// [`Self::pop`] among the blocks `wanted` accepts (a tenant's, under quotas): the first of
    /// them in the policy's order; the others keep their places (and CLOCK's bits). `None` when
    /// no evictable block is wanted.
    pub(crate) fn pop_where(&mut self, wanted: impl Fn(BlockId) -> bool) -> Option<BlockId> {
        let block = match self.policy {
            EvictionPolicy::Clock => self.advance_hand(wanted)?,
            _ => {
                let (&k, &block) = self.order.iter().find(|(_, b)| wanted(**b))?;
                self.order.remove(&k);
                self.key[block as usize] = None;
                block
            }
        };
        self.len -= 1;
        self.hits[block as usize] = 0;
        self.referenced[block as usize] = false;
        Some(block)
    }

    /// CLOCK's hand over the wanted blocks: drops stale entries, passes over unwanted ones,
    /// gives referenced wanted blocks a second round (bit cleared, back of the ring), and takes
    /// the first wanted block without one. Ends: each wanted entry goes to the back at most once
    /// before its bit is clear, and every other step moves the hand on.
    fn advance_hand(&mut self, wanted: impl Fn(BlockId) -> bool) -> Option<BlockId> {
        let mut i = 0;
        while let Some(&(block, generation)) = self.ring.get(i) {
            let b = block as usize;
            if self.in_ring[b] != Some(generation) {
                self.ring.remove(i);
            } else if !wanted(block) {
                i += 1;
            } else if std::mem::take(&mut self.referenced[b]) {
                self.ring.remove(i);
                self.ring.push_back((block, generation));
            } else {
                self.ring.remove(i);
                self.in_ring[b] = None;
                return Some(block);
            }
        }
        None
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn drain(q: &mut EvictionQueue) -> Vec<BlockId> {
        std::iter::from_fn(|| q.pop()).collect()
    }

    #[test]
    fn lru_evicts_in_release_order() {
        let mut q = EvictionQueue::new(4, EvictionPolicy::Lru);
        for b in [2, 0, 3] {
            q.push(b, 0);
        }
        q.hit(0);
        q.push(0, 0);
        assert_eq!(drain(&mut q), [2, 3, 0]);
        assert_eq!(q.len(), 0);
    }

    #[test]
    fn lfu_keeps_the_most_hit_block() {
        let mut q = EvictionQueue::new(4, EvictionPolicy::Lfu);
        // Block 1 is hit three times, block 2 once, block 3 never.
        for _ in 0..3 {
            q.hit(1);
        }
        q.hit(2);
        for b in [1, 2, 3] {
            q.push(b, 0);
        }
        assert_eq!(drain(&mut q), [3, 2, 1]);
        // Eviction dropped the content, and its count with it.
        q.push(1, 0);
        q.push(3, 0);
        assert_eq!(drain(&mut q), [1, 3]);
    }

    #[test]
    fn clock_gives_a_hit_block_a_second_chance() {
        let mut q = EvictionQueue::new(4, EvictionPolicy::Clock);
        for b in [0, 1, 2] {
            q.push(b, 0);
        }
        // Block 0 is hit (taken back) and released again: it re-enters at the back, bit set.
        q.hit(0);
        q.push(0, 0);
        q.push(3, 0);
        // Ring: 1, 2, 0*, 3 → 1, 2, then 0 is passed over (bit cleared), 3, then 0.
        assert_eq!(drain(&mut q), [1, 2, 3, 0]);
    }

    #[test]
    fn clock_skips_entries_of_blocks_taken_back() {
        let mut q = EvictionQueue::new(3, EvictionPolicy::Clock);
        q.push(0, 0);
        q.push(1, 0);
        q.remove(0);
        assert_eq!(q.len(), 1);
        assert!(!q.contains(0));
        assert_eq!(drain(&mut q), [1]);
    }

    #[test]
    fn leaf_first_evicts_the_deepest_level_first() {
        let mut q = EvictionQueue::new(6, EvictionPolicy::LeafFirst);
        // Two sequences' blocks, released tail first as the allocator does.
        for (b, depth) in [(2, 2), (1, 1), (0, 0), (5, 1), (4, 0)] {
            q.push(b, depth);
        }
        assert_eq!(drain(&mut q), [2, 1, 5, 0, 4]);
    }

    #[test]
    fn every_policy_evicts_each_block_once() {
        for policy in EvictionPolicy::ALL {
            let mut q = EvictionQueue::new(16, policy);
            for b in 0..16 {
                q.push(b, (b % 3) as usize);
                if b % 4 == 0 {
                    q.hit(b);
                    q.push(b, (b % 3) as usize);
                }
            }
            q.push(3, 0); // Already queued: ignored.
            assert_eq!(q.len(), 16, "{policy:?}");
            let mut got = drain(&mut q);
            got.sort_unstable();
            assert_eq!(got, (0..16).collect::<Vec<_>>(), "{policy:?}");
            assert_eq!(EvictionPolicy::from_name(policy.name()), Some(policy));
        }
    }

    /// pop_where takes the first wanted block in each policy's order and leaves the others
    /// where they were: after it, a plain pop gives the rest in their original order.
    #[test]
    fn pop_where_takes_the_first_wanted_block_and_keeps_the_rest_in_order() {
        for policy in EvictionPolicy::ALL {
            let mut q = EvictionQueue::new(6, policy);
            for b in 0..6 {
                q.push(b, 0);
            }
            let mut all = q.clone();
            let order = drain(&mut all);
            let odd = q.pop_where(|b| b % 2 == 1).unwrap();
            assert_eq!(
                odd,
                *order.iter().find(|b| *b % 2 == 1).unwrap(),
                "{policy:?}"
            );
            let rest: Vec<BlockId> = order.iter().copied().filter(|&b| b != odd).collect();
            assert_eq!(drain(&mut q), rest, "{policy:?}");
            assert_eq!(q.pop_where(|_| true), None);
        }
    }
}

//! Which prefix-cache entries of one pool a lower tier holds: least recently spilled first out,
//! at most `capacity` of them, and the moves a step must perform (in the order they were
//! decided). The bytes themselves live in [`super::KvTierStore`]; the pool only names entries.

use std::collections::{BTreeMap, HashMap};

use super::TierStats;
use crate::BlockId;
use crate::prefix_cache::EntryId;

/// One move between a pool and the tiers below it, named by entry (the scheduler adds the
/// group: [`super::TierOp`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum IndexOp {
    Spill { block: BlockId, entry: EntryId },
    Restore { entry: EntryId, block: BlockId },
    Drop { entry: EntryId },
}

/// The tiered entries of one pool, oldest spill first.
#[derive(Debug, Clone)]
pub(crate) struct TierIndex {
    capacity: usize,
    /// spill stamp → entry, the oldest first out when a spill finds the tiers full.
    order: BTreeMap<u64, EntryId>,
    stamp: HashMap<EntryId, u64>,
    next: u64,
    /// Moves decided since the scheduler last took them.
    pub(crate) ops: Vec<IndexOp>,
    pub(crate) stats: TierStats,
}

impl TierIndex {
    pub(crate) fn new(capacity: usize) -> Self {
        Self {
            capacity,
            order: BTreeMap::new(),
            stamp: HashMap::new(),
            next: 0,
            ops: Vec::new(),
            stats: TierStats::default(),
        }
    }

    pub(crate) fn capacity(&self) -> usize {
        self.capacity
    }

    pub(crate) fn contains(&self, entry: EntryId) -> bool {
        self.stamp.contains_key(&entry)
    }

    pub(crate) fn len(&self) -> usize {
        self.stamp.len()
    }

    /// Records the spill of `block` holding `entry`; returns the entries pushed out to make
    /// room (each with a `Drop` recorded after the spill), oldest first.
    pub(crate) fn spill(&mut self, block: BlockId, entry: EntryId) -> Vec<EntryId> {
        self.ops.push(IndexOp::Spill { block, entry });
        self.stats.spills += 1;
        self.stamp.insert(entry, self.next);
        self.order.insert(self.next, entry);
        self.next += 1;
        let mut out = Vec::new();
        while self.stamp.len() > self.capacity {
            let Some((_, old)) = self.order.pop_first() else {
                break;
            };
            self.stamp.remove(&old);
            self.ops.push(IndexOp::Drop { entry: old });
            self.stats.drops += 1;
            out.push(old);
        }
        out
    }

    /// Takes `entry` out of the tiers without a move of its own (the caller records a restore
    /// or a drop). Whether it was there.
    pub(crate) fn remove(&mut self, entry: EntryId) -> bool {
        match self.stamp.remove(&entry) {
            Some(s) => {
                self.order.remove(&s);
                true
            }
            None => false,
        }
    }

    /// `entry`, taken out by [`Self::remove`], comes back into `block`.
    pub(crate) fn restore(&mut self, entry: EntryId, block: BlockId) {
        self.ops.push(IndexOp::Restore { entry, block });
        self.stats.restores += 1;
    }

    /// `entry`, taken out by [`Self::remove`], is forgotten below.
    pub(crate) fn drop_entry(&mut self, entry: EntryId) {
        self.ops.push(IndexOp::Drop { entry });
        self.stats.drops += 1;
    }
}

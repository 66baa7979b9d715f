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
    /// Scheduler steps an entry may stay below after its spill (`None`: until pushed out).
    ttl_steps: Option<u64>,
    /// spill stamp → (entry, scheduler step of the spill), the oldest first out when a spill
    /// finds the tiers full or its time is up.
    order: BTreeMap<u64, (EntryId, u64)>,
    stamp: HashMap<EntryId, u64>,
    next: u64,
    /// The scheduler step now, which spills are stamped with.
    now: u64,
    /// Moves decided since the scheduler last took them.
    pub(crate) ops: Vec<IndexOp>,
    pub(crate) stats: TierStats,
}

impl TierIndex {
    pub(crate) fn new(capacity: usize, ttl_steps: Option<u64>) -> Self {
        Self {
            capacity,
            ttl_steps,
            order: BTreeMap::new(),
            stamp: HashMap::new(),
            next: 0,
            now: 0,
            ops: Vec::new(),
            stats: TierStats::default(),
        }
    }

    pub(crate) fn capacity(&self) -> usize {
        self.capacity
    }

    pub(crate) fn ttl_steps(&self) -> Option<u64> {
        self.ttl_steps
    }

    pub(crate) fn contains(&self, entry: EntryId) -> bool {
        self.stamp.contains_key(&entry)
    }

    pub(crate) fn len(&self) -> usize {
        self.stamp.len()
    }

    /// Withdraws a `Drop` of `entry` still waiting for the step's moves: its bytes were stored
    /// again since (fetched), and the drop would delete them.
    pub(crate) fn withdraw_drop(&mut self, entry: EntryId) {
        self.ops
            .retain(|op| !matches!(op, IndexOp::Drop { entry: e } if *e == entry));
    }

    /// Records the spill of `block` holding `entry` at the current step; returns the entries
    /// pushed out to make room (each with a `Drop` recorded after the spill), oldest first.
    pub(crate) fn spill(&mut self, block: BlockId, entry: EntryId) -> Vec<EntryId> {
        self.ops.push(IndexOp::Spill { block, entry });
        self.stats.spills += 1;
        self.hold(entry)
    }

    /// Records that the tiers hold `entry` as of the current step (spilled, or fetched from the
    /// remote tier straight into the store); returns the entries pushed out to make room, each
    /// with a `Drop` recorded, oldest first.
    pub(crate) fn hold(&mut self, entry: EntryId) -> Vec<EntryId> {
        self.stamp.insert(entry, self.next);
        self.order.insert(self.next, (entry, self.now));
        self.next += 1;
        let mut out = Vec::new();
        while self.stamp.len() > self.capacity {
            let Some((_, (old, _))) = self.order.pop_first() else {
                break;
            };
            self.stamp.remove(&old);
            self.ops.push(IndexOp::Drop { entry: old });
            self.stats.drops.full += 1;
            out.push(old);
        }
        out
    }

    /// The scheduler step is `now`: later spills are stamped with it, and the entries spilled
    /// more than `ttl_steps` steps before it are dropped, oldest first, and returned.
    pub(crate) fn tick(&mut self, now: u64) -> Vec<EntryId> {
        self.now = now;
        let Some(ttl) = self.ttl_steps else {
            return Vec::new();
        };
        let mut out = Vec::new();
        while let Some((_, &(old, at))) = self.order.first_key_value() {
            if at.saturating_add(ttl) >= now {
                break;
            }
            self.order.pop_first();
            self.stamp.remove(&old);
            self.ops.push(IndexOp::Drop { entry: old });
            self.stats.drops.expired += 1;
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

    /// `entry`, taken out by [`Self::remove`], is forgotten below: its content was computed
    /// again (`lost` false) or its bytes are gone (`lost` true).
    pub(crate) fn drop_entry(&mut self, entry: EntryId, lost: bool) {
        self.ops.push(IndexOp::Drop { entry });
        if lost {
            self.stats.drops.lost += 1;
        } else {
            self.stats.drops.recomputed += 1;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_oldest_spill_goes_when_full_or_when_its_time_is_up() {
        let mut t = TierIndex::new(2, Some(3));
        assert!(t.spill(10, 1).is_empty());
        assert!(t.tick(1).is_empty());
        assert!(t.spill(11, 2).is_empty());
        assert!(t.tick(2).is_empty());
        assert_eq!(t.spill(12, 3), vec![1], "full: entry 1, the oldest, goes");
        assert!(
            t.tick(4).is_empty(),
            "entry 2 spilled at 1 lives through step 4"
        );
        assert_eq!(t.tick(5), vec![2]);
        assert_eq!(t.tick(100), vec![3]);
        assert_eq!(t.len(), 0);
        let d = t.stats.drops;
        assert_eq!((d.full, d.expired, t.stats.spills), (1, 2, 3));
        let drops = t
            .ops
            .iter()
            .filter(|op| matches!(op, IndexOp::Drop { .. }))
            .count();
        assert_eq!(drops, 3);
        let mut no_ttl = TierIndex::new(4, None);
        no_ttl.spill(0, 7);
        assert!(no_ttl.tick(u64::MAX).is_empty());
    }
}

//! The manager's side of the tiers below the pools ([`crate::tier`]): checking that a level
//! to restore can be read back before a step relies on it, and performing a step's moves with
//! the engine.

use super::KvCacheManager;
use crate::tier::index::IndexOp;
use crate::{HitsByTier, PrefixMatch, StepExecutor, TierKey, TierOp};

/// Errors of [`KvCacheManager::move_tier_blocks`]: the engine's, or a restore without bytes.
#[derive(Debug, thiserror::Error)]
pub enum TierMoveError<E: std::fmt::Display> {
    /// The engine failed to read a block to spill or write a block to restore; its error.
    #[error("engine: {0}")]
    Engine(E),
    /// The engine's `write_block` cannot move KV blocks, yet a restore was scheduled (cannot
    /// happen: such an engine never spilled anything); run without tiers.
    #[error("the engine cannot read or write KV blocks, so it cannot use tiers; run without them")]
    Unsupported,
    /// A restore found no bytes for its key in the tier store, though they were checked when
    /// the step was scheduled: a bug in the tier bookkeeping.
    #[error("the bytes of {0:?} were checked before the step and are gone; this is a bug")]
    Lost(TierKey),
}

impl KvCacheManager {
    /// With a [`crate::tier::RestoreCost`], declines this request's restores when the model
    /// says recomputing them is cheaper: every restorable level of every group's match becomes
    /// a hole. Returns the levels declined (0 without a cost model, or when restoring wins).
    pub(crate) fn weigh_restores(&self, matches: &mut [PrefixMatch]) -> usize {
        let Some(cost) = self.tier_config.as_ref().and_then(|t| t.restore_cost) else {
            return 0;
        };
        let Some(store) = self.tiers.as_ref() else {
            return 0;
        };
        let (mut host, mut disk, mut levels) = (0u64, 0u64, 0usize);
        let depth = matches.iter().map(|m| m.restore.len()).max().unwrap_or(0);
        for level in 0..depth {
            let mut any = false;
            for (g, m) in matches.iter().enumerate() {
                if m.restore.get(level) != Some(&true) {
                    continue;
                }
                any = true;
                match store.locate(TierKey::new(g, m.links[level].1)) {
                    Some((true, n)) => disk += n as u64,
                    Some((false, n)) => host += n as u64,
                    None => {}
                }
            }
            levels += usize::from(any);
        }
        let tokens = levels * self.kv_cache.block_size;
        if levels == 0 || cost.restore_wins(tokens, host, disk) {
            return 0;
        }
        for m in matches.iter_mut() {
            for level in 0..m.restore.len() {
                m.unhold(level);
            }
        }
        levels
    }

    /// The first `levels` levels of an admission's matches, in tokens, by where they come
    /// from: a level any group restores from the remote tier counts for remote, else one any
    /// group restores from a file for disk, else one any group restores from host memory for
    /// host, else for the pool.
    pub(crate) fn hits_by_tier(&self, matches: &[PrefixMatch], levels: usize) -> HitsByTier {
        let bs = self.kv_cache.block_size as u64;
        let mut h = HitsByTier::default();
        for level in 0..levels {
            let restored = matches
                .iter()
                .enumerate()
                .filter(|(_, m)| m.restore.get(level) == Some(&true));
            let (mut from_disk, mut from_remote) = (false, false);
            let mut any = false;
            for (g, m) in restored {
                any = true;
                let key = TierKey::new(g, m.links[level].1);
                let store = self.tiers.as_ref();
                from_disk |= store.is_some_and(|s| s.came_from_disk(key));
                from_remote |= store.is_some_and(|s| s.came_from_remote(key));
            }
            match (any, from_disk, from_remote) {
                (_, _, true) => h.remote += bs,
                (_, true, false) => h.disk += bs,
                (true, false, false) => h.host += bs,
                (false, _, _) => h.pool += bs,
            }
        }
        h
    }

    /// Keeps in `m` (group `g`'s match) only the restorable levels whose bytes the store can
    /// give back now; the others become holes. A level spilled in the step being built waits
    /// for the next step; one whose bytes are lost (an unreadable file) is forgotten.
    pub(crate) fn check_restores(&mut self, g: usize, m: &mut PrefixMatch) {
        let Some(store) = self.tiers.as_mut() else {
            return;
        };
        for level in 0..m.restore.len() {
            if !m.restore[level] {
                continue;
            }
            let entry = m.links[level].1;
            if store.ready(TierKey::new(g, entry)) {
                continue;
            }
            m.unhold(level);
            if !self.allocators[g].spill_pending(entry) {
                self.allocators[g].forget_tiered(entry);
            }
        }
    }

    /// Takes the moves the pools decided into the step's list, naming each by group.
    pub(crate) fn collect_tier_ops(&mut self) {
        for (g, alloc) in self.allocators.iter_mut().enumerate() {
            let key = |entry| TierKey::new(g, entry);
            self.pending_tier_ops
                .extend(alloc.take_tier_ops().into_iter().map(|op| match op {
                    IndexOp::Spill { block, entry } => TierOp::Spill {
                        key: key(entry),
                        block,
                    },
                    IndexOp::Restore { entry, block } => TierOp::Restore {
                        key: key(entry),
                        block,
                    },
                    IndexOp::Drop { entry } => TierOp::Drop { key: key(entry) },
                }));
        }
    }

    /// Forgets below the levels the pools let go outside a step (a level computed again and
    /// registered by `update`): dropping needs no engine. Other moves wait for the next step.
    pub(crate) fn apply_tier_drops(&mut self) {
        self.collect_tier_ops();
        let Some(store) = self.tiers.as_mut() else {
            return;
        };
        self.pending_tier_ops.retain(|op| match *op {
            TierOp::Drop { key } => {
                store.remove(key);
                false
            }
            _ => true,
        });
    }

    /// Moves the last [`crate::Scheduler::schedule`]d step decided were never made (the caller ran
    /// the step without [`crate::driver::execute_step`]): those spills never reached the store,
    /// so the pools forget them. Keeps the list bounded and every tiered level readable.
    pub(crate) fn forget_unmoved(&mut self) {
        if let Some(store) = self.tiers.as_mut() {
            store.unpin_all();
        }
        for op in std::mem::take(&mut self.pending_tier_ops) {
            if let TierOp::Spill { key, .. } = op {
                if let Some(store) = self.tiers.as_mut() {
                    store.remove(key);
                }
                self.allocators[key.group as usize].forget_tiered(key.entry);
            }
        }
    }

    /// The tier moves of the step just scheduled, in order: every block to spill is read
    /// first (a block evicted this step may receive a restore), then every restore is written,
    /// then the spilled bytes are stored and dropped keys forgotten. Call it after
    /// [`crate::Scheduler::schedule`] and before the engine runs the step (its copies and forward
    /// pass); [`crate::driver::execute_step`] does. A no-op without tiers.
    ///
    /// # Errors
    /// [`TierMoveError::Engine`] if the engine fails to read or write a block;
    /// [`TierMoveError::Unsupported`] if it cannot move blocks but a restore was scheduled
    /// (impossible: nothing could have been spilled); [`TierMoveError::Lost`] if a restore
    /// finds no bytes (checked when scheduled, so a bug).
    pub fn move_tier_blocks<E: StepExecutor + ?Sized>(
        &mut self,
        engine: &mut E,
    ) -> Result<(), TierMoveError<E::Error>>
    where
        E::Error: std::fmt::Display,
    {
        let writes = self.read_remote_writes(engine);
        let ops = std::mem::take(&mut self.pending_tier_ops);
        let Some(store) = self.tiers.as_mut() else {
            return Ok(());
        };
        let mut spilled = Vec::new();
        for op in &ops {
            if let TierOp::Spill { key, block } = *op {
                let bytes = engine
                    .read_block(key.group as usize, block)
                    .map_err(TierMoveError::Engine)?;
                spilled.push((key, bytes));
            }
        }
        for op in &ops {
            if let TierOp::Restore { key, block } = *op {
                let bytes = store.take(key).ok_or(TierMoveError::Lost(key))?;
                let written = engine
                    .write_block(key.group as usize, block, &bytes)
                    .map_err(TierMoveError::Engine)?;
                if !written {
                    return Err(TierMoveError::Unsupported);
                }
            }
        }
        let mut spilled = spilled.into_iter();
        let mut lost = Vec::new();
        for op in ops {
            match op {
                TierOp::Spill { .. } => match spilled.next() {
                    Some((key, Some(bytes))) => lost.extend(store.put(key, bytes.into())),
                    Some((key, None)) => lost.push(key),
                    None => {}
                },
                TierOp::Drop { key } => store.remove(key),
                TierOp::Restore { .. } => {}
            }
        }
        store.unpin_all();
        for key in lost {
            store.remove(key);
            self.allocators[key.group as usize].forget_tiered(key.entry);
        }
        self.write_remote(writes);
        Ok(())
    }

    /// The moves between the pools and the tiers below them that the step last scheduled
    /// needs, in the order they were decided (empty without tiers, or once made).
    pub fn pending_tier_ops(&self) -> &[TierOp] {
        &self.pending_tier_ops
    }

    /// The tiers' store (`None` without tiers): what it holds and moved.
    pub fn tier_store(&self) -> Option<&crate::KvTierStore> {
        self.tiers.as_ref()
    }
}

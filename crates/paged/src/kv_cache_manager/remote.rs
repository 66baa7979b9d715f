//! The manager's side of the remote tier ([`crate::tier::RemoteTier`]): before a prompt's hit
//! is searched, the levels no pool or lower tier serves are fetched into host memory; after a
//! step, the full blocks it computed for the first time are listed, and read and written
//! through when the next step starts (before anything can overwrite them).

use super::KvCacheManager;
use crate::tier::remote::Publish;
use crate::{StepExecutor, TierKey};

impl KvCacheManager {
    /// Learns from the engine how many bytes one block of each group is (reading block 0), which
    /// the remote tier needs before it accepts a value; a no-op once known or without a remote
    /// tier. [`crate::driver::step`] calls it before each schedule.
    pub fn learn_block_bytes<E: StepExecutor + ?Sized>(&mut self, engine: &mut E) {
        let Some(remote) = self.remote.as_mut() else {
            return;
        };
        if remote.knows_block_bytes() {
            return;
        }
        for (g, bytes) in engine_block_bytes(engine, self.allocators.len()).enumerate() {
            if let Some(bytes) = bytes {
                remote.set_block_bytes(g, bytes);
            }
        }
    }

    /// Fetches from the remote tier the levels of the prompt `tokens` (salted `salt`, at most
    /// `max_blocks`) that neither a pool block nor a lower tier serves, as far as the hit could
    /// use them: every such level of a full-attention group from the first on, and for a
    /// sliding-window group only those its window needs before that hit ends. What is found and
    /// verified is held in host memory as a tiered level, which the hit search then restores.
    pub(crate) fn fetch_remote(&mut self, tokens: &[u32], salt: u64, max_blocks: usize) {
        let Some(remote) = self.remote.as_ref() else {
            return;
        };
        if !remote.knows_block_bytes() {
            return;
        }
        let bs = self.kv_cache.block_size;
        // Fetches land in host memory: never more than a pool's share, or they would push out
        // each other (what they push out is never a level an earlier admission of this step
        // will restore: the store keeps those, `KvTierStore::ready`).
        let room = self.tier_config.as_ref().map_or(0, |t| t.host_blocks);
        let mut groups: Vec<usize> = (0..self.allocators.len()).collect();
        groups.sort_by_key(|&g| self.kv_cache.groups[g].sliding_window.is_some());
        let mut hit = max_blocks;
        for g in groups {
            let group = &self.kv_cache.groups[g];
            let sliding = group.sliding_window.is_some();
            let from = if sliding {
                group.keep_from(hit * bs) / bs
            } else {
                0
            };
            let m = self.allocators[g].match_prefix_levels_salted(tokens, salt, hit);
            if m.collision_detected() {
                hit = hit.min(m.num_blocks());
                continue;
            }
            let missing: Vec<usize> = (from..hit).filter(|&l| !m.serves(l)).collect();
            let wanted: Vec<usize> = missing.iter().copied().take(room).collect();
            if wanted.is_empty() {
                continue;
            }
            let Some(remote) = self.remote.as_mut() else {
                return;
            };
            let last = wanted[wanted.len() - 1];
            let digests = remote.digests(g, (tokens, salt), bs, last + 1);
            let asks: Vec<_> = (wanted.iter())
                .map(|&l| (l, digests[l], &tokens[l * bs..(l + 1) * bs]))
                .collect();
            let fetched = remote.fetch(g, &asks);
            // A full-attention hit ends at the first level still missing: one not found, or
            // one past what host memory had room to fetch.
            if !sliding && let Some(&miss) = missing.get(fetched.len()) {
                hit = miss;
            }
            let levels = wanted.into_iter().zip(fetched).collect();
            self.adopt_from_outside(g, (tokens, salt), levels, true);
        }
    }

    /// Makes levels of the prompt `tokens` (salted `salt`) whose bytes came from outside this
    /// run's pools — fetched from the remote tier (`remote`) or read from a saved session —
    /// tiered levels of group `g` held in host memory: (level, bytes) in increasing level
    /// order. What host memory loses on the way to make room is forgotten.
    pub(crate) fn adopt_from_outside(
        &mut self,
        g: usize,
        (tokens, salt): (&[u32], u64),
        levels: Vec<(usize, Box<[u8]>)>,
        remote: bool,
    ) {
        let adopted = self.allocators[g].adopt_fetched(tokens, salt, levels, 0);
        let Some(store) = self.tiers.as_mut() else {
            return;
        };
        let mut lost = Vec::new();
        for (entry, bytes) in adopted {
            lost.extend(store.put_fetched(TierKey::new(g, entry), bytes, remote));
        }
        for key in lost {
            store.remove(key);
            self.allocators[key.group as usize].forget_tiered(key.entry);
        }
    }

    /// Lists for the remote tier the full blocks that group `g`'s pool just stored for the
    /// first time (a sequence of salt `salt` whose tokens are `tokens`): each is read and
    /// written when the next step's moves are made.
    pub(crate) fn list_remote_writes(&mut self, g: usize, salt: u64, tokens: &[u32]) {
        let Some(remote) = self.remote.as_ref() else {
            return;
        };
        let new = self.allocators[g].take_newly_cached();
        let Some(last) = new.iter().map(|&(level, _)| level).max() else {
            return;
        };
        let bs = self.kv_cache.block_size;
        let digests = remote.digests(g, (tokens, salt), bs, last + 1);
        for (level, block) in new {
            if !remote.needs_write(&digests[level]) {
                continue;
            }
            let publish = Publish {
                group: g,
                level,
                digest: digests[level],
                tokens: tokens[level * bs..(level + 1) * bs].into(),
            };
            self.unwritten.push((publish, block));
        }
    }

    /// Reads the blocks the step's moves write to the remote tier (call before anything
    /// writes a block). Returns them with their bytes for [`Self::write_remote`]. A block the
    /// engine fails to read is skipped (writing through is never worth failing a step for).
    pub(crate) fn read_remote_writes<E: StepExecutor + ?Sized>(
        &mut self,
        engine: &mut E,
    ) -> Vec<(Publish, Vec<u8>)> {
        let pending = std::mem::take(&mut self.pending_writes);
        read_blocks(engine, pending)
    }

    /// Writes to the remote tier the blocks computed since the last step was built, without
    /// waiting for a next step: call it when no step is being built or run (an idle server,
    /// the end of a batch), so that the last blocks of a conversation reach other processes
    /// now. A no-op without a remote tier.
    pub fn flush_remote_writes<E: StepExecutor + ?Sized>(&mut self, engine: &mut E) {
        if self.remote.is_none() {
            return;
        }
        let mut blocks = std::mem::take(&mut self.pending_writes);
        blocks.append(&mut self.unwritten);
        let written = read_blocks(engine, blocks);
        self.write_remote(written);
    }

    /// Hands blocks read by [`Self::read_remote_writes`] to the remote tier's writer.
    pub(crate) fn write_remote(&mut self, blocks: Vec<(Publish, Vec<u8>)>) {
        if let Some(remote) = self.remote.as_mut() {
            remote.publish(blocks);
        }
    }
}

/// The bytes of each listed block; a block the engine cannot or fails to read is left out.
fn read_blocks<E: StepExecutor + ?Sized>(
    engine: &mut E,
    blocks: Vec<(Publish, crate::BlockId)>,
) -> Vec<(Publish, Vec<u8>)> {
    let mut out = Vec::new();
    for (p, block) in blocks {
        if let Ok(Some(bytes)) = engine.read_block(p.group, block) {
            out.push((p, bytes));
        }
    }
    out
}

/// Bytes of one block of each of `groups` KV cache groups in the engine's pool (block 0 read
/// to see); `None` for a group whose blocks the engine cannot read.
pub(super) fn engine_block_bytes<E: StepExecutor + ?Sized>(
    engine: &mut E,
    groups: usize,
) -> impl Iterator<Item = Option<usize>> + '_ {
    (0..groups).map(|g| engine.read_block(g, 0).ok().flatten().map(|b| b.len()))
}

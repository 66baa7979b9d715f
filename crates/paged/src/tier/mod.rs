//! Tiers below the block pool: host memory, then files on disk (LMCache's CPU DRAM and
//! local-disk tiers; vLLM's CPU swap space), and optionally Redis, shared by every process that
//! names it (LMCache's remote backend).
//!
//! With tiers, a cached block that the prefix cache evicts is **spilled** (its bytes copied
//! down) instead of dropped, and a later prompt that starts with the same tokens **restores** it
//! into a fresh block instead of computing it again. Blocks move whole, with their prefix-cache
//! identity (the entry, verified on tokens and parent like any hit), and come back
//! bit-identical, so a restored prefix gives exactly the tokens a recomputed one gives.
//!
//! Who does what:
//! * `index.rs`, inside each pool's prefix cache: which entries the tiers hold (at most
//!   `host_blocks + disk_blocks` per pool, the oldest spill dropped first) and the moves a step
//!   must make, in the order they were decided.
//! * `store.rs` ([`KvTierStore`], owned by the [`crate::Scheduler`]): the bytes. Host memory
//!   first; past `host_blocks` per pool its least recently stored blocks go to files under the
//!   disk directory, each written with a CRC-32 and read back only if header, length and
//!   checksum match. A corrupt, missing or unwritable file is a cache miss: the level is
//!   computed again, never read wrong.
//! * the engine ([`crate::StepExecutor::read_block`] and `write_block`): a block's bytes, every
//!   layer of its group, keys and values as the pool stores them (scales included).
//! * [`crate::driver::execute_step`]: the order, before the step's copies and forward pass —
//!   read every block to spill (a block evicted this step may be the target of a restore), then
//!   write every restore, then hand the spilled bytes to the store.
//!
//! * `remote.rs` ([`RemoteTier`], owned by the manager beside the store): blocks in Redis by
//!   content, written through as they are computed and fetched into host memory when a
//!   prompt's prefix misses everything above; verified like files, never trusted.
//!
//! * `session.rs` ([`SavedSession`]): a conversation's cached blocks in a file, checksummed, to
//!   restore in this process or a restarted one (`KvCacheManager::save_session`/
//!   `restore_session`); restored levels enter host memory like fetched ones.
//!
//! A level is restorable only once its bytes are in the store: one spilled in the step being
//! built is a miss until the step has run. Before a restore is scheduled the store checks its
//! bytes (a file is read and verified then, and kept in host memory), so the move itself cannot
//! fail.

pub(crate) mod index;
pub(crate) mod remote;
mod session;
mod store;

use std::path::PathBuf;

use serde::Serialize;

pub use remote::{RETRY_AFTER, RemoteTier, RemoteTierConfig, RemoteTierStats};
pub use session::{SavedBlock, SavedSession};
pub use store::{KvTierStore, TierStoreStats};

use crate::BlockId;

/// The tiers below every pool: how many blocks each holds and where the disk tier lives.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct TierConfig {
    /// Blocks per pool kept in host memory.
    pub host_blocks: usize,
    /// Blocks per pool kept in files once host memory is full (0: no disk tier).
    pub disk_blocks: usize,
    /// Directory the disk tier writes under (a fresh subdirectory per run, removed at the end);
    /// required when `disk_blocks > 0`.
    pub disk_dir: Option<PathBuf>,
    /// Scheduler steps a spilled block may stay below before it is dropped (`None`: until the
    /// tiers are full and it is the oldest spill).
    pub ttl_steps: Option<u64>,
    /// When to restore: `None` always (a level whose bytes are below is restored); with a
    /// cost model, per request, only when restoring is cheaper than recomputing.
    pub restore_cost: Option<RestoreCost>,
    /// Offload paused sessions on purpose: when a request marked [`crate::Request::resumes`]
    /// (a multi-turn session's turn, which a later request continues) finishes, its blocks
    /// that nobody else holds leave the pool for the tiers at once, deepest first, instead of
    /// waiting as evictable blocks until the pool needs them. `false`: only eviction spills.
    pub offload_paused: bool,
    /// A tier below host memory and files in Redis, shared with other processes
    /// ([`RemoteTier`]); what it finds is restored through host memory, so `host_blocks` must
    /// be above 0.
    pub remote: Option<RemoteTierConfig>,
}

/// The cost model that chooses, per request, between restoring a prefix's levels from the
/// tiers and recomputing them (vLLM's swap-or-recompute question):
///
/// ```text
/// restore   = host bytes / host_bytes_per_s + disk bytes / disk_bytes_per_s
/// recompute = tokens × prefill_ns_per_token
/// ```
///
/// Recompute cost grows with the prefix's tokens, restore cost with its bytes (per token: 2 ×
/// layers × KV heads × head_dim × element bytes). The linear prefill term leaves out attention's
/// quadratic part, so long prefixes cost more to recompute than it says: the model errs towards
/// recomputing. `cargo xtask bench --tiers` measures the three rates for a model on a machine
/// and prints them as a `--restore-cost` value.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
pub struct RestoreCost {
    /// Nanoseconds to prefill one token.
    pub prefill_ns_per_token: u64,
    /// Bytes per second a restore moves from host memory.
    pub host_bytes_per_s: u64,
    /// Bytes per second a restore reads and verifies from a file.
    pub disk_bytes_per_s: u64,
}

impl RestoreCost {
    /// Whether restoring `host_bytes` from memory and `disk_bytes` from files is expected to be
    /// faster than prefilling `tokens` tokens again.
    pub fn restore_wins(&self, tokens: usize, host_bytes: u64, disk_bytes: u64) -> bool {
        let s = |bytes: u64, per_s: u64| bytes as f64 / per_s.max(1) as f64;
        let restore = s(host_bytes, self.host_bytes_per_s) + s(disk_bytes, self.disk_bytes_per_s);
        restore < tokens as f64 * self.prefill_ns_per_token as f64 * 1e-9
    }
}

impl TierConfig {
    /// `host_blocks` blocks per pool in host memory, no disk tier.
    pub fn host(host_blocks: usize) -> Self {
        Self {
            host_blocks,
            disk_blocks: 0,
            disk_dir: None,
            ttl_steps: None,
            restore_cost: None,
            offload_paused: false,
            remote: None,
        }
    }

    /// The same tiers plus the remote tier `remote` (`None`: none).
    pub fn with_remote(mut self, remote: Option<RemoteTierConfig>) -> Self {
        self.remote = remote;
        self
    }

    /// The same tiers, offloading paused sessions as they pause ([`TierConfig::offload_paused`]).
    pub fn with_offload_paused(mut self, offload_paused: bool) -> Self {
        self.offload_paused = offload_paused;
        self
    }

    /// The same tiers restoring only when `cost` says it beats recomputing.
    pub fn with_restore_cost(mut self, cost: Option<RestoreCost>) -> Self {
        self.restore_cost = cost;
        self
    }

    /// The same tiers dropping what was spilled more than `steps` scheduler steps ago.
    pub fn with_ttl_steps(mut self, steps: Option<u64>) -> Self {
        self.ttl_steps = steps;
        self
    }

    /// The same tiers plus `disk_blocks` blocks per pool in files under `dir`.
    pub fn with_disk(mut self, dir: impl Into<PathBuf>, disk_blocks: usize) -> Self {
        self.disk_dir = Some(dir.into());
        self.disk_blocks = disk_blocks;
        self
    }

    /// Blocks per pool the tiers hold in all.
    pub fn capacity(&self) -> usize {
        self.host_blocks.saturating_add(self.disk_blocks)
    }
}

/// Where a block's bytes are kept below the pool: the KV cache group (pool) and the
/// prefix-cache entry (unique for the run) whose content they are.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize)]
pub struct TierKey {
    /// The KV cache group, i.e. which pool the block belongs to.
    pub group: u32,
    /// The prefix-cache entry id in that group's allocator (never reused within a run).
    pub entry: u64,
}

impl TierKey {
    /// The key of `entry` of group `group`'s pool.
    pub fn new(group: usize, entry: u64) -> Self {
        Self {
            group: group as u32,
            entry,
        }
    }
}

/// One move between a pool and the tiers below it.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
pub enum TierOp {
    /// Copy `block`'s bytes down under `key`, before anything of the step writes the block.
    Spill {
        /// Where the bytes go below.
        key: TierKey,
        /// The pool block to read (evicted this step).
        block: BlockId,
    },
    /// Copy `key`'s bytes into `block` (a fresh block of the sequence adopting the level).
    Restore {
        /// Where the bytes are below.
        key: TierKey,
        /// The pool block to write.
        block: BlockId,
    },
    /// Forget `key` below (the tiers are full, or the content is in a block again).
    Drop {
        /// The entry to forget.
        key: TierKey,
    },
}

/// Running totals of one pool's moves, in blocks.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize)]
pub struct TierStats {
    /// Evicted blocks whose bytes went down a tier.
    pub spills: u64,
    /// Levels brought back from a tier into a fresh block (their prefill skipped).
    pub restores: u64,
    /// Entries the tiers let go, by why.
    pub drops: TierDrops,
}

/// Why the tiers let entries go: the two policies that bound them (size, time to live), and
/// the two events that make a copy below useless.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize)]
pub struct TierDrops {
    /// The oldest spill, pushed out by a new one when the tiers were full.
    pub full: u64,
    /// Spilled more than `ttl_steps` steps ago.
    pub expired: u64,
    /// The same content was computed again into a block (the copy below is redundant).
    pub recomputed: u64,
    /// The bytes were lost: an unreadable file, a failed write, an engine that cannot move
    /// blocks, or a step run without the moves.
    pub lost: u64,
}

impl TierDrops {
    /// Entries dropped for any reason.
    pub fn total(&self) -> u64 {
        self.full + self.expired + self.recomputed + self.lost
    }
}

/// Counts of two pools summed.
impl std::ops::Add for TierDrops {
    type Output = TierDrops;

    fn add(self, other: TierDrops) -> TierDrops {
        TierDrops {
            full: self.full + other.full,
            expired: self.expired + other.expired,
            recomputed: self.recomputed + other.recomputed,
            lost: self.lost + other.lost,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn restoring_wins_when_its_bytes_move_faster_than_its_tokens_compute() {
        // 1 ms a token; 1 GB/s from memory, 100 MB/s from files.
        let c = RestoreCost {
            prefill_ns_per_token: 1_000_000,
            host_bytes_per_s: 1_000_000_000,
            disk_bytes_per_s: 100_000_000,
        };
        // 16 tokens = 16 ms to recompute; 10 MB from memory = 10 ms, from files 100 ms.
        assert!(c.restore_wins(16, 10_000_000, 0));
        assert!(!c.restore_wins(16, 0, 10_000_000));
        assert!(!c.restore_wins(16, 16_000_000, 0), "a tie recomputes");
        assert!(c.restore_wins(200, 0, 10_000_000));
    }
}

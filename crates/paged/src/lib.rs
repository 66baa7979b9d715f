//! kvlab-paged: the bookkeeping of a paged KV cache, device-independent and plain data.
//!
//! A contiguous KV cache reserves `max_seq_len` positions per sequence up front, and most of that
//! memory holds nothing for most of the sequence's life (`waste.rs` puts numbers on it). vLLM's
//! PagedAttention instead splits the cache into a pool of fixed-size **blocks** of `block_size`
//! token slots (16 by default). A sequence takes a block only when its previous block is full,
//! so it wastes at most one partial block, and its **block table** maps its logical blocks, in
//! order, to whatever physical blocks it got:
//!
//! ```text
//!  sequence A: 37 tokens, block_size = 16      pool: num_blocks = 8 (B is another sequence)
//!
//!  logical block:  0   1   2                   physical: 0    1    2    3    4    5    6    7
//!  block_table = [ 5,  2,  7 ]                         [  ] [B0] [A1] [  ] [  ] [A0] [B1] [A2]
//!                  │   │   └─ positions 32..37 (5 of 16 slots used: the only waste)
//!                  │   └───── positions 16..32
//!                  └───────── positions  0..16
//!
//!  slot(pos) = block_table[pos / block_size] · block_size + pos % block_size
//!  slot(33)  = 7 · 16 + 1 = 113   (row 113 of the cache seen as (num_blocks · block_size, ...))
//! ```
//!
//! The engine stores each new token's k and v at its slot (`slot_mapping`), and attention reads
//! a sequence's keys through its block table. Because tables are indirections, blocks can be
//! shared: a **forked** sequence shares all of its parent's blocks and copies one only when it
//! first writes into it (copy-on-write), and sequences whose prompts start alike share the cached
//! blocks of that prefix (**prefix caching**, by chained block hashes verified token for token).
//!
//! One type per file, or per folder with one idea per file, in data-flow order:
//!
//! * [`hash`]: chained content hashes of full blocks (deterministic FNV-1a).
//! * [`block_table`]: [`BlockTable`], slots, padded `block_tables` ([`PAD_BLOCK`] = -1,
//!   [`PAD_SLOT`] = -1).
//! * `prefix_cache.rs`: the hash → entry → block store (verified hits, ghost entries that keep
//!   the chain verified where no block is held, the queue of evictable blocks), and
//!   [`PrefixMatch`]; `eviction.rs`: [`EvictionPolicy`] (LRU, LFU, CLOCK, leaf-first) and its
//!   queue.
//! * `allocator/`: [`BlockAllocator`], one pool. `mod.rs`: ref counts, `allocate`, `free`,
//!   `fork`; `append.rs`: `can_append`/`append_slot(s)` with copy-on-write; `prefix.rs`:
//!   `match_prefix(_levels)`/`adopt_prefix`/`register_full_blocks`; `window.rs`:
//!   `free_outside_window`.
//! * `config.rs`: [`KvCacheConfig`], the block size and a pool per KV cache group, the one value
//!   the engine is built with and the scheduler takes; [`SchedulerConfig`] adds step budgets.
//! * `sequence.rs`: [`Sequence`], one request's tokens, block tables and stop conditions.
//! * `kv_cache_manager/`: [`KvCacheManager`], every block a request holds in every group (vLLM
//!   v1's seam). `mod.rs`: `allocate_slots`, `free`, `fork`, window trimming, full blocks
//!   cached; `hit.rs`: `get_computed_blocks`, the hit every group serves, and the prefill's
//!   slots; `tiers.rs`: restores weighed and checked before they are scheduled, a step's spills
//!   and restores performed with the engine.
//! * `scheduler/`: [`Scheduler`], continuous batching over the manager: FCFS admission, token
//!   and sequence budgets, preemption by recompute. `mod.rs`: state and admission;
//!   `schedule.rs`: build a step; `update.rs`: take its sampled tokens back, fork, abort.
//! * [`tier`]: tiers below the pool — evicted cached blocks spilled to host memory, then to files
//!   with checksums, and restored on a later hit (`index.rs`: which entries, bounded by size and
//!   time to live; `store.rs`: [`KvTierStore`], the bytes; `remote.rs`: [`RemoteTier`], blocks
//!   in Redis by content, shared across processes; [`RestoreCost`]: restore or recompute, per
//!   request).
//! * `scheduled_batch.rs`: [`ScheduledBatch`], what a step schedules; `model_input.rs`:
//!   [`ModelInput`], the same flattened into the arrays every paged engine executes, and
//!   `validate`, the checks every engine makes of them.
//! * `unscheduled.rs`: [`UnscheduledPools`], sequences driven one at a time through the `Engine`
//!   API without the scheduler, reserving slots as the scheduler does.
//! * [`driver`]: [`driver::step`], schedule → execute → sample → update once, which the [`drive`]
//!   loop and `kvlab serve` both turn; [`execute_step`] (a step's tier moves, then the engine) and
//!   the [`StepExecutor`] an engine implements; [`metrics`]:
//!   [`Metrics`] named like vLLM's; `pool_view.rs`: [`PoolView`], who holds which block (the
//!   block-table picture as data, for `kvlab batch --svg` and `kvlab serve`'s live page); [`waste`], [`workload`]: the memory-waste calculator and
//!   seeded request-length generators.
//!
//! **Size against the references.** nano-vllm does the same two jobs in `block_manager.py` (120
//! lines) and `scheduler.py` (92). Here the scheduler is under 550 lines of code and the
//! allocator with its prefix cache under 1,100 (`tests/sizes.rs` holds both claims). The difference
//! is what nano-vllm leaves out: its prefix hit compares a block's own tokens but not its
//! parent, so a hash collision one level up goes unnoticed (here each level must follow the very
//! entry matched before it); it has no copy-on-write fork, no sliding-window groups (ghost
//! entries, holes, hybrid hits), no tiers (nor blocks shared across processes), no abort, no typed errors, no draft tokens checked
//! and rolled back (speculative decoding), no cache salts, and steps that either prefill or
//! decode. vLLM v1 splits the work as this crate does: `block_pool.py` (free queue,
//! hash → block, eviction: `prefix_cache.rs` and `allocator/mod.rs` here), `kv_cache_manager.py`
//! (a request's slots, hits and windows: [`KvCacheManager`] over `allocator/append.rs`,
//! `prefix.rs` and `window.rs`), `scheduler.py` (queues and budgets: [`Scheduler`]), and one
//! `KVCacheConfig` given to the scheduler and the model runner ([`KvCacheConfig`]).
//!
//! Nothing here touches floats of the model or a device: engines (CPU or CUDA) own the cache
//! tensors and follow the [`ScheduledBatch`] they are given; the tiers keep a block's bytes as
//! the engine hands them over, opaque.

#![forbid(unsafe_code)]

pub mod block_table;
pub mod driver;
pub mod hash;
pub mod metrics;
pub mod tier;
pub mod waste;
pub mod workload;

mod allocator;
mod config;
mod error;
mod eviction;
mod kv_cache_manager;
mod model_input;
mod pool_view;
mod prefix_cache;
mod scheduled_batch;
mod scheduler;
mod sequence;
mod unscheduled;

pub use allocator::{
    AllocatorStats, BlockAllocator, BlockCopy, DEFAULT_BLOCK_SIZE, max_window_blocks, window_start,
};
pub use block_table::{BlockId, BlockTable, PAD_BLOCK, PAD_SLOT, PaddedBlockTables, Tenant};
pub use config::{KvCacheConfig, KvGroupConfig, SchedulerConfig};
pub use driver::{
    DriveError, DriveReport, Request, StepExecutor, StepOutcome, StepStats, TokenSampler, drive,
    drive_with, execute_step,
};
pub use error::{PagedError, Result};
pub use eviction::EvictionPolicy;
pub use hash::{BlockHash, HashFn, chain_hashes, fnv1a, fnv1a_block_hash};
pub use kv_cache_manager::{ComputedBlocks, KvCacheManager, PromptSlots, TierMoveError};
pub use metrics::{HitsByTier, Metrics};
pub use model_input::{GroupInput, ModelInput, first_key};
pub use pool_view::{BlockState, GroupView, PoolView, SeqView};
pub use prefix_cache::PrefixMatch;
pub use scheduled_batch::{FinishedSeq, GroupStep, ScheduledBatch, ScheduledSeq, StepKind};
pub use scheduler::Scheduler;
pub use sequence::{FinishReason, RequestId, Sequence, SequenceStatus, StopConditions};
pub use tier::{
    KvTierStore, RemoteTier, RemoteTierConfig, RemoteTierStats, RestoreCost, SavedBlock,
    SavedSession, TierConfig, TierDrops, TierKey, TierOp, TierStats, TierStoreStats,
};
pub use unscheduled::{UnscheduledPools, UnscheduledSeq};
pub use waste::{RequestLen, Reservation, Waste, WasteRow, compute_waste, waste_table};
pub use workload::{
    LongTail, SessionTurn, Sessions, long_tail_requests, session_turns, uniform_requests,
};

//! [`Scheduler`]: continuous batching over one block pool per KV cache group. One idea per file:
//!
//! * here: the state (queues, sequences, pools), admission of requests, queries and metrics;
//! * `schedule.rs`: building a step (decodes, preemption by recompute, prefix-cached prefills);
//! * `update.rs`: taking the step's sampled tokens back, and a sequence's end (stop, abort), fork
//!   and token replacement;
//! * `tiers.rs`: the tiers below the pools — restores checked before they are scheduled, a
//!   step's spills and restores performed with the engine.
//!
//! Two queues, as in vLLM: `waiting` (FCFS; new requests at the back, preempted ones at the
//! front) and `running` (sorted by arrival, oldest first). A driver loop:
//!
//! ```
//! use kvlab_paged::{KvCacheConfig, Scheduler, SchedulerConfig, StopConditions};
//! let kv_cache = KvCacheConfig::new([None], 64, 16); // the engine is built with the same value
//! let mut sched = Scheduler::new(SchedulerConfig::new(kv_cache, 256))?;
//! sched.add_request(vec![1, 2, 3], StopConditions::max_tokens(4))?;
//! while sched.has_unfinished() {
//!     let batch = sched.schedule()?;
//!     // The engine runs `batch` here; this stand-in samples token 7 for everyone.
//!     let sampled: Vec<_> = batch.seqs.iter().map(|s| (s.seq_id, 7)).collect();
//!     for done in sched.update(&sampled)? {
//!         assert_eq!(done.output_token_ids, vec![7; 4]);
//!     }
//! }
//! # Ok::<(), kvlab_paged::PagedError>(())
//! ```

mod schedule;
mod tiers;
mod update;

pub use tiers::TierMoveError;

use std::collections::{BTreeMap, VecDeque};

use crate::{
    BlockAllocator, BlockId, BlockTable, HashFn, HitsByTier, KvTierStore, Metrics, PagedError,
    Result, SchedulerConfig, SeqId, Sequence, SequenceStatus, StopConditions, Tenant, TierOp,
};

/// Totals the scheduler counts itself (the allocators count the rest).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub(crate) struct Counters {
    pub(crate) prefix_cache_queries: u64,
    pub(crate) prefix_cache_hits: u64,
    /// Of the hits, tokens served from the pool, restored from host memory, from files.
    pub(crate) hits_by_tier: HitsByTier,
    pub(crate) num_preemptions: u64,
    pub(crate) num_recomputed_tokens: u64,
    pub(crate) num_steps: u64,
    pub(crate) num_restores_declined: u64,
}

/// The continuous-batching scheduler over one block pool per KV cache group.
#[derive(Debug)]
pub struct Scheduler {
    pub(crate) config: SchedulerConfig,
    /// (num_groups,) one pool per KV cache group.
    pub(crate) allocators: Vec<BlockAllocator>,
    pub(crate) seqs: BTreeMap<SeqId, Sequence>,
    pub(crate) waiting: VecDeque<SeqId>,
    /// Sorted by arrival (by id), oldest first.
    pub(crate) running: Vec<SeqId>,
    /// Sequences of the batch awaiting `update`, in batch order.
    pub(crate) in_flight: Option<Vec<SeqId>>,
    /// Aborted while in flight: their tokens in the next `update` are ignored.
    pub(crate) aborted_in_flight: Vec<SeqId>,
    pub(crate) next_id: u64,
    pub(crate) counters: Counters,
    /// Per tenant: (prompt tokens looked up, tokens the prefix cache served).
    pub(crate) tenant_hits: BTreeMap<Tenant, (u64, u64)>,
    /// The bytes of the blocks the tiers below the pools hold (`None`: no tiers).
    pub(crate) tiers: Option<KvTierStore>,
    /// The tier moves of the step last scheduled, until `move_tier_blocks` makes them.
    pub(crate) pending_tier_ops: Vec<TierOp>,
    /// (group, blocks in logical order) of paused sessions that finished since the last step,
    /// offloaded to the tiers when the next step is built (`TierConfig::offload_paused`).
    pub(crate) paused_blocks: Vec<(usize, Vec<BlockId>)>,
}

impl Scheduler {
    /// A scheduler with empty queues and all blocks free.
    ///
    /// # Errors
    /// [`PagedError::InvalidConfig`] from [`SchedulerConfig::validate`] or from the pool sizes;
    /// [`PagedError::Tier`] if the disk tier's directory cannot be created or written.
    pub fn new(config: SchedulerConfig) -> Result<Self> {
        config.validate()?;
        let allocators = config.kv_cache.allocators(
            config.enable_prefix_caching,
            config.eviction_policy,
            config.tenant_quota,
            config.tiers.as_ref().map(|t| (t.capacity(), t.ttl_steps)),
        )?;
        let tiers = match &config.tiers {
            Some(t) => Some(KvTierStore::new(t, allocators.len())?),
            None => None,
        };
        Ok(Self {
            config,
            allocators,
            seqs: BTreeMap::new(),
            waiting: VecDeque::new(),
            running: Vec::new(),
            in_flight: None,
            aborted_in_flight: Vec::new(),
            next_id: 0,
            counters: Counters::default(),
            tenant_hits: BTreeMap::new(),
            tiers,
            pending_tier_ops: Vec::new(),
            paused_blocks: Vec::new(),
        })
    }

    /// Replaces the block hash function of every pool (tests force collisions with it).
    pub fn with_hash_fn(mut self, hash_fn: HashFn) -> Self {
        self.allocators = self
            .allocators
            .into_iter()
            .map(|a| a.with_hash_fn(hash_fn))
            .collect();
        self
    }

    /// Queues a request at the back of the waiting queue; allowed at any time, even while a
    /// step is in flight.
    ///
    /// # Errors
    /// [`PagedError::EmptyPrompt`]; [`PagedError::PromptTooLong`] if the prompt exceeds
    /// `max_model_len` (it could never fit); [`PagedError::InvalidRequest`] if `max_tokens` is 0
    /// or `max_seq_len` is below the prompt length.
    pub fn add_request(&mut self, prompt: Vec<u32>, stop: StopConditions) -> Result<SeqId> {
        self.add_request_for(prompt, stop, 0)
    }

    /// [`Scheduler::add_request`] for a request of `tenant`: the blocks it caches count against
    /// that tenant's quota (`SchedulerConfig::tenant_quota`), and its prefix hits against its
    /// row of [`Scheduler::tenant_prefix_hits`].
    ///
    /// # Errors
    /// As [`Scheduler::add_request`].
    pub fn add_request_for(
        &mut self,
        prompt: Vec<u32>,
        stop: StopConditions,
        tenant: Tenant,
    ) -> Result<SeqId> {
        let max_model_len = self.config.max_model_len;
        if prompt.is_empty() {
            return Err(PagedError::EmptyPrompt);
        }
        if prompt.len() > max_model_len {
            return Err(PagedError::PromptTooLong {
                prompt_len: prompt.len(),
                max_model_len,
            });
        }
        if stop.max_tokens == 0 {
            return Err(PagedError::InvalidRequest(
                "max_tokens is 0; ask for at least one token".into(),
            ));
        }
        if stop.max_seq_len.is_some_and(|m| m < prompt.len()) {
            return Err(PagedError::InvalidRequest(format!(
                "max_seq_len {:?} is below the prompt length {}; raise it or leave it None",
                stop.max_seq_len,
                prompt.len()
            )));
        }
        let id = self.new_id();
        let seq = Sequence {
            id,
            prompt_len: prompt.len(),
            token_ids: prompt,
            stop,
            status: SequenceStatus::Waiting,
            num_computed_tokens: 0,
            max_computed_tokens: 0,
            block_tables: self.empty_tables(tenant),
            num_preemptions: 0,
            tenant,
            offload_on_finish: false,
        };
        self.seqs.insert(id, seq);
        self.waiting.push_back(id);
        Ok(id)
    }

    /// Marks `id` as a paused session: when it finishes (not when aborted), its blocks that
    /// nobody else holds are offloaded to the tiers at the next step instead of waiting for
    /// eviction, if the tiers have `offload_paused` on. A multi-turn trace marks every turn a
    /// later turn continues ([`crate::Request::resumes`]).
    ///
    /// # Errors
    /// [`PagedError::UnknownSequence`].
    pub fn offload_when_finished(&mut self, id: SeqId) -> Result<()> {
        self.seqs
            .get_mut(&id)
            .ok_or(PagedError::UnknownSequence(id))?
            .offload_on_finish = true;
        Ok(())
    }

    /// The configuration.
    pub fn config(&self) -> &SchedulerConfig {
        &self.config
    }

    /// One pool per KV cache group, in group order.
    pub fn allocators(&self) -> &[BlockAllocator] {
        &self.allocators
    }

    /// A live (waiting or running) sequence; finished ones are released.
    pub fn sequence(&self, id: SeqId) -> Option<&Sequence> {
        self.seqs.get(&id)
    }

    /// The waiting queue, head first.
    pub fn waiting(&self) -> impl Iterator<Item = SeqId> + '_ {
        self.waiting.iter().copied()
    }

    /// The running queue, oldest arrival first (preemption takes from the back).
    pub fn running(&self) -> &[SeqId] {
        &self.running
    }

    /// Whether any sequence is waiting or running.
    pub fn has_unfinished(&self) -> bool {
        !self.seqs.is_empty()
    }

    /// Whether a batch awaits `update`.
    pub fn is_step_in_flight(&self) -> bool {
        self.in_flight.is_some()
    }

    /// The current metrics.
    pub fn metrics(&self) -> Metrics {
        let c = self.counters;
        Metrics {
            prefix_cache_queries: c.prefix_cache_queries,
            prefix_cache_hits: c.prefix_cache_hits,
            prefix_cache_hits_by_tier: c.hits_by_tier,
            num_preemptions: c.num_preemptions,
            num_recomputed_tokens: c.num_recomputed_tokens,
            num_running: self.running.len(),
            num_waiting: self.waiting.len(),
            num_steps: c.num_steps,
            num_restores_declined: c.num_restores_declined,
            tier_store: self
                .tiers
                .as_ref()
                .map_or_else(Default::default, KvTierStore::stats),
            ..Metrics::of_pools(&self.allocators)
        }
    }

    /// Frees the blocks of `id`'s sliding-window groups that its next query cannot reach.
    pub(crate) fn trim_windows(&mut self, id: SeqId) -> Result<()> {
        let seq = seq_mut(&mut self.seqs, id)?;
        let computed = seq.num_computed_tokens;
        for ((alloc, table), group) in self
            .allocators
            .iter_mut()
            .zip(&mut seq.block_tables)
            .zip(&self.config.kv_cache.groups)
        {
            if let Some(window) = group.sliding_window {
                alloc.free_outside_window(table, computed, window)?;
            }
        }
        Ok(())
    }

    /// First position whose key group `g` must keep once a step ends with `end` tokens computed.
    pub(crate) fn keep_from(&self, g: usize, end: usize) -> usize {
        self.config.kv_cache.groups[g].keep_from(end)
    }

    pub(crate) fn seq(&self, id: SeqId) -> Result<&Sequence> {
        self.seqs.get(&id).ok_or(PagedError::UnknownSequence(id))
    }

    pub(crate) fn empty_tables(&self, tenant: Tenant) -> Vec<BlockTable> {
        let table = BlockTable::new(self.config.kv_cache.block_size).with_tenant(tenant);
        vec![table; self.allocators.len()]
    }

    /// Per tenant: (prompt tokens looked up in the prefix cache, tokens it served), over every
    /// admission so far.
    pub fn tenant_prefix_hits(&self) -> &BTreeMap<Tenant, (u64, u64)> {
        &self.tenant_hits
    }

    pub(crate) fn new_id(&mut self) -> SeqId {
        self.next_id += 1;
        SeqId(self.next_id - 1)
    }
}

/// Sequence `id` of `seqs` (a function of the map alone, so the pools can be borrowed beside it).
pub(crate) fn seq_mut(seqs: &mut BTreeMap<SeqId, Sequence>, id: SeqId) -> Result<&mut Sequence> {
    seqs.get_mut(&id).ok_or(PagedError::UnknownSequence(id))
}

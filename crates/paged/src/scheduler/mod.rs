//! [`Scheduler`]: continuous batching — queues, the token budget and preemption — over a
//! [`KvCacheManager`], which holds every block (vLLM v1's split). One idea per file:
//!
//! * here: the state (queues, sequences), admission of requests, queries and metrics;
//! * `schedule.rs`: building a step (decodes, preemption by recompute, prefix-cached and chunked
//!   prefills);
//! * `update.rs`: taking the step's sampled tokens back, and a sequence's end (stop, abort), fork
//!   and token replacement.
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
mod update;

use std::collections::{BTreeMap, VecDeque};

use crate::metrics::Counters;
use crate::{
    HashFn, KvCacheManager, Metrics, PagedError, RequestId, Result, SchedulerConfig, Sequence,
    StopConditions, Tenant,
};

/// The continuous-batching scheduler over one block pool per KV cache group.
#[derive(Debug)]
pub struct Scheduler {
    pub(crate) config: SchedulerConfig,
    /// Every block of every sequence, the prefix caches and the tiers.
    pub(crate) kv: KvCacheManager,
    pub(crate) seqs: BTreeMap<RequestId, Sequence>,
    pub(crate) waiting: VecDeque<RequestId>,
    /// Sorted by arrival (by id), oldest first.
    pub(crate) running: Vec<RequestId>,
    /// Sequences of the batch awaiting `update`, in batch order.
    pub(crate) in_flight: Option<Vec<InFlight>>,
    /// Aborted while in flight: their tokens in the next `update` are ignored.
    pub(crate) aborted_in_flight: Vec<RequestId>,
    pub(crate) next_id: u64,
    pub(crate) counters: Counters,
    /// Per tenant: (prompt tokens looked up, tokens the prefix cache served).
    pub(crate) tenant_hits: BTreeMap<Tenant, (u64, u64)>,
}

impl Scheduler {
    /// A scheduler with empty queues and all blocks free.
    ///
    /// # Errors
    /// [`PagedError::InvalidConfig`] from [`SchedulerConfig::validate`] or from the pool sizes;
    /// [`PagedError::Tier`] if the disk tier's directory cannot be created or written.
    pub fn new(config: SchedulerConfig) -> Result<Self> {
        config.validate()?;
        Ok(Self {
            kv: KvCacheManager::new(&config)?,
            config,
            seqs: BTreeMap::new(),
            waiting: VecDeque::new(),
            running: Vec::new(),
            in_flight: None,
            aborted_in_flight: Vec::new(),
            next_id: 0,
            counters: Counters::default(),
            tenant_hits: BTreeMap::new(),
        })
    }

    /// Replaces the block hash function of every pool (tests force collisions with it).
    pub fn with_hash_fn(mut self, hash_fn: HashFn) -> Self {
        self.kv = self.kv.with_hash_fn(hash_fn);
        self
    }

    /// Queues a request at the back of the waiting queue; allowed at any time, even while a
    /// step is in flight.
    ///
    /// # Errors
    /// [`PagedError::EmptyPrompt`]; [`PagedError::PromptTooLong`] if the prompt exceeds
    /// `max_model_len` (it could never fit); [`PagedError::InvalidRequest`] if `max_tokens` is 0
    /// or `max_seq_len` is below the prompt length.
    pub fn add_request(&mut self, prompt: Vec<u32>, stop: StopConditions) -> Result<RequestId> {
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
    ) -> Result<RequestId> {
        let tables = self.kv.empty_tables(tenant);
        let id = RequestId(self.next_id);
        let seq = Sequence::new(id, prompt, stop, tenant, tables, self.config.max_model_len)?;
        self.next_id += 1;
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
    pub fn offload_when_finished(&mut self, id: RequestId) -> Result<()> {
        self.seqs
            .get_mut(&id)
            .ok_or(PagedError::UnknownSequence(id))?
            .offload_on_finish = true;
        Ok(())
    }

    /// Salts waiting request `id`'s prefix-cache keys with `salt` (vLLM's `cache_salt`; 0
    /// removes it): its prompt hits, and its blocks serve, only requests of the same salt.
    ///
    /// # Errors
    /// [`PagedError::UnknownSequence`]; [`PagedError::WrongStatus`] once it was admitted (its
    /// tables hold blocks).
    pub fn set_cache_salt(&mut self, id: RequestId, salt: u64) -> Result<()> {
        let seq = self
            .seqs
            .get_mut(&id)
            .ok_or(PagedError::UnknownSequence(id))?;
        if seq.status != crate::SequenceStatus::Waiting || seq.num_preemptions > 0 {
            return Err(PagedError::WrongStatus {
                seq: id,
                actual: seq.status.name(),
                expected: "waiting, never admitted",
            });
        }
        for t in &mut seq.block_tables {
            t.salt = salt;
        }
        Ok(())
    }

    /// The configuration.
    pub fn config(&self) -> &SchedulerConfig {
        &self.config
    }

    /// The blocks: one pool per KV cache group, the prefix caches, the tiers.
    pub fn kv_cache_manager(&self) -> &KvCacheManager {
        &self.kv
    }

    /// The blocks, to move a step's tier blocks with the engine
    /// ([`KvCacheManager::move_tier_blocks`]).
    pub fn kv_cache_manager_mut(&mut self) -> &mut KvCacheManager {
        &mut self.kv
    }

    /// A live (waiting or running) sequence; finished ones are released.
    pub fn sequence(&self, id: RequestId) -> Option<&Sequence> {
        self.seqs.get(&id)
    }

    /// The waiting queue, head first.
    pub fn waiting(&self) -> impl Iterator<Item = RequestId> + '_ {
        self.waiting.iter().copied()
    }

    /// The running queue, oldest arrival first (preemption takes from the back).
    pub fn running(&self) -> &[RequestId] {
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
        let (running, waiting) = (self.running.len(), self.waiting.len());
        self.counters.metrics(running, waiting, self.kv.metrics())
    }

    /// Gives decoding sequence `id` draft tokens (speculative decoding: guesses of the tokens
    /// after its last one) for its next step to check, as many as [`Self::max_draft_tokens`]
    /// allows, replacing any it had. Returns how many it kept: none for a sequence that is not
    /// decoding (its prompt is not computed yet). The step feeds the last token and the drafts
    /// at consecutive positions and returns a row of logits for each; `update` then takes the
    /// drafts the model agreed with and one token more, and rolls the cache back past the rest.
    ///
    /// # Errors
    /// [`PagedError::UpdatePending`] while a step is in flight; [`PagedError::UnknownSequence`].
    pub fn set_spec_token_ids(&mut self, id: RequestId, mut drafts: Vec<u32>) -> Result<usize> {
        if self.in_flight.is_some() {
            return Err(PagedError::UpdatePending);
        }
        drafts.truncate(self.max_draft_tokens(id)?);
        let seq = seq_mut(&mut self.seqs, id)?;
        seq.spec_token_ids = drafts;
        Ok(seq.spec_token_ids.len())
    }

    /// The most draft tokens decoding sequence `id`'s next step may check (0 if it is not
    /// decoding): no more than could be kept before a stop condition ends it (`max_tokens`, its
    /// `max_seq_len` or `max_model_len`), and under a sliding window of W no more than `W − 2`,
    /// since a step stores its own keys only where a later query reads them (from
    /// `end + 1 − W`), and after a rollback to the step's first draft the next query reads
    /// back to `end − d + 1 − W` (d drafts): `d + 2 ≤ W` keeps every such key in the pool.
    ///
    /// # Errors
    /// [`PagedError::UnknownSequence`].
    pub fn max_draft_tokens(&self, id: RequestId) -> Result<usize> {
        let seq = self.seq(id)?;
        if !seq.is_decoding() {
            return Ok(0);
        }
        let max_model_len = self.config.max_model_len;
        let cap = seq
            .stop
            .max_seq_len
            .unwrap_or(max_model_len)
            .min(max_model_len);
        let generated = seq.len() - seq.prompt_len;
        let window = (self.config.kv_cache.groups.iter())
            .filter_map(|g| g.sliding_window)
            .map(|w| w.saturating_sub(2))
            .min()
            .unwrap_or(usize::MAX);
        // Each kept draft and the token after it are one generated token each.
        let by_tokens = seq.stop.max_tokens.saturating_sub(generated + 1);
        let by_len = cap.saturating_sub(seq.len() + 1);
        Ok(by_tokens.min(by_len).min(window))
    }

    /// Running sequences whose next step is a decode, with their tokens (prompt and output):
    /// the ones a proposer may give draft tokens ([`Self::set_spec_token_ids`]).
    pub fn decoding(&self) -> impl Iterator<Item = (RequestId, &[u32])> + '_ {
        (self.running.iter())
            .filter_map(|id| self.seqs.get(id))
            .filter(|s| s.is_decoding())
            .map(|s| (s.id, s.token_ids.as_slice()))
    }

    /// Frees the blocks of `id`'s sliding-window groups that its next query cannot reach.
    pub(crate) fn trim_windows(&mut self, id: RequestId) -> Result<()> {
        let seq = seq_mut(&mut self.seqs, id)?;
        self.kv
            .trim_windows(&mut seq.block_tables, seq.num_computed_tokens)
    }

    pub(crate) fn seq(&self, id: RequestId) -> Result<&Sequence> {
        self.seqs.get(&id).ok_or(PagedError::UnknownSequence(id))
    }

    /// Per tenant: (prompt tokens looked up in the prefix cache, tokens it served), over every
    /// admission so far.
    pub fn tenant_prefix_hits(&self) -> &BTreeMap<Tenant, (u64, u64)> {
        &self.tenant_hits
    }

    pub(crate) fn new_id(&mut self) -> RequestId {
        self.next_id += 1;
        RequestId(self.next_id - 1)
    }
}

/// A sequence of the step awaiting `update`.
#[derive(Debug, Clone)]
pub(crate) struct InFlight {
    pub(crate) id: RequestId,
    /// Positions in the cache once the step ran (`context_len`), draft tokens included.
    pub(crate) end: usize,
    /// Whether a sampled token comes back for it (all but partial prefills).
    pub(crate) samples: bool,
    /// The draft tokens the step checks after the sequence's last token.
    pub(crate) drafts: Vec<u32>,
}

/// Sequence `id` of `seqs` (a function of the map alone, so the pools can be borrowed beside it).
pub(crate) fn seq_mut(
    seqs: &mut BTreeMap<RequestId, Sequence>,
    id: RequestId,
) -> Result<&mut Sequence> {
    seqs.get_mut(&id).ok_or(PagedError::UnknownSequence(id))
}

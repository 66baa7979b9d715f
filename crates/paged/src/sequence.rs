//! One request as the scheduler tracks it: its tokens, how many of them are in the KV cache, when
//! to stop, and its block tables.
//!
//! Between steps a running sequence always has exactly one token more than it has computed: the
//! token sampled at the end of the last step, whose k and v the next step computes. A waiting
//! sequence has computed nothing; after preemption by recompute it keeps its generated tokens, so
//! on readmission its prefill covers `prompt + generated` (all tokens) and yields the logits of
//! the same position the interrupted decode would have computed.

use serde::Serialize;

use crate::{BlockTable, PagedError, Result, Tenant};

/// The scheduler's id of a request (vLLM's `request_id`): one sequence for its whole life,
/// unique per scheduler, never reused. Not `kvlab_model::SeqId`, which an engine gives the
/// sequences driven one at a time through the `Engine` API. Ids are given in arrival order (a
/// fork arrives when forked): the running queue is sorted by id, and preemption takes the
/// largest. Displayed `seq#N`, as the scheduler's messages and traces have always named them.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize)]
pub struct RequestId(pub u64);

impl std::fmt::Display for RequestId {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "seq#{}", self.0)
    }
}

/// When a sequence stops, set by the caller per request.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct StopConditions {
    /// Most tokens to generate (at least 1).
    pub max_tokens: usize,
    /// Sampling any of these (EOS and friends) finishes the sequence; the token is kept.
    pub stop_token_ids: Vec<u32>,
    /// Most tokens in total (prompt + generated); `None` means the scheduler's `max_model_len`,
    /// and a larger value is capped to it.
    pub max_seq_len: Option<usize>,
}

impl StopConditions {
    /// Stop after `max_tokens` generated tokens, with no stop tokens.
    pub fn max_tokens(max_tokens: usize) -> Self {
        Self {
            max_tokens,
            stop_token_ids: Vec::new(),
            max_seq_len: None,
        }
    }

    /// Adds stop tokens (e.g. the tokenizer's EOS id).
    pub fn with_stop_tokens(mut self, ids: impl IntoIterator<Item = u32>) -> Self {
        self.stop_token_ids.extend(ids);
        self
    }
}

/// Why a sequence finished.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
pub enum FinishReason {
    /// It sampled one of its stop tokens.
    Stop,
    /// It generated `max_tokens` tokens.
    Length,
    /// It reached its `max_seq_len` (or the scheduler's `max_model_len`) tokens in total.
    MaxSeqLen,
    /// The caller aborted it.
    Aborted,
}

/// Where a sequence is in its life.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
pub enum SequenceStatus {
    /// In the waiting queue: new, or preempted (its blocks were freed).
    Waiting,
    /// In the running queue: its k and v are in the cache up to `num_computed_tokens`.
    Running,
    /// Done; its blocks are freed.
    Finished(FinishReason),
}

impl SequenceStatus {
    pub(crate) fn name(self) -> &'static str {
        match self {
            Self::Waiting => "waiting",
            Self::Running => "running",
            Self::Finished(_) => "finished",
        }
    }
}

/// One request's state.
#[derive(Debug, Clone)]
pub struct Sequence {
    pub(crate) id: RequestId,
    /// (prompt_len + num_generated,) prompt followed by generated tokens.
    pub(crate) token_ids: Vec<u32>,
    pub(crate) prompt_len: usize,
    pub(crate) stop: StopConditions,
    pub(crate) status: SequenceStatus,
    /// Positions `0..num_computed_tokens` have their k and v in the cache.
    pub(crate) num_computed_tokens: usize,
    /// The most positions ever computed; recomputing below it counts as recompute waste.
    pub(crate) max_computed_tokens: usize,
    /// Tokens the prefill since the last admission covers (the length at admission): steps
    /// that start below it are prefill chunks, later ones decodes.
    pub(crate) prefill_len: usize,
    /// (num_groups,) one block table per KV cache group.
    pub(crate) block_tables: Vec<BlockTable>,
    pub(crate) num_preemptions: usize,
    /// Whose request it is (0 unless the caller says).
    pub(crate) tenant: Tenant,
    /// Offload its blocks to the tiers when it finishes: a paused session
    /// (`Scheduler::offload_when_finished`).
    pub(crate) offload_on_finish: bool,
    /// (num_draft_tokens,) guesses of the tokens after the last one, checked by its next decode
    /// step (`Scheduler::set_spec_token_ids`; vLLM's `spec_token_ids`).
    pub(crate) spec_token_ids: Vec<u32>,
}

impl Sequence {
    /// A waiting request `id` of `tenant` for `prompt`, with empty `block_tables` (one per KV
    /// cache group).
    ///
    /// # Errors
    /// [`PagedError::EmptyPrompt`]; [`PagedError::PromptTooLong`] if the prompt exceeds
    /// `max_model_len` (it could never fit); [`PagedError::InvalidRequest`] if `max_tokens` is 0
    /// or `max_seq_len` is below the prompt length.
    pub(crate) fn new(
        id: RequestId,
        prompt: Vec<u32>,
        stop: StopConditions,
        tenant: Tenant,
        block_tables: Vec<BlockTable>,
        max_model_len: usize,
    ) -> Result<Self> {
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
        Ok(Self {
            id,
            prompt_len: prompt.len(),
            token_ids: prompt,
            stop,
            status: SequenceStatus::Waiting,
            num_computed_tokens: 0,
            max_computed_tokens: 0,
            prefill_len: 0,
            tenant,
            block_tables,
            num_preemptions: 0,
            offload_on_finish: false,
            spec_token_ids: Vec::new(),
        })
    }

    /// The id.
    pub fn id(&self) -> RequestId {
        self.id
    }
    /// The tenant it belongs to.
    pub fn tenant(&self) -> Tenant {
        self.tenant
    }
    /// The prompt tokens.
    pub fn prompt_token_ids(&self) -> &[u32] {
        &self.token_ids[..self.prompt_len]
    }
    /// The generated tokens so far.
    pub fn output_token_ids(&self) -> &[u32] {
        &self.token_ids[self.prompt_len..]
    }
    /// Prompt followed by generated tokens.
    pub fn token_ids(&self) -> &[u32] {
        &self.token_ids
    }
    /// Total tokens (prompt + generated).
    pub fn len(&self) -> usize {
        self.token_ids.len()
    }
    /// Always false: a sequence has at least one prompt token.
    pub fn is_empty(&self) -> bool {
        self.token_ids.is_empty()
    }
    /// Current status.
    pub fn status(&self) -> SequenceStatus {
        self.status
    }
    /// The stop conditions given at admission.
    pub fn stop_conditions(&self) -> &StopConditions {
        &self.stop
    }
    /// Positions whose k and v are in the cache.
    pub fn num_computed_tokens(&self) -> usize {
        self.num_computed_tokens
    }
    /// One block table per KV cache group (empty tables while waiting).
    pub fn block_tables(&self) -> &[BlockTable] {
        &self.block_tables
    }
    /// How often this sequence was preempted.
    pub fn num_preemptions(&self) -> usize {
        self.num_preemptions
    }
    /// The draft tokens its next decode step checks (empty without speculation).
    pub fn spec_token_ids(&self) -> &[u32] {
        &self.spec_token_ids
    }
    /// Whether its prompt is computed and its next step is a decode: every position but the
    /// last sampled token's has its k and v in the cache.
    pub fn is_decoding(&self) -> bool {
        self.status == SequenceStatus::Running && self.num_computed_tokens + 1 == self.len()
    }

    /// The reason to finish now, given the last appended token, checked in vLLM's order:
    /// stop token, then `max_tokens`, then total length against `max_seq_len` capped at
    /// `max_model_len`.
    pub(crate) fn check_stop(&self, max_model_len: usize) -> Option<FinishReason> {
        let generated = self.len() - self.prompt_len;
        let last = self.output_token_ids().last();
        let cap = self
            .stop
            .max_seq_len
            .unwrap_or(max_model_len)
            .min(max_model_len);
        if last.is_some_and(|t| self.stop.stop_token_ids.contains(t)) {
            Some(FinishReason::Stop)
        } else if generated >= self.stop.max_tokens {
            Some(FinishReason::Length)
        } else if self.len() >= cap {
            Some(FinishReason::MaxSeqLen)
        } else {
            None
        }
    }
}

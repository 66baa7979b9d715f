//! Errors of the paged KV bookkeeping.
//!
//! Every fallible public function returns [`PagedError`]. Each message names what went wrong and
//! what the caller should do about it, because the caller is usually an engine author staring at
//! a log line, not at this crate's source.

use crate::{BlockId, RequestId};

/// Everything that can go wrong while allocating blocks, scheduling sequences or computing waste.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum PagedError {
    /// A configuration value is out of range or inconsistent with another one.
    #[error("invalid paged configuration: {0}")]
    InvalidConfig(String),

    /// A mutation needed more free blocks than the pool has (free list plus evictable cached).
    #[error(
        "out of KV cache blocks: need {needed}, only {free} free; ask can_allocate/can_append \
         before mutating, or free or preempt a sequence first"
    )]
    OutOfBlocks {
        /// Blocks the mutation needed.
        needed: usize,
        /// Blocks available: free list plus evictable cached blocks.
        free: usize,
    },

    /// A block id is out of range or not held by anyone (ref count 0).
    #[error(
        "block {block} is not a held block of this pool of {num_blocks} blocks; pass only block \
         tables that this allocator filled"
    )]
    InvalidBlock {
        /// The offending block id.
        block: BlockId,
        /// Blocks in the pool (valid ids are `0..num_blocks`).
        num_blocks: usize,
    },

    /// A block table was built for another block size than the allocator serving it.
    #[error(
        "block table has block_size {table} but the allocator uses {allocator}; create each \
         table with BlockTable::new(allocator.block_size())"
    )]
    BlockSizeMismatch {
        /// The table's block_size, in tokens per block.
        table: usize,
        /// The allocator's block_size, in tokens per block.
        allocator: usize,
    },

    /// A cached prefix can only be adopted by an empty block table.
    #[error(
        "block table already holds {num_tokens} tokens; adopt a cached prefix only into an \
         empty table"
    )]
    TableNotEmpty {
        /// Tokens the table already holds.
        num_tokens: usize,
    },

    /// A prefix match was computed, then the pool changed (a matched block got evicted).
    #[error(
        "prefix match is stale: level {level} (logical block) was evicted or dropped since \
         match_prefix; call match_prefix again right before adopt_prefix"
    )]
    StalePrefixMatch {
        /// The logical block index (0 = first block of the prompt) that is no longer cached.
        level: usize,
    },

    /// The disk tier's directory cannot be created or written.
    #[error("disk tier at {path}: {reason}")]
    Tier {
        /// The disk tier's directory.
        path: String,
        /// The I/O error, with what to do (choose a writable directory).
        reason: String,
    },

    /// A saved session cannot be written, read or restored here: an I/O error, a truncated or
    /// corrupt file, or one saved by a server of another model or KV layout.
    #[error("saved session {path}: {reason}")]
    Session {
        /// The session's file.
        path: String,
        /// What is wrong, with what to do.
        reason: String,
    },

    /// A sliding window of zero tokens would attend to nothing.
    #[error("sliding window must be at least 1 token, got {window}")]
    InvalidWindow {
        /// The window asked for, in tokens (always 0 here).
        window: usize,
    },

    /// A request carried no prompt tokens; there would be nothing to compute logits from.
    #[error("prompt is empty; a request needs at least one prompt token")]
    EmptyPrompt,

    /// A prompt can never fit: longer than `max_model_len` (which the pool is sized to hold).
    #[error(
        "prompt of {prompt_len} tokens exceeds max_model_len = {max_model_len}; shorten the \
         prompt, or raise max_model_len together with num_blocks"
    )]
    PromptTooLong {
        /// Tokens in the prompt.
        prompt_len: usize,
        /// Most positions of one sequence (prompt plus output) the scheduler accepts.
        max_model_len: usize,
    },

    /// A request's stop conditions or arguments are unusable.
    #[error("invalid request: {0}")]
    InvalidRequest(String),

    /// The id names no live sequence.
    #[error("unknown sequence {0}: never added, or already finished and released")]
    UnknownSequence(RequestId),

    /// The sequence exists but is in the wrong state for this operation.
    #[error("sequence {seq} is {actual}; this operation needs a {expected} sequence")]
    WrongStatus {
        /// The sequence.
        seq: RequestId,
        /// Its status's name: `"waiting"` or `"finished"`.
        actual: &'static str,
        /// The status the operation needs, e.g. `"running"`.
        expected: &'static str,
    },

    /// `schedule` or `fork` was called while the previous batch still awaits `update`.
    #[error(
        "the previous step is still in flight; call update() with its sampled tokens before \
         schedule(), fork() or replace_last_token()"
    )]
    UpdatePending,

    /// `update` was called with tokens although no step is in flight.
    #[error("no step is in flight; call schedule(), run the batch, then update() with its tokens")]
    NoStepInFlight,

    /// `update` got a token for a sequence that was not in the last batch, or two tokens for one.
    #[error(
        "sequence {0} was not scheduled in the last step or got two tokens; pass exactly one \
         sampled token per scheduled sequence"
    )]
    UnexpectedOutput(RequestId),

    /// `update` got no token for a sequence that was in the last batch.
    #[error(
        "no sampled token for sequence {0}, which was scheduled in the last step; pass exactly \
         one sampled token per scheduled sequence"
    )]
    MissingOutput(RequestId),

    /// Defensive: nothing could be scheduled although sequences are unfinished.
    #[error(
        "the scheduler cannot make progress: {0}; this means a bug in kvlab-paged or a \
         configuration that skipped SchedulerConfig::validate, please report it"
    )]
    Stuck(String),

    /// A step's arrays break a rule of [`crate::ModelInput::validate`] (an engine got a step no
    /// scheduler builds).
    #[error("malformed step: {0}")]
    MalformedStep(String),

    /// The waste calculator or a workload generator got unusable input.
    #[error("invalid workload: {0}")]
    InvalidWorkload(String),
}

/// Shorthand used throughout the crate.
pub type Result<T, E = PagedError> = std::result::Result<T, E>;

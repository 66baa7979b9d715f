//! The one error type of kvlab-model. Every message says what went wrong and what to do.

use std::path::PathBuf;

/// Errors from loading checkpoints and tokenizers, validating configs and running engines.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    /// The file does not exist or cannot be opened.
    #[error(
        "cannot open {path}: {source}. Check the path, or set KVLAB_MODELS to the folder that holds the checkpoints"
    )]
    Open {
        /// The path as given.
        path: PathBuf,
        /// Why the OS refused it (not found, permission denied).
        #[source]
        source: std::io::Error,
    },
    /// Any other I/O failure while reading a file.
    #[error("I/O error on {path}: {source}")]
    Io {
        /// The file being read.
        path: PathBuf,
        /// The OS error.
        #[source]
        source: std::io::Error,
    },
    /// The file ends before the header or data it announces.
    #[error(
        "{path} is truncated: {what} needs {needed} bytes but the file has {actual}. Re-download the file (its sha256 is in fixtures/models.json)"
    )]
    Truncated {
        /// The truncated file.
        path: PathBuf,
        /// The part that does not fit ("the 28-byte header", "the tensors its header announces").
        what: &'static str,
        /// Bytes the file needs to hold that part, counted from its start.
        needed: u64,
        /// Bytes the file has.
        actual: u64,
    },
    /// The file is larger or smaller than its header implies (not truncated, just inconsistent).
    #[error(
        "{path}: the header implies {expected} bytes but the file has {actual}; it is not a llama2.c checkpoint of that shape"
    )]
    SizeMismatch {
        /// The checkpoint.
        path: PathBuf,
        /// Bytes the header's shape implies: the header plus every tensor.
        expected: u64,
        /// Bytes the file has.
        actual: u64,
    },
    /// A header or config field is zero, negative, absurdly large or inconsistent with another.
    #[error("invalid config: {0}")]
    Config(String),
    /// A tokenizer file is malformed.
    #[error("invalid tokenizer {path}: {reason}")]
    Tokenizer {
        /// The tokenizer file (or the model file that embeds it).
        path: PathBuf,
        /// What is malformed.
        reason: String,
    },
    /// A token id outside `0..vocab_size`.
    #[error("token id {id} is outside the vocabulary (vocab_size {vocab_size})")]
    TokenOutOfRange {
        /// The first offending token id.
        id: u32,
        /// Tokens in the model's vocabulary.
        vocab_size: usize,
    },
    /// The prompt (plus BOS) does not fit in the context.
    #[error(
        "the prompt has {tokens} tokens but the context holds {max_seq_len} positions; shorten the prompt or raise -c/--ctx-size (at most the model's max_seq_len)"
    )]
    PromptTooLong {
        /// Prompt tokens, BOS included.
        tokens: usize,
        /// Positions the context holds: the sequence's reservation, else the model's max_seq_len.
        max_seq_len: usize,
    },
    /// The prompt text is too long to fit whatever it encodes to (found before encoding it).
    #[error(
        "the prompt is {bytes} bytes, at least {at_least} tokens with BOS, but the context holds {max_seq_len} positions; shorten the prompt or raise -c/--ctx-size (at most the model's max_seq_len)"
    )]
    PromptTooLongBeforeEncoding {
        /// Length of the prompt text, in bytes.
        bytes: usize,
        /// A lower bound on its tokens, BOS included ([`crate::Tokenizer::min_tokens`] + 1).
        at_least: usize,
        /// Positions the context holds: the sequence's reservation, else the model's max_seq_len.
        max_seq_len: usize,
    },
    /// The prompt is empty after encoding (it always holds BOS, so this means a bad call).
    #[error("the prompt is empty: at least the BOS token is needed")]
    EmptyPrompt,
    /// A decode step past the sequence's reserved positions.
    #[error(
        "sequence {seq} is full: position {pos} is past the {max_seq_len} positions it reserved; raise -c/--ctx-size or ask for fewer tokens (-n)"
    )]
    ContextFull {
        /// The sequence ([`crate::SeqId`]).
        seq: u64,
        /// The last position the call would have written.
        pos: usize,
        /// Positions the sequence reserved.
        max_seq_len: usize,
    },
    /// A sequence id that this engine does not hold.
    #[error("unknown sequence id {0}: it was never created or has been freed")]
    UnknownSequence(u64),
    /// An engine-specific failure (no GPU, out of blocks, ...).
    #[error("{engine} engine: {reason}")]
    Engine {
        /// The engine's name (`cpu-paged`, `cuda`, ...).
        engine: &'static str,
        /// What failed, and what to do where the engine knows.
        reason: String,
    },
    /// A sampling parameter outside its range (the message names the range).
    #[error("{0}")]
    Sampling(String),
    /// The model produced a NaN or infinite logit, so no token can be sampled.
    #[error(
        "step {pos}: the model's logit for token {index} is {value}, so no token can be chosen; the checkpoint's weights or the engine's arithmetic produced NaN or infinity. Check the file against its sha256 (fixtures/models.json) or compare with --engine naive"
    )]
    NonFiniteLogits {
        /// The position whose logits were being sampled.
        pos: usize,
        /// Token id of the first non-finite logit.
        index: usize,
        /// That logit: NaN or ±infinity.
        value: f32,
    },
    /// A model name that is not in the manifest.
    #[error(
        "no model called {name:?}; known models: {known} (`kvlab models` lists them), or pass a path to a llama2.c .bin or a .gguf file"
    )]
    UnknownModel {
        /// The name asked for.
        name: String,
        /// The manifest's model names, comma-separated.
        known: String,
    },
    /// A model file whose format this crate does not read.
    #[error("unsupported model format: {0}")]
    Format(String),

    /// A chat template that does not compile, or that refuses a conversation (its own
    /// `raise_exception`), or a model without one.
    #[error("chat template: {0}")]
    ChatTemplate(String),
}

/// Result with kvlab-model's [`Error`].
pub type Result<T, E = Error> = std::result::Result<T, E>;

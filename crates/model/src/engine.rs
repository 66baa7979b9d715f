//! The boundary every engine implements. The generate loop, verify and bench drive engines only
//! through this trait, so that parity between engines is a property of the engines alone.

use std::collections::HashMap;

use serde::Serialize;

use crate::{Config, Error, Result};

/// A sequence handle, unique within one engine.
pub type SeqId = u64;

/// KV-cache bytes an engine holds.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize)]
pub struct KvUsage {
    /// Bytes that hold a key or value of a position computed so far.
    pub used_bytes: usize,
    /// Bytes allocated for keys and values (used or not).
    pub reserved_bytes: usize,
}

/// One step's view of an engine's cache, for `kvlab generate --trace`.
#[derive(Clone, Debug, Default, Serialize)]
pub struct TraceStep {
    /// Positions the sequence holds after the step.
    pub len: usize,
    /// Per layer, the cache tensor's shape with its axis names, e.g. "(max_seq_len=512, kv_dim=32)".
    pub layer_cache_shapes: Vec<String>,
    /// Paged engines: the sequence's block table (physical block ids per logical block).
    pub block_table: Option<Vec<u32>>,
    /// Paged engines: the slots this step wrote.
    pub slot_mapping: Option<Vec<u32>>,
}

/// An inference engine over one model: it owns sequences and their KV state.
pub trait Engine {
    /// Short name used on the command line and in reports ("naive", "cpu", ...).
    fn name(&self) -> &'static str;

    /// The model's config.
    fn config(&self) -> &Config;

    /// Starts a sequence that will hold at most `max_seq_len` positions.
    ///
    /// # Errors
    /// [`crate::Error::Config`] if `max_seq_len` is 0 or exceeds the model's; engine errors if
    /// memory for it cannot be reserved.
    fn new_sequence(&mut self, max_seq_len: usize) -> Result<SeqId>;

    /// Runs `tokens` at the sequence's next positions (the whole prompt, or a further chunk);
    /// returns the logits (vocab_size,) of the last one.
    ///
    /// # Errors
    /// [`crate::Error::UnknownSequence`], [`crate::Error::EmptyPrompt`],
    /// [`crate::Error::ContextFull`], [`crate::Error::TokenOutOfRange`].
    fn prefill(&mut self, seq: SeqId, tokens: &[u32]) -> Result<Vec<f32>>;

    /// Appends one token at the next position; returns its logits (vocab_size,).
    ///
    /// The default is a one-token [`Engine::prefill`]: every kvlab engine's step takes any number
    /// of new positions, and decode is the case of one.
    ///
    /// # Errors
    /// As [`Engine::prefill`].
    fn decode(&mut self, seq: SeqId, token: u32) -> Result<Vec<f32>> {
        self.prefill(seq, &[token])
    }

    /// Runs `tokens` at the sequence's next positions like [`Engine::prefill`] and returns the
    /// logits (vocab_size,) of **every** one, in order: one step scoring a speculative guess
    /// per row (`crate::speculative`). The default feeds the tokens one decode at a time (the
    /// same logits, none of the speed-up); an engine whose step computes many rows at once
    /// overrides it.
    ///
    /// # Errors
    /// As [`Engine::prefill`].
    fn score(&mut self, seq: SeqId, tokens: &[u32]) -> Result<Vec<Vec<f32>>> {
        if tokens.is_empty() {
            return Err(crate::Error::EmptyPrompt);
        }
        tokens.iter().map(|&t| self.decode(seq, t)).collect()
    }

    /// Forgets positions `len..` of a sequence, so that the next step writes at `len`
    /// (llama.cpp's `llama_memory_seq_rm`): how a chat reuses the cached part of a conversation
    /// whose end changed. Returns `Ok(false)` when this engine cannot (the default, and what a
    /// sliding-window ring that has overwritten the needed keys answers): the caller then starts
    /// the sequence again.
    ///
    /// # Errors
    /// [`crate::Error::UnknownSequence`].
    fn truncate(&mut self, seq: SeqId, len: usize) -> Result<bool> {
        let _ = (seq, len);
        Ok(false)
    }

    /// Appends `n` positions whose keys and values are seeded random numbers (uniform in
    /// [−1, 1)) instead of computed ones, at no cost in compute: how `kvlab depth --fill random`
    /// reaches a depth of 32,768 positions on a 1B model in seconds instead of the ~10 minutes
    /// its prefill takes on 2 cores. A decode step reads every cached key and value whatever
    /// they hold, so its time at a depth is the same; its tokens are not those of any text.
    /// Returns `Ok(false)` when this engine cannot (the default, whatever the sequence): the
    /// caller fills by prefill or says so. `n` = 0 appends nothing.
    ///
    /// # Errors
    /// Engines that can: [`crate::Error::UnknownSequence`]; [`crate::Error::ContextFull`] when
    /// `n` positions do not fit.
    fn fill_random(&mut self, seq: SeqId, n: usize, seed: u64) -> Result<bool> {
        let _ = (seq, n, seed);
        Ok(false)
    }

    /// Releases a sequence and its cache. Unknown ids are ignored.
    fn free(&mut self, seq: SeqId);

    /// Bytes held for keys and values right now, and reserved.
    fn kv_usage(&self) -> KvUsage;

    /// What a learner should see of the cache after the last step (shapes, block table).
    fn trace(&self, _seq: SeqId) -> Option<TraceStep> {
        None
    }
}

impl std::iter::Sum for KvUsage {
    fn sum<I: Iterator<Item = KvUsage>>(iter: I) -> KvUsage {
        iter.fold(KvUsage::default(), |a, b| KvUsage {
            used_bytes: a.used_bytes + b.used_bytes,
            reserved_bytes: a.reserved_bytes + b.reserved_bytes,
        })
    }
}

/// The sequences an engine holds, by id: the one table every engine keeps, whatever its
/// per-sequence state `S` is (a token history, a contiguous KV cache, block tables). Ids are
/// handed out in order and never reused.
#[derive(Debug)]
pub struct Sequences<S> {
    map: HashMap<SeqId, S>,
    next_id: SeqId,
}

impl<S> Default for Sequences<S> {
    fn default() -> Self {
        Sequences {
            map: HashMap::new(),
            next_id: 0,
        }
    }
}

impl<S> Sequences<S> {
    /// Adds a sequence's state; returns its new id.
    pub fn insert(&mut self, state: S) -> SeqId {
        let id = self.next_id;
        self.next_id += 1;
        self.map.insert(id, state);
        id
    }

    /// The state of `seq`, if it exists.
    pub fn get(&self, seq: SeqId) -> Option<&S> {
        self.map.get(&seq)
    }

    /// The state of `seq`, to step it.
    ///
    /// # Errors
    /// [`Error::UnknownSequence`] if no such sequence exists (never started, or freed).
    pub fn get_mut(&mut self, seq: SeqId) -> Result<&mut S> {
        self.map.get_mut(&seq).ok_or(Error::UnknownSequence(seq))
    }

    /// Removes `seq` and returns its state; `None` for unknown ids.
    pub fn remove(&mut self, seq: SeqId) -> Option<S> {
        self.map.remove(&seq)
    }

    /// Every live sequence's state, in no particular order.
    pub fn values(&self) -> impl Iterator<Item = &S> {
        self.map.values()
    }

    /// Number of live sequences.
    pub fn len(&self) -> usize {
        self.map.len()
    }

    /// Whether no sequence is live.
    pub fn is_empty(&self) -> bool {
        self.map.is_empty()
    }
}

/// Checks a token run against the model before an engine touches it.
///
/// # Errors
/// [`crate::Error::EmptyPrompt`] for no tokens; [`crate::Error::TokenOutOfRange`];
/// [`crate::Error::ContextFull`] if `pos + tokens.len()` exceeds `max_seq_len`.
pub fn check_tokens(
    c: &Config,
    seq: SeqId,
    pos: usize,
    max_seq_len: usize,
    tokens: &[u32],
) -> Result<()> {
    if tokens.is_empty() {
        return Err(crate::Error::EmptyPrompt);
    }
    if let Some(&id) = tokens.iter().find(|&&t| t as usize >= c.vocab_size) {
        return Err(crate::Error::TokenOutOfRange {
            id,
            vocab_size: c.vocab_size,
        });
    }
    if pos + tokens.len() > max_seq_len {
        return Err(crate::Error::ContextFull {
            seq,
            pos: pos + tokens.len() - 1,
            max_seq_len,
        });
    }
    Ok(())
}

/// Checks a requested sequence length against the model.
///
/// # Errors
/// [`crate::Error::Config`] if it is 0 or beyond the model's `max_seq_len`.
pub fn check_max_seq_len(c: &Config, max_seq_len: usize) -> Result<()> {
    if max_seq_len == 0 || max_seq_len > c.max_seq_len {
        return Err(crate::Error::Config(format!(
            "a sequence of max_seq_len {max_seq_len} was asked for; the model allows 1..={}",
            c.max_seq_len
        )));
    }
    Ok(())
}

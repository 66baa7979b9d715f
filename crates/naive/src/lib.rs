//! kvlab-naive: the reference engine. It keeps **no KV cache**, only each sequence's token
//! history, and every call recomputes Q, K and V for the whole prefix under a causal mask, then
//! returns the last position's logits.
//!
//! That makes step `t` cost O(t) projections and O(t²) attention, and a generation of N tokens
//! O(N²) projections in total: the baseline the cached engines are measured against. It is written
//! for clarity, one ndarray expression per equation, and shares no attention or kernel code with
//! the CPU engine, so that agreement between the two means something.

mod forward;

use std::sync::Arc;

use kvlab_model::engine::{check_max_seq_len, check_tokens};
use kvlab_model::{Config, Engine, Error, KvUsage, Model, Result, SeqId, Sequences, TraceStep};

/// A sequence is nothing but its tokens.
struct Sequence {
    tokens: Vec<u32>,
    max_seq_len: usize,
}

/// The no-cache engine.
pub struct NaiveEngine {
    model: Arc<Model>,
    seqs: Sequences<Sequence>,
}

impl NaiveEngine {
    /// An engine over `model` with no sequences.
    pub fn new(model: Arc<Model>) -> NaiveEngine {
        NaiveEngine {
            model,
            seqs: Sequences::default(),
        }
    }

    /// Teacher forcing in one pass: the logits (vocab_size,) of every position `from..` of
    /// `tokens`, as a step-by-step run over the same tokens would return them (the causal mask
    /// makes each row see only its prefix). Verify uses it to check another engine's whole greedy
    /// sequence at the cost of one forward pass.
    ///
    /// # Errors
    /// [`Error::EmptyPrompt`], [`Error::TokenOutOfRange`], [`Error::ContextFull`] beyond the
    /// model's context, [`Error::Config`] if `from` is not a position of `tokens`.
    pub fn logits_at_every_position(&self, tokens: &[u32], from: usize) -> Result<Vec<Vec<f32>>> {
        check_tokens(
            &self.model.config,
            0,
            0,
            self.model.config.max_seq_len,
            tokens,
        )?;
        if from >= tokens.len() {
            return Err(Error::Config(format!(
                "position {from} is past the {} tokens",
                tokens.len()
            )));
        }
        Ok(forward::forward_rows(&self.model, tokens, from)
            .rows()
            .into_iter()
            .map(|r| r.to_vec())
            .collect())
    }

    fn run(&mut self, seq: SeqId, new: &[u32]) -> Result<Vec<f32>> {
        let s = self.seqs.get_mut(seq)?;
        check_tokens(&self.model.config, seq, s.tokens.len(), s.max_seq_len, new)?;
        s.tokens.extend_from_slice(new);
        // The whole point of this engine: forget everything, recompute from token 0.
        Ok(forward::forward(&self.model, &s.tokens))
    }
}

impl Engine for NaiveEngine {
    fn name(&self) -> &'static str {
        "naive"
    }

    fn config(&self) -> &Config {
        &self.model.config
    }

    fn new_sequence(&mut self, max_seq_len: usize) -> Result<SeqId> {
        check_max_seq_len(&self.model.config, max_seq_len)?;
        Ok(self.seqs.insert(Sequence {
            tokens: Vec::new(),
            max_seq_len,
        }))
    }

    fn prefill(&mut self, seq: SeqId, tokens: &[u32]) -> Result<Vec<f32>> {
        self.run(seq, tokens)
    }

    /// The naive engine keeps only the token ids: any prefix can stay.
    fn truncate(&mut self, seq: SeqId, len: usize) -> Result<bool> {
        let s = self.seqs.get_mut(seq)?;
        if len > s.tokens.len() {
            return Ok(false);
        }
        s.tokens.truncate(len);
        Ok(true)
    }

    fn free(&mut self, seq: SeqId) {
        self.seqs.remove(seq);
    }

    /// The naive engine holds no KV cache: K and V exist only transiently inside a step.
    fn kv_usage(&self) -> KvUsage {
        KvUsage::default()
    }

    fn trace(&self, seq: SeqId) -> Option<TraceStep> {
        let s = self.seqs.get(seq)?;
        let c = &self.model.config;
        let shape = format!(
            "no cache: K, V recomputed as (seq_len={}, kv_dim={}) each step",
            s.tokens.len(),
            c.kv_dim()
        );
        Some(TraceStep {
            len: s.tokens.len(),
            layer_cache_shapes: vec![shape; c.n_layers],
            block_table: None,
            slot_mapping: None,
        })
    }
}

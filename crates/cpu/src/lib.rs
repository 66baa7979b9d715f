//! kvlab-cpu: the cached CPU engine.
//!
//! Per sequence a KV cache for K and V of shape `(n_layers, max_seq_len, kv_dim)` (ring buffers
//! for sliding-window layers) is allocated once, when the sequence starts, and written in place at
//! `pos`. Prefill runs the whole prompt as matrix-matrix products (the `gemm` crate) and
//! fills the cache; decode computes one position with SIMD GEMVs and attends over the cache, its
//! parallel loops shared statically by a fixed team of threads ([`threads`]).
//!
//! Files in data-flow order: [`simd`] (dot, axpy, GEMV rows), [`quant`] (GEMV rows over bf16,
//! f16 and quantized weights), [`softmax`], [`skinny`] (the decode batch's matrix
//! product), [`linear`] (GEMV/skinny/sgemm), [`attention`], [`kv_store`]
//! (keys and values in a KV dtype), [`kv_cache`] (append, then attend), [`forward`] (the
//! cached step), [`threads`]; [`paged`] is the same step over a block pool.

pub mod attention;
pub mod elementwise;
pub mod forward;
pub mod head8;
pub mod kv_cache;
pub mod kv_store;
pub mod linear;
pub mod paged;
pub mod quant;
pub mod simd;
pub mod skinny;
pub mod softmax;
pub mod threads;
pub mod transpose;

use std::sync::Arc;

use kvlab_model::engine::{check_max_seq_len, check_tokens};
use kvlab_model::{Config, Engine, KvDtype, KvUsage, Model, Result, SeqId, Sequences, TraceStep};

use kv_cache::ContiguousKvCache;
use kvlab_model::rope::RopeTables;
pub use threads::set_num_threads;

/// The contiguous-cache CPU engine.
pub struct CpuEngine {
    model: Arc<Model>,
    seqs: Sequences<ContiguousKvCache>,
    /// One cos/sin table per distinct RoPE theta, covering the longest sequence asked for.
    rope: RopeTables,
    /// The type each sequence's cache stores keys and values in.
    kv_dtype: KvDtype,
}

impl CpuEngine {
    /// An engine whose caches keep keys and values in f32, as computed.
    pub fn new(model: Arc<Model>) -> CpuEngine {
        CpuEngine::with_kv_dtype(model, KvDtype::F32)
    }

    /// An engine whose caches store keys and values as `kv_dtype` (quantized on write,
    /// dequantized inside attention: [`kv_store`]).
    pub fn with_kv_dtype(model: Arc<Model>, kv_dtype: KvDtype) -> CpuEngine {
        CpuEngine {
            rope: RopeTables::for_config(&model.config, 0),
            model,
            seqs: Sequences::default(),
            kv_dtype,
        }
    }

    /// Grows the RoPE tables to cover `max_pos` positions.
    fn ensure_rope(&mut self, max_pos: usize) {
        if self.rope.positions() < max_pos {
            self.rope = RopeTables::for_config(&self.model.config, max_pos);
        }
    }

    /// Runs `tokens` at the sequence's next positions; returns the logits of every one with
    /// `all`, else of the last one only.
    fn run(&mut self, seq: SeqId, tokens: &[u32], all: bool) -> Result<Vec<Vec<f32>>> {
        let cache = self.seqs.get_mut(seq)?;
        check_tokens(
            &self.model.config,
            seq,
            cache.len,
            cache.max_seq_len,
            tokens,
        )?;
        let (model, rope) = (&self.model, &self.rope);
        let mut logits = Vec::new();
        // A prompt longer than a ring buffer's spare slots runs in several steps; without
        // `all`, only the last step computes logits (the classifier of Gemma 3's 262,144-token
        // vocabulary is as many multiply-adds as 1.7 tokens through its layers).
        let max_step = cache.max_step();
        let n_steps = tokens.len().div_ceil(max_step);
        for (i, step) in tokens.chunks(max_step).enumerate() {
            let positions: Vec<usize> = (cache.len..cache.len + step.len()).collect();
            let rows: Vec<usize> = match all {
                true => (0..step.len()).collect(),
                false if i + 1 == n_steps => vec![step.len() - 1],
                false => Vec::new(),
            };
            let out = forward::forward(model, rope, step, &positions, &rows, &mut *cache);
            logits.extend(out);
            cache.len += step.len();
        }
        Ok(logits)
    }
}

impl Engine for CpuEngine {
    fn name(&self) -> &'static str {
        "cpu"
    }

    fn config(&self) -> &Config {
        &self.model.config
    }

    fn new_sequence(&mut self, max_seq_len: usize) -> Result<SeqId> {
        check_max_seq_len(&self.model.config, max_seq_len)?;
        self.ensure_rope(max_seq_len);
        let cache = ContiguousKvCache::new(&self.model.config, max_seq_len, self.kv_dtype);
        Ok(self.seqs.insert(cache))
    }

    fn prefill(&mut self, seq: SeqId, tokens: &[u32]) -> Result<Vec<f32>> {
        Ok(self.run(seq, tokens, false)?.pop().unwrap_or_default())
    }

    /// Every row's logits from one forward step (the speculative check costs about a decode).
    fn score(&mut self, seq: SeqId, tokens: &[u32]) -> Result<Vec<Vec<f32>>> {
        self.run(seq, tokens, true)
    }

    fn truncate(&mut self, seq: SeqId, len: usize) -> Result<bool> {
        let config = &self.model.config;
        Ok(self.seqs.get_mut(seq)?.truncate(len, config))
    }

    fn fill_random(&mut self, seq: SeqId, n: usize, seed: u64) -> Result<bool> {
        let cache = self.seqs.get_mut(seq)?;
        if n > cache.max_seq_len - cache.len {
            return Err(kvlab_model::Error::ContextFull {
                seq,
                pos: cache.len.saturating_add(n - 1),
                max_seq_len: cache.max_seq_len,
            });
        }
        cache.fill_random(n, seed);
        Ok(true)
    }

    fn free(&mut self, seq: SeqId) {
        self.seqs.remove(seq);
    }

    fn kv_usage(&self) -> KvUsage {
        self.seqs.values().map(ContiguousKvCache::usage).sum()
    }

    fn trace(&self, seq: SeqId) -> Option<TraceStep> {
        let cache = self.seqs.get(seq)?;
        Some(TraceStep {
            len: cache.len,
            layer_cache_shapes: cache.shapes(),
            block_table: None,
            slot_mapping: None,
        })
    }
}

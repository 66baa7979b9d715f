//! kvlab-cpu: the cached CPU engine.
//!
//! Per sequence a KV cache for K and V of shape `(n_layers, max_seq_len, kv_dim)` (ring buffers
//! of `window` positions for sliding-window layers) is allocated once, when the sequence starts,
//! and written in place at `pos`. Prefill runs the whole prompt as matrix-matrix products
//! (matrixmultiply's sgemm) and fills the cache; decode computes one position with SIMD GEMVs and
//! attends over the cache with SIMD dot/axpy, threads (rayon) across output rows and heads.
//!
//! Files in data-flow order: [`simd`] (dot, axpy), [`linear`] (GEMV/sgemm), [`rope`],
//! [`kv_cache`], [`attention`], [`forward`].

pub mod attention;
pub mod forward;
pub mod kv_cache;
pub mod linear;
pub mod paged;
pub mod rope;
pub mod simd;

use std::collections::HashMap;
use std::sync::Arc;

use kvlab_model::engine::{check_max_seq_len, check_tokens};
use kvlab_model::{Config, Engine, Error, KvUsage, LayerKind, Model, Result, SeqId, TraceStep};

use attention::{AttentionInput, attention};

use kv_cache::KvCache;
use rope::RopeTable;

/// The contiguous-cache CPU engine.
pub struct CpuEngine {
    model: Arc<Model>,
    seqs: HashMap<SeqId, KvCache>,
    /// One cos/sin table per distinct RoPE theta, covering the longest sequence asked for.
    rope: Vec<RopeTable>,
    next_id: SeqId,
}

impl CpuEngine {
    pub fn new(model: Arc<Model>) -> CpuEngine {
        CpuEngine {
            model,
            seqs: HashMap::new(),
            rope: Vec::new(),
            next_id: 0,
        }
    }

    /// Grows the RoPE tables to cover `max_pos` positions.
    fn ensure_rope(&mut self, max_pos: usize) {
        let c = &self.model.config;
        let mut thetas: Vec<f32> = (0..c.n_layers).map(|l| c.rope_theta_for(l)).collect();
        thetas.dedup();
        for theta in thetas {
            match self.rope.iter().position(|r| r.theta == theta) {
                Some(i) if self.rope[i].positions() >= max_pos => {}
                Some(i) => self.rope[i] = RopeTable::new(theta, c.head_dim, max_pos),
                None => self.rope.push(RopeTable::new(theta, c.head_dim, max_pos)),
            }
        }
    }

    // ANCHOR: cpu_step
    fn run(&mut self, seq: SeqId, tokens: &[u32]) -> Result<Vec<f32>> {
        let cache = self.seqs.get_mut(&seq).ok_or(Error::UnknownSequence(seq))?;
        let c = &self.model.config;
        check_tokens(c, seq, cache.len, cache.max_seq_len, tokens)?;
        let pos0 = cache.len;
        let positions: Vec<usize> = (pos0..pos0 + tokens.len()).collect();
        let attend = |l: usize, q: &[f32], k: &[f32], v: &[f32], out: &mut [f32]| {
            let (cache_k, cache_v) = cache.layer(l);
            let window = match c.layer_kinds[l] {
                LayerKind::Global => usize::MAX,
                LayerKind::Local { window } => window,
            };
            let input = AttentionInput {
                q,
                k_new: k,
                v_new: v,
                cache_k,
                cache_v,
                cap: cache.cap(l),
                pos0,
                n_heads: c.n_heads,
                n_kv_heads: c.n_kv_heads,
                head_dim: c.head_dim,
                scale: c.attn_scale,
                window,
            };
            attention(out, &input);
            // Only now write the new K and V into the cache: with a ring buffer shorter than the
            // step, only the last `cap` survive, and the queries above still needed the rest.
            let (n, kvd) = (positions.len(), c.kv_dim());
            for i in n.saturating_sub(cache.cap(l))..n {
                cache.write(
                    l,
                    pos0 + i,
                    &k[i * kvd..(i + 1) * kvd],
                    &v[i * kvd..(i + 1) * kvd],
                );
            }
        };
        let mut logits = forward::forward(
            &self.model,
            &self.rope,
            tokens,
            &positions,
            &[tokens.len() - 1],
            attend,
        );
        cache.len = pos0 + tokens.len();
        Ok(logits.pop().expect("one row of logits"))
        // ANCHOR_END: cpu_step
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
        let id = self.next_id;
        self.next_id += 1;
        self.seqs
            .insert(id, KvCache::new(&self.model.config, max_seq_len));
        Ok(id)
    }

    fn prefill(&mut self, seq: SeqId, tokens: &[u32]) -> Result<Vec<f32>> {
        self.run(seq, tokens)
    }

    fn decode(&mut self, seq: SeqId, token: u32) -> Result<Vec<f32>> {
        self.run(seq, &[token])
    }

    fn free(&mut self, seq: SeqId) {
        self.seqs.remove(&seq);
    }

    fn kv_usage(&self) -> KvUsage {
        self.seqs
            .values()
            .map(KvCache::usage)
            .fold(KvUsage::default(), |a, b| KvUsage {
                used_bytes: a.used_bytes + b.used_bytes,
                reserved_bytes: a.reserved_bytes + b.reserved_bytes,
            })
    }

    fn trace(&self, seq: SeqId) -> Option<TraceStep> {
        let cache = self.seqs.get(&seq)?;
        Some(TraceStep {
            len: cache.len,
            layer_cache_shapes: cache.shapes(),
            block_table: None,
            slot_mapping: None,
        })
    }
}

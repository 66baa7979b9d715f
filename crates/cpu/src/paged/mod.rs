//! The paged CPU engine (`cpu-paged`): the same model as [`crate::CpuEngine`], with its KV cache
//! in a pool of fixed-size blocks (vLLM's PagedAttention, Kwon et al. 2023) instead of one
//! `(n_layers, max_seq_len, kv_dim)` buffer per sequence.
//!
//! Two ways in, one step ([`ModelInput`], checked by [`ModelInput::validate`] as every paged
//! engine checks it):
//! * as a [`kvlab_paged::StepExecutor`], the scheduler's step is run whole: block copies first,
//!   then every sequence's new tokens through one matrix product per layer, K and V stored
//!   through `slot_mapping`, attention per sequence through its row of `block_tables`;
//! * as an [`Engine`] (one sequence at a time, for `generate` and verify), the engine reserves
//!   slots through [`UnscheduledPools::step`] exactly as the scheduler would and runs the same
//!   step. The two ways share the pool, so `execute` refuses while such sequences hold blocks.

pub mod attention;
pub mod pool;

use std::sync::Arc;

use kvlab_model::engine::{check_max_seq_len, check_tokens};
use kvlab_model::{
    Config, Engine, Error, KvDtype, KvUsage, Model, Result, SeqId, Sequences, TraceStep,
};
use kvlab_paged::{
    BlockCopy, BlockId, KvCacheConfig, ModelInput, StepExecutor, UnscheduledPools, UnscheduledSeq,
};

use crate::attention::Heads;
use crate::forward::forward;
use crate::kv_cache::KvCache;
use crate::kv_store::{Part, round_trip};
use attention::{PagedLayer, SeqSpan, paged_attention};
use kvlab_model::rope::RopeTables;
use pool::KvPool;

const NAME: &str = "cpu-paged";

/// The pool as the cached forward step sees it during one step.
struct PagedStep<'a> {
    config: &'a Config,
    pool: &'a mut KvPool,
    input: &'a ModelInput,
    /// Sequence of each row. (num_tokens,)
    row_seq: &'a [usize],
    /// The step's own keys and values of the layer being run. (num_tokens, kv_dim) each
    k_new: Vec<f32>,
    v_new: Vec<f32>,
}

impl KvCache for PagedStep<'_> {
    /// `reshape_and_cache`: every new token's k and v go to their slot in the pool (−1: a
    /// sliding-window position no later step reads, not kept); the step keeps its own rows for
    /// this layer's attention.
    fn append(&mut self, l: usize, k: &[f32], v: &[f32]) {
        let g = self.config.layer_cache_group(l);
        let kvd = self.config.kv_dim();
        let slots = &self.input.groups[g].slot_mapping;
        for (r, &slot) in slots.iter().enumerate() {
            if slot >= 0 {
                self.pool.write(
                    l,
                    slot as usize,
                    &k[r * kvd..(r + 1) * kvd],
                    &v[r * kvd..(r + 1) * kvd],
                );
            }
        }
        // What the pool gives back for these rows, read back once all are written (an int4
        // key group changes when its last row arrives), so that a query reads the same key
        // whether it comes from this step or a later one. A row not kept reads as written alone.
        let (c, dtype) = (self.config, self.pool.dtype());
        let (pool_k, pool_v) = self.pool.layer(l);
        let mut tile = Vec::new();
        for (part, new, x, store) in [
            (Part::Keys, &mut self.k_new, k, pool_k),
            (Part::Values, &mut self.v_new, v, pool_v),
        ] {
            new.clear();
            new.extend_from_slice(x);
            if dtype == KvDtype::F32 {
                continue;
            }
            for (row, &slot) in new.chunks_exact_mut(kvd).zip(slots) {
                if slot >= 0 {
                    let slot = slot as usize;
                    row.copy_from_slice(store.read(slot..slot + 1, 0..c.n_kv_heads, &mut tile));
                } else {
                    round_trip(dtype, part, (c.n_kv_heads, c.head_dim), 1, row);
                }
            }
        }
    }

    /// Each query attends over its own sequence: earlier positions through its block table,
    /// this step's from the step's rows.
    fn attend(&self, l: usize, q: &[f32], heads: &Heads, out: &mut [f32]) {
        let g = self.config.layer_cache_group(l);
        let (input, tables) = (self.input, &self.input.groups[g].block_tables);
        let spans: Vec<SeqSpan<'_>> = (0..input.num_seqs())
            .map(|s| {
                let row0 = input.query_start_loc[s] as usize;
                SeqSpan {
                    row0,
                    n: input.query_start_loc[s + 1] as usize - row0,
                    pos0: input.positions[row0] as usize,
                    block_table: tables.row(s).unwrap_or(&[]),
                }
            })
            .collect();
        let (pool_k, pool_v) = self.pool.layer(l);
        let layer = PagedLayer {
            pool_k,
            pool_v,
            block_size: self.pool.block_size,
            k_new: &self.k_new,
            v_new: &self.v_new,
            kv_dim: self.config.kv_dim(),
        };
        paged_attention(out, q, heads, layer, &spans, self.row_seq);
    }
}

/// The paged CPU engine.
pub struct PagedCpuEngine {
    model: Arc<Model>,
    rope: RopeTables,
    pool: KvPool,
    /// Sequences driven one at a time through the `Engine` API, and their blocks (the
    /// scheduler keeps its own tables for batched runs; the two never share the pool at once).
    unscheduled: UnscheduledPools,
    seqs: Sequences<UnscheduledSeq>,
}

impl PagedCpuEngine {
    /// An engine whose pool has the shape `kv_cache`, the value its scheduler takes too:
    /// `KvCacheConfig::new(config.kv_cache_groups(), num_blocks, block_size)` gives every layer
    /// `num_blocks` blocks of `block_size` tokens.
    ///
    /// # Errors
    /// [`Error::Config`] for a zero size, a pool too large to index, or groups that are not the
    /// model's with one block count for all.
    pub fn new(model: Arc<Model>, kv_cache: KvCacheConfig) -> Result<PagedCpuEngine> {
        PagedCpuEngine::with_kv_dtype(model, kv_cache, KvDtype::F32)
    }

    /// An engine whose pool stores keys and values as `kv_dtype` (quantized by
    /// `reshape_and_cache`, dequantized inside paged attention: `crate::kv_store`).
    ///
    /// # Errors
    /// As [`PagedCpuEngine::new`].
    pub fn with_kv_dtype(
        model: Arc<Model>,
        kv_cache: KvCacheConfig,
        kv_dtype: KvDtype,
    ) -> Result<PagedCpuEngine> {
        let c = &model.config;
        let block_size = kv_cache.block_size;
        let num_blocks = kv_cache.groups.first().map_or(0, |g| g.num_blocks);
        if kv_cache != KvCacheConfig::new(c.kv_cache_groups(), num_blocks, block_size) {
            return Err(Error::Config(format!(
                "{kv_cache:?} is not {num_blocks} blocks for each of the model's KV cache groups {:?}",
                c.kv_cache_groups()
            )));
        }
        let unscheduled =
            UnscheduledPools::new(&kv_cache).map_err(|e| Error::Config(e.to_string()))?;
        let max_pos = c.max_seq_len.min(num_blocks.saturating_mul(block_size));
        let rope = RopeTables::for_config(c, max_pos);
        let pool = KvPool::new(
            c.n_layers,
            num_blocks,
            block_size,
            (c.n_kv_heads, c.head_dim),
            kv_dtype,
        );
        Ok(PagedCpuEngine {
            model,
            rope,
            pool,
            unscheduled,
            seqs: Sequences::default(),
        })
    }

    /// The pool's shape, for the scheduler that drives this engine.
    pub fn kv_cache(&self) -> &KvCacheConfig {
        self.unscheduled.kv_cache()
    }

    /// Runs one step: checks it ([`ModelInput::validate`]), makes its block copies, then runs
    /// every sequence's new tokens through the forward pass. Returns the logits (vocab_size,) of
    /// each `logits_indices` row.
    ///
    /// # Errors
    /// [`Error::Engine`] for a malformed step.
    pub fn run_step(&mut self, input: &ModelInput) -> Result<Vec<Vec<f32>>> {
        self.run_rows(input, &input.logits_indices)
    }

    /// [`PagedCpuEngine::run_step`], returning the logits of `rows` (token-axis indices)
    /// instead of the step's `logits_indices`: every row, for a speculative check.
    fn run_rows(&mut self, input: &ModelInput, rows: &[usize]) -> Result<Vec<Vec<f32>>> {
        let c = &self.model.config;
        input
            .validate(
                self.unscheduled.kv_cache(),
                c.vocab_size,
                self.rope.positions(),
            )
            .map_err(|e| Error::Engine {
                engine: NAME,
                reason: e.to_string(),
            })?;
        for (g, group) in input.groups.iter().enumerate() {
            self.copy_blocks(g, &group.block_copies);
        }
        let positions: Vec<usize> = input.positions.iter().map(|&p| p as usize).collect();
        let mut row_seq = Vec::with_capacity(positions.len());
        for (s, w) in input.query_start_loc.windows(2).enumerate() {
            row_seq.extend(std::iter::repeat_n(s, (w[1] - w[0]) as usize));
        }
        let mut step = PagedStep {
            config: &self.model.config,
            pool: &mut self.pool,
            input,
            row_seq: &row_seq,
            k_new: Vec::new(),
            v_new: Vec::new(),
        };
        let (model, rope, tokens) = (&self.model, &self.rope, &input.input_ids);
        Ok(forward(model, rope, tokens, &positions, rows, &mut step))
    }

    /// Copies every block of `copies` in every layer of KV group `group`.
    fn copy_blocks(&mut self, group: usize, copies: &[BlockCopy]) {
        for l in (0..self.model.config.n_layers)
            .filter(|&l| self.model.config.layer_cache_group(l) == group)
        {
            for cp in copies {
                self.pool.copy_block(l, cp.src as usize, cp.dst as usize);
            }
        }
    }

    /// One step of an unscheduled sequence: reserve its slots as the scheduler would
    /// ([`UnscheduledPools::step`]), then run it as a one-sequence step. Returns the logits of
    /// every token with `all`, else of the last.
    fn run_unscheduled(&mut self, seq: SeqId, tokens: &[u32], all: bool) -> Result<Vec<Vec<f32>>> {
        let s = self.seqs.get_mut(seq)?;
        check_tokens(&self.model.config, seq, s.len, s.max_seq_len, tokens)?;
        let input = self
            .unscheduled
            .step(s, tokens)
            .map_err(|e| Error::Engine {
                engine: NAME,
                reason: format!(
                    "{e}; the pool has {} blocks of {} tokens: build the engine with more blocks",
                    self.pool.num_blocks, self.pool.block_size
                ),
            })?;
        let every: Vec<usize> = (0..tokens.len()).collect();
        let rows = if all { &every } else { &input.logits_indices };
        let logits = self.run_rows(&input, rows)?;
        if let Ok(s) = self.seqs.get_mut(seq) {
            s.len += tokens.len();
        }
        Ok(logits)
    }
}

impl StepExecutor for PagedCpuEngine {
    type Error = Error;

    /// # Errors
    /// [`Error::Engine`] while sequences driven through the `Engine` API hold blocks of the pool
    /// (the scheduler would hand the same blocks out again), or for a malformed step.
    fn execute(&mut self, input: &ModelInput) -> Result<Vec<Vec<f32>>> {
        if !self.seqs.is_empty() {
            return Err(Error::Engine {
                engine: NAME,
                reason: format!(
                    "{} sequences started through the Engine API hold blocks of the pool the \
                     scheduler also manages; free them before running scheduled batches",
                    self.seqs.len()
                ),
            });
        }
        self.run_step(input)
    }

    /// K and V of every layer of `group`, as the pool stores them.
    ///
    /// # Errors
    /// [`Error::Engine`] for a group or block outside the pool.
    fn read_block(&mut self, group: usize, block: BlockId) -> Result<Option<Vec<u8>>> {
        let layers = self.block_layers(group, block)?;
        let mut out = Vec::new();
        Ok(self
            .pool
            .save_block(&layers, block as usize, &mut out)
            .map(|()| out))
    }

    /// # Errors
    /// [`Error::Engine`] for a group or block outside the pool, or bytes that are not one
    /// block of this pool's layers and dtype.
    fn write_block(&mut self, group: usize, block: BlockId, bytes: &[u8]) -> Result<bool> {
        let layers = self.block_layers(group, block)?;
        self.pool
            .load_block(&layers, block as usize, bytes)
            .ok_or_else(|| Error::Engine {
                engine: NAME,
                reason: format!(
                    "{} bytes are not one {} block of KV cache group {group}",
                    bytes.len(),
                    self.pool.dtype()
                ),
            })?;
        Ok(true)
    }
}

impl PagedCpuEngine {
    /// The layers of KV cache group `group`, after checking that `block` is in the pool.
    fn block_layers(&self, group: usize, block: BlockId) -> Result<Vec<usize>> {
        let c = &self.model.config;
        let layers: Vec<usize> = (0..c.n_layers)
            .filter(|&l| c.layer_cache_group(l) == group)
            .collect();
        if layers.is_empty() || block as usize >= self.pool.num_blocks {
            return Err(Error::Engine {
                engine: NAME,
                reason: format!(
                    "block {block} of KV cache group {group} is outside the pool ({} groups of {} blocks)",
                    c.kv_cache_groups().len(),
                    self.pool.num_blocks
                ),
            });
        }
        Ok(layers)
    }
}

impl Engine for PagedCpuEngine {
    fn name(&self) -> &'static str {
        NAME
    }

    fn config(&self) -> &Config {
        &self.model.config
    }

    fn new_sequence(&mut self, max_seq_len: usize) -> Result<SeqId> {
        check_max_seq_len(&self.model.config, max_seq_len)?;
        let cap = self.rope.positions();
        if max_seq_len > cap {
            return Err(Error::Config(format!(
                "the pool holds at most {cap} positions; a sequence of {max_seq_len} needs a larger pool"
            )));
        }
        Ok(self.seqs.insert(self.unscheduled.new_seq(max_seq_len)))
    }

    fn prefill(&mut self, seq: SeqId, tokens: &[u32]) -> Result<Vec<f32>> {
        let mut logits = self.run_unscheduled(seq, tokens, false)?;
        logits.pop().ok_or_else(|| Error::Engine {
            engine: NAME,
            reason: "a step returned no logits".into(),
        })
    }

    /// Every row's logits from one step: a sliding-window group keeps what the step's first
    /// query reads until the next step, so a rollback into the step is always possible.
    fn score(&mut self, seq: SeqId, tokens: &[u32]) -> Result<Vec<Vec<f32>>> {
        self.run_unscheduled(seq, tokens, true)
    }

    /// Cuts the sequence's block tables (see [`UnscheduledPools::truncate`]).
    fn truncate(&mut self, seq: SeqId, len: usize) -> Result<bool> {
        let s = self.seqs.get_mut(seq)?;
        Ok(self.unscheduled.truncate(s, len))
    }

    fn free(&mut self, seq: SeqId) {
        if let Some(mut s) = self.seqs.remove(seq) {
            self.unscheduled.free(&mut s);
        }
    }

    /// Used: the blocks the single-sequence path holds (batched runs report their usage through
    /// the scheduler's metrics). Reserved: the whole pool.
    fn kv_usage(&self) -> KvUsage {
        let c = &self.model.config;
        let used: usize = (0..c.n_layers)
            .map(|l| self.unscheduled.used_blocks(c.layer_cache_group(l)) * self.pool.block_bytes())
            .sum();
        KvUsage {
            used_bytes: used,
            reserved_bytes: self.pool.reserved_bytes(),
        }
    }

    fn trace(&self, seq: SeqId) -> Option<TraceStep> {
        let s = self.seqs.get(seq)?;
        let c = &self.model.config;
        let shapes = (0..c.n_layers)
            .map(|l| {
                let t = &s.tables[c.layer_cache_group(l)];
                format!(
                    "pool (num_blocks={}, block_size={}, n_kv_heads={}, head_dim={}) {}; blocks held by this sequence: {}",
                    self.pool.num_blocks, self.pool.block_size, c.n_kv_heads, c.head_dim, self.pool.dtype(),
                    t.blocks().iter().flatten().count()
                )
            })
            .collect();
        let (block_table, slot_mapping) = s.trace_rows();
        Some(TraceStep {
            len: s.len,
            layer_cache_shapes: shapes,
            block_table: Some(block_table),
            slot_mapping: Some(slot_mapping),
        })
    }
}

//! The scenarios `gpu_engine` runs on the GPU, run here without one through
//! `kvlab_cpu::paged::PagedCpuEngine`: the same kvlab-paged bookkeeping (scheduler, block
//! tables, slot mapping, prefix cache, copy-on-write, single-sequence pools) with the arithmetic
//! on the CPU. Each must equal the naive engine's greedy run, the batched pool must force
//! preemption and hit the prefix cache, and the fork must copy a shared block — so the scenarios
//! are proven sound, and a `gpu_engine` failure on a GPU is the CUDA engine's. The kernels are
//! `gpu_kernels`' business, `pack_step` is unit-tested in `src/launch/tests.rs`.

// Test code may unwrap: a failed unwrap is a failed test (clippy.toml allows it in #[test]
// functions; this covers the helpers too).
#![allow(clippy::unwrap_used)]

mod common;

use common::{
    BATCHED_POOL, FORK_POOL, TIERS_POOL, assert_same, batched_scenario, fork_scenario, gemma_like,
    greedy, prompt, speculative_scenario, synthetic, tiers_scenario,
};
use std::sync::Arc;

use kvlab_cpu::paged::PagedCpuEngine;
use kvlab_model::Model;
use kvlab_naive::NaiveEngine;
use kvlab_paged::KvCacheConfig;

/// The paged CPU engine over a pool of `(num_blocks, block_size)` per KV group of `model`.
fn engine(model: &Arc<Model>, (num_blocks, block_size): (usize, usize)) -> PagedCpuEngine {
    let kv_cache = KvCacheConfig::new(model.config.kv_cache_groups(), num_blocks, block_size);
    PagedCpuEngine::new(model.clone(), kv_cache).unwrap()
}

#[test]
fn batched_with_preemption_and_prefix_hits_matches_naive() {
    for (name, model) in [
        ("synth-gqa", synthetic("synth-gqa")),
        ("synth-mqa", synthetic("synth-mqa")),
        ("gemma-like", gemma_like()),
    ] {
        batched_scenario(name, &mut engine(&model, BATCHED_POOL), &model);
    }
}

#[test]
fn batched_speculative_decoding_with_rollbacks_matches_naive() {
    for (name, model) in [
        ("synth-gqa", synthetic("synth-gqa")),
        ("gemma-like", gemma_like()),
    ] {
        speculative_scenario(name, &mut engine(&model, BATCHED_POOL), &model);
    }
}

#[test]
fn tiers_spill_and_restore_match_naive() {
    let model = synthetic("synth-gqa");
    tiers_scenario("synth-gqa", &mut engine(&model, TIERS_POOL), &model);
}

#[test]
fn fork_copy_on_write_matches_naive() {
    let model = synthetic("synth-mha");
    fork_scenario(&mut engine(&model, FORK_POOL), &model);
}

/// Single-sequence mode (`Engine::prefill`/`decode`) on the Gemma-like model: a prompt longer
/// than the sliding window, then decodes far past it.
#[test]
fn single_sequence_mode_past_the_window_matches_naive() {
    let model = gemma_like();
    let p = prompt(37, 8, model.config.vocab_size);
    let (want, margins) = greedy(&mut NaiveEngine::new(model.clone()), &p, 60);
    let (got, _) = greedy(&mut engine(&model, (32, 16)), &p, 60);
    assert_same("gemma-like single-sequence", &want, &got, &margins);
}

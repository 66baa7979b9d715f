//! The GPU forward pass mirrored on the CPU (`kvlab_cuda::reference::HostForward`: the same
//! packed steps, pool layout and order of operations, with the scalar references for kernels),
//! driven by the scheduler against the naive engine. It checks without a GPU everything but the
//! kernels themselves: `pack_step`, slot mapping, block tables, which keys come from the pool and
//! which from the step, copy-on-write copies, sliding-window groups, preemption and prefix hits.

mod common;

use common::{
    BATCHED_POOL, FORK_POOL, assert_same, batched_scenario, fork_scenario, gemma_like, greedy,
    prompt, synthetic,
};
use kvlab_cuda::reference::HostForward;
use kvlab_model::sampler::argmax;
use kvlab_naive::NaiveEngine;
use kvlab_paged::UnscheduledPools;
use kvlab_paged::{ScheduledBatch, StepExecutor};

#[test]
fn host_mirror_batched_with_preemption_and_prefix_hits_matches_naive() {
    for (name, model) in [
        ("synth-gqa", synthetic("synth-gqa")),
        ("synth-mqa", synthetic("synth-mqa")),
        ("gemma-like", gemma_like()),
    ] {
        let (num_blocks, block_size) = BATCHED_POOL;
        let mut host = HostForward::new(model.clone(), num_blocks, block_size);
        batched_scenario(name, &mut host, &model);
    }
}

#[test]
fn host_mirror_fork_copy_on_write_matches_naive() {
    let model = synthetic("synth-mha");
    let (num_blocks, block_size) = FORK_POOL;
    let mut host = HostForward::new(model.clone(), num_blocks, block_size);
    fork_scenario(&mut host, &model);
}

/// Single-sequence mode (`kvlab_paged::UnscheduledPools`, what `Engine::prefill`/`decode` use) through the mirror: a
/// prompt longer than the sliding window, then decodes far past it.
#[test]
fn host_mirror_single_sequence_mode_matches_naive() {
    let model = gemma_like();
    let mut host = HostForward::new(model.clone(), 32, 16);
    let mut pools = UnscheduledPools::new(model.config.kv_cache_groups(), 32, 16).unwrap();
    let p = prompt(37, 8, model.config.vocab_size);
    let mut naive = NaiveEngine::new(model.clone());
    let (want, margins) = greedy(&mut naive, &p, 60);
    let mut seq = pools.new_seq(256);
    let mut tokens = p.clone();
    let mut got = Vec::new();
    for _ in 0..60 {
        let step = pools.reserve(&mut seq, 0, &tokens).unwrap();
        let batch = ScheduledBatch {
            seqs: vec![step],
            preempted: vec![],
        };
        let logits = host.execute(&batch).unwrap();
        seq.len += tokens.len();
        let t = argmax(&logits[0]);
        got.push(t);
        tokens = vec![t];
    }
    assert_same("gemma-like single-sequence", &want, &got, &margins);
}

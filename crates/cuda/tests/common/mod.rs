//! Shared by the test files: find a GPU or skip loudly, move buffers, poison outputs, seeded
//! random inputs, the kernels' CPU references ([`reference`]) and the engine scenarios.
#![allow(dead_code)]
// Test code may unwrap: a failed unwrap is a failed test (clippy.toml allows it in #[test]
// functions; this covers the helpers too).
#![allow(clippy::unwrap_used)]

pub mod backend;
pub mod reference;

use std::sync::Arc;

use kvlab_cuda::device::Device;
use kvlab_cuda::dtype::DType;
use kvlab_cuda::ops::Ops;

pub use backend::{Backend, Buf};
use kvlab_cpu::CpuEngine;
use kvlab_cuda::{CudaError, require_cuda};
use kvlab_model::sampler::{argmax, top2_margin};
use kvlab_model::{
    Activation, DraftModel, Drafter, Engine, LayerKind, Model, Proposer, RopeLayout, Speculative,
    registry,
};
use kvlab_naive::NaiveEngine;
use kvlab_paged::{
    KvCacheConfig, Request, RequestId, Scheduler, SchedulerConfig, StepExecutor, StopConditions,
    TierConfig, TokenSampler, drive, drive_with,
};
use rand::{Rng, SeedableRng};
use rand_chacha::ChaCha8Rng;

/// The tests' generator, seeded: every run sees the same numbers.
pub fn rng(seed: u64) -> ChaCha8Rng {
    ChaCha8Rng::seed_from_u64(seed)
}

/// `n` values uniform in [-a, a).
pub fn uniform(r: &mut ChaCha8Rng, n: usize, a: f32) -> Vec<f32> {
    (0..n).map(|_| r.random_range(-a..a)).collect()
}

/// Skips (prints SKIPPED, returns None) when there is no usable CUDA, unless
/// KVLAB_REQUIRE_CUDA=1, which turns the skip into a failure.
pub fn skip_unless_available(e: CudaError, test: &str) {
    if e.is_unavailable() && !require_cuda() {
        eprintln!("SKIPPED: {test}: no CUDA device ({e})");
    } else {
        panic!("{test}: {e}");
    }
}

/// The GPU and its kernels as a [`Backend`], or None (skipped).
pub fn gpu(test: &str) -> Option<Backend> {
    kvlab_cuda::probe()
        .and_then(|_| Device::open(0))
        .and_then(|d| Ops::new(&d).map(|ops| Backend::Gpu { _dev: d, ops }))
        .map_err(|e| skip_unless_available(e, test))
        .ok()
}

/// The CPU emulator of the kernels as a [`Backend`].
pub fn emu() -> Backend {
    Backend::Emu(backend::Emu)
}

/// A kernel test body run twice: `gpu_<name>` on the GPU (skipped without one) and
/// `emu_<name>` on the CPU emulator, which always runs.
#[macro_export]
macro_rules! on_gpu_and_emu {
    ($body:ident, $gpu:ident, $emu:ident) => {
        #[test]
        fn $gpu() {
            if let Some(b) = common::gpu(stringify!($gpu)) {
                $body(&b);
            }
        }
        #[test]
        fn $emu() {
            $body(&common::emu());
        }
    };
}

/// Uploads f32 values converted to `T`.
pub fn up<T: DType>(ops: &Backend, x: &[f32]) -> Buf<T> {
    ops.upload(T::from_f32_slice(x).as_ref())
}

/// Uploads i32 values.
pub fn up_i32(ops: &Backend, x: &[i32]) -> Buf<i32> {
    ops.upload(x)
}

/// A buffer of `n` NaNs: a kernel that leaves an element unwritten fails the comparison.
pub fn poisoned<T: DType>(ops: &Backend, n: usize) -> Buf<T> {
    up::<T>(ops, &vec![f32::NAN; n])
}

/// Downloads as f32 (after the queued work).
pub fn down<T: DType>(ops: &Backend, x: &Buf<T>) -> Vec<f32> {
    ops.to_vec(x).into_iter().map(T::to_f32).collect()
}

/// Values as stored in `T` and read back (what the kernel actually sees).
pub fn rounded<T: DType>(x: &[f32]) -> Vec<f32> {
    x.iter().map(|&v| T::from_f32(v).to_f32()).collect()
}

/// Asserts the normwise relative error is within `T`'s tolerance, the issue's: < 1e-5 for f32,
/// < 1e-2 for f16 (NaN never passes).
pub fn check<T: DType>(what: &str, got: &[f32], want: &[f32]) {
    check_within(
        &format!("{what} ({})", T::NAME),
        got,
        want,
        tolerance::<T>(),
    );
}

/// The relative error allowed for results in `T`: 1e-5 for f32, 1e-2 for 16-bit types.
pub fn tolerance<T: DType>() -> f32 {
    if T::BYTES == 4 { 1e-5 } else { 1e-2 }
}

/// Asserts relative error < `tol` (NaN never passes) and prints it.
pub fn check_within(what: &str, got: &[f32], want: &[f32], tol: f32) {
    let e = reference::rel_err(got, want);
    assert!(e < tol, "{what}: relative error {e:e} >= {tol:e}");
    eprintln!("{what}: relative error {e:e}");
}

/// Greedy tokens of `n` steps after `prompt`, and each step's top-2 margin (for reports).
pub fn greedy(e: &mut dyn Engine, prompt: &[u32], n: usize) -> (Vec<u32>, Vec<f32>) {
    let seq = e.new_sequence(e.config().max_seq_len).unwrap();
    let mut logits = e.prefill(seq, prompt).unwrap();
    let (mut out, mut margins) = (Vec::new(), Vec::new());
    for _ in 0..n {
        let t = argmax(&logits);
        out.push(t);
        margins.push(top2_margin(&logits));
        logits = e.decode(seq, t).unwrap();
    }
    e.free(seq);
    (out, margins)
}

pub fn assert_same(what: &str, want: &[u32], got: &[u32], margins: &[f32]) {
    if let Some(i) = want.iter().zip(got).position(|(a, b)| a != b) {
        panic!(
            "{what}: step {i}: naive {} vs engine {} (naive top-2 margin {})",
            want[i], got[i], margins[i]
        );
    }
    assert_eq!(want.len(), got.len(), "{what}");
}

pub fn synthetic(name: &str) -> Arc<Model> {
    let spec = registry::entry(name)
        .and_then(|e| e.synthetic.clone())
        .unwrap_or_else(|| panic!("{name} is a synthetic model of fixtures/models.json"));
    Arc::new(spec.build().unwrap())
}

/// A synthetic model with every Gemma 3 feature the engine supports: sliding-window layers
/// (two KV groups), two RoPE bases, NeoX RoPE, QK-norm, post norms, GeGLU, embedding scale.
pub fn gemma_like() -> Arc<Model> {
    let base = kvlab_model::SyntheticSpec::new(128, 256, 4, 4, 1, 512, 256, 21)
        .build()
        .unwrap();
    let mut c = base.config.clone();
    c.layer_kinds = vec![
        LayerKind::Local { window: 16 },
        LayerKind::Local { window: 16 },
        LayerKind::Global,
        LayerKind::Local { window: 16 },
    ];
    c.rope_layout = RopeLayout::Neox;
    c.rope_theta = 1e6;
    c.rope_theta_local = 1e4;
    c.activation = Activation::GeluTanh;
    c.qk_norm = true;
    c.post_norms = true;
    c.embed_scale = (c.dim as f32).sqrt() / 8.0;
    let mut w = base.weights.clone();
    let mut r = rng(9);
    for l in &mut w.layers {
        l.q_norm = (0..c.head_dim).map(|_| r.random_range(0.8..1.2)).collect();
        l.k_norm = (0..c.head_dim).map(|_| r.random_range(0.8..1.2)).collect();
        l.post_attn_norm = (0..c.dim).map(|_| r.random_range(0.4..0.6)).collect();
        l.post_ffn_norm = (0..c.dim).map(|_| r.random_range(0.4..0.6)).collect();
    }
    Arc::new(Model::new(c, w).unwrap())
}

pub fn prompt(len: usize, seed: u64, vocab: usize) -> Vec<u32> {
    let mut r = rng(seed);
    std::iter::once(1)
        .chain((1..len).map(|_| r.random_range(2..vocab as u32)))
        .collect()
}

/// A scheduler over a pool of `(num_blocks, block_size)` for `model`'s KV groups, prefix caching
/// on where no group has a sliding window.
pub fn scheduler_for(
    model: &Model,
    (num_blocks, block_size): (usize, usize),
    max_len: usize,
) -> Scheduler {
    let kv_cache = KvCacheConfig::new(model.config.kv_cache_groups(), num_blocks, block_size);
    let mut cfg = SchedulerConfig::new(kv_cache, max_len);
    cfg.enable_prefix_caching = cfg
        .kv_cache
        .groups
        .iter()
        .all(|g| g.sliding_window.is_none());
    Scheduler::new(cfg).unwrap()
}

/// Pool of [`batched_scenario`]: 14 blocks of 8 = 112 slots for 6 requests of up to 39 + 24
/// tokens, so the scheduler must preempt.
pub const BATCHED_POOL: (usize, usize) = (14, 8);

/// Six requests sharing a 24-token prefix, arriving every other step, through
/// `kvlab_paged::drive` with greedy sampling: each output must equal the naive engine's solo
/// greedy output, and the run must have preempted (and hit the prefix cache where it is on).
pub fn batched_scenario<E>(name: &str, engine: &mut E, model: &Arc<Model>)
where
    E: StepExecutor,
    E::Error: std::fmt::Display + std::fmt::Debug,
{
    let mut sched = scheduler_for(model, BATCHED_POOL, 80);
    let mut sampler = Greedy(None);
    batched_run(name, engine, model, &mut sched, &mut sampler);
}

/// [`batched_scenario`] with speculative decoding: every decode checks up to 4 draft tokens
/// from the model's first layer (an early exit, on the CPU; odd requests get their last draft
/// spoiled, so that some are always rejected), kept while the engine's argmax agrees and rolled
/// back in the pool past the first it does not. Every output must still be the naive engine's,
/// and drafts must have been both kept and rejected.
pub fn speculative_scenario<E>(name: &str, engine: &mut E, model: &Arc<Model>)
where
    E: StepExecutor,
    E::Error: std::fmt::Display + std::fmt::Debug,
{
    let draft = Arc::new(model.early_exit(1).unwrap());
    let vocab = draft.config.vocab_size;
    let proposer =
        Proposer::Draft(DraftModel::new(Box::new(CpuEngine::new(draft)), vocab).unwrap());
    let spec = Speculative {
        proposer,
        num_speculative_tokens: 4,
    };
    let mut sampler = Greedy(Some((Drafter::new(spec, 80), vocab as u32)));
    let mut sched = scheduler_for(model, BATCHED_POOL, 80);
    batched_run(name, engine, model, &mut sched, &mut sampler);
    let m = sched.metrics();
    eprintln!(
        "{name}: speculative batch token-identical; {} of {} drafts kept",
        m.spec_decode_num_accepted_tokens, m.spec_decode_num_draft_tokens
    );
    assert!(
        m.spec_decode_num_accepted_tokens > 0,
        "{name}: no draft kept"
    );
    assert!(
        m.spec_decode_num_accepted_tokens < m.spec_decode_num_draft_tokens,
        "{name}: no draft rejected, so nothing was rolled back"
    );
}

/// Argmax sampling, drafting with a [`Drafter`] over a vocabulary of this many tokens when
/// there is one.
struct Greedy(Option<(Drafter, u32)>);

impl TokenSampler for Greedy {
    type Error = std::convert::Infallible;

    fn sample(&mut self, _: RequestId, logits: Vec<f32>) -> Result<u32, Self::Error> {
        Ok(argmax(&logits))
    }

    fn speculates(&self) -> bool {
        self.0.is_some()
    }

    fn propose(&mut self, id: RequestId, token_ids: &[u32], max: usize) -> Vec<u32> {
        let (d, vocab) = self.0.as_mut().unwrap();
        let mut drafts = d.propose(id.0, token_ids, max).unwrap();
        if let Some(last) = drafts.last_mut().filter(|_| id.0 % 2 == 1) {
            *last = (*last + 1) % *vocab;
        }
        drafts
    }

    fn drafts_checked(&mut self, id: RequestId, num_drafts: usize, num_kept: usize) {
        if let Some((d, _)) = self.0.as_mut() {
            d.record(id.0, num_drafts, num_kept);
        }
    }

    fn release(&mut self, id: RequestId) {
        if let Some((d, _)) = self.0.as_mut() {
            d.release(id.0);
        }
    }
}

/// Six requests sharing a 24-token prefix, arriving every other step, through `sched` and
/// `engine` with `sampler`: each output must equal the naive engine's solo greedy output, and
/// the run must have preempted (unless it speculates) and hit the prefix cache where it is on.
fn batched_run<E>(
    name: &str,
    engine: &mut E,
    model: &Arc<Model>,
    sched: &mut Scheduler,
    sampler: &mut Greedy,
) where
    E: StepExecutor,
    E::Error: std::fmt::Display + std::fmt::Debug,
{
    let vocab = model.config.vocab_size;
    let shared = prompt(24, 99, vocab);
    let requests: Vec<Request> = (0..6)
        .map(|i| {
            let mut p = shared.clone();
            p.extend(prompt(1 + 3 * i, 100 + i as u64, vocab).iter().skip(1));
            Request {
                prompt: p,
                stop: StopConditions::max_tokens(24),
                arrival_step: 2 * i,
                tenant: 0,
                resumes: false,
            }
        })
        .collect();
    let mut naive = NaiveEngine::new(model.clone());
    let report = drive_with(engine, sched, &requests, sampler, |_, _, _| {}).unwrap();
    for (i, (r, (got, _))) in requests.iter().zip(&report.outputs).enumerate() {
        let (want, margins) = greedy(&mut naive, &r.prompt, got.len());
        assert_eq!(got.len(), 24, "{name} request {i}");
        assert_same(&format!("{name} batched request {i}"), &want, got, &margins);
    }
    let m = &report.metrics;
    eprintln!(
        "{name}: batched token-identical; {} steps, {} preemptions, {} prefix-cache hit tokens",
        m.num_steps, m.num_preemptions, m.prefix_cache_hits
    );
    // Speculation finishes in fewer steps, so its requests may never crowd the pool at once.
    assert!(
        m.num_preemptions > 0 || sampler.speculates(),
        "{name}: the pool was meant to force preemption"
    );
    if sched.config().enable_prefix_caching {
        assert!(
            m.prefix_cache_hits > 0,
            "{name}: the shared prefix was meant to hit"
        );
    }
}

/// Pool of [`tiers_scenario`]: 16 blocks of 8, a third of what its first wave wants.
pub const TIERS_POOL: (usize, usize) = (16, 8);

/// Six prompts of distinct 24-token prefixes, each sent twice (the second wave after the
/// first), through a pool too small to keep the first wave's prefixes, with tiers below it
/// (host memory, then files): the second wave restores spilled blocks, and every output must be
/// the naive engine's greedy one. The engine's `read_block`/`write_block` carry the bytes.
pub fn tiers_scenario<E>(name: &str, engine: &mut E, model: &Arc<Model>)
where
    E: StepExecutor,
    E::Error: std::fmt::Display + std::fmt::Debug,
{
    let vocab = model.config.vocab_size;
    let requests: Vec<Request> = (0..12)
        .map(|i| Request {
            prompt: prompt(27, 200 + (i % 6) as u64, vocab),
            stop: StopConditions::max_tokens(8),
            arrival_step: if i < 6 { i } else { 60 + i },
            tenant: 0,
            resumes: false,
        })
        .collect();
    let mut naive = NaiveEngine::new(model.clone());
    let mut sched = scheduler_for(model, TIERS_POOL, 40);
    let mut cfg = sched.config().clone();
    cfg.tiers = Some(TierConfig::host(2).with_disk(std::env::temp_dir(), 64));
    if cfg.enable_prefix_caching {
        sched = Scheduler::new(cfg).unwrap();
    }
    let report = drive(engine, &mut sched, &requests, argmax, |_, _, _| {}).unwrap();
    for (i, (r, (got, _))) in requests.iter().zip(&report.outputs).enumerate() {
        let (want, margins) = greedy(&mut naive, &r.prompt, got.len());
        assert_same(&format!("{name} tiers request {i}"), &want, got, &margins);
    }
    let m = &report.metrics;
    eprintln!(
        "{name}: tiers token-identical; {} spills, {} restores, {} bytes read back from disk",
        m.num_spills, m.num_restores, m.tier_store.bytes_read_from_disk
    );
    if sched.config().enable_prefix_caching {
        assert!(
            m.num_restores > 0,
            "{name}: the second wave was meant to restore"
        );
        assert!(
            m.tier_store.bytes_read_from_disk > 0,
            "{name}: and to read files"
        );
    }
}

/// Pool of [`fork_scenario`].
pub const FORK_POOL: (usize, usize) = (64, 8);

/// A 13-token prompt (its last block partial), forked after 3 generated tokens: the first write
/// into the shared block is a copy-on-write copy, and parent and child both continue exactly as
/// the naive engine's greedy run.
pub fn fork_scenario<E>(engine: &mut E, model: &Arc<Model>)
where
    E: StepExecutor,
    E::Error: std::fmt::Debug,
{
    let mut sched = scheduler_for(model, FORK_POOL, 128);
    let p = prompt(13, 5, model.config.vocab_size);
    let parent = sched
        .add_request(p.clone(), StopConditions::max_tokens(20))
        .unwrap();
    let mut child = None;
    let mut outputs: std::collections::BTreeMap<_, Vec<u32>> = Default::default();
    let mut copies = 0;
    while sched.has_unfinished() {
        let b = sched.schedule().unwrap();
        copies += b
            .seqs
            .iter()
            .flat_map(|s| &s.groups)
            .map(|g| g.block_copies.len())
            .sum::<usize>();
        let logits = engine.execute(&b.model_input()).unwrap();
        let out: Vec<_> = b
            .seqs
            .iter()
            .zip(&logits)
            .filter(|(s, _)| s.samples)
            .map(|(s, l)| (s.seq_id, argmax(l)))
            .collect();
        for &(id, t) in &out {
            outputs.entry(id).or_default().push(t);
        }
        sched.update(&out).unwrap();
        if child.is_none() && outputs.get(&parent).map_or(0, Vec::len) == 3 {
            child = Some(sched.fork(parent).unwrap());
        }
    }
    assert!(copies > 0, "the fork was meant to copy a shared block");
    let mut naive = NaiveEngine::new(model.clone());
    let (want, margins) = greedy(&mut naive, &p, 20);
    assert_same("parent", &want, &outputs[&parent], &margins);
    // The child shares the parent's first 3 tokens and continues identically (greedy).
    let child_out = &outputs[&child.expect("forked")];
    assert!(!child_out.is_empty());
    assert_same(
        "forked child",
        &want[3..3 + child_out.len()],
        child_out,
        &margins[3..],
    );
    eprintln!("fork: {copies} copy-on-write copies, parent and child token-identical");
}

//! The CUDA engine against the naive reference engine: token-identical greedy output in f32
//! mode on the synthetic models (and stories260K when KVLAB_MODELS has it), alone and batched
//! through the scheduler with preemption, prefix sharing and copy-on-write; f16 mode reported as
//! teacher-forced top-1 agreement and max |Δlogit|; each `--kv-dtype` of the device pool against
//! the paged CPU engine with the same dtype. Skips without a GPU unless
//! KVLAB_REQUIRE_CUDA=1.

mod common;

use std::sync::Arc;

use common::{
    BATCHED_POOL, FORK_POOL, TIERS_POOL, assert_same, batched_scenario, fork_scenario, gemma_like,
    greedy, prompt, speculative_scenario, synthetic, tiers_scenario,
};
use kvlab_cpu::paged::PagedCpuEngine;
use kvlab_cuda::{CudaEngine, CudaOptions, Precision};
use kvlab_model::{Engine, KvDtype, Model, Tolerance, compare_logits, registry, teacher_force};
use kvlab_naive::NaiveEngine;
use kvlab_paged::{KvCacheConfig, StepExecutor};

/// Blocks of the pool when a test does not choose: small, so that tests running side by side
/// do not each claim 90 % of the GPU.
const TEST_BLOCKS: usize = 512;

/// The engine, or None after printing SKIPPED.
fn engine(model: &Arc<Model>, mut opts: CudaOptions, test: &str) -> Option<CudaEngine> {
    opts.num_blocks.get_or_insert(TEST_BLOCKS);
    let e = CudaEngine::try_new(model.clone(), opts)
        .map_err(|e| common::skip_unless_available(e, test))
        .ok()?;
    eprintln!("{}\n{}", e.device_info(), e.pool_plan());
    Some(e)
}

/// The default options with a pool of `(num_blocks, block_size)`.
fn pool((num_blocks, block_size): (usize, usize)) -> CudaOptions {
    CudaOptions {
        num_blocks: Some(num_blocks),
        block_size,
        ..CudaOptions::default()
    }
}

#[test]
fn gpu_f32_solo_matches_naive_on_every_synthetic_model() {
    let models = [
        ("synth-mha", synthetic("synth-mha")),
        ("synth-gqa", synthetic("synth-gqa")),
        ("synth-mqa", synthetic("synth-mqa")),
        ("synth-long", synthetic("synth-long")),
        ("gemma-like", gemma_like()),
    ];
    for (name, model) in models {
        let Some(mut cuda) = engine(&model, CudaOptions::default(), "gpu_f32_solo") else {
            return;
        };
        let mut naive = NaiveEngine::new(model.clone());
        for (len, n) in [(1, 24), (13, 40), (37, 60)] {
            let p = prompt(len, len as u64, model.config.vocab_size);
            let n = n.min(model.config.max_seq_len - len);
            let (want, margins) = greedy(&mut naive, &p, n);
            let (got, _) = greedy(&mut cuda, &p, n);
            assert_same(&format!("{name} prompt {len}"), &want, &got, &margins);
        }
        eprintln!("{name}: f32 solo token-identical");
    }
}

#[test]
fn gpu_f32_stories260k_matches_naive() {
    if let Err(e) = kvlab_cuda::probe() {
        common::skip_unless_available(e, "gpu_f32_stories260k");
        return;
    }
    let loaded = match registry::locate("stories260K").unwrap() {
        registry::Located::Ready {
            entry,
            model,
            tokenizer,
        } => registry::load_entry(entry, model.as_deref(), tokenizer.as_deref()).unwrap(),
        registry::Located::Missing { searched, .. } => {
            let why = format!("stories260K not found ({searched})");
            assert!(
                std::env::var("KVLAB_REQUIRE_MODELS").as_deref() != Ok("1"),
                "KVLAB_REQUIRE_MODELS=1 but {why}"
            );
            eprintln!("SKIPPED: gpu_f32_stories260k: {why}");
            return;
        }
    };
    let model = Arc::new(loaded.model);
    let Some(mut cuda) = engine(&model, CudaOptions::default(), "gpu_f32_stories260k") else {
        return;
    };
    let mut naive = NaiveEngine::new(model.clone());
    let p = prompt(8, 1, model.config.vocab_size);
    let (want, margins) = greedy(&mut naive, &p, 200);
    let (got, _) = greedy(&mut cuda, &p, 200);
    assert_same("stories260K", &want, &got, &margins);
}

#[test]
fn gpu_f32_batched_with_preemption_and_prefix_hits_matches_naive() {
    for (name, model) in [
        ("synth-gqa", synthetic("synth-gqa")),
        ("gemma-like", gemma_like()),
    ] {
        let Some(mut cuda) = engine(&model, pool(BATCHED_POOL), "gpu_f32_batched") else {
            return;
        };
        batched_scenario(name, &mut cuda, &model);
    }
}

/// `Engine::score` on the device: one step of four tokens gives each row the logits four
/// decodes give, and a speculative generation (prompt lookup, rolled back in the pool) is the
/// naive engine's greedy text.
#[test]
fn gpu_f32_score_matches_decodes_and_speculation_matches_naive() {
    let model = gemma_like();
    let Some(mut cuda) = engine(&model, CudaOptions::default(), "gpu_f32_score") else {
        return;
    };
    let vocab = model.config.vocab_size;
    let (p, more) = (prompt(21, 5, vocab), prompt(5, 6, vocab)[1..].to_vec());
    let a = cuda.new_sequence(64).unwrap();
    cuda.prefill(a, &p).unwrap();
    let rows = cuda.score(a, &more).unwrap();
    let b = cuda.new_sequence(64).unwrap();
    cuda.prefill(b, &p).unwrap();
    for (i, &t) in more.iter().enumerate() {
        let want = cuda.decode(b, t).unwrap();
        common::check_within(&format!("score row {i}"), &rows[i], &want, 1e-3);
    }
    cuda.free(a);
    cuda.free(b);
    let mut naive = NaiveEngine::new(model.clone());
    let looping = [p.clone(), p[1..].to_vec()].concat();
    let (want, _) = greedy(&mut naive, &looping, 40);
    let opts = kvlab_model::GenerateOptions {
        ubatch: 0,
        speculative: Some(kvlab_model::Speculative::ngram(
            kvlab_model::NgramProposer::default(),
            4,
        )),
        steps: looping.len() + 40 - 1,
        max_seq_len: 0,
        trace: false,
        special: false,
    };
    let g = kvlab_model::generate_tokens(
        &mut cuda,
        &looping,
        &opts,
        &mut kvlab_model::Sampler::greedy(),
        |_| {},
    )
    .unwrap();
    let n = g.tokens.len();
    assert!(n == 40 || g.stopped, "{n} tokens");
    assert_eq!(g.tokens, want[..n], "speculative greedy tokens");
    assert!(g.spec.num_draft_tokens > 0, "{:?}", g.spec);
}

/// Speculative decoding in the batch: a step of each decode's last token and its drafts, a row
/// of logits per fed token, rollbacks in the device pool.
#[test]
fn gpu_f32_batched_speculative_decoding_matches_naive() {
    for (name, model) in [
        ("synth-gqa", synthetic("synth-gqa")),
        ("gemma-like", gemma_like()),
    ] {
        let Some(mut cuda) = engine(&model, pool(BATCHED_POOL), "gpu_f32_speculative") else {
            return;
        };
        speculative_scenario(name, &mut cuda, &model);
    }
}

/// The engine refuses every malformed step `ModelInput::malformed_variants` builds (the list the
/// paged CPU engine refuses, crates/cpu/tests/paged.rs), naming the rule, and still runs the
/// valid step afterwards.
#[test]
fn gpu_malformed_steps_are_refused_with_the_reason() {
    let model = synthetic("synth-gqa");
    let Some(mut cuda) = engine(&model, pool((32, 4)), "gpu_malformed_steps") else {
        return;
    };
    let kv_cache = cuda.kv_cache().clone();
    let mut sched =
        kvlab_paged::Scheduler::new(kvlab_paged::SchedulerConfig::new(kv_cache.clone(), 64))
            .unwrap();
    sched
        .add_request(
            (1..=9).collect(),
            kvlab_paged::StopConditions::max_tokens(3),
        )
        .unwrap();
    while sched.has_unfinished() {
        let batch = sched.schedule().unwrap();
        let input = batch.model_input();
        for (word, bad) in input.malformed_variants(&kv_cache, model.config.vocab_size) {
            let err = cuda.execute(&bad).unwrap_err().to_string();
            assert!(err.contains(word), "{word}: {err}");
        }
        let logits = cuda.execute(&input).unwrap();
        let seqs = batch.seqs.iter().zip(&logits).filter(|(s, _)| s.samples);
        let sampled: Vec<_> = seqs
            .map(|(s, l)| (s.seq_id, kvlab_model::sampler::argmax(l)))
            .collect();
        sched.update(&sampled).unwrap();
    }
}

/// The tiers' block copies on the device: spilled blocks read back to the host, restored ones
/// written into the pool, every token the naive engine's.
#[test]
fn gpu_f32_tiers_spill_and_restore_match_naive() {
    let model = synthetic("synth-gqa");
    let Some(mut cuda) = engine(&model, pool(TIERS_POOL), "gpu_tiers") else {
        return;
    };
    tiers_scenario("synth-gqa", &mut cuda, &model);
}

#[test]
fn gpu_f32_fork_copy_on_write_matches_naive() {
    let model = synthetic("synth-mha");
    let Some(mut cuda) = engine(&model, pool(FORK_POOL), "gpu_fork") else {
        return;
    };
    fork_scenario(&mut cuda, &model);
}

#[test]
fn gpu_f16_teacher_forced_agreement() {
    for (name, model) in [
        ("synth-gqa", synthetic("synth-gqa")),
        ("gemma-like", gemma_like()),
    ] {
        for (precision, kv) in [
            (Precision::F32, KvDtype::F16),
            (Precision::F16, KvDtype::F16),
        ] {
            let opts = CudaOptions {
                precision,
                kv_dtype: kv,
                ..CudaOptions::default()
            };
            let Some(mut cuda) = engine(&model, opts, "gpu_f16") else {
                return;
            };
            let mut naive = NaiveEngine::new(model.clone());
            let p = prompt(17, 3, model.config.vocab_size);
            let (forced, _) = greedy(&mut naive, &p, 60);
            let want = teacher_force(&mut naive, &p, &forced, 256).unwrap();
            let got = teacher_force(&mut cuda, &p, &forced, 256).unwrap();
            let a = compare_logits(&got, &want, Tolerance::F32);
            eprintln!(
                "{name} weights {} kv {}: top-1 agreement {:.3} over {} positions, max |dlogit| {}",
                precision.name(),
                kv.name(),
                a.top1_agreement,
                a.positions,
                a.max_abs_dlogit
            );
            assert!(a.max_abs_dlogit.is_finite());
            assert!(a.top1_agreement >= 0.9, "{name}: {a:?}");
        }
    }
}

/// Each KV dtype of the device pool (f16, bf16, fp8-e4m3, int8, int4) against the paged CPU engine
/// storing the same dtype: the same quantization (the bits `gpu_kernels` checks), the step's own
/// rows read back from the pool on both, so only f32 rounding separates them. Then a block of the quantized pool goes to the host and back into
/// another block, scales included, bit for bit (what a tier does).
#[test]
fn gpu_kv_dtypes_match_the_cpu_pool() {
    for (name, model) in [
        ("synth-gqa", synthetic("synth-gqa")),
        ("gemma-like", gemma_like()),
    ] {
        for kv in [
            KvDtype::F16,
            KvDtype::Bf16,
            KvDtype::Fp8E4m3,
            KvDtype::Int8,
            KvDtype::Int4,
        ] {
            let opts = CudaOptions {
                kv_dtype: kv,
                ..CudaOptions::default()
            };
            let Some(mut cuda) = engine(&model, opts, "gpu_kv_dtypes") else {
                return;
            };
            let groups = model.config.kv_cache_groups();
            let cfg = KvCacheConfig::new(groups.clone(), TEST_BLOCKS, cuda.pool().1);
            let mut cpu = PagedCpuEngine::with_kv_dtype(model.clone(), cfg, kv).unwrap();
            let mut naive = NaiveEngine::new(model.clone());
            let p = prompt(17, 3, model.config.vocab_size);
            let (forced, _) = greedy(&mut naive, &p, 60);
            let want = teacher_force(&mut cpu, &p, &forced, 256).unwrap();
            let got = teacher_force(&mut cuda, &p, &forced, 256).unwrap();
            let a = compare_logits(&got, &want, Tolerance::F32);
            eprintln!(
                "{name} kv {kv} (cuda vs cpu-paged): top-1 agreement {:.3} over {} positions, max |dlogit| {}",
                a.top1_agreement, a.positions, a.max_abs_dlogit
            );
            assert!(a.max_abs_dlogit.is_finite(), "{name} {kv}: {a:?}");
            assert!(a.top1_agreement >= 0.95, "{name} {kv}: {a:?}");

            for g in 0..groups.len() {
                let bytes = cuda
                    .read_block(g, 0)
                    .unwrap()
                    .expect("the cuda pool reads blocks");
                let layers = (0..model.config.n_layers)
                    .filter(|&l| model.config.layer_cache_group(l) == g)
                    .count();
                let (nkv, hd, bs) = (
                    model.config.n_kv_heads,
                    model.config.head_dim,
                    cuda.pool().1,
                );
                // int4 adds a flag byte per layer (block 0 is complete: no residual).
                let flag = usize::from(kv == KvDtype::Int4);
                assert_eq!(
                    bytes.len(),
                    layers * (nkv * kv.kv_head_bytes(hd, bs, bs) + flag),
                    "{kv}"
                );
                assert!(cuda.write_block(g, 1, &bytes).unwrap());
                assert_eq!(
                    cuda.read_block(g, 1).unwrap().unwrap(),
                    bytes,
                    "{name} {kv} group {g}"
                );
            }
        }
    }
}

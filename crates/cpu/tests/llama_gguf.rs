//! stories260K written as a GGUF of architecture `llama` (`kvlab_model::gguf_write`) is the same
//! model on every CPU engine: the naive, cpu and cpu-paged engines generate from it exactly the
//! tokens they generate from the llama2.c file.

// Test code may unwrap: a failed unwrap is a failed test (clippy.toml allows it in #[test]
// functions; this covers the helpers too).
#![allow(clippy::unwrap_used)]

mod common;

use std::sync::Arc;

use kvlab_cpu::paged::PagedCpuEngine;
use kvlab_model::sampler::argmax;
use kvlab_model::{GenerateOptions, Model, Sampler, generate_tokens};
use kvlab_paged::{KvCacheConfig, Request, Scheduler, SchedulerConfig, StopConditions, drive};

const PROMPTS: [&str; 4] = ["Once upon a time", "The dog ran", "Lily and Ben", ""];
const N_NEW: usize = 48;

/// Greedy tokens of each prompt on the naive and cpu engines (stopping at the model's stop
/// ids) and, batched, on cpu-paged (stopping at `N_NEW` tokens only).
fn greedy_everywhere(model: &Arc<Model>, prompts: &[Vec<u32>]) -> Vec<Vec<Vec<u32>>> {
    let mut by_engine = Vec::new();
    for mut engine in common::naive_and_cpu(model) {
        let outs = prompts
            .iter()
            .map(|p| {
                let opts = GenerateOptions {
                    ubatch: 0,
                    speculative: None,
                    steps: p.len() + N_NEW - 1,
                    max_seq_len: 0,
                    trace: false,
                    special: false,
                };
                generate_tokens(engine.as_mut(), p, &opts, &mut Sampler::greedy(), |_| {})
                    .unwrap()
                    .tokens
            })
            .collect();
        by_engine.push(outs);
    }
    let kv = KvCacheConfig::new(model.config.kv_cache_groups(), 64, 16);
    let mut paged = PagedCpuEngine::new(model.clone(), kv).unwrap();
    let mut sched = Scheduler::new(SchedulerConfig::new(paged.kv_cache().clone(), 256)).unwrap();
    let requests: Vec<Request> = prompts
        .iter()
        .map(|p| Request {
            prompt: p.clone(),
            stop: StopConditions::max_tokens(N_NEW),
            arrival_step: 0,
            tenant: 0,
            resumes: false,
        })
        .collect();
    let report = drive(&mut paged, &mut sched, &requests, argmax, |_, _, _| {}).unwrap();
    by_engine.push(report.outputs.into_iter().map(|(t, _)| t).collect());
    by_engine
}

#[test]
fn stories260k_as_a_llama_gguf_generates_what_the_bin_generates() {
    let Some((model, tok)) = common::stories260k() else {
        return;
    };
    let path =
        std::env::temp_dir().join(format!("kvlab-cpu-llama-gguf-{}.gguf", std::process::id()));
    let bytes = kvlab_model::gguf_write::llama_gguf(&model, &tok)
        .unwrap()
        .build();
    std::fs::write(&path, bytes).unwrap();
    let (gguf, gguf_tok) = kvlab_model::load_gguf(&path).unwrap();
    let _ = std::fs::remove_file(&path);
    let prompts: Vec<Vec<u32>> = PROMPTS.iter().map(|p| tok.encode(p, true, false)).collect();
    for (p, ids) in PROMPTS.iter().zip(&prompts) {
        assert_eq!(&gguf_tok.encode(p, true, false), ids, "{p:?}");
    }
    let from_bin = greedy_everywhere(&model, &prompts);
    let from_gguf = greedy_everywhere(&Arc::new(gguf), &prompts);
    for (engine, (a, b)) in ["naive", "cpu", "cpu-paged"]
        .iter()
        .zip(from_bin.iter().zip(&from_gguf))
    {
        for (i, (x, y)) in a.iter().zip(b).enumerate() {
            // generate_tokens stops at the model's stop ids (BOS for the .bin, EOS for the GGUF):
            // compare up to where the shorter one stopped.
            let n = x.len().min(y.len());
            assert!(n > 0, "{engine}, prompt {i}: nothing generated");
            assert_eq!(x[..n], y[..n], "{engine}, prompt {i}");
        }
    }
    // All three engines agree with each other too.
    assert_eq!(from_gguf[2][0][..8], from_gguf[0][0][..8]);
}

//! Speculative decoding behind the server: with prompt lookup or a draft model proposing each
//! decode's draft tokens, every concurrent greedy request still gets exactly the cpu engine's
//! plain greedy text, the drafts show in `/metrics`, and the pool ends free.

// Test code may unwrap: a failed unwrap is a failed test (clippy.toml allows it in #[test]
// functions; this covers the helpers too).
#![allow(clippy::unwrap_used)]

mod common;

use std::sync::Arc;

use common::{cpu_greedy, stories260k};
use futures_util::future::join_all;
use kvlab_cpu::CpuEngine;
use kvlab_cpu::paged::PagedCpuEngine;
use kvlab_model::{DraftModel, Drafter, Model, NgramProposer, Proposer, Speculative, Tokenizer};
use kvlab_paged::{KvCacheConfig, SchedulerConfig};
use kvlab_serve::{AppState, EngineParts, Executor, spawn_engine};
use serde_json::json;

/// Prompts that repeat themselves (prompt lookup finds guesses) and prompts that do not.
const PROMPTS: [&str; 6] = [
    "Once upon a time, there was a little girl",
    "Tom said: the dog is big. Tom said: the dog is big. Tom said: the dog",
    "The sun was",
    "Lily and Ben went to the park. They saw a big dog with a red ball and they wanted to play",
    "one two three one two three one two three one two",
    "She",
];

/// Builds the drafter on the engine thread, for sequences of `max_model_len` positions.
type MakeDrafter = fn(&Arc<Model>, usize) -> Drafter;

fn ngram(_: &Arc<Model>, max_model_len: usize) -> Drafter {
    Drafter::new(
        Speculative::ngram(NgramProposer::default(), 4),
        max_model_len,
    )
}

/// The target's first 3 of 5 layers as its draft: cheap, and agreeing with it often but not
/// always.
fn early_exit(model: &Arc<Model>, max_model_len: usize) -> Drafter {
    let draft = Arc::new(model.early_exit(3).unwrap());
    let vocab = draft.config.vocab_size;
    let engine = Box::new(CpuEngine::new(draft));
    let spec = Speculative {
        proposer: Proposer::Draft(DraftModel::new(engine, vocab).unwrap()),
        num_speculative_tokens: 3,
    };
    Drafter::new(spec, max_model_len)
}

/// Starts a server whose decodes check the drafts of `make`'s drafter; returns its base URL.
async fn start(model: &Arc<Model>, tok: &Arc<Tokenizer>, make: MakeDrafter) -> String {
    let max_model_len = model.config.max_seq_len;
    let m = model.clone();
    let engine = spawn_engine(
        move || {
            let kv = KvCacheConfig::new(m.config.kv_cache_groups(), 8 * max_model_len / 16, 16);
            let e = PagedCpuEngine::new(m.clone(), kv.clone()).map_err(|e| e.to_string())?;
            Ok(EngineParts {
                executor: Box::new(e) as Executor,
                // A budget below some prompts: drafts share steps with prompt chunks.
                config: SchedulerConfig {
                    max_num_batched_tokens: 32,
                    ..SchedulerConfig::new(kv, max_model_len)
                },
                drafter: Some(make(&m, max_model_len)),
            })
        },
        "stories260K",
        model.config.stop_ids.clone(),
    )
    .unwrap();
    let state = Arc::new(AppState::new(engine, tok.clone(), "stories260K".into(), 64));
    let (addr, _) = common::listen(state, std::future::pending()).await;
    format!("http://{addr}")
}

async fn complete(url: &str, prompt: &str, max_tokens: usize) -> String {
    let body = json!({"prompt": prompt, "max_tokens": max_tokens, "temperature": 0});
    let (status, v) = common::post(url, &body).await;
    assert_eq!(status, 200, "{v}");
    v["choices"][0]["text"].as_str().unwrap().to_string()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn speculating_servers_answer_every_request_with_its_plain_greedy_text() {
    let Some((model, tok)) = stories260k() else {
        return;
    };
    for (name, make) in [("ngram", ngram as MakeDrafter), ("draft_model", early_exit)] {
        let url = start(&model, &tok, make).await;
        // Every prompt twice at once (the second hits the first's cached prefix).
        let asks: Vec<(&str, usize)> = (PROMPTS.iter().chain(&PROMPTS))
            .zip([40, 64, 17, 50, 64, 33].iter().cycle())
            .map(|(p, &n)| (*p, n))
            .collect();
        let texts = join_all(asks.iter().map(|&(p, n)| complete(&url, p, n))).await;
        for ((p, n), text) in asks.iter().zip(&texts) {
            assert_eq!(text, &cpu_greedy(&model, &tok, p, *n), "{name}: {p:?}");
        }
        let drafted = common::metric(&url, "vllm:spec_decode_num_draft_tokens_total").await;
        let kept = common::metric(&url, "vllm:spec_decode_num_accepted_tokens_total").await;
        assert!(drafted > 0.0 && kept > 0.0, "{name}: {kept} of {drafted}");
        assert!(
            kept < drafted,
            "{name}: some drafts are rejected and rolled back"
        );
        common::assert_pool_free(&url, 0, 200).await;
    }
}

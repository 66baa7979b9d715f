//! What the server tests share: stories260K (shipped with kvlab, so found on a fresh clone; a
//! missing file is a loud skip, or a failure under `KVLAB_REQUIRE_MODELS=1`), the cpu engine's
//! greedy text as the reference, and the check that the pool is free once requests end.
#![allow(dead_code)]
// Test code may unwrap: a failed unwrap is a failed test (clippy.toml allows it in #[test]
// functions; this covers the helpers too).
#![allow(clippy::unwrap_used)]

use std::sync::Arc;
use std::time::Duration;

use kvlab_cpu::CpuEngine;
use kvlab_model::tokenizer::Utf8Stream;
use kvlab_model::{GenerateOptions, Model, Sampler, Tokenizer, generate_tokens};
use serde_json::Value;

/// The shipped stories260K checkpoint and its tokenizer, or `None` after the loud skip.
pub fn stories260k() -> Option<(Arc<Model>, Arc<Tokenizer>)> {
    let file = kvlab_model::registry::test_model_file;
    let (Some(bin), Some(tok)) = (file("stories260K.bin"), file("tok512.bin")) else {
        return None;
    };
    let (model, tok) = kvlab_model::registry::load_llama2c(&bin, Some(&tok)).unwrap();
    Some((Arc::new(model), Arc::new(tok.unwrap())))
}

/// The cpu engine's greedy continuation of `prompt` (exactly `max_tokens` tokens), as text: an
/// independent reference for what the server streams.
pub fn cpu_greedy(model: &Arc<Model>, tok: &Tokenizer, prompt: &str, max_tokens: usize) -> String {
    let ids = tok.encode(prompt, true, false);
    let mut engine = CpuEngine::new(model.clone());
    // run.c's count: positions computed, prompt included; the last position's token is
    // emitted without being computed, so `max_tokens` new tokens need one position fewer.
    let opts = GenerateOptions {
        ubatch: 0,
        speculative: None,
        steps: ids.len() + max_tokens - 1,
        max_seq_len: 0,
        trace: false,
        special: false,
    };
    let g = generate_tokens(&mut engine, &ids, &opts, &mut Sampler::greedy(), |_| {}).unwrap();
    assert_eq!(g.tokens.len(), max_tokens);
    let mut utf8 = Utf8Stream::default();
    let mut prev = *ids.last().unwrap();
    let mut text = String::new();
    for &t in &g.tokens {
        if !model.config.stop_ids.contains(&t) {
            text.push_str(&utf8.push(&tok.decode(prev, t, false)));
        }
        prev = t;
    }
    text + &utf8.finish()
}

/// Serves `state`'s router on a free port of 127.0.0.1 until `shutdown`; its address and the
/// server's task.
pub async fn listen(
    state: Arc<kvlab_serve::AppState>,
    shutdown: impl Future<Output = ()> + Send + 'static,
) -> (
    std::net::SocketAddr,
    tokio::task::JoinHandle<std::io::Result<()>>,
) {
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    let router = kvlab_serve::router(state, kvlab_serve::DEFAULT_BODY_LIMIT);
    (
        addr,
        tokio::spawn(kvlab_serve::serve(listener, router, shutdown)),
    )
}

/// `/health`'s answer.
pub async fn health(url: &str) -> Value {
    reqwest::get(format!("{url}/health"))
        .await
        .unwrap()
        .json()
        .await
        .unwrap()
}

/// Polls `/health` every `every`, at most `polls` times, until `done` says so: the last answer,
/// and whether `done` said so.
pub async fn poll_health(
    url: &str,
    polls: usize,
    every: Duration,
    done: impl Fn(&Value) -> bool,
) -> (Value, bool) {
    let mut h = Value::Null;
    for _ in 0..polls {
        h = health(url).await;
        if done(&h) {
            return (h, true);
        }
        tokio::time::sleep(every).await;
    }
    (h, false)
}

/// Whether `/health`'s answer `h` shows an idle pool: no block in use, no request running or
/// pending.
pub fn idle(h: &Value) -> bool {
    h["num_blocks_used"] == 0 && h["num_requests_running"] == 0 && h["num_requests_pending"] == 0
}

/// Polls `/health` every 20 ms, at most `polls` times, until no block is in use, no request is
/// running or pending, and `aborted` sequences were aborted because their receiver closed (a
/// client gone, a stop string); returns the last health answer.
pub async fn assert_pool_free(url: &str, aborted: u64, polls: usize) -> Value {
    let every = Duration::from_millis(20);
    let (h, free) = poll_health(url, polls, every, |h| {
        idle(h) && h["num_requests_aborted"] == aborted
    })
    .await;
    assert!(
        free,
        "after {polls} polls the pool is not free, or not after {aborted} aborts: {h}"
    );
    assert_eq!(h["num_blocks_free"], h["num_blocks_total"], "{h}");
    h
}

/// The value of the metric line starting with `name` on `/metrics` (a counter or a gauge).
pub async fn metric(url: &str, name: &str) -> f64 {
    let text = reqwest::get(format!("{url}/metrics"))
        .await
        .unwrap()
        .text()
        .await
        .unwrap();
    text.lines()
        .find(|l| l.starts_with(name))
        .and_then(|l| l.split_whitespace().last())
        .and_then(|v| v.parse().ok())
        .unwrap_or_else(|| panic!("no {name} in\n{text}"))
}

/// POSTs `body` to `/v1/completions`; the status and the JSON answer.
pub async fn post(url: &str, body: &Value) -> (u16, Value) {
    let r = reqwest::Client::new()
        .post(format!("{url}/v1/completions"))
        .json(body)
        .send()
        .await
        .unwrap();
    (r.status().as_u16(), r.json().await.unwrap())
}

/// POSTs a streamed `body` to `/v1/completions`; the `data:` payloads of its events, in order.
pub async fn sse_data(url: &str, body: &Value) -> Vec<String> {
    let text = reqwest::Client::new()
        .post(format!("{url}/v1/completions"))
        .json(body)
        .send()
        .await
        .unwrap()
        .text()
        .await
        .unwrap();
    text.lines()
        .filter_map(|l| l.strip_prefix("data: "))
        .map(String::from)
        .collect()
}

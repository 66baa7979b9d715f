//! The server on an ephemeral loopback port over stories260K on the cpu-paged engine, driven by
//! an HTTP client: greedy text equals the cpu engine's, streaming equals non-streaming, stop
//! strings cut the text, bad input gets OpenAI's error shape (and 429 past the waiting bound),
//! `/metrics` speaks Prometheus with vLLM's names, and the pool is fully free once every request
//! is done, a client that disconnected mid-stream included; an API key guards every route, and
//! a shutdown lets the open requests finish; the live page's `/pool` shows who holds which block
//! while requests run.

// Test code may unwrap: a failed unwrap is a failed test (clippy.toml allows it in #[test]
// functions; this covers the helpers too).
#![allow(clippy::unwrap_used)]

mod common;

use std::sync::Arc;
use std::time::Duration;

use common::{cpu_greedy, stories260k};
use futures_util::StreamExt;
use kvlab_cpu::paged::PagedCpuEngine;
use kvlab_model::{Model, Tokenizer};
use kvlab_paged::{KvCacheConfig, ModelInput, SchedulerConfig, StepExecutor};
use kvlab_serve::{
    AppState, DEFAULT_BODY_LIMIT, EngineParts, Executor, PrefixIsolation, spawn_engine,
};
use serde_json::{Value, json};

const PROMPT: &str = "Once upon a time, there was a little girl";

/// The paged engine, slowed to at least 2 ms a step: stories260K is so fast that a 300-token
/// story could end before a disconnecting client is noticed.
struct Slowed(PagedCpuEngine);

impl StepExecutor for Slowed {
    type Error = kvlab_model::Error;

    fn execute(&mut self, input: &ModelInput) -> Result<Vec<Vec<f32>>, Self::Error> {
        std::thread::sleep(Duration::from_millis(2));
        self.0.execute(input)
    }
}

/// Starts a server; returns its base URL.
async fn start(model: &Arc<Model>, tok: &Arc<Tokenizer>, max_waiting: usize) -> String {
    start_with(model, tok, max_waiting, |s| s, std::future::pending())
        .await
        .0
}

/// Starts a server whose handler state `configure` sets up (an API key, prefix isolation) that
/// stops when `shutdown` completes; returns its base URL and the serving task.
async fn start_with(
    model: &Arc<Model>,
    tok: &Arc<Tokenizer>,
    max_waiting: usize,
    configure: impl FnOnce(AppState) -> AppState,
    shutdown: impl std::future::Future<Output = ()> + Send + 'static,
) -> (String, tokio::task::JoinHandle<std::io::Result<()>>) {
    let max_model_len = model.config.max_seq_len;
    let m = model.clone();
    let engine = spawn_engine(
        move || {
            let kv = KvCacheConfig::new(m.config.kv_cache_groups(), 4 * max_model_len / 16, 16);
            let e = PagedCpuEngine::new(m, kv.clone()).map_err(|e| e.to_string())?;
            Ok(EngineParts {
                executor: Box::new(Slowed(e)) as Executor,
                config: SchedulerConfig::new(kv, max_model_len),
                drafter: None,
            })
        },
        "stories260K",
        model.config.stop_ids.clone(),
    )
    .unwrap();
    let state = Arc::new(configure(AppState::new(
        engine,
        tok.clone(),
        "stories260K".into(),
        max_waiting,
    )));
    let (addr, task) = common::listen(state, shutdown).await;
    (format!("http://{addr}"), task)
}

async fn post(url: &str, body: Value) -> (u16, Value) {
    common::post(url, &body).await
}

/// [`common::assert_pool_free`] for up to 4 s.
async fn assert_pool_free(url: &str, aborted: u64) {
    common::assert_pool_free(url, aborted, 200).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn completions_match_the_cpu_engine_stream_and_free_the_pool() {
    let Some((model, tok)) = stories260k() else {
        return;
    };
    let url = start(&model, &tok, 64).await;
    let expected = cpu_greedy(&model, &tok, PROMPT, 40);
    assert!(!expected.is_empty());

    let (status, v) = post(
        &url,
        json!({"model": "stories260K", "prompt": PROMPT, "max_tokens": 40, "temperature": 0}),
    )
    .await;
    assert_eq!(status, 200, "{v}");
    assert_eq!(v["choices"][0]["text"], expected.as_str());
    assert_eq!(v["usage"]["completion_tokens"], 40);
    assert_eq!(
        v["usage"]["prompt_tokens"],
        tok.encode(PROMPT, true, false).len()
    );
    assert_eq!(v["choices"][0]["finish_reason"], "length");
    // OpenAI's `user` names the tenant (for --tenant-quota); it changes no token.
    let (status, v) = post(
        &url,
        json!({"prompt": PROMPT, "max_tokens": 40, "temperature": 0, "user": "alice"}),
    )
    .await;
    assert_eq!(status, 200, "{v}");
    assert_eq!(v["choices"][0]["text"], expected.as_str());

    // Streaming: the chunks' text joined equals the whole, and the stream ends with [DONE].
    let stream = json!({"prompt": PROMPT, "max_tokens": 40, "temperature": 0, "stream": true});
    let data = common::sse_data(&url, &stream).await;
    assert_eq!(data.last().map(String::as_str), Some("[DONE]"));
    let mut streamed = String::new();
    for d in &data[..data.len() - 1] {
        let c: Value = serde_json::from_str(d).unwrap();
        streamed.push_str(c["choices"][0]["text"].as_str().unwrap());
    }
    assert_eq!(streamed, expected);

    // A stop string cuts the text just before it (and aborts the sequence, which would run on
    // for 300 more tokens).
    let cut = &expected[..expected.len() / 2];
    let stop = expected[cut.len()..].chars().take(3).collect::<String>();
    let (status, v) = post(
        &url,
        json!({"prompt": PROMPT, "max_tokens": 400, "temperature": 0, "stop": [stop]}),
    )
    .await;
    assert_eq!(status, 200, "{v}");
    let text = v["choices"][0]["text"].as_str().unwrap();
    assert!(
        expected.starts_with(text) && text.len() <= cut.len(),
        "{text:?}"
    );
    assert_eq!(v["choices"][0]["finish_reason"], "stop");

    // A client that disconnects mid-stream: its sequence is aborted and its blocks freed. (The
    // greedy story goes on for over 300 tokens before its EOS, so it is still running when the
    // client leaves after the first chunk.)
    let mut chunks = reqwest::Client::new()
        .post(format!("{url}/v1/completions"))
        .json(&json!({"prompt": PROMPT, "max_tokens": 450, "temperature": 0, "stream": true}))
        .send()
        .await
        .unwrap()
        .bytes_stream();
    chunks.next().await.unwrap().unwrap();
    drop(chunks);
    // Two aborts: the stop-string request's (its handler closed its receiver) and this one.
    assert_pool_free(&url, 2).await;

    // Prometheus text with vLLM's names, idle now.
    let metrics = reqwest::get(format!("{url}/metrics"))
        .await
        .unwrap()
        .text()
        .await
        .unwrap();
    for line in [
        "vllm:num_requests_running{model_name=\"stories260K\"} 0",
        "vllm:num_requests_waiting{model_name=\"stories260K\"} 0",
        "vllm:kv_cache_usage_perc{model_name=\"stories260K\"} 0",
        "# TYPE vllm:prefix_cache_hits_total counter",
        "# TYPE vllm:time_to_first_token_seconds histogram",
        // The three requests that ran to their end (the 40-token ones; the other two were
        // cancelled by their handlers).
        "vllm:request_success_total{finished_reason=\"length\",model_name=\"stories260K\"} 3",
        "vllm:e2e_request_latency_seconds_count{model_name=\"stories260K\"} 3",
        "kvlab:requests_cancelled_total{model_name=\"stories260K\"} 2",
        // No tiers in this server: their counters exist, at 0.
        "kvlab:kv_tier_spills_total{model_name=\"stories260K\"} 0",
        "kvlab:kv_tier_drops_total{reason=\"full\",model_name=\"stories260K\"} 0",
        "kvlab:kv_tier_bytes{tier=\"disk\",model_name=\"stories260K\"} 0",
        "kvlab:kv_tier_offloads_total{model_name=\"stories260K\"} 0",
        "kvlab:prefix_cache_hits_by_tier_total{tier=\"host\",model_name=\"stories260K\"} 0",
        "kvlab:prefix_cache_hits_by_tier_total{tier=\"disk\",model_name=\"stories260K\"} 0",
    ] {
        assert!(
            metrics.lines().any(|l| l == line),
            "{line:?} not in\n{metrics}"
        );
    }
    // Counts that depend on the run: present, labelled by policy and by tier.
    for prefix in [
        "kvlab:evictions_total{policy=\"lru\",model_name=\"stories260K\"} ",
        "kvlab:prefix_cache_hits_by_tier_total{tier=\"pool\",model_name=\"stories260K\"} ",
    ] {
        assert!(
            metrics.lines().any(|l| l.starts_with(prefix)),
            "{prefix:?} not in\n{metrics}"
        );
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_prompt_of_token_ids_is_the_same_prompt_as_its_text() {
    let Some((model, tok)) = stories260k() else {
        return;
    };
    let url = start(&model, &tok, 64).await;
    let text = "Once upon a time, there was a cat";
    let ids = tok.encode_special(text, true, false);
    let greedy = |prompt: Value| json!({"prompt": prompt, "max_tokens": 12, "temperature": 0});
    let (s, by_text) = post(&url, greedy(json!(text))).await;
    assert_eq!(s, 200, "{by_text}");
    let (s, by_ids) = post(&url, greedy(json!(ids))).await;
    assert_eq!(s, 200, "{by_ids}");
    assert_eq!(by_ids["choices"][0]["text"], by_text["choices"][0]["text"]);
    assert_eq!(by_ids["usage"]["prompt_tokens"], ids.len());
    assert_pool_free(&url, 0).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn bad_input_gets_openai_errors() {
    let Some((model, tok)) = stories260k() else {
        return;
    };
    let url = start(&model, &tok, 64).await;
    let client = reqwest::Client::new();
    let check = |status: u16, v: &Value, want: u16| {
        assert_eq!(status, want, "{v}");
        let e = &v["error"];
        assert!(e["message"].is_string() && e["type"].is_string(), "{v}");
        assert!(e.get("param").is_some() && e.get("code").is_some(), "{v}");
    };
    let r = client
        .post(format!("{url}/v1/completions"))
        .header("content-type", "application/json")
        .body("{not json")
        .send()
        .await
        .unwrap();
    let s = r.status().as_u16();
    check(s, &r.json().await.unwrap(), 400);
    let (s, v) = post(&url, json!({"prompt": "x", "bogus": 1})).await;
    check(s, &v, 400);
    let (s, v) = post(&url, json!({"prompt": "x", "max_tokens": 0})).await;
    check(s, &v, 400);
    let (s, v) = post(&url, json!({"prompt": "x", "max_tokens": 100_000})).await;
    check(s, &v, 400);
    let (s, v) = post(&url, json!({"prompt": "a b c d ".repeat(400)})).await;
    check(s, &v, 400);
    let (s, v) = post(&url, json!({"prompt": "x", "n": 2})).await;
    check(s, &v, 400);
    let (s, v) = post(&url, json!({"prompt": "x", "temperature": -1})).await;
    check(s, &v, 400);
    let (s, v) = post(&url, json!({"prompt": [1, 512]})).await;
    check(s, &v, 400);
    assert!(
        v["error"]["message"]
            .as_str()
            .unwrap()
            .contains("token id 512")
    );
    let (s, v) = post(&url, json!({"prompt": []})).await;
    check(s, &v, 400);
    let (s, v) = post(&url, json!({"prompt": [1, -2]})).await;
    check(s, &v, 400);
    let r = client.get(format!("{url}/nope")).send().await.unwrap();
    let s = r.status().as_u16();
    check(s, &r.json().await.unwrap(), 404);
    let r = client
        .post(format!("{url}/v1/completions"))
        .body(vec![b'x'; DEFAULT_BODY_LIMIT + 1])
        .send()
        .await
        .unwrap();
    let s = r.status().as_u16();
    check(s, &r.json().await.unwrap(), 413);
    let models: Value = reqwest::get(format!("{url}/v1/models"))
        .await
        .unwrap()
        .json()
        .await
        .unwrap();
    assert_eq!(models["data"][0]["id"], "stories260K");
    let r = client
        .post(format!("{url}/v1/chat/completions"))
        .json(&json!({"messages": [{"role": "user", "content": "hi"}]}))
        .send()
        .await
        .unwrap();
    let s = r.status().as_u16();
    let v: Value = r.json().await.unwrap();
    check(s, &v, 400);
    assert!(
        v["error"]["message"]
            .as_str()
            .unwrap()
            .contains("chat template")
    );
    let r = client
        .get(format!("{url}/v1/completions"))
        .send()
        .await
        .unwrap();
    let s = r.status().as_u16();
    check(s, &r.json().await.unwrap(), 405);
    assert_pool_free(&url, 0).await;

    // A bound of 0 waiting requests refuses every request with 429 and Retry-After.
    let full = start(&model, &tok, 0).await;
    let r = client
        .post(format!("{full}/v1/completions"))
        .json(&json!({"prompt": "x"}))
        .send()
        .await
        .unwrap();
    assert_eq!(r.status().as_u16(), 429);
    assert!(r.headers().get("retry-after").is_some());
}

/// With `--api-key`, every route wants `Authorization: Bearer <key>` (401 in OpenAI's shape
/// otherwise); on shutdown the server stops accepting but a completion in flight streams to its
/// end.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn api_key_and_graceful_shutdown() {
    let Some((model, tok)) = stories260k() else {
        return;
    };
    let (stop, stopped) = tokio::sync::oneshot::channel::<()>();
    let shutdown = async move {
        let _ = stopped.await;
    };
    let with_key = |s: AppState| s.with_api_key(Some("sekrit".into()));
    let (url, task) = start_with(&model, &tok, 64, with_key, shutdown).await;
    let client = reqwest::Client::new();
    for auth in [None, Some("Bearer wrong"), Some("sekrit")] {
        let mut r = client.get(format!("{url}/health"));
        if let Some(a) = auth {
            r = r.header("authorization", a);
        }
        let r = r.send().await.unwrap();
        assert_eq!(r.status().as_u16(), 401, "{auth:?}");
        let v: Value = r.json().await.unwrap();
        assert!(v["error"]["message"].is_string(), "{v}");
    }
    let r = client
        .get(format!("{url}/health"))
        .bearer_auth("sekrit")
        .send()
        .await
        .unwrap();
    assert_eq!(r.status().as_u16(), 200);

    // A stream in flight when the shutdown comes still runs to its [DONE].
    let mut chunks = client
        .post(format!("{url}/v1/completions"))
        .bearer_auth("sekrit")
        .json(&json!({"prompt": PROMPT, "max_tokens": 40, "temperature": 0, "stream": true}))
        .send()
        .await
        .unwrap()
        .bytes_stream();
    let mut body = String::from_utf8(chunks.next().await.unwrap().unwrap().to_vec()).unwrap();
    stop.send(()).unwrap();
    while let Some(c) = chunks.next().await {
        body.push_str(std::str::from_utf8(&c.unwrap()).unwrap());
    }
    assert!(body.trim_end().ends_with("data: [DONE]"), "{body}");
    let served = tokio::time::timeout(Duration::from_secs(10), task).await;
    assert!(
        matches!(served, Ok(Ok(Ok(())))),
        "the server did not stop: {served:?}"
    );
    assert!(
        client.get(format!("{url}/health")).send().await.is_err(),
        "a stopped server still answers"
    );
}

/// Reads `/pool` until `ok` holds for it (the engine publishes its view at most every 20 ms).
async fn pool_until(url: &str, what: &str, ok: impl Fn(&Value) -> bool) -> Value {
    let mut v = Value::Null;
    for _ in 0..500 {
        v = reqwest::get(format!("{url}/pool"))
            .await
            .unwrap()
            .json()
            .await
            .unwrap();
        if ok(&v) {
            return v;
        }
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    panic!("/pool never showed {what}: {v}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn live_page_shows_the_pool_and_shared_prefix_blocks() {
    let Some((model, tok)) = stories260k() else {
        return;
    };
    let url = start(&model, &tok, 64).await;
    let page = reqwest::get(format!("{url}/")).await.unwrap();
    assert_eq!(page.status(), 200);
    assert!(page.text().await.unwrap().contains("fetch(\"pool\")"));

    // Idle: every block free, no sequence.
    let idle = pool_until(&url, "an idle pool", |v| {
        v["metrics"]["num_blocks_total"] != 0
    })
    .await;
    let blocks = idle["groups"][0]["blocks"].as_array().unwrap();
    assert_eq!(blocks.len(), idle["metrics"]["num_blocks_total"]);
    assert!(blocks.iter().all(|b| b["state"] == "free"), "{idle}");
    assert_eq!(idle["sequences"], json!([]));
    assert_eq!(idle["model"], "stories260K");
    // Each key once: a JSON object with a key twice is read differently by different parsers.
    let raw = reqwest::get(format!("{url}/pool"))
        .await
        .unwrap()
        .text()
        .await
        .unwrap();
    assert_eq!(raw.matches("\"max_model_len\"").count(), 1, "{raw}");
    assert_eq!(idle["max_model_len"], model.config.max_seq_len);

    // Two long streams whose prompts share more than two full blocks of 16 tokens: while they
    // run, the view shows both sequences and blocks held by both (the prefix cache), each
    // block's holders matching the sequences' block tables.
    let opening = "Once upon a time, there was a little girl named Lily. She loved to play outside in the park with her friends and her dog";
    assert!(tok.encode(opening, true, false).len() > 32);
    let mut streams = Vec::new();
    for end in [" Max.", " Spot."] {
        let mut s = reqwest::Client::new()
            .post(format!("{url}/v1/completions"))
            .json(&json!({"prompt": format!("{opening}{end}"), "max_tokens": 200, "temperature": 0, "stream": true}))
            .send()
            .await
            .unwrap()
            .bytes_stream();
        s.next().await.unwrap().unwrap();
        streams.push(s);
    }
    let busy = pool_until(&url, "two running sequences sharing blocks", |v| {
        v["sequences"].as_array().unwrap().len() == 2
            && v["groups"][0]["blocks"]
                .as_array()
                .unwrap()
                .iter()
                .filter(|b| b["seqs"].as_array().is_some_and(|s| s.len() == 2))
                .count()
                >= 2
    })
    .await;
    for seq in busy["sequences"].as_array().unwrap() {
        assert_eq!(seq["status"], "running");
        for b in seq["block_tables"][0].as_array().unwrap() {
            let holders = &busy["groups"][0]["blocks"][b.as_u64().unwrap() as usize]["seqs"];
            assert!(
                holders.as_array().unwrap().contains(&seq["id"]),
                "block {b} of {} not held by it: {busy}",
                seq["id"]
            );
        }
    }
    assert!(busy["metrics"]["prefix_cache_hits"].as_u64().unwrap() >= 32);
    drop(streams);
    assert_pool_free(&url, 2).await;
    let after = pool_until(&url, "no sequence", |v| v["sequences"] == json!([])).await;
    assert!(
        after["groups"][0]["blocks"]
            .as_array()
            .unwrap()
            .iter()
            .any(|b| b["state"] == "cached"),
        "the shared prefix stays cached after both ended: {after}"
    );
}

/// `/v1/chat/completions` on a model with a chat template (tiny-qwen3's ChatML, a Hugging Face
/// folder written by transformers): the reply is the cpu engine's greedy run on the template's
/// render, as one `chat.completion` and as `chat.completion.chunk` deltas; a conversation the
/// template refuses, an empty one, or a prompt instead of messages get 400s.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn chat_completions_use_the_models_template() {
    let dir =
        std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../../fixtures/models/tiny-qwen3");
    let (model, tok, _) = kvlab_model::hf::load_hf_dir(&dir).unwrap();
    let (model, tok) = (Arc::new(model), Arc::new(tok));
    let url = start(&model, &tok, 16).await;
    let messages = json!([{"role": "user", "content": "Tell me a story."}]);
    // The reference: greedy on the rendered conversation's ids, 8 tokens.
    let rendered = tok
        .chat_template()
        .unwrap()
        .render(
            &[kvlab_model::chat::Message::new("user", "Tell me a story.")],
            true,
        )
        .unwrap();
    let ids = tok.encode_special(&rendered, false, false);
    let mut engine = kvlab_cpu::CpuEngine::new(model.clone());
    let opts = kvlab_model::GenerateOptions {
        ubatch: 0,
        speculative: None,
        steps: ids.len() + 8 - 1,
        max_seq_len: 0,
        trace: false,
        special: false,
    };
    let g = kvlab_model::generate_tokens(
        &mut engine,
        &ids,
        &opts,
        &mut kvlab_model::Sampler::greedy(),
        |_| {},
    )
    .unwrap();
    let mut utf8 = kvlab_model::tokenizer::Utf8Stream::default();
    let mut prev = *ids.last().unwrap();
    let mut want = String::new();
    for &t in &g.tokens {
        want += &utf8.push(&tok.decode(prev, t, false));
        prev = t;
    }
    want += &utf8.finish();

    let client = reqwest::Client::new();
    let chat = |body: Value| {
        client
            .post(format!("{url}/v1/chat/completions"))
            .json(&body)
            .send()
    };
    let r = chat(json!({"messages": messages, "max_tokens": 8, "temperature": 0}))
        .await
        .unwrap();
    assert_eq!(r.status().as_u16(), 200);
    let v: Value = r.json().await.unwrap();
    assert_eq!(v["object"], "chat.completion");
    assert_eq!(v["choices"][0]["message"]["role"], "assistant");
    assert_eq!(v["choices"][0]["message"]["content"], want.as_str());
    assert_eq!(v["usage"]["prompt_tokens"], ids.len());

    let r = chat(json!({"messages": messages, "max_tokens": 8, "temperature": 0, "stream": true}))
        .await
        .unwrap();
    let body = r.text().await.unwrap();
    let chunks: Vec<Value> = body
        .lines()
        .filter_map(|l| l.strip_prefix("data: "))
        .filter(|d| *d != "[DONE]")
        .map(|d| serde_json::from_str(d).unwrap())
        .collect();
    assert!(body.trim_end().ends_with("data: [DONE]"));
    assert_eq!(chunks[0]["choices"][0]["delta"]["role"], "assistant");
    let streamed: String = chunks
        .iter()
        .filter_map(|c| c["choices"][0]["delta"]["content"].as_str())
        .collect();
    assert_eq!(streamed, want);
    assert!(
        chunks
            .iter()
            .all(|c| c["object"] == "chat.completion.chunk")
    );
    assert_eq!(
        chunks.last().unwrap()["choices"][0]["finish_reason"],
        "length"
    );

    for (body, needle) in [
        (json!({"messages": []}), "messages is empty"),
        (json!({"prompt": "x"}), "takes messages"),
        (
            json!({"messages": [{"role": "user", "content": [{"type": "text"}]}]}),
            "invalid request body",
        ),
    ] {
        let r = chat(body.clone()).await.unwrap();
        assert_eq!(r.status().as_u16(), 400, "{body}");
        let v: Value = r.json().await.unwrap();
        assert!(
            v["error"]["message"].as_str().unwrap().contains(needle),
            "{v}"
        );
    }
    let r = client
        .post(format!("{url}/v1/completions"))
        .json(&json!({"messages": messages}))
        .send()
        .await
        .unwrap();
    assert_eq!(r.status().as_u16(), 400);
    assert_pool_free(&url, 0).await;
}

/// A random Hugging Face model whose greedy text emits `<s>` mid-generation (prompt 3 of
/// `fixtures/hf/tiny-mistral.json`): the server leaves special tokens out, as transformers'
/// `decode(.., skip_special_tokens=True)` and vLLM do, and prints them with vLLM's
/// `"skip_special_tokens": false`.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn special_tokens_are_left_out_of_the_text_unless_asked() {
    let root = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../../fixtures");
    let (model, tok, _) = kvlab_model::hf::load_hf_dir(&root.join("models/tiny-mistral")).unwrap();
    let record: Value =
        serde_json::from_str(&std::fs::read_to_string(root.join("hf/tiny-mistral.json")).unwrap())
            .unwrap();
    let case = &record["cases"][3];
    let printable = |key: &str| kvlab_model::fixtures::as_streamed(case[key].as_str().unwrap());
    let (skipped, shown) = (
        printable("generated_text_skip_special"),
        printable("generated_text"),
    );
    assert!(shown.contains("<s>") && !skipped.contains("<s>"));
    let n = case["generated_ids"].as_array().unwrap().len();
    let url = start(&Arc::new(model), &Arc::new(tok), 64).await;
    let prompt = case["prompt"].as_str().unwrap();
    for (extra, want) in [
        (json!({}), &skipped),
        (json!({"skip_special_tokens": true}), &skipped),
        (json!({"skip_special_tokens": false}), &shown),
    ] {
        let mut body = json!({"prompt": prompt, "max_tokens": n, "temperature": 0});
        body.as_object_mut()
            .unwrap()
            .extend(extra.as_object().unwrap().clone());
        let (status, v) = post(&url, body).await;
        assert_eq!(status, 200, "{v}");
        assert_eq!(v["choices"][0]["text"].as_str().unwrap(), want, "{extra}");
    }
}

/// `usage.prompt_tokens_details.cached_tokens` counts the prompt tokens the prefix cache served:
/// none the first time, every full block before the last prompt token the second time (the
/// last token is always computed); a stream with `stream_options.include_usage` ends with a
/// chunk of no choices carrying the same usage, and one without it has no such chunk.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn usage_reports_the_prompt_tokens_the_prefix_cache_served() {
    let Some((model, tok)) = stories260k() else {
        return;
    };
    let url = start(&model, &tok, 64).await;
    let prompt = LONG_PROMPT;
    let n = tok.encode(prompt, true, false).len();
    assert!(
        n > 33,
        "{n} tokens: the prompt should span more than two blocks of 16"
    );
    let ask = json!({"prompt": prompt, "max_tokens": 8, "temperature": 0});
    let (status, first) = post(&url, ask.clone()).await;
    assert_eq!(status, 200, "{first}");
    assert_eq!(first["usage"]["prompt_tokens_details"]["cached_tokens"], 0);
    let (_, again) = post(&url, ask).await;
    let cached = (n - 1) / 16 * 16;
    assert_eq!(
        again["usage"]["prompt_tokens_details"]["cached_tokens"],
        cached
    );
    assert_eq!(again["choices"][0]["text"], first["choices"][0]["text"]);

    let stream = |usage: bool| {
        let mut body = json!({"prompt": prompt, "max_tokens": 8, "temperature": 0, "stream": true});
        if usage {
            body["stream_options"] = json!({"include_usage": true});
        }
        let url = url.clone();
        async move { common::sse_data(&url, &body).await }
    };
    let data = stream(true).await;
    assert_eq!(data.last().map(String::as_str), Some("[DONE]"));
    let last: Value = serde_json::from_str(&data[data.len() - 2]).unwrap();
    assert_eq!(last["choices"], json!([]), "{last}");
    assert_eq!(last["usage"]["completion_tokens"], 8);
    assert_eq!(last["usage"]["prompt_tokens"], n);
    assert_eq!(
        last["usage"]["prompt_tokens_details"]["cached_tokens"],
        cached
    );
    let data = stream(false).await;
    assert!(
        data.iter().all(|d| !d.contains("\"usage\"")),
        "no usage without include_usage"
    );
    assert_pool_free(&url, 0).await;
}

/// A prompt of more than two blocks of 16 tokens, for the cached-token counts.
const LONG_PROMPT: &str = "Lily and Ben went to the park. They saw a big dog with a red ball and \
                           they wanted to play with it. The dog ran to them and";

/// The prompt tokens the prefix cache served for `body` (with `LONG_PROMPT` added).
async fn cached(url: &str, mut body: Value) -> Value {
    body["prompt"] = json!(LONG_PROMPT);
    body["max_tokens"] = json!(4);
    body["temperature"] = json!(0);
    let (status, v) = post(url, body).await;
    assert_eq!(status, 200, "{v}");
    v["usage"]["prompt_tokens_details"]["cached_tokens"].clone()
}

/// `--prefix-isolation`: by `cache_salt` (the default), requests share cached blocks only with
/// the same salt; by `user`, only within one user, so another user's identical prompt is
/// computed in full (no faster first token to time) while the same user still hits; with
/// `none`, everyone shares and a `cache_salt` is refused.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn prefix_isolation_keeps_tenants_from_sharing_cached_blocks() {
    let Some((model, tok)) = stories260k() else {
        return;
    };
    let full = (tok.encode(LONG_PROMPT, true, false).len() - 1) / 16 * 16;
    assert!(full >= 32);
    let run = |isolation| {
        start_with(
            &model,
            &tok,
            64,
            move |s| s.with_prefix_isolation(isolation),
            std::future::pending(),
        )
    };

    let (url, _) = run(PrefixIsolation::Salt).await;
    assert_eq!(cached(&url, json!({})).await, 0);
    assert_eq!(
        cached(&url, json!({})).await,
        full,
        "unsalted requests share"
    );
    assert_eq!(cached(&url, json!({"cache_salt": "a"})).await, 0);
    assert_eq!(cached(&url, json!({"cache_salt": "b"})).await, 0);
    assert_eq!(cached(&url, json!({"cache_salt": "a"})).await, full);
    let (status, v) = post(&url, json!({"prompt": "x", "cache_salt": ""})).await;
    assert_eq!(
        (status, v["error"]["param"].clone()),
        (400, json!("cache_salt"))
    );

    let (url, _) = run(PrefixIsolation::User).await;
    assert_eq!(cached(&url, json!({"user": "alice"})).await, 0);
    let hits_before = common::metric(&url, "vllm:prefix_cache_hits_total").await;
    assert_eq!(
        cached(&url, json!({"user": "bob"})).await,
        0,
        "bob never hits alice's blocks"
    );
    assert_eq!(
        cached(&url, json!({})).await,
        0,
        "nor does an anonymous request"
    );
    assert_eq!(
        common::metric(&url, "vllm:prefix_cache_hits_total").await,
        hits_before
    );
    assert_eq!(
        cached(&url, json!({"user": "alice"})).await,
        full,
        "alice hits her own"
    );
    assert_eq!(cached(&url, json!({"user": "bob"})).await, full);

    let (url, _) = run(PrefixIsolation::None).await;
    assert_eq!(cached(&url, json!({"user": "alice"})).await, 0);
    assert_eq!(cached(&url, json!({"user": "bob"})).await, full);
    let (status, v) = post(&url, json!({"prompt": "x", "cache_salt": "a"})).await;
    assert_eq!(
        (status, v["error"]["param"].clone()),
        (400, json!("cache_salt"))
    );
}

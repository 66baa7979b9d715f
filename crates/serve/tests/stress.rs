//! Robustness of `kvlab serve` over stories260K on the cpu-paged engine: 1,000 connections at
//! once (each served with its solo greedy text or refused in OpenAI's error shape), slow clients
//! (a stream read slowly, a body that trickles in or stalls until the read timeouts end it, a
//! client that leaves before its
//! answer), and bad bodies (invalid UTF-8, prompts of the wrong type, the body limit, bad
//! sampling values). After each, the pool is fully free and a fresh request is served correctly.
//!
//! The raw-socket clients use tokio's `try_read`/`try_write` (the workspace's tokio has no
//! `io-util`), and send `Connection: close` so a response ends at EOF.

// Test code may unwrap: a failed unwrap is a failed test (clippy.toml allows it in #[test]
// functions; this covers the helpers too).
#![allow(clippy::unwrap_used)]

mod common;

use std::net::SocketAddr;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

use common::{cpu_greedy, stories260k};
use futures_util::future::join_all;
use kvlab_cpu::paged::PagedCpuEngine;
use kvlab_model::{Model, Tokenizer};
use kvlab_paged::{KvCacheConfig, ModelInput, SchedulerConfig, StepExecutor};
use kvlab_serve::{
    AppState, BODY_READ_TIMEOUT, DEFAULT_BODY_LIMIT, EngineParts, Executor, HEADER_READ_TIMEOUT,
    spawn_engine,
};
use serde_json::{Value, json};
use tokio::net::{TcpSocket, TcpStream};
use tokio::time::timeout;

const PROMPTS: [&str; 6] = [
    "Once upon a time, there was a little girl",
    "Lily and Ben went to the park. They saw a big dog with a red ball and they wanted to play",
    "The sun was",
    "Tom had a toy car",
    "One day, a little bird named Tweet flew over the tall green trees to find her mom",
    "She",
];

/// The paged engine, slowed by `delay` a step, and held before its step while `hold` is set
/// (so a test can fill the waiting queue deterministically).
struct Gated {
    engine: PagedCpuEngine,
    delay: Duration,
    hold: Arc<AtomicBool>,
}

impl StepExecutor for Gated {
    type Error = kvlab_model::Error;

    fn execute(&mut self, input: &ModelInput) -> Result<Vec<Vec<f32>>, Self::Error> {
        while self.hold.load(Ordering::Acquire) {
            std::thread::sleep(Duration::from_millis(1));
        }
        std::thread::sleep(self.delay);
        self.engine.execute(input)
    }
}

struct Server {
    url: String,
    addr: SocketAddr,
    hold: Arc<AtomicBool>,
}

/// Starts a server (pool: four full contexts, 16-token blocks; chunked prefill at 24 tokens a
/// step) on an ephemeral loopback port.
async fn start(
    model: &Arc<Model>,
    tok: &Arc<Tokenizer>,
    max_waiting: usize,
    delay: Duration,
) -> Server {
    let max_model_len = model.config.max_seq_len;
    let (m, hold) = (model.clone(), Arc::new(AtomicBool::new(false)));
    let h = hold.clone();
    let engine = spawn_engine(
        move || {
            let kv = KvCacheConfig::new(m.config.kv_cache_groups(), 4 * max_model_len / 16, 16);
            let engine = PagedCpuEngine::new(m, kv.clone()).map_err(|e| e.to_string())?;
            let gated = Gated {
                engine,
                delay,
                hold: h,
            };
            // Chunked prefill under a budget below most prompts: every flood mixes decodes with
            // prompt chunks, and each text must still be its solo run's.
            let config = SchedulerConfig {
                max_num_batched_tokens: 24,
                ..SchedulerConfig::new(kv, max_model_len)
            };
            Ok(EngineParts {
                executor: Box::new(gated) as Executor,
                config,
                drafter: None,
            })
        },
        "stories260K",
        model.config.stop_ids.clone(),
    )
    .unwrap();
    let state = Arc::new(AppState::new(
        engine,
        tok.clone(),
        "stories260K".into(),
        max_waiting,
    ));
    let (addr, _) = common::listen(state, std::future::pending()).await;
    Server {
        url: format!("http://{addr}"),
        addr,
        hold,
    }
}

/// A greedy completion request.
fn greedy(prompt: &str, max_tokens: usize, stream: bool) -> Value {
    json!({"prompt": prompt, "max_tokens": max_tokens, "temperature": 0, "stream": stream})
}

/// POSTs `body` to `path`; returns the status and the JSON answer.
async fn post(url: &str, path: &str, body: impl Into<reqwest::Body>) -> (u16, Value) {
    let r = reqwest::Client::new()
        .post(format!("{url}{path}"))
        .header("content-type", "application/json")
        .body(body)
        .send()
        .await
        .unwrap();
    let status = r.status().as_u16();
    let text = r.text().await.unwrap();
    let v = serde_json::from_str(&text)
        .unwrap_or_else(|e| panic!("{status}: not JSON ({e}): {text:?}"));
    (status, v)
}

/// The text of a 200 non-streaming completion.
async fn complete(url: &str, body: &Value) -> String {
    let (status, v) = post(url, "/v1/completions", body.to_string()).await;
    assert_eq!(status, 200, "{v}");
    v["choices"][0]["text"].as_str().unwrap().to_string()
}

/// `v` is OpenAI's error shape `{"error": {"message", "type", "param", "code"}}` with `want`.
fn assert_openai_error(status: u16, v: &Value, want: u16) {
    assert_eq!(status, want, "{v}");
    assert_eq!(v.as_object().map(|o| o.len()), Some(1), "{v}");
    let e = &v["error"];
    assert!(e["message"].as_str().is_some_and(|m| !m.is_empty()), "{v}");
    assert!(e["type"].as_str().is_some_and(|t| !t.is_empty()), "{v}");
    assert!(
        e.get("param").is_some_and(|p| p.is_null() || p.is_string()),
        "{v}"
    );
    assert!(e.get("code").is_some(), "{v}");
}

/// [`common::assert_pool_free`] for up to 10 s.
async fn assert_pool_free(url: &str, aborted: u64) -> Value {
    common::assert_pool_free(url, aborted, 500).await
}

// ---- raw HTTP/1.1 over a socket ----

fn raw_request(path: &str, body: &[u8]) -> Vec<u8> {
    let head = format!(
        "POST {path} HTTP/1.1\r\nHost: kvlab\r\nContent-Type: application/json\r\nContent-Length: {}\r\nConnection: close\r\n\r\n",
        body.len()
    );
    [head.as_bytes(), body].concat()
}

async fn write_all(s: &TcpStream, mut buf: &[u8]) -> std::io::Result<()> {
    while !buf.is_empty() {
        s.writable().await?;
        match s.try_write(buf) {
            Ok(n) => buf = &buf[n..],
            Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => {}
            Err(e) => return Err(e),
        }
    }
    Ok(())
}

/// Up to `max` bytes; empty at EOF.
async fn read_some(s: &TcpStream, max: usize) -> std::io::Result<Vec<u8>> {
    let mut buf = vec![0; max];
    loop {
        s.readable().await?;
        match s.try_read(&mut buf) {
            Ok(n) => {
                buf.truncate(n);
                return Ok(buf);
            }
            Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => {}
            Err(e) => return Err(e),
        }
    }
}

async fn read_to_end(s: &TcpStream) -> Vec<u8> {
    let mut all = Vec::new();
    loop {
        let got = read_some(s, 1 << 16).await.unwrap();
        if got.is_empty() {
            return all;
        }
        all.extend_from_slice(&got);
    }
}

/// A whole HTTP/1.1 response: status, headers (names lower-cased) and body (de-chunked).
struct RawResponse {
    status: u16,
    headers: Vec<(String, String)>,
    body: Vec<u8>,
}

impl RawResponse {
    fn parse(bytes: &[u8]) -> RawResponse {
        let what = || String::from_utf8_lossy(bytes).into_owned();
        let end = bytes
            .windows(4)
            .position(|w| w == b"\r\n\r\n")
            .unwrap_or_else(|| panic!("no end of headers: {:?}", what()));
        let head = std::str::from_utf8(&bytes[..end]).unwrap();
        let mut lines = head.split("\r\n");
        let status = lines
            .next()
            .unwrap()
            .split(' ')
            .nth(1)
            .unwrap()
            .parse()
            .unwrap();
        let headers: Vec<(String, String)> = lines
            .map(|l| {
                let (k, v) = l.split_once(':').unwrap();
                (k.trim().to_ascii_lowercase(), v.trim().to_string())
            })
            .collect();
        let mut r = RawResponse {
            status,
            headers,
            body: Vec::new(),
        };
        let mut rest = &bytes[end + 4..];
        if r.header("transfer-encoding") == Some("chunked") {
            loop {
                let eol = rest.windows(2).position(|w| w == b"\r\n").unwrap();
                let size = std::str::from_utf8(&rest[..eol]).unwrap();
                let size =
                    usize::from_str_radix(size.split(';').next().unwrap().trim(), 16).unwrap();
                rest = &rest[eol + 2..];
                if size == 0 {
                    break;
                }
                r.body.extend_from_slice(&rest[..size]);
                assert_eq!(&rest[size..size + 2], b"\r\n", "{:?}", what());
                rest = &rest[size + 2..];
            }
        } else {
            let len: usize = r.header("content-length").unwrap().parse().unwrap();
            assert_eq!(rest.len(), len, "{:?}", what());
            r.body = rest.to_vec();
        }
        r
    }

    fn header(&self, name: &str) -> Option<&str> {
        self.headers
            .iter()
            .find(|(k, _)| k == name)
            .map(|(_, v)| v.as_str())
    }

    fn json(&self) -> Value {
        serde_json::from_slice(&self.body)
            .unwrap_or_else(|e| panic!("{e}: {:?}", String::from_utf8_lossy(&self.body)))
    }

    /// The text of a 200 completion, JSON or SSE (which must end with a finish reason, then
    /// `[DONE]`).
    fn completion_text(&self, stream: bool) -> String {
        assert_eq!(
            self.status,
            200,
            "{:?}",
            String::from_utf8_lossy(&self.body)
        );
        if !stream {
            return self.json()["choices"][0]["text"]
                .as_str()
                .unwrap()
                .to_string();
        }
        let body = std::str::from_utf8(&self.body).unwrap();
        let data: Vec<&str> = body
            .lines()
            .filter_map(|l| l.strip_prefix("data: "))
            .collect();
        assert_eq!(data.last(), Some(&"[DONE]"), "{body}");
        let chunks: Vec<Value> = data[..data.len() - 1]
            .iter()
            .map(|d| serde_json::from_str(d).unwrap())
            .collect();
        let last = chunks.last().unwrap();
        assert!(last["choices"][0]["finish_reason"].is_string(), "{body}");
        chunks
            .iter()
            .map(|c| {
                c["choices"][0]["text"]
                    .as_str()
                    .unwrap_or_else(|| panic!("{body}"))
            })
            .collect()
    }
}

/// The soft limit on open files, where the system says (Linux).
fn open_files_limit() -> Option<u64> {
    let limits = std::fs::read_to_string("/proc/self/limits").ok()?;
    let line = limits.lines().find(|l| l.starts_with("Max open files"))?;
    line.split_whitespace().nth(3)?.parse().ok()
}

const CONNECTIONS: usize = 1000;
const MAX_WAITING: usize = 16;
const MAX_TOKENS: [usize; 3] = [4, 8, 16];

/// Request `i` of a flood: its prompt, `max_tokens` and whether it streams, mixed over `i`.
fn flood_request(i: usize) -> (usize, usize, bool) {
    let n = PROMPTS.len();
    (
        i % n,
        MAX_TOKENS[(i / (2 * n)) % 3],
        (i / n).is_multiple_of(2),
    )
}

/// Opens `CONNECTIONS` connections, then sends request `i` on connection `i` and reads each
/// answer to its end. With `hold`, the engine is held until every answer but `MAX_WAITING` has
/// come back (while it is held no accepted request can end, so those are all refusals).
async fn flood(server: &Server, hold: bool) -> Vec<(usize, RawResponse)> {
    server.hold.store(hold, Ordering::Release);
    let conns = join_all((0..CONNECTIONS).map(|_| TcpStream::connect(server.addr))).await;
    let (tx, mut rx) = tokio::sync::mpsc::unbounded_channel();
    for (i, conn) in conns.into_iter().enumerate() {
        let (conn, tx) = (conn.unwrap(), tx.clone());
        tokio::spawn(async move {
            let (p, max_tokens, stream) = flood_request(i);
            let body = greedy(PROMPTS[p], max_tokens, stream).to_string();
            write_all(&conn, &raw_request("/v1/completions", body.as_bytes()))
                .await
                .unwrap();
            let _ = tx.send((i, RawResponse::parse(&read_to_end(&conn).await)));
        });
    }
    drop(tx);
    let mut results = Vec::new();
    loop {
        if hold && results.len() == CONNECTIONS - MAX_WAITING {
            let h = common::health(&server.url).await;
            assert_eq!(h["num_requests_pending"], MAX_WAITING, "{h}");
            server.hold.store(false, Ordering::Release);
        }
        let next = timeout(Duration::from_secs(60), rx.recv()).await;
        match next.unwrap_or_else(|_| panic!("only {} answers after 60 s", results.len())) {
            Some(r) => results.push(r),
            None => break,
        }
    }
    assert_eq!(results.len(), CONNECTIONS, "some clients failed");
    results
}

/// Checks every answer of a flood: 200 with exactly its solo text, or 429 (with Retry-After)
/// or 503 in OpenAI's shape. Returns how many were served.
fn check_flood(results: &[(usize, RawResponse)], solo: &[Vec<String>]) -> usize {
    let mut served = 0;
    for (i, r) in results {
        let (p, max_tokens, stream) = flood_request(*i);
        if r.status == 200 {
            let want = &solo[p][MAX_TOKENS.iter().position(|&m| m == max_tokens).unwrap()];
            assert_eq!(&r.completion_text(stream), want, "request {i}");
            served += 1;
            continue;
        }
        assert_openai_error(r.status, &r.json(), if r.status == 503 { 503 } else { 429 });
        if r.status == 429 {
            let retry = r.header("retry-after").expect("429 without Retry-After");
            assert!(retry.parse::<u64>().is_ok(), "Retry-After: {retry}");
        }
    }
    served
}

/// 1,000 connections open at once, each with a completion request (streamed or not, 4 to 16
/// tokens, six prompts). First with the engine held: exactly `MAX_WAITING` are accepted and
/// each gets exactly its solo greedy text, every other one a 429 with Retry-After in OpenAI's
/// shape. Then with the engine running (requests joining and leaving the batch): every answer
/// is its solo text or a refusal. Each time the pool ends free and the server answers again.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_thousand_connections_get_their_solo_text_or_a_clear_429() {
    let Some((model, tok)) = stories260k() else {
        return;
    };
    if let Some(limit) = open_files_limit() {
        assert!(
            limit >= 2 * CONNECTIONS as u64 + 200,
            "this test opens {CONNECTIONS} connections (both ends in this process): raise the open-files limit (ulimit -n) above {limit}"
        );
    }
    let server = start(&model, &tok, MAX_WAITING, Duration::ZERO).await;
    let mut solo = Vec::new();
    for p in PROMPTS {
        let mut texts = Vec::new();
        for m in MAX_TOKENS {
            texts.push(complete(&server.url, &greedy(p, m, false)).await);
        }
        solo.push(texts);
    }
    assert_eq!(
        solo[0][2],
        cpu_greedy(&model, &tok, PROMPTS[0], MAX_TOKENS[2])
    );

    let started = Instant::now();
    let served = check_flood(&flood(&server, true).await, &solo);
    assert_eq!(served, MAX_WAITING);
    eprintln!(
        "engine held: {served} served of {CONNECTIONS}, in {:?}",
        started.elapsed()
    );
    assert_pool_free(&server.url, 0).await;
    assert_eq!(
        complete(&server.url, &greedy(PROMPTS[1], 8, false)).await,
        solo[1][1]
    );

    let started = Instant::now();
    let served = check_flood(&flood(&server, false).await, &solo);
    assert!(served >= MAX_WAITING, "{served}");
    eprintln!(
        "engine free: {served} served of {CONNECTIONS}, in {:?}",
        started.elapsed()
    );
    assert_pool_free(&server.url, 0).await;
    assert_eq!(
        complete(&server.url, &greedy(PROMPTS[4], 16, false)).await,
        solo[4][2]
    );
}

/// A stream read slowly through a small receive buffer still arrives whole, and while it is
/// stalled other requests are served promptly and correctly.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_slow_reader_gets_its_whole_stream_while_others_are_served() {
    let Some((model, tok)) = stories260k() else {
        return;
    };
    let server = start(&model, &tok, 64, Duration::from_millis(1)).await;
    let long = complete(&server.url, &greedy(PROMPTS[0], 200, false)).await;
    let mut others = Vec::new();
    for p in &PROMPTS[1..4] {
        others.push(complete(&server.url, &greedy(p, 16, false)).await);
    }

    let socket = TcpSocket::new_v4().unwrap();
    socket.set_recv_buffer_size(2048).unwrap();
    let conn = socket.connect(server.addr).await.unwrap();
    let body = greedy(PROMPTS[0], 200, true).to_string();
    write_all(&conn, &raw_request("/v1/completions", body.as_bytes()))
        .await
        .unwrap();
    let mut got = Vec::new();
    let mut stalled = false;
    loop {
        let piece = timeout(Duration::from_secs(30), read_some(&conn, 256))
            .await
            .expect("the stream stopped")
            .unwrap();
        if piece.is_empty() {
            break;
        }
        got.extend_from_slice(&piece);
        if !stalled && got.len() > 1024 {
            // Mid-stream, the reader stops reading while others come and go.
            stalled = true;
            for (p, want) in PROMPTS[1..4].iter().zip(&others) {
                let t = Instant::now();
                assert_eq!(&complete(&server.url, &greedy(p, 16, false)).await, want);
                assert!(t.elapsed() < Duration::from_secs(10), "{:?}", t.elapsed());
            }
        }
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
    assert!(stalled, "the stream was shorter than 1 KiB");
    assert_eq!(RawResponse::parse(&got).completion_text(true), long);
    assert_pool_free(&server.url, 0).await;
}

/// A body that stalls after its headers, or headers that stall, hold up nobody; a body that
/// trickles in a byte at a time is served; when the stalled clients leave, nothing leaks.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn stalled_and_trickling_uploads_hold_up_nobody() {
    let Some((model, tok)) = stories260k() else {
        return;
    };
    let server = start(&model, &tok, 64, Duration::ZERO).await;
    let mut want = Vec::new();
    for p in &PROMPTS[..3] {
        want.push(complete(&server.url, &greedy(p, 12, false)).await);
    }

    let body = greedy(PROMPTS[0], 12, false).to_string();
    let request = raw_request("/v1/completions", body.as_bytes());
    let partial_body = TcpStream::connect(server.addr).await.unwrap();
    write_all(&partial_body, &request[..request.len() - body.len() / 2])
        .await
        .unwrap();
    let partial_head = TcpStream::connect(server.addr).await.unwrap();
    write_all(&partial_head, &request[..30]).await.unwrap();

    for (p, w) in PROMPTS[..3].iter().zip(&want) {
        assert_eq!(&complete(&server.url, &greedy(p, 12, false)).await, w);
    }
    // A trickled upload, a byte every 2 ms, is served like any other.
    let trickle = TcpStream::connect(server.addr).await.unwrap();
    for b in request.chunks(1) {
        write_all(&trickle, b).await.unwrap();
        tokio::time::sleep(Duration::from_millis(2)).await;
    }
    let r = timeout(Duration::from_secs(30), read_to_end(&trickle))
        .await
        .unwrap();
    assert_eq!(RawResponse::parse(&r).completion_text(false), want[0]);

    // The stalled ones got nothing, and are still waiting (not closed).
    for s in [&partial_body, &partial_head] {
        let r = timeout(Duration::from_millis(200), read_some(s, 64)).await;
        assert!(r.is_err(), "a stalled client was answered: {r:?}");
    }
    let h = assert_pool_free(&server.url, 0).await;
    // Past the read timeouts the server gives up on both: a 408 in OpenAI's shape for the
    // stalled body, a closed connection for the stalled headers.
    let slack = Duration::from_secs(5);
    let r = timeout(BODY_READ_TIMEOUT + slack, read_to_end(&partial_body))
        .await
        .expect("the stalled body was never timed out");
    let r = RawResponse::parse(&r);
    assert_openai_error(r.status, &r.json(), 408);
    timeout(HEADER_READ_TIMEOUT + slack, read_to_end(&partial_head))
        .await
        .expect("the stalled headers were never timed out");
    drop((partial_body, partial_head));
    tokio::time::sleep(Duration::from_millis(100)).await;
    let after = assert_pool_free(&server.url, 0).await;
    assert_eq!(h["num_blocks_free"], after["num_blocks_free"]);
    assert_eq!(
        &complete(&server.url, &greedy(PROMPTS[1], 12, false)).await,
        &want[1]
    );
}

/// The `vllm:prefix_cache_queries_total` counter of `/metrics`: prompt tokens the scheduler has
/// looked up, so it moves once a request reached a step.
async fn prefix_queries(url: &str) -> u64 {
    common::metric(url, "vllm:prefix_cache_queries_total").await as u64
}

/// A client that leaves right after sending a non-streaming request: its sequence is aborted
/// (not run to its end) and its blocks freed.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_client_that_leaves_before_its_answer_frees_its_blocks() {
    let Some((model, tok)) = stories260k() else {
        return;
    };
    // 5 ms a step: 400 tokens would take at least 2 s.
    let server = start(&model, &tok, 64, Duration::from_millis(5)).await;
    let body = greedy(PROMPTS[0], 400, false).to_string();
    let request = raw_request("/v1/completions", body.as_bytes());

    // Leaves once its sequence is running.
    let conn = TcpStream::connect(server.addr).await.unwrap();
    write_all(&conn, &request).await.unwrap();
    let (_, running) = common::poll_health(&server.url, 500, Duration::from_millis(5), |h| {
        h["num_requests_running"] == 1 && h["num_blocks_used"].as_u64() > Some(0)
    })
    .await;
    assert!(running, "the request never ran");
    let left = Instant::now();
    drop(conn);
    // One abort: its sequence did not run on to its 400th token.
    assert_pool_free(&server.url, 1).await;
    eprintln!(
        "a client gone while running: pool free {:?} later",
        left.elapsed()
    );

    // Leaves at once, maybe before the server read its request: either it never reached the
    // engine, or it was aborted there; never run to its end.
    let queries = prefix_queries(&server.url).await;
    let conn = TcpStream::connect(server.addr).await.unwrap();
    write_all(&conn, &request).await.unwrap();
    drop(conn);
    tokio::time::sleep(Duration::from_millis(200)).await;
    let every = Duration::from_millis(20);
    let (h, _) = common::poll_health(&server.url, 500, every, common::idle).await;
    // Aborted whether it reached a step or not; if it reached one, it must have been aborted.
    let reached = prefix_queries(&server.url).await > queries;
    let aborted = h["num_requests_aborted"].as_u64().unwrap();
    assert!(aborted == 2 || (aborted == 1 && !reached), "{h}");
    assert_pool_free(&server.url, aborted).await;
    eprintln!("a client gone at once: its request reached the engine: {reached}; {h}");
    assert_eq!(
        complete(&server.url, &greedy(PROMPTS[2], 8, false)).await,
        cpu_greedy(&model, &tok, PROMPTS[2], 8)
    );
}

/// Bad bodies get a clear 4xx in OpenAI's shape; after them the pool is free and a normal
/// request is served correctly.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn bad_bodies_get_clear_errors_and_leave_nothing_behind() {
    let Some((model, tok)) = stories260k() else {
        return;
    };
    let server = start(&model, &tok, 64, Duration::ZERO).await;
    let url = server.url.as_str();
    let bad = async |path: &str, body: Vec<u8>, want: u16, param: Option<&str>| {
        let (status, v) = post(url, path, body.clone()).await;
        assert_openai_error(status, &v, want);
        if let Some(p) = param {
            assert_eq!(v["error"]["param"], p, "{v}");
        }
        let shown = String::from_utf8_lossy(&body[..body.len().min(80)]).into_owned();
        eprintln!("{status} for {shown:?}: {}", v["error"]["message"]);
    };
    let completions = async |body: Value, want: u16, param: Option<&str>| {
        bad(
            "/v1/completions",
            body.to_string().into_bytes(),
            want,
            param,
        )
        .await;
    };

    // Not JSON, or not UTF-8.
    for body in [
        &b"{\"prompt\": \"Once \xff\xfe upon\", \"max_tokens\": 4}"[..],
        b"{\"prompt\": \"x\"}\xff",
        b"\xef\xbb\xbf{\"prompt\": \"x\"}",
        b"",
        b"[]",
        b"null",
        b"\"Once upon a time\"",
        b"{\"prompt\": \"x\", \"prompt\": \"y\"}",
    ] {
        bad("/v1/completions", body.to_vec(), 400, None).await;
    }
    let deep = format!(
        "{{\"prompt\": \"x\", \"stop\": {}{}}}",
        "[".repeat(100_000),
        "]".repeat(100_000)
    );
    bad("/v1/completions", deep.into_bytes(), 400, None).await;

    // A prompt that is neither text nor token ids (a list of strings: a batch, which kvlab does
    // not take), token ids outside the vocabulary or negative, or none.
    for prompt in [
        json!(42),
        json!([1, 2, 1_000_000]),
        json!([1, -2]),
        json!([]),
        json!(["a", "b"]),
        json!(null),
        json!({"text": "x"}),
    ] {
        completions(json!({"prompt": prompt, "max_tokens": 4}), 400, None).await;
    }
    completions(json!({"max_tokens": 4}), 400, None).await;

    // Counts and sampling values out of range.
    for max_tokens in ["-1", "1.5", "\"4\"", "18446744073709551616", "1e3"] {
        let body = format!("{{\"prompt\": \"x\", \"max_tokens\": {max_tokens}}}");
        bad("/v1/completions", body.into_bytes(), 400, None).await;
    }
    for t in [json!(-0.5), json!(-1e-9), json!(1e39), json!(1000)] {
        completions(
            json!({"prompt": "x", "temperature": t}),
            400,
            Some("temperature"),
        )
        .await;
    }
    bad(
        "/v1/completions",
        b"{\"prompt\": \"x\", \"temperature\": 1e999}".to_vec(),
        400,
        None,
    )
    .await;
    completions(json!({"prompt": "x", "temperature": "NaN"}), 400, None).await;
    for p in [json!(0), json!(-0.1), json!(1.5)] {
        completions(json!({"prompt": "x", "top_p": p}), 400, Some("top_p")).await;
    }
    completions(json!({"prompt": "x", "n": 0}), 400, Some("n")).await;
    completions(json!({"prompt": "x", "seed": -1}), 400, None).await;
    completions(
        json!({"prompt": "x", "stop": ["a", "b", "c", "d", "e"]}),
        400,
        Some("stop"),
    )
    .await;
    completions(json!({"prompt": "x", "stop": 5}), 400, None).await;
    completions(json!({"prompt": "x", "stream": "yes"}), 400, None).await;
    completions(json!({"prompt": "x", "model": "gpt-4"}), 404, Some("model")).await;

    // A prompt far beyond the context, just under the body limit, is refused (quickly).
    let t = Instant::now();
    completions(
        json!({"prompt": "a".repeat(DEFAULT_BODY_LIMIT - 100)}),
        400,
        Some("prompt"),
    )
    .await;
    assert!(t.elapsed() < Duration::from_secs(10), "{:?}", t.elapsed());

    // The body limit: exactly at it is served, one byte over is 413 (also when chunked).
    let padded = |len: usize| {
        let mut b = greedy(PROMPTS[2], 4, false).to_string().into_bytes();
        b.resize(len, b' ');
        b
    };
    let (status, v) = post(url, "/v1/completions", padded(DEFAULT_BODY_LIMIT)).await;
    assert_eq!(status, 200, "{v}");
    assert_eq!(
        v["choices"][0]["text"],
        cpu_greedy(&model, &tok, PROMPTS[2], 4)
    );
    bad("/v1/completions", padded(DEFAULT_BODY_LIMIT + 1), 413, None).await;
    let chunks: Vec<Result<Vec<u8>, std::io::Error>> = padded(DEFAULT_BODY_LIMIT + 1)
        .chunks(64 * 1024)
        .map(|c| Ok(c.to_vec()))
        .collect();
    let (status, v) = post(
        url,
        "/v1/completions",
        reqwest::Body::wrap_stream(futures_util::stream::iter(chunks)),
    )
    .await;
    assert_openai_error(status, &v, 413);
    bad(
        "/v1/chat/completions",
        padded(DEFAULT_BODY_LIMIT + 1),
        413,
        None,
    )
    .await;

    // Chat: empty messages, or no JSON at all.
    bad(
        "/v1/chat/completions",
        br#"{"messages": []}"#.to_vec(),
        400,
        None,
    )
    .await;
    bad("/v1/chat/completions", b"{not json".to_vec(), 400, None).await;

    // An empty prompt is BOS alone, served like any other; so are non-ASCII prompts.
    for prompt in ["", "héllo wörld 🙂 — ünïcode", "\u{0}\t\r\n"] {
        let (status, v) = post(url, "/v1/completions", greedy(prompt, 8, false).to_string()).await;
        assert_eq!(status, 200, "{prompt:?}: {v}");
        assert_eq!(
            v["usage"]["prompt_tokens"],
            tok.encode(prompt, true, false).len()
        );
        assert_eq!(
            v["choices"][0]["text"],
            cpu_greedy(&model, &tok, prompt, 8),
            "{prompt:?}"
        );
    }
    assert_eq!(tok.encode("", true, false).len(), 1);
    // Four stop strings are allowed.
    let (status, v) = post(
        url,
        "/v1/completions",
        json!({"prompt": "x", "max_tokens": 4, "temperature": 0, "stop": ["zq", "qz", "xx", "yy"]})
            .to_string(),
    )
    .await;
    assert_eq!(status, 200, "{v}");

    assert_pool_free(url, 0).await;
    assert_eq!(
        complete(url, &greedy(PROMPTS[0], 16, false)).await,
        cpu_greedy(&model, &tok, PROMPTS[0], 16)
    );
    assert_pool_free(url, 0).await;
}

/// `max_tokens` near `usize::MAX` must be a 400 like any other `max_tokens` beyond the context.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_huge_max_tokens_is_a_400() {
    let Some((model, tok)) = stories260k() else {
        return;
    };
    let server = start(&model, &tok, 64, Duration::ZERO).await;
    for max_tokens in [u64::MAX, u64::MAX - 5, 1 << 63] {
        let r = reqwest::Client::new()
            .post(format!("{}/v1/completions", server.url))
            .json(&json!({"prompt": "x", "max_tokens": max_tokens, "temperature": 0}))
            .send()
            .await;
        let r = r.unwrap_or_else(|e| panic!("max_tokens {max_tokens}: no response: {e}"));
        let status = r.status().as_u16();
        let v: Value = r.json().await.unwrap();
        assert_openai_error(status, &v, 400);
        assert_eq!(v["error"]["param"], "max_tokens", "{v}");
    }
    assert_pool_free(&server.url, 0).await;
}

/// A `Content-Length` over the body limit is refused from the headers alone, before any of
/// the body is waited for.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_oversized_content_length_is_refused_at_once() {
    let Some((model, tok)) = stories260k() else {
        return;
    };
    let server = start(&model, &tok, 64, Duration::ZERO).await;
    let head = format!(
        "POST /v1/completions HTTP/1.1\r\nHost: kvlab\r\nContent-Type: application/json\r\nContent-Length: {}\r\nConnection: close\r\n\r\n",
        4 * DEFAULT_BODY_LIMIT
    );
    let conn = TcpStream::connect(server.addr).await.unwrap();
    write_all(&conn, head.as_bytes()).await.unwrap();
    let r = timeout(Duration::from_secs(5), read_to_end(&conn))
        .await
        .expect("no answer without the body");
    let r = RawResponse::parse(&r);
    assert_openai_error(r.status, &r.json(), 413);
    assert_pool_free(&server.url, 0).await;
}

/// A body four times the limit, sent whole by an ordinary client, still gets its 413 to read:
/// the server answers at once and reads the rest away in the background instead of closing
/// the socket under the client's write (which a client sees as a broken pipe, not an answer).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_client_sending_a_huge_body_reads_its_413() {
    let Some((model, tok)) = stories260k() else {
        return;
    };
    let server = start(&model, &tok, 64, Duration::ZERO).await;
    for _ in 0..3 {
        let r = reqwest::Client::new()
            .post(format!("{}/v1/completions", server.url))
            .header("content-type", "application/json")
            .body(vec![b' '; 4 * DEFAULT_BODY_LIMIT])
            .send()
            .await
            .expect("the client could not read an answer");
        let status = r.status().as_u16();
        assert_openai_error(status, &r.json().await.unwrap(), 413);
    }
    assert_pool_free(&server.url, 0).await;
}

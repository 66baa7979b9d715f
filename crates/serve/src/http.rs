//! The routes: `GET /health`, `GET /v1/models`, `POST /v1/completions` (JSON or SSE),
//! `POST /v1/chat/completions` (messages through the model's chat template; a 400 for a model
//! without one), `GET /metrics`
//! (Prometheus text), the live pool page (`GET /`, data at `GET /pool`, in `page.rs`), and
//! OpenAI's error shape `{"error": {"message", "type", "param", "code"}}`
//! for every failure.

use std::convert::Infallible;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Instant, SystemTime, UNIX_EPOCH};

use axum::body::Bytes;
use axum::extract::rejection::BytesRejection;
use axum::extract::{DefaultBodyLimit, State};
use axum::http::{StatusCode, header};
use axum::response::sse::{Event, Sse};
use axum::response::{IntoResponse, Response};
use axum::routing::{get, post};
use axum::{Json, Router};
use futures_util::StreamExt;
use futures_util::stream::{self, Stream};
use kvlab_model::{Sampler, Tokenizer};
use serde::{Deserialize, Serialize};
use serde_json::json;
use tokio::sync::mpsc::UnboundedReceiver;

use crate::{Detokenizer, EngineHandle, GenerationRequest, SubmitError, TokenEvent};

/// Largest request body accepted, in bytes (1 MiB): far more than any prompt that fits a
/// context kvlab runs.
pub const DEFAULT_BODY_LIMIT: usize = 1 << 20;
/// `max_tokens` when a request leaves it out (OpenAI's default).
const DEFAULT_MAX_TOKENS: usize = 16;
/// Longest wait for a request's body once its headers are in.
pub const BODY_READ_TIMEOUT: std::time::Duration = std::time::Duration::from_secs(10);
/// Seconds a refused client is told to wait (`Retry-After`).
const RETRY_AFTER_S: &str = "1";

/// What every handler shares.
pub struct AppState {
    /// The engine thread's queue, counters and limits (max_model_len, stop tokens).
    pub engine: EngineHandle,
    /// Encodes prompts and decodes the streamed tokens.
    pub tokenizer: Arc<Tokenizer>,
    /// The name `/v1/models` lists and requests must use (or leave out).
    pub model_name: String,
    /// Most requests waiting for their first token before new ones get 429.
    pub max_waiting: usize,
    /// Completion ids are `cmpl-<n>`; also the default seed's source.
    next_id: AtomicU64,
    /// When set, every route wants `Authorization: Bearer <key>` (OpenAI's scheme).
    api_key: Option<String>,
    /// Which requests may share prefix-cache blocks (`--prefix-isolation`).
    pub(crate) prefix_isolation: PrefixIsolation,
    /// Token ids a prompt may hold: below both the tokenizer's and the model's vocabulary
    /// (an id the model has no embedding for would fail the whole step it is in).
    pub(crate) vocab_size: usize,
    /// Where `POST /slots/{id}?action=save|restore` keeps saved sessions (`--slot-save-path`),
    /// and the namespace they are written under and checked against (`None`: refused).
    pub(crate) slots: Option<(std::path::PathBuf, String)>,
}

/// Which requests share prefix-cache blocks (`kvlab serve --prefix-isolation`). A shared prefix
/// cache leaks through timing: a prompt that hits another's cached prefix gets its first token
/// sooner, which published attacks use to recover other users' prompts; a salt per request
/// (vLLM's `cache_salt`, mixed into the first block's key) keeps requests of different salts
/// from sharing anything.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum PrefixIsolation {
    /// Requests share with requests of the same `cache_salt` (vLLM's behaviour); requests
    /// without one share with each other.
    #[default]
    Salt,
    /// Requests share only with requests of the same OpenAI `user` (and `cache_salt`).
    User,
    /// Every request shares with every other; a `cache_salt` is refused rather than ignored.
    None,
}

impl std::str::FromStr for PrefixIsolation {
    type Err = String;

    fn from_str(s: &str) -> Result<Self, String> {
        match s {
            "salt" => Ok(PrefixIsolation::Salt),
            "user" => Ok(PrefixIsolation::User),
            "none" => Ok(PrefixIsolation::None),
            _ => Err(format!("{s:?}: expected user, salt or none")),
        }
    }
}

impl AppState {
    /// Handler state over a started engine.
    pub fn new(
        engine: EngineHandle,
        tokenizer: Arc<Tokenizer>,
        model_name: String,
        max_waiting: usize,
    ) -> AppState {
        let tokenizer_vocab = tokenizer.vocab_size();
        AppState {
            engine,
            tokenizer,
            model_name,
            max_waiting,
            next_id: AtomicU64::new(0),
            api_key: None,
            prefix_isolation: PrefixIsolation::default(),
            vocab_size: tokenizer_vocab,
            slots: None,
        }
    }

    /// Token-id prompts must also be below the model's vocabulary of `vocab_size` tokens.
    pub fn with_model_vocab(mut self, vocab_size: usize) -> AppState {
        self.vocab_size = self.vocab_size.min(vocab_size);
        self
    }

    /// Saves and restores sessions in a directory, under a namespace (what makes the blocks
    /// reusable: model files, weights, engine, KV dtype, block size); `None`: refused.
    pub fn with_slots(mut self, slots: Option<(std::path::PathBuf, String)>) -> AppState {
        self.slots = slots;
        self
    }

    /// Requires `Authorization: Bearer <key>` on every route (401 otherwise).
    pub fn with_api_key(mut self, key: Option<String>) -> AppState {
        self.api_key = key;
        self
    }

    /// Shares prefix-cache blocks as `isolation` says (default: by `cache_salt`).
    pub fn with_prefix_isolation(mut self, isolation: PrefixIsolation) -> AppState {
        self.prefix_isolation = isolation;
        self
    }
}

/// The router over `state`, with a body limit of `body_limit` bytes.
pub fn router(state: Arc<AppState>, body_limit: usize) -> Router {
    Router::new()
        .route("/health", get(health))
        .route("/v1/models", get(models))
        .route("/v1/completions", post(completions))
        .route("/v1/chat/completions", post(chat_completions))
        .route("/metrics", get(metrics))
        .route("/slots/{id}", post(crate::slots::slots))
        .route("/", get(crate::page::index))
        .route("/pool", get(crate::page::pool))
        .fallback(|| async {
            ApiError::new(StatusCode::NOT_FOUND, "not_found_error", "no such route")
        })
        .method_not_allowed_fallback(|| async {
            ApiError::new(
                StatusCode::METHOD_NOT_ALLOWED,
                "invalid_request_error",
                "method not allowed on this route",
            )
        })
        .layer(DefaultBodyLimit::max(body_limit))
        .layer(axum::middleware::from_fn_with_state(body_limit, read_body))
        .layer(axum::middleware::from_fn_with_state(
            state.clone(),
            require_api_key,
        ))
        .with_state(state)
}

/// 401 in OpenAI's shape unless the request carries the server's API key (when it has one).
async fn require_api_key(
    State(s): State<Arc<AppState>>,
    request: axum::extract::Request,
    next: axum::middleware::Next,
) -> Response {
    if let Some(key) = &s.api_key {
        let given = request
            .headers()
            .get(header::AUTHORIZATION)
            .and_then(|v| v.to_str().ok())
            .and_then(|v| v.strip_prefix("Bearer "));
        if !given.is_some_and(|g| same_bytes(g.as_bytes(), key.as_bytes())) {
            return ApiError::new(
                StatusCode::UNAUTHORIZED,
                "invalid_request_error",
                "missing or incorrect API key: send `Authorization: Bearer <key>`",
            )
            .into_response();
        }
    }
    next.run(request).await
}

/// Reads the whole body before the handler runs, so that a client cannot hold a request
/// open: 413 at once for a `Content-Length` over `limit` bytes, 413 once a chunked body passes
/// it, 408 if the body has not arrived within [`BODY_READ_TIMEOUT`].
///
/// After a 413 the rest of the body is read and dropped for up to [`LINGER`] in the background
/// (a "lingering close", as web servers do): a client still writing its body would otherwise
/// meet a closed socket before it reads the answer.
async fn read_body(
    State(limit): State<usize>,
    request: axum::extract::Request,
    next: axum::middleware::Next,
) -> Response {
    let too_large = |rest: axum::body::BodyDataStream| {
        tokio::spawn(linger(rest, limit));
        ApiError::new(
            StatusCode::PAYLOAD_TOO_LARGE,
            "invalid_request_error",
            format!("the request body is larger than {limit} bytes"),
        )
        .into_response()
    };
    let declared = request
        .headers()
        .get(header::CONTENT_LENGTH)
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.parse::<u64>().ok());
    let (parts, body) = request.into_parts();
    let mut stream = body.into_data_stream();
    if declared.is_some_and(|n| n > limit as u64) {
        return too_large(stream);
    }
    let mut bytes = Vec::new();
    let read = tokio::time::timeout(BODY_READ_TIMEOUT, async {
        while let Some(chunk) = stream.next().await {
            let chunk = chunk.map_err(|e| Some(e.to_string()))?;
            if bytes.len() + chunk.len() > limit {
                return Err(None::<String>);
            }
            bytes.extend_from_slice(&chunk);
        }
        Ok(())
    })
    .await;
    match read {
        Ok(Ok(())) => {}
        Ok(Err(None)) => return too_large(stream),
        Ok(Err(Some(e))) => {
            return ApiError::invalid(format!("reading the request body: {e}"), None)
                .into_response();
        }
        Err(_) => {
            return ApiError::new(
                StatusCode::REQUEST_TIMEOUT,
                "invalid_request_error",
                format!(
                    "the request body did not arrive within {} s",
                    BODY_READ_TIMEOUT.as_secs()
                ),
            )
            .into_response();
        }
    }
    next.run(axum::extract::Request::from_parts(
        parts,
        axum::body::Body::from(bytes),
    ))
    .await
}

/// How long, at most, the rest of a refused body is read and dropped.
const LINGER: std::time::Duration = std::time::Duration::from_secs(2);

/// Reads and drops what is left of a refused body, for at most [`LINGER`] and 16 × `limit`
/// bytes, then lets the connection close.
async fn linger(mut rest: axum::body::BodyDataStream, limit: usize) {
    let _ = tokio::time::timeout(LINGER, async {
        let mut dropped = 0usize;
        while let Some(Ok(chunk)) = rest.next().await {
            dropped += chunk.len();
            if dropped > limit.saturating_mul(16) {
                return;
            }
        }
    })
    .await;
}

/// a == b, in a time that depends on the lengths only (not on where they first differ).
fn same_bytes(a: &[u8], b: &[u8]) -> bool {
    a.len() == b.len() && a.iter().zip(b).fold(0u8, |d, (x, y)| d | (x ^ y)) == 0
}

/// An error in OpenAI's shape, with its status code.
#[derive(Debug)]
pub struct ApiError {
    status: StatusCode,
    kind: &'static str,
    message: String,
    param: Option<&'static str>,
    retry_after: bool,
}

/// A request the engine thread could not take: 429 with `Retry-After` when the queue is full,
/// 503 when the thread is gone.
impl From<SubmitError> for ApiError {
    fn from(e: SubmitError) -> ApiError {
        match e {
            SubmitError::QueueFull { .. } => ApiError {
                retry_after: true,
                ..ApiError::new(
                    StatusCode::TOO_MANY_REQUESTS,
                    "rate_limit_error",
                    e.to_string(),
                )
            },
            SubmitError::EngineGone => ApiError::new(
                StatusCode::SERVICE_UNAVAILABLE,
                "server_error",
                e.to_string(),
            ),
        }
    }
}

impl ApiError {
    pub(crate) fn new(
        status: StatusCode,
        kind: &'static str,
        message: impl Into<String>,
    ) -> ApiError {
        ApiError {
            status,
            kind,
            message: message.into(),
            param: None,
            retry_after: false,
        }
    }

    pub(crate) fn invalid(message: impl Into<String>, param: Option<&'static str>) -> ApiError {
        ApiError {
            param,
            ..ApiError::new(StatusCode::BAD_REQUEST, "invalid_request_error", message)
        }
    }
}

impl IntoResponse for ApiError {
    fn into_response(self) -> Response {
        let body = json!({"error": {
            "message": self.message,
            "type": self.kind,
            "param": self.param,
            "code": self.status.as_u16(),
        }});
        let mut r = (self.status, Json(body)).into_response();
        if self.retry_after {
            r.headers_mut().insert(
                header::RETRY_AFTER,
                header::HeaderValue::from_static(RETRY_AFTER_S),
            );
        }
        r
    }
}

/// Liveness plus the pool's state (`num_blocks_used == 0` when idle: no block leaked).
async fn health(State(s): State<Arc<AppState>>) -> Json<serde_json::Value> {
    let m = s.engine.shared().metrics();
    Json(json!({
        "status": "ok",
        "num_blocks_total": m.num_blocks_total,
        "num_blocks_used": m.num_blocks_used,
        "num_blocks_free": m.num_blocks_free,
        "num_requests_running": m.num_running,
        "num_requests_waiting": m.num_waiting,
        "num_requests_pending": s.engine.shared().pending(),
        "num_requests_aborted": s.engine.shared().aborted(),
    }))
}

async fn models(State(s): State<Arc<AppState>>) -> Json<serde_json::Value> {
    Json(json!({"object": "list", "data": [{
        "id": s.model_name,
        "object": "model",
        "created": 0,
        "owned_by": "kvlab",
        "max_model_len": s.engine.max_model_len(),
    }]}))
}

/// Prometheus' text format: the scheduler's gauges and counters as of the engine's last step,
/// and the requests' latency histograms (see `metrics.rs` for the names).
async fn metrics(State(s): State<Arc<AppState>>) -> Response {
    let shared = s.engine.shared();
    shared.prometheus().set_pending(shared.pending());
    (
        [(
            header::CONTENT_TYPE,
            "text/plain; version=0.0.4; charset=utf-8",
        )],
        shared.prometheus().render(),
    )
        .into_response()
}

/// `stop`: one string or a list of them.
#[derive(Deserialize)]
#[serde(untagged)]
enum StopField {
    One(String),
    Many(Vec<String>),
}

/// A completion's `prompt`: text, or token ids as OpenAI's API and vLLM also take them (sent to
/// the model as they are, no BOS added).
#[derive(Deserialize)]
#[serde(untagged)]
pub(crate) enum PromptField {
    Text(String),
    Tokens(Vec<u32>),
}

/// The fields of OpenAI's completion and chat completion requests kvlab implements; any other
/// field is refused. A completion has `prompt`, a chat completion `messages`.
#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct CompletionRequest {
    model: Option<String>,
    prompt: Option<PromptField>,
    messages: Option<Vec<kvlab_model::chat::Message>>,
    max_tokens: Option<usize>,
    temperature: Option<f32>,
    top_p: Option<f32>,
    seed: Option<u64>,
    stop: Option<StopField>,
    #[serde(default)]
    stream: bool,
    n: Option<u32>,
    /// OpenAI's end-user identifier: kvlab's tenant for prefix-cache quotas (`--tenant-quota`).
    user: Option<String>,
    /// vLLM's extension: leave special tokens (`<|im_end|>`, `<bos>`) out of the text; true
    /// when absent, as in vLLM (llama.cpp's server hides control tokens too).
    skip_special_tokens: Option<bool>,
    /// OpenAI's streaming options: `include_usage` adds a last chunk with the usage.
    stream_options: Option<StreamOptions>,
    /// vLLM's extension: the request shares prefix-cache blocks only with requests of the
    /// same salt (see [`PrefixIsolation`]).
    cache_salt: Option<String>,
}

/// OpenAI's `stream_options`.
#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct StreamOptions {
    include_usage: Option<bool>,
}

/// OpenAI's `usage`, with `prompt_tokens_details.cached_tokens`: the prompt tokens the prefix
/// cache served (from the pool or a tier below it), whose prefill was skipped.
#[derive(Serialize)]
struct Usage {
    prompt_tokens: usize,
    completion_tokens: usize,
    total_tokens: usize,
    prompt_tokens_details: PromptTokensDetails,
}

#[derive(Serialize)]
struct PromptTokensDetails {
    cached_tokens: usize,
}

/// A checked request, ready for the engine.
struct Prepared {
    prompt: Vec<u32>,
    max_tokens: usize,
    sampler: Sampler,
    stop: Vec<String>,
    stream: bool,
    /// Streamed with a last chunk carrying the usage (`stream_options.include_usage`).
    stream_usage: bool,
    tenant: kvlab_paged::Tenant,
    /// The prefix cache's salt for this request (0: none).
    cache_salt: u64,
    /// Print special tokens in the text (`skip_special_tokens: false`).
    special: bool,
}

/// Which OpenAI endpoint a request came to.
#[derive(Clone, Copy, PartialEq, Eq)]
enum Api {
    Completions,
    Chat,
}

/// The tokens of a `prompt`: token ids as they are (each checked against the vocabulary), text
/// encoded with a BOS (refused unencoded when even its lower bound exceeds `max_model_len`).
pub(crate) fn tokens_of(
    s: &AppState,
    prompt: &PromptField,
    max_model_len: usize,
) -> Result<Vec<u32>, ApiError> {
    match prompt {
        PromptField::Tokens(ids) => {
            let vocab = s.vocab_size;
            if let Some(&bad) = ids.iter().find(|&&t| t as usize >= vocab) {
                return Err(ApiError::invalid(
                    format!("token id {bad} is outside the vocabulary of {vocab} tokens"),
                    Some("prompt"),
                ));
            }
            Ok(ids.clone())
        }
        PromptField::Text(text) => {
            if s.tokenizer.min_tokens(text) + 1 > max_model_len {
                return Err(ApiError::invalid(
                    format!("the prompt is longer than the context of {max_model_len} tokens"),
                    Some("prompt"),
                ));
            }
            Ok(s.tokenizer.encode_special(text, true, false))
        }
    }
}

/// The tokens of chat `messages` rendered by the model's chat template, which writes its own
/// BOS, with the generation prompt (an assistant turn begun) at the end.
pub(crate) fn chat_tokens(
    s: &AppState,
    messages: &[kvlab_model::chat::Message],
    max_model_len: usize,
) -> Result<Vec<u32>, ApiError> {
    let Some(template) = s.tokenizer.chat_template() else {
        return Err(ApiError::invalid(
            format!(
                "model {:?} has no chat template, so chat messages cannot be turned into a prompt; send a prompt to /v1/completions",
                s.model_name
            ),
            Some("messages"),
        ));
    };
    if messages.is_empty() {
        return Err(ApiError::invalid("messages is empty", Some("messages")));
    }
    let text = template
        .render(messages, true)
        .map_err(|e| ApiError::invalid(e.to_string(), Some("messages")))?;
    if s.tokenizer.min_tokens(&text) + 1 > max_model_len {
        return Err(ApiError::invalid(
            format!("the prompt is longer than the context of {max_model_len} tokens"),
            Some("messages"),
        ));
    }
    Ok(s.tokenizer.encode_special(&text, false, false))
}

/// The prompt tokens of a request: its `prompt` ([`tokens_of`]), or its `messages` rendered by the model's chat template (which writes its own BOS).
fn prompt_tokens(
    s: &AppState,
    req: &CompletionRequest,
    api: Api,
    max_model_len: usize,
) -> Result<Vec<u32>, ApiError> {
    match (api, &req.prompt, &req.messages) {
        (Api::Completions, Some(p), None) => tokens_of(s, p, max_model_len),
        (Api::Completions, _, _) => Err(ApiError::invalid(
            "a completion takes a prompt (and no messages; those go to /v1/chat/completions)",
            Some("prompt"),
        )),
        (Api::Chat, None, Some(messages)) => chat_tokens(s, messages, max_model_len),
        (Api::Chat, _, _) => Err(ApiError::invalid(
            "a chat completion takes messages (and no prompt; that goes to /v1/completions)",
            Some("messages"),
        )),
    }
}

fn prepare(
    s: &AppState,
    body: Result<Bytes, BytesRejection>,
    api: Api,
) -> Result<Prepared, ApiError> {
    let body =
        body.map_err(|e| ApiError::new(e.status(), "invalid_request_error", e.body_text()))?;
    let req: CompletionRequest = serde_json::from_slice(&body)
        .map_err(|e| ApiError::invalid(format!("invalid request body: {e}"), None))?;
    if let Some(m) = &req.model
        && m != &s.model_name
    {
        return Err(ApiError {
            param: Some("model"),
            ..ApiError::new(
                StatusCode::NOT_FOUND,
                "not_found_error",
                format!(
                    "model {m:?} does not exist; this server serves {:?}",
                    s.model_name
                ),
            )
        });
    }
    if req.n.is_some_and(|n| n != 1) {
        return Err(ApiError::invalid("only n = 1 is supported", Some("n")));
    }
    let max_model_len = s.engine.max_model_len();
    let max_tokens = req.max_tokens.unwrap_or(DEFAULT_MAX_TOKENS);
    if max_tokens == 0 {
        return Err(ApiError::invalid(
            "max_tokens must be at least 1",
            Some("max_tokens"),
        ));
    }
    let prompt = prompt_tokens(s, &req, api, max_model_len)?;
    if prompt.is_empty() {
        return Err(ApiError::invalid(
            "the prompt has no tokens (an empty list of token ids, or text that encodes to none in a vocabulary without BOS)",
            Some("prompt"),
        ));
    }
    if prompt.len() >= max_model_len {
        return Err(ApiError::invalid(
            format!(
                "the prompt has {} tokens; the context holds {max_model_len}, leaving no room to generate",
                prompt.len()
            ),
            Some("prompt"),
        ));
    }
    // `prompt.len() < max_model_len` here, so the subtraction cannot wrap (a sum could).
    if max_tokens > max_model_len - prompt.len() {
        return Err(ApiError::invalid(
            format!(
                "max_tokens {max_tokens} plus the prompt's {} tokens is beyond the context of {max_model_len} tokens",
                prompt.len()
            ),
            Some("max_tokens"),
        ));
    }
    let seed = req
        .seed
        .unwrap_or_else(|| s.next_id.load(Ordering::Relaxed) ^ now_s());
    let sampler = Sampler::new(
        req.temperature.unwrap_or(1.0),
        req.top_p.unwrap_or(1.0),
        seed,
    )
    .map_err(|e| {
        let param = if req
            .temperature
            .is_some_and(|t| kvlab_model::sampler::check_temperature(t).is_err())
        {
            "temperature"
        } else {
            "top_p"
        };
        ApiError::invalid(e.to_string(), Some(param))
    })?;
    let cache_salt = cache_salt(
        s.prefix_isolation,
        req.cache_salt.as_deref(),
        req.user.as_deref(),
    )?;
    let stop = match req.stop {
        None => Vec::new(),
        Some(StopField::One(s)) => vec![s],
        Some(StopField::Many(v)) if v.len() <= 4 => v,
        Some(StopField::Many(_)) => {
            return Err(ApiError::invalid("at most 4 stop strings", Some("stop")));
        }
    };
    Ok(Prepared {
        prompt,
        max_tokens,
        sampler,
        stop,
        stream: req.stream,
        stream_usage: req.stream_options.and_then(|o| o.include_usage) == Some(true),
        tenant: req.user.as_deref().map_or(0, tenant_of),
        cache_salt,
        special: req.skip_special_tokens == Some(false),
    })
}

/// The prefix-cache salt of a request whose `cache_salt` is `given` and whose OpenAI `user` is
/// `user`, under `isolation` (0: none): FNV-1a of its `cache_salt`, and in `user` mode of its
/// `user` too, never 0.
///
/// # Errors
/// An empty `cache_salt`, or any `cache_salt` when the server shares everything.
pub(crate) fn cache_salt(
    isolation: PrefixIsolation,
    given: Option<&str>,
    user: Option<&str>,
) -> Result<u64, ApiError> {
    if given == Some("") {
        return Err(ApiError::invalid(
            "cache_salt is empty; leave it out or give a non-empty string",
            Some("cache_salt"),
        ));
    }
    let key = match isolation {
        PrefixIsolation::None if given.is_some() => {
            return Err(ApiError::invalid(
                "this server shares its prefix cache between all requests (--prefix-isolation                  none), so cache_salt cannot isolate this one; leave it out",
                Some("cache_salt"),
            ));
        }
        PrefixIsolation::None => return Ok(0),
        PrefixIsolation::Salt => match given {
            Some(salt) => format!("salt\0{salt}"),
            None => return Ok(0),
        },
        PrefixIsolation::User => {
            format!("user\0{}\0{}", user.unwrap_or(""), given.unwrap_or(""))
        }
    };
    Ok(kvlab_paged::fnv1a(key.as_bytes()).max(1))
}

/// The tenant of an OpenAI `user`: 1 + its FNV-1a hash modulo 2³² − 1 (0 is everyone who gives
/// none). Two users whose hashes meet share a quota; nothing else depends on it.
fn tenant_of(user: &str) -> kvlab_paged::Tenant {
    let h = kvlab_paged::fnv1a(user.as_bytes()) % u64::from(u32::MAX - 1);
    1 + h as kvlab_paged::Tenant
}

fn now_s() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map(|d| d.as_secs())
        .unwrap_or(0)
}

/// One completion in progress: its token channel and its text so far.
struct Completion {
    events: UnboundedReceiver<TokenEvent>,
    detokenizer: Detokenizer,
    prompt_tokens: usize,
    completion_tokens: usize,
    /// Prompt tokens the prefix cache served ([`TokenEvent::Cached`]).
    cached_tokens: usize,
    /// Set once the completion has ended (the receiver is closed then, which aborts the
    /// sequence at the engine's next step if it is still running).
    end: Option<&'static str>,
}

/// What [`Completion::next`] yields.
enum Piece {
    Text(String),
    Done(&'static str),
    Failed(String),
}

impl Completion {
    fn new(
        events: UnboundedReceiver<TokenEvent>,
        detokenizer: Detokenizer,
        prompt_tokens: usize,
    ) -> Completion {
        Completion {
            events,
            detokenizer,
            prompt_tokens,
            completion_tokens: 0,
            cached_tokens: 0,
            end: None,
        }
    }

    /// The usage so far (whole once the completion has ended).
    fn usage(&self) -> Usage {
        Usage {
            prompt_tokens: self.prompt_tokens,
            completion_tokens: self.completion_tokens,
            total_tokens: self.prompt_tokens + self.completion_tokens,
            prompt_tokens_details: PromptTokensDetails {
                cached_tokens: self.cached_tokens,
            },
        }
    }

    /// The next piece of text, or the end (after which it keeps returning the end).
    async fn next(&mut self) -> Piece {
        if let Some(end) = self.end {
            return Piece::Done(end);
        }
        let mut event = self.events.recv().await;
        while let Some(TokenEvent::Cached(n)) = event {
            self.cached_tokens = n;
            event = self.events.recv().await;
        }
        let (text, end) = match event {
            Some(TokenEvent::Cached(_)) => unreachable!("consumed above"),
            Some(TokenEvent::Token(t)) => {
                self.completion_tokens += 1;
                let (text, stopped) = self.detokenizer.push(t);
                (text, stopped.then_some("stop"))
            }
            Some(TokenEvent::Finished(r)) => (
                self.detokenizer.finish(),
                Some(crate::metrics::finish_reason(r)),
            ),
            Some(TokenEvent::Failed(m)) => {
                self.events.close();
                self.end = Some("abort");
                return Piece::Failed(m);
            }
            None => (String::new(), Some("abort")),
        };
        if end.is_some() {
            self.events.close();
            self.end = end;
        }
        match (text.is_empty(), end) {
            (true, Some(end)) => Piece::Done(end),
            _ => Piece::Text(text),
        }
    }
}

async fn completions(
    State(s): State<Arc<AppState>>,
    body: Result<Bytes, BytesRejection>,
) -> Result<Response, ApiError> {
    serve_request(s, body, Api::Completions).await
}

async fn chat_completions(
    State(s): State<Arc<AppState>>,
    body: Result<Bytes, BytesRejection>,
) -> Result<Response, ApiError> {
    serve_request(s, body, Api::Chat).await
}

/// One request of either endpoint: checked, submitted to the engine, answered as one JSON body
/// or streamed.
async fn serve_request(
    s: Arc<AppState>,
    body: Result<Bytes, BytesRejection>,
    api: Api,
) -> Result<Response, ApiError> {
    let arrival = Instant::now();
    let p = prepare(&s, body, api)?;
    let (tx, rx) = tokio::sync::mpsc::unbounded_channel();
    let prompt_tokens = p.prompt.len();
    let last = p.prompt[prompt_tokens - 1];
    s.engine
        .try_submit(
            GenerationRequest {
                prompt: p.prompt,
                max_tokens: p.max_tokens,
                sampler: p.sampler,
                events: tx,
                arrival,
                tenant: p.tenant,
                cache_salt: p.cache_salt,
            },
            s.max_waiting,
        )
        .map_err(ApiError::from)?;
    let detokenizer = Detokenizer::new(
        s.tokenizer.clone(),
        last,
        p.stop,
        s.engine.stop_token_ids().to_vec(),
        p.special,
    );
    let mut completion = Completion::new(rx, detokenizer, prompt_tokens);
    let prefix = if api == Api::Chat { "chatcmpl" } else { "cmpl" };
    let id = format!("{prefix}-{}", s.next_id.fetch_add(1, Ordering::Relaxed));
    let created = now_s();
    if p.stream {
        return Ok(Sse::new(sse_chunks(
            completion,
            id,
            created,
            s.model_name.clone(),
            (api, p.stream_usage),
        ))
        .into_response());
    }
    let mut text = String::new();
    let reason = loop {
        match completion.next().await {
            Piece::Text(t) => text.push_str(&t),
            Piece::Done(r) => break r,
            Piece::Failed(m) => {
                return Err(ApiError::new(
                    StatusCode::INTERNAL_SERVER_ERROR,
                    "server_error",
                    m,
                ));
            }
        }
    };
    let (object, choice) = match api {
        Api::Completions => (
            "text_completion",
            json!({"text": text, "index": 0, "logprobs": null, "finish_reason": reason}),
        ),
        Api::Chat => (
            "chat.completion",
            json!({"index": 0, "message": {"role": "assistant", "content": text},
                   "logprobs": null, "finish_reason": reason}),
        ),
    };
    Ok(Json(json!({
        "id": id,
        "object": object,
        "created": created,
        "model": s.model_name,
        "choices": [choice],
        "usage": completion.usage(),
    }))
    .into_response())
}

/// One `data:` event of a stream: OpenAI's `text_completion` / `chat.completion.chunk` object.
#[derive(serde::Serialize)]
struct StreamChunk<'a> {
    id: &'a str,
    object: &'static str,
    created: u64,
    model: &'a str,
    choices: [StreamChoice<'a>; 1],
}

#[derive(serde::Serialize)]
#[serde(untagged)]
enum StreamChoice<'a> {
    Text {
        text: &'a str,
        index: u32,
        logprobs: Option<()>,
        finish_reason: Option<&'a str>,
    },
    Chat {
        index: u32,
        delta: Delta<'a>,
        logprobs: Option<()>,
        finish_reason: Option<&'a str>,
    },
}

/// A chat chunk's new text: `role` on the first chunk only, no `content` on the last.
#[derive(serde::Serialize)]
struct Delta<'a> {
    #[serde(skip_serializing_if = "Option::is_none")]
    role: Option<&'static str>,
    #[serde(skip_serializing_if = "Option::is_none")]
    content: Option<&'a str>,
}

/// The SSE body of a streamed completion: one chunk per piece of text, a last chunk with the
/// finish reason (or an error object), with `include_usage` a chunk with no choices and the
/// usage, then `data: [DONE]`. A chat chunk carries its text as `delta.content` (the first also
/// `delta.role`), as OpenAI's `chat.completion.chunk` does.
fn sse_chunks(
    completion: Completion,
    id: String,
    created: u64,
    model: String,
    (api, include_usage): (Api, bool),
) -> impl Stream<Item = Result<Event, Infallible>> {
    let usage_chunk = {
        let (id, model) = (id.clone(), model.clone());
        let object = match api {
            Api::Completions => "text_completion",
            Api::Chat => "chat.completion.chunk",
        };
        move |usage: Usage| {
            json!({"id": id, "object": object, "created": created, "model": model,
                   "choices": [], "usage": usage})
            .to_string()
        }
    };
    let first = std::sync::atomic::AtomicBool::new(true);
    // Serialized from borrowed structs, one String per chunk: this runs once per token of
    // every open stream, and a `json!` tree costs a map and a string per field.
    let chunk = move |text: &str, reason: Option<&str>| {
        let (object, choice) = match api {
            Api::Completions => (
                "text_completion",
                StreamChoice::Text {
                    text,
                    index: 0,
                    logprobs: None,
                    finish_reason: reason,
                },
            ),
            Api::Chat => (
                "chat.completion.chunk",
                StreamChoice::Chat {
                    index: 0,
                    delta: Delta {
                        role: first.swap(false, Ordering::Relaxed).then_some("assistant"),
                        content: reason.is_none().then_some(text),
                    },
                    logprobs: None,
                    finish_reason: reason,
                },
            ),
        };
        serde_json::to_string(&StreamChunk {
            id: &id,
            object,
            created,
            model: &model,
            choices: [choice],
        })
        .expect("a chunk of strings and numbers serializes")
    };
    let (chunk, usage_chunk) = (std::sync::Arc::new(chunk), std::sync::Arc::new(usage_chunk));
    stream::unfold(Some(completion), move |state| {
        let (chunk, usage_chunk) = (chunk.clone(), usage_chunk.clone());
        async move {
            let mut c = state?;
            let event = match c.next().await {
                Piece::Text(t) => {
                    return Some((vec![Ok(Event::default().data(chunk(&t, None)))], Some(c)));
                }
                Piece::Done(r) => Event::default().data(chunk("", Some(r))),
                Piece::Failed(m) => Event::default().data(
                    json!({"error": {"message": m, "type": "server_error", "param": null, "code": 500}})
                        .to_string(),
                ),
            };
            let usage = c.usage();
            drop(c);
            let mut events = vec![Ok(event)];
            if include_usage {
                events.push(Ok(Event::default().data(usage_chunk(usage))));
            }
            Some((events, None))
        }
    })
    .flat_map(stream::iter)
    .chain(stream::once(async { Ok(Event::default().data("[DONE]")) }))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn stream_chunks_are_openais_objects() {
        let parse = |c: StreamChunk| -> serde_json::Value {
            serde_json::from_str(&serde_json::to_string(&c).unwrap()).unwrap()
        };
        let text = parse(StreamChunk {
            id: "cmpl-1",
            object: "text_completion",
            created: 7,
            model: "m",
            choices: [StreamChoice::Text {
                text: "a \"quoted\"\n line",
                index: 0,
                logprobs: None,
                finish_reason: None,
            }],
        });
        assert_eq!(
            text,
            json!({"id": "cmpl-1", "object": "text_completion", "created": 7, "model": "m",
                   "choices": [{"text": "a \"quoted\"\n line", "index": 0, "logprobs": null,
                                "finish_reason": null}]})
        );
        let chat = |role, content, finish_reason| {
            parse(StreamChunk {
                id: "chatcmpl-2",
                object: "chat.completion.chunk",
                created: 7,
                model: "m",
                choices: [StreamChoice::Chat {
                    index: 0,
                    delta: Delta { role, content },
                    logprobs: None,
                    finish_reason,
                }],
            })["choices"][0]
                .clone()
        };
        assert_eq!(
            chat(Some("assistant"), Some("Hi"), None),
            json!({"index": 0, "delta": {"role": "assistant", "content": "Hi"}, "logprobs": null,
                   "finish_reason": null})
        );
        assert_eq!(
            chat(None, None, Some("length")),
            json!({"index": 0, "delta": {}, "logprobs": null, "finish_reason": "length"})
        );
    }

    #[test]
    fn users_are_tenants_and_nobody_is_tenant_0() {
        assert_ne!(tenant_of("alice"), tenant_of("bob"));
        assert_eq!(tenant_of("alice"), tenant_of("alice"));
        assert!(
            ["", "alice", "bob", "\u{10ffff}"]
                .iter()
                .all(|u| tenant_of(u) != 0)
        );
    }
}

//! `kvlab serve`: an OpenAI-compatible HTTP server (tokio + axum) over one paged engine and the
//! continuous-batching scheduler.
//!
//! ```text
//! client ──HTTP──▶ handler (async) ──GenerationRequest (mpsc)──▶ engine thread: Scheduler + engine
//!        ◀──JSON / SSE── handler ◀──TokenEvent (one channel per request)──┘
//! ```
//!
//! `engine_loop.rs` is the engine thread (admission, steps, aborts of disconnected clients);
//! `http.rs` the routes, the OpenAI request and response shapes and their errors;
//! `detokenize.rs` token ids to text with `stop` strings; `listen.rs` accepts connections (hyper, with read timeouts);
//! `metrics.rs` the Prometheus registry
//! behind `/metrics`; `page.rs` the live block-pool page at `/` and its data at `/pool`.

mod detokenize;
pub mod engine_loop;
pub mod http;
mod listen;
pub mod metrics;
mod page;
mod slots;

pub use detokenize::Detokenizer;
pub use engine_loop::{
    EngineHandle, EngineParts, Executor, GenerationRequest, Job, SessionAction, SessionDone,
    SessionJob, SubmitError, TokenEvent, spawn_engine,
};
pub use http::{AppState, BODY_READ_TIMEOUT, DEFAULT_BODY_LIMIT, PrefixIsolation, router};
pub use listen::{HEADER_READ_TIMEOUT, serve};
pub use metrics::ServerMetrics;

/// Errors of starting the server.
#[derive(Debug, thiserror::Error)]
pub enum ServeError {
    /// The engine could not be built.
    #[error("engine: {0}")]
    Engine(String),
    /// The scheduler refused the engine's pool.
    #[error("scheduler: {0}")]
    Scheduler(String),
    /// The engine thread could not start.
    #[error("engine thread: {0}")]
    Thread(String),
    /// The metrics registry could not be built.
    #[error("metrics: {0}")]
    Metrics(String),
    /// Binding or serving the socket failed.
    #[error("http: {0}")]
    Io(#[from] std::io::Error),
}

//! The one engine thread: it owns the paged engine and the [`Scheduler`], and steps the batch
//! while any request is live.
//!
//! Handlers talk to it through two kinds of channel:
//!
//! * one `std::sync::mpsc` channel of [`Job`]s into the thread — completions to schedule, and
//!   saved-session saves and restores, run between two steps (the thread blocks on it when
//!   idle, and drains it without blocking before every step);
//! * one `tokio::sync::mpsc` unbounded channel per request back out, carrying
//!   [`TokenEvent`]s: one `Token` per sampled token, then `Finished` (or `Failed`).
//!
//! A client that goes away drops its receiver; before every step the thread aborts every
//! sequence whose receiver is closed (`Scheduler::abort`), which frees its blocks at once. The
//! sequence's token of a step already in flight is ignored by `update`.
//!
//! After every step the thread also copies the scheduler's state out for the handlers: the
//! metrics (for `/metrics` and `/health`) and, whenever it goes idle and, while someone reads
//! `/pool`, at most every [`VIEW_INTERVAL`], the [`PoolView`] the live page draws.

use std::collections::HashMap;
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::sync::mpsc::{Receiver, Sender};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use kvlab_model::{Drafter, Sampler};
use kvlab_paged::{
    DriveError, FinishReason, Metrics, PoolView, RequestId, Scheduler, SchedulerConfig,
    StepExecutor, StopConditions, TokenSampler,
};
use tokio::sync::mpsc::UnboundedSender;

use crate::{ServeError, ServerMetrics};

/// How stale the published [`PoolView`] may get while the engine runs and someone reads it (it
/// is refreshed after a step once this much time has passed, and always when the engine goes
/// idle).
pub const VIEW_INTERVAL: Duration = Duration::from_millis(20);
/// While the engine runs, the view is refreshed only if `GET /pool` was read within this long:
/// building it costs time proportional to the pool's blocks, which no one should pay for a page
/// nobody has open.
pub const VIEW_WANTED_FOR: Duration = Duration::from_secs(2);

/// A paged engine as the engine thread runs it (boxed so the CPU and CUDA engines fit).
pub type Executor = Box<dyn StepExecutor<Error = kvlab_model::Error>>;

/// What the engine thread runs, built on that thread: the engine, the scheduler's
/// configuration, and with `--speculative` the drafter that proposes each decode's draft tokens.
pub struct EngineParts {
    /// The paged engine.
    pub executor: Executor,
    /// The scheduler's configuration (its `kv_cache` the pool the engine was built with).
    pub config: SchedulerConfig,
    /// Speculative decoding's proposer, or `None` for plain decoding.
    pub drafter: Option<Drafter>,
}

/// One completion for the engine thread: a tokenized prompt, how many tokens to generate, its
/// own sampler, and where its tokens go.
pub struct GenerationRequest {
    /// Prompt token ids, BOS included (at least one).
    pub prompt: Vec<u32>,
    /// Most tokens to generate (at least 1).
    pub max_tokens: usize,
    /// This request's sampler (temperature, top_p, top_k, min_p, repeat penalty, seed); it also
    /// sees the prompt and every accepted token, for the repeat penalty.
    pub sampler: Sampler,
    /// Where the engine thread sends the request's tokens, then `Finished` or `Failed`.
    pub events: UnboundedSender<TokenEvent>,
    /// When the request reached the server (its latencies are measured from here).
    pub arrival: Instant,
    /// Whose request it is (the OpenAI `user` field; 0 when none), for prefix-cache quotas.
    pub tenant: kvlab_paged::Tenant,
    /// Its prefix-cache salt (0: none): it shares cached blocks only with requests of the same
    /// salt (`Scheduler::set_cache_salt`).
    pub cache_salt: u64,
}

/// What the engine thread is asked to do.
pub enum Job {
    /// Schedule a completion (boxed: a request is most of the enum's size).
    Generate(Box<GenerationRequest>),
    /// Save or restore a conversation's cached blocks, between two steps.
    Session(SessionJob),
}

/// A saved-session job (`POST /slots/{id}?action=save|restore`) and where its answer goes.
pub struct SessionJob {
    /// What to do.
    pub action: SessionAction,
    /// What the blocks are reusable under (model, weights, engine, KV dtype, block size):
    /// written into a saved file, and checked against a restored one.
    pub namespace: String,
    /// The answer: what was done, or why not.
    pub reply: tokio::sync::oneshot::Sender<Result<SessionDone, String>>,
}

/// Save or restore.
pub enum SessionAction {
    /// Write the cached blocks of `tokens` (salted `salt`) to `path`.
    Save {
        /// The conversation so far (its last prompt and reply), BOS included.
        tokens: Vec<u32>,
        /// Its prefix-cache salt (0: none).
        salt: u64,
        /// The file to write.
        path: std::path::PathBuf,
    },
    /// Make the blocks saved in `path` restorable by the next request that starts with them.
    Restore {
        /// The file to read.
        path: std::path::PathBuf,
    },
}

/// What a saved-session job did (llama.cpp's `n_saved`/`n_restored`, `n_written`/`n_read`,
/// `timings`).
#[derive(Debug, Clone, PartialEq)]
pub struct SessionDone {
    /// Tokens the saved (or restored) blocks cover.
    pub tokens: usize,
    /// Bytes of the file written (or read).
    pub bytes: u64,
    /// Milliseconds the job took on the engine thread.
    pub ms: f64,
}

/// What the engine thread sends back for one request.
#[derive(Debug, Clone, PartialEq)]
pub enum TokenEvent {
    /// Sent once, when the request's prefill is first scheduled (before any token): how many
    /// of its prompt tokens the prefix cache served, from the pool or a tier below it (OpenAI's
    /// `usage.prompt_tokens_details.cached_tokens`).
    Cached(usize),
    /// A newly sampled token id (stop tokens included: the handler decides what to print).
    Token(u32),
    /// The sequence ended and its blocks are free.
    Finished(FinishReason),
    /// The request could not be served (the scheduler refused it, the engine failed); its
    /// blocks are free.
    Failed(String),
}

/// What the engine thread shares with the handlers: the admission count, the Prometheus
/// metrics and the last pool view.
pub struct SharedState {
    /// Requests accepted by a handler that have not produced their first token yet (in the
    /// channel or the scheduler's waiting queue): the admission bound is checked against it.
    pending: AtomicUsize,
    /// The Prometheus registry the engine thread writes and `/metrics` renders.
    prometheus: ServerMetrics,
    /// The scheduler's metrics after the last step (or when the thread went idle).
    metrics: Mutex<Metrics>,
    /// The pool and its sequences as of the last publication (see [`VIEW_INTERVAL`]).
    view: Mutex<PoolView>,
    /// When the view was last read, in ms since `started` (0: never).
    view_read_ms: AtomicU64,
    started: Instant,
}

impl SharedState {
    /// Requests accepted but not yet started.
    pub fn pending(&self) -> usize {
        self.pending.load(Ordering::Acquire)
    }

    /// Sequences aborted so far because their receiver closed (client gone, stop string).
    pub fn aborted(&self) -> u64 {
        self.prometheus.num_cancelled()
    }

    /// The Prometheus metrics.
    pub fn prometheus(&self) -> &ServerMetrics {
        &self.prometheus
    }

    /// The pool view as of the last publication: current when the engine is idle; while it
    /// runs, at most [`VIEW_INTERVAL`] old once it has been read within [`VIEW_WANTED_FOR`]
    /// (the first read after a quiet spell may be older).
    pub fn view(&self) -> PoolView {
        let ms = self.started.elapsed().as_millis().max(1);
        self.view_read_ms
            .store(u64::try_from(ms).unwrap_or(u64::MAX), Ordering::Release);
        self.view
            .lock()
            .map(|v| v.clone())
            .unwrap_or_else(|e| e.into_inner().clone())
    }

    /// Whether the view was read within [`VIEW_WANTED_FOR`].
    fn view_wanted(&self) -> bool {
        let read = self.view_read_ms.load(Ordering::Acquire);
        read > 0
            && self.started.elapsed().as_millis() < u128::from(read) + VIEW_WANTED_FOR.as_millis()
    }

    /// The scheduler's metrics as of the last step or idle moment.
    pub fn metrics(&self) -> Metrics {
        self.metrics
            .lock()
            .map(|m| m.clone())
            .unwrap_or_else(|e| e.into_inner().clone())
    }
}

/// The handlers' end of the engine thread.
#[derive(Clone)]
pub struct EngineHandle {
    requests: Sender<Job>,
    shared: Arc<SharedState>,
    /// Most positions of one sequence (prompt plus generated tokens).
    max_model_len: usize,
    /// Tokens that end a sequence (EOS).
    stop_token_ids: Arc<[u32]>,
}

/// Why [`EngineHandle::try_submit`] refused a request.
#[derive(Debug, thiserror::Error, PartialEq, Eq)]
pub enum SubmitError {
    /// `max_waiting` requests are already waiting for their first token; the server answers
    /// 429 with `Retry-After`, and the client should retry later.
    #[error("{pending} requests are already waiting (the bound is {max_waiting}); retry later")]
    QueueFull {
        /// Requests accepted that had not produced their first token yet.
        pending: usize,
        /// The bound they were checked against (`AppState::max_waiting`).
        max_waiting: usize,
    },
    /// The engine thread has exited (while a handle lives it stops only by panicking), so
    /// nothing more can be served: the server answers 503; restart it.
    #[error("the engine thread has stopped; restart the server")]
    EngineGone,
}

impl EngineHandle {
    /// Most positions of one sequence, prompt included.
    pub fn max_model_len(&self) -> usize {
        self.max_model_len
    }

    /// The shared counters and metrics.
    pub fn shared(&self) -> &SharedState {
        &self.shared
    }

    /// Tokens that end a sequence.
    pub fn stop_token_ids(&self) -> &[u32] {
        &self.stop_token_ids
    }

    /// Queues `request` unless `max_waiting` requests are already waiting.
    ///
    /// # Errors
    /// [`SubmitError::QueueFull`] past the bound; [`SubmitError::EngineGone`] if the engine
    /// thread has exited.
    pub fn try_submit(
        &self,
        request: GenerationRequest,
        max_waiting: usize,
    ) -> Result<(), SubmitError> {
        let before = self.shared.pending.fetch_add(1, Ordering::AcqRel);
        if before >= max_waiting {
            self.shared.pending.fetch_sub(1, Ordering::AcqRel);
            return Err(SubmitError::QueueFull {
                pending: before,
                max_waiting,
            });
        }
        self.requests
            .send(Job::Generate(Box::new(request)))
            .map_err(|_| {
                self.shared.pending.fetch_sub(1, Ordering::AcqRel);
                SubmitError::EngineGone
            })
    }

    /// Queues a saved-session job; it runs between two steps.
    ///
    /// # Errors
    /// [`SubmitError::EngineGone`] if the engine thread has exited.
    pub fn submit_session(&self, job: SessionJob) -> Result<(), SubmitError> {
        (self.requests.send(Job::Session(job))).map_err(|_| SubmitError::EngineGone)
    }
}

/// Starts the engine thread. `build` runs on that thread (so an engine bound to its thread,
/// such as a CUDA context, or a draft model, stays there) and returns the engine, the
/// scheduler's configuration (its `kv_cache` the pool shape the engine was built with; its
/// `max_model_len` the positions per sequence) and the drafter if any. `model_name` labels the
/// metrics.
///
/// # Errors
/// [`ServeError::Engine`] with `build`'s error, [`ServeError::Scheduler`] for a pool the
/// scheduler refuses, [`ServeError::Thread`] if the thread cannot start,
/// [`ServeError::Metrics`] if the metrics registry cannot be built.
pub fn spawn_engine<F>(
    build: F,
    model_name: &str,
    stop_token_ids: Vec<u32>,
) -> Result<EngineHandle, ServeError>
where
    F: FnOnce() -> Result<EngineParts, String> + Send + 'static,
{
    let (requests, receiver) = std::sync::mpsc::channel();
    let (ready_tx, ready_rx) = std::sync::mpsc::channel::<Result<PoolView, ServeError>>();
    let stops = stop_token_ids.clone();
    let shared = Arc::new(SharedState {
        pending: AtomicUsize::new(0),
        prometheus: ServerMetrics::new(model_name)
            .map_err(|e| ServeError::Metrics(e.to_string()))?,
        metrics: Mutex::new(Metrics::of_pools(&[])),
        view_read_ms: AtomicU64::new(0),
        started: Instant::now(),
        view: Mutex::new(PoolView {
            max_model_len: 0,
            eviction_policy: Default::default(),
            groups: Vec::new(),
            sequences: Vec::new(),
            metrics: Metrics::of_pools(&[]),
        }),
    });
    let thread_shared = shared.clone();
    std::thread::Builder::new()
        .name("kvlab-engine".into())
        .spawn(move || {
            let started = build().map_err(ServeError::Engine).and_then(|parts| {
                let sched = Scheduler::new(parts.config)
                    .map_err(|e| ServeError::Scheduler(e.to_string()))?;
                Ok((parts.executor, sched, parts.drafter))
            });
            match started {
                Ok((engine, sched, drafter)) => {
                    let _ = ready_tx.send(Ok(PoolView::of(&sched)));
                    EngineLoop {
                        engine,
                        sched,
                        drafter,
                        live: HashMap::new(),
                        shared: thread_shared,
                        stop_token_ids: stops,
                        last_view: Instant::now(),
                    }
                    .run(&receiver);
                }
                Err(e) => {
                    let _ = ready_tx.send(Err(e));
                }
            }
        })
        .map_err(|e| ServeError::Thread(e.to_string()))?;
    let view = ready_rx
        .recv()
        .map_err(|_| ServeError::Thread("the engine thread exited while starting".into()))??;
    let max_model_len = view.max_model_len;
    *shared.metrics.lock().unwrap_or_else(|e| e.into_inner()) = view.metrics.clone();
    *shared.view.lock().unwrap_or_else(|e| e.into_inner()) = view;
    Ok(EngineHandle {
        requests,
        shared,
        max_model_len,
        stop_token_ids: stop_token_ids.into(),
    })
}

/// A request the scheduler holds.
struct LiveRequest {
    sampler: Sampler,
    events: UnboundedSender<TokenEvent>,
    arrival: Instant,
    num_prompt_tokens: usize,
    /// When it produced its last token (`None` before the first: it still counts as pending).
    last_token: Option<Instant>,
    /// Whether [`TokenEvent::Cached`] was sent.
    cached_sent: bool,
}

struct EngineLoop {
    engine: Executor,
    sched: Scheduler,
    /// Proposes each decode's draft tokens (`--speculative`).
    drafter: Option<Drafter>,
    live: HashMap<RequestId, LiveRequest>,
    shared: Arc<SharedState>,
    stop_token_ids: Vec<u32>,
    /// When the pool view was last published.
    last_view: Instant,
}

impl EngineLoop {
    /// Steps until every handle is dropped and no request is live.
    fn run(mut self, receiver: &Receiver<Job>) {
        loop {
            if self.live.is_empty() {
                self.publish(true);
                // Idle: the last blocks computed reach the remote tier now, not with the next
                // request's step.
                let kv = self.sched.kv_cache_manager_mut();
                kv.flush_remote_writes(&mut *self.engine);
                match receiver.recv() {
                    Ok(job) => self.take(job),
                    Err(_) => return,
                }
            }
            while let Ok(job) = receiver.try_recv() {
                self.take(job);
            }
            self.abort_disconnected();
            if self.live.is_empty() {
                continue;
            }
            self.step();
            self.publish(false);
        }
    }

    fn take(&mut self, job: Job) {
        match job {
            Job::Generate(r) => self.admit(*r),
            Job::Session(j) => {
                let t = Instant::now();
                let done = self.session(j.action, &j.namespace).map(|(tokens, bytes)| {
                    let ms = t.elapsed().as_secs_f64() * 1e3;
                    SessionDone { tokens, bytes, ms }
                });
                let _ = j.reply.send(done);
            }
        }
    }

    /// Saves or restores a session: (tokens covered, file bytes), or why not.
    fn session(&mut self, action: SessionAction, namespace: &str) -> Result<(usize, u64), String> {
        let kv = self.sched.kv_cache_manager_mut();
        match action {
            SessionAction::Save { tokens, salt, path } => {
                let saved = (kv.save_session(&mut *self.engine, (&tokens, salt), namespace))
                    .map_err(|e| format!("reading the session's blocks: {e}"))?;
                let covered = kvlab_paged::KvCacheManager::session_tokens(&saved);
                let bytes = saved.write(&path).map_err(|e| e.to_string())?;
                Ok((covered, bytes))
            }
            SessionAction::Restore { path } => {
                let saved = kvlab_paged::SavedSession::read(&path).map_err(|e| e.to_string())?;
                let bytes = std::fs::metadata(&path).map_or(0, |m| m.len());
                let covered = (kv.restore_session(&mut *self.engine, saved, namespace, &path))
                    .map_err(|e| e.to_string())?;
                Ok((covered, bytes))
            }
        }
    }

    fn admit(&mut self, r: GenerationRequest) {
        let stop = StopConditions::max_tokens(r.max_tokens)
            .with_stop_tokens(self.stop_token_ids.iter().copied());
        let num_prompt_tokens = r.prompt.len();
        let added = (self.sched.add_request_for(r.prompt, stop, r.tenant))
            .and_then(|id| self.sched.set_cache_salt(id, r.cache_salt).map(|()| id));
        match added {
            Ok(id) => {
                self.live.insert(
                    id,
                    LiveRequest {
                        sampler: r.sampler,
                        events: r.events,
                        arrival: r.arrival,
                        num_prompt_tokens,
                        last_token: None,
                        cached_sent: false,
                    },
                );
            }
            Err(e) => {
                self.shared.pending.fetch_sub(1, Ordering::AcqRel);
                let _ = r.events.send(TokenEvent::Failed(e.to_string()));
            }
        }
    }

    /// Forgets `id` (its sequence already ended in the scheduler), releasing its pending count.
    fn remove(&mut self, id: RequestId) -> Option<LiveRequest> {
        let r = self.live.remove(&id)?;
        if r.last_token.is_none() {
            self.shared.pending.fetch_sub(1, Ordering::AcqRel);
        }
        Some(r)
    }

    /// Aborts every sequence whose client dropped its receiver: its blocks are free now.
    fn abort_disconnected(&mut self) {
        let gone: Vec<RequestId> = self
            .live
            .iter()
            .filter(|(_, r)| r.events.is_closed())
            .map(|(id, _)| *id)
            .collect();
        for id in gone {
            let _ = self.sched.abort(id);
            self.release_draft(id);
            self.remove(id);
            self.shared.prometheus.cancelled();
        }
    }

    /// Ends every live request with `message` and leaves the scheduler with no step in flight.
    fn fail_all(&mut self, message: &str) {
        tracing::error!("{message}");
        let ids: Vec<RequestId> = self.live.keys().copied().collect();
        for id in ids {
            let _ = self.sched.abort(id);
            self.release_draft(id);
            if let Some(r) = self.remove(id) {
                let _ = r.events.send(TokenEvent::Failed(message.to_string()));
            }
        }
        // Closes a step left in flight (every sequence of it is aborted, so no token is due).
        let _ = self.sched.update(&[]);
    }

    /// [`TokenEvent::Cached`] for each request whose prefill `batch` schedules for the first
    /// time (a readmission after preemption recomputes; it is not reported again).
    fn send_cached(&mut self, batch: &kvlab_paged::ScheduledBatch) {
        for s in &batch.seqs {
            let kvlab_paged::StepKind::Prefill {
                num_cached_tokens, ..
            } = s.kind
            else {
                continue;
            };
            if let Some(r) = self.live.get_mut(&s.seq_id).filter(|r| !r.cached_sent) {
                r.cached_sent = true;
                let _ = r.events.send(TokenEvent::Cached(num_cached_tokens));
            }
        }
    }

    /// Frees what the drafter keeps for `id`.
    fn release_draft(&mut self, id: RequestId) {
        if let Some(d) = self.drafter.as_mut() {
            d.release(id.0);
        }
    }

    /// One scheduler step ([`kvlab_paged::driver::step`], the loop `drive` turns too): each
    /// sequence sampled with its own sampler (drafting first with `--speculative`), then the
    /// tokens and ends sent out.
    fn step(&mut self) {
        let failed = self.drafter.as_ref().map_or(0, |d| d.failures().0);
        let mut sampling = LiveSampling {
            live: &mut self.live,
            drafter: self.drafter.as_mut(),
        };
        let outcome = kvlab_paged::driver::step(
            self.engine.as_mut(),
            &mut self.sched,
            &mut sampling,
            |_, _| {},
        );
        if let Some((n, Some(e))) = self.drafter.as_ref().map(Drafter::failures)
            && n > failed
        {
            tracing::warn!("the draft model failed ({e}); those decodes ran without drafts");
        }
        let (sampled, finished) = match outcome {
            Ok(Some(o)) => {
                self.send_cached(&o.batch);
                for (id, reason) in o.refused {
                    if let Some(r) = self.remove(id) {
                        let _ = r.events.send(TokenEvent::Failed(reason));
                    }
                }
                (o.sampled, o.finished)
            }
            Ok(None) => {
                return self.fail_all(
                    "the scheduler made no progress: the KV pool is too small for the live requests",
                );
            }
            Err(DriveError::Paged(e)) => return self.fail_all(&format!("scheduler: {e}")),
            Err(e) => return self.fail_all(&e.to_string()),
        };
        let now = Instant::now();
        let shared = self.shared.clone();
        let metrics = &shared.prometheus;
        for (id, token) in &sampled {
            if let Some(r) = self.live.get_mut(id) {
                match r.last_token {
                    None => {
                        self.shared.pending.fetch_sub(1, Ordering::AcqRel);
                        metrics.first_token(now - r.arrival);
                    }
                    Some(last) => metrics.next_token(now - last),
                }
                r.last_token = Some(now);
                let _ = r.events.send(TokenEvent::Token(*token));
            }
        }
        for f in finished {
            if let Some(r) = self.remove(f.seq_id) {
                metrics.finished(f.reason, r.num_prompt_tokens, now - r.arrival);
                let _ = r.events.send(TokenEvent::Finished(f.reason));
            }
        }
    }

    /// Copies the scheduler's state out: the metrics every time; the pool view when `idle`, or
    /// when someone reads it and [`VIEW_INTERVAL`] has passed since the last one.
    fn publish(&mut self, idle: bool) {
        self.shared.prometheus.observe_scheduler(&self.sched);
        *self
            .shared
            .metrics
            .lock()
            .unwrap_or_else(|e| e.into_inner()) = self.sched.metrics();
        if idle || (self.shared.view_wanted() && self.last_view.elapsed() >= VIEW_INTERVAL) {
            let view = PoolView::of(&self.sched);
            *self.shared.view.lock().unwrap_or_else(|e| e.into_inner()) = view;
            self.last_view = Instant::now();
        }
    }
}

/// The live requests' samplers as the driver samples them: each row with its request's own
/// sampler, which then remembers the token (the repeat penalty of a later row sees it), and
/// the drafter's guesses for each decode.
struct LiveSampling<'a> {
    live: &'a mut HashMap<RequestId, LiveRequest>,
    drafter: Option<&'a mut Drafter>,
}

impl TokenSampler for LiveSampling<'_> {
    type Error = String;

    fn sample(&mut self, id: RequestId, mut row: Vec<f32>) -> Result<u32, String> {
        let r = self.live.get_mut(&id).ok_or("the request is gone")?;
        let token = r.sampler.sample(&mut row).map_err(|bad| {
            format!(
                "the model produced a non-finite logit ({} at token {})",
                bad.value, bad.index
            )
        })?;
        r.sampler.accept(token);
        Ok(token)
    }

    fn speculates(&self) -> bool {
        self.drafter.is_some()
    }

    /// The drafter's guesses; none if the draft engine fails (the engine thread logs it).
    fn propose(&mut self, id: RequestId, token_ids: &[u32], max: usize) -> Vec<u32> {
        (self.drafter.as_mut()).map_or_else(Vec::new, |d| d.propose_or_none(id.0, token_ids, max))
    }

    fn drafts_checked(&mut self, id: RequestId, num_drafts: usize, num_kept: usize) {
        if let Some(d) = self.drafter.as_mut() {
            d.record(id.0, num_drafts, num_kept);
        }
    }

    fn release(&mut self, id: RequestId) {
        if let Some(d) = self.drafter.as_mut() {
            d.release(id.0);
        }
    }
}

//! `kvlab serve`: an OpenAI-compatible HTTP server over a paged engine (`kvlab-serve`). One
//! engine thread steps the continuous batch; requests arrive over HTTP and stream back.

use std::sync::Arc;
use std::time::Duration;

use anyhow::{Context, Result, bail};
use clap::Args as ClapArgs;
use kvlab_cli::args::{MAX_BLOCK_SIZE, MAX_NUM_BLOCKS, usize_in};
use kvlab_engines::{
    self as engines, EngineKind, MAX_MODEL_LEN, PagedEngine, PoolOptions, build_paged,
};
use kvlab_paged::{ModelInput, SchedulerConfig, StepExecutor};
use kvlab_serve::{AppState, DEFAULT_BODY_LIMIT, EngineParts, Executor};

#[derive(ClapArgs)]
pub struct Args {
    #[command(flatten)]
    run: crate::RunArgs,
    /// Paged engine.
    #[arg(long, short = 'e', default_value_t = EngineKind::CpuPaged,
          value_parser = engines::value_parser(&EngineKind::paged()))]
    engine: EngineKind,
    /// Address to listen on (loopback by default: nothing outside this machine can reach it).
    #[arg(long, default_value = "127.0.0.1")]
    host: String,
    /// TCP port (0: any free port, printed at start).
    #[arg(long, default_value_t = 8000)]
    port: u16,
    /// Requests waiting for their first token before new ones get 429 with Retry-After.
    #[arg(long, default_value_t = 64, value_parser = usize_in(1, 1_000_000))]
    max_waiting: usize,
    /// Most positions of one sequence, prompt included (llama.cpp's -c; default: the model's
    /// context). The pool must hold at least one sequence of this length.
    #[arg(long = "ctx-size", short = 'c', value_parser = usize_in(1, MAX_MODEL_LEN as u64))]
    ctx_size: Option<usize>,
    /// Blocks in the pool (default: four sequences of the whole context).
    #[arg(long, value_parser = usize_in(1, MAX_NUM_BLOCKS))]
    num_blocks: Option<usize>,
    /// Which cached prefix block goes first when the pool runs out: lru, lfu, clock or
    /// leaf-first.
    #[arg(long, default_value = "lru", value_parser = kvlab_cli::args::eviction_parser())]
    eviction: kvlab_paged::EvictionPolicy,
    /// Turn the prefix cache off (vLLM's flag of this name): every prompt is prefilled in
    /// full, and no block is shared between sequences. The tiers hold evicted prefix-cache
    /// blocks, so they need it on.
    #[arg(long, conflicts_with_all = ["host_tier_blocks", "disk_tier"])]
    no_enable_prefix_caching: bool,
    /// Cached blocks each tenant (a request's OpenAI `user`) keeps safe from other tenants'
    /// demand (default: no quotas).
    #[arg(long, value_parser = usize_in(0, MAX_NUM_BLOCKS))]
    tenant_quota: Option<usize>,
    #[command(flatten)]
    budget: crate::BudgetArgs,
    #[command(flatten)]
    tiers: crate::TierArgs,
    /// Token slots per block.
    #[arg(long, default_value_t = kvlab_paged::DEFAULT_BLOCK_SIZE, value_parser = usize_in(1, MAX_BLOCK_SIZE))]
    block_size: usize,
    #[command(flatten)]
    kv: crate::KvArgs,
    #[command(flatten)]
    spec: crate::speculative::SpecArgs,
    /// Which requests share prefix-cache blocks: `salt` (those of the same `cache_salt`, or
    /// with none; vLLM's rule), `user` (those of the same OpenAI `user` and `cache_salt`: no
    /// tenant can time another's cached prompts), `none` (all; `cache_salt` refused).
    #[arg(long, default_value = "salt", value_parser = ["salt", "user", "none"])]
    prefix_isolation: String,
    /// Directory for saved sessions: `POST /slots/{id}?action=save|restore` writes and reads a
    /// conversation's cached blocks there (llama.cpp's flag), so that it survives a restart;
    /// restored blocks come back through host memory (--host-tier-blocks, 1024 unless given).
    #[arg(long, value_name = "DIR")]
    slot_save_path: Option<std::path::PathBuf>,
    /// Require `Authorization: Bearer KEY` on every route (401 otherwise).
    #[arg(long, env = "KVLAB_API_KEY", hide_env_values = true)]
    api_key: Option<String>,
    /// Sleep this many milliseconds after every engine step, so that the live page at `/` can
    /// be followed by eye (teaching only; 0: full speed).
    #[arg(long, default_value_t = 0, value_parser = usize_in(0, 10_000))]
    step_delay_ms: usize,
}

/// A paged engine as the server's engine thread takes it, with an optional pause per step.
struct PagedExecutor {
    engine: Box<dyn PagedEngine>,
    step_delay: Duration,
}

impl StepExecutor for PagedExecutor {
    type Error = kvlab_model::Error;

    fn execute(&mut self, input: &ModelInput) -> Result<Vec<Vec<f32>>, Self::Error> {
        let logits = self.engine.execute(input);
        if !self.step_delay.is_zero() {
            std::thread::sleep(self.step_delay);
        }
        logits
    }

    fn read_block(
        &mut self,
        group: usize,
        block: kvlab_paged::BlockId,
    ) -> Result<Option<Vec<u8>>, Self::Error> {
        self.engine.read_block(group, block)
    }

    fn write_block(
        &mut self,
        group: usize,
        block: kvlab_paged::BlockId,
        bytes: &[u8],
    ) -> Result<bool, Self::Error> {
        self.engine.write_block(group, block, bytes)
    }
}

pub fn run(a: Args) -> Result<()> {
    let loaded = a.run.start()?;
    let tokenizer = loaded
        .tokenizer
        .with_context(|| format!("{} has no tokenizer", loaded.name))?;
    let model = Arc::new(loaded.model);
    let native = model.config.max_seq_len.min(MAX_MODEL_LEN);
    let max_model_len = match a.ctx_size {
        Some(c) if c > native => bail!(
            "--ctx-size {c} is beyond {}'s context of {native} positions",
            loaded.name
        ),
        Some(c) => c,
        None => native,
    };
    let pool = match a.num_blocks {
        Some(num_blocks) => PoolOptions {
            num_blocks,
            block_size: a.block_size,
            kv_dtype: a.kv.kv_dtype,
        },
        None => {
            PoolOptions::for_sequences(4, max_model_len, a.block_size).with_kv_dtype(a.kv.kv_dtype)
        }
    };
    let stop_ids = model.config.stop_ids.clone();
    let vocab_size = model.config.vocab_size;
    let chat = tokenizer.chat_template().is_some();
    let kind = a.engine;
    let namespace = || {
        let (name, files) = (loaded.name.as_str(), loaded.files.as_slice());
        let (weights, dtype) = (a.run.model.weights, a.kv.kv_dtype);
        crate::tiers::remote_namespace((name, files), weights, kind.name(), dtype, a.block_size)
    };
    if a.slot_save_path.is_some() && a.no_enable_prefix_caching {
        bail!(
            "--slot-save-path restores a conversation's blocks through the prefix cache; drop --no-enable-prefix-caching"
        );
    }
    // Computed once (it hashes the model files), and only when something shares blocks.
    let shared = a.tiers.remote_tier.is_some() || a.slot_save_path.is_some();
    let ns = shared.then(namespace).transpose()?;
    let tiers = a.tiers.config(a.slot_save_path.is_some(), || {
        ns.clone().context("the model's namespace")
    })?;
    let slots = match (&a.slot_save_path, ns) {
        (Some(dir), Some(ns)) => {
            std::fs::create_dir_all(dir)
                .with_context(|| format!("--slot-save-path {}: cannot create it", dir.display()))?;
            Some((dir.clone(), ns))
        }
        _ => None,
    };
    let (eviction, tenant_quota) = (a.eviction, a.tenant_quota);
    let (enable_prefix_caching, budget) = (!a.no_enable_prefix_caching, a.budget);
    let step_delay = Duration::from_millis(a.step_delay_ms as u64);
    let spec = a.spec.plan(&a.run.model, &model.config)?;
    let kv_dtype = a.kv.kv_dtype;
    let engine = kvlab_serve::spawn_engine(
        move || {
            let e = build_paged(kind, model, pool).map_err(|e| format!("{e:#}"))?;
            let config = budget.apply(SchedulerConfig {
                eviction_policy: eviction,
                tenant_quota,
                tiers,
                enable_prefix_caching,
                ..SchedulerConfig::new(e.kv_cache().clone(), max_model_len)
            });
            let executor = PagedExecutor {
                engine: e,
                step_delay,
            };
            // A draft model runs on the cpu engine, one cache per sequence.
            let drafter = match &spec {
                Some(plan) => {
                    let spec = (plan.build(EngineKind::Cpu, max_model_len, kv_dtype))
                        .map_err(|e| format!("{e:#}"))?;
                    Some(kvlab_model::Drafter::new(spec, max_model_len))
                }
                None => None,
            };
            Ok(EngineParts {
                executor: Box::new(executor) as Executor,
                config,
                drafter,
            })
        },
        &loaded.name,
        stop_ids,
    )?;
    let state = Arc::new(
        AppState::new(
            engine,
            Arc::new(tokenizer),
            loaded.name.clone(),
            a.max_waiting,
        )
        .with_api_key(a.api_key.clone())
        .with_model_vocab(vocab_size)
        .with_slots(slots)
        .with_prefix_isolation(a.prefix_isolation.parse().map_err(anyhow::Error::msg)?),
    );
    // One HTTP worker thread: the cores belong to the engine thread and its helpers, and the
    // handlers' work (about 15 µs of CPU per streamed token, mostly the kernel's TCP) comes in
    // one burst per engine step, which one worker takes in one wake-up. With two workers,
    // `cargo xtask bench --serve` on the 2-core AMD EPYC measured about a third more HTTP CPU
    // time per token and a judged ratio 0.01-0.03 lower (three interleaved runs each).
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(1)
        .enable_all()
        .build()
        .context("starting the tokio runtime")?;
    runtime.block_on(async move {
        let listener = tokio::net::TcpListener::bind((a.host.as_str(), a.port))
            .await
            .with_context(|| format!("binding {}:{}", a.host, a.port))?;
        let addr = listener.local_addr()?;
        eprintln!(
            "kvlab serve: {} on {} ({} x {} tokens, {} positions per sequence) at http://{addr}\n  POST /v1/completions, /v1/chat/completions ({}); GET /v1/models, /health, /metrics; the pool live at http://{addr}/",
            loaded.name,
            kind.name(),
            kvlab_cli::plural(pool.num_blocks, "block"),
            pool.block_size,
            max_model_len,
            if chat {
                "messages through the model's chat template"
            } else {
                "refused: this model has no chat template"
            },
        );
        kvlab_serve::serve(
            listener,
            kvlab_serve::router(state, DEFAULT_BODY_LIMIT),
            shutdown_signal(),
        )
        .await
        .context("serving")?;
        eprintln!("kvlab serve: stopped (every open request finished)");
        Ok(())
    })
}

/// Completes on SIGINT (Ctrl-C) or SIGTERM: the server then stops accepting and lets the open
/// requests finish.
async fn shutdown_signal() {
    let interrupt = async {
        if tokio::signal::ctrl_c().await.is_err() {
            std::future::pending::<()>().await;
        }
    };
    #[cfg(unix)]
    let terminate = async {
        match tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate()) {
            Ok(mut s) => {
                s.recv().await;
            }
            Err(_) => std::future::pending::<()>().await,
        }
    };
    #[cfg(not(unix))]
    let terminate = std::future::pending::<()>();
    tokio::select! {
        () = interrupt => {}
        () = terminate => {}
    }
    eprintln!("kvlab serve: shutting down, finishing open requests");
}

//! `kvlab`: generate text through any engine, inspect a model's KV-cache footprint.
//!
//! stdout carries only generated text (as llama2.c's run.c prints it); stats and logs go to stderr.

mod batch;
mod chat;
mod evict;
mod generate;
mod info;
mod mem;
mod models;
mod serve;
mod speculative;
mod waste;

use std::path::PathBuf;

use clap::{Parser, Subcommand};

#[derive(Parser)]
#[command(
    name = "kvlab",
    version,
    about = "Learn and measure KV caching for LLM inference"
)]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

/// The CPU engines' worker threads, for the commands that run an engine.
#[derive(clap::Args, Clone, Copy)]
pub struct ThreadArgs {
    /// Worker threads of the CPU engines (llama.cpp's -t). Default: this machine's physical
    /// cores (hyper-threads share a core's vector units, so they rarely speed up decode);
    /// RAYON_NUM_THREADS also sets it.
    #[arg(long, short = 't', value_parser = kvlab_cli::args::usize_in(1, 4096))]
    pub threads: Option<usize>,
}

impl ThreadArgs {
    /// Starts the thread team with `--threads` threads, if given (before any engine runs).
    ///
    /// # Errors
    /// When the OS refuses the threads.
    pub fn apply(self) -> anyhow::Result<()> {
        if let Some(n) = self.threads {
            kvlab_cpu::set_num_threads(n).map_err(|e| anyhow::anyhow!("--threads {n}: {e}"))?;
        }
        Ok(())
    }
}

/// What every command that runs a model takes: the model, and the CPU engines' threads.
#[derive(clap::Args, Clone)]
pub struct RunArgs {
    #[command(flatten)]
    model: ModelArgs,
    #[command(flatten)]
    threads: ThreadArgs,
}

impl RunArgs {
    /// Starts the thread team, then loads the model ([`load`]).
    ///
    /// # Errors
    /// As [`ThreadArgs::apply`] and [`load`].
    pub fn start(&self) -> anyhow::Result<kvlab_model::registry::Loaded> {
        self.threads.apply()?;
        load(&self.model)
    }
}

/// Where the model comes from.
#[derive(clap::Args, Clone)]
pub struct ModelArgs {
    /// A model name from fixtures/models.json (found through $KVLAB_MODELS, the cache, or
    /// downloaded), a path to a llama2.c .bin, a .gguf file or a Hugging Face folder
    /// (config.json, safetensors, tokenizer.json), or a Hugging Face hub id such as
    /// Qwen/Qwen3-0.6B (downloaded into the hf-hub cache; with --offline, read from it).
    #[arg(long, short = 'm', default_value = "stories260K")]
    pub model: String,
    /// llama2.c tokenizer.bin to use instead of the model's own.
    #[arg(long)]
    pub tokenizer: Option<PathBuf>,
    /// Never download; fail if the files are not found locally.
    #[arg(long)]
    pub offline: bool,
    /// How the weight matrices are held: `stored` keeps the checkpoint's types (f32 for
    /// llama2.c files; a GGUF's Q8_0/Q5_0/Q4_K/Q6_K/F16/BF16 blocks as they are, like
    /// llama.cpp), `f32` decodes every matrix, `bf16`/`f16` convert every matrix at load (half
    /// the bytes of f32). Norm gains stay f32.
    #[arg(long, default_value_t = kvlab_model::WeightFormat::Stored,
          value_parser = clap::builder::TypedValueParser::map(
              clap::builder::PossibleValuesParser::new(kvlab_model::WeightFormat::ALL.map(|f| f.name())),
              |s| s.parse::<kvlab_model::WeightFormat>().expect("a listed value")))]
    pub weights: kvlab_model::WeightFormat,
}

/// How the engine stores the KV cache.
#[derive(clap::Args, Clone, Copy)]
pub struct KvArgs {
    /// The type the KV cache stores keys and values in: f32 (as computed), f16, bf16,
    /// fp8-e4m3 and int8 with a scale per token and KV head, or int4 (KIVI: keys per channel
    /// over a group of tokens, values per 32 channels); quantized when written, dequantized
    /// inside attention. The cpu, cpu-paged and cuda engines store every dtype.
    #[arg(long, default_value_t = kvlab_model::KvDtype::F32,
          value_parser = kvlab_cli::args::kv_dtype())]
    pub kv_dtype: kvlab_model::KvDtype,
}

/// The scheduler's step budget and chunked prefill (vLLM's flags), for `batch` and `serve`.
#[derive(clap::Args, Clone, Copy)]
pub struct BudgetArgs {
    /// Most tokens computed in one step: prompt tokens plus one per running decode (default:
    /// 2,048 or the context, whichever is larger). With chunked prefill any value from 1 works.
    #[arg(long, value_parser = kvlab_cli::args::usize_in(1, kvlab_cli::args::MAX_POSITIONS))]
    pub max_num_batched_tokens: Option<usize>,
    /// Prefill a prompt that does not fit what the step has left in chunks, one per step after
    /// the running decodes, each attending over the chunks already cached (on by default, as in
    /// vLLM v1; the flag is accepted for vLLM's command lines).
    #[arg(long, overrides_with = "no_enable_chunked_prefill")]
    pub enable_chunked_prefill: bool,
    /// Prefill every prompt whole in one step: --max-num-batched-tokens must then cover the
    /// context, and a long prompt stalls the running decodes for its whole prefill.
    #[arg(long, overrides_with = "enable_chunked_prefill")]
    pub no_enable_chunked_prefill: bool,
}

impl BudgetArgs {
    /// `config` with these flags applied.
    pub fn apply(self, config: kvlab_paged::SchedulerConfig) -> kvlab_paged::SchedulerConfig {
        kvlab_paged::SchedulerConfig {
            max_num_batched_tokens: self
                .max_num_batched_tokens
                .unwrap_or(config.max_num_batched_tokens),
            enable_chunked_prefill: !self.no_enable_chunked_prefill,
            ..config
        }
    }
}

/// Tiers below a paged engine's pool: evicted prefix-cache blocks are spilled to host memory,
/// then to files, and restored on a later hit instead of recomputed.
#[derive(clap::Args, Clone)]
pub struct TierArgs {
    /// Blocks per KV cache group kept in host memory below the pool (0: none).
    #[arg(long, default_value_t = 0, value_parser = kvlab_cli::args::usize_in(0, kvlab_cli::args::MAX_NUM_BLOCKS))]
    pub host_tier_blocks: usize,
    /// Directory for a disk tier below host memory (a subdirectory per run, removed at the
    /// end); blocks are written with a CRC-32 and a corrupt file is a miss.
    #[arg(long)]
    pub disk_tier: Option<std::path::PathBuf>,
    /// Blocks per KV cache group the disk tier holds.
    #[arg(long, default_value_t = 4096, value_parser = kvlab_cli::args::usize_in(1, kvlab_cli::args::MAX_NUM_BLOCKS))]
    pub disk_tier_blocks: usize,
    /// Scheduler steps a spilled block may stay below before it is dropped (default: until
    /// the tiers are full and it is the oldest).
    #[arg(long, value_parser = kvlab_cli::args::usize_in(1, 1 << 40))]
    pub tier_ttl_steps: Option<usize>,
    /// Restore a request's spilled levels only when faster than recomputing them, by the cost
    /// model NS_PER_TOKEN,HOST_BYTES_PER_S,DISK_BYTES_PER_S (prefill nanoseconds per token;
    /// bytes per second restored from memory and from files; `cargo xtask bench --tiers`
    /// prints this machine's). Default: always restore.
    #[arg(long, value_name = "NS,HOST_BPS,DISK_BPS", value_parser = parse_restore_cost)]
    pub restore_cost: Option<kvlab_paged::RestoreCost>,
}

/// `--restore-cost NS_PER_TOKEN,HOST_BYTES_PER_S,DISK_BYTES_PER_S`.
fn parse_restore_cost(s: &str) -> Result<kvlab_paged::RestoreCost, String> {
    let v: Vec<u64> = s
        .split(',')
        .map(|x| x.trim().parse::<u64>())
        .collect::<Result<_, _>>()
        .map_err(|e| format!("{s:?}: {e}; expected three whole numbers NS,HOST_BPS,DISK_BPS"))?;
    match v[..] {
        [ns, host, disk] if host > 0 && disk > 0 => Ok(kvlab_paged::RestoreCost {
            prefill_ns_per_token: ns,
            host_bytes_per_s: host,
            disk_bytes_per_s: disk,
        }),
        _ => Err(format!(
            "{s:?}: expected NS_PER_TOKEN,HOST_BYTES_PER_S,DISK_BYTES_PER_S with both rates above 0"
        )),
    }
}

impl TierArgs {
    /// The tiers asked for, `None` when neither flag is given.
    pub fn config(&self) -> Option<kvlab_paged::TierConfig> {
        let host = kvlab_paged::TierConfig::host(self.host_tier_blocks)
            .with_ttl_steps(self.tier_ttl_steps.map(|s| s as u64))
            .with_restore_cost(self.restore_cost);
        match &self.disk_tier {
            Some(dir) => Some(host.with_disk(dir, self.disk_tier_blocks)),
            None => (self.host_tier_blocks > 0).then_some(host),
        }
    }
}

/// One line on what the tiers did, from a run's metrics.
pub fn tier_summary(m: &kvlab_paged::Metrics) -> String {
    let t = &m.tier_store;
    format!(
        "tiers: {} blocks spilled, {} restored ({} read back from disk, {} declined by the cost model), {} dropped ({} full, {} expired, {} computed again, {} lost); now {} blocks ({}) in host memory and {} ({}) on disk; {} unreadable files, {} failed writes; prefix-cache hit tokens by tier: {} pool, {} host, {} disk",
        m.num_spills,
        m.num_restores,
        bytes(t.bytes_read_from_disk as usize),
        m.num_restores_declined,
        m.tier_drops.total(),
        m.tier_drops.full,
        m.tier_drops.expired,
        m.tier_drops.recomputed,
        m.tier_drops.lost,
        t.host_blocks,
        bytes(t.host_bytes as usize),
        t.disk_blocks,
        bytes(t.disk_bytes as usize),
        t.disk_read_errors,
        t.disk_write_errors,
        m.prefix_cache_hits_by_tier.pool,
        m.prefix_cache_hits_by_tier.host,
        m.prefix_cache_hits_by_tier.disk
    )
}

#[derive(Subcommand)]
enum Command {
    /// Generate text from a prompt, streaming it to stdout.
    Generate(generate::Args),
    /// A multi-turn conversation through the model's chat template, one stdin line per turn,
    /// the KV cache kept between turns (reused and new tokens printed per turn).
    Chat(chat::Args),
    /// Print a model's config and KV bytes per token.
    Info(info::Args),
    /// Several prompts at once through the continuous-batching scheduler and a paged engine.
    Batch(batch::Args),
    /// Write a model (a synthetic one, typically) as a llama2.c checkpoint, so run.c or any
    /// llama2.c port can run the same weights, or as a `llama` GGUF (with its tokenizer) for
    /// llama.cpp.
    Export {
        #[command(flatten)]
        model: ModelArgs,
        /// Output path: FILE.gguf writes a GGUF of architecture llama (f32), anything else a
        /// llama2.c .bin.
        #[arg(long, short)]
        out: std::path::PathBuf,
    },
    /// KV-cache memory calculator: bytes per token, sequence and batch; how many sequences fit.
    Mem(mem::Args),
    /// Reserved-but-empty KV memory: max-length preallocation vs paging.
    Waste(waste::Args),
    /// Prefix-cache eviction policies (LRU, LFU, CLOCK, leaf-first) compared on chat sessions
    /// with shared system prompts, at several pool sizes.
    Evict(evict::Args),
    /// The models kvlab knows (fixtures/models.json): what each is, where its files were found
    /// or how to get them.
    Models(models::Args),
    /// An OpenAI-compatible HTTP server (/v1/completions, streaming) over a paged engine.
    Serve(serve::Args),
}

fn main() {
    tracing_subscriber::fmt()
        .with_writer(std::io::stderr)
        .with_env_filter(
            tracing_subscriber::EnvFilter::try_from_env("KVLAB_LOG")
                .unwrap_or_else(|_| "warn".into()),
        )
        .init();
    let cli = Cli::parse();
    let result = match cli.command {
        Command::Generate(args) => generate::run(args),
        Command::Chat(args) => chat::run(args),
        Command::Info(args) => info::run(&args),
        Command::Mem(args) => mem::run(args),
        Command::Export { model, out } => load(&model).and_then(|l| {
            if out
                .extension()
                .is_some_and(|e| e.eq_ignore_ascii_case("gguf"))
            {
                let tok = l.tokenizer.as_ref().ok_or_else(|| {
                    anyhow::anyhow!("{} has no tokenizer, and a GGUF carries one", l.name)
                })?;
                let file = kvlab_model::gguf_write::llama_gguf(&l.model, tok)?.build();
                std::fs::write(&out, file)
                    .map_err(|e| anyhow::anyhow!("writing {}: {e}", out.display()))?;
            } else {
                kvlab_model::llama2c::write(&l.model, &out)?;
            }
            eprintln!(
                "wrote {} ({}) to {}",
                l.name,
                bytes(std::fs::metadata(&out)?.len() as usize),
                out.display()
            );
            Ok(())
        }),
        Command::Batch(args) => batch::run(args),
        Command::Waste(args) => waste::run(args),
        Command::Evict(args) => evict::run(args),
        Command::Models(args) => models::run(args),
        Command::Serve(args) => serve::run(args),
    };
    if let Err(e) = result {
        eprintln!("error: {e:#}");
        std::process::exit(1);
    }
}

/// Loads the model the arguments name, its matrices in the `--weights` format.
pub fn load(m: &ModelArgs) -> anyhow::Result<kvlab_model::registry::Loaded> {
    let mut l = kvlab_cli::fetch::load(&m.model, m.tokenizer.as_deref(), !m.offline)?;
    l.model = l.model.with_weight_format(m.weights);
    Ok(l)
}

/// Bytes as a human reads them (binary units), with the exact count.
pub fn bytes(n: usize) -> String {
    kvlab_cli::human_bytes(n as f64)
}

#[cfg(test)]
mod tests {
    use clap::CommandFactory;

    use super::Cli;

    /// Every flag of every subcommand says what it does in `--help`.
    #[test]
    fn every_flag_has_help_text() {
        fn walk(cmd: &clap::Command, path: &str, missing: &mut Vec<String>) {
            for arg in cmd.get_arguments() {
                let builtin = matches!(arg.get_id().as_str(), "help" | "version");
                if !builtin && arg.get_help().is_none() && arg.get_long_help().is_none() {
                    missing.push(format!("{path} --{}", arg.get_id()));
                }
            }
            for sub in cmd.get_subcommands() {
                walk(sub, &format!("{path} {}", sub.get_name()), missing);
            }
        }
        let mut missing = Vec::new();
        walk(&Cli::command(), "kvlab", &mut missing);
        assert!(missing.is_empty(), "flags without help: {missing:?}");
    }

    /// `-t/--threads` is offered by the commands that run an engine, and only by them.
    #[test]
    fn threads_only_where_an_engine_runs() {
        let cli = Cli::command();
        let with: Vec<&str> = cli
            .get_subcommands()
            .filter(|s| s.get_arguments().any(|a| a.get_id() == "threads"))
            .map(|s| s.get_name())
            .collect();
        assert_eq!(with, ["generate", "chat", "batch", "evict", "serve"]);
    }
}

//! `kvlab`: generate text through any engine, inspect a model's KV-cache footprint.
//!
//! stdout carries only generated text (as llama2.c's run.c prints it); stats and logs go to stderr.

mod batch;
mod chat;
mod depth;
mod evict;
mod generate;
mod info;
mod mem;
mod models;
mod serve;
mod speculative;
mod tiers;
mod waste;

use std::path::PathBuf;

use clap::{Parser, Subcommand};

pub use tiers::{TierArgs, tier_summary};

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
    /// What the products with quantized matrices (Q8_0, Q5_0, Q4_K, Q6_K) round the
    /// activations to: `f32` keeps them as computed (the path `verify` proves token-identical
    /// across engines); `q8` rounds them to 8 bits in blocks of 32 and uses integer dot
    /// products (AVX-512 VNNI), as llama.cpp does: faster prompts, logits within the rounding
    /// (`cargo xtask verify` reports the agreement). CPU engines; elsewhere f32.
    #[arg(long, default_value_t = kvlab_model::Activations::F32,
          value_parser = kvlab_cli::args::activations())]
    pub activations: kvlab_model::Activations,
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

#[derive(Subcommand)]
enum Command {
    /// Generate text from a prompt, streaming it to stdout.
    Generate(generate::Args),
    /// A multi-turn conversation through the model's chat template, one stdin line per turn,
    /// the KV cache kept between turns (reused and new tokens printed per turn).
    Chat(chat::Args),
    /// Print a model's config and KV bytes per token.
    Info(info::Args),
    /// Decode speed against context depth (llama-bench's -d): fill one sequence to each depth,
    /// time greedy decode steps there; the KV bytes each step reads beside it.
    Depth(depth::Args),
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
        Command::Depth(args) => depth::run(args),
        Command::Info(args) => info::run(&args),
        Command::Mem(args) => mem::run(args),
        Command::Export { model, out } => load(&model).and_then(|l| {
            if out
                .extension()
                .is_some_and(|e| e.eq_ignore_ascii_case("gguf"))
            {
                let tok = tokenizer_of(&l.tokenizer, &l.name)
                    .map_err(|e| e.context("a GGUF carries its tokenizer"))?;
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

/// A loaded model's tokenizer (`tokenizer` and `name` of a [`kvlab_model::registry::Loaded`],
/// taken apart so that its model can still move out).
///
/// # Errors
/// When it has none (a llama2.c or synthetic model without a tokenizer file).
pub fn tokenizer_of<'a>(
    tokenizer: &'a Option<kvlab_model::Tokenizer>,
    name: &str,
) -> anyhow::Result<&'a kvlab_model::Tokenizer> {
    tokenizer
        .as_ref()
        .ok_or_else(|| anyhow::anyhow!("{name} has no tokenizer; pass --tokenizer PATH"))
}

/// Loads the model the arguments name, its matrices in the `--weights` format, their products
/// rounding the activations as `--activations` says.
pub fn load(m: &ModelArgs) -> anyhow::Result<kvlab_model::registry::Loaded> {
    let mut l = kvlab_cli::fetch::load(&m.model, m.tokenizer.as_deref(), !m.offline)?;
    l.model = l
        .model
        .with_weight_format(m.weights)
        .with_activations(m.activations);
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
        assert_eq!(
            with,
            ["generate", "chat", "depth", "batch", "evict", "serve"]
        );
    }
}

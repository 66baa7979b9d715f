//! `cargo xtask <command>`: this file only parses the command line (clap) and dispatches; each
//! command is a module with its options as a clap `Args` struct. [`paths`] holds the workspace
//! paths they share.

mod bench;
mod book;
mod kv_quality;
mod paths;
mod prompts;
mod readme;
mod table;
mod verify;

use clap::{CommandFactory, Parser, Subcommand};

/// kvlab's chores: parity, benchmarks, the book and the README's generated parts.
#[derive(Parser)]
#[command(name = "cargo xtask", bin_name = "cargo xtask")]
struct Cli {
    #[command(subcommand)]
    command: Option<Command>,
}

#[derive(Subcommand)]
enum Command {
    /// Prove every engine gives the naive engine's greedy tokens on every model and prompt
    Verify(verify::Opts),
    /// Build the mdBook in docs/ and run every Reproduce-it command in it
    Book(book::Opts),
    /// Latency, throughput, memory and roofline of every engine; JSON, table and plots under
    /// target/kvlab-bench/ (--serve, --peers, --tiers, --eviction, --chunked-prefill,
    /// --speculative, --cluster: the side benches). Boxed: its options are most of the enum.
    Bench(Box<bench::Opts>),
    /// Load-test `kvlab serve` over HTTP against `kvlab batch` on the same prompts; writes
    /// serve.json and serve_load.svg/.png (also `bench --serve`)
    Load(bench::serve::LoadArgs),
    /// kvlab generate against llama2.c's run.c and llama.cpp on the same weights, interleaved;
    /// writes peers.json (also `bench --peers`)
    Peers(bench::peers::PeersArgs),
    /// Decode speed against context depth (512 to 32k positions), kvlab against llama.cpp with
    /// and without flash attention; writes depth.json and depth.svg/.png (also `bench --depth`)
    Depth(bench::depth::DepthArgs),
    /// Top-1, KL divergence, perplexity, bytes and decode speed of each --kv-dtype against the
    /// f32 cache on real checkpoints
    KvQuality(kv_quality::Args),
    /// Render README.md's headline table and benches/README.md from benches/*.json (--check:
    /// fail if either is stale)
    Readme(readme::Opts),
    /// The peak-RSS child process that bench starts (bench/memory.rs)
    #[command(name = "__rss", hide = true)]
    Rss {
        /// MODEL ENGINE CONTEXT POSITIONS
        #[arg(num_args = 4)]
        args: Vec<String>,
    },
}

fn main() -> anyhow::Result<()> {
    let cli = Cli::parse();
    match cli.command {
        Some(Command::Verify(o)) => verify::run(o),
        Some(Command::Book(o)) => book::run(o),
        Some(Command::Bench(o)) => {
            // bench.json records the words bench was given.
            let args: Vec<String> = std::env::args().skip(2).collect();
            bench::run(*o, &args)
        }
        Some(Command::Load(a)) => bench::serve::command(&a),
        Some(Command::Peers(a)) => bench::peers::command(&a),
        Some(Command::Depth(a)) => bench::depth::command(&a),
        Some(Command::KvQuality(a)) => kv_quality::run(a),
        Some(Command::Readme(o)) => readme::run(o),
        Some(Command::Rss { args }) => bench::rss_child(&args),
        None => {
            Cli::command().print_help()?;
            Ok(())
        }
    }
}

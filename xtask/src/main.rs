//! `cargo xtask <command>`: this file only dispatches; each command is a module.

mod bench;
mod book;
mod kv_quality;
mod prompts;
mod readme;
mod table;
mod verify;

fn main() -> anyhow::Result<()> {
    let args: Vec<String> = std::env::args().skip(1).collect();
    match args.first().map(String::as_str) {
        Some("verify") => verify::run(&args[1..]),
        Some("bench") => bench::run(&args[1..]),
        Some("book") => book::run(&args[1..]),
        Some("kv-quality") => kv_quality::run(&args[1..]),
        Some("readme") => readme::run(&args[1..]),
        Some("help") | Some("--help") | Some("-h") | None => {
            println!("{}", HELP);
            Ok(())
        }
        Some(other) => anyhow::bail!("unknown xtask command {other:?}\n\n{HELP}"),
    }
}

const HELP: &str = "\
cargo xtask <command>

commands:
  verify   prove every engine gives the naive engine's greedy tokens on every model and prompt
           (cargo xtask verify --help for options)
  book     build the mdBook in docs/ and run every Reproduce-it command in it
  bench    latency, throughput, memory and roofline of every engine; JSON, table and plots under
           target/kvlab-bench/ (cargo xtask bench --help for options)
  kv-quality  top-1, KL divergence, perplexity, bytes and decode speed of each --kv-dtype
           against the f32 cache on real checkpoints (cargo xtask kv-quality --help)
  readme   render README.md's headline table and benches/README.md from benches/*.json
           (--check: fail if either is stale)";

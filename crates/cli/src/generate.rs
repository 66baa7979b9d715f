//! `kvlab generate`: run.c's generate, on any engine.

use std::io::Write;
use std::sync::Arc;

use anyhow::{Context, Result};
use kvlab_cli::args::{self, MAX_POSITIONS, usize_in};
use kvlab_model::{GenerateOptions, Sampler, generate_text};

use crate::{ModelArgs, bytes};

#[derive(clap::Args)]
pub struct Args {
    #[command(flatten)]
    model: ModelArgs,
    /// The prompt (empty: start from BOS alone).
    #[arg(long, short, default_value = "")]
    prompt: String,
    /// Positions to compute, prompt included (run.c's -n); 0 or more than the context means the
    /// whole context.
    #[arg(long, short = 'n', default_value_t = 256,
          value_parser = usize_in(0, MAX_POSITIONS))]
    steps: usize,
    /// 0 is greedy (argmax); otherwise 0.001 to 100.
    #[arg(long, short, default_value_t = 1.0, value_parser = args::temperature)]
    temperature: f32,
    /// Nucleus sampling threshold, greater than 0 and at most 1; 1 disables it.
    #[arg(long, default_value_t = 0.9, value_parser = args::top_p)]
    top_p: f32,
    /// Seed of the sampler's RNG.
    #[arg(long, short, default_value_t = 42)]
    seed: u64,
    /// Engine: naive or cpu.
    #[arg(long, short, default_value = "cpu")]
    engine: String,
    /// Positions the engine reserves (default: the model's context).
    #[arg(long, value_parser = usize_in(1, MAX_POSITIONS))]
    max_seq_len: Option<usize>,
    /// Print, for every step, the tokens fed and the shapes and bytes of the cache (to stderr).
    #[arg(long)]
    trace: bool,
}

pub fn run(a: Args) -> Result<()> {
    let loaded = crate::load(&a.model)?;
    let tok = loaded
        .tokenizer
        .as_ref()
        .with_context(|| format!("{} has no tokenizer; pass --tokenizer PATH", loaded.name))?;
    let model = Arc::new(loaded.model);
    let config = model.config.clone();
    let reserve = a.max_seq_len.unwrap_or(config.max_seq_len);
    if a.engine != "naive" {
        // The cached engines reserve this many positions (ring buffers for windowed layers).
        kvlab_cli::memory::ensure_fits(
            "the KV cache",
            u64::try_from(config.kv_bytes_windowed(reserve, 4)).ok(),
            "lower --max-seq-len",
        )?;
    }
    let mut engine = kvlab_cli::engines::build(&a.engine, model)?;
    let opts = GenerateOptions {
        steps: a.steps,
        max_seq_len: a.max_seq_len.unwrap_or(0),
        trace: a.trace,
    };
    let mut sampler = Sampler::new(a.temperature, a.top_p, a.seed)?;
    let mut out = std::io::stdout().lock();
    let g = generate_text(
        engine.as_mut(),
        tok,
        &a.prompt,
        &opts,
        &mut sampler,
        |s| {
            let _ = out.write_all(s.as_bytes());
            let _ = out.flush();
        },
        |pos, fed, step| {
            eprintln!("[trace] pos {pos:>5} fed {fed:?} len {}", step.len);
            for (l, shape) in step.layer_cache_shapes.iter().enumerate() {
                eprintln!("[trace]   layer {l:>2} K,V {shape}");
            }
            if let Some(bt) = &step.block_table {
                eprintln!("[trace]   block_table {bt:?}");
            }
            if let Some(sm) = &step.slot_mapping {
                eprintln!("[trace]   slot_mapping {sm:?}");
            }
        },
    )?;
    // A closed pipe (`kvlab generate | head`) is not an error worth reporting.
    let _ = writeln!(out);
    drop(out);
    eprintln!(
        "engine {} | prompt {} tokens | prefill {:.1} tok/s | decode {} tokens at {:.1} tok/s{}",
        engine.name(),
        g.prompt.len(),
        g.prefill_tokens_per_s(),
        g.decode_steps,
        g.decode_tokens_per_s(),
        if g.stopped {
            " | stopped at a stop token"
        } else {
            ""
        }
    );
    let positions = g.prompt.len() + g.decode_steps;
    eprintln!(
        "KV cache: {} used, {} reserved (formula: {} per token x {positions} positions = {}{})",
        bytes(g.kv.used_bytes),
        bytes(g.kv.reserved_bytes),
        bytes(config.kv_bytes_per_token(4)),
        bytes(config.kv_bytes_full(positions, 4)),
        if config.kv_bytes_windowed(positions, 4) != config.kv_bytes_full(positions, 4) {
            format!(
                "; with sliding-window ring buffers {}",
                bytes(config.kv_bytes_windowed(positions, 4))
            )
        } else {
            String::new()
        }
    );
    Ok(())
}

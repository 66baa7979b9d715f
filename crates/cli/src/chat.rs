//! `kvlab chat`: a conversation with a model through its chat template, one line of stdin per
//! user turn, the KV cache kept between turns (`kvlab_model::chat::ChatSession`). After each
//! reply it prints, on stderr, how many tokens of the conversation came from the cache and how
//! many were prefilled: the multi-turn lesson of a KV cache.

use std::io::{BufRead, IsTerminal, Write};
use std::sync::Arc;

use anyhow::{Context, Result, bail};
use kvlab_cli::args::{self, MAX_POSITIONS, usize_in};
use kvlab_engines::{self as engines, EngineKind};
use kvlab_model::Sampler;
use kvlab_model::chat::ChatSession;

use crate::KvArgs;

#[derive(clap::Args)]
pub struct Args {
    #[command(flatten)]
    run: crate::RunArgs,
    /// A system message opening the conversation (the template decides whether it accepts one).
    #[arg(long)]
    system: Option<String>,
    /// Most tokens per reply (llama.cpp's -n); a reply also ends at a stop token.
    #[arg(long = "n-predict", short = 'n', default_value_t = 256,
          value_parser = usize_in(1, MAX_POSITIONS))]
    n_predict: usize,
    /// Sampling temperature: 0 is greedy (argmax); otherwise 0.001 to 100.
    #[arg(long = "temp", visible_alias = "temperature", default_value_t = 0.8,
          value_parser = args::temperature)]
    temperature: f32,
    /// Nucleus sampling threshold, greater than 0 and at most 1; 1 disables it.
    #[arg(long, default_value_t = 0.9, value_parser = args::top_p)]
    top_p: f32,
    /// Seed of the sampler's RNG.
    #[arg(long, short = 's', default_value_t = 42)]
    seed: u64,
    /// The engine (its cache is kept across turns; the cpu and naive engines can also cut it
    /// back where a turn's text differs from what was cached).
    #[arg(long, short = 'e', default_value_t = EngineKind::Cpu,
          value_parser = engines::value_parser(&EngineKind::ALL))]
    engine: EngineKind,
    /// Context positions of the whole conversation (llama.cpp's -c; default: the model's, at
    /// most 4096).
    #[arg(long = "ctx-size", short = 'c', value_parser = usize_in(1, MAX_POSITIONS))]
    ctx_size: Option<usize>,
    #[command(flatten)]
    kv: KvArgs,
}

pub fn run(a: Args) -> Result<()> {
    let loaded = a.run.start()?;
    let tok = crate::tokenizer_of(&loaded.tokenizer, &loaded.name)?;
    let Some(template) = tok.chat_template() else {
        bail!(
            "{} has no chat template (llama2.c checkpoints have none; a Hugging Face folder keeps it in chat_template.jinja or tokenizer_config.json, a GGUF in tokenizer.chat_template); use `kvlab generate -p` with a plain prompt",
            loaded.name
        );
    };
    let model = Arc::new(loaded.model);
    let ctx = a
        .ctx_size
        .unwrap_or(model.config.max_seq_len.min(4096))
        .min(model.config.max_seq_len);
    if a.engine.has_cache() {
        kvlab_engines::memory::ensure_fits(
            "the KV cache",
            u64::try_from(model.config.kv_bytes_windowed(ctx, 4)).ok(),
            "lower --ctx-size",
        )?;
    }
    let mut engine = engines::build_for(a.engine, model, ctx, a.kv.kv_dtype)?;
    let mut sampler = Sampler::new(a.temperature, a.top_p, a.seed)?;
    let mut chat = ChatSession::new(template.clone(), a.system.as_deref(), ctx);
    let interactive = std::io::stdin().is_terminal();
    if interactive {
        eprintln!(
            "chatting with {} on {} ({ctx} positions); an empty line or Ctrl-D ends",
            loaded.name,
            engine.name()
        );
    }
    let mut out = std::io::stdout().lock();
    for (turn, line) in std::io::stdin().lock().lines().enumerate() {
        let line = line.context("reading stdin")?;
        if line.trim().is_empty() {
            break;
        }
        if interactive {
            eprint!("assistant: ");
        }
        let stats = chat.turn(
            engine.as_mut(),
            tok,
            &mut sampler,
            &line,
            a.n_predict,
            |s| {
                let _ = out.write_all(s.as_bytes());
                let _ = out.flush();
            },
        );
        let stats = match stats {
            Ok(s) => s,
            Err(e @ kvlab_model::Error::ChatTemplate(_)) => {
                eprintln!("error: {e}");
                continue;
            }
            Err(e) => return Err(e.into()),
        };
        let _ = writeln!(out);
        eprintln!(
            "[turn {}] reused {} cached tokens, prefilled {} new, generated {}{} | {} of {ctx} positions in the cache",
            turn + 1,
            stats.reused_tokens,
            stats.prefilled_tokens,
            stats.generated_tokens,
            if stats.stopped { " (stop token)" } else { "" },
            stats.cached_tokens
        );
    }
    chat.end(engine.as_mut());
    Ok(())
}

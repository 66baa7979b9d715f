//! `kvlab generate`: run.c's generate, on any engine, with llama.cpp's flag names.

use std::io::Write;
use std::sync::Arc;
use std::time::Instant;

use anyhow::{Context, Result};
use kvlab_cli::args::{self, MAX_POSITIONS, usize_in};
use kvlab_engines::{self as engines, EngineKind};
use kvlab_model::{GenerateOptions, Sampler, generate_ids_text, generate_text};

use crate::{KvArgs, bytes};

/// run.c's default `-n`: positions computed, prompt included.
const RUN_C_STEPS: usize = 256;

#[derive(clap::Args)]
pub struct Args {
    #[command(flatten)]
    run: crate::RunArgs,
    /// The prompt (empty: start from BOS alone).
    #[arg(long, short = 'p', default_value = "")]
    prompt: String,
    /// New tokens to generate after the prompt (llama.cpp's -n); generation also stops at a
    /// stop token or the end of the context. Without it (and without --steps): run.c's 256
    /// positions, prompt included.
    #[arg(long = "n-predict", short = 'n', conflicts_with = "steps",
          value_parser = usize_in(1, MAX_POSITIONS))]
    n_predict: Option<usize>,
    /// Positions to compute, prompt included, as llama2.c's run.c counts its -n (for
    /// side-by-side runs with run.c); 0 means the whole context.
    #[arg(long, value_parser = usize_in(0, MAX_POSITIONS))]
    steps: Option<usize>,
    /// Sampling temperature: 0 is greedy (argmax); otherwise 0.001 to 100.
    #[arg(long = "temp", visible_alias = "temperature", default_value_t = 1.0,
          value_parser = args::temperature)]
    temperature: f32,
    /// Nucleus sampling threshold, greater than 0 and at most 1; 1 disables it.
    #[arg(long, default_value_t = 0.9, value_parser = args::top_p)]
    top_p: f32,
    /// Sample from the k most likely tokens only; 0 keeps all (llama.cpp's --top-k, off here
    /// by default as in run.c).
    #[arg(long, default_value_t = 0, value_parser = usize_in(0, 1 << 20))]
    top_k: usize,
    /// Drop tokens less likely than min-p × the most likely one; 0 is off (the default, as in
    /// run.c).
    #[arg(long, default_value_t = 0.0, value_parser = args::min_p)]
    min_p: f32,
    /// Penalise the last 64 tokens (prompt included): positive logits divided by it, negative
    /// ones multiplied; 1 is off (the default).
    #[arg(long, default_value_t = 1.0, value_parser = args::repeat_penalty)]
    repeat_penalty: f32,
    /// Seed of the sampler's RNG.
    #[arg(long, short = 's', default_value_t = 42)]
    seed: u64,
    /// The engine to run.
    #[arg(long, short = 'e', default_value_t = EngineKind::Cpu,
          value_parser = engines::value_parser(&EngineKind::ALL))]
    engine: EngineKind,
    /// Context positions the engine reserves (llama.cpp's -c; default: the prompt plus the
    /// tokens asked for, at most the model's context).
    #[arg(long = "ctx-size", short = 'c', visible_alias = "max-seq-len",
          value_parser = usize_in(1, MAX_POSITIONS))]
    ctx_size: Option<usize>,
    #[command(flatten)]
    kv: KvArgs,
    /// Most prompt tokens per forward call (llama.cpp's -ub): a longer prompt is prefilled in
    /// chunks, each attending over the chunks already cached; 0 prefills it in one call.
    #[arg(long = "ubatch-size", visible_alias = "ubatch", default_value_t = 512,
          value_parser = usize_in(0, MAX_POSITIONS))]
    ubatch_size: usize,
    #[command(flatten)]
    spec: crate::speculative::SpecArgs,
    /// Print, for every step, the tokens fed and the shapes and bytes of the cache (to stderr).
    #[arg(long)]
    trace: bool,
    /// Print the stats as one JSON object on stderr instead of text (stdout keeps the text).
    #[arg(long)]
    json: bool,
    /// Send the prompt as a user message through the model's chat template and print only the
    /// reply (which starts after the template's assistant opening); `kvlab chat` for several
    /// turns.
    #[arg(long)]
    chat: bool,
    /// Print special tokens (`<|im_end|>`, `<start_of_turn>`) as their text; without it they
    /// print nothing, as in llama.cpp (whose flag this is), transformers and vLLM.
    #[arg(long)]
    special: bool,
}

pub fn run(a: Args) -> Result<()> {
    a.run.threads.apply()?;
    let t_load = Instant::now();
    let loaded = crate::load(&a.run.model)?;
    let load_s = t_load.elapsed().as_secs_f64();
    let tok = crate::tokenizer_of(&loaded.tokenizer, &loaded.name)?;
    let weights = describe_weights(&loaded.model);
    let chat_prompt = chat_prompt(&a, tok, &loaded.name)?;
    let model = Arc::new(loaded.model);
    let config = model.config.clone();
    let context = a.ctx_size.unwrap_or(config.max_seq_len);
    let steps = steps_to_compute(&a, tok, chat_prompt.as_deref(), context);
    let reserve = if steps == 0 {
        context
    } else {
        steps.min(context)
    };
    if a.engine.has_cache() {
        // The cached engines reserve this many positions (ring buffers for windowed layers).
        kvlab_engines::memory::ensure_fits(
            "the KV cache",
            u64::try_from(a.kv.kv_dtype.bytes_windowed(&config, reserve)).ok(),
            "lower --ctx-size or --n-predict",
        )?;
    }
    let threads = kvlab_cpu::threads::num_threads();
    let mut engine = engines::build_for(a.engine, model, reserve, a.kv.kv_dtype)?;
    let opts = GenerateOptions {
        ubatch: a.ubatch_size,
        speculative: match a.spec.plan(&a.run.model, &config)? {
            Some(plan) => Some(plan.build(a.engine, reserve, a.kv.kv_dtype)?),
            None => None,
        },
        steps,
        max_seq_len: a.ctx_size.unwrap_or(0),
        trace: a.trace,
        special: a.special,
    };
    let mut sampler = Sampler::new(a.temperature, a.top_p, a.seed)?
        .with_top_k(a.top_k)
        .with_min_p(a.min_p)?
        .with_repeat_penalty(a.repeat_penalty)?;
    let mut out = std::io::stdout().lock();
    let mut on_text = |s: &str| {
        let _ = out.write_all(s.as_bytes());
        let _ = out.flush();
    };
    let on_trace = print_trace;
    let g = match &chat_prompt {
        Some(ids) => generate_ids_text(
            engine.as_mut(),
            tok,
            ids,
            &opts,
            &mut sampler,
            &mut on_text,
            on_trace,
        )?,
        None => generate_text(
            engine.as_mut(),
            tok,
            &a.prompt,
            &opts,
            &mut sampler,
            &mut on_text,
            on_trace,
        )?,
    };
    // A closed pipe (`kvlab generate | head`) is not an error worth reporting.
    let _ = writeln!(out);
    drop(out);
    // Positions in the cache: the prompt and every token fed back (the last one sampled is
    // printed but never fed).
    let positions = match a.spec.speculative {
        None => g.prompt.len() + g.decode_steps,
        // Every kept token but the last was fed; rejected guesses were rolled back.
        Some(_) => g.prompt.len() + g.tokens.len().saturating_sub(1),
    };
    let kv = a.kv.kv_dtype;
    if a.json {
        let stats = serde_json::json!({
            "model": loaded.name,
            "engine": engine.name(),
            "threads": threads,
            "load_s": load_s,
            "weights": weights,
            "prompt_tokens": g.prompt.len(),
            "generated_tokens": g.tokens.len(),
            "prefill_s": g.prefill_time.as_secs_f64(),
            "prefill_tokens_per_s": g.prefill_tokens_per_s(),
            "decode_steps": g.decode_steps,
            "decode_s": g.decode_time.as_secs_f64(),
            "decode_tokens_per_s": g.decode_tokens_per_s(),
            "stopped_at_stop_token": g.stopped,
            "speculative": g.spec,
            "kv_used_bytes": g.kv.used_bytes,
            "kv_reserved_bytes": g.kv.reserved_bytes,
            "kv_dtype": a.kv.kv_dtype,
            "kv_bytes_per_token": a.kv.kv_dtype.bytes_per_token(&config),
        });
        eprintln!("{stats}");
        return Ok(());
    }
    eprintln!("{weights}");
    eprintln!(
        "engine {} | {threads} threads | load {load_s:.2} s | prompt {} tokens | prefill {:.1} tok/s | generated {} tokens | decode {} steps at {:.1} tok/s{}",
        engine.name(),
        g.prompt.len(),
        g.prefill_tokens_per_s(),
        g.tokens.len(),
        g.decode_steps,
        g.decode_tokens_per_s(),
        if g.stopped {
            " | stopped at a stop token"
        } else {
            ""
        }
    );
    if a.spec.speculative.is_some() {
        let s = g.spec;
        eprintln!(
            "speculative: {} guesses checked in {} steps, {} kept ({:.1}%), {} rollbacks; {:.2} tokens per decode step",
            s.num_draft_tokens,
            s.num_spec_steps,
            s.num_accepted_tokens,
            100.0 * s.acceptance_rate(),
            s.num_rollbacks,
            g.tokens.len().saturating_sub(1) as f64 / g.decode_steps.max(1) as f64
        );
    }
    eprintln!("{}", kv_summary(kv, &config, &g.kv, positions));
    Ok(())
}

/// With `--chat`, the prompt's ids: the chat template's render of one user message (the
/// render writes its own BOS); `None` without `--chat`.
///
/// # Errors
/// When the model has no chat template, or the template fails.
fn chat_prompt(a: &Args, tok: &kvlab_model::Tokenizer, name: &str) -> Result<Option<Vec<u32>>> {
    if !a.chat {
        return Ok(None);
    }
    let template = tok.chat_template().with_context(|| {
        format!(
            "{} has no chat template (llama2.c checkpoints have none); leave out --chat",
            name
        )
    })?;
    let text = template.render(&[kvlab_model::chat::Message::new("user", &a.prompt)], true)?;
    Ok(Some(tok.encode_special(&text, false, false)))
}

/// Positions to compute, prompt included, from `-n` (new tokens) or `--steps` (run.c's).
fn steps_to_compute(
    a: &Args,
    tok: &kvlab_model::Tokenizer,
    chat_prompt: Option<&[u32]>,
    context: usize,
) -> usize {
    // -n counts new tokens, so it needs the prompt's length; a prompt that cannot fit is left
    // to generate_text, which refuses it before encoding.
    match (a.n_predict, a.steps, chat_prompt) {
        // The last prompt position's logits give the first new token, so n new tokens end at
        // position prompt + n − 1.
        (Some(n), _, Some(ids)) => ids.len() + n - 1,
        (Some(n), _, None) if tok.min_tokens(&a.prompt) < context => {
            tok.encode_special(&a.prompt, true, false).len() + n - 1
        }
        (Some(_), _, None) => context,
        (None, Some(s), _) => s,
        (None, None, _) => RUN_C_STEPS,
    }
}

/// `--trace`: a step's length, each run of alike layers' cache shape, the block table and the
/// slot mapping, on stderr.
fn print_trace(pos: usize, fed: &[u32], step: kvlab_model::TraceStep) {
    eprintln!("[trace] pos {pos:>5} fed {fed:?} len {}", step.len);
    // Layers whose caches look alike (every layer of a shared pool, every global layer of
    // a contiguous cache) print as one line.
    let mut first = 0;
    for run in step.layer_cache_shapes.chunk_by(|a, b| a == b) {
        let last = first + run.len() - 1;
        let layers = if last == first {
            format!("layer  {first}")
        } else {
            format!("layers {first}-{last}")
        };
        eprintln!("[trace]   {layers} K,V {}", run[0]);
        first = last + 1;
    }
    if let Some(bt) = &step.block_table {
        eprintln!("[trace]   block_table {bt:?}");
    }
    if let Some(sm) = &step.slot_mapping {
        eprintln!("[trace]   slot_mapping {sm:?}");
    }
}

/// "weights 12×q4_k 2×f32 164.8 MiB": each matrix type with its count, and the weights' bytes.
fn describe_weights(model: &kvlab_model::Model) -> String {
    let types: Vec<String> = (model.matrix_dtypes().iter())
        .map(|(ty, n)| format!("{n}×{ty}"))
        .collect();
    format!(
        "weights {} {}",
        types.join(" "),
        bytes(model.weights.bytes())
    )
}

/// The cache's line of the report: bytes used and reserved, against the formula (bytes per
/// token × `positions`), and the ring buffers' total where sliding windows make it smaller.
fn kv_summary(
    kv: kvlab_model::KvDtype,
    config: &kvlab_model::Config,
    usage: &kvlab_model::KvUsage,
    positions: usize,
) -> String {
    format!(
        "KV cache ({kv}): {} used, {} reserved (formula: {} per token x {positions} positions = {}{})",
        bytes(usage.used_bytes),
        bytes(usage.reserved_bytes),
        bytes(kv.bytes_per_token(config)),
        bytes(kv.bytes_per_token(config) * positions),
        if config
            .layer_kinds
            .iter()
            .any(|k| matches!(k, kvlab_model::LayerKind::Local { .. }))
            && kv.bytes_windowed(config, positions) != kv.bytes_per_token(config) * positions
        {
            format!(
                "; with sliding-window ring buffers {}",
                bytes(kv.bytes_windowed(config, positions))
            )
        } else {
            String::new()
        }
    )
}

//! The one generate loop. It drives any [`Engine`] exactly as llama2.c's run.c `generate` drives
//! its forward pass: the prompt's positions are computed (here in one prefill), then each new token
//! is sampled from the last logits and fed back at the next position.
//!
//! `steps` counts positions, prompt included, as run.c's `-n` does: with a prompt of `n` tokens the
//! loop computes positions `0..steps` and emits `steps − n + 1` new tokens (the last one is emitted
//! but never fed back). Generation stops early when the model emits a stop id (run.c: BOS).

use std::time::{Duration, Instant};

use serde::Serialize;

use crate::engine::check_max_seq_len;
use crate::{Engine, Error, KvUsage, Result, Sampler, SeqId, Tokenizer, TraceStep};

/// What a generation produced and what it cost.
#[derive(Clone, Debug, Default, Serialize)]
pub struct Generation {
    /// Prompt token ids, BOS included.
    pub prompt: Vec<u32>,
    /// Newly generated token ids (a final stop id is not included).
    pub tokens: Vec<u32>,
    /// Wall time of the prefill call.
    #[serde(serialize_with = "secs")]
    pub prefill_time: Duration,
    /// Wall time of all decode calls together.
    #[serde(serialize_with = "secs")]
    pub decode_time: Duration,
    /// Number of decode calls.
    pub decode_steps: usize,
    /// KV bytes at the end, before the sequence is freed.
    pub kv: KvUsage,
    /// Whether a stop id ended the generation.
    pub stopped: bool,
    /// What speculative decoding guessed and kept (all 0 without it).
    pub spec: crate::SpecStats,
}

fn secs<S: serde::Serializer>(d: &Duration, s: S) -> std::result::Result<S::Ok, S::Error> {
    s.serialize_f64(d.as_secs_f64())
}

impl Generation {
    /// Prompt tokens per second of prefill.
    pub fn prefill_tokens_per_s(&self) -> f64 {
        self.prompt.len() as f64 / self.prefill_time.as_secs_f64().max(1e-12)
    }
    /// Decode steps per second.
    pub fn decode_tokens_per_s(&self) -> f64 {
        self.decode_steps as f64 / self.decode_time.as_secs_f64().max(1e-12)
    }
}

/// Callback events of a generation, in order.
pub enum Event<'a> {
    /// A token reached its position in the text: prompt tokens after BOS first, then new ones.
    /// `prev` is the token before it (for [`Tokenizer::decode`]).
    Token {
        /// The token before it.
        prev: u32,
        /// The token itself.
        token: u32,
        /// Sampled, not from the prompt.
        generated: bool,
    },
    /// The engine's cache view after a prefill or decode call (only when tracing is on).
    Trace {
        /// First position of the call: 0 for the prefill, the new token's for a decode.
        pos: usize,
        /// The tokens the call fed: the whole prompt, or the one new token.
        fed: &'a [u32],
        /// The engine's view of the sequence's cache after the call.
        step: TraceStep,
    },
}

/// Options of [`generate_tokens`].
pub struct GenerateOptions {
    /// Positions to compute, prompt included; 0 or more than the context means the context.
    pub steps: usize,
    /// Positions the engine reserves for the sequence, and the context the prompt must fit; 0
    /// means the model's max_seq_len as the limit, with only the positions computed (`steps`,
    /// clamped) reserved.
    pub max_seq_len: usize,
    /// Ask the engine for a [`TraceStep`] after every call.
    pub trace: bool,
    /// Most prompt tokens per engine call (llama.cpp's `--ubatch-size`): a longer prompt is
    /// prefilled in chunks, each attending over the chunks already cached; 0 feeds the whole
    /// prompt in one call.
    pub ubatch: usize,
    /// Decode speculatively ([`crate::speculative`]): the same tokens as plain greedy decoding,
    /// in fewer engine steps when the guesses are good. `None`: one token per step.
    pub speculative: Option<crate::Speculative>,
    /// Print special tokens in the text ([`Tokenizer::is_special`]; [`generate_text`] and
    /// [`generate_ids_text`] only): llama.cpp's `--special`. Off, they print nothing, as in
    /// transformers' `skip_special_tokens=True`, vLLM's default and llama.cpp's.
    pub special: bool,
}

/// Runs a prompt of token ids through `engine` and samples until `steps` positions or a stop id.
///
/// # Errors
/// [`Error::EmptyPrompt`], [`Error::PromptTooLong`] if the prompt does not fit the context, and
/// whatever the engine returns.
pub fn generate_tokens(
    engine: &mut dyn Engine,
    prompt: &[u32],
    opts: &GenerateOptions,
    sampler: &mut Sampler,
    mut on_event: impl FnMut(Event<'_>),
) -> Result<Generation> {
    let config = engine.config().clone();
    let max_seq_len = if opts.max_seq_len == 0 {
        config.max_seq_len
    } else {
        opts.max_seq_len
    };
    check_max_seq_len(&config, max_seq_len)?;
    if prompt.is_empty() {
        return Err(Error::EmptyPrompt);
    }
    if prompt.len() > max_seq_len {
        return Err(Error::PromptTooLong {
            tokens: prompt.len(),
            max_seq_len,
        });
    }
    let steps = if opts.steps == 0 || opts.steps > max_seq_len {
        max_seq_len
    } else {
        opts.steps
    }
    .max(prompt.len());
    // Memory follows the request: without an explicit `max_seq_len`, the sequence reserves only
    // the positions this generation computes, not the model's whole context (a GGUF whose
    // header says 1M positions would otherwise reserve gigabytes for a few tokens).
    let reserve = if opts.max_seq_len == 0 {
        steps
    } else {
        max_seq_len
    };
    let seq = engine.new_sequence(reserve)?;
    let result = run(
        engine,
        seq,
        (prompt, opts.ubatch),
        (steps, opts.speculative.as_ref()),
        opts.trace,
        sampler,
        &mut on_event,
        &config.stop_ids,
    );
    engine.free(seq);
    result
}

#[allow(clippy::too_many_arguments)]
fn run(
    engine: &mut dyn Engine,
    seq: SeqId,
    (prompt, ubatch): (&[u32], usize),
    (steps, speculative): (usize, Option<&crate::Speculative>),
    trace: bool,
    sampler: &mut Sampler,
    on_event: &mut impl FnMut(Event<'_>),
    stop_ids: &[u32],
) -> Result<Generation> {
    let mut g = Generation {
        prompt: prompt.to_vec(),
        ..Default::default()
    };
    // ANCHOR: prefill
    let t0 = Instant::now();
    let mut logits = prefill_chunked(engine, seq, prompt, ubatch)?;
    g.prefill_time = t0.elapsed();
    // ANCHOR_END: prefill
    if trace && let Some(step) = engine.trace(seq) {
        on_event(Event::Trace {
            pos: 0,
            fed: prompt,
            step,
        });
    }
    for w in prompt.windows(2) {
        on_event(Event::Token {
            prev: w[0],
            token: w[1],
            generated: false,
        });
    }
    // The repeat penalty looks back over the prompt too, as llama.cpp's does.
    for &t in prompt {
        sampler.accept(t);
    }
    if let Some(spec) = speculative {
        let d = crate::speculative::Decode {
            engine: &mut *engine,
            seq,
            sampler,
            on_event,
            stop_ids,
            steps,
        };
        let out = crate::speculative::decode(d, spec, prompt, logits)?;
        (g.tokens, g.stopped, g.spec) = (out.tokens, out.stopped, out.stats);
        (g.decode_time, g.decode_steps) = (out.decode_time, out.decode_steps);
        g.kv = engine.kv_usage();
        return Ok(g);
    }
    let mut prev = *prompt.last().expect("non-empty prompt");
    let mut pos = prompt.len() - 1;
    // ANCHOR: decode
    loop {
        // `pos` is the position whose logits these are: the next token goes to pos + 1.
        let next = sampler.next_token(&mut logits, pos)?;
        if stop_ids.contains(&next) {
            g.stopped = true;
            break;
        }
        g.tokens.push(next);
        on_event(Event::Token {
            prev,
            token: next,
            generated: true,
        });
        pos += 1;
        if pos >= steps {
            break;
        }
        let t = Instant::now();
        logits = engine.decode(seq, next)?;
        g.decode_time += t.elapsed();
        g.decode_steps += 1;
        if trace && let Some(step) = engine.trace(seq) {
            on_event(Event::Trace {
                pos,
                fed: std::slice::from_ref(&next),
                step,
            });
        }
        prev = next;
    }
    // ANCHOR_END: decode
    g.kv = engine.kv_usage();
    Ok(g)
}

/// Encodes `text` (with BOS; control tokens written in it, such as Gemma's `<start_of_turn>`,
/// become those tokens, as llama.cpp's tools parse a prompt) and generates; `on_text` receives
/// the printable text as it streams, exactly what run.c prints (prompt pieces first, then the
/// continuation).
///
/// # Errors
/// As [`generate_tokens`].
pub fn generate_text(
    engine: &mut dyn Engine,
    tokenizer: &Tokenizer,
    text: &str,
    opts: &GenerateOptions,
    sampler: &mut Sampler,
    on_text: impl FnMut(&str),
    on_trace: impl FnMut(usize, &[u32], TraceStep),
) -> Result<Generation> {
    // Refuse a prompt that cannot fit before spending time encoding it: a lower bound on its
    // tokens is known from its length alone.
    let max_seq_len = if opts.max_seq_len == 0 {
        engine.config().max_seq_len
    } else {
        opts.max_seq_len
    };
    let at_least = tokenizer.min_tokens(text) + 1; // + BOS
    if at_least > max_seq_len {
        return Err(Error::PromptTooLongBeforeEncoding {
            bytes: text.len(),
            at_least,
            max_seq_len,
        });
    }
    let prompt = tokenizer.encode_special(text, true, false);
    let echo = Echo::PromptAndContinuation;
    stream_text(
        engine, tokenizer, &prompt, echo, opts, sampler, on_text, on_trace,
    )
}

/// [`generate_text`] from prompt ids already encoded (a chat template's render, which writes
/// its own BOS): only the continuation streams to `on_text`, not the prompt (`kvlab generate
/// --chat` prints the reply alone, as llama.cpp's conversation mode does).
///
/// # Errors
/// As [`generate_tokens`].
pub fn generate_ids_text(
    engine: &mut dyn Engine,
    tokenizer: &Tokenizer,
    prompt: &[u32],
    opts: &GenerateOptions,
    sampler: &mut Sampler,
    on_text: impl FnMut(&str),
    on_trace: impl FnMut(usize, &[u32], TraceStep),
) -> Result<Generation> {
    let echo = Echo::ContinuationOnly;
    stream_text(
        engine, tokenizer, prompt, echo, opts, sampler, on_text, on_trace,
    )
}

/// Whether [`stream_text`] prints the prompt before the continuation.
#[derive(Clone, Copy, PartialEq)]
enum Echo {
    PromptAndContinuation,
    ContinuationOnly,
}

#[allow(clippy::too_many_arguments)]
fn stream_text(
    engine: &mut dyn Engine,
    tokenizer: &Tokenizer,
    prompt: &[u32],
    echo: Echo,
    opts: &GenerateOptions,
    sampler: &mut Sampler,
    mut on_text: impl FnMut(&str),
    mut on_trace: impl FnMut(usize, &[u32], TraceStep),
) -> Result<Generation> {
    let mut stream = crate::tokenizer::Utf8Stream::default();
    let echo_prompt = echo == Echo::PromptAndContinuation;
    // The loop echoes the prompt from its second token on (the first is BOS); a vocabulary
    // without BOS (Qwen's) starts with text, printed here.
    if let Some(&first) = prompt.first()
        && echo_prompt
        && tokenizer.bos_id() != Some(first)
    {
        let s = stream.push(&tokenizer.decode(u32::MAX, first, opts.special));
        if !s.is_empty() {
            on_text(&s);
        }
    }
    let g = generate_tokens(engine, prompt, opts, sampler, |e| match e {
        Event::Token {
            prev,
            token,
            generated,
        } if generated || echo_prompt => {
            let s = stream.push(&tokenizer.decode(prev, token, opts.special));
            if !s.is_empty() {
                on_text(&s);
            }
        }
        Event::Token { .. } => {}
        Event::Trace { pos, fed, step } => on_trace(pos, fed, step),
    })?;
    let rest = stream.finish();
    if !rest.is_empty() {
        on_text(&rest);
    }
    Ok(g)
}

/// Prefills `tokens` in calls of at most `ubatch` tokens (0: one call), each chunk attending over
/// the chunks already cached, and returns the logits (vocab_size,) of the last token. Whatever
/// the chunking, the cache ends up the same and so, up to rounding, do the logits.
///
/// # Errors
/// As [`Engine::prefill`].
pub fn prefill_chunked(
    engine: &mut dyn Engine,
    seq: SeqId,
    tokens: &[u32],
    ubatch: usize,
) -> Result<Vec<f32>> {
    let size = if ubatch == 0 { tokens.len() } else { ubatch };
    let mut last = None;
    for chunk in tokens.chunks(size.max(1)) {
        last = Some(engine.prefill(seq, chunk)?);
    }
    last.ok_or(Error::EmptyPrompt)
}

/// Teacher forcing: feeds `prompt` then every token of `forced` and returns the logits (vocab,)
/// after the prompt and after each forced token but the last — the logits that predicted each
/// forced token. Used by verify to compare engines position by position.
///
/// # Errors
/// As [`generate_tokens`].
pub fn teacher_force(
    engine: &mut dyn Engine,
    prompt: &[u32],
    forced: &[u32],
    max_seq_len: usize,
) -> Result<Vec<Vec<f32>>> {
    let seq = engine.new_sequence(max_seq_len)?;
    let out = (|| {
        let mut all = vec![engine.prefill(seq, prompt)?];
        for &t in forced.iter().take(forced.len().saturating_sub(1)) {
            all.push(engine.decode(seq, t)?);
        }
        Ok(all)
    })();
    engine.free(seq);
    out
}

//! The plumbing of the build-up chapter (docs/src/build-up.md): everything the KV cache does not
//! change, so that each step's program (`src/bin/stepN_*.rs`) holds only the forward pass and the
//! generate loop, and `diff -u` between two consecutive steps shows one idea.
//!
//! Here: loading the model and the prompt ([`Lesson`]), the parts of a layer the cache never
//! touches (embedding, RMSNorm, the projections' matrix-vector product, the feed-forward block,
//! the logits), and the report every step prints (text, token ids, work done, time per token,
//! through [`Clock`]). The maths is kvlab-model's scalar reference (`kvlab_model::ops`); the
//! lessons run plain Llama models (stories260K by default), one row at a time in `Vec<f32>`.

use std::cell::Cell;
use std::ops::Range;
use std::time::{Duration, Instant};

use anyhow::{Context, Result, bail};
use kvlab_model::registry::{self, Located};
use kvlab_model::{Config, LayerKind, LayerWeights, Model, Tokenizer, ops};

/// Positions computed when `--steps` is not given (llama2.c's run.c default), prompt included.
pub const DEFAULT_STEPS: usize = 256;
/// The prompt when `--prompt` is not given.
pub const DEFAULT_PROMPT: &str = "Once upon a time";
/// The window of step 6 when `--window` is not given.
pub const DEFAULT_WINDOW: usize = 64;

/// A model, a tokenized prompt and how far to generate: what every step starts from.
pub struct Lesson {
    /// The model name, from `--model` (a name of fixtures/models.json).
    pub name: String,
    /// The model's configuration and weights, as the engines read them.
    pub model: Model,
    /// The model's tokenizer, for the prompt and the printed text.
    pub tokenizer: Tokenizer,
    /// BOS followed by the prompt's token ids.
    pub prompt: Vec<u32>,
    /// Positions to compute, prompt included (run.c's `-n`, kvlab's `--steps`): the loop stops
    /// when the sequence would grow past it; at most the model's `max_seq_len`.
    pub steps: usize,
}

const USAGE: &str = "options: -p/--prompt TEXT (default \"Once upon a time\"), --steps N (positions, prompt included; default 256, 0 = the model's context), -m/--model NAME (default stories260K)";

impl Lesson {
    /// Parses the command line (`--prompt`, `--steps`, `--model`) and loads the model.
    ///
    /// # Errors
    /// An unknown option, a model that is not found or is not a plain Llama, a prompt longer
    /// than the context.
    pub fn load() -> Result<Lesson> {
        let (lesson, window) = Lesson::parse(std::env::args().skip(1).collect())?;
        if window.is_some() {
            bail!("--window is an option of step 6 only");
        }
        Ok(lesson)
    }

    /// As [`Lesson::load`], and `--window W` (default [`DEFAULT_WINDOW`]): the sliding window
    /// of step 6, in positions, the query's own included.
    ///
    /// # Errors
    /// As [`Lesson::load`], and a window of 0.
    pub fn load_with_window() -> Result<(Lesson, usize)> {
        let (lesson, window) = Lesson::parse(std::env::args().skip(1).collect())?;
        let window = window.unwrap_or(DEFAULT_WINDOW);
        if window == 0 {
            bail!("--window must be at least 1");
        }
        Ok((lesson, window))
    }

    fn parse(args: Vec<String>) -> Result<(Lesson, Option<usize>)> {
        let (mut prompt, mut steps) = (DEFAULT_PROMPT.to_string(), DEFAULT_STEPS);
        let (mut name, mut window) = ("stories260K".to_string(), None);
        let mut args = args.into_iter();
        while let Some(a) = args.next() {
            let mut value = || {
                args.next()
                    .with_context(|| format!("{a} needs a value; {USAGE}"))
            };
            match a.as_str() {
                "-p" | "--prompt" => prompt = value()?,
                "--steps" => steps = value()?.parse().context("--steps: a number")?,
                "-m" | "--model" => name = value()?,
                "--window" => window = Some(value()?.parse().context("--window: a number")?),
                "-h" | "--help" => {
                    println!("{USAGE}");
                    std::process::exit(0);
                }
                _ => bail!("unknown option {a:?}; {USAGE}"),
            }
        }
        let Located::Ready {
            entry,
            model,
            tokenizer,
        } = registry::locate(&name)?
        else {
            bail!(
                "{name}'s files are not here: `cargo run -p kvlab-cli -- models` says where to get them (or set KVLAB_MODELS)"
            );
        };
        let loaded = registry::load_entry(entry, model.as_deref(), tokenizer.as_deref())?;
        let tokenizer = loaded
            .tokenizer
            .with_context(|| format!("{name} has no tokenizer"))?;
        check_plain_llama(&loaded.model.config)?;
        let max_seq_len = loaded.model.config.max_seq_len;
        let prompt = tokenizer.encode(&prompt, true, false);
        if prompt.len() > max_seq_len {
            bail!(
                "the prompt is {} tokens, more than the model's {max_seq_len} positions",
                prompt.len()
            );
        }
        let steps = if steps == 0 { max_seq_len } else { steps };
        let steps = steps.clamp(1, max_seq_len).max(prompt.len());
        let lesson = Lesson {
            name: loaded.name,
            model: loaded.model,
            tokenizer,
            prompt,
            steps,
        };
        Ok((lesson, window))
    }

    /// Whether generation ends at `token` (run.c stops at BOS).
    pub fn stops(&self, token: u32) -> bool {
        self.model.config.stop_ids.contains(&token)
    }

    /// Prints what a run produced: the text, the token ids, the work done and the time it took.
    pub fn report(&self, step: &str, tokens: &[u32], clock: &Clock) {
        let generated = tokens.len() - self.prompt.len();
        let end = if tokens.len() > self.steps {
            format!("reached --steps {}", self.steps)
        } else {
            "stopped at a stop token".to_string()
        };
        println!("{}", self.tokenizer.decode_all(tokens, false));
        let c = &self.model.config;
        println!(
            "--- {step} on {}: n_layers {}, n_heads {}, n_kv_heads {}, head_dim {}, kv_dim {}, max_seq_len {}",
            self.name,
            c.n_layers,
            c.n_heads,
            c.n_kv_heads,
            c.head_dim,
            c.kv_dim(),
            c.max_seq_len
        );
        println!("token ids: {tokens:?}");
        println!(
            "prompt {} tokens, generated {generated} tokens ({end})",
            self.prompt.len()
        );
        // Counted where the work happens (the feed-forward block, each step's `attend`), and
        // checked against what the positions the step computed imply.
        let (rows, products) = (clock.rows_counted, clock.products_counted);
        let (positions, scores) = (rows / c.n_layers, products / (c.n_layers * c.n_heads));
        assert_eq!(
            (positions, scores),
            (clock.positions, clock.scores),
            "the work counted differs from the positions {step} says it computed"
        );
        println!(
            "positions computed: {positions} (each one: q, k, v, attention and the feed-forward block in every layer; {rows} rows through a layer, counted)"
        );
        println!(
            "attention scores computed: {scores} (query·key products per layer and query head; {products} in all {} layers and {} query heads, counted in attend)",
            c.n_layers, c.n_heads
        );
        println!(
            "prefill: {} positions in {:.3} ms",
            self.prompt.len(),
            ms(clock.prefill)
        );
        let d = &clock.decode;
        if !d.is_empty() {
            let per = |s: &[Duration]| ms(s.iter().sum::<Duration>()) / s.len() as f64;
            let n = d.len().min(32);
            println!(
                "decode: {} steps, {:.3} ms/token on average; the first {n} {:.3} ms/token, the last {n} {:.3} ms/token",
                d.len(),
                per(d),
                per(&d[..n]),
                per(&d[d.len() - n..])
            );
        }
    }
}

fn ms(d: Duration) -> f64 {
    d.as_secs_f64() * 1e3
}

/// The lessons leave out what Gemma adds (QK-norm, sandwich norms, local layers), so that each
/// step shows the cache and nothing else; the engines in crates/ run those models.
fn check_plain_llama(c: &Config) -> Result<()> {
    if c.qk_norm || c.post_norms || c.layer_kinds.iter().any(|k| *k != LayerKind::Global) {
        bail!(
            "the build-up lessons run plain Llama models (stories260K); this one has QK-norm, sandwich norms or sliding-window layers: run it with `kvlab generate`"
        );
    }
    Ok(())
}

thread_local! {
    /// The work done so far on this thread, counted where it happens: rows through a layer's
    /// feed-forward block, and query·key products (every layer and query head).
    static WORK: Cell<(usize, usize)> = const { Cell::new((0, 0)) };
}

/// Counts `n` query·key products: each step's `attend` calls it once per query head, with the
/// number of keys that head's query was compared with.
pub fn count_scores(n: usize) {
    count(0, n);
}

/// Adds `rows` and `products` to the work counted on this thread.
fn count(rows: usize, products: usize) {
    WORK.with(|w| {
        let (r, p) = w.get();
        w.set((r + rows, p + products));
    });
}

/// Times each call of the forward pass and records the work it does: counted where it
/// happens ([`count_scores`], the feed-forward block), and implied by the positions the caller
/// says it computes, which [`Lesson::report`] checks against each other. The first call is the
/// prefill, every later one a decode step.
#[derive(Default)]
pub struct Clock {
    /// Rows that went through the whole network, summed over calls, as the caller states them.
    pub positions: usize,
    /// Query·key products per layer and query head implied by those positions: a query at
    /// position `p` sees `p + 1` keys (at most `window`).
    pub scores: usize,
    /// Rows through a layer's feed-forward block, counted (`positions × n_layers`).
    pub rows_counted: usize,
    /// Query·key products in every layer and query head, counted in `attend`.
    pub products_counted: usize,
    /// Wall time of the prefill call.
    pub prefill: Duration,
    /// Wall time of each decode call, in order.
    pub decode: Vec<Duration>,
    window: Option<usize>,
    calls: usize,
}

impl Clock {
    /// A clock for a cache that keeps only the last `window` positions (step 6).
    pub fn with_window(window: usize) -> Clock {
        Clock {
            window: Some(window),
            ..Clock::default()
        }
    }

    /// Runs `forward`, which computes the rows at `positions`, and records its time and work.
    pub fn time<R>(&mut self, positions: Range<usize>, forward: impl FnOnce() -> R) -> R {
        let window = self.window.unwrap_or(usize::MAX);
        self.positions += positions.len();
        self.scores += positions.map(|p| (p + 1).min(window)).sum::<usize>();
        let before = WORK.with(Cell::get);
        let t = Instant::now();
        let out = forward();
        let elapsed = t.elapsed();
        let after = WORK.with(Cell::get);
        self.rows_counted += after.0 - before.0;
        self.products_counted += after.1 - before.1;
        if self.calls == 0 {
            self.prefill = elapsed;
        } else {
            self.decode.push(elapsed);
        }
        self.calls += 1;
        out
    }
}

/// The embedding row of `token`, scaled: x (dim,).
pub fn embed(model: &Model, token: u32) -> Vec<f32> {
    let (c, d) = (&model.config, model.config.dim);
    let row = &model.weights.token_embedding[token as usize * d..(token as usize + 1) * d];
    row.iter().map(|&e| e * c.embed_scale).collect()
}

/// RMSNorm of `x` (n,) with gain `w` (n,).
pub fn rmsnorm(x: &[f32], w: &[f32], eps: f32) -> Vec<f32> {
    let mut out = vec![0.0; x.len()];
    ops::rmsnorm(&mut out, x, w, eps);
    out
}

/// W @ x: W (rows, x.len()) row-major, x (cols,); returns (rows,).
pub fn matvec(w: &[f32], x: &[f32], rows: usize) -> Vec<f32> {
    let mut out = vec![0.0; rows];
    ops::matvec(&mut out, w, x);
    out
}

/// x ← x + y
pub fn add(x: &mut [f32], y: &[f32]) {
    ops::axpy(x, 1.0, y);
}

// ANCHOR: feed_forward
/// The feed-forward block of one row, which the cache never touches:
/// x ← x + W2 (act(W1 xn) ⊙ W3 xn) with xn = RMSNorm(x). x (dim,).
pub fn feed_forward(c: &Config, lw: &LayerWeights, x: &mut [f32]) {
    count(1, 0); // one row through a layer
    let xn = rmsnorm(x, &lw.ffn_norm, c.norm_eps); // (dim,)
    let mut gate = matvec(&lw.w1, &xn, c.hidden_dim); // (hidden_dim,)
    let up = matvec(&lw.w3, &xn, c.hidden_dim); // (hidden_dim,)
    ops::glu(&mut gate, &up, c.activation);
    add(x, &matvec(&lw.w2, &gate, c.dim));
}
// ANCHOR_END: feed_forward

/// Logits (vocab_size,) of one row of the residual stream x (dim,): W_cls @ RMSNorm(x).
pub fn logits(model: &Model, x: &[f32]) -> Vec<f32> {
    let (c, w) = (&model.config, &model.weights);
    matvec(
        w.classifier(),
        &rmsnorm(x, &w.final_norm, c.norm_eps),
        c.vocab_size,
    )
}

/// The greedy choice: the most likely token, ties to the lowest id (as every kvlab engine).
pub fn argmax(logits: &[f32]) -> u32 {
    kvlab_model::sampler::argmax(logits)
}

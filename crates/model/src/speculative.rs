//! Speculative decoding (Leviathan et al. 2023, "Fast Inference from Transformers via
//! Speculative Decoding"; Chen et al. 2023): guess the next `k` tokens cheaply, check all the
//! guesses with **one** forward step of `k + 1` rows ([`Engine::score`]), keep the guesses up to
//! the first one the model would not have chosen, and roll the KV cache back past it
//! ([`Engine::truncate`]). A step that costs about one decode (the weights are read once for all
//! rows) can then yield up to `k + 1` tokens.
//!
//! The guesses come from one of two [`Proposer`]s:
//!
//! * **prompt lookup** (vLLM's `ngram` method, Saxena 2023): find the latest earlier occurrence
//!   of the text's last n tokens (n from `prompt_lookup_max` down to `prompt_lookup_min`) and
//!   propose what followed it. Text that repeats its input (summaries, code edits, quoting) is
//!   guessed well, other text rarely; a step with no guess is a plain decode. Free, but blind.
//! * a **draft model** (vLLM's `draft_model` method; Leviathan et al.'s setting): a smaller model
//!   with the same vocabulary decodes `k` tokens greedily in its own KV cache, which then rolls
//!   back past the guesses the target rejected, exactly as the target's does ([`DraftModel`]).
//!   Each guess costs a draft decode, so it pays when the draft is much cheaper than the target
//!   and agrees with it often.
//!
//! A rejected guess costs a row the step computed for nothing, which on text that does not
//! repeat adds up; so the number of guesses adapts ([`Backoff`]). It follows transformers'
//! assisted generation's heuristic: two more after a step that kept every guess, one fewer
//! after one that kept some (between 1 and `k`), and here half as many after one that kept
//! none. And after a step whose guesses were all
//! rejected, the next guesses wait 1, 3, 7, ... plain steps (doubling after each such step, at
//! most [`MAX_BACKOFF`], reset by any kept guess): on text that does not repeat the loop soon
//! decodes plainly, guessing one token now and then, and on text that does it speculates every
//! step.
//!
//! [`decode`] is the loop of one generation through the `Engine` API; a [`Drafter`] proposes
//! for the scheduler's batch, whose driver checks the guesses of every decode in one step.
//!
//! Greedy verification keeps the output **identical** to plain greedy decoding: a guess is kept
//! only if it is the token the sampler picks from the logits of the position before it, and the
//! token picked where a guess fails is the one plain decoding would have picked there. At a
//! temperature, speculative sampling keeps each guess with the probability the sampler gives it
//! and otherwise draws from the rest, so the output has exactly plain sampling's distribution
//! (not its exact tokens: the random draws differ).
//!
//! The cache is what makes rollback possible and where it can break: the step wrote the keys of
//! every guess, and after a rejection the next step writes at the first rejected position, whose
//! query reads the `W − 1` keys before it in a sliding window of `W`. So those keys must survive
//! a step of `k + 1` positions:
//!
//! * the contiguous cache forgets positions past the cut; its sliding-window ring keeps
//!   `W − 1 + 64` slots (`RING_STEP`), so a step of up to 64 positions overwrites nothing a
//!   rolled-back query reads: `W − 1 + k + 1` slots are live at once, hence [`MAX_GUESSES`];
//! * the paged pool frees the blocks past the cut ([`Engine::truncate`]). It keeps a window's
//!   blocks from the step's first query on, but stores the step's own keys only where a query
//!   after the step reads them (from `end + 1 − W`), so a rollback into the step needs
//!   `k + 2 ≤ W`, and `decode` guesses no more than that;
//! * a block shared through the prefix cache was copied before the step wrote into it
//!   (copy-on-write), so rolling back never touches another sequence's keys.

use std::cell::RefCell;
use std::collections::HashMap;
use std::time::Instant;

use serde::Serialize;

use crate::generate::Event;
use crate::{Engine, Error, Result, Sampler, SeqId};

/// The most guesses one step checks: a contiguous sliding-window ring keeps `window − 1 + 64`
/// slots, so a step of up to 64 positions can be rolled back (`RING_STEP` in kvlab-cpu). A
/// model with sliding windows of W also caps it at `W − 2` (see [`decode`]).
pub const MAX_GUESSES: usize = 63;

/// The most plain steps between two guesses after a run of rejected ones.
pub const MAX_BACKOFF: usize = 63;

/// Prompt lookup: the continuation of the latest earlier occurrence of the last n tokens.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize)]
pub struct NgramProposer {
    /// Shortest suffix looked up (vLLM's `prompt_lookup_min`).
    pub prompt_lookup_min: usize,
    /// Longest suffix looked up first (vLLM's `prompt_lookup_max`).
    pub prompt_lookup_max: usize,
}

impl Default for NgramProposer {
    /// Suffixes of 3 down to 1 tokens.
    fn default() -> Self {
        NgramProposer {
            prompt_lookup_min: 1,
            prompt_lookup_max: 3,
        }
    }
}

impl NgramProposer {
    /// Up to `k` tokens that followed the latest earlier occurrence of the longest suffix of
    /// `history` (between `prompt_lookup_max` and `prompt_lookup_min` tokens) found earlier in
    /// it; empty when none is.
    pub fn propose(&self, history: &[u32], k: usize) -> Vec<u32> {
        let len = history.len();
        for n in (self.prompt_lookup_min.max(1)..=self.prompt_lookup_max).rev() {
            if len <= n || k == 0 {
                continue;
            }
            let suffix = &history[len - n..];
            // Starts before the suffix's own, latest first.
            if let Some(i) = (0..len - n).rev().find(|&i| &history[i..i + n] == suffix) {
                let from = i + n;
                return history[from..(from + k).min(len)].to_vec();
            }
        }
        Vec::new()
    }
}

/// A draft model: a second engine with the target's vocabulary, whose greedy continuation of
/// the text is the guess. It keeps its own sequence, one per generation: positions it computed
/// for guesses the target rejected are rolled back ([`Engine::truncate`]) before it catches up
/// with the tokens the target chose, so each step feeds it only what it has not seen.
///
/// It drafts for several generations at once (a [`Drafter`] for the scheduler's batch): each has
/// its own sequence in the draft engine, named by a key.
pub struct DraftModel {
    state: RefCell<DraftState>,
}

struct DraftState {
    engine: Box<dyn Engine>,
    /// The sequences of the generations in progress, by key.
    seqs: HashMap<u64, DraftSeq>,
}

/// One generation's sequence in the draft engine.
struct DraftSeq {
    seq: SeqId,
    /// The tokens at its cached positions, in order.
    cached: Vec<u32>,
    /// Positions that sequence holds at most.
    max_seq_len: usize,
}

impl std::fmt::Debug for DraftModel {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let st = self.state.borrow();
        let c = st.engine.config();
        f.debug_struct("DraftModel")
            .field("engine", &st.engine.name())
            .field("n_layers", &c.n_layers)
            .field("dim", &c.dim)
            .finish()
    }
}

impl DraftModel {
    /// `engine` drafting for a target of `target_vocab_size` tokens.
    ///
    /// # Errors
    /// [`Error::Config`] if the vocabularies differ in size: a guess is a token id, so the two
    /// models must share their tokenizer (the same size is checked, the same ids are the
    /// caller's to ensure).
    pub fn new(engine: Box<dyn Engine>, target_vocab_size: usize) -> Result<DraftModel> {
        let vocab = engine.config().vocab_size;
        if vocab != target_vocab_size {
            return Err(Error::Config(format!(
                "the draft model has a vocabulary of {vocab} tokens and the target {target_vocab_size}: \
                 a draft must share the target's tokenizer"
            )));
        }
        Ok(DraftModel {
            state: RefCell::new(DraftState {
                engine,
                seqs: HashMap::new(),
            }),
        })
    }

    /// Starts generation `key`'s draft sequence for `steps` positions (at most the draft
    /// model's context), dropping any earlier one of that key.
    fn begin(&self, key: u64, steps: usize) -> Result<()> {
        self.end(key);
        let st = &mut *self.state.borrow_mut();
        let max_seq_len = steps.clamp(1, st.engine.config().max_seq_len);
        let seq = st.engine.new_sequence(max_seq_len)?;
        st.seqs.insert(
            key,
            DraftSeq {
                seq,
                cached: Vec::new(),
                max_seq_len,
            },
        );
        Ok(())
    }

    /// Frees generation `key`'s draft sequence, if it has one.
    fn end(&self, key: u64) {
        let st = &mut *self.state.borrow_mut();
        if let Some(d) = st.seqs.remove(&key) {
            st.engine.free(d.seq);
        }
    }

    /// The draft's greedy continuation of `history` for generation `key` (none without
    /// [`Self::begin`]), up to `k` tokens: the cache rolled back to what it shares with
    /// `history` (keeping at least one token to feed), the rest of `history` fed in one step,
    /// then a greedy decode per further guess. Fewer guesses where the draft's context ends.
    fn propose(&self, key: u64, history: &[u32], k: usize) -> Result<Vec<u32>> {
        let st = &mut *self.state.borrow_mut();
        let Some(d) = st.seqs.get_mut(&key) else {
            return Ok(Vec::new());
        };
        if k == 0 || history.is_empty() || history.len() > d.max_seq_len {
            return Ok(Vec::new());
        }
        let shared = (d.cached.iter().zip(history))
            .take_while(|(a, b)| a == b)
            .count();
        let keep = shared.min(history.len() - 1);
        if keep < d.cached.len() {
            if st.engine.truncate(d.seq, keep)? {
                d.cached.truncate(keep);
            } else {
                // This engine cannot roll back: start the sequence over.
                st.engine.free(d.seq);
                d.seq = st.engine.new_sequence(d.max_seq_len)?;
                d.cached.clear();
            }
        }
        Self::extend(st.engine.as_mut(), d, history, k)
    }

    /// Feeds `history[cached.len()..]`, then guesses greedily.
    fn extend(
        engine: &mut dyn Engine,
        d: &mut DraftSeq,
        history: &[u32],
        k: usize,
    ) -> Result<Vec<u32>> {
        let new = &history[d.cached.len()..];
        let mut logits = engine.prefill(d.seq, new)?;
        d.cached.extend_from_slice(new);
        let mut guesses = vec![crate::sampler::argmax(&logits)];
        while guesses.len() < k && d.cached.len() < d.max_seq_len {
            let g = *guesses.last().expect("one guess at least");
            logits = engine.decode(d.seq, g)?;
            d.cached.push(g);
            guesses.push(crate::sampler::argmax(&logits));
        }
        Ok(guesses)
    }
}

/// Where a step's guesses come from.
#[derive(Debug)]
pub enum Proposer {
    /// Prompt lookup.
    Ngram(NgramProposer),
    /// A draft model's greedy continuation.
    Draft(DraftModel),
}

impl Proposer {
    /// Readies the proposer for generation `key` of `steps` positions (a draft's sequence).
    fn begin(&self, key: u64, steps: usize) -> Result<()> {
        match self {
            Proposer::Ngram(_) => Ok(()),
            Proposer::Draft(d) => d.begin(key, steps),
        }
    }

    /// Releases what [`Self::begin`] took for generation `key`.
    fn end(&self, key: u64) {
        if let Proposer::Draft(d) = self {
            d.end(key);
        }
    }

    /// Up to `k` guesses for the tokens after `history` in generation `key`.
    fn propose(&self, key: u64, history: &[u32], k: usize) -> Result<Vec<u32>> {
        match self {
            Proposer::Ngram(n) => Ok(n.propose(history, k)),
            Proposer::Draft(d) => d.propose(key, history, k),
        }
    }

    /// The method's name, as vLLM spells it (`ngram`, `draft_model`).
    pub fn method(&self) -> &'static str {
        match self {
            Proposer::Ngram(_) => "ngram",
            Proposer::Draft(_) => "draft_model",
        }
    }
}

/// How to speculate: the proposer and how many tokens it may guess per step.
#[derive(Debug)]
pub struct Speculative {
    /// Where the guesses come from.
    pub proposer: Proposer,
    /// Most guesses checked in one step (vLLM's `num_speculative_tokens`, k).
    pub num_speculative_tokens: usize,
}

impl Speculative {
    /// Prompt lookup with `k` guesses a step.
    pub fn ngram(ngram: NgramProposer, k: usize) -> Speculative {
        Speculative {
            proposer: Proposer::Ngram(ngram),
            num_speculative_tokens: k,
        }
    }
}

/// What speculation did in one generation.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize)]
pub struct SpecStats {
    /// Steps that checked at least one guess.
    pub num_spec_steps: usize,
    /// Guesses checked.
    pub num_draft_tokens: usize,
    /// Guesses kept.
    pub num_accepted_tokens: usize,
    /// Steps that rolled the cache back (a guess was rejected).
    pub num_rollbacks: usize,
    /// Steps decoded without guessing because the last guesses were all rejected.
    pub num_backoff_steps: usize,
}

impl SpecStats {
    /// Guesses kept over guesses checked (vLLM's draft acceptance rate); NaN before any guess.
    pub fn acceptance_rate(&self) -> f64 {
        self.num_accepted_tokens as f64 / self.num_draft_tokens as f64
    }
}

/// Guessing less where guesses fail. The number of guesses follows transformers' assisted
/// generation (`num_assistant_tokens_schedule="heuristic"`): two more after a step that kept
/// every guess, one fewer after a step that kept some, between 1 and the `k` asked for; half
/// as many after a step that kept none. After a
/// step whose guesses were all rejected, the next guesses also wait 1, 3, 7, ... plain steps
/// (doubling, at most [`MAX_BACKOFF`]); any kept guess resets the wait.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Backoff {
    /// Plain steps left before guessing again.
    wait: usize,
    /// The wait after the next all-rejected step.
    next: usize,
    /// Guesses the next step may check (`None`: as many as asked).
    limit: Option<usize>,
}

impl Default for Backoff {
    fn default() -> Self {
        Backoff {
            wait: 0,
            next: 1,
            limit: None,
        }
    }
}

impl Backoff {
    /// How many of `k` guesses this step may check: `None` while the wait lasts (the step
    /// counts it down), else between 1 and `k` (0 if `k` is).
    pub fn guesses(&mut self, k: usize) -> Option<usize> {
        if self.wait > 0 {
            self.wait -= 1;
            return None;
        }
        // `record` never sets a limit below 1.
        Some(self.limit.unwrap_or(k).min(k))
    }

    /// A step checked `drafted` guesses and kept `kept` of them.
    pub fn record(&mut self, drafted: usize, kept: usize) {
        (self.wait, self.next) = match kept {
            0 => (self.next, (2 * self.next + 1).min(MAX_BACKOFF)),
            _ => (0, 1),
        };
        self.limit = Some(match kept {
            _ if kept == drafted => drafted + 2,
            0 => (drafted / 2).max(1),
            _ => drafted.saturating_sub(1).max(1),
        });
    }
}

/// Speculation for many generations at once, the scheduler's decodes (`kvlab batch --speculative`,
/// `kvlab serve --speculative`): the proposer, and per generation (a key, the scheduler's
/// request id) its [`Backoff`] and, for a draft model, its draft sequence.
#[derive(Debug)]
pub struct Drafter {
    spec: Speculative,
    /// Positions a generation reaches at most (its draft sequence's length).
    max_seq_len: usize,
    backoffs: HashMap<u64, Backoff>,
    /// Proposals that failed, and the last failure's message.
    failures: (usize, Option<String>),
}

impl Drafter {
    /// Drafting with `spec` for generations of at most `max_seq_len` positions.
    pub fn new(spec: Speculative, max_seq_len: usize) -> Drafter {
        Drafter {
            spec,
            max_seq_len,
            backoffs: HashMap::new(),
            failures: (0, None),
        }
    }

    /// [`Self::propose`] for a step that decodes plainly when drafting fails: the failure is
    /// counted and kept ([`Self::failures`]) instead of returned.
    pub fn propose_or_none(&mut self, key: u64, history: &[u32], max: usize) -> Vec<u32> {
        self.propose(key, history, max).unwrap_or_else(|e| {
            self.failures = (self.failures.0 + 1, Some(e.to_string()));
            Vec::new()
        })
    }

    /// How many proposals failed, and the last failure's message.
    pub fn failures(&self) -> (usize, Option<&str>) {
        (self.failures.0, self.failures.1.as_deref())
    }

    /// The proposer's name, as vLLM spells it.
    pub fn method(&self) -> &'static str {
        self.spec.proposer.method()
    }

    /// Up to `max` (and at most `num_speculative_tokens`, fewer as its [`Backoff`] says) guesses
    /// of the tokens after `history` for generation `key`; none while its backoff waits.
    ///
    /// # Errors
    /// Whatever the draft engine returns.
    pub fn propose(&mut self, key: u64, history: &[u32], max: usize) -> Result<Vec<u32>> {
        let k = max.min(self.spec.num_speculative_tokens);
        if k == 0 {
            return Ok(Vec::new());
        }
        if !self.backoffs.contains_key(&key) {
            self.spec.proposer.begin(key, self.max_seq_len)?;
        }
        match self.backoffs.entry(key).or_default().guesses(k) {
            Some(n) => self.spec.proposer.propose(key, history, n),
            None => Ok(Vec::new()),
        }
    }

    /// Generation `key`'s step checked `drafted` guesses and kept `kept`.
    pub fn record(&mut self, key: u64, drafted: usize, kept: usize) {
        if let Some(b) = self.backoffs.get_mut(&key) {
            b.record(drafted, kept);
        }
    }

    /// Generation `key` ended: free its draft sequence.
    pub fn release(&mut self, key: u64) {
        if self.backoffs.remove(&key).is_some() {
            self.spec.proposer.end(key);
        }
    }
}

/// The state the speculative loop shares with `generate`'s.
pub(crate) struct Decode<'a, F: FnMut(Event<'_>)> {
    pub engine: &'a mut dyn Engine,
    pub seq: SeqId,
    pub sampler: &'a mut Sampler,
    pub on_event: &'a mut F,
    pub stop_ids: &'a [u32],
    /// Positions to compute, prompt included: no position at or past it is fed.
    pub steps: usize,
}

/// What the loop produced: the generated tokens, whether a stop id ended it, engine time and
/// steps, and the speculation counts.
#[derive(Default)]
pub(crate) struct Decoded {
    pub tokens: Vec<u32>,
    pub stopped: bool,
    pub decode_time: std::time::Duration,
    pub decode_steps: usize,
    pub stats: SpecStats,
}

/// Speculative decoding after a prefill of `prompt` whose last logits are `logits`.
///
/// # Errors
/// [`Error::Engine`] if the engine cannot roll its cache back; whatever the engine or the
/// sampler return.
pub(crate) fn decode<F: FnMut(Event<'_>)>(
    d: Decode<'_, F>,
    spec: &Speculative,
    prompt: &[u32],
    logits: Vec<f32>,
) -> Result<Decoded> {
    spec.proposer.begin(0, d.steps)?;
    let out = decode_with(d, spec, prompt, logits);
    spec.proposer.end(0);
    out
}

/// [`decode`] once the proposer is ready.
fn decode_with<F: FnMut(Event<'_>)>(
    d: Decode<'_, F>,
    spec: &Speculative,
    prompt: &[u32],
    mut logits: Vec<f32>,
) -> Result<Decoded> {
    // A step's guesses must leave the keys a rolled-back query reads: in a sliding window of W
    // the paged pool stores a step's own keys only from `end + 1 − W` on, so k + 2 ≤ W.
    let most = (d.engine.config().layer_kinds.iter())
        .filter_map(|kind| match kind {
            crate::LayerKind::Local { window } => Some(window.saturating_sub(2)),
            crate::LayerKind::Global => None,
        })
        .fold(MAX_GUESSES, usize::min);
    let k = spec.num_speculative_tokens.min(most);
    let mut out = Decoded::default();
    let mut history = prompt.to_vec();
    let mut pos = prompt.len() - 1; // The position whose logits `logits` are.
    let mut pending = d.sampler.next_token(&mut logits, pos)?;
    let mut backoff = Backoff::default();
    loop {
        // `pending` was sampled from the logits of `pos`; it goes to pos + 1.
        if d.stop_ids.contains(&pending) {
            out.stopped = true;
            return Ok(out);
        }
        emit(&mut out, d.on_event, &mut history, pending);
        pos += 1;
        if pos >= d.steps {
            return Ok(out);
        }
        // Guesses for positions pos + 1.., none at or past `steps`; the time a draft model
        // takes to propose them counts as decode time.
        let t = Instant::now();
        let room = d.steps - 1 - pos;
        let draft = match backoff.guesses(k) {
            Some(n) => spec.proposer.propose(0, &history, n.min(room))?,
            None => {
                out.stats.num_backoff_steps += 1;
                Vec::new()
            }
        };
        let fed: Vec<u32> = std::iter::once(pending)
            .chain(draft.iter().copied())
            .collect();
        let mut rows = d.engine.score(d.seq, &fed)?;
        out.decode_time += t.elapsed();
        out.decode_steps += 1;
        if !draft.is_empty() {
            out.stats.num_spec_steps += 1;
            out.stats.num_draft_tokens += draft.len();
        }
        // Row i holds the logits of position pos + i, predicting position pos + i + 1.
        let mut kept = 0;
        pending = loop {
            let row = rows.get_mut(kept).ok_or_else(|| Error::Engine {
                engine: d.engine.name(),
                reason: format!("score returned {kept} rows for {} tokens", fed.len()),
            })?;
            let t = check(d.sampler, row, draft.get(kept).copied(), pos + kept)?;
            d.sampler.accept(t);
            if kept == draft.len() || t != draft[kept] {
                break t;
            }
            kept += 1;
            out.stats.num_accepted_tokens += 1;
            if d.stop_ids.contains(&t) {
                out.stopped = true;
                return Ok(out);
            }
            emit(&mut out, d.on_event, &mut history, t);
            if pos + kept >= d.steps {
                return Ok(out);
            }
        };
        pos += kept;
        if !draft.is_empty() {
            backoff.record(draft.len(), kept);
        }
        if kept < draft.len() {
            // The guesses from `kept` on were wrong: forget their keys and values.
            out.stats.num_rollbacks += 1;
            if !d.engine.truncate(d.seq, pos + 1)? {
                return Err(Error::Engine {
                    engine: d.engine.name(),
                    reason: format!(
                        "cannot roll its cache back to {} positions; speculative decoding needs \
                         an engine that can, with at most 63 guesses a step (a sliding-window \
                         ring keeps window − 1 + 64 slots)",
                        pos + 1
                    ),
                });
            }
        }
    }
}

/// The token after position `pos` from its logits `row` (scratch), given the guess for it, if
/// any, by speculative sampling (Leviathan et al. 2023, Algorithm 1; Chen et al. 2023): with `p`
/// the sampler's distribution ([`Sampler::distribution`]) and a guess `x` that prompt lookup
/// proposes with certainty, keep `x` with probability `p(x)`, else draw from `p` without `x`,
/// renormalized. Every token so chosen is distributed as one [`Sampler::sample`] draws; with a
/// greedy sampler `p` is one-hot, so the guess is kept exactly when it is the argmax, and the
/// token is the argmax either way.
///
/// # Errors
/// [`Error::NonFiniteLogits`] naming `pos`.
fn check(sampler: &mut Sampler, row: &mut [f32], guess: Option<u32>, pos: usize) -> Result<u32> {
    sampler
        .distribution(row)
        .map_err(|e| Error::NonFiniteLogits {
            pos,
            index: e.index,
            value: e.value,
        })?;
    if let Some(x) = guess.filter(|&x| (x as usize) < row.len()) {
        if sampler.coin() < row[x as usize] {
            return Ok(x);
        }
        row[x as usize] = 0.0;
    }
    Ok(sampler.draw(row))
}

/// Emits `token` as generated: into the output and the history, and to the caller.
fn emit<F: FnMut(Event<'_>)>(
    out: &mut Decoded,
    on_event: &mut F,
    history: &mut Vec<u32>,
    token: u32,
) {
    let prev = *history.last().unwrap_or(&token);
    history.push(token);
    out.tokens.push(token);
    on_event(Event::Token {
        prev,
        token,
        generated: true,
    });
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn prompt_lookup_proposes_what_followed_the_latest_match() {
        let p = NgramProposer::default();
        // "a b c d a b" → the suffix "a b" occurred at 0, followed by "c d a b".
        assert_eq!(p.propose(&[1, 2, 3, 4, 1, 2], 3), vec![3, 4, 1]);
        assert_eq!(p.propose(&[1, 2, 3, 4, 1, 2], 10), vec![3, 4, 1, 2]);
        // The latest occurrence wins: "x 9" twice, the second followed by 7.
        assert_eq!(p.propose(&[5, 9, 6, 5, 9, 7, 5, 9], 1), vec![7]);
        // Longer suffixes first: "2 3" matches where "3" alone would match later.
        assert_eq!(p.propose(&[2, 3, 8, 3, 4, 2, 3], 1), vec![8]);
        assert!(p.propose(&[1, 2, 3], 4).is_empty(), "nothing repeats");
        assert!(p.propose(&[1, 1], 0).is_empty());
        assert_eq!(
            p.propose(&[7, 7, 7], 2),
            vec![7],
            "overlapping runs continue"
        );
    }
}

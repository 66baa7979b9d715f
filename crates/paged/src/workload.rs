//! Seeded request-length generators for the waste table and scheduler experiments.
//!
//! Both use ChaCha8 seeded from a `u64`, so a seed names a workload. The uniform generator uses
//! integer sampling only and is bit-identical on every platform; the long-tail one goes through
//! `ln`, `cos` and `exp`, which are reproducible on one platform but could in principle round
//! differently elsewhere.

use rand::{Rng, SeedableRng};
use rand_chacha::ChaCha8Rng;

use crate::{PagedError, RequestLen, Result, Tenant};

/// The range of the standard uniform workload, for prompts and outputs alike.
pub const UNIFORM_RANGE: std::ops::RangeInclusive<usize> = 100..=1024;

/// `n` requests with prompt and output lengths uniform in `100..=1024` each (fits
/// `max_seq_len = 2048`).
pub fn uniform_requests(n: usize, seed: u64) -> Vec<RequestLen> {
    let mut rng = ChaCha8Rng::seed_from_u64(seed);
    (0..n)
        .map(|_| RequestLen {
            prompt_len: rng.random_range(UNIFORM_RANGE),
            output_len: rng.random_range(UNIFORM_RANGE),
        })
        .collect()
}

/// Parameters of the long-tail workload: log-normal lengths, as measured request traces look
/// (most requests short, a few very long). A log-normal with median `m` and shape `σ` is
/// `m · exp(σ · z)` with `z` standard normal; its mean is `m · exp(σ² / 2)`.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct LongTail {
    /// Median prompt length `m`, in tokens.
    pub prompt_median: f64,
    /// Shape `σ` of the prompt lengths' log-normal.
    pub prompt_sigma: f64,
    /// Median output length `m`, in tokens.
    pub output_median: f64,
    /// Shape `σ` of the output lengths' log-normal.
    pub output_sigma: f64,
    /// Longest request (prompt + output); prompts are cut to `max_seq_len - 1` and outputs to
    /// the room left, as a length stop would.
    pub max_seq_len: usize,
}

impl Default for LongTail {
    /// Prompts: median 256, σ = 1.0 (mean ≈ 422); outputs: median 128, σ = 1.2 (mean ≈ 263);
    /// `max_seq_len = 2048`.
    fn default() -> Self {
        Self {
            prompt_median: 256.0,
            prompt_sigma: 1.0,
            output_median: 128.0,
            output_sigma: 1.2,
            max_seq_len: 2048,
        }
    }
}

/// `n` requests drawn from the [`LongTail`] log-normal lengths.
///
/// # Errors
/// [`PagedError::InvalidWorkload`] if `max_seq_len < 2`, or a median is not positive and
/// finite, or a σ is negative or not finite.
pub fn long_tail_requests(n: usize, seed: u64, shape: LongTail) -> Result<Vec<RequestLen>> {
    let ok = |m: f64, s: f64| m.is_finite() && m > 0.0 && s.is_finite() && s >= 0.0;
    if shape.max_seq_len < 2
        || !ok(shape.prompt_median, shape.prompt_sigma)
        || !ok(shape.output_median, shape.output_sigma)
    {
        return Err(PagedError::InvalidWorkload(format!(
            "long-tail shape {shape:?} needs max_seq_len >= 2, positive finite medians and \
             non-negative finite sigmas"
        )));
    }
    let mut rng = ChaCha8Rng::seed_from_u64(seed);
    let mut draw = |median: f64, sigma: f64, max: usize| -> usize {
        let x = median * (sigma * standard_normal(&mut rng)).exp();
        // `as` saturates for huge or NaN floats; the clamp keeps at least one token.
        (x.round() as usize).clamp(1, max)
    };
    Ok((0..n)
        .map(|_| {
            let prompt_len = draw(
                shape.prompt_median,
                shape.prompt_sigma,
                shape.max_seq_len - 1,
            );
            let room = shape.max_seq_len - prompt_len;
            let output_len = draw(shape.output_median, shape.output_sigma, room);
            RequestLen {
                prompt_len,
                output_len,
            }
        })
        .collect())
}

/// A standard normal sample by Box–Muller: `sqrt(-2 ln u1) · cos(2π u2)` with `u1` in `(0, 1]`
/// (so the log is finite) and `u2` in `[0, 1)`.
fn standard_normal(rng: &mut ChaCha8Rng) -> f64 {
    let u1 = 1.0 - rng.random::<f64>();
    let u2 = rng.random::<f64>();
    (-2.0 * u1.ln()).sqrt() * (std::f64::consts::TAU * u2).cos()
}

/// Parameters of a chat-like workload for prefix caching: a few shared system prompts, and
/// sessions of several turns whose prompts grow by each turn (the whole conversation so far is
/// sent again, as chat clients do), interleaved in time so that sessions compete for the pool.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Sessions {
    /// Distinct system prompts; session `i` uses prompt `i % num_system_prompts`.
    pub num_system_prompts: usize,
    /// Tokens of each system prompt.
    pub system_len: usize,
    /// Sessions, not counting the noisy neighbour's.
    pub num_sessions: usize,
    /// Turns (requests) of each session.
    pub turns_per_session: usize,
    /// A user message is `user_len.0..=user_len.1` tokens.
    pub user_len: (usize, usize),
    /// Tokens of each assistant reply sent back in the next turn's prompt.
    pub reply_len: usize,
    /// Steps between a session's turns (enough for a turn to finish before the next).
    pub turn_gap_steps: usize,
    /// Sessions start this many steps apart (`0`: all at once).
    pub session_gap_steps: usize,
    /// Token ids are drawn from `first_token..vocab_size` (above BOS/EOS and friends).
    pub first_token: u32,
    /// One past the largest token id drawn (the model's vocab_size).
    pub vocab_size: u32,
    /// Tenants the sessions belong to: session `i` is tenant `i % num_tenants`.
    pub num_tenants: usize,
    /// Sessions of one more tenant (id `num_tenants`), each with a system prompt of its own
    /// that nobody shares: a noisy neighbour that fills the prefix cache with blocks nobody
    /// else reuses. They start alongside the others.
    pub noisy_sessions: usize,
}

impl Default for Sessions {
    /// 4 system prompts of 48 tokens, 24 sessions of 4 turns, user messages of 8–32 tokens,
    /// replies of 24, turns 40 steps apart, sessions starting 6 steps apart, ids 3..512
    /// (stories260K's vocabulary).
    fn default() -> Self {
        Self {
            num_system_prompts: 4,
            system_len: 48,
            num_sessions: 24,
            turns_per_session: 4,
            user_len: (8, 32),
            reply_len: 24,
            turn_gap_steps: 40,
            session_gap_steps: 6,
            first_token: 3,
            vocab_size: 512,
            num_tenants: 1,
            noisy_sessions: 0,
        }
    }
}

/// One request of a [`Sessions`] workload.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SessionTurn {
    /// Sessions `0..num_sessions`, then the noisy ones.
    pub session: usize,
    /// The turn's index in its session (0: the first).
    pub turn: usize,
    /// The session's tenant.
    pub tenant: Tenant,
    /// System prompt, then every earlier turn's user message and reply, then this turn's user
    /// message (no BOS: the caller adds one if its model wants it).
    pub prompt: Vec<u32>,
    /// The step at which it arrives.
    pub arrival_step: usize,
    /// A later turn continues this session (every turn but the last): it pauses in between.
    pub resumes: bool,
}

/// The turns of a [`Sessions`] workload, in arrival order (ties by session).
///
/// # Errors
/// [`PagedError::InvalidWorkload`] for an empty vocabulary range, no system prompt, no turn,
/// or `user_len.0 > user_len.1`.
pub fn session_turns(seed: u64, w: Sessions) -> Result<Vec<SessionTurn>> {
    if w.first_token >= w.vocab_size
        || w.num_system_prompts == 0
        || w.turns_per_session == 0
        || w.user_len.0 > w.user_len.1
        || w.num_tenants == 0
        || Tenant::try_from(w.num_tenants).is_err()
    {
        return Err(PagedError::InvalidWorkload(format!(
            "sessions workload {w:?} needs first_token < vocab_size, at least one system \
             prompt, turn and tenant, and user_len.0 <= user_len.1"
        )));
    }
    let mut rng = ChaCha8Rng::seed_from_u64(seed);
    let tokens = |n: usize, rng: &mut ChaCha8Rng| -> Vec<u32> {
        (0..n)
            .map(|_| rng.random_range(w.first_token..w.vocab_size))
            .collect()
    };
    let systems: Vec<Vec<u32>> = (0..w.num_system_prompts)
        .map(|_| tokens(w.system_len, &mut rng))
        .collect();
    let mut turns = Vec::new();
    let mut add_session =
        |session: usize, start: usize, system: Vec<u32>, tenant: Tenant, rng: &mut ChaCha8Rng| {
            let mut history = system;
            for turn in 0..w.turns_per_session {
                let user_len = rng.random_range(w.user_len.0..=w.user_len.1);
                history.extend(tokens(user_len, rng));
                turns.push(SessionTurn {
                    session,
                    turn,
                    tenant,
                    prompt: history.clone(),
                    arrival_step: start + turn * w.turn_gap_steps,
                    resumes: turn + 1 < w.turns_per_session,
                });
                history.extend(tokens(w.reply_len, rng));
            }
        };
    for session in 0..w.num_sessions {
        let system = systems[session % w.num_system_prompts].clone();
        let tenant = (session % w.num_tenants) as Tenant;
        add_session(
            session,
            session * w.session_gap_steps,
            system,
            tenant,
            &mut rng,
        );
    }
    // Drawn after the others, so that adding noisy sessions leaves the rest as they were.
    for j in 0..w.noisy_sessions {
        let system = tokens(w.system_len, &mut rng);
        let (session, start) = (w.num_sessions + j, j * w.session_gap_steps);
        add_session(session, start, system, w.num_tenants as Tenant, &mut rng);
    }
    turns.sort_by_key(|t| (t.arrival_step, t.session));
    Ok(turns)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn session_turns_grow_from_a_shared_system_prompt() {
        let w = Sessions::default();
        let turns = session_turns(7, w).unwrap();
        assert_eq!(turns.len(), w.num_sessions * w.turns_per_session);
        assert!(
            turns
                .windows(2)
                .all(|p| p[0].arrival_step <= p[1].arrival_step)
        );
        for t in &turns {
            let earlier = turns
                .iter()
                .find(|e| e.session == t.session && e.turn + 1 == t.turn);
            if let Some(e) = earlier {
                // Each turn's prompt extends the previous one's by its reply and a new message.
                assert!(t.prompt.starts_with(&e.prompt));
                assert!(t.prompt.len() >= e.prompt.len() + w.reply_len + w.user_len.0);
            }
            let other = turns
                .iter()
                .find(|o| o.session % w.num_system_prompts == t.session % w.num_system_prompts)
                .unwrap();
            assert_eq!(t.prompt[..w.system_len], other.prompt[..w.system_len]);
        }
        assert_eq!(turns, session_turns(7, w).unwrap());
        assert!(
            session_turns(
                7,
                Sessions {
                    user_len: (5, 4),
                    ..w
                }
            )
            .is_err()
        );
    }

    /// Tenants take sessions round robin; noisy sessions come after, as one more tenant, each
    /// with a system prompt nobody else has, and leave the other sessions exactly as they were.
    #[test]
    fn tenants_split_the_sessions_and_noisy_ones_share_nothing() {
        let quiet = Sessions {
            num_tenants: 3,
            ..Sessions::default()
        };
        let noisy = Sessions {
            noisy_sessions: 5,
            ..quiet
        };
        let (a, b) = (
            session_turns(1, quiet).unwrap(),
            session_turns(1, noisy).unwrap(),
        );
        assert!(a.iter().all(|t| t.tenant as usize == t.session % 3));
        let others = b.iter().filter(|t| t.session < quiet.num_sessions).cloned();
        assert_eq!(others.collect::<Vec<_>>(), a);
        let loud: Vec<_> = b
            .iter()
            .filter(|t| t.session >= quiet.num_sessions)
            .collect();
        assert_eq!(loud.len(), 5 * quiet.turns_per_session);
        assert!(loud.iter().all(|t| t.tenant == 3));
        for t in &loud {
            let system = &t.prompt[..quiet.system_len];
            let sharing = b.iter().filter(|o| o.session != t.session);
            assert!(
                sharing
                    .clone()
                    .all(|o| &o.prompt[..quiet.system_len] != system)
            );
        }
        assert!(
            session_turns(
                1,
                Sessions {
                    num_tenants: 0,
                    ..quiet
                }
            )
            .is_err()
        );
    }
}

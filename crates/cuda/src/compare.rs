//! Comparing an engine with a reference engine by teacher forcing: both see the same tokens, so
//! each position's logits are comparable even after the engines' greedy choices would differ.
//! This is how f16 mode is reported (top-1 agreement, max |Δlogit|); f32 mode must instead be
//! token-identical.

use kvlab_model::{Engine, Result, sampler, teacher_force};
use serde::Serialize;

/// Teacher-forced agreement of a candidate with a reference.
#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct Agreement {
    /// Positions compared.
    pub positions: usize,
    /// Fraction of positions whose argmax (top-1 token) is the same.
    pub top1_agreement: f64,
    /// Largest |candidate − reference| over every logit of every position.
    pub max_abs_dlogit: f32,
    /// First position whose top-1 differs, if any.
    pub first_mismatch: Option<usize>,
}

/// Feeds `prompt` then `forced` to both engines and compares the logits at every position.
///
/// # Errors
/// Whatever either engine returns.
pub fn teacher_forced_agreement(
    reference: &mut dyn Engine,
    candidate: &mut dyn Engine,
    prompt: &[u32],
    forced: &[u32],
    max_seq_len: usize,
) -> Result<Agreement> {
    let want = teacher_force(reference, prompt, forced, max_seq_len)?;
    let got = teacher_force(candidate, prompt, forced, max_seq_len)?;
    Ok(agreement(&want, &got))
}

/// [`Agreement`] of two lists of logits rows (reference first).
pub fn agreement(want: &[Vec<f32>], got: &[Vec<f32>]) -> Agreement {
    let mut same = 0;
    let mut first_mismatch = None;
    let mut max_abs_dlogit = 0.0f32;
    for (i, (w, g)) in want.iter().zip(got).enumerate() {
        if sampler::argmax(w) == sampler::argmax(g) {
            same += 1;
        } else if first_mismatch.is_none() {
            first_mismatch = Some(i);
        }
        for (a, b) in w.iter().zip(g) {
            let d = (a - b).abs();
            max_abs_dlogit = if d.is_nan() {
                f32::INFINITY
            } else {
                max_abs_dlogit.max(d)
            };
        }
    }
    let positions = want.len().min(got.len());
    Agreement {
        positions,
        top1_agreement: if positions == 0 {
            1.0
        } else {
            same as f64 / positions as f64
        },
        max_abs_dlogit,
        first_mismatch,
    }
}

#[cfg(test)]
mod tests {
    use std::sync::Arc;

    use super::*;

    #[test]
    fn agreement_counts_top1_and_the_largest_difference() {
        let want = vec![vec![0.0, 1.0, 0.5], vec![2.0, 0.0, 0.0]];
        let got = vec![vec![0.1, 1.0, 0.5], vec![0.0, 0.5, 0.0]];
        let a = agreement(&want, &got);
        assert_eq!(a.positions, 2);
        assert_eq!(a.top1_agreement, 0.5);
        assert_eq!(a.first_mismatch, Some(1));
        assert!((a.max_abs_dlogit - 2.0).abs() < 1e-6);
        let nan = agreement(&[vec![1.0]], &[vec![f32::NAN]]);
        assert!(nan.max_abs_dlogit.is_infinite());
    }

    #[test]
    fn an_engine_agrees_with_itself() {
        let model = Arc::new(
            kvlab_model::SyntheticSpec::new(32, 64, 1, 2, 2, 64, 32, 5)
                .build()
                .unwrap(),
        );
        let mut a = kvlab_naive::NaiveEngine::new(model.clone());
        let mut b = kvlab_naive::NaiveEngine::new(model);
        let r = teacher_forced_agreement(&mut a, &mut b, &[1, 2, 3], &[4, 5, 6], 32).unwrap();
        assert_eq!(r.positions, 3);
        assert_eq!(r.top1_agreement, 1.0);
        assert_eq!(r.max_abs_dlogit, 0.0);
    }
}

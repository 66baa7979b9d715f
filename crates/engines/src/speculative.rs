//! Speculative decoding in the scheduler's batch, greedy: [`GreedyDrafting`] is the
//! [`TokenSampler`] `kvlab batch`, verify and bench drive the paged engines with. It picks the
//! argmax of every row and, with a [`Drafter`], proposes the draft tokens each decode checks
//! (the driver keeps the drafts the argmax agrees with; `kvlab_paged::driver::step`).

use std::convert::Infallible;

use kvlab_model::Drafter;
use kvlab_model::sampler::argmax;
use kvlab_paged::{RequestId, TokenSampler};

/// Greedy sampling, drafting with `drafter` when there is one.
#[derive(Debug, Default)]
pub struct GreedyDrafting {
    /// Where the draft tokens come from; `None`: plain decoding.
    pub drafter: Option<Drafter>,
}

impl TokenSampler for GreedyDrafting {
    type Error = Infallible;

    fn sample(&mut self, _: RequestId, logits: Vec<f32>) -> Result<u32, Infallible> {
        Ok(argmax(&logits))
    }

    fn speculates(&self) -> bool {
        self.drafter.is_some()
    }

    /// The drafter's guesses; none if the draft engine fails (counted in
    /// [`Drafter::failures`]).
    fn propose(&mut self, id: RequestId, token_ids: &[u32], max: usize) -> Vec<u32> {
        (self.drafter.as_mut()).map_or_else(Vec::new, |d| d.propose_or_none(id.0, token_ids, max))
    }

    fn drafts_checked(&mut self, id: RequestId, num_drafts: usize, num_kept: usize) {
        if let Some(d) = self.drafter.as_mut() {
            d.record(id.0, num_drafts, num_kept);
        }
    }

    fn release(&mut self, id: RequestId) {
        if let Some(d) = self.drafter.as_mut() {
            d.release(id.0);
        }
    }
}

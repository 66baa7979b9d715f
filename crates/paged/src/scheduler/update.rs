//! The other half of a step, and a sequence's life outside of `schedule`: taking sampled tokens,
//! stopping, preempting, forking and aborting.
//!
//! `update` is where a step's k and v become *computed*: every scheduled sequence's cache now
//! covers the positions the step fed, the sampled token is appended (its k and v come next step;
//! a chunk that did not reach the end of its prompt samples nothing), newly full blocks are
//! registered in the prefix cache, stop conditions are checked, finished sequences free their
//! blocks at once, and sliding-window groups drop the blocks that fell out of the window. A step
//! that checked draft tokens (speculative decoding) keeps the ones the model agreed with and
//! rolls the cache back past the others: their slots are forgotten, and blocks wholly past the
//! cut go back to the pool (never a block the prefix cache holds: those are full of tokens
//! computed before the step).

use std::collections::BTreeMap;

use super::{InFlight, seq_mut};
use crate::{FinishReason, FinishedSeq, PagedError, RequestId, Result, Scheduler, SequenceStatus};

impl Scheduler {
    /// Takes one sampled token per sequence of the last batch that samples (any order; none
    /// for a partial prefill). A sequence whose step checked draft tokens takes 1 to
    /// `1 + num_draft_tokens` entries, in order: the drafts the model agreed with (a prefix of
    /// them) and the token sampled after the last one kept; the cache is rolled back past the
    /// drafts not kept ([`crate::KvCacheManager::truncate`]). Returns the sequences that
    /// finished (a stop token or `max_tokens` among the kept drafts ends it there); their
    /// blocks are already free. With nothing in flight, an empty `outputs` is a no-op.
    ///
    /// # Errors
    /// Checked before anything changes (the step stays in flight, so a corrected call can
    /// follow): [`PagedError::NoStepInFlight`] for tokens without a step;
    /// [`PagedError::UnexpectedOutput`] for a sequence not sampled in the batch, given more
    /// tokens than it checked drafts plus one, or given a token as a kept draft that is not the
    /// draft; [`PagedError::MissingOutput`] for a sampled batch sequence without a token.
    /// Tokens of sequences aborted while in flight are ignored.
    pub fn update(&mut self, outputs: &[(RequestId, u32)]) -> Result<Vec<FinishedSeq>> {
        let Some(in_flight) = self.in_flight.as_ref() else {
            return match outputs.first() {
                None => Ok(Vec::new()),
                Some(_) => Err(PagedError::NoStepInFlight),
            };
        };
        let mut tokens: BTreeMap<RequestId, Vec<u32>> = BTreeMap::new();
        for &(id, token) in outputs {
            if self.aborted_in_flight.contains(&id) {
                continue;
            }
            let f = in_flight.iter().find(|f| f.id == id && f.samples);
            let got = tokens.entry(id).or_default();
            got.push(token);
            // Every token before the last must be the draft at its place.
            let kept = got.len() - 1;
            let fits = f.is_some_and(|f| kept <= f.drafts.len() && got[..kept] == f.drafts[..kept]);
            if !fits {
                return Err(PagedError::UnexpectedOutput(id));
            }
        }
        let sampled = in_flight.iter().filter(|f| f.samples);
        if let Some(missing) = sampled.clone().find(|f| !tokens.contains_key(&f.id)) {
            return Err(PagedError::MissingOutput(missing.id));
        }
        let Some(mut in_flight) = self.in_flight.take() else {
            return Ok(Vec::new());
        };
        in_flight.sort_by_key(|f| f.id); // Blocks are registered oldest sequence first.
        self.aborted_in_flight.clear();
        let mut finished = Vec::new();
        for f in in_flight {
            let out = tokens.remove(&f.id).unwrap_or_default();
            if let Some(done) = self.take_tokens(&f, &out)? {
                finished.push(done);
            }
        }
        self.kv.apply_tier_drops();
        Ok(finished)
    }

    /// One sequence of the step: its tokens `out` (the kept drafts, then the sampled one)
    /// appended, the cache rolled back past the drafts not kept, full blocks registered, stop
    /// conditions checked after each token.
    fn take_tokens(&mut self, f: &InFlight, out: &[u32]) -> Result<Option<FinishedSeq>> {
        let max_model_len = self.config.max_model_len;
        let kept = out.len().saturating_sub(1);
        // The keys of the last token and of the kept drafts are valid; the rest are not.
        let computed = f.end - (f.drafts.len() - kept.min(f.drafts.len()));
        if !f.drafts.is_empty() {
            let c = &mut self.counters;
            c.spec_decode_num_drafts += 1;
            c.spec_decode_num_draft_tokens += f.drafts.len() as u64;
            c.spec_decode_num_accepted_tokens += kept as u64;
        }
        let seq = seq_mut(&mut self.seqs, f.id)?;
        seq.num_computed_tokens = computed;
        seq.max_computed_tokens = seq.max_computed_tokens.max(computed);
        if computed < f.end && !self.kv.truncate(&mut seq.block_tables, computed) {
            return Err(PagedError::Stuck(format!(
                "{} cannot roll its cache back to {computed} positions after a rejected draft",
                f.id
            )));
        }
        let mut reason = None;
        for &token in out {
            seq.token_ids.push(token);
            reason = seq.check_stop(max_model_len).filter(|_| f.samples);
            if reason.is_some() {
                break;
            }
        }
        self.kv
            .cache_blocks(&mut seq.block_tables, &seq.token_ids, computed)?;
        match reason {
            Some(reason) => Ok(Some(self.finish(f.id, reason)?)),
            None => {
                self.trim_windows(f.id)?;
                Ok(None)
            }
        }
    }

    /// Ends a sequence now, whatever its state, and frees its blocks. Allowed while a step is in
    /// flight (its token in the next `update` is then ignored).
    ///
    /// # Errors
    /// [`PagedError::UnknownSequence`] if `id` is not live.
    pub fn abort(&mut self, id: RequestId) -> Result<FinishedSeq> {
        self.seq(id)?;
        if let Some(f) = self
            .in_flight
            .as_mut()
            .filter(|f| f.iter().any(|f| f.id == id))
        {
            f.retain(|f| f.id != id);
            self.aborted_in_flight.push(id);
        }
        self.finish(id, FinishReason::Aborted)
    }

    /// Forks running sequence `parent` copy-on-write (parallel sampling, beam search): the child
    /// has the same tokens and shares every block (ref counts + 1); the first write into a
    /// shared block copies it. The child is the newest running sequence.
    ///
    /// # Errors
    /// [`PagedError::UpdatePending`] while a step is in flight; [`PagedError::UnknownSequence`];
    /// [`PagedError::WrongStatus`] unless `parent` is running; [`PagedError::InvalidRequest`]
    /// if `max_num_seqs` sequences already run.
    pub fn fork(&mut self, parent: RequestId) -> Result<RequestId> {
        self.check_running_idle(parent)?;
        if self.running.len() >= self.config.max_num_seqs {
            return Err(PagedError::InvalidRequest(format!(
                "cannot fork {parent}: max_num_seqs = {} sequences already run; raise it or \
                 fork after some finish",
                self.config.max_num_seqs
            )));
        }
        let mut child = self.seq(parent)?.clone();
        child.block_tables = self.kv.fork(&child.block_tables)?;
        let id = self.new_id();
        child.id = id;
        child.num_preemptions = 0;
        self.seqs.insert(id, child);
        self.running.push(id);
        Ok(id)
    }

    /// Replaces the last sampled token of running sequence `id` (not yet computed), e.g. to give
    /// each fork of a parallel-sampling group its own first sample. Re-checks stop conditions;
    /// returns the finished sequence if the new token ends it.
    ///
    /// # Errors
    /// [`PagedError::UpdatePending`], [`PagedError::UnknownSequence`], [`PagedError::WrongStatus`]
    /// as for `fork`; [`PagedError::InvalidRequest`] if the sequence has generated nothing yet.
    pub fn replace_last_token(&mut self, id: RequestId, token: u32) -> Result<Option<FinishedSeq>> {
        self.check_running_idle(id)?;
        let max_model_len = self.config.max_model_len;
        let seq = seq_mut(&mut self.seqs, id)?;
        if seq.output_token_ids().is_empty() {
            return Err(PagedError::InvalidRequest(format!(
                "{id} has no generated token to replace yet"
            )));
        }
        if let Some(last) = seq.token_ids.last_mut() {
            *last = token;
        }
        match seq.check_stop(max_model_len) {
            Some(reason) => Ok(Some(self.finish(id, reason)?)),
            None => Ok(None),
        }
    }

    /// Frees `id`'s blocks, drops it from the queues and returns what the caller needs.
    fn finish(&mut self, id: RequestId, reason: FinishReason) -> Result<FinishedSeq> {
        let mut seq = self
            .seqs
            .remove(&id)
            .ok_or(PagedError::UnknownSequence(id))?;
        let offload = seq.offload_on_finish && reason != FinishReason::Aborted;
        self.kv.free(&mut seq.block_tables, offload)?;
        self.running.retain(|&r| r != id);
        self.waiting.retain(|&w| w != id);
        Ok(FinishedSeq {
            seq_id: id,
            prompt_token_ids: seq.prompt_token_ids().to_vec(),
            output_token_ids: seq.output_token_ids().to_vec(),
            reason,
        })
    }

    fn check_running_idle(&self, id: RequestId) -> Result<()> {
        if self.in_flight.is_some() {
            return Err(PagedError::UpdatePending);
        }
        let status = self.seq(id)?.status;
        if status != SequenceStatus::Running {
            return Err(PagedError::WrongStatus {
                seq: id,
                actual: status.name(),
                expected: "running",
            });
        }
        Ok(())
    }
}

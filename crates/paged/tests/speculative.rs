//! Speculative decoding in the scheduler: a decode feeds its last token and the draft tokens it
//! was given, `update` keeps the drafts the model agreed with and rolls the cache back past the
//! rest. These tests pin down one step at a time; `props.rs` drives random drafts through whole
//! runs against a shadow cache.

#![allow(clippy::unwrap_used)]

use kvlab_paged::{
    EvictionPolicy, FinishReason, KvCacheConfig, KvGroupConfig, PagedError, RequestId, Scheduler,
    SchedulerConfig, StepKind, StopConditions,
};

fn config(groups: Vec<KvGroupConfig>, block_size: usize, prefix_caching: bool) -> SchedulerConfig {
    SchedulerConfig {
        kv_cache: KvCacheConfig { block_size, groups },
        max_num_batched_tokens: 64,
        enable_chunked_prefill: true,
        max_num_seqs: 8,
        max_model_len: 64,
        enable_prefix_caching: prefix_caching,
        eviction_policy: EvictionPolicy::Lru,
        tenant_quota: None,
        tiers: None,
    }
}

fn full(num_blocks: usize) -> KvGroupConfig {
    KvGroupConfig {
        num_blocks,
        sliding_window: None,
    }
}

/// Prefills `prompt` and samples `first`: the sequence then decodes.
fn decoding(s: &mut Scheduler, prompt: Vec<u32>, max_tokens: usize, first: u32) -> RequestId {
    let id = s
        .add_request(
            prompt,
            StopConditions::max_tokens(max_tokens).with_stop_tokens([99]),
        )
        .unwrap();
    s.schedule().unwrap();
    s.update(&[(id, first)]).unwrap();
    id
}

#[test]
fn a_decode_checks_its_drafts_and_keeps_the_ones_the_model_agreed_with() {
    let mut s = Scheduler::new(config(vec![full(16)], 4, false)).unwrap();
    let id = decoding(&mut s, vec![1, 2, 3, 4, 5], 20, 6);
    assert_eq!(s.max_draft_tokens(id).unwrap(), 18);
    assert_eq!(s.set_spec_token_ids(id, vec![7, 8, 9, 10]).unwrap(), 4);
    let batch = s.schedule().unwrap();
    let q = &batch.seqs[0];
    assert_eq!(q.kind, StepKind::Decode);
    assert_eq!(
        (q.token_ids.as_slice(), q.num_draft_tokens),
        (&[6, 7, 8, 9, 10][..], 4)
    );
    assert_eq!(q.positions, vec![5, 6, 7, 8, 9]);
    assert_eq!(q.context_len, 10);
    let input = batch.model_input();
    assert_eq!(
        input.logits_indices,
        vec![0, 1, 2, 3, 4],
        "a row per fed token"
    );
    input
        .validate(&s.config().kv_cache, 100, 64)
        .expect("a speculative step is a valid step");
    // The model agrees with 7 and 8, then says 20 where the draft said 9.
    let blocks_before = s.metrics().num_blocks_used;
    assert_eq!(blocks_before, 3, "positions 0..10 need three blocks of 4");
    s.update(&[(id, 7), (id, 8), (id, 20)]).unwrap();
    let seq = s.sequence(id).unwrap();
    assert_eq!(seq.output_token_ids(), &[6, 7, 8, 20]);
    assert_eq!(
        seq.num_computed_tokens(),
        8,
        "keys of 6, 7 and 8 kept; 9 and 10 rolled back"
    );
    assert_eq!(
        s.metrics().num_blocks_used,
        2,
        "the block holding only drafts went back"
    );
    let m = s.metrics();
    assert_eq!(
        (
            m.spec_decode_num_drafts,
            m.spec_decode_num_draft_tokens,
            m.spec_decode_num_accepted_tokens
        ),
        (1, 4, 2)
    );
    assert!(
        s.sequence(id).unwrap().spec_token_ids().is_empty(),
        "drafts are used once"
    );
    // The next step writes at position 8, over the rolled-back draft's slot.
    let next = s.schedule().unwrap();
    assert_eq!(next.seqs[0].positions, vec![8]);
    assert_eq!(next.seqs[0].token_ids, vec![20]);
}

#[test]
fn update_refuses_tokens_that_are_not_kept_drafts_and_one_more() {
    let mut s = Scheduler::new(config(vec![full(16)], 4, false)).unwrap();
    let id = decoding(&mut s, vec![1, 2, 3], 20, 6);
    s.set_spec_token_ids(id, vec![7, 8]).unwrap();
    s.schedule().unwrap();
    let wrong_draft = s.update(&[(id, 5), (id, 8)]);
    assert!(matches!(wrong_draft, Err(PagedError::UnexpectedOutput(_))));
    let too_many = s.update(&[(id, 7), (id, 8), (id, 1), (id, 2)]);
    assert!(matches!(too_many, Err(PagedError::UnexpectedOutput(_))));
    // Refusals change nothing: a correct update follows. All drafts kept, plus one.
    s.update(&[(id, 7), (id, 8), (id, 9)]).unwrap();
    assert_eq!(s.sequence(id).unwrap().output_token_ids(), &[6, 7, 8, 9]);
    assert_eq!(s.sequence(id).unwrap().num_computed_tokens(), 6);
}

#[test]
fn a_stop_among_the_kept_drafts_ends_the_sequence_there() {
    let mut s = Scheduler::new(config(vec![full(16)], 4, false)).unwrap();
    let id = decoding(&mut s, vec![1, 2, 3], 20, 6);
    s.set_spec_token_ids(id, vec![99, 8]).unwrap();
    s.schedule().unwrap();
    let done = s.update(&[(id, 99), (id, 8), (id, 4)]).unwrap();
    assert_eq!(done.len(), 1);
    assert_eq!(done[0].output_token_ids, vec![6, 99]);
    assert_eq!(done[0].reason, FinishReason::Stop);
    assert_eq!(s.metrics().num_blocks_used, 0);
}

#[test]
fn drafts_are_capped_by_the_stop_conditions_the_window_and_the_budget() {
    // max_tokens 5 with one generated: at most 3 drafts (each kept one and the token after
    // them are generated tokens).
    let mut s = Scheduler::new(config(vec![full(16)], 4, false)).unwrap();
    let id = decoding(&mut s, vec![1, 2, 3], 5, 6);
    assert_eq!(s.max_draft_tokens(id).unwrap(), 3);
    assert_eq!(s.set_spec_token_ids(id, vec![1; 10]).unwrap(), 3);
    // A sliding window of 5: at most 3 drafts, so that a rollback into the step still finds
    // every key its next query reads.
    let window = KvGroupConfig {
        num_blocks: 16,
        sliding_window: Some(5),
    };
    let mut s = Scheduler::new(config(vec![full(16), window], 4, false)).unwrap();
    let id = decoding(&mut s, vec![1, 2, 3], 20, 6);
    assert_eq!(s.max_draft_tokens(id).unwrap(), 3);
    // A sequence still prefilling takes none.
    let waiting = s
        .add_request(vec![1; 8], StopConditions::max_tokens(4))
        .unwrap();
    assert_eq!(s.set_spec_token_ids(waiting, vec![1, 2]).unwrap(), 0);
    // A budget of 3 tokens feeds the last token and 2 of its 3 drafts.
    let mut c = config(vec![full(16)], 4, false);
    c.max_num_batched_tokens = 3;
    let mut s = Scheduler::new(c).unwrap();
    let id = decoding(&mut s, vec![1, 2], 20, 6);
    s.set_spec_token_ids(id, vec![7, 8, 9]).unwrap();
    let b = s.schedule().unwrap();
    assert_eq!(
        (b.seqs[0].num_new_tokens(), b.seqs[0].num_draft_tokens),
        (3, 2)
    );
}

#[test]
fn a_rollback_keeps_the_blocks_the_prefix_cache_holds() {
    // Prompt of 8 (two full blocks, registered), then 6 and 4 drafts into a third and fourth
    // block, none kept: those go back; the registered ones stay and a second request hits them.
    let mut s = Scheduler::new(config(vec![full(16)], 4, true)).unwrap();
    let prompt = vec![1, 2, 3, 4, 5, 6, 7, 8];
    let id = decoding(&mut s, prompt.clone(), 20, 9);
    s.set_spec_token_ids(id, vec![10, 11, 12, 13, 14]).unwrap();
    s.schedule().unwrap();
    assert_eq!(s.metrics().num_blocks_used, 4);
    s.update(&[(id, 30)]).unwrap();
    assert_eq!(s.sequence(id).unwrap().num_computed_tokens(), 9);
    assert_eq!(
        s.metrics().num_blocks_used,
        3,
        "positions 0..9 keep three blocks"
    );
    let other = s
        .add_request(prompt.clone(), StopConditions::max_tokens(2))
        .unwrap();
    let b = s.schedule().unwrap();
    let q = b.seqs.iter().find(|q| q.seq_id == other).unwrap();
    assert_eq!(
        q.kind,
        StepKind::Prefill {
            num_cached_tokens: 4,
            is_recompute: false
        },
        "the first block is a prefix hit (the last prompt token is always computed)"
    );
}

/// A stand-in model over 4 tokens whose next-token distribution depends on the position and
/// the last token: `logits[t] = ((7·pos + 3·last + 5·t) mod 6) / 2`.
fn logits(pos: usize, last: u32) -> Vec<f32> {
    (0..4u32)
        .map(|t| ((7 * pos + 3 * last as usize + 5 * t as usize) % 6) as f32 / 2.0)
        .collect()
}

fn softmax(x: &[f32]) -> Vec<f64> {
    let e: Vec<f64> = x.iter().map(|&v| f64::from(v).exp()).collect();
    let sum: f64 = e.iter().sum();
    e.iter().map(|v| v / sum).collect()
}

/// Runs every step with [`logits`] for each row the step asks for.
struct StandIn;

impl kvlab_paged::StepExecutor for StandIn {
    type Error = String;

    fn execute(&mut self, input: &kvlab_paged::ModelInput) -> Result<Vec<Vec<f32>>, String> {
        let rows = input.logits_indices.iter();
        Ok(rows
            .map(|&r| logits(input.positions[r] as usize, input.input_ids[r]))
            .collect())
    }
}

/// Samples from the softmax with a seeded generator and proposes 0 to 3 random drafts.
struct RandomDrafts {
    rng: rand_chacha::ChaCha8Rng,
    drafts: bool,
}

impl kvlab_paged::TokenSampler for RandomDrafts {
    type Error = std::convert::Infallible;

    fn sample(&mut self, _: RequestId, logits: Vec<f32>) -> Result<u32, Self::Error> {
        use rand::Rng;
        let coin: f64 = self.rng.random();
        let p = softmax(&logits);
        let mut acc = 0.0;
        Ok(p.iter()
            .position(|&q| {
                acc += q;
                coin < acc
            })
            .unwrap_or(3) as u32)
    }

    fn speculates(&self) -> bool {
        self.drafts
    }

    fn propose(&mut self, _: RequestId, _: &[u32], max: usize) -> Vec<u32> {
        use rand::Rng;
        let n = self.rng.random_range(0..=3usize).min(max);
        (0..n).map(|_| self.rng.random_range(0..4u32)).collect()
    }
}

/// At a temperature, checking drafts by sampling each row in turn and keeping a draft while the
/// sampled token is the draft leaves the output distribution exactly plain sampling's: 20,000
/// three-token outputs of the stand-in model, with random drafts, against the exact joint
/// probabilities (Pearson's χ² over the 64 outcomes, 63 degrees of freedom).
#[test]
fn sampled_outputs_with_drafts_have_plain_samplings_distribution() {
    use rand::SeedableRng;
    const N: usize = 20_000;
    let c = SchedulerConfig {
        max_num_seqs: 512,
        max_num_batched_tokens: 4096,
        ..config(vec![full(512 * 4)], 4, false)
    };
    let requests: Vec<kvlab_paged::Request> = (0..N)
        .map(|_| kvlab_paged::Request {
            prompt: vec![1],
            stop: StopConditions::max_tokens(3),
            arrival_step: 0,
            tenant: 0,
            resumes: false,
        })
        .collect();
    let mut chi2 = Vec::new();
    for drafts in [false, true] {
        let mut s = Scheduler::new(c.clone()).unwrap();
        let mut sampler = RandomDrafts {
            rng: rand_chacha::ChaCha8Rng::seed_from_u64(7),
            drafts,
        };
        let report =
            kvlab_paged::drive_with(&mut StandIn, &mut s, &requests, &mut sampler, |_, _, _| {})
                .unwrap();
        let mut counts = [0usize; 64];
        for (out, _) in &report.outputs {
            assert_eq!(out.len(), 3);
            counts[(out[0] * 16 + out[1] * 4 + out[2]) as usize] += 1;
        }
        let m = report.metrics;
        if drafts {
            assert!(m.spec_decode_num_draft_tokens > 10_000, "{m:?}");
            assert!(m.spec_decode_num_accepted_tokens > 2_000, "{m:?}");
        }
        let mut x2 = 0.0;
        for (i, &n) in counts.iter().enumerate() {
            let (a, b, t) = (i as u32 / 16, i as u32 / 4 % 4, i as u32 % 4);
            let p = softmax(&logits(0, 1))[a as usize]
                * softmax(&logits(1, a))[b as usize]
                * softmax(&logits(2, b))[t as usize];
            let expected = p * N as f64;
            x2 += (n as f64 - expected).powi(2) / expected;
        }
        chi2.push(x2);
    }
    // P(χ²₆₃ > 110) ≈ 2·10⁻⁴: a wrong acceptance rule (keeping a draft whenever it is likely,
    // say) lands in the thousands.
    assert!(
        chi2.iter().all(|&x| x < 110.0),
        "χ² plain, with drafts: {chi2:?}"
    );
}

//! The generate loop on an engine whose logits turn NaN: a typed error naming the step, never a
//! panic or a silently chosen token.

mod common;

use kvlab_model::{
    Config, Engine, Error, GenerateOptions, KvUsage, Result, Sampler, SeqId, generate_tokens,
};

/// Returns finite logits favouring token 5 until position `nan_at`, then NaN logits.
struct NanAt {
    config: Config,
    pos: usize,
    nan_at: usize,
}

/// 32 positions, the context reserved for them only, no trace.
const OPTS: GenerateOptions = GenerateOptions {
    ubatch: 0,
    speculative: None,
    steps: 32,
    max_seq_len: 0,
    trace: false,
    special: false,
};

impl NanAt {
    fn new(config: Config, nan_at: usize) -> Self {
        NanAt {
            config,
            pos: 0,
            nan_at,
        }
    }

    fn logits(&self) -> Vec<f32> {
        let mut l = vec![0.0; self.config.vocab_size];
        if self.pos >= self.nan_at {
            l.fill(f32::NAN);
        } else {
            l[5] = 1.0;
        }
        l
    }
}

impl Engine for NanAt {
    fn name(&self) -> &'static str {
        "nan-at"
    }
    fn config(&self) -> &Config {
        &self.config
    }
    fn new_sequence(&mut self, _max_seq_len: usize) -> Result<SeqId> {
        Ok(0)
    }
    fn prefill(&mut self, _seq: SeqId, tokens: &[u32]) -> Result<Vec<f32>> {
        self.pos = tokens.len() - 1;
        Ok(self.logits())
    }
    fn decode(&mut self, _seq: SeqId, _token: u32) -> Result<Vec<f32>> {
        self.pos += 1;
        Ok(self.logits())
    }
    fn free(&mut self, _seq: SeqId) {}
    fn kv_usage(&self) -> KvUsage {
        KvUsage::default()
    }
}

#[test]
fn nan_logits_are_an_error_naming_the_step() {
    let config = Config::llama(8, 16, 1, 2, 2, 16, 32, true);
    for sampler in [Sampler::greedy(), Sampler::new(0.8, 0.9, 1).unwrap()] {
        let mut e = NanAt::new(config.clone(), 6);
        let mut s = sampler;
        let err = generate_tokens(&mut e, &[1, 2, 3], &OPTS, &mut s, |_| {}).unwrap_err();
        assert!(
            matches!(err, Error::NonFiniteLogits { pos: 6, index: 0, value } if value.is_nan()),
            "{err}"
        );
        assert!(err.to_string().starts_with("step 6:"), "{err}");
    }
}

#[test]
fn a_prompt_too_long_for_the_context_is_refused_before_it_is_encoded() {
    let tok = common::tok512().expect("tok512.bin is shipped");
    let mut e = NanAt::new(Config::llama(8, 16, 1, 2, 2, 512, 32, true), usize::MAX);
    // 10 MB of text: encoding it would take seconds; the bound refuses it at once.
    let text = "Once upon a time. ".repeat(10 << 20 >> 4);
    let t = std::time::Instant::now();
    let err = kvlab_model::generate_text(
        &mut e,
        &tok,
        &text,
        &OPTS,
        &mut Sampler::greedy(),
        |_| {},
        |_, _, _| {},
    )
    .unwrap_err();
    assert!(
        matches!(
            err,
            Error::PromptTooLongBeforeEncoding {
                max_seq_len: 32,
                ..
            }
        ),
        "{err}"
    );
    assert!(err.to_string().contains("shorten the prompt"), "{err}");
    assert!(t.elapsed().as_millis() < 500, "{:?}", t.elapsed());
}

//! `--speculative` and its flags, shared by `generate`, `batch` and `serve`: the flags
//! ([`SpecArgs`]), what they ask for once the draft model is loaded ([`SpecPlan`], which can
//! cross to `serve`'s engine thread), and the proposer built from it on the engine that runs it.

use std::sync::Arc;

use anyhow::{Context, Result, bail};
use kvlab_cli::args::usize_in;
use kvlab_engines::EngineKind;
use kvlab_model::{Config, DraftModel, KvDtype, Model, NgramProposer, Proposer, Speculative};

use crate::ModelArgs;

/// Speculative decoding's flags (vLLM's names).
#[derive(clap::Args, Clone)]
pub struct SpecArgs {
    /// Decode speculatively: `ngram` guesses the next tokens from the latest earlier occurrence
    /// of the text's last few tokens (prompt lookup, vLLM's method of this name), `draft` lets
    /// --draft-model decode them greedily; one step checks all the guesses. At --temp 0 the
    /// output is exactly plain greedy decoding's, at a temperature it has plain sampling's
    /// distribution (speculative sampling).
    #[arg(long, value_parser = ["ngram", "draft"])]
    pub speculative: Option<String>,
    /// The draft model of --speculative draft (a name, path or hub id, as -m): a smaller model
    /// with the target's tokenizer, held with the same --weights. `generate` runs it on the
    /// target's engine; `batch` and `serve` on the `cpu` engine, one cache per sequence.
    #[arg(long, value_name = "MODEL")]
    pub draft_model: Option<String>,
    /// Most guesses checked per step with --speculative (vLLM's flag; at most 63).
    #[arg(long, default_value_t = 4, value_parser = usize_in(1, 63), requires = "speculative")]
    pub num_speculative_tokens: usize,
    /// Longest suffix --speculative ngram looks up (vLLM's prompt_lookup_max).
    #[arg(long, default_value_t = 3, value_parser = usize_in(1, 64), requires = "speculative")]
    pub prompt_lookup_max: usize,
    /// Shortest suffix --speculative ngram looks up (vLLM's prompt_lookup_min).
    #[arg(long, default_value_t = 1, value_parser = usize_in(1, 64), requires = "speculative")]
    pub prompt_lookup_min: usize,
}

/// What `--speculative` asks for, the draft model loaded.
#[derive(Clone)]
pub struct SpecPlan {
    /// Prompt lookup, or the draft model's weights (held as the target's --weights).
    method: Method,
    /// Most guesses per step.
    num_speculative_tokens: usize,
}

#[derive(Clone)]
enum Method {
    Ngram(NgramProposer),
    Draft(Arc<Model>),
}

impl SpecArgs {
    /// The plan these flags ask for (`None` without `--speculative`), the draft model loaded
    /// where `model`'s flags say (its --offline and --weights) and checked against the
    /// `target`'s vocabulary.
    ///
    /// # Errors
    /// A --draft-model without `--speculative draft` or the reverse, a draft model that cannot
    /// be loaded, or one whose vocabulary is not the target's size.
    pub fn plan(&self, model: &ModelArgs, target: &Config) -> Result<Option<SpecPlan>> {
        let method = match (self.speculative.as_deref(), &self.draft_model) {
            (None, None) => return Ok(None),
            (None | Some("ngram"), Some(_)) => {
                bail!("--draft-model goes with --speculative draft")
            }
            (Some("draft"), None) => bail!("--speculative draft needs --draft-model MODEL"),
            (Some("draft"), Some(spec)) => {
                let draft = kvlab_cli::fetch::load(spec, None, !model.offline)
                    .with_context(|| format!("loading the draft model {spec}"))?;
                let draft = draft.model.with_weight_format(model.weights);
                if draft.config.vocab_size != target.vocab_size {
                    bail!(
                        "the draft model {spec} has a vocabulary of {} tokens and the target {}: \
                         a draft must share the target's tokenizer",
                        draft.config.vocab_size,
                        target.vocab_size
                    );
                }
                Method::Draft(Arc::new(draft))
            }
            _ => Method::Ngram(NgramProposer {
                prompt_lookup_min: self.prompt_lookup_min,
                prompt_lookup_max: self.prompt_lookup_max.max(self.prompt_lookup_min),
            }),
        };
        Ok(Some(SpecPlan {
            method,
            num_speculative_tokens: self.num_speculative_tokens,
        }))
    }
}

impl SpecPlan {
    /// The speculation: prompt lookup, or the draft model on engine `kind`, each of its
    /// sequences reserving `reserve` positions with keys and values stored as `kv_dtype`.
    ///
    /// # Errors
    /// When the draft engine cannot be built (no GPU for `cuda`, a cache too large).
    pub fn build(
        &self,
        kind: EngineKind,
        reserve: usize,
        kv_dtype: KvDtype,
    ) -> Result<Speculative> {
        let proposer = match &self.method {
            Method::Ngram(n) => Proposer::Ngram(*n),
            Method::Draft(model) => {
                let vocab = model.config.vocab_size;
                let engine = kvlab_engines::build_for(kind, model.clone(), reserve, kv_dtype)?;
                Proposer::Draft(DraftModel::new(engine, vocab)?)
            }
        };
        Ok(Speculative {
            proposer,
            num_speculative_tokens: self.num_speculative_tokens,
        })
    }
}

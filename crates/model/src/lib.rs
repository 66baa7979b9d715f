//! kvlab-model: the one Llama-family model definition every kvlab engine runs.
//!
//! Data flow of one request: text → [`Tokenizer::encode`] → prompt ids → [`Engine::prefill`]
//! (fills the cache for every prompt position, returns the last position's logits) →
//! [`Sampler`] picks a token → [`Engine::decode`] (one new position) → repeat →
//! [`Tokenizer::decode`] streams text. The loop lives once, in [`generate`].
//!
//! Files in data-flow order: [`config`], [`weights`], [`load`] (checkpoint loaders: llama2.c,
//! GGUF, Hugging Face folders), [`synthetic`], [`registry`] (named models), [`tokenizer`], [`ops`] (scalar reference maths),
//! [`rope`] (cos/sin tables for the engines),
//! [`engine`] (the trait), [`sampler`], [`generate`] (with [`speculative`] decoding); beside them [`compare`] (logit comparisons)
//! and [`fixtures`] (the prompt fixture format).

pub mod chat;
pub mod compare;
pub mod config;
pub mod engine;
pub mod error;
pub mod fixtures;
pub mod generate;
pub mod huge_pages;
pub mod kv_dtype;
pub mod load;
pub mod ops;
pub mod registry;
pub mod rope;
pub mod sampler;
pub mod speculative;
pub mod synthetic;
pub mod tokenizer;
pub mod weights;

pub use compare::{
    DistributionComparison, LogitComparison, Tolerance, compare_distributions, compare_logits,
};
pub use config::{Activation, Config, LayerKind, RopeLayout};
pub use engine::{Engine, KvUsage, SeqId, Sequences, TraceStep};
pub use error::{Error, Result};
pub use generate::{
    GenerateOptions, Generation, generate_ids_text, generate_text, generate_tokens,
    prefill_chunked, teacher_force,
};
pub use kv_dtype::KvDtype;
pub use kvlab_gguf::GgmlType;
pub use sampler::Sampler;
pub use speculative::{
    Backoff, DraftModel, Drafter, NgramProposer, Proposer, SpecStats, Speculative,
};
pub use synthetic::SyntheticSpec;
pub use tokenizer::{HfTokenizer, SpmTokenizer, Tokenizer};
pub use weights::{Activations, LayerWeights, Model, Tensor, WeightFormat, Weights};

// The loaders' paths from before they were grouped under `load/`, which the engines' tests, the
// fuzz targets and the CLI use.
pub use load::gguf::{llama as gguf_llama, model as gguf_model, write as gguf_write};
pub use load::{hf, llama2c};

pub use gguf_model::load_gguf;

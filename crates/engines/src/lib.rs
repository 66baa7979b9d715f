//! kvlab's engines by name, as the command line and the harness name them: [`EngineKind`] is the
//! one list (the CLI's `--engine` values, verify's and bench's engines, their order in reports and
//! what each one is compared with), [`build`] and its siblings construct an engine by kind, and
//! [`memory`] refuses a pool larger than the machine before allocating it.
//!
//! Files in data-flow order: [`kind`] (names and order), [`memory`] (the size check),
//! [`builders`] (kinds to engines), [`speculative`] (the greedy sampler, drafting or not, that
//! drives a paged engine's batch).

pub mod builders;
pub mod kind;
pub mod memory;
pub mod speculative;

pub use builders::{
    MAX_MODEL_LEN, PagedEngine, PoolOptions, availability, build, build_for, build_kv, build_paged,
    check_kv_dtype, kv_cache_config, require_cuda, scheduler_config,
};
pub use kind::{EngineKind, selected, value_parser};
pub use memory::human_bytes;
pub use speculative::GreedyDrafting;

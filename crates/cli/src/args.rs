//! Value parsers for numeric flags: every flag is range-checked by clap before anything runs, and
//! the error names the valid range. Sampling ranges live with the sampler
//! (`kvlab_model::sampler`), so the CLI and the library agree on them.

use clap::builder::RangedU64ValueParser;

/// Most positions any model here may hold (the loaders' bound on `max_seq_len`).
pub const MAX_POSITIONS: u64 = kvlab_model::config::MAX_SEQ_LEN as u64;
/// Largest block size accepted (vLLM uses 8 to 32; a block is a unit of allocation).
pub const MAX_BLOCK_SIZE: u64 = 4096;
/// Most blocks a pool may have; the pool's bytes are then checked against the machine's memory.
pub const MAX_NUM_BLOCKS: u64 = 1 << 24;
/// Most scheduler steps between two arrivals in `batch` (every idle step is simulated).
pub const MAX_ARRIVAL_GAP: u64 = 10_000;
/// Most requests per workload in `waste`.
pub const MAX_REQUESTS: u64 = 1_000_000;

/// A `usize` flag that must lie in `lo..=hi`; clap's message names the range.
pub fn usize_in(lo: u64, hi: u64) -> RangedU64ValueParser<usize> {
    RangedU64ValueParser::<usize>::new().range(lo..=hi)
}

/// `s` as a number; the error quotes it.
fn number<T: std::str::FromStr<Err: std::fmt::Display>>(s: &str) -> Result<T, String> {
    s.parse().map_err(|e| format!("{s:?} is not a number: {e}"))
}

/// `--temp`: 0 (greedy) or 0.001..=100.
///
/// # Errors
/// Not a number, or out of range (the message names the range).
pub fn temperature(s: &str) -> Result<f32, String> {
    kvlab_model::sampler::check_temperature(number(s)?).map_err(|e| e.to_string())
}

/// `--top-p`: greater than 0 and at most 1.
///
/// # Errors
/// Not a number, or out of range (the message names the range).
pub fn top_p(s: &str) -> Result<f32, String> {
    kvlab_model::sampler::check_top_p(number(s)?).map_err(|e| e.to_string())
}

/// A size in GiB: finite, greater than 0 and at most 2^20 GiB (a petabyte).
///
/// # Errors
/// Not a number, NaN, infinite, or out of range.
pub fn gib(s: &str) -> Result<f64, String> {
    let v: f64 = number(s)?;
    if v > 0.0 && v <= (1u64 << 20) as f64 {
        Ok(v)
    } else {
        Err(format!(
            "{s} is out of range: give a size in GiB greater than 0 and at most {}",
            1u64 << 20
        ))
    }
}

/// A size in GiB that may be 0 (weights of a model too small to matter).
///
/// # Errors
/// As [`gib`], but 0 is accepted.
pub fn gib_or_zero(s: &str) -> Result<f64, String> {
    if s.parse::<f64>() == Ok(0.0) {
        Ok(0.0)
    } else {
        gib(s)
    }
}

/// `--min-p`: 0 (off) to 1.
///
/// # Errors
/// Not a number, or out of range.
pub fn min_p(s: &str) -> Result<f32, String> {
    kvlab_model::sampler::check_min_p(number(s)?).map_err(|e| e.to_string())
}

/// `--repeat-penalty`: from 0.1 to 10; 1 is off.
///
/// # Errors
/// Not a number, or out of range.
pub fn repeat_penalty(s: &str) -> Result<f32, String> {
    kvlab_model::sampler::check_repeat_penalty(number(s)?).map_err(|e| e.to_string())
}

/// `--eviction`: a prefix-cache eviction policy by name (`lru`, `lfu`, `clock`, `leaf-first`).
pub fn eviction_parser() -> impl clap::builder::TypedValueParser<Value = kvlab_paged::EvictionPolicy>
{
    use clap::builder::{PossibleValuesParser, TypedValueParser};
    use kvlab_paged::EvictionPolicy;
    PossibleValuesParser::new(EvictionPolicy::ALL.map(EvictionPolicy::name))
        .map(|name| EvictionPolicy::from_name(&name).unwrap_or_default())
}

/// `--activations`' parser: clap lists the settings in its help and its error.
pub fn activations() -> impl clap::builder::TypedValueParser<Value = kvlab_model::Activations> {
    use clap::builder::{PossibleValuesParser, TypedValueParser};
    PossibleValuesParser::new(kvlab_model::Activations::ALL.map(|a| a.name()))
        .map(|s| s.parse().expect("clap checked the name"))
}

/// `--kv-dtype`'s parser: clap lists the dtypes in its help and its error.
pub fn kv_dtype() -> impl clap::builder::TypedValueParser<Value = kvlab_model::KvDtype> {
    use clap::builder::{PossibleValuesParser, TypedValueParser};
    PossibleValuesParser::new(kvlab_model::KvDtype::ALL.map(|d| d.name()))
        .map(|s| s.parse().expect("clap checked the name"))
}

//! Engines by name, as the command line and the harness name them.

use std::sync::Arc;

use anyhow::{Result, bail};
use kvlab_model::{Engine, Model};

/// Every engine name kvlab knows, in the order reports list them.
pub const ENGINES: &[&str] = &["naive", "cpu"];

/// Builds the engine called `name` over `model`.
///
/// # Errors
/// An unknown name (the message lists the known ones).
pub fn build(name: &str, model: Arc<Model>) -> Result<Box<dyn Engine>> {
    Ok(match name {
        "naive" => Box::new(kvlab_naive::NaiveEngine::new(model)),
        "cpu" => Box::new(kvlab_cpu::CpuEngine::new(model)),
        other => bail!(
            "unknown engine {other:?}; choose one of: {}",
            ENGINES.join(", ")
        ),
    })
}

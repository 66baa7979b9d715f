//! What the GGUF tests share: one small valid file to take apart, and the stored oracle fixtures.
//! Each test binary uses a part of it.
#![allow(dead_code)]

mod good;

use std::path::PathBuf;

// Not every test binary builds files (the fixture tests do not).
#[allow(unused_imports)]
pub use good::good;

/// The folder of the stored llama.cpp oracle fixtures (`scripts/gemma_oracle.py` writes them).
pub fn fixtures_dir() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../../fixtures/gemma3")
}

/// One fixture of [`fixtures_dir`], parsed; a missing or malformed one panics with its path.
pub fn fixture(name: &str) -> serde_json::Value {
    let p = fixtures_dir().join(name);
    let text = std::fs::read_to_string(&p).unwrap_or_else(|e| panic!("{}: {e}", p.display()));
    serde_json::from_str(&text).unwrap_or_else(|e| panic!("{}: {e}", p.display()))
}

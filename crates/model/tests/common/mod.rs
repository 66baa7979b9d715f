//! What the model tests share. Finding the real checkpoints (see
//! `kvlab_model::registry::test_model_file`): a missing file is a loud skip, or a failure when
//! `KVLAB_REQUIRE_MODELS=1`. Each test binary uses a part of it.
#![allow(dead_code)]
// Test code may unwrap: a failed unwrap is a failed test (clippy.toml allows it in #[test]
// functions; this covers the helpers too).
#![allow(clippy::unwrap_used)]

use std::path::PathBuf;

use kvlab_model::Tokenizer;
pub use kvlab_model::registry::test_model_file as model_file;

/// The Gemma 3 270M Q4_K_M checkpoint, or `None` after the loud skip.
pub fn gemma() -> Option<PathBuf> {
    model_file("gemma-3-270m-q4_k_m.gguf")
}

/// stories260K's 512-token llama2.c tokenizer (a clone ships it), or `None` after the loud skip.
pub fn tok512() -> Option<Tokenizer> {
    model_file("tok512.bin").map(|p| Tokenizer::load_llama2c(&p, 512).unwrap())
}

/// `name` in a new folder under the temp dir; the folder, and whatever the test put in it, is
/// removed when the returned path is dropped.
pub fn tmp(name: &str) -> TmpPath {
    let dir = tempfile::Builder::new()
        .prefix("kvlab-model-test-")
        .tempdir()
        .unwrap();
    let path = dir.path().join(name);
    TmpPath { _dir: dir, path }
}

/// A path inside a temporary folder that lives as long as it does.
pub struct TmpPath {
    _dir: tempfile::TempDir,
    path: PathBuf,
}

impl std::ops::Deref for TmpPath {
    type Target = std::path::Path;
    fn deref(&self) -> &std::path::Path {
        &self.path
    }
}

impl AsRef<std::path::Path> for TmpPath {
    fn as_ref(&self) -> &std::path::Path {
        &self.path
    }
}

/// `fixtures/<path>` parsed as JSON (the oracles' records).
pub fn fixture_json(path: &str) -> serde_json::Value {
    let p = std::path::Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("../../fixtures")
        .join(path);
    serde_json::from_str(&std::fs::read_to_string(p).unwrap()).unwrap()
}

/// A JSON array of token ids.
pub fn ids(v: &serde_json::Value) -> Vec<u32> {
    v.as_array()
        .unwrap()
        .iter()
        .map(|i| i.as_u64().unwrap() as u32)
        .collect()
}

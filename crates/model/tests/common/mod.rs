//! What the model tests share. Finding the real checkpoints (see
//! `kvlab_model::registry::test_model_file`): a missing file is a loud skip, or a failure when
//! `KVLAB_REQUIRE_MODELS=1`. Each test binary uses a part of it.
#![allow(dead_code)]

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

/// `name` in a folder of this test binary's own under the temp dir (created here).
pub fn tmp(name: &str) -> PathBuf {
    let dir = std::env::temp_dir().join(format!("kvlab-model-test-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    dir.join(name)
}

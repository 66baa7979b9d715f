//! The workspace paths every command shares: the checkout, cargo's target folder and, under
//! them, where the fixtures, the recorded runs, the book and each command's output live.

use std::path::{Path, PathBuf};

/// The checkout: the one xtask was built in, else the current directory when it is a checkout
/// (a prebuilt xtask carried to another machine, as the GPU checks do). A checkout is a folder
/// holding `fixtures/models.json`.
pub fn workspace_root() -> PathBuf {
    let built = PathBuf::from(env!("CARGO_MANIFEST_DIR"))
        .parent()
        .expect("xtask lives in the workspace")
        .to_path_buf();
    let is_checkout = |d: &Path| d.join("fixtures").join("models.json").is_file();
    if is_checkout(&built) {
        return built;
    }
    std::env::current_dir()
        .ok()
        .filter(|d| is_checkout(d))
        .unwrap_or(built)
}

/// Cargo's target folder: `$CARGO_TARGET_DIR`, else `target/` in the checkout.
pub fn target_dir() -> PathBuf {
    std::env::var_os("CARGO_TARGET_DIR")
        .map(PathBuf::from)
        .unwrap_or_else(|| workspace_root().join("target"))
}

/// Where bench, its side benches and kv-quality write their JSON and plots by default:
/// `target/kvlab-bench/`.
pub fn bench_out() -> PathBuf {
    target_dir().join("kvlab-bench")
}

/// Where verify writes its report by default: `target/kvlab-verify/verify.json`.
pub fn verify_report() -> PathBuf {
    target_dir().join("kvlab-verify").join("verify.json")
}

/// The fixtures: `fixtures/models.json`, the prompts, held-out texts, oracle cases.
pub fn fixtures() -> PathBuf {
    workspace_root().join("fixtures")
}

/// The book's chapters: `docs/src/`.
pub fn docs_src() -> PathBuf {
    workspace_root().join("docs").join("src")
}

/// The JSON schema of bench's reports: `xtask/src/bench/schema.md`.
pub fn bench_schema() -> PathBuf {
    workspace_root().join("xtask/src/bench/schema.md")
}

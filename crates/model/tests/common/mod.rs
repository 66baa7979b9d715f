//! Finding the real checkpoints for tests: `$KVLAB_MODELS/<file>`. A missing file is a loud
//! skip, or a failure when `KVLAB_REQUIRE_MODELS=1`.

use std::path::PathBuf;

/// The path of a shared model file, or `None` (after saying so on stderr) when it is absent.
///
/// # Panics
/// When the file is absent and `KVLAB_REQUIRE_MODELS=1`.
#[allow(dead_code)]
pub fn model_file(name: &str) -> Option<PathBuf> {
    let dir = std::env::var_os("KVLAB_MODELS").map(PathBuf::from);
    let path = dir.as_ref().map(|d| d.join(name));
    match path {
        Some(p) if p.is_file() => Some(p),
        _ => {
            let msg = format!(
                "real model file {name} not found (set KVLAB_MODELS to the folder holding it, e.g. KVLAB_MODELS=../shared/models)"
            );
            if std::env::var("KVLAB_REQUIRE_MODELS").is_ok_and(|v| v == "1") {
                panic!("KVLAB_REQUIRE_MODELS=1: {msg}");
            }
            eprintln!("SKIPPED: {msg}");
            None
        }
    }
}

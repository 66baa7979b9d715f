//! Helpers shared by the fuzz targets in `fuzz_targets/`: a per-process temp file for the
//! loaders that take a path, and the "valid file with a few bytes overwritten, cut or extended"
//! mutation that the stable proptests (crates/model/tests/fuzz.rs, crates/gguf/tests/fuzz.rs)
//! also use, driven here by the fuzzer's bytes.

use std::path::PathBuf;

use libfuzzer_sys::arbitrary::Unstructured;

/// A file in this process's own temp folder (`kvlab-fuzz-<pid>`), so parallel fuzzing jobs
/// (`-jobs`, `-fork`) never share one.
pub fn tmp(name: &str) -> PathBuf {
    let dir = std::env::temp_dir().join(format!("kvlab-fuzz-{}", std::process::id()));
    std::fs::create_dir_all(&dir).expect("the temp folder is writable");
    dir.join(name)
}

/// `valid` with 1 to 8 bytes overwritten at positions the input picks, then, if the input says
/// so, cut short or extended with zeros by up to 8 bytes.
pub fn mutate(valid: &[u8], u: &mut Unstructured<'_>) -> Vec<u8> {
    let mut b = valid.to_vec();
    if b.is_empty() {
        return b;
    }
    let edits = u.int_in_range(1..=8u8).unwrap_or(1);
    for _ in 0..edits {
        let at = u.int_in_range(0..=b.len() - 1).unwrap_or(0);
        b[at] = u.arbitrary().unwrap_or(0);
    }
    if u.arbitrary::<bool>().unwrap_or(false) {
        let len = u.int_in_range(0..=b.len() + 8).unwrap_or(b.len());
        b.resize(len, 0);
    }
    b
}

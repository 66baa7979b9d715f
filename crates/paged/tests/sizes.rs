//! The size claims of the crate's documentation (`src/lib.rs`, "Size against the references"),
//! held: lines of code, neither blank nor comment, of the files each claim names, unit tests
//! (a file's `#[cfg(test)]` module, last by convention) left out.

use std::path::Path;

/// Lines of code in `paths` (files, or folders read whole), relative to this crate.
fn code_lines(paths: &[&str]) -> usize {
    let root = Path::new(env!("CARGO_MANIFEST_DIR"));
    let mut files = Vec::new();
    for p in paths {
        let path = root.join(p);
        match std::fs::read_dir(&path) {
            Ok(dir) => files.extend(dir.map(|e| e.expect("a readable folder").path())),
            Err(_) => files.push(path),
        }
    }
    assert!(!files.is_empty(), "no files under {paths:?}");
    files
        .iter()
        .map(|f| {
            let text = std::fs::read_to_string(f).unwrap_or_else(|e| panic!("{f:?}: {e}"));
            let code = |l: &&str| !l.trim().is_empty() && !l.trim_start().starts_with("//");
            let body = text.split("\n#[cfg(test)]").next().unwrap_or("");
            body.lines().filter(code).count()
        })
        .sum()
}

#[test]
fn the_scheduler_stays_under_550_lines_of_code() {
    let n = code_lines(&["src/scheduler"]);
    assert!(n > 100, "{n}: the files moved? update this test and lib.rs");
    assert!(
        n < 550,
        "scheduler/ has {n} lines of code; lib.rs says under 550"
    );
}

#[test]
fn the_allocator_and_prefix_cache_stay_under_1100_lines_of_code() {
    let n = code_lines(&["src/allocator", "src/prefix_cache.rs"]);
    assert!(n > 300, "{n}: the files moved? update this test and lib.rs");
    assert!(
        n < 1100,
        "allocator/ and prefix_cache.rs have {n}; lib.rs says under 1,100"
    );
}

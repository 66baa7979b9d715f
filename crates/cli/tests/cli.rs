//! The `kvlab` binary as a user runs it: stdout carries only text, errors say what to do.

use std::process::{Command, Output};

/// Runs kvlab as a user would: the environment as the test got it (so `KVLAB_MODELS` and the
/// user cache are searched as the CLI searches them), and stories260K is always found, at the
/// latest in the copy shipped under `fixtures/models/`.
fn kvlab(args: &[&str]) -> Output {
    Command::new(env!("CARGO_BIN_EXE_kvlab"))
        .args(args)
        .output()
        .unwrap()
}

/// Runs kvlab as on a fresh clone: no `KVLAB_MODELS`, an empty user cache, no download.
fn kvlab_fresh(args: &[&str]) -> Output {
    let home = std::env::temp_dir().join(format!("kvlab-cli-fresh-{}", std::process::id()));
    std::fs::create_dir_all(&home).unwrap();
    Command::new(env!("CARGO_BIN_EXE_kvlab"))
        .args(args)
        .env_remove("KVLAB_MODELS")
        .env("HOME", &home)
        .env("XDG_CACHE_HOME", home.join("cache"))
        .output()
        .unwrap()
}

fn text(b: &[u8]) -> String {
    String::from_utf8_lossy(b).into_owned()
}

#[test]
fn generate_prints_run_c_text_on_stdout_and_stats_on_stderr() {
    for engine in ["cpu", "naive", "cpu-paged"] {
        let o = kvlab(&[
            "generate",
            "--temperature",
            "0",
            "--prompt",
            "Once upon a time",
            "--steps",
            "64",
            "--engine",
            engine,
        ]);
        assert!(o.status.success(), "{engine}: {}", text(&o.stderr));
        assert!(text(&o.stdout).starts_with("Once upon a time, there was a little girl named Lily. She loved to play outside in the park."), "{engine}: {}", text(&o.stdout));
        let err = text(&o.stderr);
        assert!(
            err.contains("prefill") && err.contains("decode") && err.contains("KV cache"),
            "{err}"
        );
    }
}

#[test]
fn bad_input_gets_a_clear_error() {
    let cases: [(&[&str], &str); 5] = [
        (&["generate", "--engine", "gpu9000"], "unknown engine"),
        (
            &["generate", "--prompt", &"word ".repeat(600)],
            "shorten the prompt",
        ),
        (&["generate", "--model", "no-such-model"], "known models"),
        (
            &["generate", "--model", "/nonexistent/x.bin"],
            "does not exist",
        ),
        (&["generate", "--engine", "cuda"], "cuda"),
    ];
    for (args, needle) in cases {
        let o = kvlab(args);
        assert!(!o.status.success(), "{args:?} should fail");
        assert!(
            text(&o.stderr).contains(needle),
            "{args:?}: {}",
            text(&o.stderr)
        );
        assert!(
            !text(&o.stderr).contains("panicked"),
            "{args:?} panicked: {}",
            text(&o.stderr)
        );
    }
}

#[test]
fn info_and_mem_print_the_formula() {
    let o = kvlab(&["info", "--model", "stories260K"]);
    let out = text(&o.stdout);
    assert!(
        out.contains("2 x 5 x 4 x 8 x 4 = 1.25 KiB (1280 B)"),
        "{out}"
    );
    let o = kvlab(&["mem", "--preset", "llama-3.1-70b"]);
    assert!(
        text(&o.stdout).contains("(327680 B)"),
        "{}",
        text(&o.stdout)
    );
    let o = kvlab(&[
        "mem",
        "--n-layers",
        "32",
        "--n-kv-heads",
        "8",
        "--head-dim",
        "128",
        "--context",
        "8192",
    ]);
    assert!(
        text(&o.stdout).contains("(131072 B)"),
        "{}",
        text(&o.stdout)
    );
}

#[test]
fn trace_shows_the_cache_growing() {
    let o = kvlab(&[
        "generate",
        "-t",
        "0",
        "-p",
        "Hi",
        "-n",
        "6",
        "--trace",
        "--engine",
        "cpu-paged",
    ]);
    let err = text(&o.stderr);
    assert!(
        err.contains("block_table") && err.contains("slot_mapping"),
        "{err}"
    );
    let o = kvlab(&[
        "generate", "-t", "0", "-p", "Hi", "-n", "6", "--trace", "--engine", "cpu",
    ]);
    assert!(
        text(&o.stderr).contains("max_seq_len=512, kv_dim=32"),
        "{}",
        text(&o.stderr)
    );
}

#[test]
fn a_fresh_clone_generates_offline_from_the_shipped_model() {
    // README command 1, with no KVLAB_MODELS, an empty cache and downloads forbidden.
    let o = kvlab_fresh(&[
        "generate",
        "--offline",
        "--temperature",
        "0",
        "--prompt",
        "Once upon a time",
        "--steps",
        "40",
    ]);
    assert!(o.status.success(), "{}", text(&o.stderr));
    assert!(
        text(&o.stdout).starts_with("Once upon a time, there was a little girl named Lily."),
        "{}",
        text(&o.stdout)
    );
    // A model the clone does not ship is missing, and the error says how to get it.
    let o = kvlab_fresh(&["info", "--offline", "--model", "gemma-3-270m"]);
    assert!(!o.status.success());
    assert!(
        text(&o.stderr).contains("KVLAB_MODELS"),
        "{}",
        text(&o.stderr)
    );
}

//! The `kvlab` binary as a user runs it: stdout carries only text, errors say what to do.

use std::path::PathBuf;
use std::process::{Command, Output};

fn models() -> Option<PathBuf> {
    let dir = PathBuf::from(std::env::var_os("KVLAB_MODELS")?);
    if dir.join("stories260K.bin").is_file() {
        return Some(dir);
    }
    None
}

/// Runs kvlab with KVLAB_MODELS as the test got it (absent: a loud skip, or a failure when
/// KVLAB_REQUIRE_MODELS=1).
fn kvlab(args: &[&str]) -> Option<Output> {
    let Some(dir) = models() else {
        assert!(
            std::env::var("KVLAB_REQUIRE_MODELS").as_deref() != Ok("1"),
            "KVLAB_REQUIRE_MODELS=1 but KVLAB_MODELS has no stories260K.bin"
        );
        eprintln!(
            "SKIPPED: set KVLAB_MODELS to the folder holding stories260K.bin (e.g. ../shared/models)"
        );
        return None;
    };
    Some(
        Command::new(env!("CARGO_BIN_EXE_kvlab"))
            .args(args)
            .env("KVLAB_MODELS", dir)
            .env(
                "XDG_CACHE_HOME",
                std::env::temp_dir().join("kvlab-cli-test-cache"),
            )
            .output()
            .unwrap(),
    )
}

fn text(b: &[u8]) -> String {
    String::from_utf8_lossy(b).into_owned()
}

#[test]
fn generate_prints_run_c_text_on_stdout_and_stats_on_stderr() {
    for engine in ["cpu", "naive", "cpu-paged"] {
        let Some(o) = kvlab(&[
            "generate",
            "--temperature",
            "0",
            "--prompt",
            "Once upon a time",
            "--steps",
            "64",
            "--engine",
            engine,
        ]) else {
            return;
        };
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
        let Some(o) = kvlab(args) else { return };
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
    let Some(o) = kvlab(&["info", "--model", "stories260K"]) else {
        return;
    };
    let out = text(&o.stdout);
    assert!(
        out.contains("2 x 5 x 4 x 8 x 4 = 1.25 KiB (1280 B)"),
        "{out}"
    );
    let Some(o) = kvlab(&["mem", "--preset", "llama-3.1-70b"]) else {
        return;
    };
    assert!(
        text(&o.stdout).contains("(327680 B)"),
        "{}",
        text(&o.stdout)
    );
    let Some(o) = kvlab(&[
        "mem",
        "--n-layers",
        "32",
        "--n-kv-heads",
        "8",
        "--head-dim",
        "128",
        "--context",
        "8192",
    ]) else {
        return;
    };
    assert!(
        text(&o.stdout).contains("(131072 B)"),
        "{}",
        text(&o.stdout)
    );
}

#[test]
fn trace_shows_the_cache_growing() {
    let Some(o) = kvlab(&[
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
    ]) else {
        return;
    };
    let err = text(&o.stderr);
    assert!(
        err.contains("block_table") && err.contains("slot_mapping"),
        "{err}"
    );
    let Some(o) = kvlab(&[
        "generate", "-t", "0", "-p", "Hi", "-n", "6", "--trace", "--engine", "cpu",
    ]) else {
        return;
    };
    assert!(
        text(&o.stderr).contains("max_seq_len=512, kv_dim=32"),
        "{}",
        text(&o.stderr)
    );
}

//! Every step of the build-up generates the naive engine's greedy tokens on stories260K (the
//! shipped default, always present), over a few hundred positions: adding the cache changes the
//! cost, never the output. Step 6 changes the model (a sliding window on every layer), so it is
//! compared with the naive engine run with the same window. The steps run as the programs a
//! reader runs (`cargo run --bin stepN_*`); no timing is asserted.

// Test code may unwrap: a failed unwrap is a failed test (clippy.toml allows it in #[test]
// functions; this covers the helpers too).
#![allow(clippy::unwrap_used)]

use std::process::Command;
use std::sync::Arc;

use kvlab_model::registry::{self, Located};
use kvlab_model::{GenerateOptions, LayerKind, Model, Sampler, Tokenizer, generate_tokens};
use kvlab_naive::NaiveEngine;

/// (prompt, --steps): one run to the end of --steps, one with a longer prompt.
const CASES: [(&str, usize); 2] = [
    ("Once upon a time", 256),
    ("Tom and his dog Max went to the park. Max saw a big", 300),
];

fn stories260k() -> (Model, Tokenizer) {
    let Located::Ready {
        entry,
        model,
        tokenizer,
    } = registry::locate("stories260K").unwrap()
    else {
        panic!("stories260K is shipped in fixtures/models; it must be found");
    };
    let loaded = registry::load_entry(entry, model.as_deref(), tokenizer.as_deref()).unwrap();
    (loaded.model, loaded.tokenizer.unwrap())
}

/// The naive engine's greedy sequence (prompt and generated ids), every layer limited to
/// `window` positions if given.
fn naive(prompt: &str, steps: usize, window: Option<usize>) -> Vec<u32> {
    let (mut model, tok) = stories260k();
    if let Some(window) = window {
        model.config.layer_kinds = vec![LayerKind::Local { window }; model.config.n_layers];
    }
    let ids = tok.encode(prompt, true, false);
    let mut engine = NaiveEngine::new(Arc::new(model));
    let opts = GenerateOptions {
        ubatch: 0,
        speculative: None,
        steps,
        max_seq_len: 0,
        trace: false,
        special: false,
    };
    let g = generate_tokens(&mut engine, &ids, &opts, &mut Sampler::greedy(), |_| {}).unwrap();
    [g.prompt, g.tokens].concat()
}

/// The token ids a step's program prints (`token ids: [1, 403, ...]`).
fn run(bin: &str, prompt: &str, steps: usize, extra: &[&str]) -> Vec<u32> {
    let out = Command::new(bin)
        .args(["--prompt", prompt, "--steps", &steps.to_string()])
        .args(extra)
        .output()
        .unwrap();
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success(),
        "{bin} failed: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    let line = stdout
        .lines()
        .find_map(|l| l.strip_prefix("token ids: "))
        .unwrap_or_else(|| panic!("{bin} printed no token ids:\n{stdout}"));
    line.trim_matches(['[', ']'])
        .split(", ")
        .map(|t| t.parse().unwrap())
        .collect()
}

fn same_as_naive(bin: &str) {
    for (prompt, steps) in CASES {
        let want = naive(prompt, steps, None);
        assert!(
            want.len() > 200,
            "{prompt:?}: only {} positions",
            want.len()
        );
        assert_eq!(run(bin, prompt, steps, &[]), want, "{bin} on {prompt:?}");
    }
}

#[test]
fn step1_no_cache_equals_naive() {
    same_as_naive(env!("CARGO_BIN_EXE_step1_no_cache"));
}

#[test]
fn step2_kv_cache_equals_naive() {
    same_as_naive(env!("CARGO_BIN_EXE_step2_kv_cache"));
}

#[test]
fn step3_positions_equals_naive() {
    same_as_naive(env!("CARGO_BIN_EXE_step3_positions"));
}

#[test]
fn step4_decode_one_equals_naive() {
    same_as_naive(env!("CARGO_BIN_EXE_step4_decode_one"));
}

#[test]
fn step5_preallocated_equals_naive() {
    same_as_naive(env!("CARGO_BIN_EXE_step5_preallocated"));
}

/// Window 8 is shorter than the second prompt, so the ring wraps during prefill too; 48 wraps in
/// decode only; 1,000 is longer than the run, so the ring never wraps and the tokens are step 5's.
#[test]
fn step6_sliding_window_equals_naive_with_the_same_window() {
    let bin = env!("CARGO_BIN_EXE_step6_sliding_window");
    for window in [8, 48] {
        for (prompt, steps) in CASES {
            let want = naive(prompt, steps, Some(window));
            let got = run(bin, prompt, steps, &["--window", &window.to_string()]);
            assert_eq!(got, want, "window {window}, {prompt:?}");
        }
    }
    let (prompt, steps) = CASES[0];
    let got = run(bin, prompt, steps, &["--window", "1000"]);
    assert_eq!(got, naive(prompt, steps, None));
}

/// The window option belongs to step 6; the others refuse it rather than ignore it.
#[test]
fn only_step6_takes_a_window() {
    let out = Command::new(env!("CARGO_BIN_EXE_step5_preallocated"))
        .args(["--window", "8"])
        .output()
        .unwrap();
    assert!(!out.status.success());
    assert!(String::from_utf8_lossy(&out.stderr).contains("step 6 only"));
}

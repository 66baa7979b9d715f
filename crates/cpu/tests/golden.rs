//! Golden greedy text of the real stories260K checkpoint on the fixture prompts (insta
//! snapshots under tests/snapshots/). Both engines must print the same text, and that text must
//! not drift: a change to a snapshot is a change in what the model says.

mod common;

use kvlab_model::{GenerateOptions, Sampler, generate_text};

#[test]
fn stories260k_greedy_text_on_fixture_prompts() {
    let Some((model, tok)) = common::stories260k() else {
        return;
    };
    let prompts: Vec<String> = common::fixture_prompts()
        .into_iter()
        .filter(|p| p.len() < 200) // the long prompts fill the context: nothing left to generate
        .collect();
    let opts = GenerateOptions {
        ubatch: 0,
        speculative: None,
        steps: 96,
        max_seq_len: 0,
        trace: false,
        special: false,
    };
    let mut out = String::new();
    for p in &prompts {
        let mut texts = Vec::new();
        for e in common::naive_and_cpu(&model).iter_mut() {
            let mut text = String::new();
            generate_text(
                e.as_mut(),
                &tok,
                p,
                &opts,
                &mut Sampler::greedy(),
                |s| text.push_str(s),
                |_, _, _| {},
            )
            .unwrap();
            texts.push(text);
        }
        assert_eq!(texts[0], texts[1], "naive and cpu differ on prompt {p:?}");
        out.push_str(&format!("=== {p:?}\n{}\n", texts[0]));
    }
    insta::assert_snapshot!(out);
}

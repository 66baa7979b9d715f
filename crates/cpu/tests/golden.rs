//! Golden greedy text of the real stories260K checkpoint on the fixture prompts (insta
//! snapshots under tests/snapshots/). Both engines must print the same text, and that text must
//! not drift: a change to a snapshot is a change in what the model says.

mod common;

use std::sync::Arc;

use kvlab_cpu::CpuEngine;
use kvlab_model::{Engine, GenerateOptions, Sampler, generate_text};
use kvlab_naive::NaiveEngine;

#[test]
fn stories260k_greedy_text_on_fixture_prompts() {
    let (Some(bin), Some(tok)) = (
        common::model_file("stories260K.bin"),
        common::model_file("tok512.bin"),
    ) else {
        return;
    };
    let (model, tok) = kvlab_model::registry::load_llama2c(&bin, Some(&tok)).unwrap();
    let (model, tok) = (Arc::new(model), tok.unwrap());
    let fixture = std::fs::read_to_string(concat!(
        env!("CARGO_MANIFEST_DIR"),
        "/../../fixtures/prompts.txt"
    ))
    .unwrap();
    let prompts: Vec<String> = fixture
        .lines()
        .filter(|l| !l.starts_with('#') && !l.is_empty())
        .map(|l| {
            if l == "<empty>" {
                String::new()
            } else {
                l.replace("\\n", "\n").replace("\\t", "\t")
            }
        })
        .filter(|p| p.len() < 200) // the long prompts fill the context: nothing left to generate
        .collect();
    let opts = GenerateOptions {
        steps: 96,
        max_seq_len: 0,
        trace: false,
    };
    let mut out = String::new();
    for p in &prompts {
        let mut texts = Vec::new();
        let mut engines: Vec<Box<dyn Engine>> = vec![
            Box::new(NaiveEngine::new(model.clone())),
            Box::new(CpuEngine::new(model.clone())),
        ];
        for e in engines.iter_mut() {
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

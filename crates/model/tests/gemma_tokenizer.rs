//! The GGUF tokenizer of Gemma 3 against llama.cpp's `llama_tokenize` ids, with
//! `parse_special` off (`encode`) and on (`encode_special`), stored with their provenance in
//! fixtures/gemma3/tokens.json (scripts/gemma_oracle.py).

mod common;

use serde_json::Value;

#[test]
#[ignore = "needs gemma-3-270m: set KVLAB_MODELS"]
fn gemma3_encodes_every_fixture_text_as_llama_cpp_does() {
    let Some(path) = common::gemma() else { return };
    let f = kvlab_gguf::GgufFile::open(&path).unwrap();
    let tok = kvlab_model::tokenizer::tokenizer_from_gguf(&f, &path).unwrap();
    let fixture: Value =
        serde_json::from_str(include_str!("../../../fixtures/gemma3/tokens.json")).unwrap();
    let mut failures = Vec::new();
    for case in fixture["cases"].as_array().unwrap() {
        let text = case["text"].as_str().unwrap();
        let want: Vec<u32> = case["ids"]
            .as_array()
            .unwrap()
            .iter()
            .map(|v| v.as_u64().unwrap() as u32)
            .collect();
        let got = tok.encode(text, true, false);
        if got != want {
            failures.push(format!(
                "{text:?}:\n  llama.cpp {want:?}\n  kvlab     {got:?}"
            ));
        }
        // parse_special: control tokens written in the text are those tokens.
        let want_special: Vec<u32> = case["ids_special"]
            .as_array()
            .unwrap()
            .iter()
            .map(|v| v.as_u64().unwrap() as u32)
            .collect();
        let got = tok.encode_special(text, true, false);
        if got != want_special {
            failures.push(format!(
                "{text:?} (special):\n  llama.cpp {want_special:?}\n  kvlab     {got:?}"
            ));
        }
        // Decoding the ids gives the text back (llama.cpp's detokenize without special tokens).
        assert_eq!(
            tok.decode_all(&want, false),
            case["detokenized"].as_str().unwrap(),
            "decode of {text:?}"
        );
    }
    assert!(
        failures.is_empty(),
        "{} of {} texts differ:\n{}",
        failures.len(),
        fixture["cases"].as_array().unwrap().len(),
        failures.join("\n")
    );
}

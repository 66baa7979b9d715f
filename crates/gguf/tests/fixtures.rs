//! The stored llama.cpp oracle fixtures (`fixtures/gemma3/*.json`, written by
//! `scripts/gemma_oracle.py`) are well-formed: they need no model file, so these run in CI.

// Test code may unwrap: a failed unwrap is a failed test (clippy.toml allows it in #[test]
// functions; this covers the helpers too).
#![allow(clippy::unwrap_used)]

mod common;

use common::{fixture, fixtures_dir};
use serde_json::Value;

fn ids(v: &Value) -> Vec<u64> {
    v.as_array()
        .unwrap()
        .iter()
        .map(|x| x.as_u64().unwrap())
        .collect()
}

const SHA256: &str = "a5fd3b62230aa5ec60212297dc9d20eaa70578ac519e00d93a17e44c087a6818";
const VOCAB: u64 = 262_144;

#[test]
fn fixtures_are_small_and_carry_provenance() {
    let mut total = 0;
    for name in ["tokens.json", "greedy.json", "dequant.json"] {
        total += std::fs::metadata(fixtures_dir().join(name)).unwrap().len();
        let f = fixture(name);
        assert_eq!(f["format_version"], 1, "{name}");
        assert_eq!(f["provenance"]["model_sha256"], SHA256, "{name}");
        let command = f["provenance"]["command"].as_str().unwrap();
        assert!(command.contains("gemma_oracle.py"), "{name}");
    }
    assert!(total < 1 << 20, "fixtures take {total} bytes");
}

#[test]
fn token_fixture_is_consistent() {
    let f = fixture("tokens.json");
    let cases = f["cases"].as_array().unwrap();
    assert!(cases.len() > 20);
    for c in cases {
        let ids = ids(&c["ids"]);
        assert_eq!(ids[0], 2, "BOS first: {}", c["text"]);
        assert!(ids.iter().all(|&i| i < VOCAB));
        assert_eq!(ids.len(), c["pieces"].as_array().unwrap().len());
    }
    // A known case: the empty prompt is BOS alone.
    let empty = cases.iter().find(|c| c["text"] == "").unwrap();
    assert_eq!(ids(&empty["ids"]), [2]);
}

#[test]
fn greedy_fixture_is_consistent() {
    let f = fixture("greedy.json");
    assert_eq!(f["provenance"]["n_threads"], 2);
    let cases = f["cases"].as_array().unwrap();
    let mut crosses_512 = 0;
    let mut starts_past_512 = 0;
    for c in cases {
        let name = c["name"].as_str().unwrap();
        let prompt = ids(&c["prompt_ids"]);
        let generated = ids(&c["generated_ids"]);
        assert_eq!(prompt[0], 2, "{name}");
        let n_gen = c["n_gen"].as_u64().unwrap() as usize;
        let eos = c["stopped_at_eos"].as_bool().unwrap();
        assert!(
            generated.len() == n_gen || (eos && generated.last() == Some(&1)),
            "{name}"
        );
        let margins = c["margins"].as_array().unwrap();
        assert_eq!(margins.len(), generated.len(), "{name}");
        let second = c["second_ids"].as_array().unwrap();
        assert_eq!(second.len(), generated.len(), "{name}");
        assert!(margins.iter().all(|m| m.as_f64().unwrap() >= 0.0));
        let last = prompt.len() + generated.len() - 1;
        if prompt.len() < 512 && last >= 512 {
            crosses_512 += 1;
        }
        if prompt.len() > 512 {
            starts_past_512 += 1;
            assert!(c["no_window_ids"].is_array(), "{name}");
        }
    }
    assert!(crosses_512 >= 1 && starts_past_512 >= 1);
}

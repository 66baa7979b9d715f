//! What verify runs: per model, a list of cases (prompt ids, tokens to generate, and optionally
//! another implementation's greedy ids for the same prompt).

use anyhow::{Context, Result};
use kvlab_model::Tokenizer;
use kvlab_model::registry::ModelEntry;
use serde_json::Value;

use crate::prompts;

/// Ids and top-2 margins another implementation produced for a case (e.g. llama.cpp).
#[derive(Clone)]
pub struct Oracle {
    /// Who produced them, with version.
    pub source: String,
    pub ids: Vec<u32>,
    pub margins: Vec<f32>,
    /// Divergences where `margins[step]` is below this are near-ties of a lower-precision oracle.
    pub near_tie: f32,
}

/// One verify case.
#[derive(Clone)]
pub struct Case {
    pub index: usize,
    pub label: String,
    /// Prompt ids, BOS first, already cut to fit.
    pub prompt: Vec<u32>,
    /// The prompt was longer than the context and was cut to max_seq_len − 1 tokens.
    pub cut: bool,
    /// Tokens to generate greedily (the last one is not fed back).
    pub n_gen: usize,
    /// Other implementations' ids for this case (empty for text prompts).
    pub oracles: Vec<Oracle>,
}

/// The cases of a model: its oracle fixture's cases if the manifest names one, else every text
/// prompt, generated to the end of the verify context.
///
/// # Errors
/// An unreadable or malformed oracle fixture.
pub fn for_model(
    entry: &ModelEntry,
    ctx: usize,
    tok: &Tokenizer,
    texts: &[String],
) -> Result<Vec<Case>> {
    match &entry.verify_cases {
        Some(file) => oracle_cases(entry, file),
        None => Ok(texts
            .iter()
            .enumerate()
            .map(|(index, text)| {
                let mut prompt = tok.encode(text, true, false);
                let cut = prompt.len() >= ctx;
                prompt.truncate(ctx - 1);
                // Positions prompt.len()..ctx are fed; the token after the last is generated too.
                let n_gen = ctx - prompt.len() + 1;
                Case {
                    index,
                    label: prompts::label(text),
                    prompt,
                    cut,
                    n_gen,
                    oracles: Vec::new(),
                }
            })
            .collect()),
    }
}

fn read_fixture(file: &str) -> Result<Value> {
    let path = crate::paths::fixtures().join(file);
    Ok(serde_json::from_str(
        &std::fs::read_to_string(&path).with_context(|| format!("reading {}", path.display()))?,
    )?)
}

fn ids(x: &Value) -> Result<Vec<u32>> {
    x.as_array()
        .context("an id array")?
        .iter()
        .map(|i| i.as_u64().map(|i| i as u32).context("an id"))
        .collect()
}

fn margins(c: &Value) -> Result<Vec<f32>> {
    Ok(c["margins"]
        .as_array()
        .context("margins")?
        .iter()
        .map(|m| m.as_f64().unwrap_or(0.0) as f32)
        .collect())
}

fn oracle_cases(entry: &ModelEntry, file: &str) -> Result<Vec<Case>> {
    let v = read_fixture(file)?;
    // The fixture names its oracle (transformers for the tiny HF checkpoints); the Gemma
    // fixture, older, is llama.cpp's.
    let source = match v["provenance"]["oracle"].as_str() {
        Some(o) => o.to_string(),
        None => format!(
            "llama.cpp (llama-cpp-python {})",
            v["provenance"]["llama_cpp_python"].as_str().unwrap_or("?")
        ),
    };
    let strict = entry
        .strict_oracle
        .as_deref()
        .map(read_fixture)
        .transpose()?;
    v["cases"]
        .as_array()
        .context("a cases array")?
        .iter()
        .enumerate()
        .map(|(index, c)| {
            let prompt = ids(&c["prompt_ids"])?;
            let oracle_ids = ids(&c["generated_ids"])?;
            let name = c["name"].as_str().unwrap_or("case");
            let text = c["prompt"].as_str().unwrap_or("");
            let mut oracles = vec![Oracle {
                source: source.clone(),
                margins: margins(c)?,
                ids: oracle_ids.clone(),
                near_tie: entry.oracle_near_tie.unwrap_or(0.0),
            }];
            if let Some(s) = &strict {
                let p = &s["provenance"];
                let hf = s["cases"]
                    .as_array()
                    .context("a cases array")?
                    .iter()
                    .find(|h| h["name"] == c["name"])
                    .with_context(|| format!("{name} is missing from the strict oracle"))?;
                oracles.push(Oracle {
                    source: format!(
                        "HF transformers {} ({}, {})",
                        p["transformers"].as_str().unwrap_or("?"),
                        p["dtype"].as_str().unwrap_or("?"),
                        p["attn_implementation"].as_str().unwrap_or("?")
                    ),
                    ids: ids(&hf["generated_ids"])?,
                    margins: margins(hf)?,
                    near_tie: 0.0,
                });
            }
            Ok(Case {
                index,
                label: format!("{name}: {}", prompts::label(text)),
                n_gen: oracle_ids.len(),
                prompt,
                cut: false,
                oracles,
            })
        })
        .collect()
}

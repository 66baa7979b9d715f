//! A GGUF file's vocabulary (`tokenizer.ggml.*`, as llama.cpp's converter writes it) as a
//! kvlab [`Tokenizer`]. Two of llama.cpp's tokenizer models are read (src/llama-vocab.cpp,
//! `llama_vocab::impl::load`):
//!
//! * `llama`: SentencePiece-style BPE with scores (Llama 2, Mistral, Gemma), run by the
//!   hand-written [`SpmTokenizer`];
//! * `gpt2`: byte-level BPE (GPT-2, Llama 3, Qwen 2/3): `tokens` spelled in GPT-2's
//!   byte-to-unicode alphabet, `merges` ("left right") in rank order, and `pre` naming the
//!   regex that splits text before BPE. kvlab writes these back into the `tokenizer.json` they
//!   were converted from (a BPE model, a `Split` pre-tokenizer with llama.cpp's regex, then
//!   `ByteLevel`) and runs it with the `tokenizers` crate, as [`HfTokenizer`].
//!
//! Token types (gguf-py's `TokenType`): 2 UNKNOWN, 3 CONTROL, 4 USER_DEFINED. llama.cpp
//! matches USER_DEFINED tokens written in text always, CONTROL (and UNKNOWN) ones only when
//! asked (`parse_special`, kvlab's [`Tokenizer::encode_special`]).

use std::path::Path;

use kvlab_gguf::GgufFile;
use serde_json::{Value, json};

use super::{HfTokenizer, SpmTokenizer, Tokenizer};
use crate::{Error, Result};

const UNKNOWN: i32 = 2;
const CONTROL: i32 = 3;
const USER_DEFINED: i32 = 4;

/// The regexes of llama.cpp's BPE pre-tokenizers that kvlab reads (src/llama-vocab.cpp,
/// `llm_tokenizer_bpe`), each used alone: GPT-2's, Llama 3's (digits in runs of up to
/// three) and Qwen 2's (single digits).
const GPT2_REGEX: &str = r"'s|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)";
const LLAMA3_REGEX: &str = r"(?:'[sS]|'[tT]|'[rR][eE]|'[vV][eE]|'[mM]|'[lL][lL]|'[dD])|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+";
const QWEN2_REGEX: &str = r"(?:'[sS]|'[tT]|'[rR][eE]|'[vV][eE]|'[mM]|'[lL][lL]|'[dD])|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+";

/// What llama.cpp does with a `tokenizer.ggml.pre` name: (regex, `ignore_merges`, default
/// `add_bos`). The names are llama-vocab.cpp's for the three regexes above.
fn pre_tokenizer(pre: &str) -> Option<(&'static str, bool, bool)> {
    Some(match pre {
        "llama3" | "llama-v3" | "llama-bpe" | "falcon3" | "falcon-h1" | "pixtral" | "midm-2.0"
        | "lfm2" => (LLAMA3_REGEX, true, true),
        "dbrx" | "smaug-bpe" => (LLAMA3_REGEX, false, false),
        "gpt-2" | "phi-2" | "jina-es" | "jina-de" | "gigachat" | "jina-v2-es" | "jina-v2-de"
        | "a.x-4.0" | "mellum" | "exaone4" | "mpt" | "olmo" => (GPT2_REGEX, false, false),
        "qwen2" | "deepseek-r1-qwen" | "kormo" | "megrez" | "stablelm2" => {
            (QWEN2_REGEX, false, false)
        }
        _ => return None,
    })
}

/// The tokenizer stored in a GGUF's metadata (see the module doc), with its chat template
/// (`tokenizer.chat_template`) when it has one.
///
/// Memory: for a `gpt2` vocabulary, the `tokenizers` crate's model twice (see
/// [`HfTokenizer::with_control_tokens_as_text`]): some tens of MB for a 150k-token vocabulary.
///
/// # Errors
/// [`Error::Format`] for a missing or inconsistent tokenizer key, or a tokenizer model or
/// pre-tokenizer kvlab does not read (named); [`Error::Tokenizer`] if the `tokenizers` crate
/// refuses the vocabulary.
pub fn tokenizer_from_gguf(f: &GgufFile, path: &Path) -> Result<Tokenizer> {
    let e = |err: kvlab_gguf::GgufError| Error::Format(format!("{}: {err}", path.display()));
    let md = f.metadata();
    let model = md.get_str("tokenizer.ggml.model").map_err(e)?;
    check_tokenizer_model(model, path)?;
    let tokens = md.get_str_array("tokenizer.ggml.tokens").map_err(e)?;
    let types = md.get_i32_array("tokenizer.ggml.token_type").map_err(e)?;
    if types.len() != tokens.len() {
        return Err(Error::Format(format!(
            "{}: {} token types for {} tokens",
            path.display(),
            types.len(),
            tokens.len()
        )));
    }
    let bos = md.get_u32("tokenizer.ggml.bos_token_id").map_err(e)?;
    let eos = md.get_u32("tokenizer.ggml.eos_token_id").map_err(e)?;
    for (key, id) in [("bos", bos), ("eos", eos)] {
        if id as usize >= tokens.len() {
            return Err(Error::Format(format!(
                "{}: tokenizer.ggml.{key}_token_id = {id} is outside the {}-token vocabulary",
                path.display(),
                tokens.len()
            )));
        }
    }
    let of_types = |wanted: &'static [i32]| {
        types
            .iter()
            .enumerate()
            .filter(move |(_, t)| wanted.contains(t))
            .map(|(i, _)| i as u32)
    };
    let template = if md.contains("tokenizer.chat_template") {
        let source = md.get_str("tokenizer.chat_template").map_err(e)?;
        Some(crate::chat::ChatTemplate::new(
            source,
            tokens.get(bos as usize).unwrap_or_default(),
            tokens.get(eos as usize).unwrap_or_default(),
        )?)
    } else {
        None
    };
    // Absent: the vocabulary type's default (the pre-tokenizer's for gpt2, true for SPM).
    let add_bos = md.opt_bool("tokenizer.ggml.add_bos_token").map_err(e)?;
    if model == "gpt2" {
        let pre = md.get_str("tokenizer.ggml.pre").map_err(e)?;
        let split = pre_tokenizer(pre).ok_or_else(|| {
            Error::Format(format!(
                "{}: tokenizer.ggml.pre = {pre:?} is not supported; kvlab reads llama.cpp's \"gpt-2\", \"llama-bpe\" (Llama 3) and \"qwen2\" pre-tokenizers and their aliases",
                path.display()
            ))
        })?;
        let merges = md.get_str_array("tokenizer.ggml.merges").map_err(e)?;
        let json = bpe_tokenizer_json(tokens.iter(), types, merges.iter(), split, bos, add_bos)
            .map_err(|reason| Error::Format(format!("{}: {reason}", path.display())))?;
        let tok = HfTokenizer::from_json(json.to_string().as_bytes(), path)?
            .with_eos(eos)
            .with_control_tokens_as_text()
            .with_chat_template(template);
        return Ok(tok.into());
    }
    let scores = md.get_f32_array("tokenizer.ggml.scores").map_err(e)?;
    let prefix = md
        .opt_bool("tokenizer.ggml.add_space_prefix")
        .map_err(e)?
        .unwrap_or(true);
    let pieces = tokens.iter().map(str::as_bytes);
    let mut tok = SpmTokenizer::new(pieces, scores.to_vec(), bos, eos, prefix)?
        .with_add_bos(add_bos.unwrap_or(true))
        .with_escaped_spaces()
        .with_verbatim(of_types(&[USER_DEFINED]))
        .with_control(of_types(&[UNKNOWN, CONTROL]))
        .with_control_hidden(of_types(&[CONTROL]));
    tok.chat_template = template;
    Ok(tok.into())
}

/// Only the tokenizer models kvlab reads: `llama` and `gpt2`.
pub(crate) fn check_tokenizer_model(model: &str, path: &Path) -> Result<()> {
    match model {
        "llama" | "gpt2" => Ok(()),
        other => Err(Error::Format(format!(
            "{}: tokenizer.ggml.model = {other:?} is not supported; kvlab reads SentencePiece-style \"llama\" and byte-level BPE \"gpt2\" vocabularies",
            path.display()
        ))),
    }
}

/// The `tokenizer.json` a `gpt2` GGUF vocabulary was converted from, given its pre-tokenizer
/// ([`pre_tokenizer`]). `add_bos` is the file's `tokenizer.ggml.add_bos_token` (absent: the
/// pre-tokenizer's default, as llama.cpp).
fn bpe_tokenizer_json<'a>(
    tokens: impl Iterator<Item = &'a str>,
    types: &[i32],
    merges: impl Iterator<Item = &'a str>,
    (regex, ignore_merges, default_bos): (&str, bool, bool),
    bos: u32,
    add_bos: Option<bool>,
) -> std::result::Result<Value, String> {
    let mut vocab = serde_json::Map::new();
    let mut added = Vec::new();
    let mut bos_text = String::new();
    for (id, text) in tokens.enumerate() {
        // llama.cpp names an empty token so that it stays addressable.
        let text = if text.is_empty() {
            format!("[EMPTY_{id}]")
        } else {
            text.to_owned()
        };
        if id == bos as usize {
            bos_text.clone_from(&text);
        }
        let ty = types[id];
        if ty == CONTROL || ty == USER_DEFINED {
            added.push(json!({
                "id": id, "content": text, "single_word": false, "lstrip": false,
                "rstrip": false, "normalized": false, "special": ty == CONTROL,
            }));
        }
        if vocab.insert(text.clone(), json!(id)).is_some() {
            return Err(format!(
                "token {text:?} appears twice in tokenizer.ggml.tokens"
            ));
        }
    }
    // llama.cpp splits a merge at its first space after the first byte.
    let merges: Vec<Value> = merges
        .map(|m| match m.bytes().skip(1).position(|b| b == b' ') {
            Some(i) => Ok(json!([&m[..=i], &m[i + 2..]])),
            None => Err(format!("merge {m:?} has no space")),
        })
        .collect::<std::result::Result<_, _>>()?;
    let post_processor = if add_bos.unwrap_or(default_bos) {
        json!({
            "type": "TemplateProcessing",
            "single": [{"SpecialToken": {"id": bos_text, "type_id": 0}}, {"Sequence": {"id": "A", "type_id": 0}}],
            "pair": [{"SpecialToken": {"id": bos_text, "type_id": 0}}, {"Sequence": {"id": "A", "type_id": 0}},
                     {"SpecialToken": {"id": bos_text, "type_id": 1}}, {"Sequence": {"id": "B", "type_id": 1}}],
            "special_tokens": {bos_text.as_str(): {"id": bos_text, "ids": [bos], "tokens": [bos_text]}},
        })
    } else {
        Value::Null
    };
    Ok(json!({
        "version": "1.0",
        "truncation": null,
        "padding": null,
        "added_tokens": added,
        "normalizer": null,
        "pre_tokenizer": {"type": "Sequence", "pretokenizers": [
            {"type": "Split", "pattern": {"Regex": regex}, "behavior": "Isolated", "invert": false},
            {"type": "ByteLevel", "add_prefix_space": false, "trim_offsets": false, "use_regex": false},
        ]},
        "post_processor": post_processor,
        "decoder": {"type": "ByteLevel", "add_prefix_space": false, "trim_offsets": false, "use_regex": false},
        "model": {
            "type": "BPE", "dropout": null, "unk_token": null, "continuing_subword_prefix": null,
            "end_of_word_suffix": null, "fuse_unk": false, "byte_fallback": false,
            "ignore_merges": ignore_merges, "vocab": vocab, "merges": merges,
        },
    }))
}

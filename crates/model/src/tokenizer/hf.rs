//! A Hugging Face `tokenizer.json`, run by the `tokenizers` crate: the same code transformers'
//! fast tokenizers call, so encoding gives transformers' ids by construction.
//!
//! What kvlab adds is the **bytes** each token prints as, for streaming (a character split over
//! byte tokens must wait for its last byte). They come from the file's decoder, of which two
//! families are read:
//!
//! * `ByteLevel` (GPT-2, Llama 3, Qwen): every byte of text was written as one printable
//!   character by GPT-2's `bytes_to_unicode` table (openai/gpt-2 `encoder.py`; tokenizers'
//!   `pre_tokenizers/byte_level.rs`), so a token's bytes are its characters mapped back;
//! * SentencePiece-style, as `Metaspace` or as the sequence `Replace("▁", " ")`, `ByteFallback`,
//!   `Fuse`, `Strip(" ", 1, 0)` (Llama 2, Mistral, Gemma): `▁` prints as a space, `<0xXX>` is that
//!   byte, and the first space of the text is dropped when the decoder strips it (`Strip` with
//!   start 1, or `Metaspace` with a prepend scheme other than `never`).
//!
//! Added tokens (`<|im_start|>`, `<s>`) print as their text, those marked special only when
//! asked (transformers' `skip_special_tokens`). Any other decoder is refused with an error
//! naming it.

use std::fmt;
use std::path::{Path, PathBuf};
use std::sync::Arc;

use serde_json::Value;

use super::pieces::Pieces;
use crate::{Error, Result};

/// A `tokenizer.json` and the bytes of each of its tokens.
#[derive(Clone)]
pub struct HfTokenizer {
    inner: Arc<tokenizers::Tokenizer>,
    /// `inner` with special added tokens matched as plain text, for [`HfTokenizer::encode`]
    /// when the vocabulary came from a GGUF (llama.cpp parses control tokens only when asked);
    /// `None` for a `tokenizer.json`, which always matches them (as transformers does).
    plain: Option<Arc<tokenizers::Tokenizer>>,
    /// Bytes each token prints as. (vocab_size,)
    pieces: Pieces,
    /// Ids of the added tokens marked `"special": true` (`<|im_end|>`, `<s>`, `<unk>`), sorted:
    /// what transformers' `decode(.., skip_special_tokens=True)` leaves out.
    special: Vec<u32>,
    /// What the post-processor puts before the text (Llama's `<s>`, `<|begin_of_text|>`), if
    /// it puts exactly one token; Qwen's puts none.
    bos_id: Option<u32>,
    /// Appended by `encode(.., eos = true)`; set by the model loader from `config.json`.
    eos_id: Option<u32>,
    /// The decoder drops the text's first space (SentencePiece's dummy prefix).
    strip_first_space: bool,
    /// Bytes of the longest token, for [`HfTokenizer::min_tokens`]; 0 when the normalizer may
    /// shorten text, so that no bound is claimed.
    max_piece_len: usize,
    /// The folder's chat template, set by the model loader.
    chat_template: Option<crate::chat::ChatTemplate>,
}

impl fmt::Debug for HfTokenizer {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("HfTokenizer")
            .field("vocab_size", &self.vocab_size())
            .field("bos_id", &self.bos_id)
            .field("eos_id", &self.eos_id)
            .field("strip_first_space", &self.strip_first_space)
            .finish_non_exhaustive()
    }
}

/// How the decoder turns a token's text into bytes.
#[derive(Clone, Copy, Debug, PartialEq)]
enum Decoding {
    ByteLevel,
    SentencePiece { strip_first_space: bool },
}

impl HfTokenizer {
    /// Reads `tokenizer.json`.
    ///
    /// Memory: the `tokenizers` crate's model (for a 150k-token byte-level BPE, some tens of MB)
    /// plus each token's bytes once.
    ///
    /// # Errors
    /// [`Error::Open`] if the file cannot be read; [`Error::Tokenizer`] if the `tokenizers`
    /// crate rejects it, its decoder is of an unsupported kind (named), or it has more than
    /// [`crate::config::MAX_VOCAB`] tokens.
    pub fn load(path: &Path) -> Result<HfTokenizer> {
        let bytes = std::fs::read(path).map_err(|source| Error::Open {
            path: path.into(),
            source,
        })?;
        HfTokenizer::from_json(&bytes, path)
    }

    /// A `tokenizer.json` given as its bytes; `origin` names it in errors (a GGUF vocabulary
    /// is turned into one by [`crate::tokenizer::tokenizer_from_gguf`]).
    ///
    /// # Errors
    /// As [`HfTokenizer::load`], less the file's opening.
    pub fn from_json(bytes: &[u8], origin: &Path) -> Result<HfTokenizer> {
        let bad = |reason: String| Error::Tokenizer {
            path: PathBuf::from(origin),
            reason,
        };
        let json: Value =
            serde_json::from_slice(bytes).map_err(|e| bad(format!("not JSON: {e}")))?;
        let decoding = decoding(&json["decoder"]).map_err(&bad)?;
        let inner = tokenizers::Tokenizer::from_bytes(bytes)
            .map_err(|e| bad(format!("the tokenizers crate rejects it: {e}")))?;
        let n = inner.get_vocab_size(true);
        if n == 0 || n > crate::config::MAX_VOCAB {
            return Err(bad(format!(
                "{n} tokens (limit {})",
                crate::config::MAX_VOCAB
            )));
        }
        let added = inner.get_added_tokens_decoder();
        let mut special: Vec<u32> = added
            .iter()
            .filter(|(_, a)| a.special)
            .map(|(&id, _)| id)
            .collect();
        special.sort_unstable();
        let table = byte_level_inverse();
        let mut pieces = Pieces::with_capacity(n);
        let mut bytes = Vec::new();
        for id in 0..n as u32 {
            bytes.clear();
            match (added.get(&id), inner.id_to_token(id)) {
                (Some(a), _) => bytes.extend_from_slice(a.content.as_bytes()),
                (None, Some(text)) => token_bytes(decoding, &table, &text, &mut bytes),
                (None, None) => {}
            }
            pieces.push(&bytes)?;
        }
        let max_piece_len = if shortens_text(&json["normalizer"]) {
            0
        } else {
            (0..n as u32)
                .map(|i| pieces.get(i).len())
                .max()
                .unwrap_or(0)
        };
        let around = inner
            .encode("", true)
            .map_err(|e| bad(format!("encoding the empty text fails: {e}")))?;
        let bos_id = match around.get_ids() {
            [bos] => Some(*bos),
            _ => None,
        };
        Ok(HfTokenizer {
            inner: Arc::new(inner),
            pieces,
            special,
            plain: None,
            bos_id,
            eos_id: None,
            strip_first_space: decoding
                == Decoding::SentencePiece {
                    strip_first_space: true,
                },
            max_piece_len,
            chat_template: None,
        })
    }

    /// Sets the chat template (from the model's folder).
    pub fn with_chat_template(mut self, t: Option<crate::chat::ChatTemplate>) -> HfTokenizer {
        self.chat_template = t;
        self
    }

    /// The chat template, if the model has one.
    pub fn chat_template(&self) -> Option<&crate::chat::ChatTemplate> {
        self.chat_template.as_ref()
    }

    /// Sets the token `encode(.., eos = true)` appends.
    pub fn with_eos(mut self, eos: u32) -> HfTokenizer {
        self.eos_id = Some(eos);
        self
    }

    /// Tokens, added ones included.
    pub fn vocab_size(&self) -> usize {
        self.pieces.len()
    }

    /// The one token the post-processor puts before the text, if any.
    pub fn bos_id(&self) -> Option<u32> {
        self.bos_id
    }

    /// The bytes a token prints as (empty outside the vocabulary).
    pub fn piece(&self, id: u32) -> &[u8] {
        self.pieces.get(id)
    }

    /// transformers' `tokenizer(text, add_special_tokens=bos).input_ids`, then EOS if asked
    /// (and known). Added tokens written in the text become those tokens. Text the `tokenizers`
    /// crate cannot encode (it fails only on internal errors) gives no ids.
    pub fn encode(&self, text: &str, bos: bool, eos: bool) -> Vec<u32> {
        self.encode_with(self.plain.as_ref().unwrap_or(&self.inner), text, bos, eos)
    }

    /// [`HfTokenizer::encode`] with every added token written in the text matched, control
    /// tokens included (llama.cpp's `parse_special`); the same as `encode` for a
    /// `tokenizer.json`.
    pub fn encode_special(&self, text: &str, bos: bool, eos: bool) -> Vec<u32> {
        self.encode_with(&self.inner, text, bos, eos)
    }

    /// Control tokens (special added tokens) written in a prompt stay text in
    /// [`HfTokenizer::encode`] and are matched only by [`HfTokenizer::encode_special`], as
    /// llama.cpp tokenizes a GGUF vocabulary. Memory: a second copy of the `tokenizers` model.
    pub fn with_control_tokens_as_text(mut self) -> HfTokenizer {
        let mut plain = (*self.inner).clone();
        plain.set_encode_special_tokens(true);
        self.plain = Some(Arc::new(plain));
        self
    }

    fn encode_with(
        &self,
        inner: &tokenizers::Tokenizer,
        text: &str,
        bos: bool,
        eos: bool,
    ) -> Vec<u32> {
        let mut ids = match inner.encode(text, bos) {
            Ok(e) => e.get_ids().to_vec(),
            Err(_) => Vec::new(),
        };
        if eos && let Some(e) = self.eos_id {
            ids.push(e);
        }
        ids
    }

    /// A lower bound on the tokens of `text` (BOS not counted), from the longest token's bytes;
    /// 0 when the normalizer may shorten the text.
    pub fn min_tokens(&self, text: &str) -> usize {
        if self.max_piece_len == 0 {
            return 0;
        }
        text.len().div_ceil(self.max_piece_len)
    }

    /// Whether `id` is an added token marked special, which printed text leaves out unless
    /// asked (transformers' `skip_special_tokens`).
    pub fn is_special(&self, id: u32) -> bool {
        self.special.binary_search(&id).is_ok()
    }

    /// transformers' `tokenizer.decode(tokens, skip_special_tokens=!special)` of a generated
    /// sequence, BOS left out either way: the `tokenizers` crate's own decoder, so text matches
    /// transformers' exactly, also where streaming differs (its `ByteFallback` turns every byte
    /// of an invalid UTF-8 run into U+FFFD; the stream replaces only the invalid bytes).
    pub fn decode_all(&self, tokens: &[u32], special: bool) -> String {
        let ids: Vec<u32> = tokens
            .iter()
            .copied()
            .filter(|&t| Some(t) != self.bos_id && (t as usize) < self.vocab_size())
            .collect();
        self.inner.decode(&ids, !special).unwrap_or_default()
    }

    /// The bytes `token` prints as after `prev`: its piece, less its leading space when it
    /// starts the text (follows BOS, or nothing when there is no BOS) and the decoder strips
    /// that space; nothing for a special token unless `special`.
    pub fn decode(&self, prev: u32, token: u32, special: bool) -> Vec<u8> {
        if !special && self.is_special(token) {
            return Vec::new();
        }
        let piece = self.piece(token);
        let starts_text = match self.bos_id {
            Some(bos) => prev == bos,
            None => prev == u32::MAX,
        };
        match piece {
            [b' ', rest @ ..] if self.strip_first_space && starts_text => rest.to_vec(),
            _ => piece.to_vec(),
        }
    }
}

/// The decoder family of a `tokenizer.json` (see the module doc).
fn decoding(decoder: &Value) -> std::result::Result<Decoding, String> {
    let ty = decoder["type"].as_str().unwrap_or("none");
    match ty {
        "ByteLevel" => Ok(Decoding::ByteLevel),
        "Metaspace" => Ok(Decoding::SentencePiece {
            strip_first_space: decoder["prepend_scheme"].as_str() != Some("never")
                && decoder["add_prefix_space"].as_bool() != Some(false),
        }),
        "Sequence" => {
            let steps = decoder["decoders"].as_array().cloned().unwrap_or_default();
            let types: Vec<&str> = steps.iter().filter_map(|d| d["type"].as_str()).collect();
            if types.contains(&"ByteLevel") {
                return Ok(Decoding::ByteLevel);
            }
            let replaces_marker = steps.iter().any(|d| {
                d["type"] == "Replace"
                    && d["pattern"]["String"] == "\u{2581}"
                    && d["content"] == " "
            });
            if replaces_marker || types.contains(&"Metaspace") {
                let strip = steps.iter().any(|d| {
                    (d["type"] == "Strip" && d["content"] == " " && d["start"].as_u64() >= Some(1))
                        || (d["type"] == "Metaspace"
                            && d["prepend_scheme"].as_str() != Some("never"))
                });
                return Ok(Decoding::SentencePiece {
                    strip_first_space: strip,
                });
            }
            Err(format!(
                "its decoder is a Sequence of {types:?}; kvlab reads ByteLevel and SentencePiece-style (Metaspace, or Replace \"\u{2581}\" → \" \" with ByteFallback) decoders"
            ))
        }
        other => Err(format!(
            "its decoder is of type {other:?}; kvlab reads ByteLevel and SentencePiece-style (Metaspace, or Replace \"\u{2581}\" → \" \" with ByteFallback) decoders"
        )),
    }
}

/// Whether a normalizer may make text shorter in bytes (Unicode normalisation, lowercasing,
/// stripping); `Replace` of a space by `▁` and `Prepend` only lengthen it.
fn shortens_text(normalizer: &Value) -> bool {
    match normalizer["type"].as_str() {
        None => false,
        Some("Prepend") => false,
        Some("Replace") => {
            let from = normalizer["pattern"]["String"].as_str().unwrap_or("");
            let to = normalizer["content"].as_str().unwrap_or("");
            from.is_empty() || to.len() < from.len()
        }
        Some("Sequence") => normalizer["normalizers"]
            .as_array()
            .is_none_or(|ns| ns.iter().any(shortens_text)),
        Some(_) => true,
    }
}

/// Appends the bytes a vocabulary token's text prints as.
fn token_bytes(decoding: Decoding, table: &[Option<u8>; 324], text: &str, out: &mut Vec<u8>) {
    match decoding {
        Decoding::ByteLevel => {
            for ch in text.chars() {
                match byte_of_char(table, ch) {
                    Some(b) => out.push(b),
                    None => out.extend_from_slice(ch.encode_utf8(&mut [0; 4]).as_bytes()),
                }
            }
        }
        Decoding::SentencePiece { .. } => {
            if let Some(b) = parse_byte_token(text) {
                out.push(b);
            } else {
                out.extend_from_slice(text.replace('\u{2581}', " ").as_bytes());
            }
        }
    }
}

/// `<0xXX>`: a byte-fallback token (SentencePiece `byte_fallback`).
fn parse_byte_token(text: &str) -> Option<u8> {
    let hex = text.strip_prefix("<0x")?.strip_suffix('>')?;
    (hex.len() == 2)
        .then(|| u8::from_str_radix(hex, 16).ok())
        .flatten()
}

/// The inverse of GPT-2's `bytes_to_unicode`, indexed by code point: the printable bytes
/// `!..=~`, `¡..=¬` and `®..=ÿ` stand for themselves; the other 68 bytes, in increasing order,
/// are U+0100 onwards. (324,)
fn byte_level_inverse() -> [Option<u8>; 324] {
    let printable = |b: u8| matches!(b, 0x21..=0x7E | 0xA1..=0xAC | 0xAE..=0xFF);
    let mut table = [None; 324];
    let mut next = 0x100;
    for b in 0..=255u8 {
        if printable(b) {
            table[b as usize] = Some(b);
        } else {
            table[next] = Some(b);
            next += 1;
        }
    }
    table
}

/// The byte a byte-level character stands for, if it is one.
fn byte_of_char(table: &[Option<u8>; 324], ch: char) -> Option<u8> {
    table.get(ch as usize).copied().flatten()
}

#[cfg(test)]
mod tests {
    use super::*;

    /// GPT-2's table, built as openai/gpt-2's `bytes_to_unicode` builds it.
    #[test]
    fn byte_level_table_is_gpt2s() {
        let mut bs: Vec<u32> = (0x21..=0x7E)
            .chain(0xA1..=0xAC)
            .chain(0xAE..=0xFF)
            .collect();
        let mut cs = bs.clone();
        let mut n = 0;
        for b in 0..256 {
            if !bs.contains(&b) {
                bs.push(b);
                cs.push(256 + n);
                n += 1;
            }
        }
        let table = byte_level_inverse();
        for (b, c) in bs.iter().zip(&cs) {
            let ch = char::from_u32(*c).unwrap();
            assert_eq!(byte_of_char(&table, ch), Some(*b as u8), "{ch:?}");
        }
        assert_eq!(byte_of_char(&table, 'Ġ'), Some(b' '));
        assert_eq!(byte_of_char(&table, 'Ċ'), Some(b'\n'));
        assert_eq!(byte_of_char(&table, '\u{0200}'), None);
    }

    #[test]
    fn byte_tokens_parse() {
        assert_eq!(parse_byte_token("<0x0A>"), Some(b'\n'));
        assert_eq!(parse_byte_token("<0xE2>"), Some(0xE2));
        assert_eq!(parse_byte_token("<0x0>"), None);
        assert_eq!(parse_byte_token("0x0A"), None);
    }

    #[test]
    fn decoders_are_classified_or_refused() {
        let llama2: Value = serde_json::json!({"type": "Sequence", "decoders": [
            {"type": "Replace", "pattern": {"String": "\u{2581}"}, "content": " "},
            {"type": "ByteFallback"}, {"type": "Fuse"},
            {"type": "Strip", "content": " ", "start": 1, "stop": 0}]});
        assert_eq!(
            decoding(&llama2),
            Ok(Decoding::SentencePiece {
                strip_first_space: true
            })
        );
        let gemma: Value = serde_json::json!({"type": "Sequence", "decoders": [
            {"type": "Replace", "pattern": {"String": "\u{2581}"}, "content": " "},
            {"type": "ByteFallback"}, {"type": "Fuse"}]});
        assert_eq!(
            decoding(&gemma),
            Ok(Decoding::SentencePiece {
                strip_first_space: false
            })
        );
        let qwen: Value = serde_json::json!({"type": "ByteLevel", "add_prefix_space": false});
        assert_eq!(decoding(&qwen), Ok(Decoding::ByteLevel));
        let wordpiece: Value = serde_json::json!({"type": "WordPiece", "prefix": "##"});
        assert!(decoding(&wordpiece).unwrap_err().contains("\"WordPiece\""));
    }

    #[test]
    fn normalizers_that_may_shorten_text_give_no_bound() {
        let llama2: Value = serde_json::json!({"type": "Sequence", "normalizers": [
            {"type": "Prepend", "prepend": "\u{2581}"},
            {"type": "Replace", "pattern": {"String": " "}, "content": "\u{2581}"}]});
        assert!(!shortens_text(&llama2));
        assert!(!shortens_text(&Value::Null));
        assert!(shortens_text(&serde_json::json!({"type": "NFKC"})));
        assert!(shortens_text(
            &serde_json::json!({"type": "Sequence", "normalizers": [{"type": "Lowercase"}]})
        ));
    }
}

//! Text ↔ token ids. Two kinds of vocabulary, one interface:
//!
//! * [`SpmTokenizer`] (`spm.rs`): SentencePiece-style BPE with scores, written by hand as
//!   llama2.c's run.c does it; llama2.c's `tokenizer.bin` and GGUF vocabularies (`llama`
//!   tokenizer model).
//! * [`HfTokenizer`] (`hf.rs`): a Hugging Face `tokenizer.json`, run by the `tokenizers` crate
//!   (the code behind transformers' fast tokenizers), byte-level BPE (GPT-2, Llama 3, Qwen) or
//!   SentencePiece-style (Llama 2, Mistral, Gemma) alike.
//! * `gguf.rs` reads a GGUF file's vocabulary into one of the two: a `llama` one into
//!   [`SpmTokenizer`], a byte-level `gpt2` one into [`HfTokenizer`] ([`tokenizer_from_gguf`]).
//!
//! Both decode a token to the **bytes** it prints as, so that a character split over several
//! byte tokens streams correctly through [`Utf8Stream`].

mod gguf;
mod hf;
mod pieces;
mod spm;

pub(crate) use gguf::check_tokenizer_model;
pub use gguf::tokenizer_from_gguf;
pub use hf::HfTokenizer;
pub use spm::SpmTokenizer;

use std::path::Path;

use crate::Result;

/// A model's tokenizer.
#[derive(Clone, Debug)]
pub enum Tokenizer {
    /// Boxed: its byte tables make it some KB, and the enum is passed around by value.
    Spm(Box<SpmTokenizer>),
    /// A Hugging Face `tokenizer.json`.
    Hf(HfTokenizer),
}

impl From<SpmTokenizer> for Tokenizer {
    fn from(t: SpmTokenizer) -> Tokenizer {
        Tokenizer::Spm(Box::new(t))
    }
}

impl From<HfTokenizer> for Tokenizer {
    fn from(t: HfTokenizer) -> Tokenizer {
        Tokenizer::Hf(t)
    }
}

impl Tokenizer {
    /// llama2.c's `tokenizer.bin`; see [`SpmTokenizer::load_llama2c`].
    ///
    /// # Errors
    /// As [`SpmTokenizer::load_llama2c`].
    pub fn load_llama2c(path: &Path, vocab_size: usize) -> Result<Tokenizer> {
        SpmTokenizer::load_llama2c(path, vocab_size).map(Tokenizer::from)
    }

    /// A Hugging Face `tokenizer.json`; see [`HfTokenizer::load`].
    ///
    /// # Errors
    /// As [`HfTokenizer::load`].
    pub fn load_hf(path: &Path) -> Result<Tokenizer> {
        HfTokenizer::load(path).map(Tokenizer::Hf)
    }

    /// The SentencePiece vocabulary, for what only it can do (writing a GGUF vocabulary).
    pub fn as_spm(&self) -> Option<&SpmTokenizer> {
        match self {
            Tokenizer::Spm(t) => Some(t),
            Tokenizer::Hf(_) => None,
        }
    }

    /// The model's chat template, if it ships one (a Hugging Face folder's, a GGUF's).
    pub fn chat_template(&self) -> Option<&crate::chat::ChatTemplate> {
        match self {
            Tokenizer::Spm(t) => t.chat_template.as_ref(),
            Tokenizer::Hf(t) => t.chat_template(),
        }
    }

    /// Number of tokens the tokenizer knows (a model's embedding may have more rows).
    pub fn vocab_size(&self) -> usize {
        match self {
            Tokenizer::Spm(t) => t.vocab_size(),
            Tokenizer::Hf(t) => t.vocab_size(),
        }
    }

    /// The beginning-of-sequence token, if the vocabulary has one (Qwen's has none).
    pub fn bos_id(&self) -> Option<u32> {
        match self {
            Tokenizer::Spm(t) => Some(t.bos_id),
            Tokenizer::Hf(t) => t.bos_id(),
        }
    }

    /// Encodes text; `bos` adds what the vocabulary puts first (BOS for Llama, nothing for
    /// Qwen), `eos` appends EOS. Control tokens written in the text stay text for a GGUF or
    /// llama2.c vocabulary (llama.cpp's default); a `tokenizer.json` always matches its added
    /// tokens (as transformers does).
    pub fn encode(&self, text: &str, bos: bool, eos: bool) -> Vec<u32> {
        match self {
            Tokenizer::Spm(t) => t.encode(text, bos, eos),
            Tokenizer::Hf(t) => t.encode(text, bos, eos),
        }
    }

    /// [`Tokenizer::encode`] with control tokens written in the text (`<start_of_turn>`,
    /// `<|im_start|>`) parsed as those tokens: llama.cpp's `parse_special`.
    pub fn encode_special(&self, text: &str, bos: bool, eos: bool) -> Vec<u32> {
        match self {
            Tokenizer::Spm(t) => t.encode_special(text, bos, eos),
            Tokenizer::Hf(t) => t.encode_special(text, bos, eos),
        }
    }

    /// A lower bound on the tokens of `text`, known without encoding it (0 when none is
    /// known), so that a huge prompt is refused before it is encoded.
    pub fn min_tokens(&self, text: &str) -> usize {
        match self {
            Tokenizer::Spm(t) => t.min_tokens(text),
            Tokenizer::Hf(t) => t.min_tokens(text),
        }
    }

    /// Whether `token` is a special (control) token, which printed text leaves out unless
    /// asked: a `tokenizer.json`'s added tokens marked `"special": true` (transformers'
    /// `skip_special_tokens`, on by default in transformers' pipelines and vLLM), a GGUF
    /// vocabulary's CONTROL tokens (llama.cpp hides them unless `--special`). A llama2.c
    /// tokenizer has none.
    pub fn is_special(&self, token: u32) -> bool {
        match self {
            Tokenizer::Spm(t) => t.is_special(token),
            Tokenizer::Hf(t) => t.is_special(token),
        }
    }

    /// The bytes `token` prints as after `prev` (a leading space is dropped right after BOS
    /// where the vocabulary adds one when encoding); a special token ([`Tokenizer::is_special`])
    /// prints nothing unless `special` (llama.cpp's `--special`).
    pub fn decode(&self, prev: u32, token: u32, special: bool) -> Vec<u8> {
        match self {
            Tokenizer::Spm(t) => t.decode(prev, token, special),
            Tokenizer::Hf(t) => t.decode(prev, token, special),
        }
    }

    /// Decodes a whole generated sequence (the first token taken to follow BOS) into text, BOS
    /// itself not printed, special tokens only if `special`; invalid UTF-8 becomes U+FFFD (for a
    /// `tokenizer.json`, exactly as transformers' `decode(.., skip_special_tokens=!special)`
    /// does it: [`HfTokenizer::decode_all`]).
    pub fn decode_all(&self, tokens: &[u32], special: bool) -> String {
        if let Tokenizer::Hf(t) = self {
            return t.decode_all(tokens, special);
        }
        let bos = self.bos_id();
        let mut bytes = Vec::new();
        let mut prev = bos.unwrap_or(u32::MAX);
        for &t in tokens {
            if Some(t) != bos {
                bytes.extend(self.decode(prev, t, special));
            }
            prev = t;
        }
        String::from_utf8_lossy(&bytes).into_owned()
    }
}

/// Turns decoded bytes into printable text as they stream in: a UTF-8 character split over
/// several byte tokens is held back until it is complete; bytes that can never form valid UTF-8
/// become U+FFFD. Like run.c's `safe_printf`, a lone control byte other than whitespace is dropped.
#[derive(Default, Debug)]
pub struct Utf8Stream {
    pending: Vec<u8>,
}

impl Utf8Stream {
    /// Feeds a piece, returns the text that is now complete.
    pub fn push(&mut self, piece: &[u8]) -> String {
        if piece.len() == 1 && piece[0].is_ascii_control() && !piece[0].is_ascii_whitespace() {
            return String::new();
        }
        self.pending.extend_from_slice(piece);
        let mut out = String::new();
        loop {
            match std::str::from_utf8(&self.pending) {
                Ok(s) => {
                    out.push_str(s);
                    self.pending.clear();
                    return out;
                }
                Err(e) => {
                    let valid = e.valid_up_to();
                    out.push_str(
                        std::str::from_utf8(&self.pending[..valid]).expect("valid prefix"),
                    );
                    match e.error_len() {
                        // Incomplete character at the end: wait for more bytes.
                        None => {
                            self.pending.drain(..valid);
                            return out;
                        }
                        Some(n) => {
                            out.push('\u{FFFD}');
                            self.pending.drain(..valid + n);
                        }
                    }
                }
            }
        }
    }

    /// Flushes what is left at the end of generation (an incomplete character becomes U+FFFD).
    pub fn finish(&mut self) -> String {
        let s = String::from_utf8_lossy(&self.pending).into_owned();
        self.pending.clear();
        s
    }
}

//! SentencePiece-style BPE with scores, as llama2.c's run.c implements it (`encode`, `decode`).
//!
//! Encoding: optional BOS; a dummy-prefix space before non-empty text (llama2.c; GGUF models say
//! whether they want it); the text split into UTF-8 code points, each looked up in the vocabulary
//! and, when missing, replaced by its bytes as `<0xXX>` tokens; then, repeatedly, the adjacent pair
//! whose concatenation is a token with the highest score is merged (ties to the leftmost pair)
//! until no pair merges. Decoding drops the leading space of the first piece after BOS and turns
//! `<0xXX>` pieces into the raw byte.

use std::hash::{BuildHasher, RandomState};
use std::path::{Path, PathBuf};

use hashbrown::HashTable;

use super::pieces::Pieces;
use crate::{Error, Result};

/// A scored vocabulary and the BPE merge rule over it.
///
/// Memory: the pieces live back to back in one buffer, and the piece → id table holds ids only,
/// so a vocabulary costs its text plus about 17 bytes per token (Gemma 3's 262,144 tokens:
/// ~7 MB), with no allocation per token.
#[derive(Clone, Debug)]
pub struct SpmTokenizer {
    /// Token pieces as stored: llama2.c's with ' ' for spaces, SentencePiece's with `▁`
    /// (U+2581). (vocab_size,)
    pieces: Pieces,
    /// Merge priority of each token. (vocab_size,)
    scores: Vec<f32>,
    /// Token ids, found by their piece's bytes (hashed with `hasher`); of equal pieces, the
    /// lowest id.
    lookup: HashTable<u32>,
    hasher: RandomState,
    /// Token id of each byte-fallback piece `<0xXX>`, when the vocabulary has it.
    byte_ids: [Option<u32>; 256],
    /// Ids of the pieces matched verbatim in the text before BPE runs (llama.cpp's USER_DEFINED
    /// tokens), longest piece first, then lowest id.
    verbatim: Vec<u32>,
    /// Whether some verbatim piece starts with each byte, so the scan for them skips the rest
    /// of the text in O(1) per byte. (256,)
    verbatim_first: [bool; 256],
    /// The verbatim ids plus the CONTROL and UNKNOWN ones (`<bos>`, `<start_of_turn>`), in the
    /// same order: what [`SpmTokenizer::encode_special`] matches (llama.cpp's `parse_special`).
    special: Vec<u32>,
    /// `verbatim_first` for `special`. (256,)
    special_first: [bool; 256],
    /// Ids that print nothing unless asked (llama.cpp's CONTROL type: `<bos>`,
    /// `<start_of_turn>`), sorted.
    control: Vec<u32>,
    /// Bytes of the longest piece, for [`SpmTokenizer::min_tokens`].
    max_piece_len: usize,
    /// Beginning-of-sequence id, prepended when an encode asks for BOS (1 in llama2.c; GGUF's
    /// `tokenizer.ggml.bos_token_id`).
    pub bos_id: u32,
    /// End-of-sequence id, appended when an encode asks for EOS (2 in llama2.c; GGUF's
    /// `tokenizer.ggml.eos_token_id`).
    pub eos_id: u32,
    /// Prepend a space to non-empty text (llama2.c; SentencePiece's `add_dummy_prefix`).
    pub add_dummy_prefix: bool,
    /// Whether an encode asked for BOS (`bos: true`) gets it: a GGUF's
    /// `tokenizer.ggml.add_bos_token`, true when the key is absent (llama.cpp's default for an
    /// SPM vocabulary, llama-vocab.cpp), and always true for llama2.c's tokenizer.
    pub add_bos: bool,
    /// The vocabulary writes spaces as `▁` (SentencePiece): text spaces become `▁` before BPE
    /// (llama.cpp's `llama_escape_whitespace`), and `▁` prints as a space.
    pub escape_spaces: bool,
    /// A GGUF's `tokenizer.chat_template`, if it has one.
    pub chat_template: Option<crate::chat::ChatTemplate>,
}

/// SentencePiece's space marker, U+2581, in UTF-8.
const SPACE_MARKER: &str = "\u{2581}";

impl SpmTokenizer {
    /// Builds a tokenizer from pieces (token id order, bytes) and their scores (one each). The
    /// pieces are copied into the tokenizer's own buffer, so they may borrow from anything (a
    /// file's memory map, a metadata array).
    ///
    /// # Errors
    /// [`Error::Config`] if the counts differ or are 0, the pieces add up to 4 GiB or more, or
    /// BOS/EOS are outside the vocabulary.
    pub fn new<P: AsRef<[u8]>>(
        pieces: impl IntoIterator<Item = P>,
        scores: Vec<f32>,
        bos_id: u32,
        eos_id: u32,
        add_dummy_prefix: bool,
    ) -> Result<SpmTokenizer> {
        // At most one piece per score is kept, so a long iterator is not collected.
        let mut stored = Pieces::with_capacity(scores.len());
        let mut n = 0usize;
        for p in pieces {
            n += 1;
            if n > scores.len() {
                continue;
            }
            stored.push(p.as_ref())?;
        }
        if n != scores.len() || n == 0 {
            return Err(Error::Config(format!(
                "tokenizer has {n} pieces and {} scores",
                scores.len()
            )));
        }
        if bos_id as usize >= n || eos_id as usize >= n {
            return Err(Error::Config(
                "BOS or EOS id outside the tokenizer's vocabulary".into(),
            ));
        }
        stored.shrink_to_fit();
        let mut tok = SpmTokenizer {
            pieces: stored,
            scores,
            lookup: HashTable::with_capacity(n),
            hasher: RandomState::new(),
            byte_ids: [None; 256],
            verbatim: Vec::new(),
            verbatim_first: [false; 256],
            special: Vec::new(),
            special_first: [false; 256],
            control: Vec::new(),
            max_piece_len: 0,
            bos_id,
            eos_id,
            add_dummy_prefix,
            add_bos: true,
            escape_spaces: false,
            chat_template: None,
        };
        let mut lookup = std::mem::take(&mut tok.lookup);
        for id in 0..n as u32 {
            let p = tok.piece(id);
            let (len, byte) = (p.len(), parse_byte_piece(p));
            let hash = tok.hasher.hash_one(p);
            // First occurrence wins, as llama2.c's sorted-vocab bsearch finds one of equal keys.
            let hash_of = |&j: &u32| tok.hasher.hash_one(tok.piece(j));
            if let hashbrown::hash_table::Entry::Vacant(v) =
                lookup.entry(hash, |&j| tok.piece(j) == p, hash_of)
            {
                v.insert(id);
            }
            if let Some(b) = byte {
                tok.byte_ids[b as usize].get_or_insert(id);
            }
            tok.max_piece_len = tok.max_piece_len.max(len);
        }
        tok.lookup = lookup;
        Ok(tok)
    }

    /// The id of the token whose piece is `bytes` (the lowest of equal pieces), if any.
    fn find(&self, bytes: &[u8]) -> Option<u32> {
        let hash = self.hasher.hash_one(bytes);
        self.lookup.find(hash, |&j| self.piece(j) == bytes).copied()
    }

    /// Sets [`SpmTokenizer::add_bos`]: whether `encode(…, bos: true)` puts BOS first.
    pub fn with_add_bos(mut self, add_bos: bool) -> SpmTokenizer {
        self.add_bos = add_bos;
        self
    }

    /// Declares that the vocabulary writes spaces as `▁` (SentencePiece/GGUF vocabularies).
    pub fn with_escaped_spaces(mut self) -> SpmTokenizer {
        self.escape_spaces = true;
        self
    }

    /// Marks tokens to be matched verbatim in the text before BPE (llama.cpp's USER_DEFINED).
    pub fn with_verbatim(mut self, ids: impl IntoIterator<Item = u32>) -> SpmTokenizer {
        let control: Vec<u32> = self
            .special
            .iter()
            .filter(|id| !self.verbatim.contains(id))
            .copied()
            .collect();
        (self.verbatim, self.verbatim_first) = self.match_list(ids);
        (self.special, self.special_first) =
            self.match_list(self.verbatim.iter().chain(&control).copied());
        self
    }

    /// Marks tokens that [`SpmTokenizer::encode_special`] also matches in the text (llama.cpp's
    /// CONTROL and UNKNOWN token types: `<bos>`, `<start_of_turn>`, `<unk>`); plain
    /// [`SpmTokenizer::encode`] keeps their text as text.
    pub fn with_control(mut self, ids: impl IntoIterator<Item = u32>) -> SpmTokenizer {
        let all: Vec<u32> = self.special.iter().copied().chain(ids).collect();
        (self.special, self.special_first) = self.match_list(all);
        self
    }

    /// Marks the tokens that print nothing unless asked: llama.cpp's CONTROL type, which
    /// `llama_token_to_piece(.., special = false)` renders as empty.
    pub fn with_control_hidden(mut self, ids: impl IntoIterator<Item = u32>) -> SpmTokenizer {
        self.control = ids.into_iter().collect();
        self.control.sort_unstable();
        self.control.dedup();
        self
    }

    /// Whether `id` prints nothing unless asked ([`SpmTokenizer::with_control_hidden`]).
    pub fn is_special(&self, id: u32) -> bool {
        self.control.binary_search(&id).is_ok()
    }

    /// Ids to match in the text, valid and non-empty, deduplicated, longest piece first (then
    /// lowest id), and which bytes start one of them.
    fn match_list(&self, ids: impl IntoIterator<Item = u32>) -> (Vec<u32>, [bool; 256]) {
        let n = self.vocab_size();
        let mut list: Vec<u32> = ids
            .into_iter()
            .filter(|&id| (id as usize) < n && !self.piece(id).is_empty())
            .collect();
        list.sort_by(|&a, &b| {
            let (pa, pb) = (self.piece(a), self.piece(b));
            pb.len().cmp(&pa.len()).then(a.cmp(&b))
        });
        list.dedup();
        let mut first = [false; 256];
        for &id in &list {
            first[self.piece(id)[0] as usize] = true;
        }
        (list, first)
    }

    /// Loads llama2.c's `tokenizer.bin`: i32 max_token_length, then per token f32 score, i32
    /// length, bytes. `vocab_size` comes from the model's config (the file does not store it).
    /// BOS is 1 and EOS 2, as in llama2.c.
    ///
    /// # Errors
    /// [`Error::Open`], or [`Error::Tokenizer`] if the file is truncated, a length is negative or
    /// larger than max_token_length, or bytes are left over.
    pub fn load_llama2c(path: &Path, vocab_size: usize) -> Result<SpmTokenizer> {
        let bytes = std::fs::read(path).map_err(|source| Error::Open {
            path: path.into(),
            source,
        })?;
        let bad = |reason: String| Error::Tokenizer {
            path: PathBuf::from(path),
            reason,
        };
        let mut cur = Cursor {
            bytes: &bytes,
            at: 0,
        };
        let max_len = cur
            .i32()
            .ok_or_else(|| bad("truncated before max_token_length".into()))?;
        if max_len <= 0 || max_len > 1 << 16 {
            return Err(bad(format!("max_token_length {max_len} is not plausible")));
        }
        // Each token needs at least 8 bytes, so a vocab larger than the file allows is caught
        // before the vectors are reserved.
        if vocab_size > bytes.len() / 8 {
            return Err(bad(format!(
                "the file is too small for {vocab_size} tokens; does this tokenizer belong to this model?"
            )));
        }
        let mut pieces = Vec::with_capacity(vocab_size);
        let mut scores = Vec::with_capacity(vocab_size);
        for i in 0..vocab_size {
            let truncated = || bad(format!("truncated in token {i} of {vocab_size}"));
            let score = f32::from_bits(cur.i32().ok_or_else(truncated)? as u32);
            let len = cur.i32().ok_or_else(truncated)?;
            if len < 0 || len > max_len {
                return Err(bad(format!(
                    "token {i} has length {len} (max_token_length {max_len})"
                )));
            }
            pieces.push(cur.take(len as usize).ok_or_else(truncated)?);
            scores.push(score);
        }
        if cur.at != bytes.len() {
            return Err(bad(format!(
                "{} bytes left after {vocab_size} tokens; the model's vocab_size does not match this tokenizer",
                bytes.len() - cur.at
            )));
        }
        SpmTokenizer::new(pieces, scores, 1, 2, true)
    }

    /// Number of tokens.
    pub fn vocab_size(&self) -> usize {
        self.pieces.len()
    }

    /// The merge score of a token (0 for an id outside the vocabulary).
    pub fn score(&self, id: u32) -> f32 {
        self.scores.get(id as usize).copied().unwrap_or(0.0)
    }

    /// llama.cpp's token type of `id` (gguf-py's `TokenType`): 6 BYTE for `<0xXX>` pieces,
    /// 4 USER_DEFINED for the pieces matched verbatim, 3 CONTROL for the other special ones, 1
    /// NORMAL otherwise. (A llama2.c tokenizer marks nothing special; its writer names them.)
    pub fn gguf_token_type(&self, id: u32) -> i32 {
        if parse_byte_piece(self.piece(id)).is_some() {
            6
        } else if self.verbatim.contains(&id) {
            4
        } else if self.special.contains(&id) {
            3
        } else {
            1
        }
    }

    /// The raw piece of a token as stored (llama2.c's spaces as ' ', SentencePiece's as `▁`);
    /// empty for an id outside the vocabulary.
    pub fn piece(&self, id: u32) -> &[u8] {
        self.pieces.get(id)
    }

    /// Encodes text, optionally with BOS first and EOS last (run.c's `encode`). Control tokens
    /// written in the text (`<bos>`, `<start_of_turn>`) stay text; see
    /// [`SpmTokenizer::encode_special`].
    pub fn encode(&self, text: &str, bos: bool, eos: bool) -> Vec<u32> {
        self.encode_matching(text, bos, eos, &self.verbatim, &self.verbatim_first)
    }

    /// [`SpmTokenizer::encode`], but control tokens written in the text become those tokens
    /// (llama.cpp's `llama_tokenize(..., parse_special = true)`, what llama-cli and llama-server
    /// do with a prompt): `"<start_of_turn>user"` is `[105, 2364]` for Gemma 3, not the
    /// characters of `<start_of_turn>`.
    pub fn encode_special(&self, text: &str, bos: bool, eos: bool) -> Vec<u32> {
        self.encode_matching(text, bos, eos, &self.special, &self.special_first)
    }

    /// Splits out the tokens of `list` found in the text (at the leftmost position, the longest
    /// there) and BPE-encodes the text between them. The dummy-prefix space goes before every
    /// text fragment that starts the text or follows a matched token (llama.cpp's SPM rule;
    /// without matched tokens: once, before the text, as run.c does).
    fn encode_matching(
        &self,
        text: &str,
        bos: bool,
        eos: bool,
        list: &[u32],
        first: &[bool; 256],
    ) -> Vec<u32> {
        let mut tokens = Vec::with_capacity(text.len() + 3);
        if bos && self.add_bos {
            tokens.push(self.bos_id);
        }
        let mut rest = text.as_bytes();
        let mut after_token = true;
        while !rest.is_empty() {
            let hit = (0..rest.len())
                .filter(|&i| first[rest[i] as usize])
                .find_map(|i| {
                    list.iter()
                        .map(|&id| (id, self.piece(id)))
                        .find(|(_, p)| rest[i..].starts_with(p))
                        .map(|(id, p)| (i, p.len(), id))
                });
            let (raw, token) = match hit {
                Some((i, len, id)) => (&rest[..i], Some((id, i + len))),
                None => (rest, None),
            };
            if !raw.is_empty() {
                // llama2.c adds the dummy prefix as a token of its own that BPE may then merge
                // with what follows (" " + "Once" → " Once"): the same as prepending a space.
                if self.add_dummy_prefix && after_token {
                    self.bpe(&[b" ", raw].concat(), &mut tokens);
                } else {
                    self.bpe(raw, &mut tokens);
                }
                after_token = false;
            }
            match token {
                Some((id, end)) => {
                    tokens.push(id);
                    rest = &rest[end..];
                    after_token = true;
                }
                None => rest = &[],
            }
        }
        if eos {
            tokens.push(self.eos_id);
        }
        tokens
    }

    /// BPE's starting symbols: each code point of `text` (spaces escaped if the vocabulary does),
    /// as its token or, when it has none, as its bytes' `<0xXX>` tokens.
    fn code_points(&self, text: &[u8]) -> Vec<u32> {
        let mut ids = Vec::with_capacity(text.len());
        let mut s = String::from_utf8_lossy(text);
        if self.escape_spaces {
            s = s.replace(' ', SPACE_MARKER).into();
        }
        let mut buf = [0u8; 4];
        for ch in s.chars() {
            let ch = ch.encode_utf8(&mut buf).as_bytes();
            match self.find(ch) {
                Some(id) => ids.push(id),
                None => ids.extend(ch.iter().filter_map(|&b| self.byte_ids[b as usize])),
            }
        }
        ids
    }

    /// Byte-fallback split into code points, then greedy highest-score merges.
    ///
    /// run.c rescans every adjacent pair after each merge (O(n²) for n code points). This keeps
    /// the symbols in a doubly linked list and the candidate merges in a max-heap ordered by
    /// score, then leftmost position (SentencePiece's `bpe_model.cc` and llama.cpp's
    /// `llm_tokenizer_spm` do the same), so a merge costs O(log n): the heap's top is exactly
    /// the pair the rescan would pick (highest score, ties to the leftmost), and entries made
    /// stale by an earlier merge are recognised and dropped when popped.
    fn bpe(&self, text: &[u8], out: &mut Vec<u32>) {
        if text.is_empty() {
            return;
        }
        let ids = self.code_points(text);
        // (n_symbols,): symbol i starts as ids[i]; `len` counts the initial symbols it covers
        // (0 once merged into its left neighbour).
        let n = ids.len();
        let mut sym: Vec<Symbol> = ids
            .iter()
            .enumerate()
            .map(|(i, &id)| Symbol {
                id,
                prev: i.checked_sub(1),
                next: (i + 1 < n).then_some(i + 1),
                len: 1,
            })
            .collect();
        let mut heap = std::collections::BinaryHeap::with_capacity(n);
        let mut merged = Vec::new();
        for i in 1..n {
            self.push_candidate(&sym, i - 1, i, &mut merged, &mut heap);
        }
        while let Some(c) = heap.pop() {
            let Some(right) = sym[c.left].next else {
                continue;
            };
            // Stale: the left or right symbol has merged since (symbols only grow, so their
            // total length changed, or the right one is gone).
            if sym[c.left].len == 0
                || sym[right].len == 0
                || sym[c.left].len + sym[right].len != c.len
            {
                continue;
            }
            let after = sym[right].next;
            sym[c.left].id = c.id;
            sym[c.left].len = c.len;
            sym[c.left].next = after;
            sym[right].len = 0;
            if let Some(a) = after {
                sym[a].prev = Some(c.left);
                self.push_candidate(&sym, c.left, a, &mut merged, &mut heap);
            }
            if let Some(p) = sym[c.left].prev {
                self.push_candidate(&sym, p, c.left, &mut merged, &mut heap);
            }
        }
        let mut at = (n > 0).then_some(0);
        while let Some(i) = at {
            out.push(sym[i].id);
            at = sym[i].next;
        }
    }

    /// Pushes the merge of symbols `left` and `right` if their concatenation is a token.
    fn push_candidate(
        &self,
        sym: &[Symbol],
        left: usize,
        right: usize,
        merged: &mut Vec<u8>,
        heap: &mut std::collections::BinaryHeap<Candidate>,
    ) {
        merged.clear();
        merged.extend_from_slice(self.piece(sym[left].id));
        merged.extend_from_slice(self.piece(sym[right].id));
        if let Some(id) = self.find(merged) {
            heap.push(Candidate {
                score: merge_key(self.scores[id as usize]),
                left,
                len: sym[left].len + sym[right].len,
                id,
            });
        }
    }

    /// A lower bound on the tokens `encode(text, false, false)` returns, known without encoding:
    /// every token covers at most the longest piece's bytes of text (a byte-fallback token
    /// covers one). 0 when the vocabulary lacks some byte tokens (unknown bytes are then
    /// dropped, and no bound holds).
    pub fn min_tokens(&self, text: &str) -> usize {
        if self.byte_ids.iter().any(Option::is_none) {
            return 0;
        }
        text.len().div_ceil(self.max_piece_len.max(1))
    }

    /// The bytes a token prints as when it follows `prev` (run.c's `decode`): the leading space
    /// is dropped right after BOS when the tokenizer adds a dummy prefix (and only then: llama.cpp
    /// strips it for the same reason), and `<0xXX>` becomes the byte; a control token prints
    /// nothing unless `special` (llama.cpp's `llama_token_to_piece`).
    pub fn decode(&self, prev: u32, token: u32, special: bool) -> Vec<u8> {
        if !special && self.is_special(token) {
            return Vec::new();
        }
        let raw = self.piece(token);
        if let Some(b) = parse_byte_piece(raw) {
            return vec![b];
        }
        let unescaped;
        let mut piece = raw;
        if self.escape_spaces {
            unescaped = String::from_utf8_lossy(raw)
                .replace(SPACE_MARKER, " ")
                .into_bytes();
            piece = &unescaped;
        }
        if self.add_dummy_prefix && prev == self.bos_id && piece.first() == Some(&b' ') {
            piece = &piece[1..];
        }
        piece.to_vec()
    }
}

/// One symbol of BPE's working list: a token and its neighbours.
struct Symbol {
    id: u32,
    prev: Option<usize>,
    next: Option<usize>,
    /// Initial symbols (code points or fallback bytes) it covers; 0 once merged away.
    len: usize,
}

/// A candidate merge of symbol `left` with its right neighbour into token `id`. The heap's
/// greatest is the highest score, ties to the smallest (leftmost) `left`: run.c's choice.
struct Candidate {
    score: f32,
    left: usize,
    /// The merged symbol's `len`, to recognise candidates made stale by an earlier merge.
    len: usize,
    id: u32,
}

impl Ord for Candidate {
    fn cmp(&self, other: &Self) -> std::cmp::Ordering {
        self.score
            .total_cmp(&other.score)
            .then(other.left.cmp(&self.left))
    }
}

impl PartialOrd for Candidate {
    fn partial_cmp(&self, other: &Self) -> Option<std::cmp::Ordering> {
        Some(self.cmp(other))
    }
}

impl PartialEq for Candidate {
    fn eq(&self, other: &Self) -> bool {
        self.cmp(other).is_eq()
    }
}

impl Eq for Candidate {}

/// A score as the heap orders it: −0 equals +0 (the rescan's `>` treats them as equal, so the
/// leftmost wins), and NaN (a malformed file) ranks below every number.
fn merge_key(score: f32) -> f32 {
    if score.is_nan() {
        f32::NEG_INFINITY
    } else {
        score + 0.0
    }
}

/// A bounds-checked little-endian reader.
struct Cursor<'a> {
    bytes: &'a [u8],
    at: usize,
}

impl<'a> Cursor<'a> {
    fn take(&mut self, n: usize) -> Option<&'a [u8]> {
        let b = self.bytes.get(self.at..self.at.checked_add(n)?)?;
        self.at += n;
        Some(b)
    }
    fn i32(&mut self) -> Option<i32> {
        Some(i32::from_le_bytes(self.take(4)?.try_into().ok()?))
    }
}

/// `<0xXX>` → the byte XX.
fn parse_byte_piece(p: &[u8]) -> Option<u8> {
    if p.len() == 6 && p.starts_with(b"<0x") && p[5] == b'>' {
        u8::from_str_radix(std::str::from_utf8(&p[3..5]).ok()?, 16).ok()
    } else {
        None
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    /// run.c's merge loop, kept as the reference the priority-queue version must equal: rescan
    /// every adjacent pair, merge the highest-scoring (ties to the leftmost), repeat.
    fn bpe_rescan(t: &SpmTokenizer, text: &[u8]) -> Vec<u32> {
        let mut tokens = t.code_points(text);
        loop {
            let mut best: Option<(f32, usize, u32)> = None;
            for i in 0..tokens.len().saturating_sub(1) {
                let merged = [t.piece(tokens[i]), t.piece(tokens[i + 1])].concat();
                if let Some(id) = t.find(&merged) {
                    let score = t.scores[id as usize];
                    if best.is_none_or(|(b, _, _)| score > b) {
                        best = Some((score, i, id));
                    }
                }
            }
            let Some((_, i, id)) = best else { break };
            tokens[i] = id;
            tokens.remove(i + 1);
        }
        tokens
    }

    fn tok512() -> SpmTokenizer {
        let p = crate::registry::test_model_file("tok512.bin").expect("tok512.bin is shipped");
        SpmTokenizer::load_llama2c(&p, 512).unwrap()
    }

    /// A vocabulary with equal scores everywhere, so every choice is decided by the tie rule.
    fn ties() -> SpmTokenizer {
        let mut pieces: Vec<Vec<u8>> = vec![b"<unk>".to_vec(), b"<s>".to_vec(), b"</s>".to_vec()];
        pieces.extend((0..=255u8).map(|b| format!("<0x{b:02X}>").into_bytes()));
        for p in [
            "a", "b", "aa", "ab", "ba", "bb", "aaa", "aba", "abab", "bab",
        ] {
            pieces.push(p.as_bytes().to_vec());
        }
        let scores = vec![0.0; pieces.len()];
        SpmTokenizer::new(pieces, scores, 1, 2, false).unwrap()
    }

    /// The heap's tokens and the rescan's for `text`.
    fn heap_and_rescan(t: &SpmTokenizer, text: &str) -> (Vec<u32>, Vec<u32>) {
        let mut out = Vec::new();
        t.bpe(text.as_bytes(), &mut out);
        (out, bpe_rescan(t, text.as_bytes()))
    }

    #[test]
    fn the_heap_equals_the_rescan_on_stories_text() {
        let text = "Once upon a time, there was a little girl named Lily. She loved to play \
                    outside in the park. One day, she saw a big, red ball. naïve café ☕ 123!";
        let (heap, rescan) = heap_and_rescan(&tok512(), text);
        assert_eq!(heap, rescan);
    }

    proptest! {
        #[test]
        fn the_heap_equals_the_rescan_on_random_text(text in "[ a-zA-Z.,'é☕\n]{0,200}") {
            let (heap, rescan) = heap_and_rescan(&tok512(), &text);
            prop_assert_eq!(heap, rescan);
        }

        #[test]
        fn ties_go_to_the_leftmost_pair_as_in_the_rescan(text in "[ab]{0,40}") {
            let (heap, rescan) = heap_and_rescan(&ties(), &text);
            prop_assert_eq!(heap, rescan);
        }
    }

    /// `ties()` plus a control token `<ctl>` and a user-defined `<ud>`, with the dummy prefix.
    fn with_specials() -> SpmTokenizer {
        let t = ties();
        let n = t.vocab_size() as u32;
        let mut pieces: Vec<Vec<u8>> = (0..n).map(|id| t.piece(id).to_vec()).collect();
        pieces.extend([b"<ctl>".to_vec(), b"<ud>".to_vec(), b" ".to_vec()]);
        let scores = vec![0.0; pieces.len()];
        SpmTokenizer::new(pieces, scores, 1, 2, true)
            .unwrap()
            .with_control([n])
            .with_verbatim([n + 1])
            .with_control_hidden([n])
    }

    #[test]
    fn a_control_token_prints_nothing_unless_asked() {
        // llama.cpp's llama_token_to_piece(.., special): CONTROL tokens are empty without it;
        // USER_DEFINED ones always print.
        let t = with_specials();
        let (ctl, ud) = (t.vocab_size() as u32 - 3, t.vocab_size() as u32 - 2);
        assert!(t.is_special(ctl) && !t.is_special(ud));
        assert_eq!(t.decode(0, ctl, false), b"");
        assert_eq!(t.decode(0, ctl, true), b"<ctl>");
        assert_eq!(t.decode(0, ud, false), b"<ud>");
    }

    #[test]
    fn encode_special_matches_control_tokens_and_encode_does_not() {
        let t = with_specials();
        let (ctl, ud, space) = (
            t.vocab_size() as u32 - 3,
            t.vocab_size() as u32 - 2,
            t.vocab_size() as u32 - 1,
        );
        let a = t.encode("a", false, false)[1];
        // `<ud>` is matched by both; `<ctl>` only by encode_special. The dummy-prefix space goes
        // before the text and before each fragment after a matched token (llama.cpp's SPM rule).
        assert_eq!(
            t.encode_special("<ctl>a<ud>a", false, false),
            [ctl, space, a, ud, space, a]
        );
        let plain = t.encode("<ctl>a<ud>a", false, false);
        assert!(!plain.contains(&ctl) && plain.contains(&ud), "{plain:?}");
        assert_eq!(t.encode_special("<ctl>", true, true), [1, ctl, 2]);
        // Without special tokens in the text the two agree.
        assert_eq!(
            t.encode_special("abba ab", true, false),
            t.encode("abba ab", true, false)
        );
    }

    #[test]
    fn min_tokens_is_a_lower_bound() {
        let t = tok512();
        for text in [
            "",
            "a",
            "Once upon a time",
            &"the cat sat on the mat. ".repeat(50),
        ] {
            assert!(
                t.min_tokens(text) <= t.encode(text, false, false).len(),
                "{text}"
            );
        }
    }
}

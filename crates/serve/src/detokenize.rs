//! Token ids to the text a completion returns, as they stream in: UTF-8 characters split over
//! byte tokens are held back until complete, stop tokens (and special tokens, unless asked)
//! print nothing, and text that could be
//! the start of a `stop` string is held back until it is known not to be one.

use std::sync::Arc;

use kvlab_model::Tokenizer;
use kvlab_model::tokenizer::Utf8Stream;

/// Incremental detokenizer of one completion.
pub struct Detokenizer {
    tokenizer: Arc<Tokenizer>,
    utf8: Utf8Stream,
    /// The token before the next one (the prompt's last token at first).
    prev: u32,
    stop_strings: Vec<String>,
    stop_token_ids: Vec<u32>,
    /// Decoded text not yet returned (a possible start of a stop string).
    held: String,
    /// Print special tokens ([`Tokenizer::is_special`]); off by default in the API.
    special: bool,
}

impl Detokenizer {
    /// A detokenizer continuing after `prev` (the prompt's last token); special tokens print
    /// only if `special`.
    pub fn new(
        tokenizer: Arc<Tokenizer>,
        prev: u32,
        stop_strings: Vec<String>,
        stop_token_ids: Vec<u32>,
        special: bool,
    ) -> Detokenizer {
        Detokenizer {
            tokenizer,
            utf8: Utf8Stream::default(),
            prev,
            stop_strings: stop_strings.into_iter().filter(|s| !s.is_empty()).collect(),
            stop_token_ids,
            held: String::new(),
            special,
        }
    }

    /// Feeds one generated token; returns the text now safe to send, and whether a stop string
    /// was reached (the returned text then ends just before it, and generation should stop).
    pub fn push(&mut self, token: u32) -> (String, bool) {
        if self.stop_token_ids.contains(&token) {
            return (String::new(), false);
        }
        let piece = self.tokenizer.decode(self.prev, token, self.special);
        self.prev = token;
        self.held.push_str(&self.utf8.push(&piece));
        if let Some(at) = self
            .stop_strings
            .iter()
            .filter_map(|s| self.held.find(s.as_str()))
            .min()
        {
            self.held.truncate(at);
            return (std::mem::take(&mut self.held), true);
        }
        let keep = self
            .stop_strings
            .iter()
            .map(|s| longest_suffix_prefix(&self.held, s))
            .max()
            .unwrap_or(0);
        let ready = self.held.len() - keep;
        let out = self.held[..ready].to_string();
        self.held.drain(..ready);
        (out, false)
    }

    /// The text still held at the end of generation.
    pub fn finish(&mut self) -> String {
        let mut out = std::mem::take(&mut self.held);
        out.push_str(&self.utf8.finish());
        out
    }
}

/// Bytes of the longest suffix of `text` that is a proper prefix of `stop` (on char
/// boundaries).
fn longest_suffix_prefix(text: &str, stop: &str) -> usize {
    (1..stop.len().min(text.len() + 1))
        .rev()
        .find(|&k| {
            stop.is_char_boundary(k)
                && text.is_char_boundary(text.len() - k)
                && text.ends_with(&stop[..k])
        })
        .unwrap_or(0)
}

#[cfg(test)]
mod tests {
    use super::longest_suffix_prefix;

    #[test]
    fn a_possible_stop_string_start_is_held_back() {
        assert_eq!(longest_suffix_prefix("hello wo", "world"), 2);
        assert_eq!(longest_suffix_prefix("hello", "world"), 0);
        assert_eq!(longest_suffix_prefix("ab", "abc"), 2);
        assert_eq!(longest_suffix_prefix("", "abc"), 0);
    }
}

//! The repository's prompt fixture format (`fixtures/prompts.txt`), read by `cargo xtask
//! verify` and by the engines' integration tests: one prompt per line; `\n` and `\t` escapes;
//! `<empty>` is the empty prompt; lines starting with `#` and blank lines are skipped.

/// The repository's prompt fixture, `fixtures/prompts.txt`, found from this crate's folder (for
/// tests inside the workspace).
pub const PROMPTS: &str = concat!(env!("CARGO_MANIFEST_DIR"), "/../../fixtures/prompts.txt");

/// The prompts of the fixture file at `path`, in order.
///
/// # Errors
/// Reading the file.
pub fn read_prompts(path: &std::path::Path) -> std::io::Result<Vec<String>> {
    Ok(prompt_lines(&std::fs::read_to_string(path)?))
}

/// The prompts of a fixture file's text, in order.
pub fn prompt_lines(text: &str) -> Vec<String> {
    text.lines()
        .filter(|l| !l.starts_with('#') && !l.is_empty())
        .map(|l| {
            if l == "<empty>" {
                String::new()
            } else {
                l.replace("\\n", "\n").replace("\\t", "\t")
            }
        })
        .collect()
}

/// An oracle's decoded text as kvlab's stream prints it: without the ASCII control characters
/// other than whitespace, which [`crate::tokenizer::Utf8Stream`] drops as run.c's `safe_printf`
/// does (random test models emit some). For comparing streamed text with transformers' decode.
pub fn as_streamed(text: &str) -> String {
    text.chars()
        .filter(|ch| !ch.is_ascii_control() || ch.is_ascii_whitespace())
        .collect()
}

#[cfg(test)]
mod tests {
    use super::prompt_lines;

    #[test]
    fn comments_blanks_empty_and_escapes() {
        let text = "# a comment\nOnce upon a time\n\n<empty>\na\\nb\\tc\n";
        assert_eq!(
            prompt_lines(text),
            ["Once upon a time", "", "a\nb\tc"].map(String::from)
        );
    }
}

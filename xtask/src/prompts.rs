//! `fixtures/prompts.txt` (its format: `kvlab_model::fixtures`), and prompts as table labels.

use std::path::Path;

use anyhow::{Context, Result};

/// The prompts of a fixture file, in order (the format: [`kvlab_model::fixtures`]).
pub fn load(path: &Path) -> Result<Vec<String>> {
    kvlab_model::fixtures::read_prompts(path).with_context(|| format!("reading {}", path.display()))
}

/// A prompt shortened for a table cell.
pub fn label(p: &str) -> String {
    let one_line: String = p
        .chars()
        .map(|c| if c.is_control() { ' ' } else { c })
        .collect();
    let n = one_line.chars().count();
    if p.is_empty() {
        "<empty>".into()
    } else if n > 24 {
        format!(
            "{}… ({} chars)",
            one_line.chars().take(18).collect::<String>(),
            n
        )
    } else {
        one_line
    }
}

//! The book's figures, checked: every number the prose quotes sits next to a marker naming the
//! command (or the recorded file) it comes from, and `cargo xtask book` fails when they disagree.
//!
//! Markers are HTML comments, invisible in the rendered book, one per line:
//!
//! ```text
//! <!-- check: COMMAND ==> EXPECTED [==> EXPECTED ...] -->
//! <!-- check-json: FILE POINTER ==> NUMBER -->
//! ```
//!
//! - `check:` COMMAND is one of the chapter's "Reproduce it" commands (so a reader can run it);
//!   each EXPECTED must occur in its output (standard output, then standard error, where kvlab
//!   prints its statistics and traces), runs of whitespace compared as one space.
//!   This is for figures that are arithmetic (`kvlab mem`, `kvlab waste`, `kvlab info`): exact.
//! - `check-json:` the value at the JSON POINTER (RFC 6901, e.g. `/decode/0/step_ms/median/16`)
//!   of FILE (relative to the workspace root), rounded to as many decimals as NUMBER shows, must
//!   equal NUMBER. This is for timings: they move from run to run, so the prose quotes one
//!   recorded run (`benches/baseline.json`) and says so; the check makes sure it quotes that
//!   record, and that refreshing the record without the prose fails.

use std::path::Path;

use anyhow::{Context, Result, bail};

/// What one marker asks.
#[derive(Debug, Clone, PartialEq)]
pub enum Check {
    /// Every `expected` string occurs in `cmd`'s output (stdout and stderr).
    Output { cmd: String, expected: Vec<String> },
    /// The number at `pointer` in the JSON `file`, rounded like `expected`, equals it.
    Json {
        file: String,
        pointer: String,
        expected: String,
    },
}

/// One marker and where it is, for error messages.
#[derive(Debug, Clone, PartialEq)]
pub struct Marker {
    pub file: String,
    pub line: usize,
    pub check: Check,
}

impl Marker {
    fn at(&self) -> String {
        format!("docs/src/{}:{}", self.file, self.line)
    }
}

const SEP: &str = " ==> ";

/// The markers of one chapter, in order; a line that starts a marker but does not parse is an
/// error (a typo must not silently turn a check off).
pub fn parse(file: &str, text: &str) -> Result<Vec<Marker>> {
    let mut out = Vec::new();
    for (i, raw) in text.lines().enumerate() {
        let line = raw.trim();
        if !line.starts_with("<!-- check") {
            continue;
        }
        let at = || format!("docs/src/{file}:{}", i + 1);
        let Some(body) = line.strip_suffix("-->") else {
            bail!(
                "{}: a check marker must fit on one line and end with -->",
                at()
            )
        };
        let check = if let Some(rest) = body.strip_prefix("<!-- check:") {
            let mut parts = rest.split(SEP).map(str::trim);
            let cmd = parts.next().unwrap_or_default().to_string();
            let expected: Vec<String> = parts.map(str::to_string).collect();
            if cmd.is_empty() || expected.is_empty() || expected.iter().any(|e| e.is_empty()) {
                bail!("{}: expected `<!-- check: COMMAND ==> EXPECTED -->`", at())
            }
            Check::Output { cmd, expected }
        } else if let Some(rest) = body.strip_prefix("<!-- check-json:") {
            let (lhs, expected) = rest
                .split_once(SEP)
                .with_context(|| format!("{}: expected `==> NUMBER`", at()))?;
            let mut lhs = lhs.split_whitespace();
            let (Some(file), Some(pointer), None) = (lhs.next(), lhs.next(), lhs.next()) else {
                bail!(
                    "{}: expected `<!-- check-json: FILE POINTER ==> NUMBER -->`",
                    at()
                )
            };
            let expected = expected.trim().to_string();
            if expected.parse::<f64>().is_err() {
                bail!("{}: {expected:?} is not a number", at())
            }
            Check::Json {
                file: file.to_string(),
                pointer: pointer.to_string(),
                expected,
            }
        } else {
            bail!(
                "{}: unknown marker (use `<!-- check: ... -->` or `<!-- check-json: ... -->`)",
                at()
            )
        };
        out.push(Marker {
            file: file.to_string(),
            line: i + 1,
            check,
        });
    }
    Ok(out)
}

/// Runs of whitespace as one space, so a table's column padding does not matter.
fn squash(s: &str) -> String {
    s.split_whitespace().collect::<Vec<_>>().join(" ")
}

/// Checks an output marker against the command's output (stdout followed by stderr); the error
/// says which figure no longer matches and what to do.
pub fn verify_output(m: &Marker, output: &str) -> Result<(), String> {
    let Check::Output { cmd, expected } = &m.check else {
        return Err(format!("{}: not an output check", m.at()));
    };
    let out = squash(output);
    let missing: Vec<&String> = expected
        .iter()
        .filter(|e| !out.contains(&squash(e)))
        .collect();
    if missing.is_empty() {
        return Ok(());
    }
    Err(format!(
        "{}: `{cmd}` no longer prints {missing:?}; run it and update the figures quoted next to this marker",
        m.at()
    ))
}

/// Checks a JSON marker against the file under `root`.
pub fn verify_json(m: &Marker, root: &Path) -> Result<(), String> {
    let Check::Json {
        file,
        pointer,
        expected,
    } = &m.check
    else {
        return Err(format!("{}: not a JSON check", m.at()));
    };
    let text = std::fs::read_to_string(root.join(file))
        .map_err(|e| format!("{}: reading {file}: {e}", m.at()))?;
    let json: serde_json::Value =
        serde_json::from_str(&text).map_err(|e| format!("{}: parsing {file}: {e}", m.at()))?;
    let Some(value) = json.pointer(pointer).and_then(serde_json::Value::as_f64) else {
        return Err(format!("{}: {file} has no number at {pointer}", m.at()));
    };
    let decimals = expected.split_once('.').map_or(0, |(_, d)| d.len());
    let got = format!("{value:.decimals$}");
    if &got == expected {
        Ok(())
    } else {
        Err(format!(
            "{}: {file} {pointer} is {value} ({got} at {decimals} decimals), the prose quotes {expected}; update the figure quoted next to this marker",
            m.at()
        ))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const CHAPTER: &str = "text\n\
        <!-- check: kvlab mem --preset x ==> per token 128.00 KiB ==> 2 × 32 -->\n\
        <!-- check-json: data.json /a/1/b ==> 37.9 -->\n";

    #[test]
    fn parses_both_markers_with_their_lines() {
        let m = parse("c.md", CHAPTER).unwrap();
        assert_eq!(m.len(), 2);
        assert_eq!(m[0].line, 2);
        assert_eq!(
            m[0].check,
            Check::Output {
                cmd: "kvlab mem --preset x".into(),
                expected: vec!["per token 128.00 KiB".into(), "2 × 32".into()],
            }
        );
        assert_eq!(
            m[1].check,
            Check::Json {
                file: "data.json".into(),
                pointer: "/a/1/b".into(),
                expected: "37.9".into(),
            }
        );
    }

    #[test]
    fn malformed_markers_are_errors_not_skipped() {
        for bad in [
            "<!-- check: kvlab mem -->",
            "<!-- check: kvlab mem ==> 12",
            "<!-- check-jsn: f /p ==> 1 -->",
            "<!-- check-json: f ==> 1 -->",
            "<!-- check-json: f /p ==> about 1 -->",
        ] {
            assert!(parse("c.md", bad).is_err(), "{bad} parsed");
        }
    }

    #[test]
    fn output_matches_across_column_padding() {
        let m = &parse("c.md", CHAPTER).unwrap()[0];
        let out = "model x\nper token      128.00 KiB (131072 B)\nshape 2 ×   32 × 8\n";
        assert_eq!(verify_output(m, out), Ok(()));
    }

    #[test]
    fn a_changed_figure_fails() {
        let m = &parse("c.md", CHAPTER).unwrap()[0];
        let out = "per token      64.00 KiB (65536 B)\n2 × 32\n";
        let err = verify_output(m, out).unwrap_err();
        assert!(err.contains("docs/src/c.md:2"), "{err}");
        assert!(err.contains("per token 128.00 KiB"), "{err}");
    }

    #[test]
    fn json_figures_compare_at_the_quoted_precision() {
        let dir = std::env::temp_dir().join(format!("kvlab-book-check-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        std::fs::write(dir.join("data.json"), r#"{"a": [0, {"b": 37.9242}]}"#).unwrap();
        let m = |n: &str| {
            parse(
                "c.md",
                &format!("<!-- check-json: data.json /a/1/b ==> {n} -->"),
            )
            .unwrap()[0]
                .clone()
        };
        assert_eq!(verify_json(&m("37.9"), &dir), Ok(()));
        assert_eq!(verify_json(&m("37.92"), &dir), Ok(()));
        assert_eq!(verify_json(&m("38"), &dir), Ok(()));
        assert!(verify_json(&m("37.8"), &dir).is_err());
        assert!(verify_json(&m("37.924"), &dir).is_ok());
        let missing = parse("c.md", "<!-- check-json: data.json /a/7 ==> 1 -->").unwrap();
        assert!(
            verify_json(&missing[0], &dir)
                .unwrap_err()
                .contains("no number")
        );
        std::fs::remove_dir_all(&dir).unwrap();
    }
}

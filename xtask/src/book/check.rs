//! The book's figures, checked: every number the prose quotes sits next to a marker naming the
//! command (or the recorded file) it comes from, and `cargo xtask book` fails when they disagree.
//!
//! Markers are HTML comments, invisible in the rendered book, one per line:
//!
//! ```text
//! <!-- check: COMMAND ==> EXPECTED [==> EXPECTED ...] -->
//! <!-- check-json: FILE EXPR ==> NUMBER [±TOLERANCE] -->
//! <!-- check-file: FILE ==> EXPECTED [==> EXPECTED ...] -->
//! <!-- calc: EXPR ==> NUMBER [±TOLERANCE] -->
//! <!-- given: WHY ==> FIGURE [==> FIGURE ...] -->
//! <!-- source: WHERE ==> FIGURE [==> FIGURE ...] -->
//! ```
//!
//! - `check:` COMMAND is one of the chapter's "Reproduce it" commands (so a reader can run it);
//!   each EXPECTED must occur in its output (standard output, then standard error, where kvlab
//!   prints its statistics and traces), runs of whitespace compared as one space.
//!   This is for figures that are arithmetic (`kvlab mem`, `kvlab waste`, `kvlab info`): exact.
//! - `check-json:` EXPR is a JSON pointer (RFC 6901, e.g. `/decode/0/step_ms/median/16`) into
//!   FILE (relative to the workspace root), or pointers and numbers joined by `+ - * /`,
//!   evaluated left to right (`/a / /b` for a ratio of two recorded values, `/hit_rate * 100`
//!   for a percentage). Its value must equal NUMBER within ±TOLERANCE when one is written, else
//!   rounded to as many decimals as NUMBER shows; `==> <N` and `==> >N` check a bound ("under
//!   2%": `==> <2`). This is for timings: they move from run to
//!   run, so the prose quotes one recorded run (`benches/baseline.json`) and says so; the check
//!   makes sure it quotes that record, and that refreshing the record without the prose fails.
//! - `check-file:` each EXPECTED occurs in FILE (relative to the workspace root), whitespace
//!   squashed as for `check:`: for records that are text, such as a profiler's report.
//! - `calc:` EXPR is arithmetic on numbers (`1,280 / 480`), evaluated and compared as for
//!   `check-json`: for a figure the prose derives from others it quotes ("int8 saves 2.7×").
//! - `given:` figures the prose sets rather than measures (an experiment's settings, a
//!   definition, arithmetic spelled out in the sentence), with WHY they are what they are.
//! - `source:` figures quoted from outside kvlab (a paper, a model card, a peer's docs), with
//!   WHERE they were published, so a reader can look them up.
//!
//! [`super::lint`] fails the book on a figure in prose that no marker of its paragraph quotes.

use std::path::Path;
use std::sync::LazyLock;

use anyhow::{Context, Result, bail};
use regex::Regex;

/// What one marker asks.
#[derive(Debug, Clone, PartialEq)]
pub enum Check {
    /// Every `expected` string occurs in `cmd`'s output (stdout and stderr).
    Output { cmd: String, expected: Vec<String> },
    /// `expr` evaluated over the JSON `file` equals `expected`: within `tolerance` when one is
    /// written, else rounded to `expected`'s decimals. Without a file (a `calc` marker) `expr`
    /// is arithmetic on numbers the prose shows.
    Json {
        file: Option<String>,
        expr: Vec<Term>,
        expected: String,
        tolerance: Tolerance,
    },
    /// Every `expected` string occurs in the text `file`.
    File { file: String, expected: Vec<String> },
    /// Figures the prose sets rather than measures, and why.
    Given { why: String, figures: Vec<String> },
    /// Figures quoted from a source outside kvlab, and where it is.
    Source {
        source: String,
        figures: Vec<String>,
    },
}

/// How close a `check-json` or `calc` value must be to the number the prose quotes.
#[derive(Debug, Clone, Copy, PartialEq)]
pub enum Tolerance {
    /// Equal when rounded to the quoted number's decimals (`==> 37.9`).
    Rounded,
    /// Within this much either way (`==> 6 ±0.5`, for "about 6×").
    Within(f64),
    /// Below the quoted number (`==> <2`, for "under 2%").
    Below,
    /// Above it (`==> >10`, for "more than ten times").
    Above,
}

/// One token of a `check-json` expression, evaluated left to right.
#[derive(Debug, Clone, PartialEq)]
pub enum Term {
    /// A JSON pointer into the marker's file.
    Pointer(String),
    /// A literal, e.g. the 100 of a percentage.
    Number(f64),
    /// `+ - * /`, applied to the value so far and the next operand.
    Op(char),
}

impl Check {
    /// Every figure this marker quotes, as the digits of its numbers (commas dropped): what
    /// [`super::lint`] matches the prose's figures against.
    pub fn quoted(&self) -> Vec<String> {
        let texts: Vec<&String> = match self {
            Check::Output { expected, .. } | Check::File { expected, .. } => {
                expected.iter().collect()
            }
            Check::Json { expected, .. } => vec![expected],
            Check::Given { figures, .. } | Check::Source { figures, .. } => {
                figures.iter().collect()
            }
        };
        texts.into_iter().flat_map(|t| numbers(t)).collect()
    }
}

/// A number as the book writes it: digits, commas between digits as thousands separators, and
/// decimals ("1,024.5"). The lint's figures are this followed by a unit (`lint.rs`).
pub const NUM: &str = r"\d(?:[\d,]*\d)?(?:\.\d+)?";

static NUMBER: LazyLock<Regex> = LazyLock::new(|| {
    Regex::new(NUM).unwrap_or_else(|e| panic!("the number regex does not compile: {e}"))
});

/// The numbers in `text`, commas dropped: "1,024.5 ms and 2×" gives ["1024.5", "2"].
pub fn numbers(text: &str) -> Vec<String> {
    NUMBER
        .find_iter(text)
        .map(|m| m.as_str().replace(',', ""))
        .collect()
}

/// `value` rounded to as many decimals as `like` shows: how a figure is compared with its
/// source ("37.9" shows 37.9242 as "37.9", "38" as "38").
pub fn rounded_like(value: f64, like: &str) -> String {
    let decimals = like.split_once('.').map_or(0, |(_, d)| d.len());
    format!("{value:.decimals$}")
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
        if !["<!-- check", "<!-- calc", "<!-- given", "<!-- source"]
            .iter()
            .any(|p| line.starts_with(p))
        {
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
            parse_json(rest, true).map_err(|e| anyhow::anyhow!("{}: {e}", at()))?
        } else if let Some(rest) = body.strip_prefix("<!-- calc:") {
            parse_json(rest, false).map_err(|e| anyhow::anyhow!("{}: {e}", at()))?
        } else if let Some(rest) = body.strip_prefix("<!-- check-file:") {
            let (file, expected) = labelled(rest).with_context(|| {
                format!(
                    "{}: expected `<!-- check-file: FILE ==> EXPECTED -->`",
                    at()
                )
            })?;
            Check::File { file, expected }
        } else if let Some(rest) = body.strip_prefix("<!-- given:") {
            let (why, figures) = labelled(rest)
                .with_context(|| format!("{}: expected `<!-- given: WHY ==> FIGURE -->`", at()))?;
            Check::Given { why, figures }
        } else if let Some(rest) = body.strip_prefix("<!-- source:") {
            let (source, figures) = labelled(rest).with_context(|| {
                format!("{}: expected `<!-- source: WHERE ==> FIGURE -->`", at())
            })?;
            Check::Source { source, figures }
        } else {
            bail!(
                "{}: unknown marker (use `<!-- check: ... -->`, `<!-- check-json: ... -->`, `<!-- given: ... -->` or `<!-- source: ... -->`)",
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

/// `FILE EXPR ==> NUMBER [±TOLERANCE]`, the body of a `check-json` marker.
/// With `with_file` false, the body of a `calc` marker: `EXPR ==> NUMBER [±TOLERANCE]`,
/// numbers only.
fn parse_json(rest: &str, with_file: bool) -> Result<Check> {
    let form = if with_file {
        "expected `<!-- check-json: FILE EXPR ==> NUMBER [±TOLERANCE] -->`"
    } else {
        "expected `<!-- calc: EXPR ==> NUMBER [±TOLERANCE] -->`"
    };
    let (lhs, rhs) = rest.split_once(SEP).context(form)?;
    let mut words = lhs.split_whitespace();
    let file = if with_file {
        Some(words.next().context(form)?.to_string())
    } else {
        None
    };
    let mut expr = Vec::new();
    for (i, w) in words.enumerate() {
        let operand = i % 2 == 0;
        expr.push(match w {
            "+" | "-" | "*" | "/" if !operand => Term::Op(w.chars().next().unwrap_or('+')),
            _ if operand && with_file && w.starts_with('/') && w.len() > 1 => {
                Term::Pointer(w.to_string())
            }
            _ if operand => Term::Number(w.replace(',', "").parse().with_context(|| {
                format!("{w:?} is neither a JSON pointer nor a number; {form}")
            })?),
            _ => bail!("{w:?} is not one of + - * /; {form}"),
        });
    }
    let pointers = expr.iter().any(|t| matches!(t, Term::Pointer(_)));
    if expr.len() % 2 == 0 || pointers != with_file {
        bail!("{form}, EXPR pointers (check-json) or numbers (calc) joined by + - * /")
    }
    let mut rhs = rhs.split_whitespace();
    let first = rhs.next().unwrap_or_default();
    let (expected, bound) = match first.strip_prefix('<') {
        Some(n) => (n, Some(Tolerance::Below)),
        None => match first.strip_prefix('>') {
            Some(n) => (n, Some(Tolerance::Above)),
            None => (first, None),
        },
    };
    let expected = expected.to_string();
    if expected.parse::<f64>().is_err() {
        bail!("{expected:?} is not a number")
    }
    let tolerance = match (bound, rhs.next()) {
        (Some(b), None) => b,
        (None, None) => Tolerance::Rounded,
        (None, Some(t)) => Tolerance::Within(
            t.strip_prefix('±')
                .and_then(|t| t.parse::<f64>().ok())
                .with_context(|| format!("{t:?} is not a tolerance like ±0.05"))?,
        ),
        (Some(_), Some(t)) => bail!("{t:?} after a bound: write `<N` or `>N` alone"),
    };
    if rhs.next().is_some() {
        bail!("{form}")
    }
    Ok(Check::Json {
        file,
        expr,
        expected,
        tolerance,
    })
}

/// `LABEL ==> FIGURE [==> FIGURE ...]` of `given` and `source` markers; each figure must hold a
/// number, or it could not match the prose.
fn labelled(rest: &str) -> Option<(String, Vec<String>)> {
    let mut parts = rest.split(SEP).map(str::trim);
    let label = parts.next().filter(|l| !l.is_empty())?.to_string();
    let figures: Vec<String> = parts.map(str::to_string).collect();
    if figures.is_empty() || figures.iter().any(|f| numbers(f).is_empty()) {
        return None;
    }
    Some((label, figures))
}

/// Runs of whitespace as one space, so a table's column padding does not matter.
fn squash(s: &str) -> String {
    s.split_whitespace().collect::<Vec<_>>().join(" ")
}

/// The `expected` strings `text` does not contain, whitespace squashed on both sides.
fn missing_from<'a>(text: &str, expected: &'a [String]) -> Vec<&'a String> {
    let text = squash(text);
    expected
        .iter()
        .filter(|e| !text.contains(&squash(e)))
        .collect()
}

/// Checks an output marker against the command's output (stdout followed by stderr); the error
/// says which figure no longer matches and what to do.
pub fn verify_output(m: &Marker, output: &str) -> Result<(), String> {
    let Check::Output { cmd, expected } = &m.check else {
        return Err(format!("{}: not an output check", m.at()));
    };
    let missing = missing_from(output, expected);
    if missing.is_empty() {
        return Ok(());
    }
    Err(format!(
        "{}: `{cmd}` no longer prints {missing:?}; run it and update the figures quoted next to this marker",
        m.at()
    ))
}

/// Checks a text-file marker against the file under `root`.
pub fn verify_file(m: &Marker, root: &Path) -> Result<(), String> {
    let Check::File { file, expected } = &m.check else {
        return Err(format!("{}: not a file check", m.at()));
    };
    let text = std::fs::read_to_string(root.join(file))
        .map_err(|e| format!("{}: reading {file}: {e}", m.at()))?;
    let missing = missing_from(&text, expected);
    if missing.is_empty() {
        return Ok(());
    }
    Err(format!(
        "{}: {file} does not say {missing:?}; update the figures quoted next to this marker",
        m.at()
    ))
}

/// Checks a JSON marker against the file under `root`.
pub fn verify_json(m: &Marker, root: &Path) -> Result<(), String> {
    let Check::Json {
        file,
        expr,
        expected,
        tolerance,
    } = &m.check
    else {
        return Err(format!("{}: not a JSON check", m.at()));
    };
    let (json, file) = match file {
        Some(file) => {
            let text = std::fs::read_to_string(root.join(file))
                .map_err(|e| format!("{}: reading {file}: {e}", m.at()))?;
            let json = serde_json::from_str(&text)
                .map_err(|e| format!("{}: parsing {file}: {e}", m.at()))?;
            (json, file.as_str())
        }
        None => (serde_json::Value::Null, "calc:"),
    };
    let value = eval(&json, expr).map_err(|e| format!("{}: {file}: {e}", m.at()))?;
    let shown: String = expr
        .iter()
        .map(|t| match t {
            Term::Pointer(p) => p.clone(),
            Term::Number(n) => n.to_string(),
            Term::Op(o) => o.to_string(),
        })
        .collect::<Vec<_>>()
        .join(" ");
    let want: f64 = expected.parse().unwrap_or(f64::NAN);
    let (ok, how) = match tolerance {
        Tolerance::Within(tol) => ((value - want).abs() <= *tol, format!("±{tol}")),
        Tolerance::Below => (value < want, "must be below".to_string()),
        Tolerance::Above => (value > want, "must be above".to_string()),
        Tolerance::Rounded => {
            let got = rounded_like(value, expected);
            (&got == expected, format!("{got} at the quoted precision"))
        }
    };
    if ok {
        Ok(())
    } else {
        Err(format!(
            "{}: {file} {shown} is {value} ({how}), the prose quotes {expected}; update the figure quoted next to this marker",
            m.at()
        ))
    }
}

/// `expr` over `json`, left to right; an error names a pointer with no number behind it.
fn eval(json: &serde_json::Value, expr: &[Term]) -> Result<f64, String> {
    let operand = |t: &Term| match t {
        Term::Pointer(p) => json
            .pointer(p)
            .and_then(serde_json::Value::as_f64)
            .ok_or_else(|| format!("no number at {p}")),
        Term::Number(n) => Ok(*n),
        Term::Op(o) => Err(format!("operator {o} where a value belongs")),
    };
    let mut value = operand(&expr[0])?;
    for pair in expr[1..].chunks(2) {
        let [Term::Op(op), rhs] = pair else {
            return Err("an operator without its operand".into());
        };
        let rhs = operand(rhs)?;
        value = match op {
            '+' => value + rhs,
            '-' => value - rhs,
            '*' => value * rhs,
            _ => value / rhs,
        };
    }
    Ok(value)
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
                file: Some("data.json".into()),
                expr: vec![Term::Pointer("/a/1/b".into())],
                expected: "37.9".into(),
                tolerance: Tolerance::Rounded,
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
            "<!-- check-json: f /p / ==> 1 -->",
            "<!-- check-json: f /p x 100 ==> 1 -->",
            "<!-- check-json: f 100 ==> 1 -->",
            "<!-- check-json: f /p ==> 1 0.1 -->",
            "<!-- given: ==> 16 tokens -->",
            "<!-- check-file: a.txt -->",
            "<!-- calc: /a ==> 1 -->",
            "<!-- calc: 2 x 3 ==> 6 -->",
            "<!-- calc: 2 ==> <3 ±1 -->",
            "<!-- given: the demo's pool -->",
            "<!-- source: a blog ==> most of it -->",
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
        let m_expr = |rest: &str| {
            parse("c.md", &format!("<!-- check-json: data.json {rest} -->")).unwrap()[0].clone()
        };
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
        let calc = parse("c.md", "<!-- calc: 1,280 / 480 ==> 2.7 -->").unwrap();
        assert_eq!(verify_json(&calc[0], &dir), Ok(()));
        let calc = parse("c.md", "<!-- calc: 1,280 / 480 ==> 2.6 -->").unwrap();
        assert!(verify_json(&calc[0], &dir).is_err());
        let calc = |c: &str| parse("c.md", &format!("<!-- calc: {c} -->")).unwrap()[0].clone();
        assert_eq!(verify_json(&calc("1.7 ==> <2"), &dir), Ok(()));
        assert!(verify_json(&calc("2.1 ==> <2"), &dir).is_err());
        assert_eq!(verify_json(&calc("54 ==> >10"), &dir), Ok(()));
        assert!(verify_json(&calc("9 ==> >10"), &dir).is_err());
        // Expressions, left to right, and a written tolerance.
        assert_eq!(
            verify_json(&m_expr("/a/1/b / 2 * 100 ==> 1896"), &dir),
            Ok(())
        );
        assert_eq!(
            verify_json(&m_expr("/a/1/b - /a/0 ==> 38 ±0.1"), &dir),
            Ok(())
        );
        assert!(verify_json(&m_expr("/a/1/b ==> 38 ±0.05"), &dir).is_err());
        std::fs::write(dir.join("ncu.txt"), "DRAM Throughput      %     5.71\n").unwrap();
        let file =
            |e: &str| parse("c.md", &format!("<!-- check-file: ncu.txt ==> {e} -->")).unwrap();
        assert_eq!(
            verify_file(&file("DRAM Throughput % 5.71")[0], &dir),
            Ok(())
        );
        assert!(verify_file(&file("DRAM Throughput % 5.72")[0], &dir).is_err());
        let missing = parse("c.md", "<!-- check-json: data.json /a/7 ==> 1 -->").unwrap();
        assert!(
            verify_json(&missing[0], &dir)
                .unwrap_err()
                .contains("no number")
        );
        std::fs::remove_dir_all(&dir).unwrap();
    }

    #[test]
    fn markers_quote_the_numbers_of_their_figures() {
        assert_eq!(
            numbers("1,024.5 ms, 2× and 3, 4"),
            ["1024.5", "2", "3", "4"]
        );
        let m = parse(
            "c.md",
            "<!-- given: the demo's pool ==> 24 blocks of 16 tokens ==> 20 ms -->",
        )
        .unwrap();
        assert_eq!(m[0].check.quoted(), ["24", "16", "20"]);
        let m = parse("c.md", "<!-- source: vLLM blog, 2023 ==> 60% – 80% -->").unwrap();
        assert_eq!(m[0].check.quoted(), ["60", "80"]);
    }
}

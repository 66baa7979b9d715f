//! The book's lint: a figure in prose that no marker quotes fails `cargo xtask book`.
//!
//! A figure is a number followed by a unit of time, size, rate or work, or by `×` or `%`
//! ("1.36×", "27.3 ms", "640 KiB", "44.8–69.0%"); a `×` followed by another number is
//! multiplication ("2 × 32"), not a figure. Prose is everything outside fenced code, inline
//! code, HTML comments and link targets; tables count. A `×` written after a space ("15 × the
//! last 512") multiplies too; a ratio is written against its number ("27×"). The markers of a
//! figure are the two blocks of markers around it: the one that ends its paragraphs and the
//! one just before them, unless a heading comes between. A figure is marked when one of them
//! quotes its number at the figure's precision ("39 MiB" is quoted by a marker's "39.00");
//! both ends of a range must be.

use std::sync::LazyLock;

use regex::Regex;

use super::check::{Marker, NUM, rounded_like};

/// A figure in prose that no marker quotes.
#[derive(Debug, Clone, PartialEq)]
pub struct Unmarked {
    /// 1-based line in the chapter.
    pub line: usize,
    /// As written, e.g. "27×".
    pub figure: String,
}

/// A number, an optional range end, and a unit (longest alternatives first: the regex takes
/// the first that matches).
static FIGURE: LazyLock<Regex> = LazyLock::new(|| {
    const UNIT: &str = r"tok/s|tokens/s|GB/s|GiB/s|MB/s|MiB/s|GFLOP/s|FLOPs?|KiB|MiB|GiB|TiB|kB|KB|MB|GB|TB|bytes?|seconds?|minutes?|hours?|min|ms|µs|us|ns|s|×|%";
    Regex::new(&format!(r"({NUM})(?:\s?[–-]\s?({NUM}))?(\s?)({UNIT}|B)"))
        .unwrap_or_else(|e| panic!("the figure regex does not compile: {e}"))
});

static INLINE_SKIP: LazyLock<Regex> = LazyLock::new(|| {
    Regex::new(r"`[^`]*`|<!--.*?-->|\]\([^)]*\)|<[^>]*>")
        .unwrap_or_else(|e| panic!("the skip regex does not compile: {e}"))
});

/// The figures on one line of prose, with their numbers (commas dropped).
fn figures(line: &str) -> Vec<(String, Vec<String>)> {
    let prose = INLINE_SKIP.replace_all(line, " ");
    let mut out = Vec::new();
    for c in FIGURE.captures_iter(&prose) {
        let (Some(all), Some(unit)) = (c.get(0), c.get(4)) else {
            continue;
        };
        let before = prose[..all.start()].chars().next_back();
        let after = prose[all.end()..].chars().next();
        // Part of a word or name ("sm_90", "v2", "Q4_K", "1.2.3"), not a figure.
        if before.is_some_and(|b| b.is_alphanumeric() || "_./-".contains(b)) {
            continue;
        }
        let alpha = unit.as_str().chars().all(char::is_alphabetic);
        if alpha && after.is_some_and(|a| a.is_alphanumeric() || a == '_') {
            continue;
        }
        // "7B" is a model's size; a bare B is bytes only after a space ("1280 B").
        let spaced = c.get(3).is_some_and(|s| !s.as_str().is_empty());
        if unit.as_str() == "B" && !spaced {
            continue;
        }
        // "2 × 32" and "15 × the last 512" multiply.
        if unit.as_str() == "×"
            && (spaced
                || prose[all.end()..]
                    .trim_start()
                    .starts_with(|d: char| d.is_ascii_digit()))
        {
            continue;
        }
        let nums = [c.get(1), c.get(2)]
            .into_iter()
            .flatten()
            .map(|m| m.as_str().replace(',', ""))
            .collect();
        out.push((all.as_str().to_string(), nums));
    }
    out
}

/// Whether `quoted` (a marker's number) shows `figure` (the prose's) at the prose's precision.
fn shows(quoted: &str, figure: &str) -> bool {
    quoted == figure
        || quoted
            .parse::<f64>()
            .is_ok_and(|q| rounded_like(q, figure) == figure)
}

/// The figures of `text` (one chapter) that neither marker block around them quotes.
pub fn unmarked(text: &str, markers: &[Marker]) -> Vec<Unmarked> {
    let mut out = Vec::new();
    // Figures since the last marker block; the numbers that block quoted (`before`) and the
    // block being read now (`after`).
    let mut pending: Vec<(usize, String, Vec<String>)> = Vec::new();
    let mut before: Vec<String> = Vec::new();
    let mut after: Vec<String> = Vec::new();
    let mut in_block = false;
    let mut flush = |pending: &mut Vec<(usize, String, Vec<String>)>,
                     before: &mut Vec<String>,
                     after: &mut Vec<String>| {
        for (line, figure, nums) in pending.drain(..) {
            let quoted = |n: &String| before.iter().chain(after.iter()).any(|q| shows(q, n));
            if !nums.iter().all(quoted) {
                out.push(Unmarked { line, figure });
            }
        }
        *before = std::mem::take(after);
    };
    let mut in_fence = false;
    let mut in_comment = false;
    for (i, raw) in text.lines().enumerate() {
        let line = raw.trim();
        if line.starts_with("```") {
            in_fence = !in_fence;
            continue;
        }
        if in_fence {
            continue;
        }
        if in_comment {
            in_comment = !line.contains("-->");
            continue;
        }
        if line.starts_with("<!--") {
            if let Some(m) = markers.iter().find(|m| m.line == i + 1) {
                after.extend(m.check.quoted());
                in_block = true;
            } else {
                in_comment = !line.contains("-->");
            }
            continue;
        }
        // A marker block ends at the next line with text; a heading starts afresh.
        if in_block && !line.is_empty() {
            flush(&mut pending, &mut before, &mut after);
            in_block = false;
        }
        if line.starts_with('#') {
            flush(&mut pending, &mut before, &mut after);
            before.clear();
        }
        for (figure, nums) in figures(raw) {
            pending.push((i + 1, figure, nums));
        }
    }
    flush(&mut pending, &mut before, &mut after);
    out
}

#[cfg(test)]
mod tests {
    use super::super::check::parse;
    use super::*;

    fn lint(text: &str) -> Vec<String> {
        let markers = parse("c.md", text).unwrap();
        unmarked(text, &markers)
            .into_iter()
            .map(|u| format!("{}:{}", u.line, u.figure))
            .collect()
    }

    #[test]
    fn finds_figures_and_leaves_names_and_products_alone() {
        let found: Vec<String> = figures(
            "27× as long, 1.41 ms, 640 KiB, 1280 B, 44.8–69.0%, 5.92 tokens/s, 1,024 MiB; \
             not Llama 3 8B, sm_90, 2 × 32, 15 × the last, `12 ms`, [x](a/3%.md), Q4_K_M, v2",
        )
        .into_iter()
        .map(|(f, _)| f)
        .collect();
        assert_eq!(
            found,
            [
                "27×",
                "1.41 ms",
                "640 KiB",
                "1280 B",
                "44.8–69.0%",
                "5.92 tokens/s",
                "1,024 MiB"
            ]
        );
    }

    #[test]
    fn a_quoted_figure_passes_at_its_precision() {
        let text = "The cache takes 39 MiB and 1.25 KiB.\n\n\
                    <!-- check: kvlab mem ==> 39.00 MiB ==> 1.25 KiB -->\n";
        assert!(lint(text).is_empty(), "{:?}", lint(text));
    }

    #[test]
    fn a_planted_unmarked_figure_fails() {
        let text = "It ran 27× faster.\n\n<!-- check-json: b.json /r ==> 27 -->\n\n\
                    Later it took 12.5 ms, then 3 ms.\n\n<!-- check-json: b.json /t ==> 12.5 -->\n";
        assert_eq!(lint(text), ["5:3 ms"]);
        // The block before a paragraph counts too, but not the one before that.
        let text = "It ran 27× faster.\n\n<!-- check-json: b.json /r ==> 27 -->\n\nAgain 27×.\n\n\
                    <!-- given: x ==> 2 -->\n\nOnce more 27×.\n<!-- given: x ==> 3 -->\n";
        assert_eq!(lint(text), ["9:27×"]);
        // Nor by a marker past a heading.
        let text = "It ran 27× faster.\n\n## Next\n\n<!-- check-json: b.json /r ==> 27 -->\n";
        assert_eq!(lint(text), ["1:27×"]);
    }

    #[test]
    fn both_ends_of_a_range_and_more_decimals_than_quoted_fail() {
        let text = "From 44.8–69.0% and 2.31 ms.\n<!-- given: setting ==> 44.8 ==> 2.3 -->\n";
        assert_eq!(lint(text), ["1:44.8–69.0%", "1:2.31 ms"]);
    }

    #[test]
    fn code_and_comments_are_not_prose() {
        let text = "```sh\nkvlab mem # 39 MiB\n```\n<!--\n12 ms\n-->\nUse `-n 16 ms`.\n";
        assert!(lint(text).is_empty(), "{:?}", lint(text));
    }
}

//! The build-up's promise, checked: between two consecutive steps, every added line of code is
//! marked `NEW (step N)`, and the diffs the chapter shows (docs/build-up/diffs/*.diff, included
//! by docs/src/build-up.md) are the diffs of the sources as they are now.
//!
//! A marker covers its own line; a marker on a line of its own (`// NEW (step N): why`) also
//! covers the lines below it down to the next blank line. Comment-only lines and lone closing
//! brackets need no marker. After changing a step, regenerate the diffs with
//! `KVLAB_BLESS=1 cargo test -p kvlab-build-up --test diffs`.

use std::path::{Path, PathBuf};

const STEPS: [&str; 6] = [
    "step1_no_cache",
    "step2_kv_cache",
    "step3_positions",
    "step4_decode_one",
    "step5_preallocated",
    "step6_sliding_window",
];

fn crate_dir() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
}

fn source(step: &str) -> String {
    let path = crate_dir().join("src/bin").join(format!("{step}.rs"));
    std::fs::read_to_string(&path).unwrap_or_else(|e| panic!("{}: {e}", path.display()))
}

/// One line of a line diff.
#[derive(Clone, Copy, PartialEq, Debug)]
enum Line<'a> {
    Same(&'a str),
    Removed(&'a str),
    Added(&'a str),
}

/// A shortest line diff of `a` to `b`, through their longest common subsequence.
fn line_diff<'a>(a: &[&'a str], b: &[&'a str]) -> Vec<Line<'a>> {
    let (n, m) = (a.len(), b.len());
    // lcs[i][j]: the longest common subsequence of a[i..] and b[j..]. (n + 1, m + 1)
    let mut lcs = vec![vec![0usize; m + 1]; n + 1];
    for i in (0..n).rev() {
        for j in (0..m).rev() {
            lcs[i][j] = if a[i] == b[j] {
                lcs[i + 1][j + 1] + 1
            } else {
                lcs[i + 1][j].max(lcs[i][j + 1])
            };
        }
    }
    let (mut i, mut j, mut out) = (0, 0, Vec::new());
    while i < n || j < m {
        if i < n && j < m && a[i] == b[j] {
            out.push(Line::Same(a[i]));
            (i, j) = (i + 1, j + 1);
        } else if i < n && (j == m || lcs[i + 1][j] >= lcs[i][j + 1]) {
            // Removals first within a change, as diff -u prints them.
            out.push(Line::Removed(a[i]));
            i += 1;
        } else {
            out.push(Line::Added(b[j]));
            j += 1;
        }
    }
    out
}

/// The lines after a file's `//!` header and the blank line that ends it, and how many were
/// skipped: the chapter says in prose what each header says.
fn body(text: &str) -> (Vec<&str>, usize) {
    let lines: Vec<&str> = text.lines().collect();
    let skip = lines.iter().take_while(|l| l.starts_with("//!")).count();
    let skip = skip + usize::from(lines.get(skip).is_some_and(|l| l.is_empty()));
    (lines[skip..].to_vec(), skip)
}

/// `diff -u`'s format, 3 lines of context, without timestamps, of the files' bodies (line
/// numbers are the files').
fn unified(from: &str, to: &str, a: &str, b: &str) -> String {
    let ((la, skip_a), (lb, skip_b)) = (body(a), body(b));
    let d = line_diff(&la, &lb);
    let mut out = format!("--- {from}\n+++ {to}\n");
    let changed: Vec<usize> = (0..d.len())
        .filter(|&k| !matches!(d[k], Line::Same(_)))
        .collect();
    let mut k = 0;
    while k < changed.len() {
        // A hunk: changes at most 2 × 3 unchanged lines apart share one.
        let mut end = k;
        while end + 1 < changed.len() && changed[end + 1] - changed[end] <= 7 {
            end += 1;
        }
        let lo = changed[k].saturating_sub(3);
        let hi = (changed[end] + 4).min(d.len());
        // Line numbers (1-based) where the hunk starts in a and in b.
        let before = &d[..lo];
        let a0 = before
            .iter()
            .filter(|l| !matches!(l, Line::Added(_)))
            .count();
        let b0 = before
            .iter()
            .filter(|l| !matches!(l, Line::Removed(_)))
            .count();
        let hunk = &d[lo..hi];
        let na = hunk.iter().filter(|l| !matches!(l, Line::Added(_))).count();
        let nb = hunk
            .iter()
            .filter(|l| !matches!(l, Line::Removed(_)))
            .count();
        out += &format!(
            "@@ -{},{na} +{},{nb} @@\n",
            skip_a + a0 + 1,
            skip_b + b0 + 1
        );
        for l in hunk {
            let (sign, text) = match l {
                Line::Same(t) => (' ', t),
                Line::Removed(t) => ('-', t),
                Line::Added(t) => ('+', t),
            };
            out += &format!("{sign}{text}\n");
        }
        k = end + 1;
    }
    out
}

fn marker_step(line: &str) -> Option<usize> {
    let rest = line.split("NEW (step ").nth(1)?;
    rest.split(')').next()?.parse().ok()
}

fn needs_no_marker(line: &str) -> bool {
    let t = line.trim();
    t.is_empty() || t.starts_with("//") || t.chars().all(|c| "}]);,".contains(c))
}

#[test]
fn every_added_line_is_marked_with_its_step() {
    let mut problems = Vec::new();
    for (n, pair) in STEPS.windows(2).enumerate() {
        let step = n + 2;
        let (a, b) = (source(pair[0]), source(pair[1]));
        let (la, lb): (Vec<&str>, Vec<&str>) = (a.lines().collect(), b.lines().collect());
        // Marker coverage of step N's file, line by line.
        let mut covered = vec![false; lb.len()];
        let mut paragraph = false;
        for (i, l) in lb.iter().enumerate() {
            if l.trim().is_empty() {
                paragraph = false;
            }
            if marker_step(l) == Some(step) {
                covered[i] = true;
                if l.trim().starts_with("// NEW (step") {
                    paragraph = true;
                }
            }
            covered[i] |= paragraph;
        }
        let mut i = 0; // line index in b
        for l in line_diff(&la, &lb) {
            match l {
                Line::Same(_) => i += 1,
                Line::Removed(_) => {}
                Line::Added(text) => {
                    if let Some(s) = marker_step(text).filter(|&s| s != step) {
                        problems.push(format!(
                            "{}.rs:{}: an added line marked step {s}: {text}",
                            pair[1],
                            i + 1
                        ));
                    }
                    if !covered[i] && !needs_no_marker(text) {
                        problems.push(format!(
                            "{}.rs:{}: added but not marked NEW (step {step}): {text}",
                            pair[1],
                            i + 1
                        ));
                    }
                    i += 1;
                }
            }
        }
        if !lb.iter().any(|l| marker_step(l) == Some(step)) {
            problems.push(format!("{}.rs has no NEW (step {step}) marker", pair[1]));
        }
    }
    assert!(problems.is_empty(), "\n{}", problems.join("\n"));
}

#[test]
fn no_step_mentions_a_later_one() {
    for (n, step) in STEPS.iter().enumerate() {
        for (i, l) in source(step).lines().enumerate() {
            if let Some(s) = marker_step(l) {
                assert!(
                    (2..=n + 1).contains(&s),
                    "{step}.rs:{}: marked step {s}",
                    i + 1
                );
            }
        }
    }
}

/// The chapter's diffs are the sources' diffs (after their headers); KVLAB_BLESS=1 rewrites them.
#[test]
fn the_chapters_diffs_are_current() {
    let dir = crate_dir().join("diffs");
    let bless = std::env::var("KVLAB_BLESS").as_deref() == Ok("1");
    let mut stale = Vec::new();
    for pair in STEPS.windows(2) {
        let (from, to) = (
            format!("src/bin/{}.rs", pair[0]),
            format!("src/bin/{}.rs", pair[1]),
        );
        let want = unified(&from, &to, &source(pair[0]), &source(pair[1]));
        let path: PathBuf = dir.join(format!("{}.diff", pair[1]));
        if bless {
            std::fs::create_dir_all(&dir).unwrap();
            std::fs::write(&path, &want).unwrap();
        } else if std::fs::read_to_string(&path).ok().as_deref() != Some(want.as_str()) {
            stale.push(rel(&path));
        }
    }
    assert!(
        stale.is_empty(),
        "{stale:?} no longer match the sources: KVLAB_BLESS=1 cargo test -p kvlab-build-up --test diffs"
    );
}

fn rel(p: &Path) -> String {
    p.strip_prefix(crate_dir())
        .unwrap_or(p)
        .display()
        .to_string()
}

#[test]
fn the_diff_of_a_small_change_reads_like_diff_u() {
    let a = "a\nb\nc\nd\ne\nf\ng\nh\n";
    let b = "a\nb\nc\nd\nE\nf\ng\nh\ni\n";
    assert_eq!(
        unified("x", "y", a, b),
        "--- x\n+++ y\n@@ -2,7 +2,8 @@\n b\n c\n d\n-e\n+E\n f\n g\n h\n+i\n"
    );
}

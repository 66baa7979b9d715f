//! The recorded runs a chapter quotes are named in it, and marked as history once the code they
//! measured has changed.
//!
//! For every JSON record a chapter's `check-json` markers read, its prose must name the machine
//! (the record's CPU or GPU), the date (`YYYY-MM-DD`) and, where the record holds one, the commit
//! (its first 7 hex digits). A record made before the last change to `crates/` (by its commit
//! when it has one, else by its date) measured code that no longer exists as it was: the
//! paragraph naming its date must then also say `history`.

use std::collections::HashMap;
use std::path::Path;

use anyhow::{Context, Result};
use serde_json::Value;

use super::check::{Check, Marker};

/// What a record says about where and when it was made.
#[derive(Debug, Clone, PartialEq)]
pub struct Record {
    /// Relative to the workspace root, e.g. `benches/tiers.json`.
    pub file: String,
    /// As the chapter should name it, e.g. "AMD EPYC", "Intel Xeon", "NVIDIA H100 80GB HBM3".
    pub machine: String,
    /// `YYYY-MM-DD`.
    pub date: String,
    /// First 7 hex digits, where the record holds a commit.
    pub commit: Option<String>,
}

/// The first `YYYY-MM-DD` in `s`.
fn date_in(s: &str) -> Option<String> {
    s.as_bytes().windows(10).find_map(|w| {
        let ok = w.iter().enumerate().all(|(i, c)| match i {
            4 | 7 => *c == b'-',
            _ => c.is_ascii_digit(),
        });
        ok.then(|| String::from_utf8_lossy(w).into_owned())
    })
}

/// "Intel(R) Xeon(R) Processor" as prose writes it: "Intel Xeon".
fn plain_cpu(model: &str) -> String {
    model
        .replace("(R)", "")
        .replace("(TM)", "")
        .split_whitespace()
        .filter(|w| !matches!(*w, "Processor" | "CPU"))
        .collect::<Vec<_>>()
        .join(" ")
}

/// Reads `file` (under `root`) and what it says about its machine, date and commit.
///
/// # Errors
/// The file is unreadable or not JSON, or it names no machine or no date (neither inside nor
/// in its path).
pub fn describe(root: &Path, file: &str) -> Result<Record> {
    let text =
        std::fs::read_to_string(root.join(file)).with_context(|| format!("reading {file}"))?;
    let json: Value = serde_json::from_str(&text).with_context(|| format!("parsing {file}"))?;
    let (machine, date, commit) = match json.get("machine") {
        Some(Value::Object(m)) => (
            m.get("cpu_model").and_then(Value::as_str).map(plain_cpu),
            m.get("date_utc").and_then(Value::as_str).and_then(date_in),
            m.get("git_commit")
                .and_then(Value::as_str)
                .map(str::to_string),
        ),
        // The side benches' one line: "AMD EPYC (2 logical CPUs), load 1.5 ..., DATE[, commit C]".
        Some(Value::String(line)) => (
            line.split(" (").next().map(plain_cpu),
            date_in(line),
            line.split("commit ").nth(1).map(|c| c.trim().to_string()),
        ),
        // A GPU record names its device; the folder it lives in, its date.
        _ => (
            json.pointer("/device/name")
                .and_then(Value::as_str)
                .map(str::to_string),
            date_in(file),
            None,
        ),
    };
    Ok(Record {
        file: file.to_string(),
        machine: machine.with_context(|| format!("{file} names no machine"))?,
        date: date.with_context(|| format!("{file} has no date"))?,
        commit: commit.map(|c| {
            c.chars()
                .take_while(char::is_ascii_hexdigit)
                .take(7)
                .collect()
        }),
    })
}

/// Whether `crates/` changed after the record was made: after its commit, or after its date
/// when it has none; `None` where git cannot tell (no git, a shallow clone without the record's
/// commit or without the history of `crates/`), and then the book does not judge it.
pub fn stale(root: &Path, r: &Record) -> Option<bool> {
    let git = |args: &[&str]| crate::bench::machine::cmd_in(root, "git", args);
    // A shallow clone knows too little history to say.
    if git(&["rev-parse", "--is-shallow-repository"]).is_none_or(|s| s != "false") {
        return None;
    }
    match &r.commit {
        Some(c) => git(&["log", "--format=%h", &format!("{c}..HEAD"), "--", "crates"])
            .map(|changes| !changes.is_empty()),
        None => git(&["log", "-1", "--format=%cs", "--", "crates"])
            .filter(|last| !last.is_empty())
            .map(|last| last.as_str() > r.date.as_str()),
    }
}

/// The records read so far, by file, each with whether it is stale ([`stale`]; `None`: git
/// cannot tell), so that a record several chapters quote is read and judged once.
pub type Described = HashMap<String, (Record, Option<bool>)>;

/// The records `markers` (one chapter's) read, each once, described through `cache`.
///
/// # Errors
/// As [`describe`].
pub fn quoted(
    root: &Path,
    markers: &[Marker],
    cache: &mut Described,
) -> Result<Vec<(Record, Option<bool>)>> {
    let mut out: Vec<(Record, Option<bool>)> = Vec::new();
    for m in markers {
        let Check::Json {
            file: Some(file), ..
        } = &m.check
        else {
            continue;
        };
        if out.iter().any(|(r, _)| &r.file == file) {
            continue;
        }
        if !cache.contains_key(file) {
            let r = describe(root, file)?;
            let stale = stale(root, &r);
            cache.insert(file.clone(), (r, stale));
        }
        out.extend(cache.get(file).cloned());
    }
    Ok(out)
}

/// What `text` (one chapter) fails to say about the records it quotes: each missing name, and
/// each stale record whose date's paragraph does not say `history`.
pub fn unnamed(text: &str, records: &[(Record, Option<bool>)]) -> Vec<String> {
    let paragraphs: Vec<&str> = text.split("\n\n").collect();
    let mut out = Vec::new();
    for (r, stale) in records {
        let mut missing: Vec<&str> = Vec::new();
        if !text.contains(&r.machine) {
            missing.push(&r.machine);
        }
        if !text.contains(&r.date) {
            missing.push(&r.date);
        }
        if let Some(c) = &r.commit
            && !text.contains(c.as_str())
        {
            missing.push(c);
        }
        if !missing.is_empty() {
            out.push(format!(
                "{} is quoted but the chapter does not name {missing:?}",
                r.file
            ));
        } else if *stale == Some(true)
            && !paragraphs
                .iter()
                .any(|p| p.contains(&r.date) && p.contains("history"))
        {
            out.push(format!(
                "{} ({}) measured code that has changed since: the paragraph naming its date must call it history, or re-run it",
                r.file, r.date
            ));
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use std::process::Command;

    use super::*;

    fn record(commit: Option<&str>) -> Record {
        Record {
            file: "benches/x.json".into(),
            machine: "AMD EPYC".into(),
            date: "2026-11-24".into(),
            commit: commit.map(str::to_string),
        }
    }

    #[test]
    fn reads_both_machine_forms_and_a_gpu_folder() {
        let dir = tempfile::tempdir().unwrap();
        let write = |name: &str, json: &str| {
            std::fs::create_dir_all(dir.path().join(name).parent().unwrap()).unwrap();
            std::fs::write(dir.path().join(name), json).unwrap();
        };
        write(
            "a.json",
            r#"{"machine": {"cpu_model": "Intel(R) Xeon(R) Processor", "date_utc": "2026-11-21T12:15:11Z", "git_commit": "ed910d30f729+dirty"}}"#,
        );
        write(
            "b.json",
            r#"{"machine": "AMD EPYC (2 logical CPUs), load 1.5 at the start, 2026-11-27T00:57:47Z, commit 1c14262abcd"}"#,
        );
        write(
            "h100-2026-11-26/c.json",
            r#"{"device": {"name": "NVIDIA H100 80GB HBM3"}}"#,
        );
        let a = describe(dir.path(), "a.json").unwrap();
        assert_eq!(
            (a.machine.as_str(), a.date.as_str()),
            ("Intel Xeon", "2026-11-21")
        );
        assert_eq!(a.commit.as_deref(), Some("ed910d3"));
        let b = describe(dir.path(), "b.json").unwrap();
        assert_eq!(
            (b.machine.as_str(), b.date.as_str()),
            ("AMD EPYC", "2026-11-27")
        );
        assert_eq!(b.commit.as_deref(), Some("1c14262"));
        let c = describe(dir.path(), "h100-2026-11-26/c.json").unwrap();
        assert_eq!(
            (c.machine.as_str(), c.date.as_str()),
            ("NVIDIA H100 80GB HBM3", "2026-11-26")
        );
        assert_eq!(c.commit, None);
        write("d.json", r#"{"rows": []}"#);
        assert!(describe(dir.path(), "d.json").is_err());
    }

    #[test]
    fn a_chapter_must_name_machine_date_and_commit() {
        let named = "Recorded on an AMD EPYC, 2026-11-24, at commit 1c14262.";
        assert!(unnamed(named, &[(record(Some("1c14262")), Some(false))]).is_empty());
        let err = unnamed(
            "Recorded on 2026-11-24.",
            &[(record(Some("1c14262")), Some(false))],
        );
        assert_eq!(err.len(), 1);
        assert!(
            err[0].contains("AMD EPYC") && err[0].contains("1c14262"),
            "{err:?}"
        );
    }

    #[test]
    fn a_stale_record_must_be_called_history_where_its_date_is() {
        let r = [(record(None), Some(true))];
        assert_eq!(unnamed("An AMD EPYC, 2026-11-24.", &r).len(), 1);
        assert!(unnamed("An AMD EPYC, 2026-11-24: history now.", &r).is_empty());
        // "history" elsewhere does not count.
        assert_eq!(
            unnamed("An AMD EPYC, 2026-11-24.\n\nSome history.", &r).len(),
            1
        );
    }

    #[test]
    fn staleness_follows_crates_and_is_not_judged_in_a_shallow_clone() {
        let dir = tempfile::tempdir().unwrap();
        let repo = dir.path().join("repo");
        let git = |at: &Path, args: &[&str]| {
            let out = Command::new("git")
                .args([
                    "-c",
                    "user.name=t",
                    "-c",
                    "user.email=t@t",
                    "-c",
                    "commit.gpgsign=false",
                ])
                .args(args)
                .current_dir(at)
                .output()
                .unwrap();
            assert!(
                out.status.success(),
                "git {args:?}: {}",
                String::from_utf8_lossy(&out.stderr)
            );
            String::from_utf8_lossy(&out.stdout).trim().to_string()
        };
        std::fs::create_dir_all(repo.join("crates")).unwrap();
        git(&repo, &["init", "-q"]);
        std::fs::write(repo.join("crates/a.rs"), "1").unwrap();
        git(&repo, &["add", "."]);
        git(&repo, &["commit", "-q", "-m", "one"]);
        let first = git(&repo, &["rev-parse", "--short=7", "HEAD"]);
        let at = |commit: &str| Record {
            commit: Some(commit.to_string()),
            ..record(None)
        };
        assert_eq!(stale(&repo, &at(&first)), Some(false));
        std::fs::write(repo.join("crates/a.rs"), "2").unwrap();
        git(&repo, &["commit", "-q", "-am", "two"]);
        assert_eq!(stale(&repo, &at(&first)), Some(true));
        let url = format!("file://{}", repo.display());
        git(
            dir.path(),
            &["clone", "-q", "--depth", "1", &url, "shallow"],
        );
        assert_eq!(stale(&dir.path().join("shallow"), &at(&first)), None);
    }
}

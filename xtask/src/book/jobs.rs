//! What `cargo xtask book` runs: every shell block of every chapter, not only "Reproduce it".
//!
//! A "Reproduce it" block is a list of commands, each run on its own and named by its text. Any
//! other ```` ```sh ```` block (the build-up's steps, a walkthrough that starts a server and
//! sends it requests) runs whole, as one bash script, named by its first line: that is what
//! a `check:` marker names to check its output. Each script runs with `set -eo pipefail` (a
//! failing line fails it) and with `diff` counting "files differ" (exit 1) as success, in a
//! process group of its own that is killed when the script ends, so a server a walkthrough
//! starts with `&` never outlives it. A line ending in `|| true` is refused: it would hide the
//! failure the run exists to find.

use std::io::Read;
use std::os::unix::process::CommandExt;
use std::path::Path;
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use anyhow::{Context, Result, bail};

/// One thing to run: a "Reproduce it" command or a whole block.
#[derive(Debug, Clone, PartialEq)]
pub struct Job {
    /// The chapter, e.g. `paging.md`.
    pub file: String,
    /// 1-based line of the command, or of the block's first line.
    pub line: usize,
    /// How markers and `KVLAB_BOOK_SKIP` name it: the command, or the block's first line.
    pub key: String,
    /// What bash runs.
    pub script: String,
}

/// Prepended to every script: fail on the first failing line, and let `diff` show differences.
const PRELUDE: &str = "set -eo pipefail\ndiff() { command diff \"$@\" || [ $? -eq 1 ]; }\n";

/// The most one job may take, in seconds: the longest bench the book names takes ~13 minutes.
const TIMEOUT_S: u64 = 1800;

/// The ```` ```sh ```` blocks of `text`: the "Reproduce it" block as one job per command, every
/// other block as one job.
///
/// # Errors
/// No "Reproduce it" block, an unclosed block, or a line ending in `|| true`.
pub fn jobs(file: &str, text: &str) -> Result<Vec<Job>> {
    let mut out = Vec::new();
    let mut in_reproduce = false;
    let mut saw_reproduce = false;
    let mut block: Option<(usize, Vec<String>)> = None;
    for (i, raw) in text.lines().enumerate() {
        let line = raw.trim_end();
        if block.is_none() && line.starts_with("## ") {
            in_reproduce = line == "## Reproduce it";
        }
        match (&mut block, line.trim_start()) {
            (None, "```sh") => block = Some((i + 2, Vec::new())),
            (Some(_), "```") => {
                let Some((first, lines)) = block.take() else {
                    continue;
                };
                for (k, l) in lines.iter().enumerate() {
                    if l.trim_end().ends_with("|| true") {
                        bail!(
                            "docs/src/{file}:{}: `{}` ends in `|| true`, which hides its failure; \
                             let the book see it fail",
                            first + k,
                            l.trim()
                        );
                    }
                }
                let mut commands = lines
                    .iter()
                    .enumerate()
                    .filter_map(|(k, l)| command(l).map(|c| (first + k, c)));
                let job = |line, key: &str, script: String| Job {
                    file: file.to_string(),
                    line,
                    key: key.to_string(),
                    script,
                };
                if in_reproduce {
                    saw_reproduce = true;
                    out.extend(commands.map(|(line, c)| job(line, c, c.to_string())));
                } else if let Some((line, key)) = commands.next() {
                    out.push(job(line, key, lines.join("\n")));
                }
            }
            (Some((_, lines)), _) => lines.push(raw.to_string()),
            (None, _) => {}
        }
    }
    if let Some((first, _)) = block {
        bail!(
            "docs/src/{file}:{}: a ```sh block is never closed",
            first - 1
        )
    }
    if !saw_reproduce {
        bail!("docs/src/{file} has no ```sh block under \"## Reproduce it\"")
    }
    Ok(out)
}

/// A block's line as a command: trimmed, unless it is blank or a comment.
fn command(line: &str) -> Option<&str> {
    let line = line.trim();
    (!line.is_empty() && !line.starts_with('#')).then_some(line)
}

/// Why `job` cannot run on this machine: it names the CUDA engine and `nvidia-smi -L` lists no
/// GPU. `None` when it needs none or one is here.
pub fn needs_gpu(job: &Job) -> Option<String> {
    if !job.script.contains("--engine cuda") {
        return None;
    }
    let listed = Command::new("nvidia-smi")
        .arg("-L")
        .output()
        .is_ok_and(|o| o.status.success() && !o.stdout.is_empty());
    (!listed).then(|| "needs an NVIDIA GPU (nvidia-smi -L lists none)".to_string())
}

/// Runs `job` from `root`; returns whether it succeeded and what it printed (standard output,
/// then standard error, where kvlab prints its statistics).
///
/// # Errors
/// bash cannot start, the output files cannot be made or read, or the job runs past its time
/// (then its process group is killed).
pub fn run(job: &Job, root: &Path) -> Result<(bool, String)> {
    let mut stdout = tempfile::tempfile().context("a file for the job's output")?;
    let mut stderr = tempfile::tempfile().context("a file for the job's errors")?;
    // Commands run `cargo run`; they build as from the shell (see without_cargo_run_env).
    let mut child = crate::verify::without_cargo_run_env(&mut Command::new("bash"))
        .arg("-c")
        .arg(format!("{PRELUDE}{}", job.script))
        .current_dir(root)
        .stdin(Stdio::null())
        .stdout(stdout.try_clone()?)
        .stderr(stderr.try_clone()?)
        // Its own process group, so that what it starts in the background is killed with it.
        .process_group(0)
        .spawn()
        .with_context(|| format!("starting bash for {}", job.key))?;
    let group = child.id();
    let start = Instant::now();
    let status = loop {
        if let Some(status) = child.try_wait()? {
            break Some(status);
        }
        if start.elapsed() > Duration::from_secs(TIMEOUT_S) {
            break None;
        }
        std::thread::sleep(Duration::from_millis(50));
    };
    // Whatever it left running (servers started with `&`) goes with it.
    let _ = Command::new("kill")
        .args(["-TERM", "--", &format!("-{group}")])
        .stderr(Stdio::null())
        .status();
    let _ = child.wait();
    let Some(status) = status else {
        bail!(
            "docs/src/{}:{}: `{}` ran past {TIMEOUT_S} s and was stopped",
            job.file,
            job.line,
            job.key
        )
    };
    let read = |f: &mut std::fs::File| -> Result<String> {
        use std::io::Seek;
        let mut s = Vec::new();
        f.rewind()?;
        f.read_to_end(&mut s)?;
        Ok(String::from_utf8_lossy(&s).into_owned())
    };
    let printed = format!("{}\n{}", read(&mut stdout)?, read(&mut stderr)?);
    Ok((status.success(), printed))
}

#[cfg(test)]
mod tests {
    use super::*;

    const CHAPTER: &str = "# T\n\n```sh\ncargo run --bin step1\ndiff -u a b\n```\n\n\
        ## Reproduce it\n\n```sh\n# a comment\nkvlab mem\n\nkvlab waste\n```\n";

    #[test]
    fn a_block_is_one_job_and_reproduce_is_one_per_command() {
        let jobs = jobs("t.md", CHAPTER).unwrap();
        let keys: Vec<(&str, usize)> = jobs.iter().map(|j| (j.key.as_str(), j.line)).collect();
        assert_eq!(
            keys,
            [
                ("cargo run --bin step1", 4),
                ("kvlab mem", 12),
                ("kvlab waste", 14)
            ]
        );
        assert_eq!(jobs[0].script, "cargo run --bin step1\ndiff -u a b");
    }

    #[test]
    fn or_true_and_a_missing_reproduce_block_are_refused() {
        let err = jobs("t.md", &CHAPTER.replace("kvlab waste", "kvlab gpu || true"))
            .unwrap_err()
            .to_string();
        assert!(err.contains("t.md:14") && err.contains("|| true"), "{err}");
        assert!(jobs("t.md", "```sh\nls\n```\n").is_err());
        assert!(jobs("t.md", "## Reproduce it\n```sh\nls\n").is_err());
    }

    #[test]
    fn a_script_fails_on_its_first_failing_line_but_not_on_a_diff() {
        let dir = tempfile::tempdir().unwrap();
        let job = |script: &str| Job {
            file: "t.md".into(),
            line: 1,
            key: "k".into(),
            script: script.into(),
        };
        std::fs::write(dir.path().join("a"), "1\n").unwrap();
        std::fs::write(dir.path().join("b"), "2\n").unwrap();
        let (ok, out) = run(&job("diff -u a b\necho after"), dir.path()).unwrap();
        assert!(ok, "{out}");
        assert!(out.contains("+2") && out.contains("after"), "{out}");
        let (ok, out) = run(&job("false\necho after"), dir.path()).unwrap();
        assert!(!ok && !out.contains("after"), "{out}");
        let (ok, _) = run(&job("diff -u a missing"), dir.path()).unwrap();
        assert!(!ok, "diff's trouble (exit 2) is a failure");
    }

    #[test]
    fn what_a_script_starts_in_the_background_ends_with_it() {
        let dir = tempfile::tempdir().unwrap();
        let job = Job {
            file: "t.md".into(),
            line: 1,
            key: "k".into(),
            script: "sleep 300 &\necho $! > pid".into(),
        };
        let (ok, _) = run(&job, dir.path()).unwrap();
        assert!(ok);
        let pid = std::fs::read_to_string(dir.path().join("pid")).unwrap();
        std::thread::sleep(Duration::from_millis(200));
        // Gone, or a zombie waiting for init to reap it.
        let alive = std::fs::read_to_string(format!("/proc/{}/stat", pid.trim()))
            .is_ok_and(|stat| !stat.contains(") Z "));
        assert!(!alive, "the background sleep outlived its script");
    }
}

//! `cargo xtask book`: builds the mdBook in docs/ (when mdbook is installed), runs every shell
//! block of every chapter (`jobs.rs`: each "Reproduce it" command, and every other block as a
//! script, servers and all), and checks every figure the prose quotes against
//! the output it comes from (the markers of `check.rs`), so a number that drifts fails the build;
//! a figure in prose without a marker fails it too (`lint.rs`).
//! `KVLAB_BOOK_SKIP="cmd1; cmd2"` leaves out commands the caller has just run itself (a command
//! a check marker needs is run anyway). `--check-only` skips the HTML build and runs only the
//! commands the markers need. A command that names a model of `fixtures/models.json` whose
//! files are not on this machine (Gemma 3 270M without `KVLAB_MODELS`) is SKIPPED with how to
//! get them, and its figures with it, as `cargo xtask verify` skips what is missing; with
//! `KVLAB_REQUIRE_MODELS=1` (CI) it is a failure. A command of the CUDA engine is SKIPPED on a
//! machine without an NVIDIA GPU, and says so.

mod check;
mod jobs;
mod lint;
mod records;

use std::collections::HashMap;
use std::process::Command;
use std::time::Instant;

use anyhow::{Context, Result, bail};

use crate::paths::{self, workspace_root};

/// One chapter: its file name, the jobs its shell blocks make, its check markers and the
/// figures in its prose that no marker quotes.
struct Chapter {
    file: String,
    jobs: Vec<jobs::Job>,
    markers: Vec<check::Marker>,
    unmarked: Vec<lint::Unmarked>,
    /// What the chapter fails to say about the records it quotes (`records.rs`).
    unnamed: Vec<String>,
}

/// Every chapter of SUMMARY.md, in book order; a check marker whose command is not one of its
/// chapter's jobs is an error (the reader must be able to run it).
fn chapters() -> Result<Vec<Chapter>> {
    let src = paths::docs_src();
    let summary =
        std::fs::read_to_string(src.join("SUMMARY.md")).context("reading docs/src/SUMMARY.md")?;
    let root = workspace_root();
    let mut described = records::Described::new();
    let mut out = Vec::new();
    for file in summary
        .lines()
        .filter_map(|l| l.split("](").nth(1))
        .filter_map(|r| r.strip_suffix(')'))
    {
        let text = std::fs::read_to_string(src.join(file))
            .with_context(|| format!("reading docs/src/{file}"))?;
        let jobs = jobs::jobs(file, &text)?;
        let markers = check::parse(file, &text)?;
        for m in &markers {
            if let check::Check::Output { cmd, .. } = &m.check
                && !jobs.iter().any(|j| &j.key == cmd)
            {
                bail!(
                    "docs/src/{file}:{}: `{cmd}` is checked but is neither a command of the chapter's Reproduce it block nor the first line of one of its shell blocks",
                    m.line
                );
            }
        }
        let unmarked = lint::unmarked(&text, &markers);
        let quoted = records::quoted(&root, &markers, &mut described)?;
        let unnamed = records::unnamed(&text, &quoted);
        out.push(Chapter {
            file: file.to_string(),
            jobs,
            markers,
            unmarked,
            unnamed,
        });
    }
    let unjudged: Vec<&String> = described
        .iter()
        .filter(|(_, (_, stale))| stale.is_none())
        .map(|(file, _)| file)
        .collect();
    if !unjudged.is_empty() {
        eprintln!(
            "book: git cannot tell here whether these records predate the code they measure (a shallow clone?), so their staleness is not checked: {unjudged:?}"
        );
    }
    Ok(out)
}

/// `cargo xtask book`'s options.
#[derive(clap::Args)]
#[command(
    about = "mdbook build docs (if mdbook is on PATH), run every shell block of the book, and \
             check every figure marked in the prose against its command's output"
)]
pub struct Opts {
    /// No HTML build; run only the commands that check markers need
    #[arg(long)]
    check_only: bool,
}

/// `cargo xtask book` with its parsed options.
///
/// # Errors
/// mdbook failing, a chapter whose checked command is none of its jobs, a line ending in
/// `|| true`, a command or block that fails or runs past its time, a figure that differs from its command's output, or a missing model
/// under `KVLAB_REQUIRE_MODELS=1`.
pub fn run(o: Opts) -> Result<()> {
    let check_only = o.check_only;
    let root = workspace_root();
    if !check_only {
        build_html(&root)?;
    }
    let chapters = chapters()?;
    refuse_unmarked(&chapters)?;
    // Commands the caller already ran in this job (CI runs the bench smoke test on its own).
    let skip: Vec<String> = std::env::var("KVLAB_BOOK_SKIP")
        .unwrap_or_default()
        .split(';')
        .map(|s| s.trim().to_string())
        .filter(|s| !s.is_empty())
        .collect();
    let checked = |cmd: &String| {
        chapters
            .iter()
            .flat_map(|c| &c.markers)
            .any(|m| matches!(&m.check, check::Check::Output { cmd: c, .. } if c == cmd))
    };
    let mut todo: Vec<&jobs::Job> = Vec::new();
    for job in chapters.iter().flat_map(|c| &c.jobs) {
        let wanted = checked(&job.key) || (!check_only && !skip.contains(&job.key));
        // The same script once; a block that starts with another chapter's command but goes
        // on (a build-up step and its diff) still runs.
        if wanted && !todo.iter().any(|j| j.script == job.script) {
            todo.push(job);
        }
    }
    let mut failed = Vec::new();
    let require = std::env::var("KVLAB_REQUIRE_MODELS").is_ok_and(|v| v == "1");
    // Jobs left out because a model they name is missing (with how to get it) or no GPU is here.
    let mut skipped: Vec<(String, String)> = Vec::new();
    // What each job printed, stdout then stderr (kvlab prints statistics to stderr).
    let mut output: HashMap<String, String> = HashMap::new();
    let n = todo.len();
    for (i, job) in todo.iter().enumerate() {
        let (file, key) = (&job.file, &job.key);
        let missing = job
            .script
            .lines()
            .find_map(|l| missing_model(l, local_files));
        if let Some(why) = &missing {
            let verdict = if require { "FAIL" } else { "SKIPPED" };
            println!("book: [{}/{n}] {verdict} {file}: {key}: {why}", i + 1);
            if require {
                failed.push(key.clone());
            }
        }
        // CI has no GPU: that is reported, never a failure.
        let no_gpu = jobs::needs_gpu(job);
        if let (None, Some(why)) = (&missing, &no_gpu) {
            println!("book: [{}/{n}] SKIPPED {file}: {key}: {why}", i + 1);
        }
        if let Some(why) = missing.or(no_gpu) {
            skipped.push((key.clone(), why));
            continue;
        }
        let t = Instant::now();
        let (ok, printed) = jobs::run(job, &root)?;
        println!(
            "book: [{}/{n}] {} {:>6.1} s  {file}: {key}",
            i + 1,
            if ok { "ok  " } else { "FAIL" },
            t.elapsed().as_secs_f64()
        );
        if !ok {
            eprintln!("{printed}");
            failed.push(key.clone());
        }
        // Markers name a job by its key; when two jobs share it, both begin with that command.
        output.entry(key.clone()).or_insert(printed);
    }
    if !failed.is_empty() {
        bail!("{} of the book's commands failed: {failed:?}", failed.len());
    }
    println!("book: {} commands and blocks ran", n - skipped.len());
    for (cmd, why) in &skipped {
        println!("book: SKIPPED {cmd}: {why}");
    }

    let markers: Vec<&check::Marker> = chapters
        .iter()
        .flat_map(|c| &c.markers)
        .filter(|m| match &m.check {
            check::Check::Output { cmd, .. } => !skipped.iter().any(|(s, _)| s == cmd),
            check::Check::Json { .. } | check::Check::File { .. } => true,
            // Settings and outside sources: the lint needs them, there is nothing to run.
            check::Check::Given { .. } | check::Check::Source { .. } => false,
        })
        .collect();
    let mismatches: Vec<String> = markers
        .iter()
        .filter_map(|m| {
            match &m.check {
                check::Check::Output { cmd, .. } => check::verify_output(m, &output[cmd]),
                check::Check::Json { .. } => check::verify_json(m, &root),
                check::Check::File { .. } => check::verify_file(m, &root),
                check::Check::Given { .. } | check::Check::Source { .. } => Ok(()),
            }
            .err()
        })
        .collect();
    for e in &mismatches {
        eprintln!("book: {e}");
    }
    if !mismatches.is_empty() {
        bail!(
            "{} of {} figures quoted in the book no longer match their source",
            mismatches.len(),
            markers.len()
        );
    }
    println!(
        "book: all {} figures quoted in the book match their commands' output",
        markers.len()
    );
    Ok(())
}

/// Lists every figure in prose that no marker quotes and every record a chapter quotes without
/// naming it, and fails if there is one.
fn refuse_unmarked(chapters: &[Chapter]) -> Result<()> {
    let unnamed: Vec<String> = chapters
        .iter()
        .flat_map(|c| {
            c.unnamed
                .iter()
                .map(move |u| format!("docs/src/{}: {u}", c.file))
        })
        .collect();
    refuse(
        &unnamed,
        "record(s) quoted without their machine, date and commit, or stale without being called history",
    )?;
    let unmarked: Vec<String> = chapters
        .iter()
        .flat_map(|c| {
            c.unmarked.iter().map(move |u| {
                format!(
                    "docs/src/{}:{}: {:?} has no marker quoting it",
                    c.file, u.line, u.figure
                )
            })
        })
        .collect();
    refuse(
        &unmarked,
        "figure(s) in the book's prose have no marker: after their paragraph, add a check, \
         check-json, check-file or calc marker that verifies the figure, or a given (a setting) \
         or source (an outside figure) marker; xtask/src/book/check.rs says which is which",
    )
}

/// Prints each of `problems` and fails, saying how many and `what` they are, if there is one.
fn refuse(problems: &[String], what: &str) -> Result<()> {
    for p in problems {
        eprintln!("book: {p}");
    }
    if !problems.is_empty() {
        bail!("{} {what}", problems.len());
    }
    Ok(())
}

/// Why `cmd` cannot run here: the first manifest model it names with `--model`/`-m` whose
/// files `is_local` does not find, and how to get them; `None` when it names none missing
/// (paths and unknown names are left to the command).
fn missing_model(cmd: &str, is_local: impl Fn(&str) -> Result<(), String>) -> Option<String> {
    let words: Vec<&str> = cmd.split_whitespace().collect();
    words
        .windows(2)
        .filter(|w| w[0] == "--model" || w[0] == "-m")
        .map(|w| w[1].trim_matches(|c| c == '"' || c == '\''))
        .filter(|name| kvlab_model::registry::entry(name).is_some())
        .find_map(|name| {
            is_local(name)
                .err()
                .map(|how| format!("needs {name}: {how}"))
        })
}

/// Whether a manifest model's files are on this machine (`KVLAB_MODELS`, the user cache, the
/// shipped copy); the error says how to get the missing file. Nothing is downloaded.
fn local_files(name: &str) -> Result<(), String> {
    use kvlab_model::registry::{Located, locate};
    match locate(name) {
        Ok(Located::Ready { .. }) => Ok(()),
        Ok(Located::Missing { file, .. }) => {
            Err(format!("{} is missing; {}", file.file, file.how_to_get()))
        }
        Err(e) => Err(e.to_string()),
    }
}

fn build_html(root: &std::path::Path) -> Result<()> {
    match Command::new("mdbook")
        .arg("build")
        .arg("docs")
        .current_dir(root)
        .status()
    {
        Ok(s) if s.success() => println!("book: mdbook build docs: ok (target/book)"),
        Ok(s) => bail!("mdbook build docs failed ({s})"),
        Err(_) if std::env::var("CI").is_ok() => {
            bail!("mdbook is not installed: cargo install mdbook --no-default-features --locked")
        }
        Err(_) => eprintln!(
            "book: mdbook not installed, skipping the HTML build (cargo install mdbook --no-default-features --locked)"
        ),
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::{chapters, missing_model, refuse_unmarked};

    /// A planted wrong number and a planted unmarked one, each against a real record: the
    /// first fails its check, the second the lint.
    #[test]
    fn a_planted_wrong_number_and_a_planted_unmarked_one_each_fail() {
        use super::{check, lint};
        let root = crate::paths::workspace_root();
        let right = "The step took 1.41 ms.\n\n\
            <!-- check-json: benches/baseline.json /decode/0/step_ms/median/64 ==> 1.41 -->\n";
        let markers = check::parse("c.md", right).unwrap();
        assert!(lint::unmarked(right, &markers).is_empty());
        assert_eq!(check::verify_json(&markers[0], &root), Ok(()));
        let wrong = right.replace("1.41", "1.42");
        let markers = check::parse("c.md", &wrong).unwrap();
        assert!(lint::unmarked(&wrong, &markers).is_empty());
        assert!(check::verify_json(&markers[0], &root).is_err());
        let unmarked = format!("{right}\nThen it took 2.5 ms.\n");
        let markers = check::parse("c.md", &unmarked).unwrap();
        let found = lint::unmarked(&unmarked, &markers);
        assert_eq!(found.len(), 1);
        assert_eq!(found[0].figure, "2.5 ms");
    }

    /// The lint over the real book, so `cargo test` catches an unmarked figure before CI's
    /// `cargo xtask book` does.
    #[test]
    fn every_figure_in_the_book_has_a_marker() {
        let chapters = chapters().unwrap();
        assert!(chapters.len() > 10);
        refuse_unmarked(&chapters).unwrap();
    }

    #[test]
    fn a_command_naming_a_missing_model_is_skipped_with_how_to_get_it() {
        let gemma_missing = |name: &str| match name {
            "gemma-3-270m" => Err("get it from its upstream".to_string()),
            _ => Ok(()),
        };
        let why = missing_model(
            "cargo run --release -p kvlab-cli -- info --model gemma-3-270m",
            gemma_missing,
        );
        assert_eq!(
            why.as_deref(),
            Some("needs gemma-3-270m: get it from its upstream")
        );
        // -m, quotes; a present model, a path and a command without a model run as they are.
        assert!(missing_model("kvlab info -m 'gemma-3-270m'", gemma_missing).is_some());
        for cmd in [
            "kvlab info --model stories260K",
            "kvlab info -m fixtures/models/tiny-qwen3",
            "kvlab mem --preset gemma-3-270m",
            "cargo xtask bench --quick",
        ] {
            assert_eq!(missing_model(cmd, gemma_missing), None, "{cmd}");
        }
    }
}

//! `cargo xtask book`: builds the mdBook in docs/ (when mdbook is installed) and runs every
//! "Reproduce it" command of every chapter, so the numbers the book quotes stay reproducible.
//! `KVLAB_BOOK_SKIP="cmd1; cmd2"` leaves out commands the caller has just run itself.

use std::process::Command;
use std::time::Instant;

use anyhow::{Context, Result, bail};

use crate::verify::workspace_root;

/// The shell commands under each chapter's "## Reproduce it" heading, in book order.
fn reproduce_commands() -> Result<Vec<(String, String)>> {
    let src = workspace_root().join("docs/src");
    let summary =
        std::fs::read_to_string(src.join("SUMMARY.md")).context("reading docs/src/SUMMARY.md")?;
    let mut out = Vec::new();
    for file in summary
        .lines()
        .filter_map(|l| l.split("](").nth(1))
        .filter_map(|r| r.strip_suffix(')'))
    {
        let text = std::fs::read_to_string(src.join(file))
            .with_context(|| format!("reading docs/src/{file}"))?;
        let Some(section) = text.split("## Reproduce it").nth(1) else {
            bail!("docs/src/{file} has no \"## Reproduce it\" section")
        };
        let block = section
            .split("```sh")
            .nth(1)
            .and_then(|b| b.split("```").next())
            .with_context(|| format!("docs/src/{file}: no ```sh block under Reproduce it"))?;
        for cmd in block
            .lines()
            .map(str::trim)
            .filter(|l| !l.is_empty() && !l.starts_with('#'))
        {
            if !out.iter().any(|(_, c)| c == cmd) {
                out.push((file.to_string(), cmd.to_string()));
            }
        }
    }
    Ok(out)
}

pub fn run(args: &[String]) -> Result<()> {
    if args.iter().any(|a| a == "-h" || a == "--help") {
        println!(
            "cargo xtask book: mdbook build docs (if mdbook is on PATH), then run every \"Reproduce it\" command"
        );
        return Ok(());
    }
    let root = workspace_root();
    match Command::new("mdbook")
        .arg("build")
        .arg("docs")
        .current_dir(&root)
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
    // Commands the caller already ran in this job (CI runs the bench smoke test on its own).
    let skip: Vec<String> = std::env::var("KVLAB_BOOK_SKIP")
        .unwrap_or_default()
        .split(';')
        .map(|s| s.trim().to_string())
        .filter(|s| !s.is_empty())
        .collect();
    let cmds: Vec<(String, String)> = reproduce_commands()?
        .into_iter()
        .filter(|(_, c)| !skip.contains(c))
        .collect();
    let mut failed = Vec::new();
    for (i, (file, cmd)) in cmds.iter().enumerate() {
        let t = Instant::now();
        let out = Command::new("bash")
            .arg("-c")
            .arg(cmd)
            .current_dir(&root)
            .output()
            .with_context(|| format!("running {cmd}"))?;
        let ok = out.status.success();
        println!(
            "book: [{}/{}] {} {:>6.1} s  {file}: {cmd}",
            i + 1,
            cmds.len(),
            if ok { "ok  " } else { "FAIL" },
            t.elapsed().as_secs_f64()
        );
        if !ok {
            eprintln!("{}", String::from_utf8_lossy(&out.stderr));
            failed.push(cmd.clone());
        }
    }
    if !failed.is_empty() {
        bail!("{} reproduce command(s) failed: {failed:?}", failed.len());
    }
    println!("book: all {} reproduce commands ran", cmds.len());
    Ok(())
}

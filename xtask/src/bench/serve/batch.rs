//! The reference: `kvlab batch` on the same prompts and pool, its throughput.

use std::path::Path;
use std::process::Command;

use anyhow::{Context, Result, bail};
use serde_json::Value;

use super::{BLOCK_SIZE, BatchRef, Plan, PromptRef};
use crate::paths::workspace_root;

/// `kvlab batch` on the same prompts, all at step 0, the same pool, no prefix cache; its JSON
/// stats (stderr).
pub(super) fn run_batch(
    kvlab: &Path,
    plan: &Plan,
    refs: &[PromptRef],
    num_blocks: usize,
) -> Result<BatchRef> {
    let fixed = [
        "batch".to_string(),
        "-m".into(),
        plan.model.clone(),
        "-n".into(),
        plan.max_tokens.to_string(),
        "--arrival-gap".into(),
        "0".into(),
        "--num-blocks".into(),
        num_blocks.to_string(),
        "--block-size".into(),
        BLOCK_SIZE.to_string(),
        "--no-enable-prefix-caching".into(),
        "--json".into(),
    ];
    let mut cmd = Command::new(kvlab);
    cmd.args(&fixed).current_dir(workspace_root());
    for r in refs {
        cmd.args(["-p", &r.text]);
    }
    let out = cmd
        .output()
        .with_context(|| format!("running {} batch", kvlab.display()))?;
    let stderr = String::from_utf8_lossy(&out.stderr);
    if !out.status.success() {
        bail!("kvlab batch failed ({}):\n{stderr}", out.status);
    }
    let v: Value = stderr
        .lines()
        .rev()
        .find_map(|l| serde_json::from_str::<Value>(l.trim()).ok())
        .context("kvlab batch printed no JSON stats on stderr")?;
    let engine_s = v["engine_s"].as_f64().context("no engine_s")?;
    let wall_s = v["wall_s"].as_f64().context("no wall_s")?;
    let output_tokens: usize = refs.iter().map(|r| r.completion_tokens).sum();
    // stdout: "[i] (reason) prompt+completion", one line per prompt (a completion may hold
    // newlines, so each entry runs to the next "[i+1] (").
    let stdout = String::from_utf8_lossy(&out.stdout);
    let same_text = refs
        .iter()
        .filter(|r| {
            let start = stdout.find(&format!("[{}] (", r.index));
            let end = stdout.find(&format!("\n[{}] (", r.index + 1));
            start.is_some_and(|s| {
                let entry = &stdout[s..end.unwrap_or(stdout.len())];
                entry.trim_end().ends_with(r.completion.trim_end())
            })
        })
        .count();
    Ok(BatchRef {
        command: format!(
            "{} {} -p <the {} prompts>",
            kvlab.display(),
            fixed.join(" "),
            refs.len()
        ),
        engine_s,
        wall_s,
        output_tokens,
        output_tok_per_s: output_tokens as f64 / wall_s.max(1e-9),
        output_tok_per_s_engine: output_tokens as f64 / engine_s.max(1e-9),
        tokens_per_s_all: v["tokens_per_s"].as_f64().unwrap_or(f64::NAN),
        preemptions: v["preemptions"].as_f64().unwrap_or(0.0),
        prefix_cache_hits: v["prefix_cache_hits"].as_f64().unwrap_or(f64::NAN),
        same_text,
    })
}

//! `--baseline FILE`: compares this run's engine speedups with a stored run's.
//!
//! Only ratios are compared (ratios.rs): a baseline from another machine, or from this one on a
//! busier day, has different absolute times but, within noise, the same speedups. A ratio has
//! regressed when it fell by more than the noise both runs measured (their relative
//! half-spreads added), with a floor of `MIN_TOLERANCE`, because three repetitions on a shared
//! machine under-state the noise more often than not. Ratios of sub-millisecond timings are
//! reported but not judged. Keys carry the model's context, so a `--quick` run (shorter
//! contexts) compares only with a `--quick` baseline.

use std::path::Path;

use anyhow::{Context, Result};
use serde::{Deserialize, Serialize};

use super::ratios::Ratio;

/// The smallest relative change ever flagged: on this shared 2-core machine, two runs of the
/// same commit moved ratios by up to ~20 %.
pub const MIN_TOLERANCE: f64 = 0.25;
/// The floor when either side has fewer than 3 samples (quick runs, the naive engine's long
/// generations).
pub const FEW_SAMPLES_TOLERANCE: f64 = 0.5;
/// Ratios whose engine side took less than this (ms) in either run are shown, not judged.
pub const MIN_JUDGED_MS: f64 = 1.0;

/// One ratio compared.
#[derive(Clone, Debug, Serialize, Deserialize)]
pub struct Comparison {
    pub key: String,
    pub baseline: f64,
    pub now: f64,
    /// now / baseline − 1.
    pub change: f64,
    /// The relative change tolerated: max(MIN_TOLERANCE, baseline noise + this run's noise).
    pub tolerance: f64,
    /// "ok", "REGRESSED", "improved", or "too short to judge" (under `MIN_JUDGED_MS`).
    pub verdict: String,
}

/// The comparison with a stored run.
#[derive(Clone, Debug, Serialize, Deserialize)]
pub struct BaselineReport {
    pub file: String,
    pub baseline_machine: String,
    pub baseline_commit: String,
    pub baseline_date: String,
    pub same_cpu_model: bool,
    pub comparisons: Vec<Comparison>,
    /// Keys in only one of the two runs (not compared).
    pub only_in_baseline: Vec<String>,
    pub only_now: Vec<String>,
    pub regressions: usize,
}

#[derive(Deserialize)]
struct Stored {
    machine: super::machine::Machine,
    ratios: Vec<Ratio>,
}

/// Reads `file` (a bench.json) and compares its ratios with `now`.
pub fn compare(file: &Path, now: &[Ratio], cpu_model: &str) -> Result<BaselineReport> {
    let text = std::fs::read_to_string(file)
        .with_context(|| format!("reading baseline {}", file.display()))?;
    let stored: Stored = serde_json::from_str(&text).with_context(|| {
        format!(
            "{} is not a kvlab bench.json (format_version 1)",
            file.display()
        )
    })?;
    let mut comparisons = Vec::new();
    let mut only_in_baseline = Vec::new();
    for b in &stored.ratios {
        let Some(n) = now.iter().find(|n| n.key == b.key) else {
            only_in_baseline.push(b.key.clone());
            continue;
        };
        let change = n.value / b.value - 1.0;
        // With fewer than 3 samples on a side the spread says little about the noise.
        let floor = if b.n.min(n.n) < 3 {
            FEW_SAMPLES_TOLERANCE
        } else {
            MIN_TOLERANCE
        };
        let tolerance = (b.noise + n.noise).max(floor);
        let verdict = if b.engine_ms.min(n.engine_ms) < MIN_JUDGED_MS {
            "too short to judge"
        } else if change < -tolerance {
            "REGRESSED"
        } else if change > tolerance {
            "improved"
        } else {
            "ok"
        };
        comparisons.push(Comparison {
            key: b.key.clone(),
            baseline: b.value,
            now: n.value,
            change,
            tolerance,
            verdict: verdict.into(),
        });
    }
    let only_now = now
        .iter()
        .filter(|n| !stored.ratios.iter().any(|b| b.key == n.key))
        .map(|n| n.key.clone())
        .collect();
    Ok(BaselineReport {
        file: file.display().to_string(),
        baseline_machine: format!(
            "{} ({} logical CPUs, {})",
            stored.machine.cpu_model, stored.machine.logical_cpus, stored.machine.kvlab_simd
        ),
        baseline_commit: stored.machine.git_commit.clone(),
        baseline_date: stored.machine.date_utc.clone(),
        same_cpu_model: stored.machine.cpu_model == cpu_model,
        regressions: comparisons
            .iter()
            .filter(|c| c.verdict == "REGRESSED")
            .count(),
        comparisons,
        only_in_baseline,
        only_now,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ratio(key: &str, value: f64, noise: f64) -> Ratio {
        Ratio {
            key: key.into(),
            model: "m".into(),
            engine: "cpu".into(),
            reference: "naive".into(),
            what: "decode generation".into(),
            at: 256,
            value,
            min: value * (1.0 - noise),
            max: value * (1.0 + noise),
            noise,
            n: 3,
            engine_ms: 100.0,
        }
    }

    #[test]
    fn a_drop_beyond_the_noise_is_a_regression_and_within_it_is_not() {
        let stored = serde_json::json!({
            "machine": super::super::machine::Machine::default(),
            "ratios": [ratio("a", 40.0, 0.05), ratio("b", 40.0, 0.05), ratio("gone", 2.0, 0.0)],
        });
        let path =
            std::env::temp_dir().join(format!("kvlab-baseline-test-{}.json", std::process::id()));
        std::fs::write(&path, stored.to_string()).unwrap();
        // a: −30 % against a tolerance of max(10 %, 5 % + 5 %): regressed. b: −8 %: noise.
        let now = [
            ratio("a", 28.0, 0.05),
            ratio("b", 36.8, 0.05),
            ratio("new", 1.0, 0.0),
        ];
        let r = compare(&path, &now, "").unwrap();
        std::fs::remove_file(&path).unwrap();
        let verdict = |k: &str| {
            r.comparisons
                .iter()
                .find(|c| c.key == k)
                .unwrap()
                .verdict
                .clone()
        };
        assert_eq!(verdict("a"), "REGRESSED");
        assert_eq!(verdict("b"), "ok");
        assert_eq!(r.regressions, 1);
        assert_eq!(r.only_in_baseline, vec!["gone".to_string()]);
        assert_eq!(r.only_now, vec!["new".to_string()]);
    }
}

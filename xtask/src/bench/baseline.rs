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

use anyhow::{Context, Result, bail};
use serde::{Deserialize, Serialize};

use super::machine::Machine;
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
    /// How the baseline's machine differs from this one (CPU model, logical CPUs, SIMD level,
    /// GPUs); empty on the same machine. Across machines only ratios compare, and even those
    /// move with core counts and SIMD width.
    #[serde(default)]
    pub machine_differences: Vec<String>,
    pub comparisons: Vec<Comparison>,
    /// Keys in only one of the two runs (not compared).
    pub only_in_baseline: Vec<String>,
    pub only_now: Vec<String>,
    pub regressions: usize,
}

#[derive(Deserialize)]
struct Stored {
    machine: Machine,
    ratios: Vec<Ratio>,
}

/// Refuses a baseline whose mode (`quick` or `full`) is not `mode`: their ratios carry other
/// models and contexts in their keys, so nothing would be compared.
///
/// # Errors
/// The file is unreadable, not a bench.json, or of the other mode (the message says what to run).
pub fn check_mode(file: &Path, mode: &str) -> Result<()> {
    #[derive(Deserialize)]
    struct Mode {
        mode: String,
    }
    let text = std::fs::read_to_string(file)
        .with_context(|| format!("reading baseline {}", file.display()))?;
    let then: Mode = serde_json::from_str(&text)
        .with_context(|| format!("{} is not a kvlab bench.json", file.display()))?;
    if then.mode != mode {
        bail!(
            "{} is a {} run's bench.json and this is a {mode} run: their speedups are measured on other models and contexts, so none would compare; {}",
            file.display(),
            then.mode,
            if mode == "quick" {
                "drop --quick to compare with it, or save a --quick run's target/kvlab-bench/bench.json as the baseline of --quick runs"
            } else {
                "add --quick to compare with it, or use a full run's bench.json (benches/baseline.json)"
            }
        );
    }
    Ok(())
}

/// What differs between the baseline's machine and this one, in words.
pub fn machine_differences(then: &Machine, now: &Machine) -> Vec<String> {
    let mut d = Vec::new();
    if then.cpu_model != now.cpu_model {
        d.push(format!(
            "CPU {:?} then, {:?} now",
            then.cpu_model, now.cpu_model
        ));
    }
    if then.logical_cpus != now.logical_cpus {
        d.push(format!(
            "{} logical CPUs then, {} now",
            then.logical_cpus, now.logical_cpus
        ));
    }
    if then.kvlab_simd != now.kvlab_simd {
        d.push(format!(
            "SIMD {} then, {} now",
            then.kvlab_simd, now.kvlab_simd
        ));
    }
    if then.gpus != now.gpus {
        d.push(format!("GPUs {:?} then, {:?} now", then.gpus, now.gpus));
    }
    d
}

impl BaselineReport {
    /// The run's outcome against the baseline: an error when a speedup regressed, or when
    /// nothing could be compared (a comparison of nothing is not a pass).
    ///
    /// # Errors
    /// Regressions, or no ratio in common / none long enough to judge, with the reason.
    pub fn verdict(&self) -> Result<()> {
        let judged = self
            .comparisons
            .iter()
            .filter(|c| c.verdict != "too short to judge")
            .count();
        if self.comparisons.is_empty() {
            bail!(
                "nothing to compare with {}: no speedup key in common (the baseline has {}, this \
                 run {}); keys carry the model and its context, so compare a full run with a full \
                 baseline and a --quick run with a --quick one, with the same models and engines",
                self.file,
                self.only_in_baseline.len(),
                self.only_now.len()
            );
        }
        if judged == 0 {
            bail!(
                "nothing to judge against {}: all {} speedups in common timed under {MIN_JUDGED_MS} ms \
                 on one side; run without --quick or with larger models",
                self.file,
                self.comparisons.len()
            );
        }
        if self.regressions > 0 {
            bail!(
                "{} speedup(s) regressed against {} beyond the measured noise{}",
                self.regressions,
                self.file,
                if self.machine_differences.is_empty() {
                    String::new()
                } else {
                    format!(
                        " (the baseline is from another machine: {})",
                        self.machine_differences.join("; ")
                    )
                }
            );
        }
        Ok(())
    }
}

/// Reads `file` (a bench.json) and compares its ratios with `now`, measured on `machine`.
pub fn compare(file: &Path, now: &[Ratio], machine: &Machine) -> Result<BaselineReport> {
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
        same_cpu_model: stored.machine.cpu_model == machine.cpu_model,
        machine_differences: machine_differences(&stored.machine, machine),
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

    #[test]
    fn a_baseline_of_the_other_mode_is_refused_before_the_run() {
        let stored = Path::new(env!("CARGO_MANIFEST_DIR")).join("../benches/baseline.json");
        check_mode(&stored, "full").unwrap();
        let e = check_mode(&stored, "quick").unwrap_err().to_string();
        assert!(
            e.contains("is a full run's bench.json") && e.contains("drop --quick"),
            "{e}"
        );
    }

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
            "machine": Machine::default(),
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
        let r = compare(&path, &now, &Machine::default()).unwrap();
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

    fn report(comparisons: Vec<Comparison>, regressions: usize) -> BaselineReport {
        BaselineReport {
            file: "b.json".into(),
            baseline_machine: String::new(),
            baseline_commit: String::new(),
            baseline_date: String::new(),
            same_cpu_model: true,
            machine_differences: vec!["2 logical CPUs then, 16 now".into()],
            comparisons,
            only_in_baseline: vec!["x".into()],
            only_now: vec!["y".into(), "z".into()],
            regressions,
        }
    }

    fn comparison(verdict: &str) -> Comparison {
        Comparison {
            key: "k".into(),
            baseline: 1.0,
            now: 1.0,
            change: 0.0,
            tolerance: 0.25,
            verdict: verdict.into(),
        }
    }

    #[test]
    fn nothing_comparable_fails_and_says_why() {
        let e = report(vec![], 0).verdict().unwrap_err().to_string();
        assert!(
            e.contains("no speedup key in common (the baseline has 1, this run 2)"),
            "{e}"
        );
        let e = report(vec![comparison("too short to judge")], 0)
            .verdict()
            .unwrap_err()
            .to_string();
        assert!(e.contains("nothing to judge"), "{e}");
        assert!(report(vec![comparison("ok")], 0).verdict().is_ok());
        let e = report(vec![comparison("REGRESSED")], 1)
            .verdict()
            .unwrap_err()
            .to_string();
        assert!(
            e.contains("another machine: 2 logical CPUs then, 16 now"),
            "{e}"
        );
    }

    #[test]
    fn a_baseline_from_another_machine_says_how_it_differs() {
        let then = Machine {
            cpu_model: "A".into(),
            logical_cpus: 2,
            kvlab_simd: "avx512f".into(),
            ..Machine::default()
        };
        let now = Machine {
            cpu_model: "B".into(),
            logical_cpus: 16,
            kvlab_simd: "avx512f".into(),
            ..Machine::default()
        };
        assert_eq!(
            machine_differences(&then, &now),
            vec![
                "CPU \"A\" then, \"B\" now".to_string(),
                "2 logical CPUs then, 16 now".to_string()
            ]
        );
        assert!(machine_differences(&now, &now).is_empty());
    }

    #[test]
    fn the_stored_baseline_records_its_machine() {
        let path = crate::paths::workspace_root().join("benches/baseline.json");
        let stored: Stored =
            serde_json::from_str(&std::fs::read_to_string(&path).unwrap()).unwrap();
        assert!(!stored.machine.cpu_model.is_empty(), "{}", path.display());
        assert!(stored.machine.logical_cpus > 0);
        assert!(!stored.machine.kvlab_simd.is_empty());
    }
}

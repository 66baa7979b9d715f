//! The attention page's program (docs/src/attention.md), checked: the causal mask is a
//! triangle, every row's weights sum to 1, and the weights are the softmax of the scores shown.

use std::process::Command;

/// The rows (query positions) of a matrix the program prints under `title`, as cells.
fn matrix(out: &str, title: &str) -> Vec<Vec<String>> {
    let mut lines = out.lines().skip_while(|l| !l.starts_with(title)).skip(2);
    let mut rows = Vec::new();
    while let Some(l) = lines.next().filter(|l| l.starts_with("        ")) {
        rows.push(l.split_whitespace().skip(1).map(str::to_string).collect());
    }
    rows
}

#[test]
fn masked_above_the_diagonal_and_each_row_a_softmax() {
    let out = Command::new(env!("CARGO_BIN_EXE_attention"))
        .args(["-p", "Once upon a time, Lily"])
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let out = String::from_utf8(out.stdout).unwrap();
    let scores = matrix(&out, "scores");
    let weights = matrix(&out, "softmax");
    assert!(scores.len() >= 5, "{out}");
    assert_eq!(scores.len(), weights.len());
    for (i, (s, w)) in scores.iter().zip(&weights).enumerate() {
        assert_eq!(s.len(), scores.len(), "row {i} of {out}");
        for j in 0..s.len() {
            if j > i {
                assert_eq!((s[j].as_str(), w[j].as_str()), ("-inf", "0"), "({i}, {j})");
            }
        }
        // softmax of the printed scores (3 decimals) against the printed weights.
        let seen: Vec<f64> = s[..=i].iter().map(|x| x.parse().unwrap()).collect();
        let max = seen.iter().cloned().fold(f64::MIN, f64::max);
        let sum: f64 = seen.iter().map(|x| (x - max).exp()).sum();
        for j in 0..=i {
            let want = (seen[j] - max).exp() / sum;
            let got: f64 = w[j].parse().unwrap();
            assert!((got - want).abs() < 3e-3, "({i}, {j}): {got} vs {want}");
        }
        let total: f64 = w.iter().map(|x| x.parse::<f64>().unwrap()).sum();
        assert!((total - 1.0).abs() < 3e-3, "row {i} sums to {total}");
    }
    assert!(out.contains("weights sum to 1.000000"), "{out}");
}

//! Summaries of repeated measurements: min / median / max over repetitions, percentiles, and the
//! noise that a baseline comparison must not mistake for a change.

use serde::{Deserialize, Serialize};

/// A sample summarised. Times are in the unit of the field that holds it (the field's name says).
#[derive(Clone, Copy, Debug, Default, Serialize, Deserialize)]
pub struct Summary {
    /// Number of samples.
    pub n: usize,
    pub min: f64,
    pub median: f64,
    pub max: f64,
    pub mean: f64,
    /// Percentiles by linear interpolation between order statistics (numpy's default); with
    /// fewer than 100 samples p99 lies between the two largest, with fewer than 10 p90 too.
    pub p90: f64,
    pub p99: f64,
}

impl Summary {
    /// Summarises `xs`; an empty sample gives n = 0 and NaN statistics.
    pub fn of(xs: &[f64]) -> Summary {
        let mut v = xs.to_vec();
        v.sort_by(f64::total_cmp);
        Summary {
            n: v.len(),
            min: v.first().copied().unwrap_or(f64::NAN),
            median: percentile_sorted(&v, 50.0),
            max: v.last().copied().unwrap_or(f64::NAN),
            // 0 / 0 for an empty sample: NaN.
            mean: v.iter().sum::<f64>() / v.len() as f64,
            p90: percentile_sorted(&v, 90.0),
            p99: percentile_sorted(&v, 99.0),
        }
    }

    /// Half the relative spread, (max − min) / (2 · median): how far one repetition may sit from
    /// the middle. 0 for a single sample (the noise is then unknown, not zero: callers treat
    /// n = 1 specially).
    pub fn rel_noise(&self) -> f64 {
        if self.n < 2 || self.median == 0.0 {
            0.0
        } else {
            (self.max - self.min) / (2.0 * self.median.abs())
        }
    }
}

/// The p-th percentile (0..=100) of sorted `v`, interpolating linearly between ranks.
pub fn percentile_sorted(v: &[f64], p: f64) -> f64 {
    if v.is_empty() {
        return f64::NAN;
    }
    let rank = p / 100.0 * (v.len() - 1) as f64;
    let (lo, hi) = (rank.floor() as usize, rank.ceil() as usize);
    v[lo] + (v[hi] - v[lo]) * (rank - lo as f64)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn percentiles_interpolate_like_numpy() {
        let s = Summary::of(&[4.0, 1.0, 3.0, 2.0]);
        assert_eq!((s.min, s.median, s.max), (1.0, 2.5, 4.0));
        assert!((s.p90 - 3.7).abs() < 1e-12);
        assert!((s.rel_noise() - 0.6).abs() < 1e-12);
        assert_eq!(Summary::of(&[5.0]).rel_noise(), 0.0);
        let empty = Summary::of(&[]);
        assert_eq!(empty.n, 0);
        assert!(empty.min.is_nan() && empty.median.is_nan() && empty.mean.is_nan());
    }
}

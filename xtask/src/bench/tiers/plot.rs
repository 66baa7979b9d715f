//! `bench --tiers`' figure: a returning request's TTFT, restored or recomputed, against its
//! context.

use std::path::Path;

use anyhow::Result;
use plotters::prelude::*;

use crate::bench::plot::{Line, Panel, Series, axis, color, log_range, unique, write_pair};

/// `bench --tiers`' figure, SVG and PNG: the returning request's TTFT against its context (both
/// log), recomputed and restored from each tier, and on a second panel each tier's TTFT over
/// recompute's (below 1: restoring wins; the crossover is where a line crosses 1).
pub fn figure(dir: &Path, r: &super::TierReport) -> Result<Vec<String>> {
    let modes = unique(r.rows.iter().map(|x| x.mode.as_str()));
    let style = |i: usize| {
        let c = match i {
            0 => color("naive"),
            1 => color("cpu-paged"),
            _ => color("cpu"),
        };
        (c.stroke_width(2), c.stroke_width(3))
    };
    let pts = |mode: &str, f: &dyn Fn(&super::TierRow) -> f64| -> Vec<(f64, f64)> {
        r.rows
            .iter()
            .filter(|x| x.mode == mode)
            .map(|x| (x.context as f64, f(x)))
            .collect()
    };
    let (xlo, xhi) = log_range(r.rows.iter().map(|x| x.context as f64));
    let (lo, hi) = log_range(r.rows.iter().map(|x| x.ttft_ms.median));
    let ttft = Panel {
        title: format!("TTFT of a returning request — {}", r.model),
        x: axis(
            xlo..xhi,
            Some(2.0),
            "context of the returning request, tokens (log)",
        ),
        y: axis(lo..hi, Some(10.0), "time to first token, ms (log)"),
        legend: SeriesLabelPosition::UpperLeft,
        series: modes
            .iter()
            .enumerate()
            .map(|(i, m)| {
                let (line, key) = style(i);
                Series::new(pts(m, &|x| x.ttft_ms.median), line, Line::Circles)
                    .key((*m).to_string(), key)
            })
            .collect(),
    };
    let (rlo, rhi) = log_range(r.rows.iter().map(|x| x.ttft_vs_recompute).chain([0.5, 2.0]));
    let mut ratio_series = vec![
        Series::new(
            vec![(xlo, 1.0), (xhi, 1.0)],
            BLACK.stroke_width(1),
            Line::Dashed(6, 4),
        )
        .key("recompute (1)".into(), BLACK.stroke_width(2)),
    ];
    ratio_series.extend(modes.iter().enumerate().skip(1).map(|(i, m)| {
        let (line, key) = style(i);
        Series::new(pts(m, &|x| x.ttft_vs_recompute), line, Line::Circles)
            .key(format!("restore from {m}"), key)
    }));
    let ratio = Panel {
        title: "restore / recompute (below 1: restoring wins)".into(),
        x: axis(
            xlo..xhi,
            Some(2.0),
            "context of the returning request, tokens (log)",
        ),
        y: axis(rlo..rhi, Some(10.0), "TTFT relative to recompute (log)"),
        legend: SeriesLabelPosition::UpperRight,
        series: ratio_series,
    };
    write_pair(dir, "tiers_ttft", &[ttft, ratio])
}

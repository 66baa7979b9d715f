//! `bench --eviction`'s figure: the prefix-cache hit rate of each eviction policy against the
//! pool's size.

use std::path::Path;

use anyhow::Result;
use plotters::prelude::*;

use crate::bench::plot::{Line, Panel, Series, axis, unique, write_pair};

/// `bench --eviction`'s figure, SVG and PNG: the prefix-cache hit rate against the pool's size
/// for each eviction policy, without tiers (left), and with tiers below the pool (right: solid,
/// spilling on eviction; dashed, offloading paused sessions too).
pub fn figure(dir: &Path, r: &super::EvictionReport) -> Result<Vec<String>> {
    use super::mode;
    let rows = &r.sessions;
    let policies = unique(rows.iter().filter_map(|x| x["policy"].as_str()));
    let pts = |policy: &str, m: &str| -> Vec<(f64, f64)> {
        rows.iter()
            .filter(|x| x["policy"].as_str() == Some(policy) && mode(x) == m)
            .filter_map(|x| {
                Some((
                    x["num_blocks"].as_f64()?,
                    100.0 * x["prefix_hit_rate"].as_f64()?,
                ))
            })
            .collect()
    };
    let blocks = rows.iter().filter_map(|x| x["num_blocks"].as_f64());
    let (xlo, xhi) = blocks.fold((f64::INFINITY, 0.0f64), |(l, h), b| (l.min(b), h.max(b)));
    let (xlo, xhi) = if xlo.is_finite() {
        (xlo * 0.9, xhi * 1.1)
    } else {
        (1.0, 2.0)
    };
    let policy_color = |i: usize| {
        const PALETTE: [RGBColor; 4] = [
            RGBColor(214, 39, 40),
            RGBColor(31, 119, 180),
            RGBColor(44, 160, 44),
            RGBColor(148, 103, 189),
        ];
        PALETTE[i % PALETTE.len()]
    };
    let top = rows
        .iter()
        .filter_map(|x| x["prefix_hit_rate"].as_f64())
        .fold(0.0f64, f64::max);
    let ytop = (100.0 * top * 1.2).clamp(10.0, 100.0);
    let panel = |title: String, modes: &[(&str, Line)]| {
        let mut series: Vec<Series> = policies
            .iter()
            .enumerate()
            .flat_map(|(i, p)| {
                let c = policy_color(i);
                modes.iter().enumerate().map(move |(j, &(m, line))| {
                    let s = Series::new(pts(p, m), c.stroke_width(2), line);
                    // One key per policy; the dashed lines share the one key below.
                    if j == 0 {
                        s.key((*p).to_string(), c.stroke_width(3))
                    } else {
                        s
                    }
                })
            })
            .collect();
        if modes.len() > 1 {
            series.push(
                Series::new(Vec::new(), BLACK.stroke_width(1), Line::Dashed(6, 4)).key(
                    "dashed: paused sessions offloaded".into(),
                    BLACK.stroke_width(1),
                ),
            );
        }
        Panel {
            title,
            x: axis(xlo..xhi, Some(2.0), "pool, blocks of 16 tokens (log)"),
            y: axis(0.0..ytop, None, "prefix-cache hit rate, % of prompt tokens"),
            legend: SeriesLabelPosition::LowerRight,
            series,
        }
    };
    let plain = panel(
        format!("eviction policies, no tiers — {}", r.model),
        &[("no tiers", Line::Circles)],
    );
    let tiered = panel(
        "with tiers below the pool (64 host + 4,096 disk blocks)".into(),
        &[("tiers", Line::Circles), ("offload", Line::Dashed(6, 4))],
    );
    write_pair(dir, "eviction_hit_rate", &[plain, tiered])
}

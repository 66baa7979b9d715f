//! `bench --cluster`'s figure: the prefix-cache hit rate (left) and the 99th percentile of the
//! time to first token (right) against the number of instances, per routing, with and without the Redis tier.

use std::path::Path;

use anyhow::Result;
use plotters::prelude::*;

use super::{ClusterReport, ClusterRow, Routing};
use crate::bench::plot::{Line, Panel, Series, axis, write_pair};

/// Writes `cluster.svg` and `.png`; returns their names.
pub fn figure(dir: &Path, r: &ClusterReport) -> Result<Vec<String>> {
    // A colour per routing; dashed with the Redis tier.
    let configs = [Routing::RoundRobin, Routing::Affinity].map(|routing| {
        let color = match routing {
            Routing::RoundRobin => RGBColor(214, 39, 40),
            Routing::Affinity => RGBColor(31, 119, 180),
        };
        [(false, Line::Circles), (true, Line::Dashed(6, 4))]
            .map(|(remote, line)| (routing, remote, color, line))
    });
    let most = r.rows.iter().map(|x| x.instances).max().unwrap_or(1) as f64;
    let series = |value: &dyn Fn(&ClusterRow) -> f64| -> Vec<Series> {
        configs
            .iter()
            .flatten()
            .map(|&(routing, remote, color, line)| {
                let pts = (r.rows.iter())
                    .filter(|x| x.routing == routing && x.remote_tier == remote)
                    .map(|x| (x.instances as f64, value(x)))
                    .collect();
                let label = format!(
                    "{}, {}",
                    routing.name(),
                    if remote {
                        "Redis tier (dashed)"
                    } else {
                        "no Redis"
                    }
                );
                Series::new(pts, color.stroke_width(2), line).key(label, color.stroke_width(3))
            })
            .collect()
    };
    let ttft_top = (r.rows.iter())
        .map(|x| x.ttft_ms.p99)
        .fold(1.0f64, f64::max);
    let hit = Panel {
        title: format!("prefix-cache hit rate — {}", r.model),
        x: axis(0.5..most + 0.5, None, "instances behind HAProxy"),
        y: axis(0.0..100.0, None, "hit rate, % of prompt tokens"),
        legend: SeriesLabelPosition::LowerLeft,
        series: series(&|x| 100.0 * x.hit_rate),
    };
    let ttft = Panel {
        title: "time to first token, 99th percentile".into(),
        x: axis(0.5..most + 0.5, None, "instances behind HAProxy"),
        y: axis(0.0..ttft_top * 1.1, None, "TTFT p99, ms"),
        legend: SeriesLabelPosition::UpperRight,
        series: series(&|x| x.ttft_ms.p99),
    };
    write_pair(dir, "cluster", &[hit, ttft])
}

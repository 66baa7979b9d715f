//! The load test's table on the terminal.

use super::{Pair, ServeReport};
use crate::bench::stats::Summary;

/// The table, on stdout.
pub fn print(r: &ServeReport) {
    println!(
        "== kvlab serve under load: {} requests x {} tokens, {} ({} blocks x {}) ==",
        r.requests, r.max_tokens, r.model, r.num_blocks, r.block_size
    );
    let p = |s: &Summary| {
        let f = |v: f64| {
            if v < 10.0 {
                format!("{v:.1}")
            } else {
                format!("{v:.0}")
            }
        };
        format!("{} / {} / {}", f(s.median), f(s.p90), f(s.p99))
    };
    crate::table::columns(
        &r.rates,
        &[
            ("rate req/s", &|x| x.rate.clone()),
            ("ok", &|x| x.ok.to_string()),
            ("refused", &|x| x.refused.to_string()),
            ("lost", &|x| x.lost.to_string()),
            ("out tok/s", &|x| format!("{:.0}", x.output_tok_per_s)),
            ("TTFT ms p50/p90/p99", &|x| p(&x.ttft_ms)),
            ("TPOT ms p50/p90/p99", &|x| p(&x.tpot_ms)),
            ("e2e ms p50/p90/p99", &|x| p(&x.e2e_ms)),
            ("prefix hit", &|x| {
                x.prefix_cache_hit_rate
                    .map_or_else(|| "-".into(), |h| format!("{:.0}%", h * 100.0))
            }),
            ("preempt", &|x| format!("{:.0}", x.preemptions)),
        ],
    );
    let b = &r.batch;
    println!(
        "saturation pairs, the prefix cache off on both sides so that both do the same work: \
         every request at once on a fresh server, and kvlab batch (same prompts, all at step 0, \
         same pool), back to back"
    );
    println!(
        "  kvlab batch: {:.0} output tok/s median of {} runs over the whole run (the first: {} \
         tokens in {:.2} s, {:.2} s of it engine time; {:.0} tok/s counting prompt tokens; {} \
         of {} texts as solo)",
        r.batch_output_tok_per_s_median,
        r.pairs.len(),
        b.output_tokens,
        b.wall_s,
        b.engine_s,
        b.tokens_per_s_all,
        b.same_text,
        r.requests
    );
    let list = |f: &dyn Fn(&Pair) -> f64| {
        r.pairs
            .iter()
            .map(|p| format!("{:.2}", f(p)))
            .collect::<Vec<_>>()
            .join(" ")
    };
    println!(
        "  server / kvlab batch: {} -> median {:.2} (goal >= {:.2}: {})",
        list(&|p| p.ratio),
        r.paired_ratio_median,
        r.goal_ratio,
        if r.mode == "quick" {
            "not judged in quick mode: stories260K's run is a few ms"
        } else if r.paired_ratio_median >= r.goal_ratio {
            "met"
        } else {
            "NOT met"
        },
    );
    println!(
        "  server / kvlab batch's engine time alone (strict: batch's sampling and scheduling \
         not counted): {} -> median {:.2}",
        list(&|p| p.ratio_engine),
        r.paired_ratio_engine_median
    );
}

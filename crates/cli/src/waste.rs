//! `kvlab waste`: the fraction of reserved KV memory that holds no token, under max-length
//! preallocation and under paging with blocks of 8, 16 and 32 tokens (the measurement behind
//! vLLM's finding: in Kwon et al. 2023, §1 and Fig. 2, only 20.4–38.2% of existing systems' KV
//! memory holds token states, which the vLLM blog rounds to "60–80% wasted").

use anyhow::Result;
use clap::Args as ClapArgs;
use kvlab_cli::args::{MAX_POSITIONS, MAX_REQUESTS, usize_in};
use kvlab_paged::waste::{TABLE_BLOCK_SIZES, waste_table};
use kvlab_paged::workload::{LongTail, long_tail_requests, uniform_requests};

#[derive(ClapArgs)]
pub struct Args {
    /// Requests per workload.
    #[arg(long, short, default_value_t = 1000, value_parser = usize_in(1, MAX_REQUESTS))]
    requests: usize,
    /// Context every sequence reserves under max-length preallocation.
    #[arg(long, default_value_t = 2048, value_parser = usize_in(1, MAX_POSITIONS))]
    max_seq_len: usize,
    /// Seed of the workloads' random lengths (the same seed gives the same table).
    #[arg(long, short, default_value_t = 0)]
    seed: u64,
    /// Print JSON instead of a table.
    #[arg(long)]
    json: bool,
}

pub fn run(a: Args) -> Result<()> {
    let workloads = [
        (
            "uniform prompt 100-1024, output 100-1024",
            uniform_requests(a.requests, a.seed),
        ),
        (
            "long-tail (log-normal, median prompt 256, output 128)",
            long_tail_requests(
                a.requests,
                a.seed,
                LongTail {
                    max_seq_len: a.max_seq_len,
                    ..LongTail::default()
                },
            )?,
        ),
    ];
    let mut rows = Vec::new();
    for (name, reqs) in &workloads {
        rows.extend(waste_table(name, reqs, a.max_seq_len, &TABLE_BLOCK_SIZES)?);
    }
    if a.json {
        println!("{}", serde_json::to_string_pretty(&rows)?);
        return Ok(());
    }
    println!(
        "{} requests per workload, max_seq_len {}; waste = reserved slots holding no token / reserved slots",
        a.requests, a.max_seq_len
    );
    println!(
        "{:<56} {:<18} {:>16} {:>14} {:>22}",
        "workload", "scheme", "reserved/seq", "waste at end", "waste, time-averaged"
    );
    for r in &rows {
        let scheme = match r.block_size {
            Some(b) => format!("paged, block {b}"),
            None => "max-length".into(),
        };
        println!(
            "{:<56} {:<18} {:>16.0} {:>13.1}% {:>21.1}%",
            r.workload,
            scheme,
            r.mean_reserved_slots,
            100.0 * r.final_waste_frac,
            100.0 * r.time_avg_waste_frac
        );
    }
    println!(
        "\"at end\": each sequence at its final length; \"time-averaged\": over every decode step while sequences grow (what a running server holds)."
    );
    Ok(())
}

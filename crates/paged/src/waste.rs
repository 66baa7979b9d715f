//! How much reserved KV memory holds no token: max-length preallocation versus paging.
//!
//! A sequence of `len = prompt_len + output_len` tokens needs `len` slots, one per token (the
//! vLLM paper counts this way; the very last sampled token's k and v are in fact never written,
//! a difference of one slot we ignore). What it *reserves* depends on the scheme:
//!
//! * **max-length preallocation** (a contiguous cache per sequence, as in FasterTransformer or
//!   Orca's baseline): `max_seq_len` slots from admission to the end;
//! * **paging with block size b**: `ceil(len / b) · b` slots, taken a block at a time.
//!
//! Two numbers per scheme, both `1 - used / reserved` over a set of requests:
//!
//! * `final_waste_frac`: at the end of each sequence's life (all tokens present), summed over
//!   requests. For paging this is pure internal fragmentation, under `b / len` per sequence.
//! * `time_avg_waste_frac`: the same ratio integrated over time while sequences grow. A sequence
//!   is alive for `output_len` steps and after step `s` (1 = the prefill, which samples the first
//!   token) holds `prompt_len + s` tokens; used and reserved slots are summed over every
//!   (sequence, step) pair, so it is memory·time weighted, not an average of ratios. This is
//!   the kind of waste the vLLM paper measures (Kwon et al. 2023, §1 and Fig. 2: only
//!   20.4–38.2 % of the KV memory of preallocating systems holds token states; the vLLM blog
//!   rounds it to "60–80 % wasted"): memory reserved for tokens not generated yet. (The paper's
//!   figure also counts internal and external fragmentation, which these formulas do not model.)
//!
//! A request longer than `max_seq_len` is truncated to it (as a max-length stop would end it);
//! its prompt must be shorter than `max_seq_len`.

use serde::Serialize;

use crate::{PagedError, Result};

/// The lengths of one request.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
pub struct RequestLen {
    /// Prompt tokens.
    pub prompt_len: usize,
    /// Generated tokens (at least 1: the prefill samples the first).
    pub output_len: usize,
}

/// How a sequence reserves KV memory.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
pub enum Reservation {
    /// `max_seq_len` slots for the sequence's whole life.
    MaxLength,
    /// `ceil(len / block_size) · block_size` slots.
    Paged {
        /// Tokens per block (b).
        block_size: usize,
    },
}

/// Used and reserved slots of a set of requests under one reservation scheme.
#[derive(Debug, Clone, Copy, PartialEq, Serialize)]
pub struct Waste {
    /// Σ len at the end of life.
    pub used_slots: u64,
    /// Σ reserved slots at the end of life.
    pub reserved_slots: u64,
    /// `1 - used_slots / reserved_slots`.
    pub final_waste_frac: f64,
    /// Σ over (sequence, step) of tokens held.
    pub used_slot_steps: u64,
    /// Σ over (sequence, step) of slots reserved.
    pub reserved_slot_steps: u64,
    /// `1 - used_slot_steps / reserved_slot_steps`.
    pub time_avg_waste_frac: f64,
}

/// Computes [`Waste`] for `requests` under `reservation`.
///
/// # Errors
/// [`PagedError::InvalidWorkload`] if there are no requests, a prompt or output length is 0, a
/// prompt is not below `max_seq_len`, or a size is 0.
pub fn compute_waste(
    requests: &[RequestLen],
    max_seq_len: usize,
    reservation: Reservation,
) -> Result<Waste> {
    let bad = |msg: String| Err(PagedError::InvalidWorkload(msg));
    if requests.is_empty() || max_seq_len == 0 {
        return bad("need at least one request and max_seq_len >= 1".into());
    }
    if reservation == (Reservation::Paged { block_size: 0 }) {
        return bad("block_size must be at least 1".into());
    }
    let (mut used, mut reserved, mut used_t, mut reserved_t) = (0u64, 0u64, 0u64, 0u64);
    for (i, r) in requests.iter().enumerate() {
        if r.prompt_len == 0 || r.output_len == 0 || r.prompt_len >= max_seq_len {
            return bad(format!(
                "request {i} has prompt_len {} and output_len {}; both must be >= 1 and the \
                 prompt below max_seq_len = {max_seq_len}",
                r.prompt_len, r.output_len
            ));
        }
        let p = r.prompt_len as u64;
        let o = r.output_len.min(max_seq_len - r.prompt_len) as u64;
        let len = p + o;
        used += len;
        // Σ_{s=1..o} (p + s) = o·p + o(o+1)/2.
        used_t += o * p + o * (o + 1) / 2;
        match reservation {
            Reservation::MaxLength => {
                reserved += max_seq_len as u64;
                reserved_t += o * max_seq_len as u64;
            }
            Reservation::Paged { block_size } => {
                let b = block_size as u64;
                reserved += len.div_ceil(b) * b;
                reserved_t += b * (ceil_sum(p + o, b) - ceil_sum(p, b));
            }
        }
    }
    let frac = |u: u64, r: u64| 1.0 - u as f64 / r as f64;
    Ok(Waste {
        used_slots: used,
        reserved_slots: reserved,
        final_waste_frac: frac(used, reserved),
        used_slot_steps: used_t,
        reserved_slot_steps: reserved_t,
        time_avg_waste_frac: frac(used_t, reserved_t),
    })
}

/// `Σ_{x=1..n} ceil(x / b)`: with `n = q·b + r`, blocks 1..q each appear `b` times and block
/// `q + 1` appears `r` times, so the sum is `b·q(q+1)/2 + r·(q+1)`.
fn ceil_sum(n: u64, b: u64) -> u64 {
    let (q, r) = (n / b, n % b);
    b * q * (q + 1) / 2 + r * (q + 1)
}

/// One row of the waste table: a workload under one scheme.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct WasteRow {
    /// Name of the workload (e.g. "uniform", "long-tail").
    pub workload: String,
    /// "max-length" or "paged".
    pub scheme: String,
    /// The block size for paged rows.
    pub block_size: Option<usize>,
    /// Requests in the workload.
    pub num_requests: usize,
    /// Slots a max-length sequence reserves (requests are truncated to it).
    pub max_seq_len: usize,
    /// Mean slots reserved per sequence at the end of life.
    pub mean_reserved_slots: f64,
    /// [`Waste::final_waste_frac`] of this workload and scheme.
    pub final_waste_frac: f64,
    /// [`Waste::time_avg_waste_frac`] of this workload and scheme.
    pub time_avg_waste_frac: f64,
}

/// The block sizes of the standard table.
pub const TABLE_BLOCK_SIZES: [usize; 3] = [8, 16, 32];

/// The max-length row followed by one paged row per block size.
///
/// # Errors
/// As [`compute_waste`].
pub fn waste_table(
    workload: &str,
    requests: &[RequestLen],
    max_seq_len: usize,
    block_sizes: &[usize],
) -> Result<Vec<WasteRow>> {
    let schemes = std::iter::once(Reservation::MaxLength).chain(
        block_sizes
            .iter()
            .map(|&b| Reservation::Paged { block_size: b }),
    );
    schemes
        .map(|reservation| {
            let w = compute_waste(requests, max_seq_len, reservation)?;
            let (scheme, block_size) = match reservation {
                Reservation::MaxLength => ("max-length", None),
                Reservation::Paged { block_size } => ("paged", Some(block_size)),
            };
            Ok(WasteRow {
                workload: workload.to_string(),
                scheme: scheme.to_string(),
                block_size,
                num_requests: requests.len(),
                max_seq_len,
                mean_reserved_slots: w.reserved_slots as f64 / requests.len() as f64,
                final_waste_frac: w.final_waste_frac,
                time_avg_waste_frac: w.time_avg_waste_frac,
            })
        })
        .collect()
}

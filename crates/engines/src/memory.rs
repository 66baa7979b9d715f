//! Refusing a KV cache or pool larger than the machine before allocating it: an allocation that
//! size aborts the process (or gets it OOM-killed) after minutes of swapping, with no message.

use anyhow::{Result, bail};

/// The machine's total memory in bytes (sysinfo: MemTotal on Linux), if it can be read.
pub fn total_memory() -> Option<u64> {
    let mut s = sysinfo::System::new();
    s.refresh_memory();
    Some(s.total_memory()).filter(|&m| m > 0)
}

/// Fails when `bytes` (`None`: more than u64 can count) exceeds the machine's total memory.
/// `what` names the buffer, `raise` the flags that change its size.
///
/// # Errors
/// The size needed, the memory there is, and what to change.
pub fn ensure_fits(what: &str, bytes: Option<u64>, raise: &str) -> Result<()> {
    let Some(total) = total_memory() else {
        return Ok(());
    };
    match bytes {
        Some(b) if b <= total => Ok(()),
        Some(b) => bail!(
            "{what} would need {} but this machine has {} of memory; {raise}",
            human_bytes(b as f64),
            human_bytes(total as f64)
        ),
        None => bail!(
            "{what} would need more than 2^64 bytes; this machine has {}; {raise}",
            human_bytes(total as f64)
        ),
    }
}

/// Bytes as a human reads them (binary units), with the exact count while f64 holds it exactly
/// (below 2^53); larger sizes (the memory calculator's) print in scientific notation.
pub fn human_bytes(n: f64) -> String {
    const UNITS: [&str; 9] = ["B", "KiB", "MiB", "GiB", "TiB", "PiB", "EiB", "ZiB", "YiB"];
    let mut v = n;
    let mut u = 0;
    while v >= 1024.0 && u + 1 < UNITS.len() {
        v /= 1024.0;
        u += 1;
    }
    let exact = if n < (1u64 << 53) as f64 && n.fract() == 0.0 {
        format!("{} B", n as u64)
    } else {
        format!("{n:.3e} B")
    };
    if u == 0 {
        exact
    } else {
        format!("{v:.2} {} ({exact})", UNITS[u])
    }
}

#[cfg(test)]
mod tests {
    use super::human_bytes;

    #[test]
    fn human_bytes_is_exact_when_it_can_be_and_never_wraps() {
        assert_eq!(human_bytes(28.0), "28 B");
        assert_eq!(human_bytes(1280.0), "1.25 KiB (1280 B)");
        // 2^80 bytes: past u64, printed approximately instead of wrapping to a small number.
        assert_eq!(human_bytes(2f64.powi(80)), "1.00 YiB (1.209e24 B)");
    }
}

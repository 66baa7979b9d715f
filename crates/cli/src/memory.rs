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
            crate::human_bytes(b as f64),
            crate::human_bytes(total as f64)
        ),
        None => bail!(
            "{what} would need more than 2^64 bytes; this machine has {}; {raise}",
            crate::human_bytes(total as f64)
        ),
    }
}

//! The pieces of the `kvlab` command that xtask reuses: finding and loading models by name or
//! path, building engines by name, flag value parsers and the memory check.

pub mod args;
pub mod engines;
pub mod fetch;
pub mod memory;

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

/// A count and its noun, the noun in the plural unless the count is 1: "1 block", "3 blocks"
/// (nouns whose plural adds an s).
pub fn plural(n: usize, noun: &str) -> String {
    if n == 1 {
        format!("1 {noun}")
    } else {
        format!("{n} {noun}s")
    }
}

#[cfg(test)]
mod tests {
    use super::{human_bytes, plural};

    #[test]
    fn one_is_singular() {
        assert_eq!(plural(1, "sequence"), "1 sequence");
        assert_eq!(plural(0, "block"), "0 blocks");
        assert_eq!(plural(12, "block"), "12 blocks");
    }

    #[test]
    fn human_bytes_is_exact_when_it_can_be_and_never_wraps() {
        assert_eq!(human_bytes(28.0), "28 B");
        assert_eq!(human_bytes(1280.0), "1.25 KiB (1280 B)");
        // 2^80 bytes: past u64, printed approximately instead of wrapping to a small number.
        assert_eq!(human_bytes(2f64.powi(80)), "1.00 YiB (1.209e24 B)");
    }
}

//! The pieces of the `kvlab` command that xtask reuses: finding and loading models by name or
//! path, and flag value parsers. Engines by name and the memory check live in `kvlab-engines`.

pub mod args;
pub mod fetch;
pub mod fill;

pub use kvlab_engines::human_bytes;

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
    use super::plural;

    #[test]
    fn one_is_singular() {
        assert_eq!(plural(1, "sequence"), "1 sequence");
        assert_eq!(plural(0, "block"), "0 blocks");
        assert_eq!(plural(12, "block"), "12 blocks");
    }
}

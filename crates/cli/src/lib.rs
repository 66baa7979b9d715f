//! The pieces of the `kvlab` command that xtask reuses: finding and loading models by name or
//! path, and building engines by name.

pub mod engines;
pub mod fetch;

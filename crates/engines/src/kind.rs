//! Engines by name. [`EngineKind`] is the one list: the CLI's `--engine` values, verify's and
//! bench's engines, their order in reports and what each one is compared with all come from it.
//! Names, parsing and display are clap's [`ValueEnum`].

use std::fmt;
use std::str::FromStr;
use std::sync::LazyLock;

use anyhow::{Error, Result, anyhow};
use clap::ValueEnum;
use clap::builder::PossibleValue;

/// Every engine kvlab knows, in the order reports list them. Adding an engine: a variant (its
/// `#[value(name)]` is its name on the command line and in reports), its row in
/// [`EngineKind::ALL`], and its constructor in [`build`](crate::build) (or
/// [`build_paged`](crate::build_paged) for a paged one).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, ValueEnum)]
pub enum EngineKind {
    /// No cache: every step recomputes the whole prefix. The reference of every comparison.
    #[value(name = "naive")]
    Naive,
    /// One contiguous KV cache per sequence.
    #[value(name = "cpu")]
    Cpu,
    /// A pool of fixed-size blocks on the CPU: prefix caching, continuous batching.
    #[value(name = "cpu-paged")]
    CpuPaged,
    /// The same paged pool on an NVIDIA GPU.
    #[value(name = "cuda")]
    Cuda,
}

impl EngineKind {
    /// Every engine, in report order.
    pub const ALL: [EngineKind; 4] = [Self::Naive, Self::Cpu, Self::CpuPaged, Self::Cuda];

    /// The reference every other engine's tokens and speed are compared with.
    pub const REFERENCE: EngineKind = Self::Naive;

    /// The name on the command line and in reports (its `#[value(name)]`).
    pub fn name(self) -> &'static str {
        // ValueEnum hands out its names in owned `PossibleValue`s; kept once here so that a name
        // lives as long as the program.
        static NAMES: LazyLock<Vec<(EngineKind, PossibleValue)>> = LazyLock::new(|| {
            EngineKind::ALL
                .into_iter()
                .map(|e| (e, e.to_possible_value().expect("no engine is skipped")))
                .collect()
        });
        let (_, value) = NAMES
            .iter()
            .find(|(e, _)| *e == self)
            .expect("every engine is in ALL");
        value.get_name()
    }

    /// The paged engines (the values of `kvlab batch --engine`).
    pub fn paged() -> Vec<EngineKind> {
        Self::ALL.into_iter().filter(|e| e.is_paged()).collect()
    }

    /// Whether its KV cache is a block pool, so that it also runs batched steps from the
    /// scheduler.
    pub const fn is_paged(self) -> bool {
        matches!(self, Self::CpuPaged | Self::Cuda)
    }

    /// Whether it keeps a KV cache at all (every engine but the reference).
    pub const fn has_cache(self) -> bool {
        !matches!(self, Self::Naive)
    }

    /// Whether it runs on the CPU (the others need a GPU).
    pub const fn on_cpu(self) -> bool {
        !matches!(self, Self::Cuda)
    }

    /// The engines whose speed this one is divided by: the reference for every engine, and the
    /// contiguous cache for the paged ones (what paging costs or buys).
    pub fn compared_with(self) -> &'static [EngineKind] {
        match self {
            Self::Naive => &[],
            Self::Cpu => &[Self::Naive],
            Self::CpuPaged | Self::Cuda => &[Self::Naive, Self::Cpu],
        }
    }

    /// The engine called `name` (exactly, case-sensitive), if kvlab has one.
    pub fn from_name(name: &str) -> Option<EngineKind> {
        <EngineKind as ValueEnum>::from_str(name, false).ok()
    }
}

impl FromStr for EngineKind {
    type Err = Error;

    /// An engine by name.
    ///
    /// # Errors
    /// An unknown name; the message lists the known ones.
    fn from_str(name: &str) -> Result<EngineKind> {
        EngineKind::from_name(name).ok_or_else(|| {
            let known = EngineKind::ALL.map(EngineKind::name).join(", ");
            anyhow!("unknown engine {name:?}; known: {known}")
        })
    }
}

impl fmt::Display for EngineKind {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

/// A report row's engine name against an engine: `row.engine == EngineKind::Cpu`.
impl PartialEq<EngineKind> for String {
    fn eq(&self, e: &EngineKind) -> bool {
        self == e.name()
    }
}

/// The engines of `ALL` that `wanted` names (all of them when `wanted` is empty), in report
/// order.
pub fn selected(wanted: &[EngineKind]) -> Vec<EngineKind> {
    EngineKind::ALL
        .into_iter()
        .filter(|e| wanted.is_empty() || wanted.contains(e))
        .collect()
}

/// `--engine`'s value parser over `engines`: clap checks the name and lists the possible values
/// (names only, as before: the variants' docs stay out of `--help`) in its error.
pub fn value_parser(
    engines: &[EngineKind],
) -> impl clap::builder::TypedValueParser<Value = EngineKind> {
    use clap::builder::{PossibleValuesParser, TypedValueParser};
    PossibleValuesParser::new(engines.iter().map(|e| PossibleValue::new(e.name())))
        .map(|name| EngineKind::from_name(&name).expect("clap checked the name"))
}

#[cfg(test)]
mod tests {
    use super::EngineKind;

    #[test]
    fn names_round_trip_and_errors_list_the_engines() {
        let names = EngineKind::ALL.map(EngineKind::name);
        assert_eq!(names, ["naive", "cpu", "cpu-paged", "cuda"]);
        for e in EngineKind::ALL {
            assert_eq!(e.to_string().parse::<EngineKind>().unwrap(), e);
        }
        let err = "gpu".parse::<EngineKind>().unwrap_err().to_string();
        assert_eq!(
            err,
            "unknown engine \"gpu\"; known: naive, cpu, cpu-paged, cuda"
        );
        assert_eq!(EngineKind::from_name("CPU"), None);
    }
}

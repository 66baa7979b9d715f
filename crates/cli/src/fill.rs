//! How `kvlab depth` (and `cargo xtask depth`, which runs it beside llama.cpp) fills the
//! context before each depth's decoded tokens.

/// The text the context is filled with when `-p` is not given; any text works, its tokens
/// (after BOS) are repeated to each depth.
pub const FILL_TEXT: &str = "Once upon a time, in a small village at the edge of a great forest, \
there lived a girl who loved to read. Every morning she walked to the old library, where the \
librarian kept a shelf of books about the stars, the sea and the mountains far away. ";

/// How each depth's positions before its decoded tokens are filled.
#[derive(Clone, Copy, Debug, PartialEq, Eq, clap::ValueEnum, serde::Serialize)]
#[serde(rename_all = "lowercase")]
pub enum Fill {
    /// Prefill the fill text's tokens (the keys and values of real text).
    Text,
    /// Seeded random keys and values, uniform in [−1, 1), written without computing
    /// (`Engine::fill_random`): the same decode time, none of the prefill's.
    Random,
}

impl Fill {
    /// The flag's value naming it (`--fill text`, `--fill random`).
    pub fn arg(self) -> &'static str {
        match self {
            Fill::Text => "text",
            Fill::Random => "random",
        }
    }
}

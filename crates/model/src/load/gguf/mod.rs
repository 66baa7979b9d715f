//! GGUF checkpoints (llama.cpp's format): [`model`] reads one into the model definition (Gemma 3
//! there, the plain Llama family's config in [`llama`]); [`write`](mod@write) writes a plain Llama model back
//! out as GGUF.

pub mod llama;
pub mod model;
pub mod write;

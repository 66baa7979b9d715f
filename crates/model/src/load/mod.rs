//! Checkpoints from disk into the one model definition, one format each: [`llama2c`] (llama2.c's
//! `.bin`, read and written), [`gguf`] (llama.cpp's GGUF: read, and written for the peers
//! comparison) and [`hf`] (Hugging Face folders: `config.json`, safetensors, `tokenizer.json`).
//! [`crate::registry`] picks the loader for a named model or a path.

pub mod gguf;
pub mod hf;
pub mod llama2c;

//! kvlab-gguf

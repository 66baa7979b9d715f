//! What the GGUF tests share: one small valid file to take apart, and the stored oracle fixtures.
//! Each test binary uses a part of it.
#![allow(dead_code)]

use std::path::PathBuf;

use kvlab_gguf::{GgmlType, GgufBuilder, MetadataArray, MetadataValue};

/// A small valid file: metadata of several types, two F32 tensors and one Q8_0 block (d = 0.5,
/// f16 0x3800, and every quant 1).
pub fn good() -> GgufBuilder {
    let mut q8 = vec![0x00, 0x38];
    q8.extend([1u8; 32]);
    GgufBuilder::new()
        .kv(
            "general.architecture",
            MetadataValue::String("gemma3".into()),
        )
        .kv("gemma3.block_count", MetadataValue::U32(2))
        .kv(
            "gemma3.attention.layer_norm_rms_epsilon",
            MetadataValue::F32(1e-6),
        )
        .kv(
            "tokenizer.ggml.tokens",
            MetadataValue::Array(MetadataArray::String(vec!["<pad>".into(), "▁a".into()])),
        )
        .kv(
            "tokenizer.ggml.scores",
            MetadataValue::Array(MetadataArray::F32(vec![0.0, -1.5])),
        )
        .kv(
            "tokenizer.ggml.token_type",
            MetadataValue::Array(MetadataArray::I32(vec![3, 1])),
        )
        .tensor_f32("norm.weight", &[3], &[1.0, 2.0, 3.0])
        .tensor_f32("w.weight", &[2, 3], &[1.0, 2.0, 3.0, 4.0, 5.0, 6.0])
        .tensor("q.weight", &[32], GgmlType::Q8_0, q8)
}

/// The folder of the stored llama.cpp oracle fixtures (`scripts/gemma_oracle.py` writes them).
pub fn fixtures_dir() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../../fixtures/gemma3")
}

/// One fixture of [`fixtures_dir`], parsed; a missing or malformed one panics with its path.
pub fn fixture(name: &str) -> serde_json::Value {
    let p = fixtures_dir().join(name);
    let text = std::fs::read_to_string(&p).unwrap_or_else(|e| panic!("{}: {e}", p.display()));
    serde_json::from_str(&text).unwrap_or_else(|e| panic!("{}: {e}", p.display()))
}

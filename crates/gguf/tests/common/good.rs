//! One small valid GGUF file to take apart: the seed of the malformed-input tests here and of the
//! `gguf_reader` fuzz target (fuzz/), which includes this file by path.

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
            MetadataValue::Array(MetadataArray::String(vec!["<pad>", "▁a"].into())),
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

//! The GGUF reader and the checks made from a GGUF header before any tensor is read: on any
//! file, `GgufFile::from_bytes` and `GgufFile::open` give a file or a typed error; every tensor
//! of a file that opens dequantizes or fails with a typed error; the header validation
//! (`gguf_model::read_gguf_config`, what `kvlab info` runs), the GGUF tokenizer and the full
//! `load_gguf` give a value or a typed error, and a file whose header passes loads to exactly
//! that config. Never a panic. The reader half is the property of crates/gguf/tests/fuzz.rs.
//!
//! The first input byte picks: (0) the bytes as they are; (1) the GGUF tests' small file,
//! crates/gguf/tests/common/good.rs (metadata of several types, F32 tensors, a Q8_0 block), with
//! a few bytes overwritten or the end moved; (2) the same for a complete tiny gemma3 checkpoint (every
//! key and tensor `load_gguf` needs), so mutations reach the header validation.

#![no_main]

use std::sync::OnceLock;

use kvlab_fuzz::{mutate, tmp};
use kvlab_gguf::{GgmlType, GgufBuilder, GgufFile, MetadataArray, MetadataValue};
use kvlab_model::gguf_model::read_gguf_config;
use kvlab_model::tokenizer::tokenizer_from_gguf;
use kvlab_model::load_gguf;
use libfuzzer_sys::arbitrary::Unstructured;
use libfuzzer_sys::fuzz_target;

#[path = "../../crates/gguf/tests/common/good.rs"]
mod good;

/// The GGUF tests' small valid file (`good()` of crates/gguf/tests/common), built once.
fn small() -> &'static [u8] {
    static SMALL: OnceLock<Vec<u8>> = OnceLock::new();
    SMALL.get_or_init(|| good::good().build())
}

/// A gemma3 checkpoint of dim 4, one layer, 2 query heads of size 2 sharing 1 KV head, FFN 8,
/// vocab 4: every key and tensor `load_gguf` reads, token embedding in F16, the rest F32.
fn gemma3() -> &'static [u8] {
    static GEMMA: OnceLock<Vec<u8>> = OnceLock::new();
    GEMMA.get_or_init(|| {
        let (d, h, q, kv, hd, v) = (4u64, 8u64, 4u64, 2u64, 2u64, 4u64);
        let u32kv = |b: GgufBuilder, k: &str, x: u64| b.kv(k, MetadataValue::U32(x as u32));
        let mut b = GgufBuilder::new().kv(
            "general.architecture",
            MetadataValue::String("gemma3".into()),
        );
        for (k, x) in [
            ("gemma3.embedding_length", d),
            ("gemma3.block_count", 1),
            ("gemma3.attention.head_count", q / hd),
            ("gemma3.attention.head_count_kv", kv / hd),
            ("gemma3.attention.key_length", hd),
            ("gemma3.attention.sliding_window", 4),
            ("gemma3.feed_forward_length", h),
            ("gemma3.context_length", 16),
            ("tokenizer.ggml.bos_token_id", 2),
            ("tokenizer.ggml.eos_token_id", 1),
        ] {
            b = u32kv(b, k, x);
        }
        b = b
            .kv(
                "gemma3.attention.layer_norm_rms_epsilon",
                MetadataValue::F32(1e-6),
            )
            .kv("gemma3.rope.freq_base", MetadataValue::F32(1e6))
            .kv("gemma3.rope.freq_base_swa", MetadataValue::F32(1e4))
            .kv(
                "tokenizer.ggml.model",
                MetadataValue::String("llama".into()),
            )
            .kv(
                "tokenizer.ggml.tokens",
                MetadataValue::Array(MetadataArray::String(
                    vec!["<pad>", "<eos>", "<bos>", "▁a"].into(),
                )),
            )
            .kv(
                "tokenizer.ggml.scores",
                MetadataValue::Array(MetadataArray::F32(vec![0.0, 0.0, 0.0, -1.0])),
            )
            .kv(
                "tokenizer.ggml.token_type",
                MetadataValue::Array(MetadataArray::I32(vec![3, 3, 3, 1])),
            )
            .kv(
                "tokenizer.ggml.add_space_prefix",
                MetadataValue::Bool(false),
            );
        let f16_one = [0x00u8, 0x3c];
        b = b.tensor(
            "token_embd.weight",
            &[d, v],
            GgmlType::F16,
            f16_one.repeat((d * v) as usize),
        );
        let f32t = |b: GgufBuilder, name: &str, ne: &[u64]| {
            let n = ne.iter().product::<u64>() as usize;
            let data: Vec<f32> = (0..n).map(|i| (i % 7) as f32 * 0.1).collect();
            b.tensor_f32(name, ne, &data)
        };
        b = f32t(b, "output_norm.weight", &[d]);
        for (n, ne) in [
            ("attn_norm", vec![d]),
            ("attn_q", vec![d, q]),
            ("attn_k", vec![d, kv]),
            ("attn_v", vec![d, kv]),
            ("attn_output", vec![q, d]),
            ("attn_q_norm", vec![hd]),
            ("attn_k_norm", vec![hd]),
            ("post_attention_norm", vec![d]),
            ("ffn_norm", vec![d]),
            ("ffn_gate", vec![d, h]),
            ("ffn_down", vec![h, d]),
            ("ffn_up", vec![d, h]),
            ("post_ffw_norm", vec![d]),
        ] {
            b = f32t(b, &format!("blk.0.{n}.weight"), &ne);
        }
        let bytes = b.build();
        // The seed must load, or mutations of it would only ever reach the first error.
        let p = tmp("gemma3.gguf");
        std::fs::write(&p, &bytes).expect("temp file");
        if let Err(e) = load_gguf(&p) {
            panic!("the tiny gemma3 seed does not load: {e}");
        }
        bytes
    })
}

fuzz_target!(|data: &[u8]| {
    let mut u = Unstructured::new(data);
    let bytes = match u.int_in_range(0..=2u8).unwrap_or(0) {
        0 => u.take_rest().to_vec(),
        1 => mutate(small(), &mut u),
        _ => mutate(gemma3(), &mut u),
    };
    let p = tmp("fuzz.gguf");
    std::fs::write(&p, &bytes).expect("temp file");
    if let Ok(f) = GgufFile::from_bytes(bytes) {
        let _ = f.summary().to_string();
        let names: Vec<String> = f.tensor_names().map(str::to_owned).collect();
        for n in names {
            let _ = f.dequantize(&n);
            let _ = f.dequantize_rows(&n, 0..1);
        }
        if let Ok(t) = tokenizer_from_gguf(&f, &p) {
            let ids = t.encode("a <eos> a", true, true);
            let _ = t.decode_all(&ids);
        }
    }
    if let Ok(header) = read_gguf_config(&p) {
        if let Ok((model, _)) = load_gguf(&p) {
            assert_eq!(header, model.config);
        }
    }
});

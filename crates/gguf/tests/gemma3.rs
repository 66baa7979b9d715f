//! Tests on the real Gemma 3 270M Q4_K_M checkpoint, found through `KVLAB_MODELS` or the user
//! cache. A clone does not ship it, so every test here is `#[ignore]`d (libtest counts them);
//! `cargo test -- --include-ignored` with `KVLAB_MODELS` set runs them, and with
//! `KVLAB_REQUIRE_MODELS=1` (CI) a missing file fails instead of skipping.
//!
//! The cross-check against an independent dequantizer uses `fixtures/gemma3/dequant.json`,
//! written by `scripts/gemma_oracle.py --dequant` with gguf-py's numpy dequantization.

mod common;

use std::sync::OnceLock;

use common::fixture;
use kvlab_gguf::{GEMMA3_270M_FILE, GgmlType, GgufFile};

/// The opened checkpoint, found where the CLI finds it (`$KVLAB_MODELS`, then the user cache;
/// see `kvlab_model::registry::test_model_file`), or `None` after a loud SKIPPED line. These
/// tests are `#[ignore]`d because a clone does not ship Gemma; CI runs them with
/// `--include-ignored` and `KVLAB_REQUIRE_MODELS=1`, which turns a missing file into a failure.
/// A file that does not open panics in the test that opened it first (libtest names it).
fn gemma() -> Option<&'static GgufFile> {
    static FILE: OnceLock<Option<GgufFile>> = OnceLock::new();
    FILE.get_or_init(|| {
        let p = kvlab_model::registry::test_model_file(GEMMA3_270M_FILE)?;
        Some(GgufFile::open(&p).unwrap_or_else(|e| panic!("{}: {e}", p.display())))
    })
    .as_ref()
}

#[test]
#[ignore = "needs gemma-3-270m: set KVLAB_MODELS"]
fn metadata_matches_the_model_card() {
    let Some(f) = gemma() else { return };
    let md = f.metadata();
    assert_eq!(f.version(), 3);
    assert_eq!(f.alignment(), 32);
    assert_eq!(md.len(), 33);
    assert_eq!(md.architecture().unwrap(), "gemma3");
    assert_eq!(md.get_u32("gemma3.context_length").unwrap(), 32768);
    assert_eq!(md.get_u32("gemma3.embedding_length").unwrap(), 640);
    assert_eq!(md.get_u32("gemma3.block_count").unwrap(), 18);
    assert_eq!(md.get_u32("gemma3.feed_forward_length").unwrap(), 2048);
    assert_eq!(md.get_u32("gemma3.attention.head_count").unwrap(), 4);
    assert_eq!(md.get_u32("gemma3.attention.head_count_kv").unwrap(), 1);
    assert_eq!(md.get_u32("gemma3.attention.key_length").unwrap(), 256);
    assert_eq!(md.get_u32("gemma3.attention.value_length").unwrap(), 256);
    assert_eq!(
        md.get_f32("gemma3.attention.layer_norm_rms_epsilon")
            .unwrap(),
        1e-6
    );
    assert_eq!(md.get_f32("gemma3.rope.freq_base").unwrap(), 1e6);
    assert_eq!(md.get_u32("gemma3.attention.sliding_window").unwrap(), 512);
    assert_eq!(md.opt_f32("gemma3.final_logit_softcapping").unwrap(), None);
    assert_eq!(md.get_str("tokenizer.ggml.model").unwrap(), "llama");
    assert_eq!(md.get_str("tokenizer.ggml.pre").unwrap(), "default");
    assert_eq!(md.get_u32("tokenizer.ggml.bos_token_id").unwrap(), 2);
    assert_eq!(md.get_u32("tokenizer.ggml.eos_token_id").unwrap(), 1);
    assert_eq!(md.get_u32("tokenizer.ggml.unknown_token_id").unwrap(), 3);
    assert_eq!(md.get_u32("tokenizer.ggml.padding_token_id").unwrap(), 0);
    assert!(md.get_bool("tokenizer.ggml.add_bos_token").unwrap());
    assert!(!md.get_bool("tokenizer.ggml.add_space_prefix").unwrap());

    let tokens = md.get_str_array("tokenizer.ggml.tokens").unwrap();
    let scores = md.get_f32_array("tokenizer.ggml.scores").unwrap();
    let types = md.get_i32_array("tokenizer.ggml.token_type").unwrap();
    assert_eq!(
        (tokens.len(), scores.len(), types.len()),
        (262144, 262144, 262144)
    );
    assert_eq!(
        tokens.iter().take(4).collect::<Vec<_>>(),
        ["<pad>", "<eos>", "<bos>", "<unk>"]
    );
    assert_eq!(&tokens[106], "<end_of_turn>");
    // Byte-fallback tokens <0x00>..<0xFF> have type 6 (BYTE).
    let b0 = tokens.iter().position(|t| t == "<0x00>").unwrap();
    assert_eq!(&tokens[b0 + 0x41], "<0x41>");
    assert!((b0..b0 + 256).all(|i| types[i] == 6));
}

#[test]
#[ignore = "needs gemma-3-270m: set KVLAB_MODELS"]
fn tensor_table_shapes_and_types() {
    let Some(f) = gemma() else { return };
    let s = f.summary();
    assert_eq!(s.n_tensors, 236);
    let hist: Vec<(GgmlType, usize)> = s
        .by_type
        .iter()
        .map(|t| (t.ggml_type, t.n_tensors))
        .collect();
    assert_eq!(
        hist,
        [
            (GgmlType::F32, 109),
            (GgmlType::Q5_0, 81),
            (GgmlType::Q8_0, 10),
            (GgmlType::Q4_K, 27),
            (GgmlType::Q6_K, 9),
        ]
    );
    assert_eq!(s.file_bytes, 253_113_024);
    assert!(s.tensor_bytes < s.file_bytes);
    println!("{s}");

    let emb = f.tensor_info("token_embd.weight").unwrap();
    assert_eq!(
        (emb.ggml_type, emb.ne.as_slice()),
        (GgmlType::Q8_0, &[640u64, 262144][..])
    );
    assert_eq!(emb.shape(), [262144, 640]); // (vocab, n_embd)
    let q = f.tensor_info("blk.0.attn_q.weight").unwrap();
    assert_eq!((q.ggml_type, q.shape()), (GgmlType::Q5_0, vec![1024, 640])); // (n_head*head_dim, n_embd)
    let k = f.tensor_info("blk.0.attn_k.weight").unwrap();
    assert_eq!(k.shape(), [256, 640]); // (n_kv_head*head_dim, n_embd)
    let o = f.tensor_info("blk.0.attn_output.weight").unwrap();
    assert_eq!((o.ggml_type, o.shape()), (GgmlType::Q4_K, vec![640, 1024]));
    let down = f.tensor_info("blk.0.ffn_down.weight").unwrap();
    assert_eq!(
        (down.ggml_type, down.shape()),
        (GgmlType::Q6_K, vec![640, 2048])
    );
    assert_eq!(
        f.tensor_info("blk.0.attn_q_norm.weight").unwrap().shape(),
        [256]
    );
    assert!(!f.has_tensor("output.weight")); // tied: the classifier is token_embd
    for l in 0..18 {
        for t in [
            "attn_norm",
            "attn_q",
            "attn_k",
            "attn_v",
            "attn_q_norm",
            "attn_k_norm",
            "attn_output",
            "post_attention_norm",
            "ffn_norm",
            "ffn_gate",
            "ffn_up",
            "ffn_down",
            "post_ffw_norm",
        ] {
            assert!(f.has_tensor(&format!("blk.{l}.{t}.weight")), "blk.{l}.{t}");
        }
    }
}

#[test]
#[ignore = "needs gemma-3-270m: set KVLAB_MODELS"]
fn every_tensor_dequantizes_to_finite_values() {
    let Some(f) = gemma() else { return };
    for t in f.tensors() {
        let x = f.dequantize(&t.name).unwrap();
        assert_eq!(x.len(), t.len(), "{}", t.name);
        if let Some(i) = x.iter().position(|v| !v.is_finite()) {
            panic!("{} [{i}] = {}", t.name, x[i]);
        }
    }
}

#[test]
#[ignore = "needs gemma-3-270m: set KVLAB_MODELS"]
fn norm_weights_already_include_gemmas_plus_one() {
    // Gemma's RMSNorm scales by (1 + w); llama.cpp's converter stores 1 + w in the GGUF, so the
    // weights are used as plain multipliers. Their values are well away from 0 on average.
    let Some(f) = gemma() else { return };
    let mean = |name: &str| {
        let x = f.dequantize(name).unwrap();
        x.iter().map(|&v| f64::from(v)).sum::<f64>() / x.len() as f64
    };
    let attn_norm = f.dequantize("blk.0.attn_norm.weight").unwrap();
    assert_eq!(&attn_norm[..4], [16.0, 16.875, 10.8125, 41.5]);
    assert!((mean("blk.0.attn_norm.weight") - 13.480_810_546_875).abs() < 1e-9);
    assert_eq!(
        &f.dequantize("output_norm.weight").unwrap()[..4],
        [7.125, 9.5625, 47.0, 145.0]
    );
    assert!(mean("blk.0.attn_q_norm.weight") > 1.5);
    assert!(mean("blk.0.attn_k_norm.weight") > 1.5);
}

#[test]
#[ignore = "needs gemma-3-270m: set KVLAB_MODELS"]
fn dequantization_agrees_with_gguf_py() {
    let Some(f) = gemma() else { return };
    let fx = fixture("dequant.json");
    assert_eq!(fx["format_version"], 1);
    let mut seen = std::collections::BTreeSet::new();
    for t in fx["tensors"].as_array().unwrap() {
        let name = t["name"].as_str().unwrap();
        let info = f.tensor_info(name).unwrap();
        assert_eq!(
            info.ggml_type.name(),
            t["ggml_type"].as_str().unwrap(),
            "{name}"
        );
        seen.insert(info.ggml_type);
        let x = f.dequantize(name).unwrap();
        assert_eq!(x.len() as u64, t["n_elements"].as_u64().unwrap());
        let close = |a: f32, b: f64, what: &str| {
            // Same f32 arithmetic in a possibly different order: allow one rounding step.
            let tol = 2e-7 * b.abs().max(1e-3);
            assert!((f64::from(a) - b).abs() <= tol, "{name} {what}: {a} vs {b}");
        };
        for (i, v) in t["head"].as_array().unwrap().iter().enumerate() {
            close(x[i], v.as_f64().unwrap(), &format!("[{i}]"));
        }
        let idx = t["probe_index"].as_array().unwrap();
        let val = t["probe_value"].as_array().unwrap();
        for (i, v) in idx.iter().zip(val) {
            let i = i.as_u64().unwrap() as usize;
            close(x[i], v.as_f64().unwrap(), &format!("[{i}]"));
        }
        let sum_abs: f64 = x.iter().map(|&v| f64::from(v).abs()).sum();
        let sum_sq: f64 = x.iter().map(|&v| f64::from(v) * f64::from(v)).sum();
        for (got, key) in [(sum_abs, "sum_abs"), (sum_sq, "sum_sq")] {
            let want = t[key].as_f64().unwrap();
            assert!(
                (got - want).abs() <= 1e-9 * want.abs(),
                "{name} {key}: {got} vs {want}"
            );
        }
    }
    for ty in [
        GgmlType::F32,
        GgmlType::Q5_0,
        GgmlType::Q8_0,
        GgmlType::Q4_K,
        GgmlType::Q6_K,
    ] {
        assert!(seen.contains(&ty), "fixture lacks a {ty} tensor");
    }
}

#[test]
#[ignore = "needs gemma-3-270m: set KVLAB_MODELS"]
fn row_lookup_equals_the_full_tensor() {
    let Some(f) = gemma() else { return };
    for name in [
        "blk.3.ffn_down.weight",
        "blk.5.attn_output.weight",
        "blk.0.attn_q.weight",
    ] {
        let info = f.tensor_info(name).unwrap();
        let full = f.dequantize(name).unwrap();
        let n = info.row_len();
        let rows = 7..19;
        let part = f.dequantize_rows(name, rows.clone()).unwrap();
        assert_eq!(part, full[rows.start * n..rows.end * n], "{name}");
    }
    // One token's embedding: row 2 (<bos>) of the (vocab, n_embd) table.
    let bos = f.dequantize_rows("token_embd.weight", 2..3).unwrap();
    assert_eq!(bos.len(), 640);
    assert!(bos.iter().all(|v| v.is_finite()) && bos.iter().any(|&v| v != 0.0));
}

#[test]
#[ignore = "needs gemma-3-270m: set KVLAB_MODELS"]
fn token_fixture_pieces_are_this_vocabulary() {
    // Ties the llama.cpp tokenization fixture to this file's vocabulary as kvlab-gguf reads it.
    let Some(f) = gemma() else { return };
    let tokens = f.metadata().get_str_array("tokenizer.ggml.tokens").unwrap();
    let fx = fixture("tokens.json");
    for c in fx["cases"].as_array().unwrap() {
        let ids = c["ids"].as_array().unwrap();
        let pieces = c["pieces"].as_array().unwrap();
        for (id, piece) in ids.iter().zip(pieces) {
            let id = id.as_u64().unwrap() as usize;
            assert_eq!(&tokens[id], piece.as_str().unwrap(), "case {}", c["text"]);
        }
    }
}

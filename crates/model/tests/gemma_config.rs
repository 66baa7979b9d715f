//! Gemma 3 270M read from GGUF: the configuration the architecture needs (checked against
//! llama.cpp's gemma3 graph and HF transformers, see crates/model/src/load/gguf/model.rs).

mod common;

use kvlab_model::{Activation, LayerKind, RopeLayout};

#[test]
#[ignore = "needs gemma-3-270m: set KVLAB_MODELS"]
fn gemma3_gguf_becomes_the_expected_config() {
    let Some(path) = common::gemma() else { return };
    let (model, tok) = kvlab_model::load_gguf(&path).unwrap();
    let c = &model.config;
    assert_eq!(
        (
            c.dim,
            c.hidden_dim,
            c.n_layers,
            c.n_heads,
            c.n_kv_heads,
            c.head_dim
        ),
        (640, 2048, 18, 4, 1, 256)
    );
    assert_eq!((c.vocab_size, c.max_seq_len), (262_144, 32_768));
    assert_eq!(c.rope_layout, RopeLayout::Neox);
    assert_eq!((c.rope_theta, c.rope_theta_local), (1e6, 1e4));
    assert_eq!(c.activation, Activation::GeluTanh);
    let global: Vec<usize> = (0..18)
        .filter(|&l| c.layer_kinds[l] == LayerKind::Global)
        .collect();
    assert_eq!(global, [5, 11, 17]);
    assert!(
        c.layer_kinds
            .iter()
            .all(|k| matches!(k, LayerKind::Global | LayerKind::Local { window: 512 }))
    );
    assert_eq!(c.embed_scale, 640f32.sqrt());
    assert_eq!(c.attn_scale, 1.0 / 16.0);
    assert!(c.qk_norm && c.post_norms && c.shared_classifier);
    assert_eq!((c.bos_id, c.stop_ids.as_slice()), (2, [1, 106].as_slice()));
    // The GGUF norm weights already include Gemma's +1 (llama.cpp's converter adds it).
    let w0 = &model.weights.layers[0].attn_norm;
    assert_eq!(&w0[..4], &[16.0, 16.875, 10.8125, 41.5]);
    // MQA with ring buffers: 3 global layers × full + 15 local × 512 positions.
    assert_eq!(
        c.kv_bytes_windowed(8192, 4),
        2 * 256 * 4 * (3 * 8192 + 15 * 512)
    );
    assert_eq!(c.kv_bytes_full(8192, 4), 2 * 18 * 256 * 4 * 8192);
    // The tokenizer: no dummy prefix, spaces as ▁.
    let spm = tok.as_spm().expect("a GGUF vocabulary");
    assert!(!spm.add_dummy_prefix && spm.escape_spaces);
    assert_eq!(
        tok.decode_all(&tok.encode("Hello  world\n", true, false), false),
        "Hello  world\n"
    );
}

#[test]
#[ignore = "needs gemma-3-270m: set KVLAB_MODELS"]
fn gemma3_config_from_the_header_alone_equals_the_loaded_one() {
    let Some(path) = common::gemma() else { return };
    let header = kvlab_model::gguf_model::read_gguf_config(&path).unwrap();
    let (model, _) = kvlab_model::load_gguf(&path).unwrap();
    assert_eq!(header, model.config);
}

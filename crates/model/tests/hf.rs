//! Hugging Face folders: the tiny checkpoints of `fixtures/models/tiny-*` (written by
//! transformers' `save_pretrained`, scripts/hf_oracle.py) load as configuration of the one
//! model, and their `tokenizer.json` gives transformers' ids and text on every fixture text
//! (records in `fixtures/hf/<name>.json`). The engines' greedy ids are checked against
//! transformers' in kvlab-cpu's `hf_engines` test and in `cargo xtask verify`.

// Test code may unwrap: a failed unwrap is a failed test (clippy.toml allows it in #[test]
// functions; this covers the helpers too).
#![allow(clippy::unwrap_used)]

mod common;

use std::path::{Path, PathBuf};

use common::ids;
use kvlab_model::fixtures::as_streamed;
use kvlab_model::hf::{self, HfArch};
use kvlab_model::{Activation, LayerKind, RopeLayout, Tokenizer};
use serde_json::Value;

/// The tiny Hugging Face checkpoints: the manifest's models of format `hf` (llama, mistral,
/// qwen2, qwen3, gemma3_text, llama with Llama 3's RoPE scaling), listed once, in
/// fixtures/models.json.
fn hf_models() -> Vec<&'static str> {
    let names: Vec<&str> = kvlab_model::registry::manifest()
        .models
        .iter()
        .filter(|m| m.format == kvlab_model::registry::Format::Hf)
        .map(|m| m.name.as_str())
        .collect();
    assert!(names.len() >= 6, "fixtures/models.json lists {names:?}");
    names
}

fn fixtures() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../../fixtures")
}

fn folder(name: &str) -> PathBuf {
    fixtures().join("models").join(name)
}

fn record(name: &str) -> Value {
    common::fixture_json(&format!("hf/{name}.json"))
}

#[test]
fn configs_are_read_as_each_architecture_says() {
    let (c, arch) = hf::read_hf_config(&folder("tiny-llama")).unwrap();
    assert_eq!(arch, HfArch::Llama);
    assert_eq!(
        (c.dim, c.n_layers, c.n_heads, c.n_kv_heads, c.head_dim),
        (64, 3, 8, 2, 8)
    );
    assert_eq!(c.rope_layout, RopeLayout::Neox);
    assert!(!c.shared_classifier && !c.qk_norm && !c.post_norms);
    assert_eq!(c.norm_eps, 1e-5);
    assert!(c.layer_kinds.iter().all(|k| *k == LayerKind::Global));

    let (c, arch) = hf::read_hf_config(&folder("tiny-mistral")).unwrap();
    assert_eq!(arch, HfArch::Mistral);
    assert!(
        c.layer_kinds
            .iter()
            .all(|k| *k == LayerKind::Local { window: 24 })
    );
    assert_eq!(c.n_kv_heads, 1, "MQA");

    let (c, arch) = hf::read_hf_config(&folder("tiny-qwen3")).unwrap();
    assert_eq!(arch, HfArch::Qwen3);
    assert_eq!(
        c.head_dim, 32,
        "head_dim from the config, not hidden / heads"
    );
    assert!(c.qk_norm && c.shared_classifier && !c.post_norms);
    assert_eq!(c.rope_theta, 1e6);

    let (c, arch) = hf::read_hf_config(&folder("tiny-qwen2")).unwrap();
    assert_eq!(arch, HfArch::Qwen2);
    assert!(c.qkv_bias && !c.qk_norm);

    let (c, _) = hf::read_hf_config(&folder("tiny-llama3")).unwrap();
    let s = c.rope_scaling.expect("rope_type llama3");
    assert_eq!((s.factor, s.original_max_position_embeddings), (8.0, 64));
    // Head 16, base 500,000: pair 0 (wavelength 6.3) is kept, pair 1 (32.5) interpolated,
    // pairs 2.. (≥ 168) divided by 8, as transformers' _compute_llama3_parameters does.
    let plain: Vec<f32> = (0..8)
        .map(|j| 500_000f32.powf(-(2 * j) as f32 / 16.0))
        .collect();
    let f = c.rope_freqs(c.rope_theta);
    assert_eq!(f[0], plain[0]);
    assert!(f[1] < plain[1] && f[1] > plain[1] / 8.0);
    assert!(
        f[2..]
            .iter()
            .zip(&plain[2..])
            .all(|(a, b)| (a - b / 8.0).abs() <= 1e-6 * b)
    );

    let (c, arch) = hf::read_hf_config(&folder("tiny-gemma3")).unwrap();
    assert_eq!(arch, HfArch::Gemma3);
    assert!(c.qk_norm && c.post_norms && c.shared_classifier);
    assert_eq!(c.activation, Activation::GeluTanh);
    assert_eq!(c.embed_scale, 8.0);
    assert_eq!(c.attn_scale, 0.25, "query_pre_attn_scalar 16");
    assert_eq!(
        c.layer_kinds,
        [
            vec![LayerKind::Local { window: 16 }; 3],
            vec![LayerKind::Global]
        ]
        .concat()
    );
    assert_eq!((c.rope_theta, c.rope_theta_local), (1e6, 1e4));
}

#[test]
fn every_folder_loads_with_its_stop_ids() {
    for name in hf_models() {
        let (m, tok, files) = hf::load_hf_dir(&folder(name)).unwrap();
        let r = record(name);
        assert_eq!(
            m.config.stop_ids,
            vec![r["eos_id"].as_u64().unwrap() as u32],
            "{name}"
        );
        assert_eq!(
            tok.bos_id(),
            r["bos_id"].as_u64().map(|b| b as u32),
            "{name}"
        );
        assert_eq!(
            files.len(),
            3,
            "{name}: config, tokenizer, one safetensors file"
        );
    }
}

#[test]
fn tokenizer_json_gives_transformers_ids_and_text() {
    for name in hf_models() {
        let (_, tok, _) = hf::load_hf_dir(&folder(name)).unwrap();
        let r = record(name);
        let mut compared = 0;
        for t in r["tokens"].as_array().unwrap() {
            let text = t["text"].as_str().unwrap();
            assert_eq!(
                tok.encode_special(text, true, false),
                ids(&t["ids"]),
                "{name}: {text:?}"
            );
            let plain = ids(&t["ids_no_special"]);
            assert_eq!(tok.encode(text, false, false), plain, "{name}: {text:?}");
            // transformers prints a BOS written in the text; kvlab's decode_all leaves BOS out.
            if tok.bos_id().is_none_or(|b| !plain.contains(&b)) {
                assert_eq!(
                    tok.decode_all(&plain, true),
                    t["decoded"].as_str().unwrap(),
                    "{name}"
                );
                compared += 1;
            }
            assert!(
                tok.min_tokens(text) <= plain.len(),
                "{name}: min_tokens is a lower bound"
            );
        }
        assert!(compared >= 10, "{name}: {compared} texts decoded");
        for c in r["cases"].as_array().unwrap() {
            let text = c["prompt"].as_str().unwrap();
            let want = ids(&c["prompt_ids"]);
            if !text.is_empty() {
                // The script cuts prompts longer than the context allows (the last one).
                let got = tok.encode_special(text, true, false);
                assert_eq!(&got[..want.len().min(got.len())], want, "{name}: {text:?}");
            }
            let generated = ids(&c["generated_ids"]);
            if tok.bos_id().is_none_or(|b| !generated.contains(&b)) {
                assert_eq!(
                    tok.decode_all(&generated, true),
                    c["generated_text"].as_str().unwrap(),
                    "{name}: decoding {generated:?} with special tokens"
                );
            }
            // Special tokens left out, BOS among them: transformers' skip_special_tokens=True.
            assert_eq!(
                tok.decode_all(&generated, false),
                c["generated_text_skip_special"].as_str().unwrap(),
                "{name}: decoding {generated:?}"
            );
        }
    }
}

#[test]
fn streamed_bytes_make_the_same_text() {
    // A character split over byte tokens streams whole (the byte-level llama and the
    // byte-fallback mistral both split 😀 into four tokens).
    for name in ["tiny-llama", "tiny-mistral"] {
        let (_, tok, _) = hf::load_hf_dir(&folder(name)).unwrap();
        let text = "and \u{e9}\u{e8} \u{4e2d}\u{6587} \u{1f600}!";
        let ids = tok.encode(text, true, false);
        let mut stream = kvlab_model::tokenizer::Utf8Stream::default();
        let mut out = String::new();
        for w in ids.windows(2) {
            out += &stream.push(&tok.decode(w[0], w[1], false));
        }
        out += &stream.finish();
        assert_eq!(out, text, "{name}");
    }
}

/// What `kvlab generate` and `kvlab serve` stream for a generation that emits special tokens
/// mid-text (`<s>`, `<unk>`, `<|im_end|>` in these random models): transformers'
/// `decode(ids, skip_special_tokens=True)`, vLLM's and llama.cpp's default; with `--special`,
/// `skip_special_tokens=False`. Compared where the text is valid UTF-8 (the stream replaces only
/// invalid bytes by U+FFFD, transformers' `ByteFallback` every byte of an invalid run), less
/// the control characters other than whitespace, which the stream drops as run.c does.
#[test]
fn streamed_text_leaves_special_tokens_out_as_transformers_does() {
    let (mut with_special, mut compared) = (0, 0);
    for name in hf_models() {
        let (_, tok, _) = hf::load_hf_dir(&folder(name)).unwrap();
        let r = record(name);
        for c in r["cases"].as_array().unwrap() {
            let generated = ids(&c["generated_ids"]);
            let prev = *ids(&c["prompt_ids"]).last().unwrap();
            let stream = |special: bool| {
                let mut utf8 = kvlab_model::tokenizer::Utf8Stream::default();
                let mut out = String::new();
                let mut p = prev;
                for &t in &generated {
                    out += &utf8.push(&tok.decode(p, t, special));
                    p = t;
                }
                out + &utf8.finish()
            };
            let printable = |key: &str| as_streamed(c[key].as_str().unwrap());
            let (skipped, shown) = (
                printable("generated_text_skip_special"),
                printable("generated_text"),
            );
            if generated.iter().any(|&t| tok.is_special(t)) {
                with_special += 1;
                assert_ne!(skipped, shown, "{name}: the fixture shows the difference");
            }
            let bos_inside = tok.bos_id().is_some_and(|b| generated.contains(&b));
            if !skipped.contains('\u{FFFD}') && !bos_inside {
                assert_eq!(stream(false), skipped, "{name}: {generated:?}");
                compared += 1;
            }
            if !shown.contains('\u{FFFD}') && !bos_inside {
                assert_eq!(stream(true), shown, "{name}: {generated:?} with --special");
            }
        }
    }
    assert!(
        with_special >= 5 && compared >= 15,
        "{with_special} generations emit a special token; {compared} compared"
    );
}

fn copy_folder(name: &str, to: &Path) {
    std::fs::create_dir_all(to).unwrap();
    for e in std::fs::read_dir(folder(name)).unwrap() {
        let e = e.unwrap();
        std::fs::copy(e.path(), to.join(e.file_name())).unwrap();
    }
}

fn scratch(tag: &str) -> PathBuf {
    std::env::temp_dir().join(format!("kvlab-hf-test-{}-{tag}", std::process::id()))
}

fn edit_config(dir: &Path, edit: impl FnOnce(&mut Value)) {
    let p = dir.join("config.json");
    let mut v: Value = serde_json::from_str(&std::fs::read_to_string(&p).unwrap()).unwrap();
    edit(&mut v);
    std::fs::write(&p, serde_json::to_string(&v).unwrap()).unwrap();
}

#[test]
fn unsupported_features_are_refused_by_name() {
    type Edit = fn(&mut Value);
    let cases: [(&str, Edit, &str); 8] = [
        (
            "moe",
            |v| v["model_type"] = "qwen2_moe".into(),
            "model_type \"qwen2_moe\"",
        ),
        (
            "bias",
            |v| v["attention_bias"] = true.into(),
            "attention_bias",
        ),
        (
            "yarn",
            |v| v["rope_parameters"]["rope_type"] = "yarn".into(),
            "rope_type \"yarn\"",
        ),
        (
            "llama3-incomplete",
            |v| v["rope_parameters"]["rope_type"] = "llama3".into(),
            "rope_type llama3 without factor",
        ),
        (
            "old-rope-scaling",
            |v| {
                v["rope_parameters"] = Value::Null;
                v["rope_scaling"] = serde_json::json!({"type": "yarn", "factor": 4.0});
            },
            "\"yarn\"",
        ),
        (
            "act",
            |v| v["hidden_act"] = "relu".into(),
            "hidden_act \"relu\"",
        ),
        (
            "absurd",
            |v| v["num_hidden_layers"] = 1_000_000.into(),
            "absurd",
        ),
        ("heads", |v| v["num_key_value_heads"] = 3.into(), "multiple"),
    ];
    for (tag, edit, want) in cases {
        let dir = scratch(tag);
        copy_folder("tiny-llama", &dir);
        edit_config(&dir, edit);
        let err = hf::load_hf_dir(&dir).map(|_| ()).unwrap_err().to_string();
        assert!(err.contains(want), "{tag}: {err}");
        std::fs::remove_dir_all(&dir).unwrap();
    }
}

#[test]
fn broken_checkpoints_give_errors_not_panics() {
    // A truncated safetensors file, a tensor of the wrong shape, a missing tokenizer.
    let dir = scratch("truncated");
    copy_folder("tiny-llama", &dir);
    let st = dir.join("model.safetensors");
    let bytes = std::fs::read(&st).unwrap();
    std::fs::write(&st, &bytes[..bytes.len() / 2]).unwrap();
    assert!(hf::load_hf_dir(&dir).is_err());
    std::fs::write(&st, &bytes[..4]).unwrap();
    assert!(hf::load_hf_dir(&dir).is_err());
    std::fs::write(&st, &bytes).unwrap();
    edit_config(&dir, |v| v["intermediate_size"] = 96.into());
    let err = hf::load_hf_dir(&dir).map(|_| ()).unwrap_err().to_string();
    assert!(err.contains("mlp.gate_proj.weight has shape"), "{err}");
    std::fs::remove_file(dir.join("tokenizer.json")).unwrap();
    assert!(hf::load_hf_dir(&dir).is_err());
    std::fs::remove_dir_all(&dir).unwrap();
}

#[test]
fn tokenizer_enum_keeps_spm_behaviour() {
    // The llama2.c vocabulary still goes through the hand-written BPE.
    let p = kvlab_model::registry::test_model_file("tok512.bin").expect("shipped");
    let t = Tokenizer::load_llama2c(&p, 512).unwrap();
    assert!(t.as_spm().is_some());
    assert_eq!(t.bos_id(), Some(1));
    let ids = t.encode("Once upon a time", true, false);
    assert_eq!(t.decode_all(&ids, false), "Once upon a time");
}

#[test]
fn chat_templates_render_as_transformers_renders_them() {
    use kvlab_model::chat::Message;
    let mut rendered = 0;
    for name in ["tiny-qwen3", "tiny-mistral"] {
        let (_, tok, _) = hf::load_hf_dir(&folder(name)).unwrap();
        let template = tok
            .chat_template()
            .expect("the folder has chat_template.jinja");
        for c in record(name)["chats"].as_array().unwrap() {
            let messages: Vec<Message> = c["messages"]
                .as_array()
                .unwrap()
                .iter()
                .map(|m| Message::new(m["role"].as_str().unwrap(), m["content"].as_str().unwrap()))
                .collect();
            let got = template.render(&messages, c["add_generation_prompt"].as_bool().unwrap());
            match (got, c["text"].as_str(), c["error"].as_str()) {
                (Ok(text), Some(want), _) => {
                    assert_eq!(text, want, "{name}: {messages:?}");
                    // Special tokens written by the template are parsed as tokens, and nothing
                    // is added: transformers' apply_chat_template(tokenize=True).
                    assert_eq!(
                        tok.encode_special(&text, false, false),
                        ids(&c["ids"]),
                        "{name}"
                    );
                    rendered += 1;
                }
                (Err(e), None, Some(why)) => {
                    assert!(e.to_string().contains(why), "{name}: {e} vs {why}");
                }
                (got, _, _) => panic!("{name}: {messages:?}: kvlab {got:?}, transformers {c}"),
            }
        }
    }
    assert!(rendered >= 8, "{rendered} conversations rendered");
    let (_, tok, _) = hf::load_hf_dir(&folder("tiny-llama")).unwrap();
    assert!(
        tok.chat_template().is_none(),
        "tiny-llama ships no template"
    );
}

#[test]
fn sharded_checkpoints_load_through_their_index() {
    // tiny-llama's tensors split over two shards named by model.safetensors.index.json, as
    // save_pretrained writes checkpoints larger than its shard size.
    let dir = scratch("sharded");
    copy_folder("tiny-llama", &dir);
    let bytes = std::fs::read(dir.join("model.safetensors")).unwrap();
    std::fs::remove_file(dir.join("model.safetensors")).unwrap();
    let st = safetensors::SafeTensors::deserialize(&bytes).unwrap();
    let mut names: Vec<String> = st.names().into_iter().map(String::from).collect();
    names.sort();
    let mut weight_map = serde_json::Map::new();
    for (k, part) in names.chunks(names.len().div_ceil(2)).enumerate() {
        let file = format!("model-{:05}-of-00002.safetensors", k + 1);
        let views: Vec<(String, safetensors::tensor::TensorView)> = part
            .iter()
            .map(|n| (n.clone(), st.tensor(n).unwrap()))
            .collect();
        safetensors::serialize_to_file(views, None, &dir.join(&file)).unwrap();
        for n in part {
            weight_map.insert(n.clone(), file.clone().into());
        }
    }
    let index = serde_json::json!({"metadata": {}, "weight_map": weight_map});
    std::fs::write(dir.join("model.safetensors.index.json"), index.to_string()).unwrap();
    let (sharded, _, files) = hf::load_hf_dir(&dir).unwrap();
    let (whole, _, _) = hf::load_hf_dir(&folder("tiny-llama")).unwrap();
    assert_eq!(files.len(), 4, "config, tokenizer, two shards: {files:?}");
    let all = |m: &kvlab_model::Model| -> Vec<Vec<f32>> {
        let w = &m.weights;
        let mut v = vec![w.token_embedding.to_vec(), w.final_norm.to_vec()];
        for l in &w.layers {
            v.extend(l.tensors().iter().map(|t| t.to_vec()));
        }
        v.push(w.classifier().to_vec());
        v
    };
    assert_eq!(all(&sharded), all(&whole));
    // A shard the index names but the folder lacks is an error naming it.
    std::fs::remove_file(dir.join("model-00002-of-00002.safetensors")).unwrap();
    let err = hf::load_hf_dir(&dir).map(|_| ()).unwrap_err().to_string();
    assert!(err.contains("model-00002-of-00002.safetensors"), "{err}");
    std::fs::remove_dir_all(&dir).unwrap();
}

//! Hugging Face checkpoint folders: `config.json` ([`config`], each architecture's facts cited
//! there), `model.safetensors` or its shards ([`safetensors`]), `tokenizer.json`
//! ([`crate::tokenizer::HfTokenizer`]) and, when present, `generation_config.json` (more stop
//! ids). The folder a `save_pretrained` writes, or a hub snapshot.
//!
//! Tensor names (transformers' modeling files): `model.embed_tokens`, per layer
//! `model.layers.N.` + `input_layernorm`, `self_attn.{q,k,v,o}_proj` (with `.bias` on q, k, v
//! for Qwen2), `self_attn.{q,k}_norm`
//! (Qwen3, Gemma 3), `post_attention_layernorm`, `mlp.{gate,up,down}_proj`, and for Gemma 3
//! `pre_feedforward_layernorm` and `post_feedforward_layernorm`; `model.norm`, `lm_head`. In
//! Llama, Mistral and Qwen3 `post_attention_layernorm` is the norm *before* the MLP; in Gemma 3
//! it is the norm of the attention output (and `pre_feedforward_layernorm` the MLP's).

pub mod config;
pub mod safetensors;

use std::path::{Path, PathBuf};

use serde_json::Value;

pub use config::HfArch;
use safetensors::SafetensorsFiles;

use crate::weights::{LayerWeights, Tensor};
use crate::{Config, Error, Model, Result, Tokenizer, Weights};

/// Whether `dir` looks like a Hugging Face checkpoint folder (it has a `config.json`).
pub fn is_hf_dir(dir: &Path) -> bool {
    dir.is_dir() && dir.join("config.json").is_file()
}

fn read_json(path: &Path) -> Result<Value> {
    let text = std::fs::read_to_string(path).map_err(|source| Error::Open {
        path: path.into(),
        source,
    })?;
    serde_json::from_str(&text).map_err(|e| Error::Format(format!("{}: {e}", path.display())))
}

/// The config of folder `dir` and its architecture, from `config.json` plus the stop ids of
/// `generation_config.json` (transformers' `generate` stops on those); no tensor is read.
///
/// # Errors
/// [`Error::Open`] without a `config.json`; as [`config::parse`].
pub fn read_hf_config(dir: &Path) -> Result<(Config, HfArch)> {
    let cfg = read_json(&dir.join("config.json"))?;
    let (mut c, arch) = config::parse(&cfg).map_err(|e| match e {
        Error::Config(m) => Error::Config(format!("{}: {m}", dir.display())),
        other => other,
    })?;
    let gen_path = dir.join("generation_config.json");
    if gen_path.is_file() {
        let g = read_json(&gen_path)?;
        let extra = match &g["eos_token_id"] {
            Value::Array(xs) => xs.iter().filter_map(Value::as_u64).collect(),
            x => x.as_u64().into_iter().collect::<Vec<_>>(),
        };
        for id in extra {
            let id = u32::try_from(id).unwrap_or(u32::MAX);
            if id as usize >= c.vocab_size {
                return Err(Error::Config(format!(
                    "{}: eos_token_id {id} is outside the vocabulary",
                    gen_path.display()
                )));
            }
            if !c.stop_ids.contains(&id) {
                c.stop_ids.push(id);
            }
        }
    }
    Ok((c, arch))
}

/// Loads a Hugging Face folder: its weights (mapped, see [`safetensors`]) and `tokenizer.json`.
///
/// Memory: the safetensors files are mapped, not read; f32 and bf16/f16 matrices stay in the
/// map. Only Gemma 3's norm weights (a few KB) are copied, to add their 1.
///
/// # Errors
/// As [`read_hf_config`]; [`Error::Format`] for a missing, misshapen or unsupported tensor
/// (named) or a tokenizer larger than the model's vocabulary; [`Error::Tokenizer`] for a bad
/// `tokenizer.json`.
pub fn load_hf_dir(dir: &Path) -> Result<(Model, Tokenizer, Vec<PathBuf>)> {
    let (c, arch) = read_hf_config(dir)?;
    let tok_path = dir.join("tokenizer.json");
    let mut tok = crate::tokenizer::HfTokenizer::load(&tok_path)?
        .with_chat_template(crate::chat::ChatTemplate::from_hf_dir(dir)?);
    if let Some(&eos) = c.stop_ids.first() {
        tok = tok.with_eos(eos);
    }
    if tok.vocab_size() > c.vocab_size {
        return Err(Error::Format(format!(
            "{}: {} tokens, but the model's vocab_size is {}",
            tok_path.display(),
            tok.vocab_size(),
            c.vocab_size
        )));
    }
    let st = SafetensorsFiles::open(dir)?;
    let (d, hd) = (c.dim, c.head_dim);
    let norm = |name: &str, len: usize| -> Result<Tensor> {
        let t = st.tensor(name, &[len])?;
        Ok(if arch.norm_adds_one() {
            t.iter().map(|w| w + 1.0).collect::<Vec<f32>>().into()
        } else {
            t
        })
    };
    let layers = (0..c.n_layers)
        .map(|l| {
            let p = format!("model.layers.{l}.");
            let m = |n: &str, rows: usize, cols: usize| {
                st.tensor(&format!("{p}{n}.weight"), &[rows, cols])
            };
            let v = |n: &str, len: usize| norm(&format!("{p}{n}.weight"), len);
            let none = Tensor::default;
            let (ffn_norm, post_attn_norm, post_ffn_norm) = if c.post_norms {
                (
                    v("pre_feedforward_layernorm", d)?,
                    v("post_attention_layernorm", d)?,
                    v("post_feedforward_layernorm", d)?,
                )
            } else {
                (v("post_attention_layernorm", d)?, none(), none())
            };
            let (q_norm, k_norm) = if c.qk_norm {
                (v("self_attn.q_norm", hd)?, v("self_attn.k_norm", hd)?)
            } else {
                (none(), none())
            };
            let bias = |n: &str, len: usize| st.tensor(&format!("{p}{n}.bias"), &[len]);
            let (bq, bk, bv) = if c.qkv_bias {
                (
                    bias("self_attn.q_proj", c.q_dim())?,
                    bias("self_attn.k_proj", c.kv_dim())?,
                    bias("self_attn.v_proj", c.kv_dim())?,
                )
            } else {
                (none(), none(), none())
            };
            Ok(LayerWeights {
                attn_norm: v("input_layernorm", d)?,
                wq: m("self_attn.q_proj", c.q_dim(), d)?,
                wk: m("self_attn.k_proj", c.kv_dim(), d)?,
                wv: m("self_attn.v_proj", c.kv_dim(), d)?,
                wo: m("self_attn.o_proj", d, c.q_dim())?,
                bq,
                bk,
                bv,
                q_norm,
                k_norm,
                post_attn_norm,
                ffn_norm,
                w1: m("mlp.gate_proj", c.hidden_dim, d)?,
                w2: m("mlp.down_proj", d, c.hidden_dim)?,
                w3: m("mlp.up_proj", c.hidden_dim, d)?,
                post_ffn_norm,
            })
        })
        .collect::<Result<Vec<_>>>()?;
    let has_head = st.contains("lm_head.weight");
    if !c.shared_classifier && !has_head {
        return Err(Error::Format(format!(
            "{}: tie_word_embeddings is false but the checkpoint has no lm_head.weight",
            dir.display()
        )));
    }
    let weights = Weights {
        token_embedding: st.tensor("model.embed_tokens.weight", &[c.vocab_size, d])?,
        layers,
        final_norm: norm("model.norm.weight", d)?,
        classifier: if c.shared_classifier {
            None
        } else {
            Some(st.tensor("lm_head.weight", &[c.vocab_size, d])?)
        },
    };
    let mut files = vec![dir.join("config.json"), tok_path];
    files.extend(st.paths().iter().cloned());
    let model = Model::new(c, weights)?;
    model.weights.prefault();
    Ok((model, tok.into(), files))
}

//! A Hugging Face `config.json` as configuration of the one model. Four `model_type`s are read;
//! each fact is from the transformers modeling file named (transformers 5.x, `models/<name>/`):
//!
//! * `llama` (`modeling_llama.py`): RMSNorm before attention (`input_layernorm`) and before the
//!   MLP (`post_attention_layernorm`), SwiGLU `down(silu(gate(x)) · up(x))` (`hidden_act`
//!   "silu"), RoPE by `rotate_half`, i.e. pairs (i, i + head_dim/2): [`RopeLayout::Neox`], with
//!   q and k used as stored (convert_hf_to_gguf.py permutes them into llama.cpp's adjacent pairs;
//!   kvlab keeps HF's order and layout instead), scale `head_dim^-0.5`, `head_dim` from the
//!   config or `hidden_size / num_attention_heads`, the classifier `lm_head` unless
//!   `tie_word_embeddings`;
//! * `mistral` (`modeling_mistral.py`): Llama, with every layer a sliding window of
//!   `sliding_window` positions when it is set (the mask keeps `q − window < k ≤ q`,
//!   `masking_utils.sliding_window_overlay`): [`LayerKind::Local`];
//! * `qwen2` (`modeling_qwen2.py`): Llama with biases on the q, k and v projections (`q_proj`,
//!   `k_proj`, `v_proj` are `nn.Linear(..., bias=True)`; `o_proj` has none);
//! * `qwen3` (`modeling_qwen3.py`): Llama with per-head RMSNorm of q and k before RoPE (`q_norm`,
//!   `k_norm`, weights (head_dim,)), no q/k/v bias;
//! * `gemma3_text` (`modeling_gemma3.py`): Gemma 3's text model: embeddings scaled by
//!   sqrt(hidden_size), RMSNorm computing x̂ · (1 + w) (the 1 is added to the weights here,
//!   as llama.cpp's converter does), QK-norm, post-attention and post-FFN norms, GeGLU with
//!   `gelu_pytorch_tanh`, scale `query_pre_attn_scalar^-0.5`, `layer_types` of
//!   "sliding_attention" (RoPE base `rope_local_base_freq`, or the sliding entry of
//!   `rope_parameters`) and "full_attention" (`rope_theta`).
//!
//! RoPE's base is `rope_theta` (transformers 4) or `rope_parameters.rope_theta` (transformers
//! 5); `rope_type` "llama3" (Llama 3.1 and 3.2: `factor`, `low_freq_factor`, `high_freq_factor`,
//! `original_max_position_embeddings`) scales the frequencies as `_compute_llama3_parameters`
//! does ([`Llama3RopeScaling`]). Refused with an error naming the field rather than computed
//! wrongly: any other `model_type` (MoE among them), any other `rope_type` (YaRN,
//! linear, dynamic), `attention_bias`, `mlp_bias`, logit soft-capping, an activation other than
//! the above, `use_sliding_window` in Qwen3, and absurd sizes.

use serde_json::Value;

use crate::config::Llama3RopeScaling;
use crate::config::{MAX_DIM, MAX_LAYERS, MAX_SEQ_LEN, MAX_VOCAB, check_field};
use crate::{Activation, Config, Error, LayerKind, Result, RopeLayout};

/// The architectures kvlab reads, by `model_type`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum HfArch {
    /// `"llama"`: transformers' LlamaForCausalLM (Llama 2/3, SmolLM, TinyLlama).
    Llama,
    /// `"mistral"`: Llama's layout with an optional `sliding_window` on every layer.
    Mistral,
    /// `"qwen2"`: Llama's layout with biases on q, k and v.
    Qwen2,
    /// `"qwen3"`: Llama's layout with RMSNorm on each head's q and k (`qk_norm`).
    Qwen3,
    /// `"gemma3_text"`: Gemma 3, sliding-window and global layers interleaved, GeGLU, scaled
    /// embeddings.
    Gemma3,
}

impl HfArch {
    /// The `model_type`s read, for error messages.
    pub const NAMES: &'static str = "llama, mistral, qwen2, qwen3, gemma3_text";

    fn of(model_type: &str) -> Option<HfArch> {
        Some(match model_type {
            "llama" => HfArch::Llama,
            "mistral" => HfArch::Mistral,
            "qwen2" => HfArch::Qwen2,
            "qwen3" => HfArch::Qwen3,
            "gemma3_text" => HfArch::Gemma3,
            _ => return None,
        })
    }

    /// Norm weights are stored as w for x̂ · (1 + w) (Gemma): the loader adds 1.
    pub fn norm_adds_one(self) -> bool {
        self == HfArch::Gemma3
    }
}

fn bad(what: String) -> Error {
    Error::Config(format!("config.json: {what}"))
}

/// A field as a positive integer, bounded.
fn size(v: &Value, key: &str, max: usize) -> Result<usize> {
    let n = v[key]
        .as_u64()
        .ok_or_else(|| bad(format!("{key} is missing or not a non-negative integer")))?;
    check_field(key, usize::try_from(n).unwrap_or(usize::MAX), max)
}

fn opt_size(v: &Value, key: &str, max: usize) -> Result<Option<usize>> {
    match &v[key] {
        Value::Null => Ok(None),
        _ => size(v, key, max).map(Some),
    }
}

fn float(v: &Value, key: &str) -> Result<Option<f32>> {
    match &v[key] {
        Value::Null => Ok(None),
        x => x
            .as_f64()
            .map(|f| Some(f as f32))
            .ok_or_else(|| bad(format!("{key} is not a number"))),
    }
}

/// Token ids of a field that is an id, a list of ids, or absent.
fn ids(v: &Value, key: &str) -> Result<Vec<u32>> {
    let one = |x: &Value| {
        x.as_u64()
            .and_then(|i| u32::try_from(i).ok())
            .ok_or_else(|| bad(format!("{key} holds {x}, not a token id")))
    };
    match &v[key] {
        Value::Null => Ok(Vec::new()),
        Value::Array(xs) => xs.iter().map(one).collect(),
        x => Ok(vec![one(x)?]),
    }
}

/// What `rope_parameters` (transformers 5) or `rope_theta`/`rope_scaling` (transformers 4)
/// say: the base, and Llama 3's scaling when `rope_type` is "llama3"; any other scaling is
/// refused. `params` is the object to read (for Gemma 3, one per layer type).
fn rope(
    params: &Value,
    cfg: &Value,
    what: &str,
) -> Result<(Option<f32>, Option<Llama3RopeScaling>)> {
    // transformers 4 kept the scaling apart from the base, in `rope_scaling`.
    let scaling = if cfg["rope_parameters"].is_null() && !cfg["rope_scaling"].is_null() {
        &cfg["rope_scaling"]
    } else {
        params
    };
    let ty = scaling["rope_type"]
        .as_str()
        .or(scaling["type"].as_str())
        .unwrap_or("default");
    let llama3 = match ty {
        "default" => None,
        "llama3" => {
            let f = |k: &str| {
                float(scaling, k)?
                    .ok_or_else(|| bad(format!("{what}: rope_type llama3 without {k}")))
            };
            Some(Llama3RopeScaling {
                factor: f("factor")?,
                low_freq_factor: f("low_freq_factor")?,
                high_freq_factor: f("high_freq_factor")?,
                original_max_position_embeddings: size(
                    scaling,
                    "original_max_position_embeddings",
                    MAX_SEQ_LEN,
                )?,
            })
        }
        other => {
            return Err(bad(format!(
                "{what} has rope_type {other:?}; kvlab reads unscaled RoPE (\"default\") and Llama 3's \"llama3\""
            )));
        }
    };
    Ok((float(params, "rope_theta")?, llama3))
}

/// The [`Config`] of a `config.json` (see the module doc for what is read and refused), and
/// the architecture, which the weight loader needs for tensor names and norm offsets.
///
/// # Errors
/// [`Error::Config`] naming the field: a missing or absurd size, an unsupported `model_type`
/// or feature, inconsistent shapes.
pub fn parse(cfg: &Value) -> Result<(Config, HfArch)> {
    let model_type = cfg["model_type"]
        .as_str()
        .ok_or_else(|| bad("model_type is missing".into()))?;
    let arch = HfArch::of(model_type).ok_or_else(|| {
        bad(format!(
            "model_type {model_type:?} is not supported; kvlab reads {}",
            HfArch::NAMES
        ))
    })?;
    // Qwen2's q, k and v projections always have biases (modeling_qwen2.py: bias=True; its
    // config has no attention_bias field); elsewhere a bias is refused.
    for key in ["attention_bias", "mlp_bias"] {
        if arch != HfArch::Qwen2 && cfg[key].as_bool() == Some(true) {
            return Err(bad(format!(
                "{key} is true: linear layers with biases are not supported"
            )));
        }
    }
    for key in ["final_logit_softcapping", "attn_logit_softcapping"] {
        if !cfg[key].is_null() {
            return Err(bad(format!(
                "{key} = {}: logit soft-capping is not supported",
                cfg[key]
            )));
        }
    }
    if matches!(arch, HfArch::Qwen2 | HfArch::Qwen3)
        && cfg["use_sliding_window"].as_bool() == Some(true)
    {
        return Err(bad(
            "use_sliding_window is true: Qwen's sliding-window layers are not supported".into(),
        ));
    }
    let dim = size(cfg, "hidden_size", MAX_DIM)?;
    let hidden_dim = size(cfg, "intermediate_size", 1 << 20)?;
    let n_layers = size(cfg, "num_hidden_layers", MAX_LAYERS)?;
    let n_heads = size(cfg, "num_attention_heads", MAX_DIM)?;
    let n_kv_heads = opt_size(cfg, "num_key_value_heads", MAX_DIM)?.unwrap_or(n_heads);
    let vocab = size(cfg, "vocab_size", MAX_VOCAB)?;
    let ctx = size(cfg, "max_position_embeddings", MAX_SEQ_LEN)?;
    let head_dim = match opt_size(cfg, "head_dim", MAX_DIM)? {
        Some(h) => h,
        None if dim.is_multiple_of(n_heads) => dim / n_heads,
        None => {
            return Err(bad(format!(
                "hidden_size ({dim}) is not a multiple of num_attention_heads ({n_heads}) and head_dim is absent"
            )));
        }
    };
    let act = cfg["hidden_act"]
        .as_str()
        .or(cfg["hidden_activation"].as_str())
        .unwrap_or("silu");
    let activation = match act {
        "silu" | "swish" => Activation::Silu,
        "gelu_pytorch_tanh" => Activation::GeluTanh,
        other => {
            return Err(bad(format!(
                "hidden_act {other:?} is not supported (silu and gelu_pytorch_tanh are)"
            )));
        }
    };
    let tied = cfg["tie_word_embeddings"]
        .as_bool()
        .unwrap_or(arch == HfArch::Gemma3);
    let mut c = Config::llama(
        dim, hidden_dim, n_layers, n_heads, n_kv_heads, vocab, ctx, tied,
    );
    c.head_dim = head_dim;
    c.attn_scale = 1.0 / (head_dim as f32).sqrt();
    c.activation = activation;
    c.rope_layout = RopeLayout::Neox;
    c.norm_eps = float(cfg, "rms_norm_eps")?.unwrap_or(1e-6);
    let params = &cfg["rope_parameters"];
    match arch {
        HfArch::Gemma3 => gemma3(cfg, &mut c)?,
        _ => {
            let from = if params.is_null() { cfg } else { params };
            let (theta, scaling) = rope(from, cfg, "rope_parameters")?;
            c.rope_theta = theta.unwrap_or(10_000.0);
            c.rope_theta_local = c.rope_theta;
            c.rope_scaling = scaling;
        }
    }
    if arch == HfArch::Mistral
        && let Some(w) = opt_size(cfg, "sliding_window", MAX_SEQ_LEN)?
    {
        c.layer_kinds = vec![LayerKind::Local { window: w }; n_layers];
    }
    c.qk_norm = matches!(arch, HfArch::Qwen3 | HfArch::Gemma3);
    c.qkv_bias = arch == HfArch::Qwen2;
    let bos = ids(cfg, "bos_token_id")?;
    c.bos_id = bos.first().copied().unwrap_or(0);
    c.stop_ids = ids(cfg, "eos_token_id")?;
    if let Some(id) = c.stop_ids.iter().find(|&&id| id as usize >= vocab) {
        return Err(bad(format!(
            "eos_token_id {id} is outside the vocabulary ({vocab})"
        )));
    }
    c.validate()?;
    Ok((c, arch))
}

/// Gemma 3's text model (`Gemma3TextConfig`): the fields beyond Llama's.
fn gemma3(cfg: &Value, c: &mut Config) -> Result<()> {
    c.embed_scale = (c.dim as f32).sqrt();
    c.post_norms = true;
    let scalar = float(cfg, "query_pre_attn_scalar")?.unwrap_or(c.head_dim as f32);
    if scalar.is_nan() || scalar <= 0.0 {
        return Err(bad(format!("query_pre_attn_scalar = {scalar}")));
    }
    c.attn_scale = 1.0 / scalar.sqrt();
    let window = size(cfg, "sliding_window", MAX_SEQ_LEN)?;
    let types = cfg["layer_types"]
        .as_array()
        .ok_or_else(|| bad("layer_types is missing (transformers ≥ 4.53 writes it)".into()))?;
    if types.len() != c.n_layers {
        return Err(bad(format!(
            "layer_types has {} entries for {} layers",
            types.len(),
            c.n_layers
        )));
    }
    c.layer_kinds = types
        .iter()
        .map(|t| match t.as_str() {
            Some("full_attention") => Ok(LayerKind::Global),
            Some("sliding_attention") => Ok(LayerKind::Local { window }),
            _ => Err(bad(format!("layer_types holds {t}"))),
        })
        .collect::<Result<_>>()?;
    let params = &cfg["rope_parameters"];
    // Gemma 3's larger models scale the global layers' RoPE linearly; kvlab reads the unscaled
    // ones (270M, 1B), and a scaled one is refused by `rope`.
    let unscaled =
        |(theta, scaling): (Option<f32>, Option<Llama3RopeScaling>), what: &str| match scaling {
            None => Ok(theta),
            Some(_) => Err(bad(format!(
                "{what}: Llama 3 RoPE scaling on a Gemma 3 model"
            ))),
        };
    let (full, local) = if params.is_null() {
        (
            unscaled(rope(cfg, cfg, "config")?, "config")?,
            float(cfg, "rope_local_base_freq")?,
        )
    } else {
        let full = "rope_parameters.full_attention";
        let sliding = "rope_parameters.sliding_attention";
        (
            unscaled(rope(&params["full_attention"], cfg, full)?, full)?,
            unscaled(rope(&params["sliding_attention"], cfg, sliding)?, sliding)?,
        )
    };
    c.rope_theta = full.unwrap_or(1_000_000.0);
    c.rope_theta_local = local.unwrap_or(10_000.0);
    Ok(())
}

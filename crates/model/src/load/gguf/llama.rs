//! GGUF files of the plain Llama family as configuration of the one model: architectures
//! `llama`, `qwen2` and `qwen3`, which the llama2.c loader's model also is (SwiGLU, RMSNorm,
//! RoPE, no post-norms, embedding unscaled), each with what sets it apart. Each fact below is
//! from llama.cpp:
//!
//! * hyperparameters (src/llama-model.cpp `load_hparams`), keys prefixed by the architecture
//!   (`{arch}` = `llama`, `qwen2`, `qwen3`): `{arch}.context_length`, `.embedding_length`,
//!   `.block_count`, `.feed_forward_length`, `.attention.head_count`,
//!   `.attention.head_count_kv` (absent: = head_count), `.attention.layer_norm_rms_epsilon`
//!   (required), `.rope.freq_base` (absent: 10,000, `rope_freq_base_train` default);
//! * head_dim = `{arch}.attention.key_length`, absent: embedding_length / head_count
//!   (`n_embd_head_k`); `{arch}.rope.dimension_count` (`n_rot`) must equal it (llama.cpp
//!   asserts `n_embd_head == n_rot` in all three graphs), since kvlab rotates whole heads;
//! * the vocabulary size is the tokenizer's (`tokenizer.ggml.tokens`); `{arch}.vocab_size`,
//!   when written, must agree;
//! * graph (src/models/llama.cpp, qwen2.cpp, qwen3.cpp): x += attn_output(attn(rope(q),
//!   rope(k), v)) with q, k, v = attn_q(n), attn_k(n), attn_v(n) and n = rms_norm(x)·attn_norm,
//!   then x += ffn_down(silu(ffn_gate(m)) · ffn_up(m)) with m = rms_norm(x)·ffn_norm
//!   (`build_ffn(..., LLM_FFN_SILU, LLM_FFN_PAR)`), logits = output(rms_norm(x)·output_norm);
//!   so ffn_gate is llama2.c's w1, ffn_up w3, ffn_down w2;
//!   * `qwen2` adds the biases `attn_q.bias`, `attn_k.bias`, `attn_v.bias` to q, k and v
//!     (qwen2.cpp `ggml_add(ctx0, Qcur, model.layers[il].bq)`);
//!   * `qwen3` applies a per-head RMSNorm to q and k before RoPE, weights `attn_q_norm`,
//!     `attn_k_norm` (head_dim,) (qwen3.cpp `build_norm(Qcur, attn_q_norm, ...)`);
//! * attention scale 1/sqrt(head_dim) (`kq_scale` when `f_attention_scale` is 0, i.e. when
//!   `{arch}.attention.scale` is absent; a file that sets it is refused);
//! * RoPE: `llama_model_rope_type` gives `llama` `LLAMA_ROPE_TYPE_NORM`, ggml's mode 0, which
//!   rotates adjacent pairs (2i, 2i+1): [`crate::RopeLayout::Interleaved`], run.c's layout
//!   (convert_hf_to_gguf.py's `LlamaModel.permute` reorders HF's q/k rows into it; llama2.c
//!   checkpoints are in it already); `qwen2` and `qwen3` get `LLAMA_ROPE_TYPE_NEOX`, pairs
//!   (i, i + head_dim/2): [`crate::RopeLayout::Neox`], with no permutation;
//! * Llama 3.1's RoPE scaling arrives as the tensor `rope_freqs.weight` (head_dim/2,) f32,
//!   which divides each frequency (ggml_rope_ext's `freq_factors`; llama.cpp's converter
//!   computes it with transformers' `_compute_llama3_parameters`): [`Config::rope_freq_factors`];
//! * tensors (src/llama-arch.cpp): `token_embd`, `blk.N.attn_norm`, `attn_q`, `attn_k`,
//!   `attn_v`, `attn_output`, `ffn_norm`, `ffn_gate`, `ffn_up`, `ffn_down`, `output_norm`,
//!   `output`; `output` is TENSOR_NOT_REQUIRED and, when absent, the token embedding is used
//!   (TENSOR_DUPLICATED): a tied classifier;
//! * BOS and EOS from `tokenizer.ggml.bos_token_id` / `eos_token_id`. Generation stops at
//!   llama.cpp's end-of-generation tokens (`special_eog_ids`): EOS, `tokenizer.ggml.eot_token_id`
//!   and `eom_token_id` when written, and the tokens whose text llama-vocab.cpp recognises as
//!   an end of turn (`<|eot_id|>`, `<|im_end|>`, `<|endoftext|>`, ...: [`EOG_TEXTS`]), not
//!   at BOS as llama2.c's run.c does.
//!
//! Refused, naming the field, rather than computed wrongly: `{arch}.rope.scaling.type` other
//! than `none` (or `linear` with factor 1, the identity), `{arch}.expert_count` > 0 (MoE:
//! ffn_*_exps), `{arch}.attention.scale`, rope.dimension_count ≠ head_dim. A Mistral model
//! converted by llama.cpp is a `llama` GGUF (convert_hf_to_gguf.py registers
//! MistralForCausalLM under LlamaModel; llama.cpp has no `mistral` architecture), and its graph
//! applies no sliding window; kvlab reads it the same way.

use std::path::Path;

use kvlab_gguf::GgufFile;

use crate::config::{MAX_DIM, MAX_LAYERS, MAX_SEQ_LEN, check_field};
use crate::{Config, Error, Result, RopeLayout};

/// The architectures this file reads.
pub(crate) const ARCHS: [&str; 3] = ["llama", "qwen2", "qwen3"];

/// Token texts llama.cpp treats as an end of generation wherever they are in the vocabulary
/// (src/llama-vocab.cpp, the EOT/EOM auto-detection: "find EOT token").
pub const EOG_TEXTS: [&str; 11] = [
    "<|eot_id|>",
    "<|eom_id|>",
    "<|im_end|>",
    "<|end|>",
    "<end_of_turn>",
    "<|endoftext|>",
    "<|end_of_text|>",
    "<EOT>",
    "_<EOT>",
    "<｜end▁of▁sentence｜>",
    "<end_of_utterance>",
];

fn refuse(path: &Path, what: String) -> Error {
    Error::Format(format!("{}: {what}", path.display()))
}

/// The config of a `llama`, `qwen2` or `qwen3` GGUF from its metadata (and its small
/// `rope_freqs.weight`, when present), every header field bounded before anything is sized
/// from it.
///
/// # Errors
/// [`Error::Format`] for a missing key or a refused feature (see the module doc), naming the
/// field; [`Error::Config`] for absurd or inconsistent values.
pub(crate) fn llama_config(f: &GgufFile, arch: &str, path: &Path) -> Result<Config> {
    let e = |err: kvlab_gguf::GgufError| Error::Format(format!("{}: {err}", path.display()));
    let md = f.metadata();
    let tok_model = md.get_str("tokenizer.ggml.model").map_err(e)?;
    crate::tokenizer::check_tokenizer_model(tok_model, path)?;
    let key = |k: &str| format!("{arch}.{k}");
    let u = |k: &str| md.get_usize(&key(k)).map_err(e);
    let opt_u = |k: &str| -> Result<Option<usize>> {
        if md.contains(&key(k)) {
            md.get_usize(&key(k)).map(Some).map_err(e)
        } else {
            Ok(None)
        }
    };
    if let Some(n) = opt_u("expert_count")?
        && n > 0
    {
        return Err(refuse(
            path,
            format!("{arch}.expert_count = {n}: mixture-of-experts models are not supported"),
        ));
    }
    check_rope_scaling(f, arch, path)?;
    if md.contains(&key("attention.scale")) {
        return Err(refuse(
            path,
            format!(
                "{arch}.attention.scale is set: only the default 1/sqrt(head_dim) is supported"
            ),
        ));
    }
    let dim = check_field(&key("embedding_length"), u("embedding_length")?, MAX_DIM)?;
    let n_layers = check_field(&key("block_count"), u("block_count")?, MAX_LAYERS)?;
    let n_heads = check_field(
        &key("attention.head_count"),
        u("attention.head_count")?,
        MAX_DIM,
    )?;
    let n_kv_heads = opt_u("attention.head_count_kv")?.unwrap_or(n_heads);
    let hidden = u("feed_forward_length")?;
    let ctx = check_field(&key("context_length"), u("context_length")?, MAX_SEQ_LEN)?;
    let head_dim = match opt_u("attention.key_length")? {
        Some(k) => k,
        None if dim.is_multiple_of(n_heads) => dim / n_heads,
        None => {
            return Err(Error::Config(format!(
                "{}: {arch}.embedding_length ({dim}) is not a multiple of {arch}.attention.head_count ({n_heads}) and {arch}.attention.key_length is absent",
                path.display()
            )));
        }
    };
    if let Some(v) = opt_u("attention.value_length")?
        && v != head_dim
    {
        return Err(Error::Config(format!(
            "{}: {arch}.attention.value_length ({v}) differs from the key length ({head_dim})",
            path.display()
        )));
    }
    if let Some(n_rot) = opt_u("rope.dimension_count")?
        && n_rot != head_dim
    {
        return Err(Error::Config(format!(
            "{}: {arch}.rope.dimension_count = {n_rot} but head_dim = {head_dim}; kvlab rotates whole heads (llama.cpp refuses this too: \"invalid n_rot\")",
            path.display()
        )));
    }
    let tokens = md.get_str_array("tokenizer.ggml.tokens").map_err(e)?;
    let vocab = tokens.len();
    if let Some(v) = opt_u("vocab_size")?
        && v != vocab
    {
        return Err(Error::Config(format!(
            "{}: {arch}.vocab_size = {v} but tokenizer.ggml.tokens has {vocab} tokens",
            path.display()
        )));
    }
    let shared = !f.has_tensor("output.weight");
    let mut c = Config::llama(
        dim, hidden, n_layers, n_heads, n_kv_heads, vocab, ctx, shared,
    );
    c.head_dim = head_dim;
    c.attn_scale = 1.0 / (head_dim as f32).sqrt();
    c.norm_eps = md
        .get_f32(&key("attention.layer_norm_rms_epsilon"))
        .map_err(e)?;
    let theta = md.opt_f32(&key("rope.freq_base")).map_err(e)?;
    c.rope_theta = theta.unwrap_or(10_000.0);
    c.rope_theta_local = c.rope_theta;
    if arch != "llama" {
        c.rope_layout = RopeLayout::Neox;
    }
    c.qkv_bias = arch == "qwen2";
    c.qk_norm = arch == "qwen3";
    if f.has_tensor("rope_freqs.weight") {
        let info = f.tensor_info("rope_freqs.weight").map_err(e)?;
        if info.n_elements != (head_dim / 2) as u64 {
            return Err(Error::Config(format!(
                "{}: tensor rope_freqs.weight has {} elements but head_dim/2 = {}",
                path.display(),
                info.n_elements,
                head_dim / 2
            )));
        }
        c.rope_freq_factors = f.dequantize("rope_freqs.weight").map_err(e)?;
    }
    c.bos_id = md.get_u32("tokenizer.ggml.bos_token_id").map_err(e)?;
    c.stop_ids = eog_ids(f, path)?;
    c.validate()?;
    Ok(c)
}

/// llama.cpp's end-of-generation tokens: EOS, the EOT and EOM ids when written, and every
/// token whose text is in [`EOG_TEXTS`]; in increasing id order after EOS.
///
/// # Errors
/// [`Error::Format`] for a missing EOS key or an id outside the vocabulary.
pub(crate) fn eog_ids(f: &GgufFile, path: &Path) -> Result<Vec<u32>> {
    let e = |err: kvlab_gguf::GgufError| Error::Format(format!("{}: {err}", path.display()));
    let md = f.metadata();
    let tokens = md.get_str_array("tokenizer.ggml.tokens").map_err(e)?;
    let mut ids = vec![md.get_u32("tokenizer.ggml.eos_token_id").map_err(e)?];
    for k in ["eot", "eom"] {
        if let Some(id) = md
            .opt_u32(&format!("tokenizer.ggml.{k}_token_id"))
            .map_err(e)?
        {
            ids.push(id);
        }
    }
    ids.extend(
        tokens
            .iter()
            .enumerate()
            .filter(|(_, t)| EOG_TEXTS.contains(t))
            .map(|(i, _)| i as u32),
    );
    if let Some(bad) = ids.iter().find(|&&id| id as usize >= tokens.len()) {
        return Err(Error::Format(format!(
            "{}: end-of-generation token {bad} is outside the {}-token vocabulary",
            path.display(),
            tokens.len()
        )));
    }
    let eos = ids[0];
    let mut rest: Vec<u32> = ids[1..].iter().copied().filter(|&i| i != eos).collect();
    rest.sort_unstable();
    rest.dedup();
    Ok(std::iter::once(eos).chain(rest).collect())
}

/// RoPE exactly as trained, or with Llama 3.1's factors in `rope_freqs.weight`:
/// `{arch}.rope.scaling.type` absent or `none`, or `linear` with a factor of 1 (llama.cpp's
/// default type string is "linear" with factor 0 → scale 1).
fn check_rope_scaling(f: &GgufFile, arch: &str, path: &Path) -> Result<()> {
    let e = |err: kvlab_gguf::GgufError| Error::Format(format!("{}: {err}", path.display()));
    let md = f.metadata();
    let factor = match md
        .opt_f32(&format!("{arch}.rope.scaling.factor"))
        .map_err(e)?
    {
        Some(x) => Some(x),
        None => md
            .opt_f32(&format!("{arch}.rope.scale_linear"))
            .map_err(e)?,
    };
    let identity = matches!(factor, None | Some(0.0) | Some(1.0));
    let type_key = format!("{arch}.rope.scaling.type");
    if md.contains(&type_key) {
        let ty = md.get_str(&type_key).map_err(e)?;
        if !(ty == "none" || (ty == "linear" && identity)) {
            return Err(refuse(
                path,
                format!(
                    "{type_key} = {ty:?} (factor {factor:?}) is not supported; only unscaled RoPE (\"none\") and Llama 3.1's rope_freqs are"
                ),
            ));
        }
    } else if !identity {
        return Err(refuse(
            path,
            format!("{arch}.rope.scaling.factor = {factor:?}: scaled RoPE is not supported"),
        ));
    }
    Ok(())
}

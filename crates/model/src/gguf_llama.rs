//! GGUF files of architecture `llama` as configuration of the one model: the plain Llama that
//! the llama2.c loader also builds (SwiGLU, RMSNorm, RoPE on adjacent pairs, no QK-norm, no
//! post-norms, embedding unscaled). Each fact below is from llama.cpp:
//!
//! * hyperparameters (src/llama-model.cpp `load_hparams`): `llama.context_length`,
//!   `llama.embedding_length`, `llama.block_count`, `llama.feed_forward_length`,
//!   `llama.attention.head_count`, `llama.attention.head_count_kv` (absent: = head_count),
//!   `llama.attention.layer_norm_rms_epsilon` (required for LLM_ARCH_LLAMA),
//!   `llama.rope.freq_base` (absent: 10,000, `rope_freq_base_train` default);
//! * head_dim = `llama.attention.key_length`, absent: embedding_length / head_count
//!   (`n_embd_head_k`); `llama.rope.dimension_count` (`n_rot`) must equal it for LLM_ARCH_LLAMA
//!   ("invalid n_rot" otherwise), since kvlab rotates whole heads;
//! * the vocabulary size is the tokenizer's (`tokenizer.ggml.tokens`); `llama.vocab_size`, when
//!   written, must agree;
//! * graph (src/models/llama.cpp): x += attn_output(attn(rope(attn_q(n)), rope(attn_k(n)),
//!   attn_v(n))) with n = rms_norm(x)·attn_norm, then x += ffn_down(silu(ffn_gate(m)) · ffn_up(m))
//!   with m = rms_norm(x)·ffn_norm (`build_ffn(..., LLM_FFN_SILU, LLM_FFN_PAR)`), logits =
//!   output(rms_norm(x)·output_norm); so ffn_gate is llama2.c's w1, ffn_up w3, ffn_down w2;
//! * attention scale 1/sqrt(head_dim) (`kq_scale` when `f_attention_scale` is 0, i.e. when
//!   `llama.attention.scale` is absent; a file that sets it is refused);
//! * RoPE: `llama_model_rope_type` gives LLM_ARCH_LLAMA `LLAMA_ROPE_TYPE_NORM`, ggml's mode 0,
//!   which rotates adjacent pairs (2i, 2i+1): [`crate::RopeLayout::Interleaved`], run.c's layout.
//!   convert_hf_to_gguf.py's `LlamaModel.permute` reorders HF's q/k rows into it; llama2.c
//!   checkpoints are in it already;
//! * tensors (src/llama-arch.cpp, LLM_ARCH_LLAMA): `token_embd`, `blk.N.attn_norm`, `attn_q`,
//!   `attn_k`, `attn_v`, `attn_output`, `ffn_norm`, `ffn_gate`, `ffn_up`, `ffn_down`,
//!   `output_norm`, `output`; `output` is TENSOR_NOT_REQUIRED and, when absent, the token
//!   embedding is used (TENSOR_DUPLICATED): a tied classifier;
//! * BOS and EOS from `tokenizer.ggml.bos_token_id` / `eos_token_id`; generation stops at EOS
//!   (llama.cpp's end-of-generation token), not at BOS as llama2.c's run.c does.
//!
//! Refused, naming the field, rather than computed wrongly: `llama.rope.scaling.type` other than
//! `none` (or `linear` with factor 1, the identity), a `rope_freqs.weight` tensor (Llama 3.1's
//! frequency factors), `llama.expert_count` > 0 (MoE: ffn_*_exps), `llama.attention.scale`, a
//! tokenizer other than SentencePiece-style `llama` (Llama 3's GPT-2-style BPE, `gpt2`, is not
//! supported yet), rope.dimension_count ≠ head_dim.

use std::path::Path;

use kvlab_gguf::GgufFile;

use crate::config::{MAX_DIM, MAX_LAYERS, MAX_SEQ_LEN, check_field};
use crate::{Config, Error, Result};

fn refuse(path: &Path, what: String) -> Error {
    Error::Format(format!("{}: {what}", path.display()))
}

/// The config of a `llama` GGUF from its metadata alone (every header field bounded before
/// anything is sized from it).
///
/// # Errors
/// [`Error::Format`] for a missing key or a refused feature (see the module doc), naming the
/// field; [`Error::Config`] for absurd or inconsistent values.
pub(crate) fn llama_config(f: &GgufFile, path: &Path) -> Result<Config> {
    let e = |err: kvlab_gguf::GgufError| Error::Format(format!("{}: {err}", path.display()));
    let md = f.metadata();
    let tok_model = md.get_str("tokenizer.ggml.model").map_err(e)?;
    check_tokenizer_model(tok_model, path)?;
    let u = |k: &str| md.get_usize(&format!("llama.{k}")).map_err(e);
    let opt_u = |k: &str| -> Result<Option<usize>> {
        let key = format!("llama.{k}");
        if md.contains(&key) {
            md.get_usize(&key).map(Some).map_err(e)
        } else {
            Ok(None)
        }
    };
    if let Some(n) = opt_u("expert_count")?
        && n > 0
    {
        return Err(refuse(
            path,
            format!("llama.expert_count = {n}: mixture-of-experts models are not supported"),
        ));
    }
    check_rope_scaling(f, path)?;
    if md.contains("llama.attention.scale") {
        return Err(refuse(
            path,
            "llama.attention.scale is set: only the default 1/sqrt(head_dim) is supported".into(),
        ));
    }
    let dim = check_field("llama.embedding_length", u("embedding_length")?, MAX_DIM)?;
    let n_layers = check_field("llama.block_count", u("block_count")?, MAX_LAYERS)?;
    let n_heads = check_field(
        "llama.attention.head_count",
        u("attention.head_count")?,
        MAX_DIM,
    )?;
    let n_kv_heads = opt_u("attention.head_count_kv")?.unwrap_or(n_heads);
    let hidden = u("feed_forward_length")?;
    let ctx = check_field("llama.context_length", u("context_length")?, MAX_SEQ_LEN)?;
    let head_dim = match opt_u("attention.key_length")? {
        Some(k) => k,
        None if dim.is_multiple_of(n_heads) => dim / n_heads,
        None => {
            return Err(Error::Config(format!(
                "{}: llama.embedding_length ({dim}) is not a multiple of llama.attention.head_count ({n_heads}) and llama.attention.key_length is absent",
                path.display()
            )));
        }
    };
    if let Some(v) = opt_u("attention.value_length")?
        && v != head_dim
    {
        return Err(Error::Config(format!(
            "{}: llama.attention.value_length ({v}) differs from the key length ({head_dim})",
            path.display()
        )));
    }
    if let Some(n_rot) = opt_u("rope.dimension_count")?
        && n_rot != head_dim
    {
        return Err(Error::Config(format!(
            "{}: llama.rope.dimension_count = {n_rot} but head_dim = {head_dim}; kvlab rotates whole heads (llama.cpp refuses this too: \"invalid n_rot\")",
            path.display()
        )));
    }
    let vocab = md.get_str_array("tokenizer.ggml.tokens").map_err(e)?.len();
    if let Some(v) = opt_u("vocab_size")?
        && v != vocab
    {
        return Err(Error::Config(format!(
            "{}: llama.vocab_size = {v} but tokenizer.ggml.tokens has {vocab} tokens",
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
        .get_f32("llama.attention.layer_norm_rms_epsilon")
        .map_err(e)?;
    let theta = md.opt_f32("llama.rope.freq_base").map_err(e)?;
    c.rope_theta = theta.unwrap_or(10_000.0);
    c.rope_theta_local = c.rope_theta;
    c.bos_id = md.get_u32("tokenizer.ggml.bos_token_id").map_err(e)?;
    c.stop_ids = vec![md.get_u32("tokenizer.ggml.eos_token_id").map_err(e)?];
    c.validate()?;
    Ok(c)
}

/// Only SentencePiece-style vocabularies (`llama`) are read.
pub(crate) fn check_tokenizer_model(model: &str, path: &Path) -> Result<()> {
    match model {
        "llama" => Ok(()),
        "gpt2" => Err(refuse(
            path,
            "tokenizer.ggml.model = \"gpt2\" (GPT-2-style byte-level BPE, as Llama 3 uses) is not supported yet; kvlab reads SentencePiece-style \"llama\" vocabularies".into(),
        )),
        other => Err(refuse(
            path,
            format!("tokenizer.ggml.model = {other:?} is not supported; kvlab reads SentencePiece-style \"llama\" vocabularies"),
        )),
    }
}

/// RoPE exactly as trained: `llama.rope.scaling.type` absent or `none`, or `linear` with a
/// factor of 1 (llama.cpp's default type string is "linear" with factor 0 → scale 1), and no
/// `rope_freqs.weight` frequency factors.
fn check_rope_scaling(f: &GgufFile, path: &Path) -> Result<()> {
    let e = |err: kvlab_gguf::GgufError| Error::Format(format!("{}: {err}", path.display()));
    let md = f.metadata();
    let factor = match md.opt_f32("llama.rope.scaling.factor").map_err(e)? {
        Some(x) => Some(x),
        None => md.opt_f32("llama.rope.scale_linear").map_err(e)?,
    };
    let identity = matches!(factor, None | Some(0.0) | Some(1.0));
    if md.contains("llama.rope.scaling.type") {
        let ty = md.get_str("llama.rope.scaling.type").map_err(e)?;
        if !(ty == "none" || (ty == "linear" && identity)) {
            return Err(refuse(
                path,
                format!(
                    "llama.rope.scaling.type = {ty:?} (factor {factor:?}) is not supported; only unscaled RoPE (\"none\") is"
                ),
            ));
        }
    } else if !identity {
        return Err(refuse(
            path,
            format!("llama.rope.scaling.factor = {factor:?}: scaled RoPE is not supported"),
        ));
    }
    if f.has_tensor("rope_freqs.weight") {
        return Err(refuse(
            path,
            "tensor rope_freqs.weight (RoPE frequency factors, as Llama 3.1 has) is not supported"
                .into(),
        ));
    }
    Ok(())
}

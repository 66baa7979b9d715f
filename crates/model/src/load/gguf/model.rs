//! GGUF checkpoints (llama.cpp's format) into the one model definition. Four architectures are
//! read: `llama`, `qwen2` and `qwen3` (their config in [`super::llama`], facts cited there)
//! and `gemma3`, all as configuration of the Llama-family model, not as copies of it. The
//! vocabulary is read by [`crate::tokenizer::tokenizer_from_gguf`]. For Gemma 3, each fact below was checked
//! against llama.cpp (src/models/gemma3.cpp, src/llama-hparams.cpp, src/llama-vocab.cpp) and
//! Hugging Face transformers (models/gemma3/modeling_gemma3.py, configuration_gemma3.py):
//!
//! * embedding scaled by sqrt(dim) in f32 (gemma3.cpp `ggml_scale(inpL, sqrtf(n_embd))`; HF
//!   `Gemma3TextScaledWordEmbedding`);
//! * RMSNorm weights: Gemma computes x̂·(1 + w), and llama.cpp's converter already adds the 1
//!   (conversion/gemma.py `norm_shift`), so GGUF norm weights are used as they are (this file's
//!   blk.0.attn_norm has mean ≈ 13.5);
//! * QK-norm: per-head RMSNorm of q and k, weights (head_dim,), eps = the model's, before RoPE
//!   (gemma3.cpp `attn_q_norm`/`attn_k_norm`; HF `q_norm`/`k_norm`);
//! * post-attention and post-FFN RMSNorms before each residual add (HF `post_attention_layernorm`,
//!   `post_feedforward_layernorm`);
//! * RoPE NEOX layout, pairs (i, i + head_dim/2) (llama-model.cpp: gemma3 → `LLAMA_ROPE_TYPE_NEOX`;
//!   HF `rotate_half`);
//! * GeGLU: down(gelu_tanh(gate(x)) · up(x)) (llama-graph.cpp `ggml_geglu_split`; HF
//!   `gelu_pytorch_tanh`);
//! * attention scale 1/sqrt(head_dim) = 1/16 (gemma3.cpp `f_attention_scale`; HF
//!   `query_pre_attn_scalar ** -0.5` with query_pre_attn_scalar = 256);
//! * layer l is local (sliding window `attention.sliding_window` = 512, RoPE base 10,000) when
//!   l % 6 < 5, global (RoPE base `rope.freq_base` = 1e6) otherwise: layers 5, 11, 17
//!   (gemma3.cpp `load_swa_pattern(ml, 6)`; llama-hparams.h `rope_freq_base_train_swa` = 10000;
//!   HF `sliding_window_pattern`); a query at p sees keys p − 511 ..= p;
//! * no final logit soft-capping; the classifier is the token embedding (no `output.weight`);
//! * BOS 2, EOS 1, and `<end_of_turn>` (106) also ends generation.

use std::path::Path;

use kvlab_gguf::GgufFile;

use crate::weights::{LayerWeights, Tensor};
use crate::{Activation, Config, Error, LayerKind, Model, Result, RopeLayout, Tokenizer, Weights};

fn gguf_err(path: &Path) -> impl Fn(kvlab_gguf::GgufError) -> Error + '_ {
    move |e| Error::Format(format!("{}: {e}", path.display()))
}

/// Loads a GGUF checkpoint (architecture `llama`, `qwen2`, `qwen3` or `gemma3`) and the
/// tokenizer stored in its metadata. Tensors of the types the CPU kernels read (F16, BF16, Q8_0, Q5_0, Q4_K, Q6_K; see
/// [`crate::weights::ENCODINGS`]) stay encoded, read in place from the file's memory map; F32
/// tensors are mapped too; any other type is dequantized to f32 here.
///
/// Memory: Gemma 3 270M Q4_K_M kept as stored is its 247 MB of blocks (the 253 MB file less its
/// header), mapped; dequantized (by an engine that reads f32, or `--weights f32`) it is 268M f32
/// parameters ≈ 1.07 GB, the 671 MB embedding (262,144 × 640) most of it. The header's pages are
/// not kept resident, and the tokenizer is ~7 MB of heap (see [`Tokenizer`]); the parsed metadata
/// is dropped on return.
///
/// # Errors
/// [`Error::Format`] for an unreadable file, another architecture, a missing key or tensor;
/// [`Error::Config`] for inconsistent shapes.
pub fn load_gguf(path: &Path) -> Result<(Model, Tokenizer)> {
    let e = gguf_err(path);
    let f = GgufFile::open(path).map_err(&e)?;
    // Everything the header says is checked before any tensor is dequantized: the config, the
    // tokenizer, and every tensor's element count against the config's shapes.
    let c = gguf_config(&f, path)?;
    let tok = crate::tokenizer::tokenizer_from_gguf(&f, path)?;
    check_tensor_sizes(&f, &c, path)?;
    let t = |name: String| load_tensor(&f, &name).map_err(&e);
    let layers = (0..c.n_layers)
        .map(|l| {
            let b = |n: &str| t(format!("blk.{l}.{n}.weight"));
            let bias = |n: &str| t(format!("blk.{l}.{n}.bias"));
            // llama-arch.cpp's names; ffn_gate is w1, ffn_down w2, ffn_up w3.
            let mut w = LayerWeights::llama([
                b("attn_norm")?,
                b("attn_q")?,
                b("attn_k")?,
                b("attn_v")?,
                b("attn_output")?,
                b("ffn_norm")?,
                b("ffn_gate")?,
                b("ffn_down")?,
                b("ffn_up")?,
            ]);
            if c.qkv_bias {
                (w.bq, w.bk, w.bv) = (bias("attn_q")?, bias("attn_k")?, bias("attn_v")?);
            }
            if c.qk_norm {
                (w.q_norm, w.k_norm) = (b("attn_q_norm")?, b("attn_k_norm")?);
            }
            if c.post_norms {
                w.post_attn_norm = b("post_attention_norm")?;
                w.post_ffn_norm = b("post_ffw_norm")?;
            }
            Ok(w)
        })
        .collect::<Result<Vec<_>>>()?;
    let weights = Weights {
        token_embedding: t("token_embd.weight".into())?,
        layers,
        final_norm: t("output_norm.weight".into())?,
        classifier: if c.shared_classifier {
            None
        } else {
            Some(t("output.weight".into())?)
        },
    };
    let model = Model::new(c, weights)?;
    model.weights.prefault();
    Ok((model, tok))
}

/// Tensor `name` kept as the file stores it where a kernel reads that type (from the map when
/// the file is mapped), dequantized to f32 otherwise.
fn load_tensor(f: &GgufFile, name: &str) -> kvlab_gguf::Result<Tensor> {
    let info = f.tensor_info(name)?;
    let (ty, len) = (info.ggml_type, info.len());
    let mapped = match f.tensor_mapping(name)? {
        Some((map, range)) if ty == kvlab_gguf::GgmlType::F32 => {
            Tensor::from_map(&map, range.start, len)
        }
        Some((map, range)) => Tensor::encoded_from_map(&map, ty, range.start, len),
        None => Tensor::encoded_from_bytes(ty, f.tensor_bytes(name)?.to_vec(), len),
    };
    match mapped {
        Some(t) => Ok(t),
        None => f.dequantize(name).map(Tensor::from),
    }
}

/// The [`Config`] from a GGUF's metadata alone, with every tensor's size checked against
/// it; no tensor is read (what `kvlab info` needs).
///
/// # Errors
/// As [`load_gguf`] for the metadata and the tensor table.
pub fn read_gguf_config(path: &Path) -> Result<Config> {
    let f = GgufFile::open(path).map_err(gguf_err(path))?;
    let c = gguf_config(&f, path)?;
    check_tensor_sizes(&f, &c, path)?;
    Ok(c)
}

/// The config from the metadata (the body [`load_gguf`] always had, before its tensors).
fn gguf_config(f: &GgufFile, path: &Path) -> Result<Config> {
    let e = gguf_err(path);
    let md = f.metadata();
    let arch = md.get_str("general.architecture").map_err(&e)?;
    match arch {
        "gemma3" => {}
        a if super::llama::ARCHS.contains(&a) => {
            return super::llama::llama_config(f, a, path);
        }
        _ => {
            return Err(Error::Format(format!(
                "{}: architecture {arch:?} is not supported; kvlab reads llama, qwen2, qwen3 and gemma3 GGUF files (and llama2.c .bin files)",
                path.display()
            )));
        }
    }
    let key = |k: &str| format!("{arch}.{k}");
    let u = |k: &str| md.get_usize(&key(k)).map_err(&e);
    let tokens = md.get_str_array("tokenizer.ggml.tokens").map_err(&e)?;
    use crate::config::{MAX_DIM, MAX_LAYERS, check_field};
    // Bound the fields that size vectors before anything is built from them.
    let dim = check_field("embedding_length", u("embedding_length")?, MAX_DIM)?;
    let n_layers = check_field("block_count", u("block_count")?, MAX_LAYERS)?;
    let n_heads = check_field("head_count", u("attention.head_count")?, MAX_DIM)?;
    let window = u("attention.sliding_window")?;
    let head_dim = u("attention.key_length")?;
    let mut c = Config::llama(
        dim,
        u("feed_forward_length")?,
        n_layers,
        n_heads,
        u("attention.head_count_kv")?,
        tokens.len(),
        u("context_length")?,
        true,
    );
    c.head_dim = head_dim;
    c.norm_eps = md
        .get_f32(&key("attention.layer_norm_rms_epsilon"))
        .map_err(&e)?;
    c.rope_layout = RopeLayout::Neox;
    c.rope_theta = md.get_f32(&key("rope.freq_base")).map_err(&e)?;
    c.rope_theta_local = md
        .opt_f32(&key("rope.freq_base_swa"))
        .map_err(&e)?
        .unwrap_or(10_000.0);
    c.activation = Activation::GeluTanh;
    c.layer_kinds = LayerKind::interleaved(n_layers, 6, window);
    c.embed_scale = (dim as f32).sqrt();
    c.attn_scale = 1.0 / (head_dim as f32).sqrt();
    c.qk_norm = true;
    c.post_norms = true;
    c.bos_id = md.get_u32("tokenizer.ggml.bos_token_id").map_err(&e)?;
    c.stop_ids = super::llama::eog_ids(f, path)?;
    c.validate()?;
    if f.has_tensor("output.weight") {
        return Err(Error::Format(format!(
            "{}: an untied output.weight is not expected for gemma3",
            path.display()
        )));
    }
    Ok(c)
}

/// Compares every tensor's element count in the tensor table with the shape the config
/// implies, so a file whose header and tensors disagree fails before anything is dequantized.
fn check_tensor_sizes(f: &GgufFile, c: &Config, path: &Path) -> Result<()> {
    let (d, h, q, kv, hd) = (c.dim, c.hidden_dim, c.q_dim(), c.kv_dim(), c.head_dim);
    // (name, rows, columns): a matrix (out, in) is GGUF's ne = [in, out]; a vector has ne = [n].
    let mut expect: Vec<(String, usize, usize)> = vec![
        ("token_embd.weight".into(), c.vocab_size, d),
        ("output_norm.weight".into(), 1, d),
    ];
    if !c.shared_classifier {
        expect.push(("output.weight".into(), c.vocab_size, d));
    }
    for l in 0..c.n_layers {
        let mut per_layer = vec![
            ("attn_norm", 1, d),
            ("attn_q", q, d),
            ("attn_k", kv, d),
            ("attn_v", kv, d),
            ("attn_output", d, q),
            ("ffn_norm", 1, d),
            ("ffn_gate", h, d),
            ("ffn_down", d, h),
            ("ffn_up", h, d),
        ];
        if c.qk_norm {
            per_layer.extend([("attn_q_norm", 1, hd), ("attn_k_norm", 1, hd)]);
        }
        let mut biases = Vec::new();
        if c.qkv_bias {
            biases.extend([("attn_q", q), ("attn_k", kv), ("attn_v", kv)]);
        }
        for (n, len) in biases {
            expect.push((format!("blk.{l}.{n}.bias"), 1, len));
        }
        if c.post_norms {
            per_layer.extend([("post_attention_norm", 1, d), ("post_ffw_norm", 1, d)]);
        }
        for (n, rows, cols) in per_layer {
            expect.push((format!("blk.{l}.{n}.weight"), rows, cols));
        }
    }
    for (name, rows, cols) in expect {
        let info = f.tensor_info(&name).map_err(gguf_err(path))?;
        let len = rows * cols;
        if info.n_elements != len as u64 {
            return Err(Error::Config(format!(
                "{}: tensor {name} has {} elements but the header's config implies {len}",
                path.display(),
                info.n_elements
            )));
        }
        // The row length too, so a transposed matrix of the right size is refused.
        if rows > 1 && info.ne.first() != Some(&(cols as u64)) {
            return Err(Error::Config(format!(
                "{}: tensor {name} has ne {:?} but the config implies [{cols}, {rows}]",
                path.display(),
                info.ne
            )));
        }
    }
    Ok(())
}

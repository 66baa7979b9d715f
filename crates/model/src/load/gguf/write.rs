//! Writing a plain Llama model and its SentencePiece tokenizer as a GGUF of architecture `llama`
//! (f32 tensors), so that llama.cpp runs the very weights kvlab runs, synthetic shapes included
//! (`kvlab export --out FILE.gguf`). The layout is what `load/gguf/llama.rs` reads and what
//! `scripts/peers/llama2c_to_gguf.py` writes with gguf-py: matrices (out, in) row-major as
//! `ne = [in, out]`, q/k rows as they are (kvlab's plain Llama already rotates adjacent pairs,
//! llama.cpp's LLAMA_ROPE_TYPE_NORM), the classifier as `output.weight` only when untied.

use kvlab_gguf::{GgufBuilder, MetadataArray, MetadataValue as V};

use crate::{Error, Model, Result, Tokenizer};

/// The GGUF of `model` with `tok` as its vocabulary.
///
/// A llama2.c tokenizer (spaces written as ' ', BOS and EOS as "\n<s>\n" and "\n</s>\n") is
/// written as llama.cpp's SPM vocabulary the way llama2c_to_gguf.py does it: '▁' for spaces,
/// ids 0/1/2 as `<unk>` (UNKNOWN), `<s>`, `</s>` (CONTROL), `<0xXX>` as BYTE.
///
/// # Errors
/// [`Error::Format`] for a model that is not a plain Llama (QK-norm, post-norms, GeGLU, sliding
/// windows, NEOX RoPE, scaled embeddings) or a tokenizer whose size differs from the model's
/// vocabulary, or a `tokenizer.json` vocabulary.
pub fn llama_gguf(model: &Model, tok: &Tokenizer) -> Result<GgufBuilder> {
    let c = &model.config;
    // A GGUF also holds the norm epsilon, the RoPE bases and the BOS and stop ids.
    let mut plain = c.plain_llama_of_same_shape();
    plain.norm_eps = c.norm_eps;
    plain.rope_theta = c.rope_theta;
    plain.rope_theta_local = c.rope_theta_local;
    plain.bos_id = c.bos_id;
    plain.stop_ids = c.stop_ids.clone();
    if *c != plain {
        return Err(Error::Format(
            "only plain Llama models can be written as a llama GGUF (no QK-norm, post-norms, GeGLU, windows, NEOX RoPE or scaled embedding)".into(),
        ));
    }
    if tok.vocab_size() != c.vocab_size {
        return Err(Error::Format(format!(
            "the tokenizer has {} tokens, the model {}",
            tok.vocab_size(),
            c.vocab_size
        )));
    }
    let tok = tok.as_spm().ok_or_else(|| {
        Error::Format(
            "only SentencePiece-style vocabularies (llama2.c, GGUF) can be written as a llama GGUF; this is a tokenizer.json".into(),
        )
    })?;
    let llama2c = !tok.escape_spaces;
    let (mut pieces, mut types) = (Vec::new(), Vec::new());
    for id in 0..c.vocab_size as u32 {
        let raw = String::from_utf8_lossy(tok.piece(id)).into_owned();
        let (piece, ty) = match id {
            0 if llama2c => ("<unk>".to_string(), 2),
            1 if llama2c => ("<s>".to_string(), 3),
            2 if llama2c => ("</s>".to_string(), 3),
            _ if llama2c => {
                let ty = tok.gguf_token_type(id);
                (
                    if ty == 6 {
                        raw
                    } else {
                        raw.replace(' ', "\u{2581}")
                    },
                    ty,
                )
            }
            _ => (raw, tok.gguf_token_type(id)),
        };
        pieces.push(piece);
        types.push(ty);
    }
    let scores: Vec<f32> = (0..c.vocab_size as u32).map(|id| tok.score(id)).collect();
    let u = |v: usize| V::U32(v as u32);
    let mut b = GgufBuilder::new()
        .kv("general.architecture", V::String("llama".into()))
        .kv("general.name", V::String("kvlab export".into()))
        .kv("llama.context_length", u(c.max_seq_len))
        .kv("llama.embedding_length", u(c.dim))
        .kv("llama.block_count", u(c.n_layers))
        .kv("llama.feed_forward_length", u(c.hidden_dim))
        .kv("llama.attention.head_count", u(c.n_heads))
        .kv("llama.attention.head_count_kv", u(c.n_kv_heads))
        .kv("llama.rope.dimension_count", u(c.head_dim))
        .kv("llama.rope.freq_base", V::F32(c.rope_theta))
        .kv("llama.attention.layer_norm_rms_epsilon", V::F32(c.norm_eps))
        .kv("llama.vocab_size", u(c.vocab_size))
        .kv("tokenizer.ggml.model", V::String("llama".into()))
        .kv(
            "tokenizer.ggml.tokens",
            V::Array(MetadataArray::String(pieces.into())),
        )
        .kv(
            "tokenizer.ggml.scores",
            V::Array(MetadataArray::F32(scores)),
        )
        .kv(
            "tokenizer.ggml.token_type",
            V::Array(MetadataArray::I32(types)),
        )
        .kv("tokenizer.ggml.bos_token_id", V::U32(tok.bos_id))
        .kv("tokenizer.ggml.eos_token_id", V::U32(tok.eos_id))
        .kv("tokenizer.ggml.add_bos_token", V::Bool(tok.add_bos))
        .kv(
            "tokenizer.ggml.add_space_prefix",
            V::Bool(tok.add_dummy_prefix),
        );
    if llama2c {
        b = b.kv("tokenizer.ggml.unknown_token_id", V::U32(0));
    }
    let (d, h, q, kv) = (c.dim, c.hidden_dim, c.q_dim(), c.kv_dim());
    let w = &model.weights;
    let matrix = |rows: usize, cols: usize| [cols as u64, rows as u64];
    b = b.tensor_f32(
        "token_embd.weight",
        &matrix(c.vocab_size, d),
        &w.token_embedding,
    );
    for (l, lw) in w.layers.iter().enumerate() {
        let name = |t: &str| format!("blk.{l}.{t}.weight");
        b = b
            .tensor_f32(&name("attn_norm"), &[d as u64], &lw.attn_norm)
            .tensor_f32(&name("attn_q"), &matrix(q, d), &lw.wq)
            .tensor_f32(&name("attn_k"), &matrix(kv, d), &lw.wk)
            .tensor_f32(&name("attn_v"), &matrix(kv, d), &lw.wv)
            .tensor_f32(&name("attn_output"), &matrix(d, q), &lw.wo)
            .tensor_f32(&name("ffn_norm"), &[d as u64], &lw.ffn_norm)
            .tensor_f32(&name("ffn_gate"), &matrix(h, d), &lw.w1)
            .tensor_f32(&name("ffn_down"), &matrix(d, h), &lw.w2)
            .tensor_f32(&name("ffn_up"), &matrix(h, d), &lw.w3);
    }
    b = b.tensor_f32("output_norm.weight", &[d as u64], &w.final_norm);
    if let Some(cls) = &w.classifier {
        b = b.tensor_f32("output.weight", &matrix(c.vocab_size, d), cls);
    }
    Ok(b)
}

#!/usr/bin/env python3
"""Writes a llama2.c checkpoint and its tokenizer as an f32 GGUF of architecture `llama`, so
llama.cpp runs the very weights kvlab runs (`cargo xtask bench --peers`, prefill rows).

    python3 scripts/peers/llama2c_to_gguf.py MODEL.bin TOKENIZER.bin OUT.gguf

MODEL.bin: llama2.c's legacy checkpoint (crates/model/src/load/llama2c.rs): 7 little-endian int32
(dim, hidden_dim, n_layers, n_heads, n_kv_heads, vocab_size, seq_len; a negative vocab_size means
an unshared classifier at the end), then f32 tensors token_embedding, rms_att, wq, wk, wv, wo,
rms_ffn, w1, w2, w3, rms_final, the unused RoPE tables, [wcls]. Matrices are (out, in) row-major.

llama2.c keeps Meta's layout (RoPE on adjacent pairs), which is what llama.cpp's `llama`
architecture computes (LLAMA_ROPE_TYPE_NORM): the q/k rows are written as they are, without the
permutation convert_hf_to_gguf.py undoes for Hugging Face checkpoints.

TOKENIZER.bin: llama2.c's tokenizer (int32 max_token_length, then per token f32 score, int32
length, bytes), exported from a SentencePiece model with '▁' written as ' ' and <s>, </s> as
"\\n<s>\\n", "\\n</s>\\n". It becomes llama.cpp's SPM tokenizer (`tokenizer.ggml.model` =
"llama"): the same pieces with '▁' restored, the same scores, <0xXX> byte tokens, BOS 1, EOS 2,
UNK 0, a BOS added and a space prefixed, as llama2.c's encode does.

Needs numpy and the `gguf` package (pip install gguf), nothing else.
"""
import argparse
import struct
import sys

import numpy as np

try:
    import gguf
except ImportError:
    sys.exit("the gguf package is missing: pip install gguf")


def read_checkpoint(path):
    data = np.fromfile(path, dtype=np.uint8)
    header = struct.unpack("<7i", data[:28].tobytes())
    dim, hidden, n_layers, n_heads, n_kv_heads, vocab, seq_len = header
    shared = vocab > 0
    vocab = abs(vocab)
    head_dim = dim // n_heads
    kv_dim = n_kv_heads * head_dim
    f = data[28:].view("<f4")
    at = 0

    def take(*shape):
        nonlocal at
        n = int(np.prod(shape))
        if at + n > f.size:
            sys.exit(f"{path}: truncated (a tensor of {n} floats at float {at} of {f.size})")
        t = f[at : at + n].reshape(shape)
        at += n
        return t

    w = {"tok_embeddings": take(vocab, dim)}
    w["rms_att"] = take(n_layers, dim)
    w["wq"] = take(n_layers, dim, dim)
    w["wk"] = take(n_layers, kv_dim, dim)
    w["wv"] = take(n_layers, kv_dim, dim)
    w["wo"] = take(n_layers, dim, dim)
    w["rms_ffn"] = take(n_layers, dim)
    w["w1"] = take(n_layers, hidden, dim)
    w["w2"] = take(n_layers, dim, hidden)
    w["w3"] = take(n_layers, hidden, dim)
    w["rms_final"] = take(dim)
    take(seq_len * head_dim)  # freq_cis_real and freq_cis_imag, (seq_len, head_dim/2) each
    if not shared:
        w["wcls"] = take(vocab, dim)
    if at != f.size:
        sys.exit(f"{path}: {f.size - at} floats past what the header implies")
    cfg = dict(
        dim=dim,
        hidden=hidden,
        n_layers=n_layers,
        n_heads=n_heads,
        n_kv_heads=n_kv_heads,
        vocab=vocab,
        seq_len=seq_len,
        shared=shared,
    )
    return cfg, w


def read_tokenizer(path, vocab):
    with open(path, "rb") as fh:
        data = fh.read()
    (max_len,) = struct.unpack_from("<i", data, 0)
    at = 4
    pieces, scores, types = [], [], []
    for i in range(vocab):
        score, n = struct.unpack_from("<fi", data, at)
        at += 8
        raw = data[at : at + n]
        at += n
        if i == 0:
            piece, kind = b"<unk>", gguf.TokenType.UNKNOWN
        elif i == 1:
            piece, kind = b"<s>", gguf.TokenType.CONTROL
        elif i == 2:
            piece, kind = b"</s>", gguf.TokenType.CONTROL
        elif len(raw) == 6 and raw.startswith(b"<0x") and raw.endswith(b">"):
            piece, kind = raw, gguf.TokenType.BYTE
        else:
            piece, kind = raw.replace(b" ", "\u2581".encode()), gguf.TokenType.NORMAL
        pieces.append(piece)
        scores.append(score)
        types.append(kind)
    if at != len(data):
        sys.exit(f"{path}: {len(data) - at} bytes after {vocab} tokens (wrong tokenizer?)")
    return pieces, scores, types


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("checkpoint")
    ap.add_argument("tokenizer")
    ap.add_argument("out")
    ap.add_argument("--name", default=None)
    a = ap.parse_args()
    c, w = read_checkpoint(a.checkpoint)
    pieces, scores, types = read_tokenizer(a.tokenizer, c["vocab"])

    arch = "llama"
    g = gguf.GGUFWriter(a.out, arch)
    g.add_name(a.name or a.checkpoint.rsplit("/", 1)[-1].removesuffix(".bin"))
    g.add_file_type(gguf.LlamaFileType.ALL_F32)
    g.add_context_length(c["seq_len"])
    g.add_embedding_length(c["dim"])
    g.add_block_count(c["n_layers"])
    g.add_feed_forward_length(c["hidden"])
    g.add_head_count(c["n_heads"])
    g.add_head_count_kv(c["n_kv_heads"])
    g.add_rope_dimension_count(c["dim"] // c["n_heads"])
    g.add_rope_freq_base(10000.0)
    g.add_layer_norm_rms_eps(1e-5)
    g.add_vocab_size(c["vocab"])

    g.add_tokenizer_model("llama")
    g.add_token_list(pieces)
    g.add_token_scores(scores)
    g.add_token_types(types)
    g.add_unk_token_id(0)
    g.add_bos_token_id(1)
    g.add_eos_token_id(2)
    g.add_add_bos_token(True)
    g.add_add_eos_token(False)
    g.add_add_space_prefix(True)

    f32 = lambda t: np.ascontiguousarray(t, dtype=np.float32)  # noqa: E731
    # numpy (out, in) row-major is ggml's ne = [in, out], what llama.cpp's loader expects.
    g.add_tensor("token_embd.weight", f32(w["tok_embeddings"]))
    for i in range(c["n_layers"]):
        b = f"blk.{i}."
        g.add_tensor(b + "attn_norm.weight", f32(w["rms_att"][i]))
        g.add_tensor(b + "attn_q.weight", f32(w["wq"][i]))
        g.add_tensor(b + "attn_k.weight", f32(w["wk"][i]))
        g.add_tensor(b + "attn_v.weight", f32(w["wv"][i]))
        g.add_tensor(b + "attn_output.weight", f32(w["wo"][i]))
        g.add_tensor(b + "ffn_norm.weight", f32(w["rms_ffn"][i]))
        g.add_tensor(b + "ffn_gate.weight", f32(w["w1"][i]))
        g.add_tensor(b + "ffn_down.weight", f32(w["w2"][i]))
        g.add_tensor(b + "ffn_up.weight", f32(w["w3"][i]))
    g.add_tensor("output_norm.weight", f32(w["rms_final"]))
    if "wcls" in w:
        g.add_tensor("output.weight", f32(w["wcls"]))
    g.write_header_to_file()
    g.write_kv_data_to_file()
    g.write_tensors_to_file()
    g.close()
    print(
        f"wrote {a.out}: llama, f32, dim {c['dim']}, hidden {c['hidden']}, {c['n_layers']} layers, "
        f"{c['n_heads']}/{c['n_kv_heads']} heads, vocab {c['vocab']}, ctx {c['seq_len']}, "
        f"{'shared' if c['shared'] else 'own'} classifier"
    )


if __name__ == "__main__":
    main()

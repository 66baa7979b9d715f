#!/usr/bin/env python3
"""Converts a tiny Hugging Face fixture folder (fixtures/models/tiny-*) into an f32 GGUF, the way
llama.cpp's convert_hf_to_gguf.py does for these architectures, so that llama.cpp can serve as an
oracle for kvlab's GGUF loader on the very weights transformers ran (fixtures/hf/<name>.json).

No kvlab code is involved: the weights are read with `safetensors`, the file is written by
gguf-py's GGUFWriter, and the tokenizer metadata (merges, BOS/EOS ids, add_bos, chat template) by
gguf-py's own SpecialVocab, as convert's `_set_vocab_gpt2` does. convert_hf_to_gguf.py itself
is not used (it is not on PyPI, and its BPE pre-tokenizer detection hashes the tokenizer's output
on a test string against a table of known models, which no fixture tokenizer is in). What it does
is reproduced for three architectures:

  LlamaForCausalLM -> `llama` (tiny-llama, tiny-llama3), Qwen2ForCausalLM -> `qwen2`,
  Qwen3ForCausalLM -> `qwen3`.

* hparams: {arch}.context_length (max_position_embeddings), embedding_length, block_count,
  feed_forward_length, attention.head_count, attention.head_count_kv,
  attention.layer_norm_rms_epsilon, rope.freq_base (rope_parameters.rope_theta),
  rope.dimension_count (head_dim, or hidden_size / heads), attention.key_length and
  attention.value_length (only when config.json has head_dim, as convert's TextModel does),
  vocab_size; general.name, general.type, general.file_type (ALL_F32),
  general.quantization_version.
* tensors, all f32, in the order convert writes them (its extra tensors, then the safetensors
  file's order): rope_freqs.weight (Llama 3.1 RoPE only), token_embd, blk.N.{attn_norm, attn_q,
  attn_k, attn_v, attn_output, ffn_norm, ffn_gate, ffn_up, ffn_down}, qwen2's attn_{q,k,v}.bias,
  qwen3's attn_q_norm / attn_k_norm, output_norm, and output.weight only when
  tie_word_embeddings is false (llama.cpp then uses token_embd for the output).
* `llama` only: the q and k rows are permuted by convert's LlamaModel.permute (q with n_head, k
  with n_kv_head): Hugging Face rotates the halves of a head (rotate_half) where llama.cpp's
  `llama` graph rotates adjacent pairs (LLAMA_ROPE_TYPE_NORM). qwen2 and qwen3 are not permuted:
  llama.cpp runs them with NEOX RoPE, which is rotate_half.
* Llama 3.1 RoPE (rope_type "llama3"): a rope_freqs.weight tensor of head_dim/2 factors, computed
  exactly as convert's LlamaModel.generate_extra_tensors (torch f32 frequencies); llama.cpp
  divides each frequency by its factor, which is transformers' _compute_llama3_parameters. No
  rope.scaling.* key is written (convert writes none for llama3). One deliberate difference:
  convert reads original_max_position_embeddings from the top level of config.json (default
  8192, right for every released Llama 3.x, whose rope_scaling says 8192), while transformers 5
  keeps it in rope_parameters, where tiny-llama3 says 64; this script takes rope_parameters'
  value (the one transformers computed with), then the top level, then 8192.
* tokenizer: tokenizer.ggml.model "gpt2"; tokenizer.ggml.pre "gpt-2" for a tokenizer.json whose
  pre-tokenizer is ByteLevel(use_regex=true) (GPT-2's regex), "qwen2" for Split(Qwen2's
  PRETOKENIZE_REGEX, isolated) + ByteLevel(use_regex=false), anything else refused; the tokens in
  id order (ids no token has: "[PAD<id>]", UNUSED, as convert); token types NORMAL, CONTROL for
  added tokens that are special (or look special: "<|...|>", as convert), USER_DEFINED for other
  added tokens; then SpecialVocab(load_merges=True): merges "left right" in rank order, BOS/EOS
  ids (tokenizer_config.json, then config.json: the qwen fixtures have bos = eos), add_bos from a
  TemplateProcessing post-processor, chat template (tokenizer_config.json or
  chat_template.jinja). add_bos_token is then set explicitly: true iff the post-processor puts
  BOS first (tiny-llama, tiny-llama3), false otherwise (SpecialVocab alone writes nothing for
  the qwen fixtures, leaving it to llama.cpp's default).

The output is deterministic (the same bytes on every run).

Run (from the repository root; a venv with torch, safetensors, numpy and gguf 0.19.0 from PyPI,
e.g. the one scripts/hf_oracle.py runs in):
    python scripts/hf_to_gguf.py              # all four -> fixtures/models/<name>.gguf
    python scripts/hf_to_gguf.py fixtures/models/tiny-qwen2 --out /tmp/tiny-qwen2.gguf
"""

from __future__ import annotations

import argparse
import json
import math
import sys
from pathlib import Path

import numpy as np

try:
    import gguf
    import torch
    from safetensors import safe_open
except ImportError as e:
    sys.exit(f"{e.name} is missing: pip install gguf torch safetensors numpy")

ROOT = Path(__file__).resolve().parent.parent
DEFAULT_MODELS = ["tiny-llama", "tiny-llama3", "tiny-qwen2", "tiny-qwen3"]
ARCHES = {"LlamaForCausalLM": "llama", "Qwen2ForCausalLM": "qwen2", "Qwen3ForCausalLM": "qwen3"}

# Qwen2's pre-tokenizer pattern, as the real Qwen2 tokenizer.json and transformers'
# models/qwen2/tokenization_qwen2.py (PRETOKENIZE_REGEX) write it; llama.cpp's "qwen2"
# pre-tokenizer (LLAMA_VOCAB_PRE_TYPE_QWEN2) is this regex.
QWEN2_REGEX = (r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*"
               r"|\s*[\r\n]+|\s+(?!\S)|\s+")

# HF tensor name suffix (after model.layers.N.) -> GGUF name suffix (after blk.N.).
LAYER_MAP = {
    "input_layernorm.weight": "attn_norm.weight",
    "self_attn.q_proj.weight": "attn_q.weight",
    "self_attn.k_proj.weight": "attn_k.weight",
    "self_attn.v_proj.weight": "attn_v.weight",
    "self_attn.o_proj.weight": "attn_output.weight",
    "self_attn.q_proj.bias": "attn_q.bias",
    "self_attn.k_proj.bias": "attn_k.bias",
    "self_attn.v_proj.bias": "attn_v.bias",
    "self_attn.q_norm.weight": "attn_q_norm.weight",
    "self_attn.k_norm.weight": "attn_k_norm.weight",
    "post_attention_layernorm.weight": "ffn_norm.weight",
    "mlp.gate_proj.weight": "ffn_gate.weight",
    "mlp.up_proj.weight": "ffn_up.weight",
    "mlp.down_proj.weight": "ffn_down.weight",
}
# Which per-layer tensors each architecture has (anything else in the checkpoint is refused).
COMMON = {"attn_norm.weight", "attn_q.weight", "attn_k.weight", "attn_v.weight",
          "attn_output.weight", "ffn_norm.weight", "ffn_gate.weight", "ffn_up.weight",
          "ffn_down.weight"}
LAYER_TENSORS = {
    "llama": COMMON,
    "qwen2": COMMON | {"attn_q.bias", "attn_k.bias", "attn_v.bias"},
    "qwen3": COMMON | {"attn_q_norm.weight", "attn_k_norm.weight"},
}


def permute(w: np.ndarray, n_head: int, n_head_kv: int | None) -> np.ndarray:
    """convert_hf_to_gguf.py's LlamaModel.permute: rotate_half's row order -> adjacent pairs."""
    if n_head_kv is not None and n_head != n_head_kv:
        n_head = n_head_kv
    return (w.reshape(n_head, 2, w.shape[0] // n_head // 2, *w.shape[1:])
            .swapaxes(1, 2)
            .reshape(w.shape))


def llama3_rope_factors(rope: dict, hparams: dict, head_dim: int) -> np.ndarray:
    """convert_hf_to_gguf.py's LlamaModel.generate_extra_tensors (llama3 rope), line for line,
    except where original_max_position_embeddings is read from (see the module docstring)."""
    base = rope.get("rope_theta", 10000.0)
    dim = head_dim
    freqs = 1.0 / (base ** (torch.arange(0, dim, 2, dtype=torch.float32) / dim))
    factor = rope.get("factor", 8.0)
    low_freq_factor = rope.get("low_freq_factor", 1.0)
    high_freq_factor = rope.get("high_freq_factor", 4.0)
    old_context_len = rope.get("original_max_position_embeddings",
                               hparams.get("original_max_position_embeddings", 8192))
    low_freq_wavelen = old_context_len / low_freq_factor
    high_freq_wavelen = old_context_len / high_freq_factor
    assert low_freq_wavelen != high_freq_wavelen
    rope_factors = []
    for freq in freqs:
        wavelen = 2 * math.pi / freq
        if wavelen < high_freq_wavelen:
            rope_factors.append(1)
        elif wavelen > low_freq_wavelen:
            rope_factors.append(factor)
        else:
            smooth = (old_context_len / wavelen - low_freq_factor) / (high_freq_factor - low_freq_factor)
            rope_factors.append(1 / ((1 - smooth) / factor + smooth))
    return torch.tensor(rope_factors, dtype=torch.float32).numpy()


def detect_pre(tok: dict, path: Path) -> str:
    """tokenizer.ggml.pre from tokenizer.json's pre-tokenizer (see the module docstring)."""
    pre = tok.get("pre_tokenizer") or {}
    if tok.get("normalizer") is not None:
        sys.exit(f"{path}: a normalizer ({tok['normalizer'].get('type')}); not a GPT-2-style byte-level BPE")
    if pre.get("type") == "ByteLevel" and pre.get("use_regex") is True and not pre.get("add_prefix_space"):
        return "gpt-2"
    if pre.get("type") == "Sequence":
        parts = pre.get("pretokenizers", [])
        if (len(parts) == 2 and parts[0].get("type") == "Split"
                and parts[0].get("pattern") == {"Regex": QWEN2_REGEX}
                and parts[0].get("behavior") == "Isolated" and not parts[0].get("invert")
                and parts[1].get("type") == "ByteLevel" and parts[1].get("use_regex") is False
                and not parts[1].get("add_prefix_space")):
            return "qwen2"
    sys.exit(f"{path}: pre-tokenizer {json.dumps(pre)[:200]} is neither GPT-2's ByteLevel regex "
             "nor Qwen2's Split; refusing to guess a llama.cpp pre-tokenizer")


def vocab(folder: Path, vocab_size: int):
    """convert's get_vocab_base, from tokenizer.json: (tokens, token types, pre)."""
    path = folder / "tokenizer.json"
    tok = json.loads(path.read_text(encoding="utf-8"))
    model = tok.get("model", {})
    if model.get("type") != "BPE" or model.get("byte_fallback") or model.get("continuing_subword_prefix") \
            or model.get("end_of_word_suffix"):
        sys.exit(f"{path}: not a plain byte-level BPE model")
    if (tok.get("decoder") or {}).get("type") != "ByteLevel":
        sys.exit(f"{path}: the decoder is not ByteLevel")
    pre = detect_pre(tok, path)
    reverse = {i: t for t, i in model["vocab"].items()}
    added = {a["id"]: a for a in tok.get("added_tokens", [])}
    for i, a in added.items():
        if reverse.get(i, a["content"]) != a["content"]:
            sys.exit(f"{path}: added token {i} {a['content']!r} clashes with {reverse[i]!r}")
        reverse[i] = a["content"]
    if max(reverse) >= vocab_size:
        sys.exit(f"{path}: token id {max(reverse)} >= vocab_size {vocab_size}")
    tokens, types = [], []
    for i in range(vocab_size):
        if i not in reverse:
            tokens.append(f"[PAD{i}]")
            types.append(gguf.TokenType.UNUSED)
            continue
        t = reverse[i]
        if i in added:
            looks_special = t.startswith("<|") and t.endswith("|>")
            types.append(gguf.TokenType.CONTROL if added[i]["special"] or looks_special
                         else gguf.TokenType.USER_DEFINED)
        else:
            types.append(gguf.TokenType.NORMAL)
        tokens.append(t)
    return tok, tokens, types, pre


def bos_first(tok: dict, bos_content: str | None) -> bool:
    """Whether the post-processor puts BOS first (TemplateProcessing whose single starts with it)."""
    pp = tok.get("post_processor") or {}
    for p in pp.get("processors", [pp]):
        if p.get("type") == "TemplateProcessing":
            single = p.get("single", [])
            first = single[0].get("SpecialToken", {}).get("id") if single else None
            return first is not None and first == bos_content
    return False


def convert(folder: Path, out: Path) -> None:
    cfg = json.loads((folder / "config.json").read_text(encoding="utf-8"))
    archs = cfg.get("architectures") or []
    if len(archs) != 1 or archs[0] not in ARCHES:
        sys.exit(f"{folder}: architectures {archs}; this converter knows {sorted(ARCHES)}")
    arch = ARCHES[archs[0]]
    n_head = cfg["num_attention_heads"]
    n_kv = cfg.get("num_key_value_heads", n_head)
    head_dim = cfg.get("head_dim") or cfg["hidden_size"] // n_head
    n_layer = cfg["num_hidden_layers"]
    rope = dict(cfg.get("rope_parameters") or cfg.get("rope_scaling") or {})
    if "rope_theta" not in rope and "rope_theta" in cfg:
        rope["rope_theta"] = cfg["rope_theta"]
    rope_type = rope.get("rope_type", rope.get("type", "default"))
    if rope_type not in ("default", "llama3") or (rope_type == "llama3" and arch != "llama"):
        sys.exit(f"{folder}: rope_type {rope_type!r} is not handled here")
    tied = cfg.get("tie_word_embeddings", False)
    vocab_size = cfg["vocab_size"]

    tok, tokens, types, pre = vocab(folder, vocab_size)

    g = gguf.GGUFWriter(str(out), arch)
    # general.* (convert's Metadata.set_gguf_meta_model, the part that applies here)
    g.add_type(gguf.GGUFType.MODEL)
    g.add_name(folder.name)
    # TextModel.set_gguf_parameters
    g.add_block_count(n_layer)
    g.add_context_length(cfg["max_position_embeddings"])
    g.add_embedding_length(cfg["hidden_size"])
    g.add_feed_forward_length(cfg["intermediate_size"])
    g.add_head_count(n_head)
    g.add_head_count_kv(n_kv)
    g.add_rope_freq_base(rope["rope_theta"])
    g.add_layer_norm_rms_eps(cfg["rms_norm_eps"])
    if cfg.get("head_dim") is not None:
        g.add_key_length(cfg["head_dim"])
        g.add_value_length(cfg["head_dim"])
    g.add_file_type(gguf.LlamaFileType.ALL_F32)
    # LlamaModel.set_gguf_parameters (written for all three here)
    g.add_vocab_size(vocab_size)
    g.add_rope_dimension_count(head_dim)
    g.add_quantization_version(gguf.GGML_QUANT_VERSION)
    # _set_vocab_gpt2
    g.add_tokenizer_model("gpt2")
    g.add_tokenizer_pre(pre)
    g.add_token_list(tokens)
    g.add_token_types(types)
    special = gguf.SpecialVocab(folder, load_merges=True, n_vocab=vocab_size)
    if not special.merges:
        sys.exit(f"{folder}: no merges in tokenizer.json")
    tc_path = folder / "tokenizer_config.json"
    tc = json.loads(tc_path.read_text(encoding="utf-8")) if tc_path.is_file() else {}
    bos_content = tc.get("bos_token")
    if isinstance(bos_content, dict):
        bos_content = bos_content.get("content")
    special.add_special_token["bos"] = bos_first(tok, bos_content)
    for typ in ("bos", "eos"):
        if typ not in special.special_token_ids:
            sys.exit(f"{folder}: no {typ} token id in tokenizer_config.json or config.json")
    special.add_to_gguf(g, quiet=True)

    # tensors: convert's extra tensors first, then the checkpoint in file order
    if rope_type == "llama3":
        g.add_tensor("rope_freqs.weight", llama3_rope_factors(rope, cfg, head_dim))
    seen = set()
    with safe_open(str(folder / "model.safetensors"), "np") as f:
        for name in f.keys():
            w = np.ascontiguousarray(f.get_tensor(name), dtype=np.float32)
            if name == "model.embed_tokens.weight":
                gname = "token_embd.weight"
            elif name == "model.norm.weight":
                gname = "output_norm.weight"
            elif name == "lm_head.weight":
                if tied:
                    continue  # transformers would not save it; llama.cpp reuses token_embd
                gname = "output.weight"
            elif name.startswith("model.layers."):
                bid, rest = name[len("model.layers."):].split(".", 1)
                if rest not in LAYER_MAP or LAYER_MAP[rest] not in LAYER_TENSORS[arch]:
                    sys.exit(f"{folder}: unexpected tensor {name} for {arch}")
                gname = f"blk.{int(bid)}.{LAYER_MAP[rest]}"
                if arch == "llama" and rest == "self_attn.q_proj.weight":
                    w = permute(w, n_head, n_head)
                elif arch == "llama" and rest == "self_attn.k_proj.weight":
                    w = permute(w, n_head, n_kv)
            else:
                sys.exit(f"{folder}: unexpected tensor {name}")
            seen.add(gname)
            g.add_tensor(gname, np.ascontiguousarray(w))
    want = {"token_embd.weight", "output_norm.weight"} | ({"output.weight"} if not tied else set())
    want |= {f"blk.{i}.{t}" for i in range(n_layer) for t in LAYER_TENSORS[arch]}
    if seen != want:
        sys.exit(f"{folder}: missing {sorted(want - seen)}, extra {sorted(seen - want)}")
    g.write_header_to_file()
    g.write_kv_data_to_file()
    g.write_tensors_to_file()
    g.close()
    print(f"wrote {out} ({out.stat().st_size} bytes): {arch}, pre {pre}, {n_layer} layers, "
          f"{n_head}/{n_kv} heads of {head_dim}, vocab {vocab_size}, "
          f"{'tied' if tied else 'own'} output, add_bos {special.add_special_token['bos']}, "
          f"bos {special.special_token_ids['bos']} eos {special.special_token_ids['eos']}"
          f"{', rope_freqs' if rope_type == 'llama3' else ''}"
          f"{', chat template' if special.chat_template else ''}")


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("folders", nargs="*", type=Path,
                    help="Hugging Face folders (default: the four tiny-llama/llama3/qwen2/qwen3 fixtures)")
    ap.add_argument("--out", type=Path, help="output file (one folder only); default <folder>.gguf")
    a = ap.parse_args()
    folders = a.folders or [ROOT / "fixtures" / "models" / m for m in DEFAULT_MODELS]
    if a.out and len(folders) != 1:
        sys.exit("--out needs exactly one folder")
    for folder in folders:
        folder = folder.resolve()
        convert(folder, a.out or folder.with_name(folder.name + ".gguf"))


if __name__ == "__main__":
    main()

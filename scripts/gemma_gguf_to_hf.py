#!/usr/bin/env python3
"""The Gemma 3 270M GGUF as a Hugging Face folder, written by transformers (the local check of
kvlab's Hugging Face loader on real weights; the folder is too large to commit).

transformers reads the GGUF (its gguf-py based loader dequantizes every tensor and subtracts the
1 that llama.cpp's converter added to Gemma's norm weights), and `save_pretrained` writes
config.json, model.safetensors, generation_config.json and the tokenizer (tokenizer.json,
tokenizer_config.json) that `AutoTokenizer.from_pretrained(..., gguf_file=...)` builds from the
GGUF vocabulary. The weights are saved in f32 by default, so that kvlab reading the folder and
kvlab reading the GGUF with `--weights f32` compute on the same numbers; `--dtype bfloat16` writes
the usual bf16 checkpoint instead, which the test compares with the GGUF read with
`--weights bf16` (teacher-forced logits within the bf16 tolerance).

kvlab's test `gemma_gguf_and_its_hf_folder_are_the_same_model` (crates/cpu/tests/hf_engines.rs)
then checks, when KVLAB_GEMMA_HF points at the folder: the same config, the same tokenizer ids
on every fixture prompt, and the same greedy tokens on the cpu engine.

Usage (about 2 minutes, ~3 GB of RAM; needs torch, transformers, gguf, accelerate from PyPI):
    python scripts/gemma_gguf_to_hf.py --model "$KVLAB_MODELS/gemma-3-270m-q4_k_m.gguf" --out /tmp/gemma-3-270m-hf
    KVLAB_GEMMA_HF=/tmp/gemma-3-270m-hf KVLAB_MODELS=... cargo test --release -p kvlab-cpu --test hf_engines gemma -- --include-ignored
"""

import argparse
import os

import torch
import transformers


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--model", required=True, help="the gemma-3-270m GGUF")
    ap.add_argument("--out", required=True, help="the folder to write")
    ap.add_argument("--dtype", default="float32", choices=["float32", "bfloat16"])
    args = ap.parse_args()
    folder, name = os.path.split(os.path.abspath(args.model))
    dtype = getattr(torch, args.dtype)
    model = transformers.AutoModelForCausalLM.from_pretrained(folder, gguf_file=name, dtype=dtype)
    tok = transformers.AutoTokenizer.from_pretrained(folder, gguf_file=name)
    # transformers marks a GGUF-loaded model as quantized and refuses to save it, although its
    # tensors are already dequantized: the same weights go into a plain model of the same config.
    config = model.config
    if hasattr(config, "quantization_config"):
        del config.quantization_config
    plain = transformers.AutoModelForCausalLM.from_config(config, dtype=dtype)
    missing, unexpected = plain.load_state_dict(model.state_dict(), strict=False)
    assert not unexpected and all("lm_head" in m for m in missing), (missing, unexpected)
    plain.tie_weights()
    plain.generation_config = model.generation_config
    plain.save_pretrained(args.out, safe_serialization=True)
    tok.save_pretrained(args.out)
    print(f"wrote {args.out}: {sorted(os.listdir(args.out))} "
          f"(transformers {transformers.__version__}, {args.dtype})")


if __name__ == "__main__":
    main()

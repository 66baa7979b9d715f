#!/usr/bin/env python3
"""Hugging Face transformers peer for `kvlab-cuda-bench decode`: greedy generation with a static
KV cache (cache_implementation="static") on a Llama-3-8B-shaped model with random f16 weights,
at batch 1/16/64/256, timed on the same GPU in the same run. Prints (or writes) JSON.

Pairs with the decode rows of `kvlab-cuda-bench decode` (scripts/cuda/run-gpu-checks.sh bench)
and with `cargo xtask bench` on a GPU machine: same shapes (dim 4096, hidden 14336, 32 layers,
32 query / 8 KV heads, vocab 128256), same prompt length and number of new tokens, f16 weights
and KV cache. The weights are not the same numbers (kvlab's are seeded synthetic ones, these are
torch's initialisation): dense f16 GEMMs and attention take the same time whatever the values.

Decode time per step is measured as (T(new_tokens) - T(1)) / (new_tokens - 1), where T(n) is a
whole generate() call producing n tokens, so the prefill is excluded the same way kvlab excludes
its prefill steps. Pass --compile to torch.compile the forward (Hugging Face's recommended setup
for static caches; slower to start).

Needs: python3 with torch (CUDA build) and transformers on the GPU machine. Not run on the build
machine (no GPU there).
"""

import argparse
import json
import sys
import time

SHAPES = {
    "llama-3-8b": dict(hidden_size=4096, intermediate_size=14336, num_hidden_layers=32,
                       num_attention_heads=32, num_key_value_heads=8, vocab_size=128256),
    "llama-3.2-1b": dict(hidden_size=2048, intermediate_size=8192, num_hidden_layers=16,
                         num_attention_heads=32, num_key_value_heads=8, vocab_size=128256),
}


def parse():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--shape", choices=sorted(SHAPES), default="llama-3-8b")
    ap.add_argument("--batches", default="1,16,64,256")
    ap.add_argument("--prompt-len", type=int, default=128)
    ap.add_argument("--new-tokens", type=int, default=128)
    ap.add_argument("--compile", action="store_true")
    ap.add_argument("--quick", action="store_true", help="batches 1,64 and 16 new tokens")
    ap.add_argument("--out", help="write the JSON here instead of stdout")
    a = ap.parse_args()
    if a.quick:
        a.batches, a.new_tokens = "1,64", 16
    return a


def timed_generate(model, input_ids, new_tokens, compiled):
    import torch
    torch.cuda.synchronize()
    t = time.perf_counter()
    out = model.generate(
        input_ids=input_ids,
        attention_mask=torch.ones_like(input_ids),
        max_new_tokens=new_tokens,
        min_new_tokens=new_tokens,
        do_sample=False,
        cache_implementation="static",
        # transformers compiles the forward by itself when the cache is static; the static
        # cache's length is prompt + max_new_tokens, so each length recompiled inside the timed
        # call (the first H100 run measured 352 ms/token that way). Eager unless --compile.
        disable_compile=not compiled,
    )
    torch.cuda.synchronize()
    assert out.shape[1] == input_ids.shape[1] + new_tokens, out.shape
    return time.perf_counter() - t


def main():
    a = parse()
    import torch
    import transformers
    from transformers import LlamaConfig, LlamaForCausalLM

    if not torch.cuda.is_available():
        print("SKIPPED: torch sees no CUDA device", file=sys.stderr)
        sys.exit(0)
    torch.manual_seed(17)
    cfg = LlamaConfig(**SHAPES[a.shape], max_position_embeddings=8192, rope_theta=10000.0,
                      tie_word_embeddings=False)
    torch.set_default_dtype(torch.float16)
    with torch.device("cuda"):
        model = LlamaForCausalLM(cfg).eval()
    torch.set_default_dtype(torch.float32)
    model.generation_config.pad_token_id = 0
    model.generation_config.eos_token_id = None
    if a.compile:
        model.forward = torch.compile(model.forward, mode="reduce-overhead", fullgraph=True)

    rows = []
    for batch in [int(b) for b in a.batches.split(",")]:
        ids = torch.randint(2, cfg.vocab_size, (batch, a.prompt_len), device="cuda")
        with torch.inference_mode():
            # Warm-up of both lengths timed below (and their compilation with --compile).
            timed_generate(model, ids, 1, a.compile)
            timed_generate(model, ids, a.new_tokens, a.compile)
            t1 = timed_generate(model, ids, 1, a.compile)
            tn = timed_generate(model, ids, a.new_tokens, a.compile)
        step = (tn - t1) / max(a.new_tokens - 1, 1)
        row = dict(batch=batch, prompt_len=a.prompt_len, new_tokens=a.new_tokens,
                   prefill_plus_first_token_s=t1, total_s=tn, tpot_ms=1e3 * step,
                   tokens_per_s=batch / step)
        print(f"hf static cache batch {batch:>3}: {row['tokens_per_s']:.0f} tokens/s, "
              f"{row['tpot_ms']:.2f} ms/token per sequence", file=sys.stderr)
        rows.append(row)
        del ids
        torch.cuda.empty_cache()

    report = dict(
        engine="hf-transformers-static-cache",
        shape=a.shape,
        dtype="float16",
        compiled=a.compile,
        device=torch.cuda.get_device_name(0),
        torch=torch.__version__,
        transformers=transformers.__version__,
        rows=rows,
    )
    text = json.dumps(report, indent=1)
    if a.out:
        with open(a.out, "w") as f:
            f.write(text)
        print(f"wrote {a.out}", file=sys.stderr)
    else:
        print(text)


if __name__ == "__main__":
    main()

#!/usr/bin/env python3
"""Decode speed against context depth with llama.cpp (llama-cpp-python), for `cargo xtask depth`.

    python3 scripts/peers/llama_cpp_depth.py MODEL.gguf --threads 2 --depths 8192,16384,32768 \
        --n-gen 32 --prompt "TEXT" [--flash-attn]

The same procedure as `kvlab depth`: the prompt's tokens after BOS repeated fill one sequence in
ubatches up to depth - n_gen, then n_gen greedy tokens are decoded, each `eval` timed, for each
depth in turn. The KV cache is llama.cpp's default (f16 keys and values) with sliding-window
layers kept at their window as llama.cpp's own tools do (swa_full off; the library's default is
on). Prints one JSON line on stdout; with verbose on, llama.cpp's log on stderr names the cache's
size ("llama_kv_cache: size = ... MiB"), which the caller reads.
"""
import argparse
import json
import time

import llama_cpp
import numpy as np


def last_argmax(llm):
    """Greedy id from the last evaluated position's logits (ties to the lowest id, as kvlab)."""
    logits = np.ctypeslib.as_array(llm._ctx.get_logits_ith(-1), shape=(llm.n_vocab(),))
    return int(logits.argmax())


def fill_token(ids, k):
    """The k-th fill token: BOS (ids[0]), then the text's other tokens over and over."""
    if k == 0 or len(ids) == 1:
        return ids[0]
    return ids[1 + (k - 1) % (len(ids) - 1)]


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("model")
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--depths", required=True, help="comma-separated, ascending")
    ap.add_argument("--n-gen", type=int, default=32)
    ap.add_argument("--ubatch", type=int, default=512)
    ap.add_argument("--prompt", required=True)
    ap.add_argument("--flash-attn", action="store_true")
    a = ap.parse_args()
    depths = sorted({int(d) for d in a.depths.split(",")})
    llm = llama_cpp.Llama(
        model_path=a.model,
        n_ctx=depths[-1],
        n_threads=a.threads,
        n_threads_batch=a.threads,
        n_batch=a.ubatch,
        n_ubatch=a.ubatch,
        logits_all=False,
        flash_attn=a.flash_attn,
        swa_full=False,
        verbose=True,
    )
    ids = llm.tokenize(a.prompt.encode(), add_bos=True, special=True)
    rows, pos, fed = [], 0, 0
    for depth in depths:
        start = pos
        t0 = time.perf_counter()
        while pos < depth - a.n_gen:
            n = min(a.ubatch, depth - a.n_gen - pos)
            llm.eval([fill_token(ids, k) for k in range(fed, fed + n)])
            fed += n
            pos += n
        fill_s = time.perf_counter() - t0
        step_ms, out = [], []
        for _ in range(a.n_gen):
            nxt = last_argmax(llm)
            t = time.perf_counter()
            llm.eval([nxt])
            step_ms.append((time.perf_counter() - t) * 1e3)
            out.append(nxt)
            pos += 1
        rows.append({
            "depth": depth,
            "fill_s": fill_s,
            "fill_tokens_per_s": (depth - a.n_gen - start) / max(fill_s, 1e-9),
            "step_ms": step_ms,
            "median_step_ms": float(np.median(step_ms)),
            "decode_tokens_per_s": a.n_gen / (sum(step_ms) / 1e3),
            "ids": out,
        })
    print(json.dumps({
        "llama_cpp_python": llama_cpp.__version__,
        "flash_attn": a.flash_attn,
        "threads": a.threads,
        "n_gen": a.n_gen,
        "ubatch": a.ubatch,
        "fill_ids": ids,
        "depths": rows,
    }), flush=True)


if __name__ == "__main__":
    main()

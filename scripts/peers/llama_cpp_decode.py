#!/usr/bin/env python3
"""Greedy decode with llama.cpp (llama-cpp-python from PyPI) for `cargo xtask bench --peers`.

    python3 scripts/peers/llama_cpp_decode.py MODEL.gguf --threads 2 --prompt "Once upon a time" --steps 256

Runs the prompt, then greedy steps until `steps` positions (prompt included, run.c's meaning) or
the end-of-sequence token, and prints one JSON line: prompt tokens, generated ids, prefill and
decode tokens/s (decode: the steps after the first sampled token's forward pass, as kvlab and
run.c time it). Install: pip install llama-cpp-python==0.3.36 (built from source).
"""
import argparse
import json
import time

import llama_cpp
import numpy as np


def last_argmax(llm):
    """Greedy id from the last evaluated position's logits (ties to the lowest id, as kvlab).

    Read from the context: with logits_all=False, llama-cpp-python 0.3.x no longer copies logits
    into `llm.scores` (it stays all zeros, whose argmax is always 0).
    """
    logits = np.ctypeslib.as_array(llm._ctx.get_logits_ith(-1), shape=(llm.n_vocab(),))
    return int(logits.argmax())


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("model")
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--prompt", default="Once upon a time")
    ap.add_argument("--steps", type=int, default=256)
    a = ap.parse_args()
    llm = llama_cpp.Llama(
        model_path=a.model,
        n_ctx=max(a.steps, 64),
        n_threads=a.threads,
        n_threads_batch=a.threads,
        n_batch=512,
        logits_all=False,
        verbose=False,
    )
    prompt = llm.tokenize(a.prompt.encode(), add_bos=True, special=True)
    t0 = time.perf_counter()
    llm.eval(prompt)
    t1 = time.perf_counter()
    ids = []
    eos = llm.token_eos()
    decode_start = None
    while len(prompt) + len(ids) < a.steps:
        tok = last_argmax(llm)
        ids.append(tok)
        if tok == eos or len(prompt) + len(ids) >= a.steps:
            break
        llm.eval([tok])
        if decode_start is None:
            decode_start = time.perf_counter()
            decoded = 0
        else:
            decoded += 1
    t2 = time.perf_counter()
    decode_tok_s = decoded / (t2 - decode_start) if decode_start and decoded > 0 else float("nan")
    print(json.dumps({
        "llama_cpp_python": llama_cpp.__version__,
        "prompt_tokens": len(prompt),
        "ids": ids,
        "prefill_tok_s": len(prompt) / (t1 - t0),
        "decode_tok_s": decode_tok_s,
    }))


if __name__ == "__main__":
    main()

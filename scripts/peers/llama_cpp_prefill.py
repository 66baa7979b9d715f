#!/usr/bin/env python3
"""Prefill (prompt evaluation) speed of llama.cpp (llama-cpp-python from PyPI), for
`cargo xtask bench --peers`:

    python3 scripts/peers/llama_cpp_prefill.py MODEL.gguf --threads 2 --prompt-file P.txt --new 8

Loads the model, tokenizes the prompt (BOS added, as kvlab and llama2.c do), times one
`eval` of the whole prompt in a single batch (the first after loading, as kvlab's `generate`
times its prefill: both map the weights and touch them there), then greedily generates `--new`
ids for the identity check. Prints one JSON line: prompt ids, generated ids, prefill seconds and
tokens/s. Install: pip install llama-cpp-python==0.3.36 (built from source).

OpenMP's wait policy matters on a small machine: unset (libgomp spins, then sleeps), as
llama.cpp ships, was fastest when the machine was otherwise idle; with other load, spinning
threads made the same run 64 to 3200 tok/s, and OMP_WAIT_POLICY=passive keeps it steady.
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


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("model")
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--prompt", default=None)
    ap.add_argument("--prompt-file", default=None)
    ap.add_argument("--new", type=int, default=8, help="greedy ids after the prompt")
    a = ap.parse_args()
    text = open(a.prompt_file).read() if a.prompt_file else (a.prompt or "Once upon a time")
    llm = llama_cpp.Llama(
        model_path=a.model,
        n_ctx=0,  # the model's context
        n_threads=a.threads,
        n_threads_batch=a.threads,
        n_batch=512,
        n_ubatch=512,
        logits_all=False,
        verbose=False,
    )
    prompt = llm.tokenize(text.encode(), add_bos=True, special=False)
    if len(prompt) + a.new > llm.n_ctx():
        raise SystemExit(f"prompt ({len(prompt)}) + {a.new} exceeds the context {llm.n_ctx()}")
    t0 = time.perf_counter()
    llm.eval(prompt)
    t1 = time.perf_counter()
    ids = []
    eos = llm.token_eos()
    for i in range(a.new):
        tok = last_argmax(llm)
        ids.append(tok)
        if tok == eos or i + 1 == a.new:
            break
        llm.eval([tok])
    print(json.dumps({
        "llama_cpp_python": llama_cpp.__version__,
        "prompt_ids": prompt,
        "ids": ids,
        "prefill_s": t1 - t0,
        "prefill_tok_s": len(prompt) / (t1 - t0),
    }))


if __name__ == "__main__":
    main()

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

With --fill random (as `kvlab depth --fill random`), each depth's positions are filled without
computing: the sequence's KV state is written as llama.cpp saves it (llama_state_seq_get_data's
layout: llama-context.cpp's magic and sequence id, then llama-kv-cache.cpp's state_write: stream count, cell count, each cell's pos and
sequence, then per layer the keys' type, row size and rows, then the values the same way, or
transposed when the cache keeps V transposed), with seeded random f16 keys and values, uniform
in [-1, 1), and loaded with llama_state_seq_set_data. The layout's types and sizes are read from
the state of one real token first; a model with more than one KV cache (sliding-window layers)
is refused.
"""
import argparse
import ctypes
import json
import struct
import sys
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


class KvLayout:
    """What one KV cache's saved state holds per cell, read from the state of one real token."""

    def __init__(self, blob, n_layer_model):
        at = 0

        def take(fmt):
            nonlocal at
            vals = struct.unpack_from(fmt, blob, at)
            at += struct.calcsize(fmt)
            return vals

        magic, _seq = take("<Ii")
        if magic != STATE_MAGIC:
            sys.exit(f"random fill: the sequence state starts with {magic:#x}, not {STATE_MAGIC:#x}")
        (n_stream,) = take("<I")
        (cells,) = take("<I")
        if n_stream != 1 or cells != 1:
            sys.exit(f"random fill: expected 1 stream of 1 cell, the state has {n_stream} and {cells}")
        pos, n_seq = take("<iI")
        if pos != 0 or n_seq != 1:
            sys.exit(f"random fill: the probe's cell holds position {pos} of {n_seq} sequences, not 0 of 1")
        take(f"<{n_seq}i")
        self.v_trans, n_layer = take("<II")
        if self.v_trans not in (0, 1) or n_layer != n_layer_model:
            # A second cache (sliding-window layers) holds the other layers; cells with extra
            # per-cell data (M-RoPE) shift everything after them.
            sys.exit(
                f"random fill: the saved state's first cache holds {n_layer} of the model's "
                f"{n_layer_model} layers (v_trans {self.v_trans}): a second KV cache (sliding-window "
                "layers) or cells with extra data, which this fill does not write; use --fill text"
            )
        self.k = []  # (type, row bytes) per layer
        for _ in range(n_layer):
            ty, row = take("<iQ")
            self.k.append((ty, row))
            at += row
        self.v = []  # (type, row bytes) or, transposed, (type, element bytes, rows)
        for _ in range(n_layer):
            if self.v_trans:
                ty, el, n_embd = take("<iII")
                self.v.append((ty, el, n_embd))
                at += el * n_embd
            else:
                ty, row = take("<iQ")
                self.v.append((ty, row))
                at += row
        if at != len(blob):
            sys.exit(
                f"random fill: {len(blob) - at} bytes after the first KV cache's state; "
                "models with more than one KV cache (sliding-window layers) fill with --fill text"
            )
        if any(ty != GGML_TYPE_F16 for ty, *_ in self.k + self.v):
            sys.exit("random fill: only an f16 KV cache (llama.cpp's default) is written")

    def blob(self, n, rng):
        """The saved state of n cells at positions 0..n-1 of sequence 0, random f16 rows."""
        parts = [struct.pack("<IiII", STATE_MAGIC, 0, 1, n)]
        parts.append(np.tile(np.array([0, 1, 0], dtype="<i4"), n).view(np.uint8).copy())
        parts[-1].view("<i4")[0::3] = np.arange(n, dtype="<i4")
        parts.append(struct.pack("<II", self.v_trans, len(self.k)))

        def rows(nbytes):
            x = rng.random(nbytes // 2, dtype=np.float32) * 2 - 1
            return x.astype(np.float16).view(np.uint8)

        for ty, row in self.k:
            parts += [struct.pack("<iQ", ty, row), rows(n * row)]
        for v in self.v:
            if self.v_trans:
                ty, el, n_embd = v
                parts += [struct.pack("<iII", ty, el, n_embd), rows(n * el * n_embd)]
            else:
                ty, row = v
                parts += [struct.pack("<iQ", ty, row), rows(n * row)]
        return np.concatenate([np.frombuffer(p, dtype=np.uint8) for p in parts])


GGML_TYPE_F16 = 1
# llama-context.cpp's io_magic, the first u32 of a saved sequence state.
STATE_MAGIC = 0xAF143CD8


def state_of_seq0(llm):
    """Sequence 0's saved KV state, as llama_state_seq_get_data writes it."""
    ctx = llm._ctx.ctx
    size = llama_cpp.llama_state_seq_get_size(ctx, 0)
    buf = (ctypes.c_uint8 * size)()
    got = llama_cpp.llama_state_seq_get_data(ctx, buf, size, 0)
    return bytes(buf[:got])


def fill_random(llm, layout, n, seed):
    """Sequence 0 holds n random positions (0..n-1); llama-cpp-python's own count follows."""
    blob = layout.blob(n, np.random.default_rng(seed))
    ptr = blob.ctypes.data_as(ctypes.POINTER(ctypes.c_uint8))
    if llama_cpp.llama_state_seq_set_data(llm._ctx.ctx, ptr, blob.size, 0) != blob.size:
        sys.exit(f"llama_state_seq_set_data refused {n} random positions")
    mem = llama_cpp.llama_get_memory(llm._ctx.ctx)
    last = llama_cpp.llama_memory_seq_pos_max(mem, 0)
    if last != n - 1:
        sys.exit(f"after the random fill the sequence ends at position {last}, not {n - 1}")
    llm.n_tokens = n


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("model")
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--depths", required=True, help="comma-separated, ascending")
    ap.add_argument("--n-gen", type=int, default=32)
    ap.add_argument("--ubatch", type=int, default=512)
    ap.add_argument("--prompt", required=True)
    ap.add_argument("--flash-attn", action="store_true")
    ap.add_argument("--fill", choices=["text", "random"], default="text")
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
    layout = None
    if a.fill == "random":
        llm.eval(ids[:1])
        layout = KvLayout(state_of_seq0(llm), llama_cpp.llama_model_n_layer(llm.model))
        llm.reset()
    rows, pos, fed = [], 0, 0
    for depth in depths:
        start = pos
        t0 = time.perf_counter()
        first = None
        if layout is not None and pos < depth - a.n_gen:
            n = depth - a.n_gen - pos
            # The whole sequence is written again (the state replaces it), seeded by depth.
            fill_random(llm, layout, depth - a.n_gen, depth)
            first = fill_token(ids, fed + n)
            fed += n
            pos += n
        while pos < depth - a.n_gen:
            n = min(a.ubatch, depth - a.n_gen - pos)
            llm.eval([fill_token(ids, k) for k in range(fed, fed + n)])
            fed += n
            pos += n
        fill_s = time.perf_counter() - t0
        step_ms, out = [], []
        for _ in range(a.n_gen):
            nxt = first if first is not None else last_argmax(llm)
            first = None
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
        "fill": a.fill,
        "threads": a.threads,
        "n_gen": a.n_gen,
        "ubatch": a.ubatch,
        "fill_ids": ids,
        "depths": rows,
    }), flush=True)


if __name__ == "__main__":
    main()

#!/usr/bin/env python3
"""llama.cpp oracle for Gemma 3 270M: writes the reference fixtures in fixtures/gemma3/.

What it writes (all JSON, each with `format_version` and a `provenance` block):
  tokens.json   llama.cpp's tokenization (llama_tokenize, add_bos=True, special=False) of every
                prompt in fixtures/prompts.txt plus a list of tricky strings, and the same
                with special=True (parse_special: control tokens written in the text, such as
                <start_of_turn>, become those tokens) as ids_special.
  greedy.json   greedy generation (argmax of the last position's logits, ties to the lowest id,
                no sampler, no repeat penalty) for every fixture prompt (BOS + prompt, 32 new
                tokens) and for long cases whose positions cross / start beyond 512 (the
                sliding window), with the top-2 logit margin at every step.
  dequant.json  (with --dequant, needs the `gguf` package) an independent dequantization of a
                few tensors of every type by gguf-py (numpy), for kvlab-gguf's cross-check.

Nothing here runs in CI: CI uses the stored fixtures. Re-run it only to regenerate them.

Install (builds llama.cpp from source, 10-40 minutes on 2 cores; no GPU needed):
    python3 -m venv /tmp/oracle-venv
    CMAKE_BUILD_PARALLEL_LEVEL=2 \
    CMAKE_ARGS="-DGGML_NATIVE=OFF -DGGML_AVX2=ON -DGGML_AVX512=OFF -DGGML_FMA=ON -DGGML_F16C=ON \
                -DLLAMA_CURL=OFF -DLLAMA_BUILD_TESTS=OFF -DLLAMA_BUILD_EXAMPLES=OFF" \
      /tmp/oracle-venv/bin/pip install --no-cache-dir llama-cpp-python==0.3.36 numpy
    /tmp/oracle-venv/bin/pip install gguf==0.19.0     # only for --dequant

Run (from the repository root):
    /tmp/oracle-venv/bin/python scripts/gemma_oracle.py \
        --model "$KVLAB_MODELS/gemma-3-270m-q4_k_m.gguf" --out fixtures/gemma3 --dequant

Determinism: n_threads=2, f32 KV cache (type_k = type_v = GGML_TYPE_F32), no flash attention,
n_ctx=2048, n_batch = n_ubatch = 512. llama.cpp's CPU matmuls quantize activations (to Q8_0 /
Q8_K) before the dot products with quantized weights, so its logits differ slightly from an
engine that dequantizes weights to f32: compare token ids, and treat steps whose recorded
top-2 margin is tiny as near-ties.
"""

from __future__ import annotations

import argparse
import datetime
import hashlib
import json
import os
import platform
import shlex
import sys
from pathlib import Path

FORMAT_VERSION = 1
EXPECTED_SHA256 = "a5fd3b62230aa5ec60212297dc9d20eaa70578ac519e00d93a17e44c087a6818"
BOS, EOS = 2, 1
N_GEN = 32
N_CTX = 2048
N_THREADS = 2
BUILD_FLAGS = (
    "-DGGML_NATIVE=OFF -DGGML_AVX2=ON -DGGML_AVX512=OFF -DGGML_FMA=ON -DGGML_F16C=ON "
    "-DLLAMA_CURL=OFF -DLLAMA_BUILD_TESTS=OFF -DLLAMA_BUILD_EXAMPLES=OFF"
)

# Strings that exercise the SentencePiece path: spaces (leading, trailing, runs), newlines,
# tabs, carriage returns, digits, accents (composed and decomposed), CJK, rare CJK (byte
# fallback), emoji (with a skin-tone modifier), U+2581 itself, text that looks like special or
# byte tokens (special=False keeps it plain text).
EXTRA_STRINGS = [
    "Hello world",
    " Hello",
    "Hello ",
    "  two  spaces   three   ",
    "     ",
    " ",
    "\n",
    "\n\nline one\nline two\n",
    "\ttab\tseparated\t",
    "windows\r\nline end",
    "1234567890 3.14159 2024-01-01 007",
    "naïve café résumé Ñandú",
    "e\u0301 versus \u00e9",
    "日本語のテキスト、中文，한국어",
    "\U0002000b\U0002a6a5",
    "emoji 🦀🔥👍🏽 done",
    "\u2581already\u2581has\u2581U+2581",
    "<start_of_turn>user\nhi<end_of_turn>",
    "x<0x41>y <bos> <unk>",
    "aaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaa",
    "The quick brown fox jumps over the lazy dog.",
    # Chat-shaped and special-token-heavy text, for special=True.
    "<start_of_turn>user\nWrite a poem about the sea.<end_of_turn>\n<start_of_turn>model\n",
    "<bos><start_of_turn>user\nhi<end_of_turn>\n<start_of_turn>model\nHello!<end_of_turn>\n",
    "a<end_of_turn>b <start_of_turn> c<eos>d<pad>e<unk>f<mask>g",
    "<start_of_turn><start_of_turn>x<end_of_turn><end_of_turn>",
    "<start_of_turn",
    "<<start_of_turn>>",
    " <start_of_image> image <end_of_image> ",
    "<unused0><unused99>[multimodal]",
    "<table><tr><td>cell</td></tr></table> <h1>title</h1> <b>bold</b>",
    "\n\n<start_of_turn>\n\n\n",
]


def load_prompts(path: Path) -> list[str]:
    """Same rules as xtask/src/prompts.rs: skip '#' and blank lines, `<empty>` is "",
    `\\n` and `\\t` escapes."""
    out = []
    for line in path.read_text(encoding="utf-8").split("\n"):
        line = line.removesuffix("\r")
        if line.startswith("#") or line == "":
            continue
        out.append("" if line == "<empty>" else line.replace("\\n", "\n").replace("\\t", "\t"))
    return out


def sha256(path: Path) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for chunk in iter(lambda: f.read(1 << 20), b""):
            h.update(chunk)
    return h.hexdigest()


def provenance(model: Path, digest: str, extra: dict) -> dict:
    p = {
        "tool": "scripts/gemma_oracle.py",
        "command": " ".join(shlex.quote(a) for a in [sys.executable, *sys.argv]),
        "date_utc": datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ"),
        "model_file": model.name,
        "model_sha256": digest,
        "python": platform.python_version(),
        "machine": platform.machine(),
    }
    p.update(extra)
    return p


def write_json(path: Path, obj: dict) -> None:
    text = json.dumps(obj, ensure_ascii=False, indent=1)
    path.write_text(text + "\n", encoding="utf-8")
    print(f"wrote {path} ({len(text.encode())} bytes)", file=sys.stderr)


def llama_provenance() -> dict:
    import llama_cpp

    info = llama_cpp.llama_print_system_info().decode(errors="replace").strip()
    # The sdist carries no git metadata; the shared-library versions identify the vendored
    # llama.cpp (for 0.3.36: libllama 0.5.0, ggml 0.25.3; its CMake printed "ggml commit:
    # 0c1e570-dirty").
    libdir = Path(llama_cpp.__file__).parent / "lib"
    libs = sorted(p.name for p in libdir.glob("lib*.so.*.*.*")) if libdir.is_dir() else []
    return {
        "llama_cpp_python": llama_cpp.__version__,
        "llama_cpp": "the llama.cpp vendored by llama-cpp-python "
        + llama_cpp.__version__
        + " (vendor/llama.cpp in its sdist), built from source; libraries: "
        + ", ".join(libs),
        # The flags of the documented install above, unless the run says otherwise (a library
        # built another way: its system_info below shows what it was built for).
        "build_flags": os.environ.get("KVLAB_ORACLE_BUILD_FLAGS", BUILD_FLAGS),
        "system_info": info,
    }


def open_llama(model: Path):
    # On a shared 2-core machine OpenMP's spinning barrier makes each token take seconds
    # instead of ~40 ms; passive waiting changes the speed, not the numbers.
    os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")
    import llama_cpp

    return llama_cpp.Llama(
        model_path=str(model),
        n_ctx=N_CTX,
        n_batch=512,
        n_ubatch=512,
        n_threads=N_THREADS,
        n_threads_batch=N_THREADS,
        logits_all=False,
        type_k=0,  # GGML_TYPE_F32
        type_v=0,
        flash_attn=False,
        seed=0,
        verbose=False,
    )


def token_texts(llm, ids: list[int]) -> list[str]:
    return [llm._model.token_get_text(i) for i in ids]


def tokens_fixture(llm, prompts: list[str]) -> list[dict]:
    cases = []
    for i, text in enumerate(prompts):
        cases.append({"source": "prompts.txt", "index": i, "text": text})
    for text in EXTRA_STRINGS:
        cases.append({"source": "extra", "text": text})
    for c in cases:
        ids = llm.tokenize(c["text"].encode("utf-8"), add_bos=True, special=False)
        c["ids"] = ids
        c["pieces"] = token_texts(llm, ids)
        c["ids_special"] = llm.tokenize(c["text"].encode("utf-8"), add_bos=True, special=True)
        # What llama.cpp's detokenizer gives back for the ids after BOS.
        c["detokenized"] = llm.detokenize(ids[1:]).decode("utf-8", errors="replace")
    return cases


def last_logits(llm):
    import llama_cpp
    import numpy as np

    ptr = llama_cpp.llama_get_logits_ith(llm._ctx.ctx, -1)
    return np.ctypeslib.as_array(ptr, shape=(llm.n_vocab(),)).astype(np.float32).copy()


def greedy(llm, prompt_ids: list[int], n_gen: int, keep_logits: int = 0) -> dict:
    """BOS-prefixed prompt ids in, greedy ids out: argmax over the logits of the last
    position (np.argmax returns the first maximum, i.e. ties go to the lowest id)."""
    import numpy as np

    llm.reset()
    llm.eval(prompt_ids)
    out: dict = {"generated_ids": [], "margins": [], "second_ids": [], "stopped_at_eos": False}
    for step in range(n_gen):
        logits = last_logits(llm)
        order = np.argsort(-logits, kind="stable")
        tok, second = int(order[0]), int(order[1])
        assert tok == int(np.argmax(logits))
        if step == 0:
            out["step0_top5"] = [[int(t), float(logits[t])] for t in order[:5]]
            if keep_logits:
                out["step0_logits_head"] = [float(x) for x in logits[:keep_logits]]
        out["generated_ids"].append(tok)
        out["second_ids"].append(second)
        out["margins"].append(round(float(logits[tok] - logits[second]), 6))
        if tok == EOS:
            out["stopped_at_eos"] = True
            break
        llm.eval([tok])
    return out


def long_prompt(llm, story: str, n_tokens: int) -> tuple[str, list[int]]:
    """The story repeated, cut at a word boundary to the first prefix with >= n_tokens ids
    (BOS included)."""
    words = " ".join([story] * 8).split(" ")
    lo, hi = 1, len(words)
    while lo < hi:  # smallest word count whose tokenization reaches n_tokens
        mid = (lo + hi) // 2
        if len(llm.tokenize(" ".join(words[:mid]).encode(), add_bos=True, special=False)) >= n_tokens:
            hi = mid
        else:
            lo = mid + 1
    text = " ".join(words[:lo])
    return text, llm.tokenize(text.encode(), add_bos=True, special=False)


def greedy_fixture(llm, prompts: list[str]) -> list[dict]:
    cases = []
    for i, text in enumerate(prompts):
        ids = llm.tokenize(text.encode("utf-8"), add_bos=True, special=False)
        c = {"name": f"prompt{i:02}", "source": "prompts.txt", "index": i, "prompt": text,
             "prompt_ids": ids, "n_gen": N_GEN}
        c.update(greedy(llm, ids, N_GEN, keep_logits=16 if i < 2 else 0))
        cases.append(c)
        print(f"  {c['name']}: {len(ids)} prompt ids, min margin {min(c['margins']):.4f}",
              file=sys.stderr)
    story = next(p for p in prompts if p.startswith("Once upon a time, in a small village"))
    for name, n_prompt, n_gen, note in [
        ("long_cross_512", 490, 64, "prompt fills positions 0..489; generation crosses 512"),
        ("long_beyond_512", 700, 32, "prompt alone is past the 512-token window"),
    ]:
        text, ids = long_prompt(llm, story, n_prompt)
        c = {"name": name, "source": "story repeated (prompts.txt line starting 'Once upon a "
             "time, in a small village'), cut at a word", "note": note, "prompt": text,
             "prompt_ids": ids, "n_gen": n_gen}
        c.update(greedy(llm, ids, n_gen))
        c["last_position"] = len(ids) + len(c["generated_ids"]) - 1
        cases.append(c)
        print(f"  {name}: {len(ids)} prompt ids, min margin {min(c['margins']):.4f}",
              file=sys.stderr)
    return cases


def window_check(model: Path, cases: list[dict]) -> None:
    """For every case that reaches past position 512, greedy ids again with the sliding window
    switched off (kv override gemma3.attention.sliding_window = 4096 > n_ctx): an engine that
    forgets the window produces `no_window_ids` instead of `generated_ids`."""
    import llama_cpp

    llm = llama_cpp.Llama(
        model_path=str(model), n_ctx=N_CTX, n_batch=512, n_ubatch=512, n_threads=N_THREADS,
        n_threads_batch=N_THREADS, logits_all=False, type_k=0, type_v=0, flash_attn=False,
        seed=0, verbose=False, kv_overrides={"gemma3.attention.sliding_window": 4096},
    )
    for c in cases:
        if len(c["prompt_ids"]) + c["n_gen"] <= 512:
            continue
        r = greedy(llm, c["prompt_ids"], c["n_gen"])
        c["no_window_ids"] = r["generated_ids"]
        c["window_changes_tokens"] = r["generated_ids"] != c["generated_ids"]
        print(f"  {c['name']}: window changes tokens: {c['window_changes_tokens']}", file=sys.stderr)


def dequant_fixture(model: Path) -> dict:
    import gguf
    import numpy as np

    r = gguf.GGUFReader(str(model))
    wanted = [
        "output_norm.weight", "blk.0.attn_norm.weight", "blk.0.attn_q_norm.weight",
        "token_embd.weight", "blk.0.attn_q.weight", "blk.0.attn_k.weight", "blk.0.attn_v.weight",
        "blk.0.attn_output.weight", "blk.0.ffn_gate.weight", "blk.0.ffn_up.weight",
        "blk.0.ffn_down.weight", "blk.17.ffn_down.weight", "blk.17.attn_output.weight",
    ]
    out = []
    for t in r.tensors:
        if t.name not in wanted:
            continue
        x = gguf.dequantize(t.data, t.tensor_type).astype(np.float32).reshape(-1)
        n = x.size
        probe = sorted(set(int(i) for i in np.linspace(0, n - 1, 64)))
        x64 = x.astype(np.float64)
        out.append({
            "name": t.name,
            "ggml_type": t.tensor_type.name,
            "ne": [int(d) for d in t.shape],
            "n_elements": int(n),
            "head": [float(v) for v in x[:32]],
            "probe_index": probe,
            "probe_value": [float(x[i]) for i in probe],
            "sum": float(x64.sum()),
            "sum_abs": float(np.abs(x64).sum()),
            "sum_sq": float((x64 * x64).sum()),
        })
        print(f"  {t.name}: {t.tensor_type.name} {n} elements", file=sys.stderr)
    return {"tool": "gguf-py " + getattr(gguf, "__version__", "0.19.0") + " (gguf.dequantize, numpy)",
            "tensors": out}


def main() -> int:
    root = Path(__file__).resolve().parent.parent
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    default_model = Path(os.environ.get("KVLAB_MODELS", root.parent / "shared" / "models")) / "gemma-3-270m-q4_k_m.gguf"
    ap.add_argument("--model", type=Path, default=default_model)
    ap.add_argument("--prompts", type=Path, default=root / "fixtures" / "prompts.txt")
    ap.add_argument("--out", type=Path, default=root / "fixtures" / "gemma3")
    ap.add_argument("--skip-llama", action="store_true", help="only --dequant")
    ap.add_argument("--tokens-only", action="store_true", help="only tokens.json (seconds, not minutes)")
    ap.add_argument("--dequant", action="store_true", help="also write dequant.json (needs gguf)")
    args = ap.parse_args()

    digest = sha256(args.model)
    if digest != EXPECTED_SHA256:
        print(f"warning: {args.model} has sha256 {digest}, expected {EXPECTED_SHA256}", file=sys.stderr)
    args.out.mkdir(parents=True, exist_ok=True)
    prompts = load_prompts(args.prompts)

    if not args.skip_llama:
        llm = open_llama(args.model)
        prov = provenance(args.model, digest, llama_provenance())
        prov.update({"n_ctx": N_CTX, "n_threads": N_THREADS, "n_batch": 512, "n_ubatch": 512,
                     "kv_cache_type": "f32", "flash_attn": False,
                     "omp_wait_policy": os.environ.get("OMP_WAIT_POLICY")})
        write_json(args.out / "tokens.json", {
            "format_version": FORMAT_VERSION,
            "what": "llama_tokenize(text, add_bos=True, special=False) ids; pieces are the "
                    "vocabulary strings of those ids; detokenized is llama.cpp's "
                    "detokenization of the ids after BOS; ids_special are "
                    "llama_tokenize(text, add_bos=True, special=True) ids",
            "provenance": prov,
            "bos_id": BOS,
            "cases": tokens_fixture(llm, prompts),
        })
        if args.tokens_only:
            return 0
        cases = greedy_fixture(llm, prompts)
        del llm
        window_check(args.model, cases)
        write_json(args.out / "greedy.json", {
            "format_version": FORMAT_VERSION,
            "what": "greedy decoding: prompt_ids (BOS + prompt) evaluated, then at each step "
                    "the argmax of the last position's logits (ties to the lowest id) is "
                    "appended; margins[i] = logit(generated_ids[i]) - logit(second_ids[i]); "
                    "stops early at EOS (id 1), recorded in stopped_at_eos; for cases that "
                    "reach past position 512, no_window_ids are the greedy ids with the "
                    "sliding window switched off (a wrong-window engine produces those)",
            "provenance": prov,
            "eos_id": EOS,
            "cases": cases,
        })
    if args.dequant:
        d = dequant_fixture(args.model)
        write_json(args.out / "dequant.json", {
            "format_version": FORMAT_VERSION,
            "what": "f32 values of whole tensors dequantized by gguf-py: the first 32 values, "
                    "64 probes at evenly spaced flat indices, and f64 sums of x, |x| and x^2",
            "provenance": provenance(args.model, digest, {"dequantizer": d["tool"]}),
            "tensors": d["tensors"],
        })
    return 0


if __name__ == "__main__":
    sys.exit(main())

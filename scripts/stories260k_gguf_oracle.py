#!/usr/bin/env python3
"""llama.cpp oracle for kvlab's `llama` GGUF path: writes fixtures/stories260k_gguf/greedy.json.

An independent writer and a second oracle for crates/model/src/load/gguf/llama.rs:
  1. scripts/peers/llama2c_to_gguf.py (gguf-py's GGUFWriter, not kvlab's builder) turns the
     shipped fixtures/models/stories260K.bin + tok512.bin into an f32 GGUF of architecture
     `llama` (default /tmp/stories260K.gguf);
  2. llama.cpp (through llama-cpp-python) tokenizes each of the first fixture prompts
     (add_bos=True, special=False) and decodes greedily: argmax of the last position's logits,
     ties to the lowest id, no sampler, N_GEN new tokens, not stopped at EOS (a stop is marked).

The Rust test crates/model/tests/llama_gguf.rs reads the GGUF this script writes (via
KVLAB_STORIES260K_GGUF; a local check, not run in CI) and checks kvlab against the ids.

Run (from the repository root; a venv with llama-cpp-python 0.3.36 and gguf 0.19.0, installed
as scripts/gemma_oracle.py documents):
    OMP_WAIT_POLICY=PASSIVE /path/to/venv/bin/python scripts/stories260k_gguf_oracle.py

Determinism as scripts/gemma_oracle.py: n_threads=2, f32 KV cache, no flash attention,
n_ctx=512 (the model's context), n_batch = n_ubatch = 512.
"""

from __future__ import annotations

import argparse
import datetime
import importlib.metadata
import json
import os
import platform
import shlex
import subprocess
import sys
from pathlib import Path

FORMAT_VERSION = 1
N_GEN = 64
N_CTX = 512
N_THREADS = 2
N_PROMPTS = 5  # prompts.txt's first five: <empty>, "A", "Once upon a time", two short stories
BOS, EOS = 1, 2


# The same prompt rules and file hash as the Gemma oracle beside this script.
sys.path.insert(0, str(Path(__file__).resolve().parent))
from gemma_oracle import load_prompts, sha256  # noqa: E402


def main() -> int:
    root = Path(__file__).resolve().parent.parent
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--gguf", type=Path, default=Path("/tmp/stories260K.gguf"),
                    help="where llama2c_to_gguf.py writes the GGUF")
    ap.add_argument("--out", type=Path, default=root / "fixtures" / "stories260k_gguf")
    args = ap.parse_args()

    models = root / "fixtures" / "models"
    writer = root / "scripts" / "peers" / "llama2c_to_gguf.py"
    cmd = [sys.executable, str(writer), str(models / "stories260K.bin"), str(models / "tok512.bin"),
           str(args.gguf)]
    subprocess.run(cmd, check=True)
    digest = sha256(args.gguf)

    os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")
    import gguf
    import llama_cpp
    import numpy as np

    llm = llama_cpp.Llama(
        model_path=str(args.gguf), n_ctx=N_CTX, n_batch=512, n_ubatch=512, n_threads=N_THREADS,
        n_threads_batch=N_THREADS, logits_all=False, type_k=0, type_v=0,  # GGML_TYPE_F32
        flash_attn=False, seed=0, verbose=False,
    )
    cases = []
    for i, text in enumerate(load_prompts(root / "fixtures" / "prompts.txt")[:N_PROMPTS]):
        ids = llm.tokenize(text.encode("utf-8"), add_bos=True, special=False)
        llm.reset()
        llm.eval(ids)
        gen, margins, stopped = [], [], None
        for step in range(N_GEN):
            ptr = llama_cpp.llama_get_logits_ith(llm._ctx.ctx, -1)
            logits = np.ctypeslib.as_array(ptr, shape=(llm.n_vocab(),)).astype(np.float32).copy()
            order = np.argsort(-logits, kind="stable")
            tok = int(np.argmax(logits))
            assert tok == int(order[0])
            gen.append(tok)
            margins.append(round(float(logits[order[0]] - logits[order[1]]), 6))
            if tok == EOS and stopped is None:
                stopped = step
            llm.eval([tok])
        cases.append({
            "name": f"prompt{i:02}", "index": i, "prompt": text, "prompt_ids": ids,
            "generated_ids": gen, "min_margin": min(margins), "first_eos_step": stopped,
            "text": llm.detokenize(gen).decode("utf-8", errors="replace"),
        })
        print(f"  prompt{i:02}: {len(ids)} prompt ids, min margin {min(margins):.4f}", file=sys.stderr)

    libdir = Path(llama_cpp.__file__).parent / "lib"
    libs = sorted(p.name for p in libdir.glob("lib*.so.*.*.*")) if libdir.is_dir() else []
    prov = {
        "tool": "scripts/stories260k_gguf_oracle.py",
        "command": " ".join(shlex.quote(a) for a in [sys.executable, *sys.argv]),
        "gguf_writer_command": " ".join(shlex.quote(str(Path(a).relative_to(root)) if a.startswith(str(root)) else a)
                                        for a in cmd[1:]),
        "date_utc": datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ"),
        "gguf_file": args.gguf.name,
        "gguf_sha256": digest,
        "gguf_bytes": args.gguf.stat().st_size,
        "source_sha256": {n: sha256(models / n) for n in ["stories260K.bin", "tok512.bin"]},
        "gguf_py": importlib.metadata.version("gguf"),
        "llama_cpp_python": llama_cpp.__version__,
        "llama_cpp_libraries": libs,
        "numpy": np.__version__,
        "python": platform.python_version(),
        "machine": platform.machine(),
        "system_info": llama_cpp.llama_print_system_info().decode(errors="replace").strip(),
        "n_ctx": N_CTX, "n_threads": N_THREADS, "n_batch": 512, "n_ubatch": 512,
        "kv_cache": "f32 (type_k = type_v = 0)", "flash_attn": False,
        "omp_wait_policy": os.environ.get("OMP_WAIT_POLICY"),
        "decoding": f"greedy: argmax of the last logits, ties to the lowest id, {N_GEN} new tokens, "
                    "not stopped at EOS (first_eos_step marks one)",
    }
    args.out.mkdir(parents=True, exist_ok=True)
    path = args.out / "greedy.json"
    text = json.dumps({"format_version": FORMAT_VERSION, "provenance": prov, "cases": cases},
                      ensure_ascii=False, indent=1)
    path.write_text(text + "\n", encoding="utf-8")
    print(f"wrote {path} ({len(text.encode())} bytes)", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())

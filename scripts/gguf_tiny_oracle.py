#!/usr/bin/env python3
"""llama.cpp oracle for kvlab's GGUF loader on the tiny fixtures: writes fixtures/gguf/<name>.json.

For tiny-llama, tiny-llama3 (Llama 3.1 RoPE), tiny-qwen2 and tiny-qwen3 (fixtures/models/), whose
transformers outputs are fixtures/hf/<name>.json (scripts/hf_oracle.py), this checks that the
GGUF conversions fixtures/models/<name>.gguf (scripts/hf_to_gguf.py: gguf-py, no kvlab code)
make llama.cpp (through llama-cpp-python) compute what transformers computed, and records
llama.cpp's own ids, so kvlab's GGUF path (architectures `llama` with a GPT-2-style byte-level
BPE vocabulary, `qwen2`, `qwen3`) is tested against two implementations no kvlab code wrote:

  * tokens: every `tokens[].text` of the transformers record is tokenized by llama.cpp
    (llama_tokenize) with add_special=True, parse_special=True, which is transformers'
    tokenizer(text).input_ids (`ids`: BOS first when the GGUF's add_bos_token says so, special
    tokens written in the text parsed), and with add_special=False, parse_special=True, which is
    tokenizer(text, add_special_tokens=False).input_ids (`ids_no_special`); both are compared.
    Also recorded, not compared (transformers' record has no counterpart): add_special=False,
    parse_special=False (`ids_plain`: "<|im_start|>" in the text is plain text).
  * cases: every `cases[]` entry's prompt_ids (transformers' own ids, fed as they are) is
    decoded greedily: at each step the argmax of the last position's logits (np.argmax: ties to
    the lowest id; no sampler), fed back one token at a time with the KV cache, for n_gen steps
    or until EOS is generated (included), the rule of the transformers record (its
    stopped_at_eos). The ids are compared with transformers' generated_ids. A divergence is
    accepted only where transformers' top-2 margin at that step is below NEAR_TIE (1e-3): a
    near-tie that float rounding may flip; it is then recorded (near_tie_flip) and printed.
    For the cases whose record has step_logits (transformers' full logits at steps 0-2), the
    largest absolute logit difference is recorded too.

Exit status 1 if anything disagrees with transformers (other than a recorded near-tie flip), or
if a GGUF is missing.

Run (from the repository root; the GGUFs first, in a venv with torch + gguf, then this in a venv
with llama-cpp-python 0.3.36 and numpy, installed as scripts/gemma_oracle.py documents):
    /work/peers/hf-venv/bin/python scripts/hf_to_gguf.py
    OMP_WAIT_POLICY=PASSIVE /work/peers/lcp-venv/bin/python scripts/gguf_tiny_oracle.py

Determinism as scripts/gemma_oracle.py: n_threads=2, f32 KV cache (type_k = type_v = 0,
GGML_TYPE_F32), no flash attention, n_ctx = the model's context (256), n_batch = n_ubatch = n_ctx
(a prompt is one batch), CPU only.
"""

from __future__ import annotations

import argparse
import datetime
import importlib.metadata
import json
import os
import platform
import shlex
import sys
from pathlib import Path

FORMAT_VERSION = 1
N_THREADS = 2
NEAR_TIE = 1e-3
MODELS = ["tiny-llama", "tiny-llama3", "tiny-qwen2", "tiny-qwen3"]

sys.path.insert(0, str(Path(__file__).resolve().parent))
from gemma_oracle import sha256  # noqa: E402  (the same file hash as the other oracles)


def last_logits(llama_cpp, np, llm):
    ptr = llama_cpp.llama_get_logits_ith(llm._ctx.ctx, -1)
    return np.ctypeslib.as_array(ptr, shape=(llm.n_vocab(),)).astype(np.float32).copy()


def greedy(llama_cpp, np, llm, prompt_ids, n_gen, eos):
    """Greedy ids, top-2 margins, and the full logits of steps 0-2."""
    llm.reset()
    llm.eval(prompt_ids)
    gen, margins, step_logits = [], [], []
    for step in range(n_gen):
        logits = last_logits(llama_cpp, np, llm)
        tok = int(np.argmax(logits))  # first maximum: ties to the lowest id
        margins.append(float(logits[tok] - np.partition(logits, -2)[-2]))
        if step < 3:
            step_logits.append(logits)
        gen.append(tok)
        if tok == eos or step + 1 == n_gen:
            break
        llm.eval([tok])
    return gen, margins, step_logits


def run_model(name, gguf_path, hf, llama_cpp, np):
    # n_ctx = the model's own context, read from the file by gguf-py before llama.cpp loads it.
    import gguf
    fields = gguf.GGUFReader(str(gguf_path)).fields
    arch = fields["general.architecture"].contents()
    n_ctx = int(fields[f"{arch}.context_length"].contents())
    add_bos_md = fields["tokenizer.ggml.add_bos_token"].contents()
    llm = llama_cpp.Llama(
        model_path=str(gguf_path), n_ctx=n_ctx, n_batch=n_ctx, n_ubatch=n_ctx,
        n_threads=N_THREADS, n_threads_batch=N_THREADS, logits_all=False,
        type_k=0, type_v=0,  # GGML_TYPE_F32
        flash_attn=False, seed=0, n_gpu_layers=0, verbose=False,
    )
    eos = hf["eos_id"]
    assert llm.token_eos() == eos, f"{name}: llama.cpp's EOS {llm.token_eos()} != transformers' {eos}"
    bos = llm.token_bos()

    tokens, tok_ok = [], 0
    for t in hf["tokens"]:
        raw = t["text"].encode("utf-8")
        ids = llm.tokenize(raw, add_bos=True, special=True)
        ids_ns = llm.tokenize(raw, add_bos=False, special=True)
        ids_plain = llm.tokenize(raw, add_bos=False, special=False)
        ok = ids == t["ids"] and ids_ns == t["ids_no_special"]
        tok_ok += ok
        rec = {"text": t["text"], "ids": ids, "ids_no_special": ids_ns, "ids_plain": ids_plain,
               "equal_transformers": ok}
        if not ok:
            rec["transformers_ids"] = t["ids"]
            rec["transformers_ids_no_special"] = t["ids_no_special"]
            print(f"  {name}: TOKENS DIFFER for {t['text'][:40]!r}:\n    llama.cpp    {ids}\n"
                  f"    transformers {t['ids']}", file=sys.stderr)
        tokens.append(rec)

    cases, case_ok, flips, failures = [], 0, [], 0
    for c in hf["cases"]:
        gen, margins, step_logits = greedy(llama_cpp, np, llm, c["prompt_ids"], c["n_gen"], eos)
        ref = c["generated_ids"]
        equal = gen == ref
        rec = {"name": c["name"], "prompt_ids": c["prompt_ids"], "n_gen": c["n_gen"],
               "generated_ids": gen, "stopped_at_eos": bool(gen and gen[-1] == eos),
               "min_margin": round(min(margins), 6), "equal_transformers": equal}
        if "step_logits" in c:
            diffs = [float(np.max(np.abs(ours - np.asarray(theirs, dtype=np.float32))))
                     for ours, theirs in zip(step_logits, c["step_logits"])]
            rec["max_abs_logit_diff_steps_0_2"] = round(max(diffs), 7)
        if equal:
            case_ok += 1
        else:
            step = next((i for i, (a, b) in enumerate(zip(gen, ref)) if a != b), min(len(gen), len(ref)))
            hf_margin = c["margins"][step] if step < len(c["margins"]) else None
            near = step < len(gen) and step < len(ref) and hf_margin is not None and hf_margin < NEAR_TIE
            rec["first_difference_step"] = step
            rec["transformers_generated_ids"] = ref
            rec["transformers_margin_at_difference"] = hf_margin
            rec["llama_cpp_margin_at_difference"] = round(margins[step], 6) if step < len(margins) else None
            rec["near_tie_flip"] = near
            if near:
                flips.append(f"{c['name']} step {step} (transformers margin {hf_margin})")
                print(f"  {name}: {c['name']}: near-tie flip at step {step}: llama.cpp {gen[step]}, "
                      f"transformers {ref[step]} (margin {hf_margin})", file=sys.stderr)
            else:
                failures += 1
                print(f"  {name}: {c['name']}: GENERATION DIFFERS at step {step}:\n"
                      f"    llama.cpp    {gen}\n    transformers {ref}", file=sys.stderr)
        cases.append(rec)
    failures += len(tokens) - tok_ok
    summary = {"texts": len(tokens), "texts_equal": tok_ok, "cases": len(cases),
               "cases_equal": case_ok, "near_tie_flips": flips, "failures": failures}
    meta = {"n_ctx": n_ctx, "bos_id": bos, "eos_id": eos, "add_bos_token": add_bos_md,
            "tokenizer_pre": llm.metadata.get("tokenizer.ggml.pre"),
            "architecture": llm.metadata.get("general.architecture")}
    return meta, tokens, cases, summary


def main() -> int:
    root = Path(__file__).resolve().parent.parent
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--models-dir", type=Path, default=root / "fixtures" / "models",
                    help="where <name>.gguf (scripts/hf_to_gguf.py) are")
    ap.add_argument("--hf", type=Path, default=root / "fixtures" / "hf",
                    help="transformers' records <name>.json")
    ap.add_argument("--out", type=Path, default=root / "fixtures" / "gguf")
    ap.add_argument("--only", choices=MODELS, help="one model")
    args = ap.parse_args()

    os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")
    import llama_cpp
    import numpy as np

    libdir = Path(llama_cpp.__file__).parent / "lib"
    libs = sorted(p.name for p in libdir.glob("lib*.so.*.*.*")) if libdir.is_dir() else []
    try:
        gguf_version = importlib.metadata.version("gguf")
    except importlib.metadata.PackageNotFoundError:
        gguf_version = None
    date = datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ")
    rel = lambda p: str(p.relative_to(root)) if p.is_relative_to(root) else str(p)  # noqa: E731

    bad = 0
    lines = []
    for name in MODELS:
        if args.only and args.only != name:
            continue
        gguf_path = args.models_dir / f"{name}.gguf"
        hf_path = args.hf / f"{name}.json"
        if not gguf_path.is_file():
            print(f"{gguf_path} is missing: run scripts/hf_to_gguf.py first", file=sys.stderr)
            bad += 1
            continue
        hf = json.loads(hf_path.read_text(encoding="utf-8"))
        meta, tokens, cases, summary = run_model(name, gguf_path, hf, llama_cpp, np)
        bad += summary["failures"]
        prov = {
            "tool": "scripts/gguf_tiny_oracle.py",
            "command": " ".join(shlex.quote(a) for a in [sys.executable, *sys.argv]),
            "gguf_writer_command": "python scripts/hf_to_gguf.py",
            "date_utc": date,
            "gguf_file": rel(gguf_path),
            "gguf_sha256": sha256(gguf_path),
            "gguf_bytes": gguf_path.stat().st_size,
            "transformers_record": rel(hf_path),
            "transformers_record_sha256": sha256(hf_path),
            "gguf_py": gguf_version,
            "llama_cpp_python": llama_cpp.__version__,
            "llama_cpp_libraries": libs,
            "numpy": np.__version__,
            "python": platform.python_version(),
            "machine": platform.machine(),
            "system_info": llama_cpp.llama_print_system_info().decode(errors="replace").strip(),
            "n_ctx": meta["n_ctx"], "n_threads": N_THREADS, "n_batch": meta["n_ctx"],
            "n_ubatch": meta["n_ctx"], "kv_cache": "f32 (type_k = type_v = 0)", "flash_attn": False,
            "n_gpu_layers": 0, "omp_wait_policy": os.environ.get("OMP_WAIT_POLICY"),
        }
        record = {
            "format_version": FORMAT_VERSION,
            "what": (
                "llama.cpp (llama-cpp-python, CPU, f32 weights and KV cache) on the GGUF that "
                "scripts/hf_to_gguf.py converts from fixtures/models/<name>/, checked against "
                "transformers' record fixtures/hf/<name>.json. tokens[]: llama_tokenize of each "
                "text: ids with add_special=True, parse_special=True (= transformers' "
                "tokenizer(text).input_ids), ids_no_special with add_special=False, "
                "parse_special=True (= add_special_tokens=False), ids_plain with both false (not "
                "compared); equal_transformers: ids and ids_no_special both equal transformers'. "
                "cases[]: transformers' prompt_ids fed as they are, then greedy decoding: argmax "
                "of the last position's logits (ties to the lowest id, no sampler), one token at "
                "a time with the KV cache, n_gen steps or until EOS is generated (included; "
                "stopped_at_eos), as transformers' record; min_margin: the smallest top-2 logit "
                "gap of llama.cpp's steps; equal_transformers: generated_ids equal transformers' "
                "generated_ids; a difference is accepted only at a step where transformers' "
                f"margin is below {NEAR_TIE} (near_tie_flip); max_abs_logit_diff_steps_0_2: "
                "largest |llama.cpp - transformers| logit over steps 0-2 where transformers "
                "recorded step_logits"
            ),
            "provenance": prov,
            "model": name,
            "architecture": meta["architecture"],
            "tokenizer_pre": meta["tokenizer_pre"],
            "add_bos_token": meta["add_bos_token"],
            "bos_id": meta["bos_id"],
            "eos_id": meta["eos_id"],
            "summary": summary,
            "cases": cases,
            "tokens": tokens,
        }
        args.out.mkdir(parents=True, exist_ok=True)
        path = args.out / f"{name}.json"
        text = json.dumps(record, ensure_ascii=False, indent=1)
        path.write_text(text + "\n", encoding="utf-8")
        logit_diffs = [c["max_abs_logit_diff_steps_0_2"] for c in cases if "max_abs_logit_diff_steps_0_2" in c]
        line = (f"{name:12} {meta['architecture']:6} pre {meta['tokenizer_pre']:6} texts "
                f"{summary['texts_equal']}/{summary['texts']}, cases {summary['cases_equal']}/"
                f"{summary['cases']}, near-tie flips {len(summary['near_tie_flips'])}, "
                f"max |logit diff| steps 0-2 {max(logit_diffs) if logit_diffs else float('nan'):.2e}"
                f" -> {rel(path)}")
        for f in summary["near_tie_flips"]:
            line += f"\n{'':13}near-tie flip: {f}"
        lines.append(line)
        print(line, file=sys.stderr)
    print("\nsummary (llama.cpp vs transformers):")
    print("\n".join(lines))
    print("ALL AGREE" if bad == 0 else f"{bad} DISAGREEMENT(S)")
    return 0 if bad == 0 else 1


if __name__ == "__main__":
    sys.exit(main())

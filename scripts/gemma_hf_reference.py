#!/usr/bin/env python3
"""f32 oracle for Gemma 3 270M: Hugging Face transformers on the SAME GGUF file as llama.cpp.

Why: llama.cpp (fixtures/gemma3/greedy.json) quantizes activations to 8 bits inside its matmuls,
so near-tie steps can flip against an engine that dequantizes the weights to f32 and computes in
f32 (kvlab). transformers dequantizes the GGUF tensors (with gguf-py) to f32 and runs its own
Gemma 3 code (models/gemma3/modeling_gemma3.py) in f32: an independent f32 reference.

What it writes: fixtures/gemma3/hf_f32.json (format_version 1). For each case of greedy.json,
with its prompt_ids exactly (BOS included, never retokenized), HF greedy decoding for the same
number of steps (n_gen), by explicit argmax of the last position's logits (torch.argmax: ties to
the lowest id; no generate(), no sampler), with use_cache=True (DynamicCache; the sliding layers
keep their window) and then checked by recomputing: one cache-free forward over
prompt + generated[:-1] must give the same argmax at every step (recompute_* fields). Per step:
the chosen id, the second id, the top-2 margin; for steps 0 and 1 the top-10 (id, logit) pairs and
HF's logits of llama.cpp's chosen and second id at that step (histories equal only while the ids
so far agree: `history_equals_llama`). Also teacher-forced on llama.cpp's ids (one cache-free
forward over prompt + llama's generated[:-1]): HF's argmax under llama.cpp's history and HF's
margin logit(llama chosen) - logit(llama second) at every step (`tf_llama`). For prompt00 and
prompt02 the first 64 step-0 logits and max|logit|.

Checks it makes before writing (the run fails if one does not hold):
  * sha256 of the model file;
  * config: model_type gemma3_text, sliding_window 512, layer_types sliding except layers
    5, 11, 17, RoPE theta 10,000 (sliding) / 1e6 (full), query_pre_attn_scalar = head_dim = 256,
    no soft-capping, tied embeddings, attention implementation eager;
  * norm weights: llama.cpp's converter stores 1 + w; transformers' GGUF loader
    (Gemma2TensorProcessor, also used for gemma3) subtracts 1 again, and Gemma3RMSNorm computes
    x_hat * (1 + w_hf). The script checks (1 + w_hf) == w_gguf in f32 for every norm tensor;
  * rotary inv_freq buffers equal theta^(-2j/256) (non-persistent buffers after a GGUF load);
  * an independent transcription of llama.cpp's gemma3 graph (src/models/gemma3.cpp) in torch
    from the raw GGUF tensors (norm weights used as stored, x_hat * w_gguf) gives the same step-0
    logits as the HF model for every case (`direct_check`).

Install (CPU only; the PyPI torch wheel for linux x86_64 is the CUDA build and pulls ~5 GB of
nvidia-* wheels, which is fine on disk; CPU execution is forced here anyway):
    python3 -m venv /tmp/hf-venv
    /tmp/hf-venv/bin/pip install torch==2.15.0 transformers==5.23.0 accelerate gguf==0.19.0 \
        numpy sentencepiece protobuf
(transformers requires accelerate to load a GGUF file.) Tested with torch 2.15.0 (+cu132 wheel, run
on CPU), transformers 5.23.0, accelerate, gguf 0.19.0, numpy 2.4.6, Python 3.11.

Tokenizer: not used (prompt_ids are taken from greedy.json as they are). For the record,
AutoTokenizer.from_pretrained(dir, gguf_file=name) builds a GemmaTokenizer from the GGUF vocabulary
(~17 s) and reproduces all 14 prompt_ids of greedy.json from their prompt text.

Run (from the repository root; 2 threads; about 10 minutes on 2 shared cores, peak ~4 GB RAM):
    OMP_NUM_THREADS=2 /tmp/hf-venv/bin/python scripts/gemma_hf_reference.py \
        --model "$KVLAB_MODELS/gemma-3-270m-q4_k_m.gguf" \
        --greedy fixtures/gemma3/greedy.json --out fixtures/gemma3/hf_f32.json

Compare kvlab's step-0 logits with HF's (kvlab's dump from crates/cpu/examples/gemma_dump.rs):
    KVLAB_MODELS=... cargo run --release -p kvlab-cpu --example gemma_dump -- \
        fixtures/gemma3/hf_f32.json > /tmp/kvlab_dump.json
    /tmp/hf-venv/bin/python scripts/gemma_hf_reference.py --compare-kvlab /tmp/kvlab_dump.json
(with --model too, it reruns HF's step 0 and compares full logit vectors when the dump names
raw files.)
"""

from __future__ import annotations

import os

os.environ.setdefault("OMP_NUM_THREADS", "2")
os.environ.setdefault("MKL_NUM_THREADS", "2")
os.environ.setdefault("CUDA_VISIBLE_DEVICES", "")

import argparse
import datetime
import hashlib
import json
import math
import platform
import shlex
import sys
from pathlib import Path

import numpy as np

FORMAT_VERSION = 1
EXPECTED_SHA256 = "a5fd3b62230aa5ec60212297dc9d20eaa70578ac519e00d93a17e44c087a6818"
N_THREADS = 2
TOPK = 10
HEAD_CASES = ("prompt00", "prompt02")
HEAD_N = 64


def sha256(path: Path) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for chunk in iter(lambda: f.read(1 << 20), b""):
            h.update(chunk)
    return h.hexdigest()


def r6(x: float) -> float:
    return round(float(x), 6)


def top2(logits):
    """(best id, second id, margin) with ties to the lowest id (torch.topk is not tie-stable)."""
    import torch

    best = int(torch.argmax(logits))
    masked = logits.clone()
    masked[best] = -math.inf
    second = int(torch.argmax(masked))
    return best, second, float(logits[best] - logits[second])


def topk_pairs(logits, k=TOPK):
    import torch

    vals, ids = torch.sort(logits, descending=True, stable=True)
    return [[int(i), r6(v)] for i, v in zip(ids[:k], vals[:k])]


# --------------------------------------------------------------------------------------------
# Loading and checks


def load_hf(model_path: Path):
    import torch
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(
        str(model_path.parent),
        gguf_file=model_path.name,
        dtype=torch.float32,
        attn_implementation="eager",
    )
    model.eval()
    return model


def check_config(model) -> dict:
    c = model.config
    lt = list(c.layer_types)
    want_lt = ["full_attention" if l % 6 == 5 else "sliding_attention" for l in range(18)]
    rp = c.rope_parameters
    facts = {
        "model_type": c.model_type,
        "attn_implementation": c._attn_implementation,
        "sliding_window": c.sliding_window,
        "full_attention_layers": [i for i, t in enumerate(lt) if t == "full_attention"],
        "rope_theta_sliding": rp["sliding_attention"]["rope_theta"],
        "rope_theta_full": rp["full_attention"]["rope_theta"],
        "rope_type": [rp["sliding_attention"]["rope_type"], rp["full_attention"]["rope_type"]],
        "query_pre_attn_scalar": c.query_pre_attn_scalar,
        "head_dim": c.head_dim,
        "rms_norm_eps": c.rms_norm_eps,
        "hidden_activation": c.hidden_activation,
        "final_logit_softcapping": c.final_logit_softcapping,
        "attn_logit_softcapping": c.attn_logit_softcapping,
        "tie_word_embeddings": c.tie_word_embeddings,
        "embed_scale": float(model.model.embed_tokens.embed_scale),
    }
    assert facts["model_type"] == "gemma3_text", facts
    assert facts["attn_implementation"] == "eager", facts
    assert facts["sliding_window"] == 512, facts
    assert lt == want_lt, lt
    assert facts["rope_theta_sliding"] == 10_000.0 and facts["rope_theta_full"] == 1_000_000.0, rp
    assert facts["rope_type"] == ["default", "default"], rp
    assert facts["query_pre_attn_scalar"] == 256 and facts["head_dim"] == 256, facts
    assert facts["final_logit_softcapping"] is None and facts["attn_logit_softcapping"] is None
    assert facts["hidden_activation"] == "gelu_pytorch_tanh"
    assert facts["tie_word_embeddings"]
    assert model.lm_head.weight.data_ptr() == model.model.embed_tokens.weight.data_ptr()
    assert abs(facts["embed_scale"] - math.sqrt(640)) < 1e-5
    for l, layer in enumerate(model.model.layers):
        a = layer.self_attn
        assert a.sliding_window == (512 if want_lt[l] == "sliding_attention" else None), (l, a.sliding_window)
        assert a.scaling == 256 ** -0.5
    return facts


def check_rotary(model) -> float:
    """Max |inv_freq - theta^(-2j/256)| over both rotary tables (buffers are not in the GGUF)."""
    import torch

    worst = 0.0
    rot = model.model.rotary_emb
    for lt, theta in (("sliding_attention", 10_000.0), ("full_attention", 1_000_000.0)):
        inv = getattr(rot, f"{lt}_inv_freq")
        want = 1.0 / (theta ** (torch.arange(0, 256, 2, dtype=torch.int64).float() / 256))
        worst = max(worst, float((inv.float() - want).abs().max()))
    assert worst == 0.0, worst
    return worst


def gguf_tensors(model_path: Path) -> dict:
    from gguf import GGUFReader, dequantize

    r = GGUFReader(str(model_path))
    out = {}
    for t in r.tensors:
        a = dequantize(t.data, t.tensor_type)
        out[t.name] = np.ascontiguousarray(a.reshape([int(d) for d in reversed(t.shape)]).astype(np.float32))
    return out


def check_norms(model, g: dict) -> dict:
    """(1 + w_hf) must equal the GGUF weight (1 + w baked in by llama.cpp's converter), in f32."""
    import torch

    sd = model.state_dict()
    pairs = [("output_norm.weight", "model.norm.weight")]
    names = {
        "attn_norm": "input_layernorm",
        "post_attention_norm": "post_attention_layernorm",
        "ffn_norm": "pre_feedforward_layernorm",
        "post_ffw_norm": "post_feedforward_layernorm",
        "attn_q_norm": "self_attn.q_norm",
        "attn_k_norm": "self_attn.k_norm",
    }
    for l in range(18):
        for gn, hn in names.items():
            pairs.append((f"blk.{l}.{gn}.weight", f"model.layers.{l}.{hn}.weight"))
    worst = 0.0
    for gn, hn in pairs:
        w = torch.from_numpy(g[gn])
        worst = max(worst, float(((1.0 + sd[hn].float()) - w).abs().max()))
    out = {
        "n_norm_tensors": len(pairs),
        "max_abs_(1+w_hf)-w_gguf": worst,
        "output_norm_gguf_first4": [float(x) for x in g["output_norm.weight"][:4]],
        "model.norm.weight_hf_first4": [float(x) for x in sd["model.norm.weight"][:4]],
    }
    assert worst == 0.0, out
    # the big matrices are gguf-py's dequantization too: spot-check two
    for gn, hn in (("token_embd.weight", "model.embed_tokens.weight"), ("blk.7.ffn_down.weight", "model.layers.7.mlp.down_proj.weight")):
        assert torch.equal(torch.from_numpy(g[gn]), sd[hn]), gn
    return out


def direct_forward(g: dict, ids: list[int]):
    """llama.cpp's gemma3 graph (src/models/gemma3.cpp) written out in torch from the raw GGUF
    tensors: norms use the stored weights as they are (x_hat * w_gguf). Returns the last logits."""
    import torch

    T = lambda n: torch.from_numpy(g[n])
    d, nh, hd, eps, win = 640, 4, 256, 1e-6, 512
    n = len(ids)

    def rms(x, w):
        return x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + eps) * w

    def rope(x, theta):  # NEOX: pairs (j, j + hd/2); x (heads, n, hd)
        inv = 1.0 / (theta ** (torch.arange(0, hd, 2, dtype=torch.float64) / hd))
        ang = torch.arange(n, dtype=torch.float64)[:, None] * inv[None, :]
        cos, sin = torch.cos(ang).float(), torch.sin(ang).float()
        a, b = x[..., : hd // 2], x[..., hd // 2 :]
        return torch.cat([a * cos - b * sin, a * sin + b * cos], dim=-1)

    emb = T("token_embd.weight")
    x = emb[torch.tensor(ids)] * math.sqrt(d)
    pos = torch.arange(n)
    causal = pos[None, :] <= pos[:, None]
    local = causal & (pos[:, None] - pos[None, :] < win)
    for l in range(18):
        B = lambda s: T(f"blk.{l}.{s}.weight")
        is_global = l % 6 == 5
        h = rms(x, B("attn_norm"))
        q = (h @ B("attn_q").T).view(n, nh, hd).transpose(0, 1)
        k = (h @ B("attn_k").T).view(n, 1, hd).transpose(0, 1)
        v = (h @ B("attn_v").T).view(n, 1, hd).transpose(0, 1)
        q, k = rms(q, B("attn_q_norm")), rms(k, B("attn_k_norm"))
        theta = 1_000_000.0 if is_global else 10_000.0
        q, k = rope(q, theta), rope(k, theta)
        s = (q @ k.transpose(-1, -2)) * (1.0 / math.sqrt(hd))
        s = s.masked_fill(~(causal if is_global else local), -math.inf)
        o = (torch.softmax(s, dim=-1) @ v).transpose(0, 1).reshape(n, nh * hd)
        o = rms(o @ B("attn_output").T, B("post_attention_norm"))
        x = x + o
        h = rms(x, B("ffn_norm"))
        f = torch.nn.functional.gelu(h @ B("ffn_gate").T, approximate="tanh") * (h @ B("ffn_up").T)
        x = x + rms(f @ B("ffn_down").T, B("post_ffw_norm"))
    return rms(x[-1], T("output_norm.weight")) @ emb.T


# --------------------------------------------------------------------------------------------
# Runs


def all_logits(model, ids: list[int], n_last: int):
    """Cache-free forward over ids; logits of the last n_last positions (n_last, vocab)."""
    import torch

    with torch.no_grad():
        out = model(input_ids=torch.tensor([ids]), use_cache=False, logits_to_keep=n_last)
    return out.logits[0].float()


def greedy_cached(model, prompt: list[int], n_gen: int, eos: int):
    """Greedy with the KV cache: prefill, then one token at a time. Returns ids and per-step logits."""
    import torch
    from transformers import DynamicCache

    cache = DynamicCache(config=model.config)
    ids, steps = [], []
    with torch.no_grad():
        out = model(input_ids=torch.tensor([prompt]), past_key_values=cache, use_cache=True, logits_to_keep=1)
        for i in range(n_gen):
            logits = out.logits[0, -1].float().clone()
            steps.append(logits)
            best = int(torch.argmax(logits))
            ids.append(best)
            if best == eos or i == n_gen - 1:
                break
            pos = len(prompt) + i
            out = model(
                input_ids=torch.tensor([[best]]),
                past_key_values=out.past_key_values,
                use_cache=True,
                cache_position=torch.tensor([pos]),
                logits_to_keep=1,
            )
    return ids, steps


def run_case(model, case: dict, eos: int, g: dict | None) -> dict:
    import torch

    prompt = [int(t) for t in case["prompt_ids"]]
    n_gen = int(case["n_gen"])
    ll_ids = [int(t) for t in case["generated_ids"]]
    ll_second = [int(t) for t in case["second_ids"]]
    ll_margin = [float(m) for m in case["margins"]]

    ids, steps = greedy_cached(model, prompt, n_gen, eos)
    gen, second, margins = [], [], []
    for lg in steps:
        b, s, m = top2(lg)
        gen.append(b)
        second.append(s)
        margins.append(r6(m))
    res = {
        "name": case["name"],
        "n_prompt": len(prompt),
        "n_gen": n_gen,
        "generated_ids": gen,
        "second_ids": second,
        "margins": margins,
        "stopped_at_eos": bool(gen) and gen[-1] == eos,
    }
    first_div = next((i for i in range(min(len(gen), len(ll_ids))) if gen[i] != ll_ids[i]), None)
    res["equals_llama"] = gen == ll_ids
    res["first_divergence"] = first_div
    if first_div is not None:
        res["divergence"] = {
            "step": first_div,
            "hf_id": gen[first_div],
            "hf_second": second[first_div],
            "hf_margin": margins[first_div],
            "llama_id": ll_ids[first_div],
            "llama_second": ll_second[first_div],
            "llama_margin": ll_margin[first_div],
            "hf_logit_of_llama_id_minus_hf_best": r6(steps[first_div][ll_ids[first_div]] - steps[first_div][gen[first_div]]),
        }
    res["steps01"] = []
    for i in range(min(2, len(steps))):
        lg = steps[i]
        res["steps01"].append(
            {
                "step": i,
                "history_equals_llama": gen[:i] == ll_ids[:i],
                "top10": topk_pairs(lg),
                "logit_of_llama_id": [ll_ids[i], r6(lg[ll_ids[i]])],
                "logit_of_llama_second": [ll_second[i], r6(lg[ll_second[i]])],
            }
        )
    if case["name"] in HEAD_CASES:
        res["step0_logits_head"] = [r6(v) for v in steps[0][:HEAD_N]]
        res["step0_max_abs_logit"] = r6(steps[0].abs().max())

    # Recompute check: one cache-free forward over prompt + gen[:-1].
    rec = all_logits(model, prompt + gen[:-1], len(gen))
    rec_ids = [int(torch.argmax(rec[i])) for i in range(len(gen))]
    res["recompute_ids_equal"] = rec_ids == gen
    res["recompute_max_abs_logit_diff"] = float(max(float((rec[i] - steps[i]).abs().max()) for i in range(len(gen))))

    # Teacher-forced on llama.cpp's ids.
    tf = all_logits(model, prompt + ll_ids[:-1], len(ll_ids))
    tf_ids, tf_marg = [], []
    for i in range(len(ll_ids)):
        tf_ids.append(int(torch.argmax(tf[i])))
        tf_marg.append(r6(tf[i][ll_ids[i]] - tf[i][ll_second[i]]))
    res["tf_llama"] = {
        "hf_argmax": tf_ids,
        "hf_margin_llama_pair": tf_marg,
        "steps_where_hf_argmax_differs": [i for i in range(len(ll_ids)) if tf_ids[i] != ll_ids[i]],
    }

    if g is not None:
        dl = direct_forward(g, prompt)
        res["direct_check"] = {
            "max_abs_diff_step0": float((dl - steps[0]).abs().max()),
            "argmax": int(torch.argmax(dl)),
        }
    return res


def compare_kvlab(dump_path: Path, hf_path: Path, greedy_path: Path, model_path: Path | None) -> None:
    """Prints kvlab vs HF (and llama.cpp) step-0 agreement and greedy-id agreement."""
    kv = json.loads(dump_path.read_text())
    hf = {c["name"]: c for c in json.loads(hf_path.read_text())["cases"]}
    ll = {c["name"]: c for c in json.loads(greedy_path.read_text())["cases"]}
    model = load_hf(model_path) if model_path else None
    print(f"{'case':16} {'max|kv-hf| top10':>16} {'rel':>9} {'head64':>9} {'full':>9}  ids kv==hf  kv==llama  first kv/hf div")
    for kc in kv["cases"]:
        name = kc["name"]
        h = hf[name]
        hf_top = {i: v for i, v in h["steps01"][0]["top10"]}
        kv_at = {int(i): v for i, v in kc["step0_at_hf_top10"]}
        d = max(abs(kv_at[i] - hf_top[i]) for i in hf_top)
        scale = max(abs(v) for v in hf_top.values())
        head = ""
        if "step0_logits_head" in h and "step0_logits_head" in kc:
            head = f"{max(abs(a - b) for a, b in zip(kc['step0_logits_head'], h['step0_logits_head'])):9.2e}"
        full = ""
        if model is not None and kc.get("step0_raw"):
            import torch

            kvl = torch.from_numpy(np.fromfile(kc["step0_raw"], dtype="<f4"))
            hfl = all_logits(model, [int(t) for t in ll[name]["prompt_ids"]], 1)[0]
            full = f"{float((kvl - hfl).abs().max()):9.2e}"
        kg, hg, lg = kc["generated_ids"], h["generated_ids"], ll[name]["generated_ids"]
        div = next((i for i in range(min(len(kg), len(hg))) if kg[i] != hg[i]), None)
        print(f"{name:16} {d:16.2e} {d / scale:9.2e} {head:>9} {full:>9}  {str(kg == hg):10} {str(kg == lg):10} {div}")


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--model", type=Path)
    ap.add_argument("--greedy", type=Path, default=Path("fixtures/gemma3/greedy.json"))
    ap.add_argument("--out", type=Path, default=Path("fixtures/gemma3/hf_f32.json"))
    ap.add_argument("--cases", nargs="*", help="only these case names (default: all)")
    ap.add_argument("--no-direct-check", action="store_true", help="skip the GGUF-direct graph check")
    ap.add_argument("--compare-kvlab", type=Path, help="a gemma_dump JSON: compare, write nothing")
    args = ap.parse_args()

    import torch

    torch.set_num_threads(N_THREADS)
    torch.manual_seed(0)

    if args.compare_kvlab:
        compare_kvlab(args.compare_kvlab, args.out, args.greedy, args.model)
        return 0
    if args.model is None:
        ap.error("--model is required")

    digest = sha256(args.model)
    if digest != EXPECTED_SHA256:
        print(f"sha256 mismatch: {digest}", file=sys.stderr)
        return 1
    greedy = json.loads(args.greedy.read_text())
    eos = int(greedy["eos_id"])

    import gguf
    import transformers

    model = load_hf(args.model)
    config_facts = check_config(model)
    check_rotary(model)
    g = gguf_tensors(args.model)
    norm_facts = check_norms(model, g)
    if args.no_direct_check:
        g = None

    cases = []
    for case in greedy["cases"]:
        if args.cases and case["name"] not in args.cases:
            continue
        t0 = datetime.datetime.now()
        res = run_case(model, case, eos, g)
        dt = (datetime.datetime.now() - t0).total_seconds()
        print(
            f"{res['name']:16} n_prompt {res['n_prompt']:4}  equals_llama {res['equals_llama']!s:5}  "
            f"first_div {res['first_divergence']}  recompute_ok {res['recompute_ids_equal']} "
            f"({res['recompute_max_abs_logit_diff']:.1e})  direct {res.get('direct_check')}  {dt:.0f}s",
            flush=True,
        )
        assert res["recompute_ids_equal"], res["name"]
        if "direct_check" in res:
            assert res["direct_check"]["max_abs_diff_step0"] < 1e-2, res["direct_check"]
        cases.append(res)

    doc = {
        "format_version": FORMAT_VERSION,
        "what": (
            "Hugging Face transformers Gemma3ForCausalLM in float32, eager attention, sliding window 512 on "
            "layers other than 5/11/17, loaded from the same GGUF (gguf-py dequantization). Greedy decoding "
            "from greedy.json's prompt_ids (not retokenized) by explicit argmax of the last logits (ties to the "
            "lowest id), use_cache=True, checked by a cache-free recompute (recompute_*). margins[i] = "
            "logit(generated_ids[i]) - logit(second_ids[i]). steps01: top-10 (id, logit) at steps 0 and 1 and "
            "HF's logits of llama.cpp's chosen/second id there. tf_llama: HF teacher-forced on llama.cpp's "
            "generated ids: HF's argmax and HF's logit(llama id) - logit(llama second) at each step. "
            "direct_check: an independent torch transcription of llama.cpp's gemma3 graph on the raw GGUF "
            "tensors vs HF, step-0 logits."
        ),
        "provenance": {
            "tool": "scripts/gemma_hf_reference.py",
            "command": "OMP_NUM_THREADS=2 " + " ".join(shlex.quote(a) for a in [sys.executable.replace(str(Path.home()), "~"), *sys.argv]),
            "date_utc": datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ"),
            "model_file": args.model.name,
            "model_sha256": digest,
            "python": platform.python_version(),
            "machine": platform.machine(),
            "transformers": transformers.__version__,
            "torch": torch.__version__,
            "gguf": gguf.__version__ if hasattr(gguf, "__version__") else _dist_version("gguf"),
            "numpy": np.__version__,
            "dtype": "float32",
            "attn_implementation": "eager",
            "kv_cache": "use_cache=True (transformers DynamicCache), verified by cache-free recompute",
            "device": "cpu",
            "torch_threads": torch.get_num_threads(),
            "config": config_facts,
            "norm_check": norm_facts,
            "greedy_fixture": str(args.greedy),
        },
        "eos_id": eos,
        "cases": cases,
    }
    args.out.write_text(json.dumps(doc, indent=1, ensure_ascii=False) + "\n")
    print(f"wrote {args.out} ({args.out.stat().st_size} bytes)")
    return 0


def _dist_version(name: str) -> str:
    from importlib.metadata import version

    return version(name)


if __name__ == "__main__":
    sys.exit(main())

#!/usr/bin/env python3
"""Load test of `kvlab serve` with the official `openai` Python client.

The same idea as `cargo xtask bench --serve` (xtask/src/bench/serve/mod.rs), from a second, independent
client: the method of vLLM's benchmarks/benchmark_serving.py. Every prompt is first run alone
(greedy, not streamed) for its reference text; then, for each request rate, the same prompts are
sent with Poisson arrivals (exponential gaps of mean 1/rate from a seeded RNG; "inf" sends all at
once), streamed, temperature 0, and for each request it measures:

  TTFT  time to first token: send -> first chunk with non-empty text (ms)
  TPOT  time per output token after the first: (e2e - TTFT) / (completion tokens - 1) (ms)
  e2e   send -> end of the stream (ms)

Per rate it prints requests ok / refused (429 or 503: allowed) / lost (any other failure, or a
completed text that differs from the prompt's solo text), output tokens/s (completion tokens over
the time from the first send to the last completion), TTFT/TPOT/e2e p50/p90/p99, and the prefix
cache hit rate and preemptions from /metrics (deltas over the rate's window). A lost request makes
the script exit 1 with the prompt's index. Unlike the xtask mode, the server is not restarted
between rates: the prefix cache is warm from the solo runs (every rate reads ~all prompt blocks
from it), and the order of the prompts comes from Python's RNG, not the xtask's.

Usage (not run in CI: CI's machine has no Python packages):

    python3 -m venv /tmp/oai && /tmp/oai/bin/pip install openai
    cargo run --release -p kvlab-cli -- serve -m stories260K --port 8000 &
    /tmp/oai/bin/python scripts/serve_load_openai.py --base-url http://127.0.0.1:8000/v1 \\
        --requests 16 --max-tokens 32 --rate 4 --rate inf

Options: --model (default: the server's one model from /v1/models), --api-key (for a server
started with --api-key; otherwise any string), --seed, --json FILE (the results as JSON).
"""

import argparse
import asyncio
import json
import random
import sys
import time
import urllib.request

import openai
from openai import AsyncOpenAI, OpenAI

# The prompt set of xtask/src/bench/serve/mod.rs: shared openings x continuations.
OPENINGS = [
    "Once upon a time, in a small town near the sea, there lived a kind old man who had a little "
    "boat. Every morning he went out on the water to catch fish for the children of the town.",
    "One day, a little girl named Lily went to the park with her mom. The sun was shining and the "
    "birds were singing in the tall trees.",
    "Tom was a big brown dog who loved to play in the garden. He liked to dig holes and chase the "
    "red ball that his friend Sam threw for him.",
    "There was a tiny bird who lived in a nest at the top of an old tree. She wanted to fly far "
    "away and see the world.",
]
CONTINUATIONS = [
    " One day,",
    " But then something strange happened.",
    " Suddenly, they heard a loud noise.",
    " The next morning,",
    " They were very happy and",
    " She looked around and saw",
    " He did not know what to do, so",
    " It was the best day ever because",
]


def prompts(n, seed):
    """n prompts: openings x continuations in a seeded order, repeated if n is larger."""
    combos = [o + c for o in OPENINGS for c in CONTINUATIONS]
    random.Random(seed).shuffle(combos)
    return [combos[i % len(combos)] for i in range(n)]


def percentile(xs, p):
    """numpy's default percentile: linear interpolation between order statistics."""
    if not xs:
        return float("nan")
    v = sorted(xs)
    rank = p / 100 * (len(v) - 1)
    lo, hi = int(rank), min(int(rank) + 1, len(v) - 1)
    return v[lo] + (v[hi] - v[lo]) * (rank - lo)


def metrics(base_url):
    """/metrics as {name: value}, summed over label sets ({} if it cannot be read)."""
    root = base_url.rstrip("/").removesuffix("/v1")
    try:
        text = urllib.request.urlopen(root + "/metrics", timeout=10).read().decode()
    except OSError:
        return {}
    out = {}
    for line in text.splitlines():
        if line.startswith("#") or not line.strip():
            continue
        name = line.split("{")[0].split(" ")[0]
        try:
            out[name] = out.get(name, 0.0) + float(line.rsplit(" ", 1)[1])
        except ValueError:
            pass
    return out


def solo(client, model, texts, max_tokens):
    """Each prompt alone, not streamed: (reference text, completion tokens)."""
    refs = []
    for i, t in enumerate(texts):
        r = client.completions.create(
            model=model, prompt=t, max_tokens=max_tokens, temperature=0
        )
        refs.append((r.choices[0].text, r.usage.completion_tokens))
        print(f"  solo {i}: {r.usage.completion_tokens} tokens", file=sys.stderr)
    return refs


async def one(client, model, prompt, max_tokens, at, t0):
    """One streamed request sent `at` seconds after t0: ("ok", ttft_s, e2e_s, text, end_s),
    ("refused", status) or ("lost", why)."""
    await asyncio.sleep(max(0.0, t0 + at - time.perf_counter()))
    sent = time.perf_counter()
    first, parts = None, []
    try:
        stream = await client.completions.create(
            model=model,
            prompt=prompt,
            max_tokens=max_tokens,
            temperature=0,
            stream=True,
        )
        async for chunk in stream:
            text = chunk.choices[0].text if chunk.choices else ""
            if text and first is None:
                first = time.perf_counter()
            parts.append(text)
    except openai.APIStatusError as e:
        if e.status_code in (429, 503):
            return ("refused", e.status_code)
        return ("lost", f"HTTP {e.status_code}: {e.message}")
    except Exception as e:  # noqa: BLE001 - every other failure is a lost request
        return ("lost", f"{type(e).__name__}: {e}")
    end = time.perf_counter()
    ttft = (first - sent) if first is not None else float("nan")
    return ("ok", ttft, end - sent, "".join(parts), end - t0)


async def sweep(base_url, api_key, model, texts, refs, max_tokens, rate, seed):
    """One rate: Poisson arrivals (benchmark_serving.py's np.random.exponential(1 / rate)).
    A client per rate: its connection pool belongs to this rate's event loop."""
    rng = random.Random(f"{seed}-{rate}")
    at, arrivals = 0.0, []
    for i in range(len(texts)):
        if i > 0 and rate != float("inf"):
            at += rng.expovariate(rate)
        arrivals.append(at)
    before = metrics(base_url)
    async with AsyncOpenAI(base_url=base_url, api_key=api_key, max_retries=0,
                           timeout=900) as client:
        t0 = time.perf_counter()
        results = await asyncio.gather(
            *(one(client, model, t, max_tokens, a, t0) for t, a in zip(texts, arrivals))
        )
    after = metrics(base_url)
    ttft, tpot, e2e, lost = [], [], [], []
    refused = tokens = 0
    end = 0.0
    for i, (r, (ref_text, ref_tokens)) in enumerate(zip(results, refs)):
        if r[0] == "refused":
            refused += 1
        elif r[0] == "lost":
            lost.append(f"prompt {i}: {r[1]}")
        elif r[3] != ref_text:
            lost.append(f"prompt {i}: text differs from its solo run\n  solo:   {ref_text!r}\n"
                        f"  loaded: {r[3]!r}")
        else:
            _, t, e, _, end_s = r
            ttft.append(t * 1e3)
            e2e.append(e * 1e3)
            if ref_tokens > 1:
                tpot.append((e - t) * 1e3 / (ref_tokens - 1))
            tokens += ref_tokens
            end = max(end, end_s)
    d = {k: after.get(k, 0.0) - before.get(k, 0.0) for k in after}
    queries = d.get("vllm:prefix_cache_queries_total", 0.0)
    return {
        "rate": "inf" if rate == float("inf") else rate,
        "ok": len(e2e),
        "refused": refused,
        "lost": lost,
        "duration_s": end,
        "output_tokens": tokens,
        "output_tok_per_s": tokens / end if end > 0 else float("nan"),
        **{f"{n}_ms": {f"p{p}": percentile(xs, p) for p in (50, 90, 99)}
           for n, xs in (("ttft", ttft), ("tpot", tpot), ("e2e", e2e))},
        "prefix_cache_hit_rate": d.get("vllm:prefix_cache_hits_total", 0.0) / queries
        if queries else None,
        "preemptions": d.get("vllm:num_preemptions_total"),
    }


def fmt(s):
    return " / ".join(f"{v:.1f}" if v < 10 else f"{v:.0f}" for v in s.values())


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--base-url", default="http://127.0.0.1:8000/v1")
    ap.add_argument("--api-key", default="unused")
    ap.add_argument("--model")
    ap.add_argument("--requests", type=int, default=16)
    ap.add_argument("--max-tokens", type=int, default=32)
    ap.add_argument("--rate", action="append", type=float,
                    help="requests/s, or inf (repeatable; default 4 and inf)")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--json", help="write the results here")
    a = ap.parse_args()
    rates = a.rate or [4.0, float("inf")]
    # max_retries=0: a 429 is counted as refused, not retried behind our back.
    client = OpenAI(base_url=a.base_url, api_key=a.api_key, max_retries=0)
    model = a.model or client.models.list().data[0].id
    texts = prompts(a.requests, a.seed)
    print(f"{model} at {a.base_url}: {a.requests} requests x {a.max_tokens} tokens, "
          f"rates {rates}", file=sys.stderr)
    refs = solo(client, model, texts, a.max_tokens)
    rows = []
    for rate in rates:
        row = asyncio.run(sweep(a.base_url, a.api_key, model, texts, refs, a.max_tokens, rate,
                                a.seed))
        rows.append(row)
        print(f"  rate {row['rate']}: {row['ok']} ok, {len(row['lost'])} lost",
              file=sys.stderr)
    head = ("rate", "ok", "refused", "lost", "out tok/s", "TTFT ms p50/p90/p99",
            "TPOT ms p50/p90/p99", "e2e ms p50/p90/p99", "prefix hit", "preempt")
    table = [head] + [(
        str(r["rate"]), str(r["ok"]), str(r["refused"]), str(len(r["lost"])),
        f"{r['output_tok_per_s']:.0f}", fmt(r["ttft_ms"]), fmt(r["tpot_ms"]), fmt(r["e2e_ms"]),
        "-" if r["prefix_cache_hit_rate"] is None else f"{r['prefix_cache_hit_rate']:.0%}",
        "-" if r["preemptions"] is None else f"{r['preemptions']:.0f}",
    ) for r in rows]
    widths = [max(len(row[i]) for row in table) for i in range(len(head))]
    for j, row in enumerate(table):
        print("  ".join(c.ljust(w) for c, w in zip(row, widths)).rstrip())
        if j == 0:
            print("  ".join("-" * w for w in widths))
    if a.json:
        with open(a.json, "w") as f:
            json.dump({"model": model, "requests": a.requests, "max_tokens": a.max_tokens,
                       "rates": rows}, f, indent=2)
    lost = [(r["rate"], why) for r in rows for why in r["lost"]]
    if lost:
        for rate, why in lost:
            print(f"LOST at rate {rate}: {why}", file=sys.stderr)
        sys.exit(1)


if __name__ == "__main__":
    main()

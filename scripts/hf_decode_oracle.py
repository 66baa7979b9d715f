#!/usr/bin/env python3
"""Adds transformers' decode of each greedy case with special tokens skipped to fixtures/hf/*.json.

`scripts/hf_oracle.py` writes `generated_text_skip_special` itself; this script adds it to
records made before it did, from the ids already recorded, with no model run (it needs
transformers and tokenizers from PyPI, not torch): for each case,
`AutoTokenizer.from_pretrained(folder).decode(generated_ids, skip_special_tokens=True)`, the text
transformers, vLLM (`skip_special_tokens` defaults to true) and llama.cpp (control tokens hidden
unless `--special`) print for those ids. The versions and date go to
`provenance.decode_skip_special`.

Usage: python scripts/hf_decode_oracle.py
"""

import datetime
import glob
import json
import os

import tokenizers
import transformers

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def main():
    for path in sorted(glob.glob(os.path.join(ROOT, "fixtures", "hf", "tiny-*.json"))):
        name = os.path.basename(path)[: -len(".json")]
        with open(path, encoding="utf-8") as f:
            record = json.load(f)
        fast = transformers.AutoTokenizer.from_pretrained(os.path.join(ROOT, "fixtures", "models", name))
        for case in record["cases"]:
            ids = case["generated_ids"]
            assert fast.decode(ids, skip_special_tokens=False) == case["generated_text"], name
            case["generated_text_skip_special"] = fast.decode(ids, skip_special_tokens=True)
        record["provenance"]["decode_skip_special"] = {
            "tool": "scripts/hf_decode_oracle.py",
            "transformers": transformers.__version__,
            "tokenizers": tokenizers.__version__,
            "date_utc": datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ"),
        }
        with open(path, "w", encoding="utf-8") as f:
            json.dump(record, f, ensure_ascii=False, indent=1)
            f.write("\n")
        print(f"{name}: {len(record['cases'])} cases")


if __name__ == "__main__":
    main()

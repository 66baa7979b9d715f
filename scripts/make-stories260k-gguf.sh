#!/usr/bin/env bash
# Writes the shipped stories260K (fixtures/models/stories260K.bin + tok512.bin) as an f32 GGUF of
# architecture `llama` with gguf-py, llama.cpp's own writer (scripts/peers/llama2c_to_gguf.py),
# into target/stories260K.gguf, idempotently, and prints the export that lets
# crates/model/tests/llama_gguf.rs check kvlab's GGUF reader against it:
#
#   eval "$(scripts/make-stories260k-gguf.sh)"
#   KVLAB_REQUIRE_MODELS=1 cargo test -p kvlab-model --test llama_gguf -- --include-ignored
#
# gguf and numpy come from PyPI into a venv (KVLAB_GGUF_VENV, default /tmp/gguf-venv). Progress
# goes to stderr; stdout is only the export.
set -euo pipefail
cd "$(dirname "$0")/.."

venv="${KVLAB_GGUF_VENV:-/tmp/gguf-venv}"
out="$PWD/target/stories260K.gguf"

if [ ! -x "$venv/bin/python" ]; then
    echo "make-stories260k-gguf: creating venv $venv" >&2
    python3 -m venv "$venv" >&2
fi
if ! "$venv/bin/python" -c "import gguf, numpy" 2>/dev/null; then
    echo "make-stories260k-gguf: installing gguf==0.19.0 and numpy" >&2
    "$venv/bin/pip" install --quiet --disable-pip-version-check "gguf==0.19.0" numpy >&2
fi
if [ ! -s "$out" ]; then
    mkdir -p target
    "$venv/bin/python" scripts/peers/llama2c_to_gguf.py \
        fixtures/models/stories260K.bin fixtures/models/tok512.bin "$out.tmp" >&2
    mv "$out.tmp" "$out"
fi
echo "export KVLAB_STORIES260K_GGUF=$out"

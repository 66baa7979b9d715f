#!/usr/bin/env bash
# Builds llama.cpp's own HTTP server, llama-server, from source with CMake, for
# `cargo xtask bench --serve --peer llama-server` (xtask/src/bench/serve/peer.rs):
#
#     scripts/peers/build_llama_server.sh DIR [BRANCH_OR_TAG]
#     export KVLAB_LLAMA_SERVER=DIR/build/bin/llama-server
#
# DIR: where llama.cpp's source is (cloned there from github.com/ggml-org/llama.cpp at
# BRANCH_OR_TAG, e.g. a release tag such as b7000, default master, if DIR holds no
# CMakeLists.txt; any llama.cpp source tree works, e.g. the one
# in llama-cpp-python's sdist under vendor/llama.cpp). Needs git (to clone), cmake and a C++
# compiler; about 10 minutes on 2 cores.
#
# The CPU backend is built for this machine's instruction sets. ggml's GGML_NATIVE=ON build
# crashed at the first evaluation on an AMX host (a Xeon with AMX-INT8, 2026-11-27), so where the
# CPU has AMX the build names the instruction sets itself and leaves AMX out.
set -euo pipefail
dir=$(realpath -m "${1:?usage: scripts/peers/build_llama_server.sh DIR [BRANCH_OR_TAG]}")
ref=${2:-master}
if [ ! -f "$dir/CMakeLists.txt" ]; then
    git clone --depth 1 --branch "$ref" https://github.com/ggml-org/llama.cpp "$dir"
fi
command -v cmake >/dev/null || { echo "cmake is missing: apt-get install cmake (or pip install cmake)" >&2; exit 1; }
flags=$(grep -m1 '^flags' /proc/cpuinfo || true)
has() { [[ " $flags " == *" $1 "* ]]; }
isa=(-DGGML_NATIVE=ON)
if has amx_int8 || has amx_tile; then
    onoff() { if has "$1"; then echo ON; else echo OFF; fi; }
    isa=(-DGGML_NATIVE=OFF -DGGML_AVX="$(onoff avx)" -DGGML_AVX2="$(onoff avx2)"
         -DGGML_FMA="$(onoff fma)" -DGGML_F16C="$(onoff f16c)" -DGGML_AVX512="$(onoff avx512f)"
         -DGGML_AVX512_VBMI="$(onoff avx512vbmi)" -DGGML_AVX512_VNNI="$(onoff avx512_vnni)"
         -DGGML_AVX512_BF16="$(onoff avx512_bf16)" -DGGML_AMX_TILE=OFF -DGGML_AMX_INT8=OFF
         -DGGML_AMX_BF16=OFF)
fi
cmake -S "$dir" -B "$dir/build" -DCMAKE_BUILD_TYPE=Release "${isa[@]}" \
    -DLLAMA_CURL=OFF -DLLAMA_OPENSSL=OFF -DLLAMA_BUILD_TESTS=OFF
cmake --build "$dir/build" --target llama-server -j "$(nproc)"
"$dir/build/bin/llama-server" --version
echo "export KVLAB_LLAMA_SERVER=$dir/build/bin/llama-server"

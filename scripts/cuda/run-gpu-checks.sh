#!/usr/bin/env bash
# The CUDA engine's checks on a GPU machine that has the CUDA 13 driver, NVRTC and cuBLAS but no
# Rust toolchain. Two halves:
#
#   scripts/cuda/run-gpu-checks.sh stage        # here (with cargo): build and collect into
#                                               # target/cuda-gpu/ everything the GPU side needs
#   scripts/cuda/run-gpu-checks.sh tests        # there: every kvlab-cuda test binary, with
#                                               # KVLAB_REQUIRE_CUDA=1 (a skip is a failure)
#   scripts/cuda/run-gpu-checks.sh bench [ARGS] # there: kvlab-cuda-bench ARGS (default: all)
#   scripts/cuda/run-gpu-checks.sh peer [ARGS]  # there: the Hugging Face peer benchmark
#   scripts/cuda/run-gpu-checks.sh generate     # there: `kvlab generate --engine cuda`, if the
#                                               # kvlab binary was staged and knows the engine
#
# Results (logs, JSON) go to $OUT when set (the device tool fetches it), else
# target/cuda-gpu/results. target/ is git-ignored: carry target/cuda-gpu to the GPU machine
# (crates/cuda/README.md shows the device-tool call).
set -euo pipefail
cd "$(dirname "$0")/../.."
stage_dir=target/cuda-gpu

die() { echo "run-gpu-checks: $*" >&2; exit 1; }

stage() {
    command -v cargo >/dev/null || die "stage needs cargo (run it on the build machine)"
    rm -rf "$stage_dir"
    mkdir -p "$stage_dir/bin" "$stage_dir/include"
    echo "== building kvlab-cuda tests and kvlab-cuda-bench (release)" >&2
    cargo build --release -p kvlab-cuda --bin kvlab-cuda-bench >&2
    cargo test --release -p kvlab-cuda --no-run --message-format=json 2>/dev/null \
        | python3 -c '
import json, sys
for line in sys.stdin:
    try:
        m = json.loads(line)
    except ValueError:
        continue
    if m.get("reason") == "compiler-artifact" and m.get("profile", {}).get("test") and m.get("executable"):
        print(m["target"]["name"], m["executable"])
' > "$stage_dir/tests.txt"
    [ -s "$stage_dir/tests.txt" ] || die "cargo test --no-run listed no test binaries"
    while read -r name exe; do
        cp "$exe" "$stage_dir/bin/test-$name"
        strip --strip-debug "$stage_dir/bin/test-$name" 2>/dev/null || true
    done < "$stage_dir/tests.txt"
    cp target/release/kvlab-cuda-bench "$stage_dir/bin/"
    strip --strip-debug "$stage_dir/bin/kvlab-cuda-bench" 2>/dev/null || true
    if [ -x target/release/kvlab ]; then
        cp target/release/kvlab "$stage_dir/bin/"
        strip --strip-debug "$stage_dir/bin/kvlab" 2>/dev/null || true
    else
        echo "note: target/release/kvlab not built; 'generate' will be skipped" \
             "(cargo build --release -p kvlab-cli, then stage again)" >&2
    fi
    # CUDA headers for NVRTC (cuda_fp16.h and what it includes, 4 MB), in case the GPU
    # machine's toolkit has none: from KVLAB_CUDA_INCLUDE, else from the PyPI wheel.
    local inc="${KVLAB_CUDA_INCLUDE:-}"
    if [ -z "$inc" ] || [ ! -f "$inc/cuda_fp16.h" ]; then
        eval "$(scripts/cuda/setup-nvrtc.sh)"
        inc="$KVLAB_CUDA_INCLUDE"
    fi
    cp -r "$inc/." "$stage_dir/include/"
    du -sh "$stage_dir" >&2
    local bytes
    bytes=$(du -sb "$stage_dir" | cut -f1)
    [ "$bytes" -lt $((64 << 20)) ] || echo "warning: $stage_dir is over 64 MiB, the device tool's carry limit" >&2
    echo "staged: $(ls "$stage_dir/bin" | tr '\n' ' ')" >&2
}

# Environment of the GPU-side commands.
gpu_env() {
    [ -d "$stage_dir/bin" ] || die "$stage_dir is missing: run 'stage' on the build machine and carry it"
    results="${OUT:-$stage_dir/results}"
    mkdir -p "$results"
    if [ -z "${KVLAB_CUDA_INCLUDE:-}" ] \
        && [ ! -f "${CUDA_HOME:-/nonexistent}/include/cuda_fp16.h" ] \
        && [ ! -f /usr/local/cuda/include/cuda_fp16.h ]; then
        export KVLAB_CUDA_INCLUDE="$PWD/$stage_dir/include"
    fi
    if [ -z "${KVLAB_MODELS:-}" ]; then
        for d in shared/models ../shared/models; do
            if [ -d "$d" ]; then export KVLAB_MODELS="$PWD/$d"; break; fi
        done
    fi
    # libnvrtc.so.13 and libcublas.so.13: from the loader path, else the toolkit, else a
    # PyTorch install's NVIDIA wheels (site-packages/nvidia/cu13/lib or nvidia/*/lib).
    local lib
    for lib in libnvrtc.so.13 libcublas.so.13; do
        if ! ldconfig -p 2>/dev/null | grep -q "$lib"; then
            local d
            for d in ${CUDA_HOME:+"$CUDA_HOME/lib64"} /usr/local/cuda/lib64 \
                /usr/local/cuda/targets/x86_64-linux/lib \
                $(python3 -c 'import nvidia, glob, os; p = list(nvidia.__path__)[0]; print(" ".join(glob.glob(os.path.join(p, "*", "lib"))))' 2>/dev/null); do
                if [ -f "$d/$lib" ]; then
                    export LD_LIBRARY_PATH="${LD_LIBRARY_PATH:+$LD_LIBRARY_PATH:}$d"
                    break
                fi
            done
        fi
    done
    export KVLAB_REQUIRE_CUDA="${KVLAB_REQUIRE_CUDA:-1}"
    export KVLAB_REQUIRE_NVRTC="${KVLAB_REQUIRE_NVRTC:-1}"
    nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader 2>/dev/null \
        | tee "$results/nvidia-smi.txt" >&2 || echo "nvidia-smi not available" >&2
    echo "KVLAB_CUDA_INCLUDE=${KVLAB_CUDA_INCLUDE:-<toolkit>} KVLAB_MODELS=${KVLAB_MODELS:-<unset>}" \
         "LD_LIBRARY_PATH=${LD_LIBRARY_PATH:-<unset>}" >&2
}

tests() {
    gpu_env
    local failed=()
    for t in "$stage_dir"/bin/test-*; do
        local name
        name=$(basename "$t")
        echo "== $name" >&2
        # Integration tests run from the package folder, as cargo runs them.
        if (cd crates/cuda && "../../$t" --test-threads=1 --nocapture) > "$results/$name.log" 2>&1; then
            echo "   $(grep '^test result' "$results/$name.log" | tail -n 1)" >&2
        else
            failed+=("$name")
            tail -n 40 "$results/$name.log" >&2
        fi
        grep -E "relative error|token-identical|agreement|SKIPPED|preemptions" "$results/$name.log" >&2 || true
    done
    if [ ${#failed[@]} -gt 0 ]; then
        die "failed: ${failed[*]} (logs in $results)"
    fi
    echo "every kvlab-cuda test binary passed (KVLAB_REQUIRE_CUDA=$KVLAB_REQUIRE_CUDA; logs in $results)" >&2
}

bench() {
    gpu_env
    "$stage_dir/bin/kvlab-cuda-bench" "${@:-all}" --out "$results/cuda-bench.json" 2>&1 \
        | tee "$results/cuda-bench.log" >&2
}

peer() {
    gpu_env
    python3 -c 'import torch, transformers' 2>/dev/null \
        || die "python3 with torch and transformers is needed for the peer benchmark"
    python3 scripts/cuda/hf_peer_bench.py "$@" --out "$results/hf-peer.json" 2>&1 \
        | tee "$results/hf-peer.log" >&2
}

generate() {
    gpu_env
    [ -x "$stage_dir/bin/kvlab" ] || die "kvlab was not staged (build kvlab-cli in release first)"
    "$stage_dir/bin/kvlab" generate --engine cuda --model stories260K --temperature 0 \
        --prompt "Once upon a time" 2>&1 | tee "$results/generate-cuda.log" >&2
}

case "${1:-}" in
    stage) stage ;;
    tests) tests ;;
    bench) shift; bench "$@" ;;
    peer) shift; peer "$@" ;;
    generate) generate ;;
    *) sed -n '2,19p' "$0" | sed 's/^# \{0,1\}//' >&2; exit 2 ;;
esac

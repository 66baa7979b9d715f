#!/usr/bin/env bash
# The CUDA engine's checks on a GPU machine that has the CUDA 13 driver, NVRTC and cuBLAS but no
# Rust toolchain. Two halves:
#
#   scripts/cuda/run-gpu-checks.sh stage        # here (with cargo): build and collect into
#                                               # target/cuda-gpu/ everything the GPU side needs
#   scripts/cuda/run-gpu-checks.sh first-run    # there, first: inventory, smoke, nvrtc_compile,
#                                               # gpu_kernels, gpu_engine, verify, bench --quick,
#                                               # each under its own timeout; stops at the first
#                                               # broken stage (KEEP_GOING=1: runs every stage)
#   scripts/cuda/run-gpu-checks.sh sanitize     # there: gpu_kernels under compute-sanitizer
#                                               # memcheck, racecheck and synccheck
#   scripts/cuda/run-gpu-checks.sh exec CMD...  # there: CMD with the staged binaries on PATH and
#                                               # the libraries found, e.g. `exec ncu -k
#                                               # regex:paged_attention_v1 --launch-count 1
#                                               # kvlab-cuda-bench attention --quick`
#   scripts/cuda/run-gpu-checks.sh tests        # there: every kvlab-cuda test binary, with
#                                               # KVLAB_REQUIRE_CUDA=1 (a skip is a failure)
#   scripts/cuda/run-gpu-checks.sh bench [ARGS] # there: kvlab-cuda-bench ARGS (default: all)
#   scripts/cuda/run-gpu-checks.sh peer [ARGS]  # there: the Hugging Face peer benchmark
#   scripts/cuda/run-gpu-checks.sh generate     # there: `kvlab generate --engine cuda`, if the
#                                               # kvlab binary was staged and knows the engine
#
# Results (logs, JSON) go to $OUT when set (the device tool fetches it), else
# target/cuda-gpu/results. first-run and sanitize write one summary log and one .tar.gz of every
# stage's log (the device tool brings back at most 8 files). target/ is git-ignored: carry target/cuda-gpu to the GPU machine
# (crates/cuda/README.md shows the device-tool call).
set -euo pipefail
cd "$(dirname "$0")/../.."
stage_dir=target/cuda-gpu

die() { echo "run-gpu-checks: $*" >&2; exit 1; }

stage() {
    command -v cargo >/dev/null || die "stage needs cargo (run it on the build machine)"
    rm -rf "$stage_dir"
    local work="$stage_dir/unpacked"
    mkdir -p "$work/bin" "$work/include"
    echo "== building kvlab-cuda tests and kvlab-cuda-bench (release)" >&2
    cargo build --release -p kvlab-cuda --bin kvlab-cuda-bench >&2
    # Test binaries that need the GPU (the others run in CI): their build errors are shown.
    cargo test --release -p kvlab-cuda --no-run --message-format=json \
        --test gpu_kernels --test gpu_engine --test no_gpu --test nvrtc_compile \
        | python3 -c '
import json, sys
for line in sys.stdin:
    try:
        m = json.loads(line)
    except ValueError:
        continue
    if m.get("reason") == "compiler-artifact" and m.get("profile", {}).get("test") and m.get("executable"):
        print(m["target"]["name"], m["executable"])
    elif m.get("reason") == "compiler-message":
        print(m["message"].get("rendered", ""), file=sys.stderr, end="")
' > "$stage_dir/tests.txt"
    [ -s "$stage_dir/tests.txt" ] || die "cargo test --no-run listed no test binaries"
    while read -r name exe; do
        cp "$exe" "$work/bin/test-$name"
    done < "$stage_dir/tests.txt"
    cp target/release/kvlab-cuda-bench "$work/bin/"
    # kvlab (generate --engine cuda) and xtask (verify --engine cuda) are optional: built with
    # `cargo build --release -p kvlab-cli -p xtask`; first-run skips what is not staged.
    local b
    for b in kvlab xtask; do
        if [ -x "target/release/$b" ]; then
            cp "target/release/$b" "$work/bin/"
        else
            echo "note: target/release/$b not built; first-run skips what needs it" \
                 "(cargo build --release -p kvlab-cli -p xtask, then stage again)" >&2
        fi
    done
    strip --strip-all "$work"/bin/* 2>/dev/null || true
    # CUDA headers for NVRTC (cuda_fp16.h and what it includes, 4 MB), in case the GPU
    # machine's toolkit has none: from KVLAB_CUDA_INCLUDE, else from the PyPI wheel.
    local inc="${KVLAB_CUDA_INCLUDE:-}"
    if [ -z "$inc" ] || [ ! -f "$inc/cuda_fp16.h" ]; then
        eval "$(scripts/cuda/setup-nvrtc.sh)"
        inc="$KVLAB_CUDA_INCLUDE"
    fi
    cp -r "$inc/." "$work/include/"
    # One gzip'd tar (gzip is on every machine): ~45 MB of binaries and headers pack into
    # ~20 MB, which leaves room for the checkout within the device tool's 64 MiB.
    tar -C "$work" -czf "$stage_dir/payload.tar.gz" bin include
    echo "staged: $(ls "$work/bin" | tr '\n' ' ')" >&2
    rm -rf "$work"
    local bytes
    bytes=$(du -sb "$stage_dir" | cut -f1)
    echo "$stage_dir: $((bytes >> 20)) MiB" >&2
    [ "$bytes" -lt $((40 << 20)) ] \
        || echo "warning: $stage_dir is $((bytes >> 20)) MiB, over the 40 MiB staging budget" \
                "(the device tool carries 64 MiB with the checkout)" >&2
}

# Unpacks the staged payload (once) into $stage_dir/bin and $stage_dir/include.
unpack() {
    [ -f "$stage_dir/payload.tar.gz" ] \
        || die "$stage_dir/payload.tar.gz is missing: run 'stage' on the build machine and carry $stage_dir"
    [ -d "$stage_dir/bin" ] || tar -C "$stage_dir" -xzf "$stage_dir/payload.tar.gz"
}

# Environment of the GPU-side commands.
gpu_env() {
    unpack
    results="${OUT:-$stage_dir/results}"
    mkdir -p "$results"
    # The staged headers (CUDA 13.0's, with cuda_bf16.h, which NVRTC 13 no longer has built
    # in) unless told otherwise: /usr/local/cuda/include may be another CUDA version.
    if [ -z "${KVLAB_CUDA_INCLUDE:-}" ]; then
        export KVLAB_CUDA_INCLUDE="$PWD/$stage_dir/include"
    fi
    if [ -z "${KVLAB_MODELS:-}" ]; then
        for d in shared/models ../shared/models; do
            if [ -d "$d" ]; then export KVLAB_MODELS="$PWD/$d"; break; fi
        done
    fi
    # libnvrtc.so.13 (with libnvrtc-builtins.so.13.*, which NVRTC opens by name) and
    # libcublas.so.13: the folder holding each goes first on LD_LIBRARY_PATH, because cudarc
    # opens the first of libX.so, libX.so.13, libX.so.12, ... that loads and would take an
    # older toolkit's silently. Searched: CUDA_HOME, the toolkit, a PyTorch install's wheels.
    local lib d
    for lib in libnvrtc.so.13 libcublas.so.13; do
        for d in ${CUDA_HOME:+"$CUDA_HOME/lib64"} /usr/local/cuda/lib64 \
            /usr/local/cuda/targets/x86_64-linux/lib \
            $(python3 -c 'import nvidia, glob, os; p = list(nvidia.__path__)[0]; print(" ".join(glob.glob(os.path.join(p, "*", "lib"))))' 2>/dev/null) \
            $(ldconfig -p 2>/dev/null | awk -v l="$lib" '$1 == l { sub("/[^/]*$", "", $NF); print $NF }'); do
            if [ -f "$d/$lib" ]; then
                case ":${LD_LIBRARY_PATH:-}:" in *":$d:"*) ;; *)
                    export LD_LIBRARY_PATH="$d${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}" ;;
                esac
                break
            fi
        done
    done
    export KVLAB_REQUIRE_CUDA="${KVLAB_REQUIRE_CUDA:-1}"
    export KVLAB_REQUIRE_NVRTC="${KVLAB_REQUIRE_NVRTC:-1}"
    nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader >&2 2>/dev/null \
        || echo "nvidia-smi not available" >&2
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

# One stage of first-run: NAME TIMEOUT_S COMMAND...; the log goes to $logs/NAME.log and a line
# to the summary. Returns the command's status (124 when it timed out).
stage_run() {
    local name=$1 limit=$2
    shift 2
    local t0=$SECONDS rc=0
    echo "== $name (limit ${limit}s): $*" >&2
    timeout --kill-after=10 "$limit" "$@" > "$logs/$name.log" 2>&1 || rc=$?
    local verdict=ok
    [ "$rc" -eq 0 ] || verdict="FAILED (exit $rc$([ "$rc" -eq 124 ] && echo ', timed out'))"
    echo "   $name: $verdict in $((SECONDS - t0)) s" >&2
    grep -E "^test result|relative error [0-9.e+-]+ >=|token-identical|panicked|FAILED|SKIPPED|error:|warning: kernels|mapped:|NVRTC [0-9]|argmax kernel|opened GPU|compiled and loaded" \
        "$logs/$name.log" | head -n 40 | sed 's/^/   | /' >&2 || true
    [ "$rc" -eq 0 ] || tail -n 30 "$logs/$name.log" | sed 's/^/   ! /' >&2
    return "$rc"
}

# The environment, for the log: driver, toolkit, libraries, headers, glibc.
inventory() ( # a subshell without -e: a missing tool is a line of the log, not the end
    set +eu
    echo "date: $(date -u +%FT%TZ)"; uname -a
    ldd --version 2>&1 | head -n 1
    nvidia-smi 2>&1 | head -n 20 || echo "nvidia-smi: not found"
    command -v nvcc >/dev/null && nvcc --version | tail -n 2
    ls -d /usr/local/cuda* 2>&1
    grep -h "define CUDA_VERSION" /usr/local/cuda/include/cuda.h 2>&1
    echo "-- loader cache (cuda, nvrtc, cublas):"
    ldconfig -p 2>/dev/null | grep -E "libcuda\.so|libnvrtc|libcublas" || echo "(none)"
    echo "-- NVIDIA wheels:"
    python3 -c 'import nvidia, glob, os; p = list(nvidia.__path__)[0]; [print(f) for f in sorted(glob.glob(os.path.join(p, "*", "lib", "lib*rtc*")) + glob.glob(os.path.join(p, "*", "lib", "libcublas.so*")))]' 2>&1
    echo "-- headers: KVLAB_CUDA_INCLUDE=$KVLAB_CUDA_INCLUDE"
    ls "$KVLAB_CUDA_INCLUDE"/cuda_fp16.h "$KVLAB_CUDA_INCLUDE"/cuda_bf16.h "$KVLAB_CUDA_INCLUDE"/cuda_fp8.h 2>&1
    echo "-- LD_LIBRARY_PATH=${LD_LIBRARY_PATH:-<unset>} KVLAB_MODELS=${KVLAB_MODELS:-<unset>}"
    echo "-- staged: $(du -sh "$stage_dir" | cut -f1)"; ls -la "$stage_dir/bin"
)

# Packs every stage log into $results/logs.tar.gz (the summary stays beside it).
pack_logs() {
    tar -C "$logs" -czf "$results/logs.tar.gz" . 2>/dev/null || true
}

first_run() {
    # Without a GPU this stops in seconds, before any stage, saying why.
    command -v nvidia-smi >/dev/null && nvidia-smi -L >/dev/null 2>&1 \
        || die "first-run needs an NVIDIA GPU: nvidia-smi is missing or lists no GPU. Run it on the GPU machine (crates/cuda/README.md)"
    gpu_env
    logs=$(mktemp -d)
    trap pack_logs EXIT
    inventory > "$logs/inventory.log" 2>&1
    sed 's/^/   | /' "$logs/inventory.log" >&2
    local bin=$PWD/$stage_dir/bin failed=()
    # The whole run fits one device call: each stage gets its own limit or what is left of
    # FIRST_RUN_BUDGET_S (default 540 s), whichever is less.
    local deadline=$((SECONDS + ${FIRST_RUN_BUDGET_S:-540}))
    step() {
        local name=$1 limit=$2 left=$((deadline - SECONDS))
        shift 2
        if [ "$left" -lt 15 ]; then
            echo "== $name: NOT RUN (the ${FIRST_RUN_BUDGET_S:-540} s budget is spent)" >&2
            failed+=("$name(not run)")
            return 0
        fi
        [ "$limit" -le "$left" ] || limit=$left
        if stage_run "$name" "$limit" "$@"; then return 0; fi
        failed+=("$name")
        [ "${KEEP_GOING:-0}" = 1 ] || die "stopped at stage $name (logs in $results/logs.tar.gz)"
    }
    local tests="cd crates/cuda && KVLAB_MODELS=${KVLAB_MODELS:-} "
    step smoke 90 "$bin/kvlab-cuda-bench" smoke --out "$logs/smoke.json"
    step nvrtc_compile 60 bash -c "$tests '$bin/test-nvrtc_compile' --nocapture"
    step gpu_kernels 150 env CUDA_LAUNCH_BLOCKING=1 bash -c "$tests '$bin/test-gpu_kernels' gpu_ --test-threads=4 --nocapture"
    step gpu_engine 150 bash -c "$tests '$bin/test-gpu_engine' --test-threads=4 --nocapture"
    if [ -x "$bin/xtask" ]; then
        # Every verify model but those whose files are not here (Gemma 3 270M lives outside the
        # checkout): f32, token-identical to the naive engine.
        local m models=()
        for m in ${VERIFY_MODELS:-stories260K synth-mha synth-gqa synth-mqa synth-long tiny-llama tiny-mistral tiny-qwen3 tiny-gemma3 tiny-llama3 tiny-qwen2 tiny-llama-gguf}; do
            models+=(--model "$m")
        done
        step verify 150 "$bin/xtask" verify --engine cuda "${models[@]}" \
            --prompts fixtures/prompts.txt --out "$logs/verify.json"
    fi
    if [ -x "$bin/kvlab" ]; then
        step generate 30 "$bin/kvlab" generate --engine cuda -m stories260K --temp 0 -n 64 -p "Once upon a time"
    fi
    # A small synthetic shape: building Llama-3-8B's 8 B random weights on the host is a
    # measurement run's cost, not a first run's.
    step bench 90 "$bin/kvlab-cuda-bench" all --quick --model "${BENCH_MODEL:-stories42M-shape}" --out "$logs/cuda-bench.json"
    [ ${#failed[@]} -eq 0 ] || die "failed stages: ${failed[*]} (logs in $results/logs.tar.gz)"
    echo "first-run: every stage passed on $(nvidia-smi --query-gpu=name --format=csv,noheader | head -n 1)" >&2
}

# gpu_kernels under compute-sanitizer's memcheck, racecheck and synccheck.
sanitize() {
    command -v compute-sanitizer >/dev/null || die "compute-sanitizer is not on PATH (it ships with the CUDA toolkit)"
    gpu_env
    logs=$(mktemp -d)
    trap pack_logs EXIT
    local bin=$PWD/$stage_dir/bin failed=() tool
    for tool in ${SANITIZE_TOOLS:-memcheck racecheck synccheck}; do
        # racecheck skips the cuBLAS test: it reports hazards inside NVIDIA's split-K GEMM
        # (nvjet_* on Hopper) that are not ours to fix, and excluding those kernels by name
        # (--kernel-name-exclude) made them fault. Every kvlab kernel runs in the other tests.
        local filter=${SANITIZE_FILTER:-}
        [ "$tool" != racecheck ] || filter="${filter:-} --skip gpu_linear_cublas"
        stage_run "sanitize-$tool" "${SANITIZE_LIMIT:-150}" bash -c "cd crates/cuda && compute-sanitizer --tool $tool --error-exitcode 9 --print-limit 20 '$bin/test-gpu_kernels' gpu_ --test-threads=1 $filter" \
            || failed+=("$tool")
    done
    [ ${#failed[@]} -eq 0 ] || die "compute-sanitizer found errors or failed: ${failed[*]}"
    echo "sanitize: memcheck, racecheck and synccheck clean on gpu_kernels" >&2
}

case "${1:-}" in
    # The summary is also written to $OUT (or the results folder) as <mode>.log.
    exec) shift; gpu_env; PATH="$PWD/$stage_dir/bin:$PATH" "$@" ;;
    first-run|sanitize)
        results="${OUT:-$stage_dir/results}"
        mkdir -p "$results"
        "${1//-/_}" 2>&1 | tee "$results/$1.log" ;;
    stage) stage ;;
    tests) tests ;;
    bench) shift; bench "$@" ;;
    peer) shift; peer "$@" ;;
    generate) generate ;;
    *) awk 'NR > 1 && !/^#/ { exit } NR > 1' "$0" | sed 's/^# \{0,1\}//' >&2; exit 2 ;;
esac

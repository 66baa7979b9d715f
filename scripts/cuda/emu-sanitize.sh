#!/usr/bin/env bash
# The CUDA kernels' emulated tests (crates/cuda/tests/gpu_kernels.rs, `emu_…`) under
# AddressSanitizer and UndefinedBehaviorSanitizer, fibers first to last and last to first, and
# proof that the checks can fail: a planted out-of-bounds write must end in ASan's
# heap-buffer-overflow report (crates/cuda/emu/planted/planted.cu). No GPU needed; CI runs it.
#
#   scripts/cuda/emu-sanitize.sh
#
# Builds into target/emu-sanitize (its own target dir: the sanitized emulator must not replace the
# plain one). The test binaries run with the ASan runtime preloaded (cargo's runner), since Rust's
# own code is not instrumented and the runtime must come first in the library list.
set -euo pipefail
cd "$(dirname "$0")/../.."
export CARGO_TARGET_DIR="${CARGO_TARGET_DIR_EMU_SANITIZE:-target/emu-sanitize}"
export KVLAB_EMU_SANITIZE=address,undefined
asan=$(gcc -print-file-name=libasan.so)
[ -f "$asan" ] || { echo "emu-sanitize: gcc's libasan.so not found (apt install gcc)" >&2; exit 1; }
# Rust's allocations are the heap ASan guards (the host buffers kernels write); leaks are not the
# question here. The emulator tells ASan of every fiber switch (its fiber interface).
export ASAN_OPTIONS=detect_leaks=0:abort_on_error=0:halt_on_error=1
export UBSAN_OPTIONS=print_stacktrace=1:halt_on_error=1
export CARGO_TARGET_X86_64_UNKNOWN_LINUX_GNU_RUNNER="env LD_PRELOAD=$asan"
tests=(cargo test -p kvlab-cuda --locked --test gpu_kernels --test emu_planted)

echo "== emulated kernel tests under ASan + UBSan, fibers first to last" >&2
"${tests[@]}" -- emu_
echo "== the same, fibers last to first" >&2
KVLAB_EMU_REVERSE=1 "${tests[@]}" -- emu_

echo "== a planted out-of-bounds write must be caught" >&2
log=$(mktemp)
if KVLAB_EMU_PLANTED_OOB=1 "${tests[@]}" -- emu_planted_out_of_bounds > "$log" 2>&1; then
    cat "$log" >&2
    echo "emu-sanitize: the planted out-of-bounds write was NOT caught" >&2
    exit 1
fi
if ! grep -q "heap-buffer-overflow" "$log"; then
    cat "$log" >&2
    echo "emu-sanitize: the planted test failed, but not with ASan's heap-buffer-overflow" >&2
    exit 1
fi
grep -m1 "ERROR: AddressSanitizer" "$log" >&2
grep -m1 "planted_out_of_bounds_v1" "$log" >&2 || true
echo "emu-sanitize: clean under ASan and UBSan both ways; the planted bug was caught" >&2

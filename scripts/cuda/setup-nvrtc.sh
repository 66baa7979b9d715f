#!/usr/bin/env bash
# Installs NVRTC and the CUDA headers of CUDA 13.0 from PyPI (the wheels nvidia-cuda-nvrtc and
# nvidia-cuda-runtime; no GPU, driver, toolkit or nvcc needed) into a venv, idempotently, and
# prints the two exports that let kvlab-cuda's `nvrtc_compiles_every_kernel` test find them:
#
#   eval "$(scripts/cuda/setup-nvrtc.sh)"
#   KVLAB_REQUIRE_NVRTC=1 cargo test -p kvlab-cuda --test nvrtc_compile
#
# The wheels put libnvrtc.so.13 (+ libnvrtc-builtins.so.13.0) under
# site-packages/nvidia/cu13/lib and cuda_fp16.h under site-packages/nvidia/cu13/include.
# Environment: KVLAB_NVRTC_VENV (default /tmp/nvrtc-venv), KVLAB_NVRTC_VERSION (default 13.0.*,
# the CUDA version of the GPU machine). Progress goes to stderr; stdout is only the exports.
set -euo pipefail

venv="${KVLAB_NVRTC_VENV:-/tmp/nvrtc-venv}"
version="${KVLAB_NVRTC_VERSION:-13.0.*}"

cu13_root() {
    "$venv/bin/python" - <<'PY' 2>/dev/null
import os, nvidia
print(os.path.join(list(nvidia.__path__)[0], "cu13"))
PY
}

ready() {
    local root
    root="$(cu13_root)" || return 1
    [ -f "$root/lib/libnvrtc.so.13" ] && [ -f "$root/include/cuda_fp16.h" ]
}

if [ ! -x "$venv/bin/python" ]; then
    echo "setup-nvrtc: creating venv $venv" >&2
    python3 -m venv "$venv" >&2
fi
if ! ready; then
    echo "setup-nvrtc: installing nvidia-cuda-nvrtc==$version nvidia-cuda-runtime==$version" >&2
    "$venv/bin/pip" install --quiet --disable-pip-version-check \
        "nvidia-cuda-nvrtc==$version" "nvidia-cuda-runtime==$version" >&2
fi
if ! ready; then
    echo "setup-nvrtc: the wheels installed but libnvrtc.so.13 or cuda_fp16.h is not under" \
         "$(cu13_root || echo '<nvidia/cu13>'); check the wheel layout" >&2
    exit 1
fi
root="$(cu13_root)"
echo "setup-nvrtc: NVRTC in $root/lib, headers in $root/include" >&2
echo "export LD_LIBRARY_PATH=\"$root/lib\${LD_LIBRARY_PATH:+:\$LD_LIBRARY_PATH}\""
echo "export KVLAB_CUDA_INCLUDE=\"$root/include\""

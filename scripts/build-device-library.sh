#!/usr/bin/env bash
# Build the kernels here (CPU machine, no GPU) for the device machine, so
# that a device call loads them instead of spending ~150 s on a build:
# against the device's torch (2.11.0+cu130, from the package mirror, in a
# venv of its own), sm_90, into .devlib/kernels-<stamp>.so.gz.partNN -- what
# gpu-check.sh takes as LIBRARY_GZ=.devlib/kernels-<stamp>.so.gz (carry
# ".devlib"). The library has no Python symbols, so Python 3.11 here and
# 3.12 there do not matter; it needs glibc <= this machine's.
#
#   bash scripts/build-device-library.sh     (~10 min for all units on 2
#                                             cores; a rebuild after an edit
#                                             redoes the units it touches)
#
# Environment: DEVICE_TORCH (default 2.11.0), VENV (default
# /tmp/venv-device-torch), BUILD_DIR (default /tmp/pyg_dfgnn-device-build),
# CUDA_HOME (default /usr/local/cuda), MAX_JOBS (default 2).
set -euo pipefail

ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
DEVICE_TORCH=${DEVICE_TORCH:-2.11.0}
VENV=${VENV:-/tmp/venv-device-torch}
BUILD_DIR=${BUILD_DIR:-/tmp/pyg_dfgnn-device-build}
export CUDA_HOME=${CUDA_HOME:-/usr/local/cuda}
export TORCH_CUDA_ARCH_LIST=9.0
export MAX_JOBS=${MAX_JOBS:-2}

if ! "$VENV/bin/python" -c "import torch, sys; sys.exit(0 if \
torch.__version__.startswith('$DEVICE_TORCH') and torch.version.cuda else 1)" \
    2>/dev/null; then
  echo "creating $VENV (torch==$DEVICE_TORCH, CUDA build, ~5 GB)" >&2
  rm -rf "$VENV"
  python3 -m venv "$VENV"
  "$VENV/bin/pip" install -qq --no-cache-dir "torch==$DEVICE_TORCH" ninja
fi
# the math libraries' headers (cusparse.h, ...) from torch's nvidia wheels
include=$(ls -d "$VENV"/lib/python3*/site-packages/nvidia/cu13/include | head -n 1)
export CPLUS_INCLUDE_PATH="$include${CPLUS_INCLUDE_PATH:+:$CPLUS_INCLUDE_PATH}"
export PATH="$VENV/bin:$PATH" PYG_DFGNN_CACHE="$BUILD_DIR"
mkdir -p "$BUILD_DIR"

# the loader by path: the package's other imports need not be in this venv
"$VENV/bin/python" - "$ROOT/pyg_dfgnn/ops/_loader.py" <<'PY'
import importlib.util
import sys
spec = importlib.util.spec_from_file_location('loader', sys.argv[1])
loader = importlib.util.module_from_spec(spec)
spec.loader.exec_module(loader)
loader.build(verbose=True)
PY

cd "$ROOT"
stamp=$(export LC_ALL=C; cat kernels/*.cu kernels/*.cuh kernels/*.cpp kernels/*.h \
  | sha1sum | cut -c1-12)
mkdir -p .devlib  # (carry holds 64 MiB: one library as parts, ~40 MB)
gzip -c "$BUILD_DIR/pyg_dfgnn_kernels.so" \
  | split -b 15M -d - ".devlib/kernels-$stamp.so.gz.part"
ls -l .devlib
echo "LIBRARY_GZ=.devlib/kernels-$stamp.so.gz (carry [\".devlib\"])"

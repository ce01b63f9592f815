#!/usr/bin/env bash
# Build the kernels here (CPU machine, no GPU) for the device machine, so
# that a device call loads them instead of spending ~150 s on a build:
# scripts/ci-compile-kernels.sh against the device's torch (2.11.0+cu130,
# from the package mirror, in a venv of its own), sm_90, in a kept build
# folder; then packed as .devlib/kernels-<stamp>.so.gz.partNN -- what
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
# CUDA_HOME, MAX_JOBS (ci-compile-kernels.sh's defaults).
set -euo pipefail

ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
BUILD_DIR=${BUILD_DIR:-/tmp/pyg_dfgnn-device-build}
CUDA_TORCH_VERSION=${DEVICE_TORCH:-2.11.0} \
  CUDA_VENV=${VENV:-/tmp/venv-device-torch} BUILD_DIR="$BUILD_DIR" \
  TORCH_CUDA_ARCH_LIST=9.0 bash "$ROOT/scripts/ci-compile-kernels.sh"

cd "$ROOT"
stamp=$(export LC_ALL=C; cat kernels/*.cu kernels/*.cuh kernels/*.cpp kernels/*.h \
  | sha1sum | cut -c1-12)
mkdir -p .devlib  # (carry holds 64 MiB: one library as parts, ~40 MB)
gzip -c "$BUILD_DIR/pyg_dfgnn_kernels.so" \
  | split -b 15M -d - ".devlib/kernels-$stamp.so.gz.part"
ls -l .devlib
echo "LIBRARY_GZ=.devlib/kernels-$stamp.so.gz (carry [\".devlib\"])"

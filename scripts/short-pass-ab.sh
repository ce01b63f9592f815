#!/usr/bin/env bash
# Builds scripts/short_pass_harness.cu against one kernel tree: a git
# revision's kernels/ (or "." for the working tree) into OUT.so, for sm_90,
# here (CPU: nvcc and torch's headers suffice) or on the device. Then, on
# the device, scripts/short_pass_ab.py times the trees' passes side by side.
#
#   bash scripts/short-pass-ab.sh main .devlib/main.so
#   bash scripts/short-pass-ab.sh . .devlib/new.so
#   (device) python scripts/short_pass_ab.py .devlib/main.so:0 \
#       .devlib/new.so:0 .devlib/new.so:-1
#
# PYTHON: the interpreter whose torch gives the headers (default python3;
# here the CUDA build's, whose pip CUDA packages hold cusparse.h).
set -eu
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
REV=$1
OUT=$(realpath -m "$2")
cd "$ROOT"
if [ "$REV" = . ]; then
  TREE="$ROOT/kernels"
else
  TMP=$(mktemp -d)
  trap 'rm -rf "$TMP"' EXIT
  git archive "$REV" kernels | tar -x -C "$TMP"
  TREE="$TMP/kernels"
fi
# (kernel trees from session 45 on take the WALK parameter)
WALK=
if grep -q "bool WALK" "$TREE/fwd_rows_kernel.cuh"; then WALK=-DWALK_PARAM; fi
export CUDA_HOME=${CUDA_HOME:-/usr/local/cuda}
# torch's headers, and the CUDA libraries' of a pip CUDA build (cusparse.h)
INCLUDES=$(${PYTHON:-python3} -c "
import glob, os, torch, torch.utils.cpp_extension as c
site = os.path.dirname(os.path.dirname(torch.__file__))
paths = c.include_paths() + glob.glob(os.path.join(site, 'nvidia/*/include'))
print(' '.join('-isystem ' + p for p in paths))")
"$CUDA_HOME/bin/nvcc" -shared -Xcompiler -fPIC -O3 -std=c++17 -lineinfo \
  -gencode=arch=compute_90,code=sm_90 --expt-relaxed-constexpr \
  -D__CUDA_NO_HALF_OPERATORS__ -D__CUDA_NO_HALF_CONVERSIONS__ \
  -D__CUDA_NO_BFLOAT16_CONVERSIONS__ -D__CUDA_NO_HALF2_OPERATORS__ \
  $INCLUDES -isystem "$CUDA_HOME/include" -I"$TREE" $WALK \
  scripts/short_pass_harness.cu -o "$OUT"
echo "$OUT: kernels of $REV${WALK:+ (WALK)}"

#!/usr/bin/env bash
# SASS of every kernel translation unit, one text file per kernel, for
# checking that a refactor of kernels/ changed no generated code (a file
# split, a helper moved, names of host functions): compile a tree before and
# after, then diff the two folders. No GPU needed.
#
#   scripts/sass-fingerprint.sh OUT_DIR [KERNELS_DIR]
#
# Device code only (nvcc -cubin, sm_90, the extension's flags without
# -lineinfo); cuobjdump -sass per cubin, split per function (sorted, so the
# order in which templates are instantiated does not matter); the
# instruction text, without addresses or encodings. Uses .venv-cuda's torch
# headers (scripts/ci-compile-kernels.sh creates it). MAX_JOBS in parallel.
set -euo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
OUT="$(mkdir -p "$1" && cd "$1" && pwd)"
KDIR="$(cd "${2:-$ROOT/kernels}" && pwd)"
CUDA_HOME="${CUDA_HOME:-/usr/local/cuda}"
TI="$ROOT/.venv-cuda/lib/python3.11/site-packages/torch/include"
SITE="$ROOT/.venv-cuda/lib/python3.11/site-packages"
# Math-library headers from torch's nvidia wheels when CUDA_HOME lacks them
# (as scripts/ci-compile-kernels.sh); cuobjdump from triton's when CUDA_HOME
# has none.
if [[ ! -f "$CUDA_HOME/include/cusparse.h" ]]; then
    export CPLUS_INCLUDE_PATH="$SITE/nvidia/cu13/include${CPLUS_INCLUDE_PATH:+:$CPLUS_INCLUDE_PATH}"
fi
CUOBJDUMP="$CUDA_HOME/bin/cuobjdump"
[[ -x "$CUOBJDUMP" ]] || CUOBJDUMP="$SITE/triton/backends/nvidia/bin/cuobjdump"
PYINC="$(python3 -c 'import sysconfig; print(sysconfig.get_paths()["include"])')"
FLAGS=(-DTORCH_EXTENSION_NAME=pyg_dfgnn_kernels -DTORCH_API_INCLUDE_EXTENSION_H
       -isystem "$TI" -isystem "$TI/torch/csrc/api/include"
       -isystem "$CUDA_HOME/include" -isystem "$PYINC"
       -D__CUDA_NO_HALF_OPERATORS__ -D__CUDA_NO_HALF_CONVERSIONS__
       -D__CUDA_NO_BFLOAT16_CONVERSIONS__ -D__CUDA_NO_HALF2_OPERATORS__
       --expt-relaxed-constexpr -gencode=arch=compute_90,code=sm_90 -O3
       -std=c++20)
one() {
    local src="$1" name; name="$(basename "$src" .cu)"
    "$CUDA_HOME/bin/nvcc" "${FLAGS[@]}" -cubin "$src" -o "$OUT/$name.cubin"
    "$CUOBJDUMP" -sass "$OUT/$name.cubin" | python3 -c '
import re, sys, pathlib
out = pathlib.Path(sys.argv[1]); funcs = {}; cur = None
for line in sys.stdin:
    m = re.match(r"\s*Function : (\S+)", line)
    if m:
        cur = m.group(1); funcs[cur] = []
    elif cur is not None:
        m = re.match(r"\s*/\*[0-9a-f]{4,}\*/\s*(.*?)\s*;", line)
        if m:
            funcs[cur].append(m.group(1))
for f, body in sorted(funcs.items()):
    (out / (f[:200] + ".sass")).write_text("\n".join(body) + "\n")
print(f"{sys.argv[1]}: {len(funcs)} functions")
' "$OUT/$name" 2>&1
}
jobs=()
for src in "$KDIR"/*.cu; do
    mkdir -p "$OUT/$(basename "$src" .cu)"
    one "$src" &
    jobs+=($!)
    while (( $(jobs -rp | wc -l) >= ${MAX_JOBS:-2} )); do wait -n; done
done
wait

#!/usr/bin/env bash
# Compile the CUDA kernels (kernels/*.cpp, kernels/*.cu) on a machine without
# a GPU, to catch build errors before any GPU time is spent.
#
# Uses (creating it on first run: ~1-3 min from the local wheel mirror) the venv
# .venv-cuda with a CUDA build of torch, then JIT-builds the kernels the way
# pyg_dfgnn does at run time (pyg_dfgnn.ops._loader.build) into a throw-away
# cache. Exits non-zero when the build fails. ~8 min for the 11 sources on 2
# cores (sm_90 only; each translation unit pays ~1 min for the torch headers).
#
# Environment: CUDA_HOME (default /usr/local/cuda), TORCH_CUDA_ARCH_LIST
# (default 9.0), MAX_JOBS (default 2), PYTHON (interpreter for a new venv,
# default python3), KEEP_BUILD=1 keeps the build folder for inspection;
# CUDA_TORCH_VERSION, CUDA_VENV and BUILD_DIR (a kept folder: rebuilds only
# what changed) build for another torch (scripts/build-device-library.sh:
# the device's).
set -euo pipefail

ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
VENV="${CUDA_VENV:-$ROOT/.venv-cuda}"
TORCH_CUDA_VERSION=${CUDA_TORCH_VERSION:-2.14.1}
NINJA_VERSION=1.13.2

export CUDA_HOME="${CUDA_HOME:-/usr/local/cuda}"
export TORCH_CUDA_ARCH_LIST="${TORCH_CUDA_ARCH_LIST:-9.0}"
export MAX_JOBS="${MAX_JOBS:-2}"

log() { echo "[ci-compile-kernels] $*" >&2; }
start=$SECONDS

if [[ ! -x "$CUDA_HOME/bin/nvcc" ]]; then
    log "FAIL: no nvcc at $CUDA_HOME/bin/nvcc (set CUDA_HOME)"
    exit 2
fi

venv_ok() {
    [[ -x "$VENV/bin/python" && -x "$VENV/bin/ninja" ]] || return 1
    "$VENV/bin/python" -c "
import sys, torch
ok = torch.__version__.split('+')[0] == '$TORCH_CUDA_VERSION' and torch.version.cuda
sys.exit(0 if ok else 1)" 2>/dev/null
}

if venv_ok; then
    log "reusing $VENV"
else
    log "creating $VENV (torch==$TORCH_CUDA_VERSION CUDA build, ninja)"
    rm -rf "$VENV"
    "${PYTHON:-python3}" -m venv "$VENV"
    # No pip cache: the CUDA wheels are ~3 GB and the venv ~5.4 GB, and a
    # cached copy doubles that on a small disk.
    "$VENV/bin/pip" install -qq --no-cache-dir "torch==$TORCH_CUDA_VERSION" \
        "ninja==$NINJA_VERSION" || true  # judged by venv_ok below
    if ! venv_ok; then
        log "FAIL: could not set up $VENV with a CUDA torch $TORCH_CUDA_VERSION"
        log "free space where it goes (it needs ~6 GB, more while pip unpacks):"
        df -h "$ROOT" "${TMPDIR:-/tmp}" >&2 || true
        rm -rf "$VENV"
        exit 2
    fi
    log "venv ready after $((SECONDS - start)) s"
fi
"$VENV/bin/python" -c "import torch; print('[ci-compile-kernels] torch',
      torch.__version__, 'CUDA', torch.version.cuda)" 2>/dev/null

shopt -s nullglob
sources=("$ROOT"/kernels/*.cpp "$ROOT"/kernels/*.cu)
if (( ${#sources[@]} == 0 )); then
    log "FAIL: no kernel sources in $ROOT/kernels"
    exit 1
fi
log "compiling ${#sources[@]} sources for TORCH_CUDA_ARCH_LIST=$TORCH_CUDA_ARCH_LIST" \
    "with MAX_JOBS=$MAX_JOBS"

export PYG_DFGNN_CACHE
if [[ -n "${BUILD_DIR:-}" ]]; then
    PYG_DFGNN_CACHE="$BUILD_DIR"
    mkdir -p "$BUILD_DIR"
else
    PYG_DFGNN_CACHE="$(mktemp -d "${TMPDIR:-/tmp}/pyg_dfgnn-ci-build.XXXXXX")"
fi
if [[ "${KEEP_BUILD:-0}" != 1 && -z "${BUILD_DIR:-}" ]]; then
    trap 'rm -rf "$PYG_DFGNN_CACHE"' EXIT
fi
export PATH="$VENV/bin:$PATH"  # ninja
# A CUDA_HOME without the math-library headers (cusparse.h, cublas_v2.h, which
# ATen/cuda/CUDAContext.h includes) gets them from torch's nvidia-* wheels,
# searched after CUDA_HOME/include so that they shadow nothing.
if [[ ! -f "$CUDA_HOME/include/cusparse.h" ]]; then
    wheel_include="$("$VENV/bin/python" -c "
import glob, os, sysconfig
hits = glob.glob(os.path.join(sysconfig.get_paths()['purelib'], 'nvidia', '*',
                              'include', 'cusparse.h'))
print(os.path.dirname(hits[0]) if hits else '')")"
    if [[ -n "$wheel_include" ]]; then
        log "no cusparse.h in $CUDA_HOME/include: using $wheel_include"
        export CPLUS_INCLUDE_PATH="$wheel_include${CPLUS_INCLUDE_PATH:+:$CPLUS_INCLUDE_PATH}"
    fi
fi
build_start=$SECONDS
# The loader is loaded by path so that the package's other imports
# (torch_geometric, ...) need not be in this venv.
if "$VENV/bin/python" - "$ROOT/pyg_dfgnn/ops/_loader.py" <<'PY'
import importlib.util
import sys
import warnings

warnings.filterwarnings('ignore', message='Failed to initialize NumPy')
spec = importlib.util.spec_from_file_location('pyg_dfgnn_loader', sys.argv[1])
loader = importlib.util.module_from_spec(spec)
spec.loader.exec_module(loader)
loader.build(verbose=True)
PY
then
    log "OK: kernels compiled and loaded in $((SECONDS - build_start)) s" \
        "(total $((SECONDS - start)) s)"
else
    rc=$?
    log "FAIL: kernel build failed (exit $rc) after $((SECONDS - build_start)) s"
    [[ "${KEEP_BUILD:-0}" == 1 ]] && log "build folder kept: $PYG_DFGNN_CACHE"
    exit 1
fi

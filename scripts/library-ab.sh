#!/usr/bin/env bash
# One device call comparing two kernel libraries built here
# (scripts/build-device-library.sh) and carried as xz files (".devlib";
# two fit the 64-MiB carry where two .gz would not): the GPU tests and the
# sanitizers on the new one, the tensor-core tests on the old one too, an
# in-run A/B of both (scripts/env_ab.py) and ncu profiles of both; logs and
# JSON under $OUT, the A/B table printed last.
#
#   OLD_XZ=.devlib/old-<stamp>.so.xz NEW_XZ=.devlib/new-<stamp>.so.xz \
#     AB_CASES=pattern-like:1x128:bf16:dot,... bash scripts/library-ab.sh
#
# Environment: AB_VARIANTS, CHECK_ENV (below), TEST_PATHS (the new
# library's tests; default the TC and autograd tests), OLD_TEST_PATHS
# (default tests/test_tc_windows_cuda.py; "" skips), SANITIZE_ARGS
# (default tc), AB_ROUNDS (2), NCU_CASE (default pattern-like:8x16:bf16:dot;
# "" skips), NCU_KERNELS (regex, default the TC kernels).
set -u
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$ROOT"
source scripts/device-env.sh
OUT=${OUT:-./library-ab-out}
mkdir -p "$OUT"
unxz "$OLD_XZ" /tmp/old.so && unxz "$NEW_XZ" /tmp/new.so || exit 1
T0=$(date +%s)

if [ -n "${OLD_TEST_PATHS-tests/test_tc_windows_cuda.py}" ]; then
  PYG_DFGNN_LIBRARY=/tmp/old.so timeout 150 python -m pytest -m cuda -q \
    --no-header -p no:cacheprovider ${OLD_TEST_PATHS-tests/test_tc_windows_cuda.py} \
    >"$OUT/old-tests.txt" 2>&1
  echo "old library tests: rc=$? $(tail -n 1 "$OUT/old-tests.txt")"
fi
# (CHECK_ENV: variables of the new library's tests and sanitizers, e.g.
# 'PYG_DFGNN_SHORT_THREADS=max')
env ${CHECK_ENV:-} PYG_DFGNN_LIBRARY=/tmp/new.so OUT="$OUT/check" \
  STAGES="test sanitize" \
  TEST_PATHS="${TEST_PATHS:-tests/test_tc_windows_cuda.py tests/test_tc_fragments.py tests/test_autograd_cuda.py}" \
  SANITIZE_SCRIPTS="scripts/sanitize_cases.py scripts/sanitize_bwd.py" \
  SANITIZE_ARGS="${SANITIZE_ARGS-tc}" DEADLINE_S=${CHECK_DEADLINE_S:-300} \
  bash scripts/gpu-check.sh >"$OUT/check.txt" 2>&1
tail -n 8 "$OUT/check.txt"

# (AB_VARIANTS: more variants, e.g. 'new-x:PYG_DFGNN_LIBRARY=/tmp/new.so;KNOB=1')
python scripts/env_ab.py 'old:PYG_DFGNN_LIBRARY=/tmp/old.so' \
  'new:PYG_DFGNN_LIBRARY=/tmp/new.so' ${AB_VARIANTS:-} \
  --rounds "${AB_ROUNDS:-2}" \
  --cases "$AB_CASES" --json "$OUT/ab.json" >"$OUT/ab.txt" 2>&1

if [ -n "${NCU_CASE-pattern-like:8x16:bf16:dot}" ] && command -v ncu >/dev/null; then
  for lib in old new; do
    PYG_DFGNN_LIBRARY=/tmp/$lib.so timeout 120 ncu \
      --kernel-name "regex:${NCU_KERNELS:-tc_(fwd|bwd)_kernel}" --launch-count 2 \
      --section SpeedOfLight --section WarpStateStats --section SchedulerStats \
      --section ComputeWorkloadAnalysis --section InstructionStats \
      --section Occupancy \
      python scripts/kernel_times.py "${NCU_CASE-pattern-like:8x16:bf16:dot}" \
      --steps 1 >"$OUT/ncu-$lib.txt" 2>&1
    echo "ncu $lib: rc=$?"
  done
fi
echo "=== $(( $(date +%s) - T0 ))s; A/B (GPU ms, median of rounds):"
cat "$OUT/ab.txt"

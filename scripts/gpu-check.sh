#!/usr/bin/env bash
# One device call: build the kernels, run the GPU tests, the sanitizers, the
# kernel benchmark and the training-features benchmark; copy logs / JSON to
# $OUT; print a stage summary last.
#
#   run: bash scripts/gpu-check.sh            (OUT defaults to ./gpu-check-out)
#   STAGES="build test sanitize fwdbench bench features" bash scripts/gpu-check.sh
#                                             (a subset; also: ncu, modules, profile, compilelog, e2e,
#                                             varlencheck, profilefeatures, accuracy —
#                                             module-level and end-to-end
#                                             benchmarks, off by default)
#   PYTEST_ARGS="-k random_case" ...          (extra pytest arguments)
#   SANITIZE_SCRIPTS="scripts/sanitize_cases.py" ...  (default: fwd + bwd)
#   SANITIZE_ARGS="projection" ...             (arguments of the scripts)
#   SAVE_LIBRARY=1 ... / LIBRARY_GZ=.devlib/kernels-<stamp>.so.gz ...
#                                             (save the built kernels to $OUT /
#                                             load them in a later call: the
#                                             file or its .partNN files)
set -u
source "$(dirname "${BASH_SOURCE[0]}")/device-env.sh"
OUT=${OUT:-./gpu-check-out}
LOGS=$(mktemp -d)  # $OUT brings back at most 8 files: logs travel as a tarball
mkdir -p "$OUT"
STAGES=${STAGES:-"build test sanitize fwdbench bench features"}
PY=${PYTHON:-python}
T0=$(date +%s)

# The device call's own limit is 600 s: a stage gets at most what is left
# of DEADLINE_S, a stage past it is skipped, and the logs are packed after
# every stage, so that a call cut short still brings back what ran.
DEADLINE_S=${DEADLINE_S:-570}

# One line per stage, in a file: stages run in a background job too.
record() { echo "$1" >>"$LOGS/stages.txt"; }

pack_logs() {
  { echo "=== summary ($(( $(date +%s) - T0 ))s, $(head -n 1 "$LOGS/gpu.txt" 2>/dev/null))"
    cat "$LOGS/stages.txt" 2>/dev/null; } >"$LOGS/summary.txt"
  local tmp
  tmp=$(mktemp)  # (two jobs may pack at once)
  tar -czf "$tmp" -C "$LOGS" . 2>/dev/null && chmod 644 "$tmp" &&
    mv -f "$tmp" "$OUT/logs.tar.gz"
  rm -f "$tmp"
}

stage() {  # stage NAME TIMEOUT_S CMD...: run, log to $OUT/NAME.log, record rc
  local name=$1 limit=$2
  shift 2
  local t=$(date +%s)
  local left=$(( DEADLINE_S - (t - T0) ))
  if (( left < 15 )); then
    record "$(printf '%-12s skipped (deadline %ss)' "$name" "$DEADLINE_S")"
    return 0
  fi
  (( limit > left )) && limit=$left
  echo "=== $name: $*"
  timeout --kill-after=10 "$limit" "$@" >"$LOGS/$name.log" 2>&1
  local rc=$?
  tail -n 25 "$LOGS/$name.log"
  record "$(printf '%-12s rc=%-4s %4ss' "$name" "$rc" "$(( $(date +%s) - t ))")"
  pack_logs
  return 0
}

has() { [[ " $STAGES " == *" $1 "* ]]; }

nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader \
  >"$LOGS/gpu.txt" 2>&1
cat "$LOGS/gpu.txt"

# The kernel sources' stamp: a library saved by one call (SAVE_LIBRARY=1 ->
# $OUT/kernels-<stamp>.so.gz) is loaded by a later one (LIBRARY_GZ=<that
# file, carried>) only while kernels/ is unchanged.
STAMP=$(export LC_ALL=C; cat kernels/*.cu kernels/*.cuh kernels/*.cpp kernels/*.h | sha1sum | cut -c1-12)
if has build && [ -n "${LIBRARY_GZ:-}" ] \
    && compgen -G "$LIBRARY_GZ*" >/dev/null \
    && [[ "$(basename "$LIBRARY_GZ")" == "kernels-$STAMP.so.gz" ]]; then
  # the saved file, or the parts it came back in
  cat $( [ -f "$LIBRARY_GZ" ] && echo "$LIBRARY_GZ" || echo "$LIBRARY_GZ".part* ) \
    | gunzip -c >/tmp/pyg_dfgnn_kernels.so
  export PYG_DFGNN_LIBRARY=/tmp/pyg_dfgnn_kernels.so
  stage load 120 $PY -c \
    "from pyg_dfgnn.ops._loader import load_kernels; assert load_kernels()"
elif has build; then
  [ -n "${LIBRARY_GZ:-}" ] && echo "LIBRARY_GZ=$LIBRARY_GZ is not kernels-$STAMP: building"
  stage build 420 $PY -c \
    "from pyg_dfgnn.ops._loader import build; build(verbose=True)"
  grep -E "error|spill stores|Used [0-9]+ registers" "$LOGS/build.log" \
    | sort | uniq -c | sort -rn | head -n 8
  if [ -n "${SAVE_LIBRARY:-}" ] && [ -f "$PYG_DFGNN_CACHE/pyg_dfgnn_kernels.so" ]; then
    # (in parts: a file back from $OUT is at most 16 MiB)
    gzip -c "$PYG_DFGNN_CACHE/pyg_dfgnn_kernels.so" \
      | split -b 15M -d - "$OUT/kernels-$STAMP.so.gz.part"
    ls -l "$OUT"/kernels-$STAMP.so.gz.part*
  fi
fi
sanitize() {
  for tool in memcheck racecheck; do
    for script in ${SANITIZE_SCRIPTS:-scripts/sanitize_cases.py scripts/sanitize_bwd.py scripts/sanitize_features.py}; do
      [ -f "$script" ] || continue
      name="$tool-$(basename "$script" .py)"
      stage "$name" 150 compute-sanitizer --tool "$tool" --error-exitcode 9 \
        $PY "$script" ${SANITIZE_ARGS:-}
      grep -E "ERROR SUMMARY|RACECHECK SUMMARY" "$LOGS/$name.log" | tail -n 2
    done
  done
  # The short kernels' walks: these small graphs have fewer groups than
  # resident blocks, so they take one group a block unless the grid is
  # capped (PYG_DFGNN_SHORT_PERSIST=3: each block walks many groups).
  [ -n "${SANITIZE_ARGS:-}" ] && return 0
  for script in ${SANITIZE_SCRIPTS:-scripts/sanitize_cases.py scripts/sanitize_bwd.py scripts/sanitize_features.py}; do
    [ -f "$script" ] || continue
    name="memcheck-walk-$(basename "$script" .py)"
    stage "$name" 150 env PYG_DFGNN_SHORT_PERSIST=3 compute-sanitizer \
      --tool memcheck --error-exitcode 9 $PY "$script"
    grep -E "ERROR SUMMARY" "$LOGS/$name.log" | tail -n 1
  done
}
# The sanitizers beside the tests (both check correctness only, so sharing
# the GPU costs them nothing but time; 16 CPU cores): ~190 s less per call.
sanitizer_job=
if has sanitize && has test && [ -z "${SERIAL:-}" ]; then
  sanitize >"$LOGS/sanitize-job.out" 2>&1 &
  sanitizer_job=$!
fi
if has test; then
  stage test ${TEST_TIMEOUT:-240} $PY -m pytest -m cuda -q --maxfail=25 \
    --no-header -p no:cacheprovider -rf ${PYTEST_ARGS:-} ${TEST_PATHS:-tests/}
fi
if [ -n "$sanitizer_job" ]; then
  wait "$sanitizer_job"
  cat "$LOGS/sanitize-job.out"
elif has sanitize; then
  sanitize
fi
if has ncu; then  # kernel profiles (text) of NCU_CASES' launches
  stage ncu ${NCU_TIMEOUT:-240} ncu --kernel-name "regex:${NCU_KERNELS:-tc_(fwd|bwd)_kernel}" \
    --launch-count ${NCU_LAUNCHES:-2} --section SpeedOfLight \
    --section Occupancy --section LaunchStats --section WarpStateStats \
    --section MemoryWorkloadAnalysis --section ComputeWorkloadAnalysis \
    --section SchedulerStats \
    $PY scripts/profile_kernels.py ${NCU_CASES:-pattern-like:1x128:tc:bf16}
fi
if has varlencheck; then  # is the varlen kernel's dropout mask the same in its backward?
  stage varlencheck 90 $PY scripts/varlen_dropout_check.py
fi
if has profilefeatures; then  # CUDA kernels per training step of the feature rows
  stage profilefeatures ${PROFILE_FEATURES_TIMEOUT:-120} $PY scripts/profile_features.py \
    ${PROFILE_FEATURES_ROWS:-gat gat-edge gt gt-edge}
fi
if has accuracy; then  # issue 10's accuracy runs (resumable: scripts/accuracy-check.sh)
  limit=${ACCURACY_TIMEOUT:-400}
  stage accuracy $(( limit + 20 )) env OUT="$LOGS/accuracy" DEADLINE_S=$limit \
    bash scripts/accuracy-check.sh
  cp "$LOGS/accuracy/accuracy-state.tar.gz" "$OUT/" 2>/dev/null
  rm -f "$LOGS/accuracy/accuracy-state.tar.gz"; pack_logs
fi
if has fwdbench; then
  stage fwdbench ${FWD_BENCH_TIMEOUT:-150} $PY scripts/fwd_bench.py ${FWD_BENCH_ARGS:-} \
    --out "$OUT/fwd_bench.json"
fi
if has bench && [ -f benchmarks/kernels.py ]; then
  stage bench 200 $PY benchmarks/kernels.py ${BENCH_ARGS:-} \
    --out "$OUT/kernels.json"
fi
if has features && [ -f benchmarks/training_features.py ]; then
  # dropout / edge_dim / attention weights: gates vs PyG, 0 reference calls
  stage features ${FEATURES_TIMEOUT:-240} $PY benchmarks/training_features.py \
    ${FEATURES_ARGS:-} --out "$OUT/training_features.json"
fi

if has modules && [ -f benchmarks/modules.py ]; then
  stage modules ${MODULES_TIMEOUT:-240} $PY benchmarks/modules.py \
    ${MODULES_ARGS:-} --out "$OUT/modules.json"
fi
if has profile; then  # ms per step, GPU busy %, host syncs per step
  stage profile ${PROFILE_TIMEOUT:-200} $PY scripts/profile_step.py \
    --cfg ${PROFILE_CFG:-configs/pattern-gps.yaml} \
    --variants ${PROFILE_VARIANTS:-dfgnn,pyg-runner} \
    --json "$OUT/profile_step.json" ${PROFILE_ARGS:-}
fi
if has compilelog; then  # each compiled step's time with its recompiles,
  # graph breaks and cudagraph re-records, with and without CUDA graphs
  stage compilelog ${COMPILELOG_TIMEOUT:-300} env \
    TORCH_LOGS=recompiles,graph_breaks,cudagraphs $PY scripts/compile_steps.py \
    --cfg ${PROFILE_CFG:-configs/pattern-gps.yaml} \
    --variants ${COMPILE_VARIANTS:-dfgnn,dfgnn-nocg} --steps ${COMPILE_STEPS:-40} \
    --json "$OUT/compile_steps.json"
fi
if has e2e; then  # same config, backend pyg vs dfgnn, same data and epochs
  stage e2e ${E2E_TIMEOUT:-300} $PY -m pyg_dfgnn bench-e2e \
    --cfg ${E2E_CFG:-configs/pattern-gat.yaml} --epochs ${E2E_EPOCHS:-3} \
    --out "$OUT" ${E2E_VARIANTS:+--variants "$E2E_VARIANTS"} \
    train.num_workers=4 ${E2E_ARGS:-}
fi

pack_logs
cp "$LOGS/summary.txt" "$OUT/summary.txt"
echo
cat "$LOGS/summary.txt"

#!/usr/bin/env bash
# Accuracy runs of issue 10's gate on one GPU, resumable across device calls:
# the same config and seed trained for EPOCHS epochs as
#   dfgnn        backend dfgnn, captured step (train.capture=true)
#   dfgnn-eager  backend dfgnn, eager step
#   pyg          backend pyg (GATConv + padded MultiheadAttention), captured
# and a full 100-epoch dfgnn run (RUNS="... dfgnn-100"); dfgnn-layers /
# pyg-layers / dfgnn-layers-100 the same with train.compile_layers. Each call trains
# until DEADLINE_S (default 540 s after its start), stopping after an epoch
# with a checkpoint (train.time_limit_s), packs the run folders into
# $OUT/accuracy-state.tar.gz, and prints the table
# (scripts/accuracy_table.py). The next call continues them when the
# state is carried back: unpack the tarball into ./accuracy-state (an
# ignored path) and pass it in the device call's `carry`.
#
#   run: bash scripts/accuracy-check.sh
#   CFG=configs/cluster-gps.yaml EPOCHS=30 RUNS="dfgnn pyg" bash scripts/accuracy-check.sh
set -u
source "$(dirname "${BASH_SOURCE[0]}")/device-env.sh"
T0=$(date +%s)
OUT=${OUT:-./accuracy-out}
STATE=${STATE:-./accuracy-state}
CFG=${CFG:-configs/pattern-gps.yaml}
EPOCHS=${EPOCHS:-30}
RUNS=${RUNS:-"dfgnn dfgnn-eager pyg dfgnn-100"}
DEADLINE_S=${DEADLINE_S:-540}
MARGIN_S=${MARGIN_S:-60}   # one epoch past the limit + eval + checkpoint
PY=${PYTHON:-python}
mkdir -p "$OUT" "$STATE"
NAME=$(basename "$CFG" .yaml)

overrides() {  # run name -> runner overrides
  case $1 in
    dfgnn)       echo "backend=dfgnn train.capture=true optim.max_epoch=$EPOCHS" ;;
    dfgnn-eager) echo "backend=dfgnn train.capture=false optim.max_epoch=$EPOCHS" ;;
    pyg)         echo "backend=pyg train.capture=true optim.max_epoch=$EPOCHS" ;;
    dfgnn-100)   echo "backend=dfgnn train.capture=true optim.max_epoch=100" ;;
    # the captured step replaying GPS layers compiled by inductor
    dfgnn-layers) echo "backend=dfgnn train.capture=true train.compile_layers=true optim.max_epoch=$EPOCHS" ;;
    pyg-layers)  echo "backend=pyg train.capture=true train.compile_layers=true optim.max_epoch=$EPOCHS" ;;
    dfgnn-layers-100) echo "backend=dfgnn train.capture=true train.compile_layers=true optim.max_epoch=100" ;;
    *) echo "unknown run '$1'" >&2; return 1 ;;
  esac
}

# Build the kernels and generate (cache) the dataset once, outside the runs'
# time limits (train.time_limit_s counts training only).
$PY -c "
import torch
if torch.cuda.is_available():  # (CPU: the reference path, nothing to build;
    # \$PYG_DFGNN_LIBRARY: a library carried in, loaded instead of built)
    from pyg_dfgnn.ops._loader import load_kernels; assert load_kernels()" \
  >"$OUT/build.log" 2>&1 \
  || { tail -n 30 "$OUT/build.log"; exit 1; }
$PY -c "
import sys
from pyg_dfgnn.datasets import build_datasets
from pyg_dfgnn.train.config import load_config
build_datasets(load_config(sys.argv[1]))" "$CFG" >"$OUT/dataset.log" 2>&1 \
  || { tail -n 30 "$OUT/dataset.log"; exit 1; }
echo "kernels + dataset ready after $(( $(date +%s) - T0 ))s"

for run in $RUNS; do
  ov=$(overrides "$run") || exit 2
  dir="$STATE/$NAME/$run"
  results=$(ls "$dir"/*/*/results.json 2>/dev/null | head -n 1)
  if [[ -n "$results" ]] && $PY - "$results" <<'PYEOF'
import json, sys
sys.exit(0 if json.load(open(sys.argv[1]))['finished'] else 1)
PYEOF
  then
    echo "=== $run: done"; continue
  fi
  left=$(( DEADLINE_S - ($(date +%s) - T0) - MARGIN_S ))
  if (( left < 60 )); then echo "=== $run: no time left in this call"; continue; fi
  resume=""
  ls "$dir"/*/*/ckpt/last.pt >/dev/null 2>&1 && resume="--resume"
  echo "=== $run: $ov (limit ${left}s) $resume"
  $PY -m pyg_dfgnn train --cfg "$CFG" $resume out_dir="$dir" \
    train.progress_bar=false train.time_limit_s=$left $ov \
    >>"$OUT/$NAME-$run.log" 2>&1
  echo "rc=$?"; tail -n 4 "$OUT/$NAME-$run.log"
done

tar -czf "$OUT/accuracy-state.tar.gz" -C "$STATE" .
$PY scripts/accuracy_table.py "$STATE" --out "$OUT/accuracy.json"
echo "($(( $(date +%s) - T0 ))s)"

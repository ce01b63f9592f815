#!/usr/bin/env bash
# One call on a 2-GPU machine (nvidia-h200-x2): data-parallel scaling of the
# runner (pattern-gps) and of sampled Reddit-size training, 1 GPU vs 2 GPUs
# (torchrun, NCCL, NVLink multicast off), the same epochs and seed, in two
# modes (DDP_BATCH):
#   global    strong scaling: the batch of all ranks together is the 1-GPU
#             batch (each rank half of it, the 1-GPU steps per epoch);
#   per_rank  weak scaling: each rank takes the 1-GPU batch (global batch
#             doubled, half the steps per epoch; train.ddp_batch=per_rank,
#             sampled_reddit.py --per-rank-batch).
# Writes $OUT/ddp-scaling.json (throughput ratio and final accuracies per
# workload and mode) and the logs; prints the table last.
#
#   run (kind nvidia-h200-x2): bash scripts/ddp-check.sh
#   EPOCHS=3 PATTERN_SIZE=2000 REDDIT_EPOCHS=2 DDP_BATCH="global per_rank"
#   STAGES="build pattern reddit" DEADLINE=560 (the defaults);
#   PATTERN_VARIANTS="eager" (add "captured": the device loader and the
#   CUDA-graph step, train.capture=graphs, whose gradient all-reduce is
#   captured with it); REDDIT_REPEATS=1 (1-GPU / 2-GPU pairs, run in
#   turn; throughput averaged). Each stage's
#   time limit is cut to what is left of DEADLINE seconds (a stage with
#   less than 20 s left is skipped), so the table prints inside one
#   10-minute call.
set -u
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 \
  NVSHMEM_DISABLE_NVLS=1
export PYG_DFGNN_CACHE=${PYG_DFGNN_CACHE:-$PWD/build/pdf_cache}
source "$(dirname "${BASH_SOURCE[0]}")/device-env.sh"
OUT=${OUT:-./ddp-out}
RUNS=$(mktemp -d)
mkdir -p "$OUT"
STAGES=${STAGES:-"build pattern reddit"}
EPOCHS=${EPOCHS:-3}
PATTERN_SIZE=${PATTERN_SIZE:-2000}  # training graphs (val/test: 1/5 each)
REDDIT_EPOCHS=${REDDIT_EPOCHS:-2}
DDP_BATCH=${DDP_BATCH:-"global per_rank"}
DEADLINE=${DEADLINE:-560}
PATTERN_VARIANTS=${PATTERN_VARIANTS:-eager}
REDDIT_REPEATS=${REDDIT_REPEATS:-1}
START=$(date +%s)
PY=${PYTHON:-python}
has() { [[ " $STAGES " == *" $1 "* ]]; }
mode() { [[ " $DDP_BATCH " == *" $1 "* ]]; }
stage() {  # stage NAME TIMEOUT_S CMD...
  local name=$1 limit=$2 t=$(date +%s)
  local left=$(( DEADLINE - (t - START) ))
  shift 2
  if (( left < 20 )); then
    echo "=== $name: skipped, ${left}s left of DEADLINE=${DEADLINE}s"
    return
  fi
  (( limit > left )) && limit=$left
  echo "=== $name (limit ${limit}s): $*"
  timeout --kill-after=10 "$limit" "$@" >"$OUT/$name.log" 2>&1
  echo "--- $name rc=$? $(( $(date +%s) - t ))s"
  grep -v Warning "$OUT/$name.log" | tail -n 6
}
nvidia-smi --query-gpu=name,memory.total --format=csv,noheader
has build && stage build 200 $PY -c \
  "from pyg_dfgnn.ops._loader import build; build(verbose=False)"
variant_args() {  # pattern variant -> extra runner overrides
  [[ $1 == captured ]] && echo "train.loader=device train.capture=graphs"
}
if has pattern; then
  for v in $PATTERN_VARIANTS; do
    vs=$([[ $v == eager ]] && echo "" || echo "-$v")
    # The first 1-GPU run generates and caches PATTERN.
    stage pattern-1gpu$vs 150 $PY -m pyg_dfgnn train \
      --cfg configs/pattern-gps.yaml optim.max_epoch=$EPOCHS \
      dataset.size=$PATTERN_SIZE out_dir=$RUNS/1gpu$vs \
      train.progress_bar=False $(variant_args $v)
    cp $RUNS/1gpu$vs/*/*/results.json "$OUT/pattern-1gpu$vs.json" 2>/dev/null
    for m in global per_rank; do
      mode $m || continue
      suffix=$([[ $m == global ]] && echo "" || echo "-$m")
      stage pattern-2gpu$suffix$vs 120 $PY -m torch.distributed.run \
        --nproc_per_node=2 -m pyg_dfgnn train --cfg configs/pattern-gps.yaml \
        optim.max_epoch=$EPOCHS dataset.size=$PATTERN_SIZE \
        out_dir=$RUNS/2gpu-$m$vs train.progress_bar=False \
        train.ddp_batch=$m $(variant_args $v)
      cp $RUNS/2gpu-$m$vs/*/*/results.json \
        "$OUT/pattern-2gpu$suffix$vs.json" 2>/dev/null
    done
  done
fi
if has reddit; then
  for r in $(seq 1 $REDDIT_REPEATS); do
    rs=""; (( r > 1 )) && rs="-r$r"
    stage reddit-1gpu$rs 90 $PY examples/sampled_reddit.py \
      --epochs $REDDIT_EPOCHS --json "$OUT/reddit-1gpu$rs.json"
    for m in global per_rank; do
      mode $m || continue
      suffix=$([[ $m == global ]] && echo "" || echo "-$m")
      stage reddit-2gpu$suffix$rs 90 $PY -m torch.distributed.run \
        --nproc_per_node=2 examples/sampled_reddit.py \
        --epochs $REDDIT_EPOCHS --json "$OUT/reddit-2gpu$suffix$rs.json" \
        $([[ $m == per_rank ]] && echo --per-rank-batch)
    done
  done
fi
$PY - "$OUT" <<'EOF'
import json, os, sys
out = sys.argv[1]
def load(name):
    path = os.path.join(out, name)
    return json.load(open(path)) if os.path.exists(path) else None
rows = {}
def pattern_speed(r):
    # Epoch 0 carries one-time costs (warm-up); compare the later epochs.
    h = r['history'][1:] or r['history']
    return sum(e['graphs_per_s'] for e in h) / len(h)
def reddit_speed(r):
    h = r['history'][1:] or r['history']
    return sum(e['seeds_per_s'] for e in h) / len(h)
import re
mean = lambda xs: sum(xs) / len(xs)
for vs in ('', '-captured'):
    p1 = load(f'pattern-1gpu{vs}.json')
    for mode, suffix in (('global', ''), ('per_rank', '-per_rank')):
        p2 = load(f'pattern-2gpu{suffix}{vs}.json')
        if p1 and p2:
            rows[f'pattern-gps{vs} {mode}'] = {
                'graphs_per_s': [pattern_speed(p1), pattern_speed(p2)],
                'scaling': pattern_speed(p2) / pattern_speed(p1),
                'test_metric': [p1['final']['test_metric'],
                                p2['final']['test_metric']],
                'epochs': [p1['epochs_done'], p2['epochs_done']],
                'steps_per_epoch': [p1['history'][-1].get('train_steps'),
                                    p2['history'][-1].get('train_steps')]}
def runs(prefix):  # a reddit stage's repeats (prefix[-rN].json), in order
    names = [f for f in os.listdir(out)
             if re.fullmatch(re.escape(prefix) + r'(-r\d+)?\.json', f)]
    return [json.load(open(os.path.join(out, f)))
            for f in sorted(names, key=lambda f: (len(f), f))]
r1s = runs('reddit-1gpu')
for mode, suffix in (('global', ''), ('per_rank', '-per_rank')):
    r2s = runs(f'reddit-2gpu{suffix}')
    if r1s and r2s:
        r1, r2 = r1s[-1], r2s[-1]
        s1 = mean([reddit_speed(r) for r in r1s])
        s2 = mean([reddit_speed(r) for r in r2s])
        rows[f'sampled-reddit {mode}'] = {
            'seeds_per_s': [s1, s2], 'scaling': s2 / s1,
            'scaling_per_repeat': [reddit_speed(b) / reddit_speed(a)
                                   for a, b in zip(r1s, r2s)],
            'test_acc': [r1['history'][-1]['test_acc'],
                         r2['history'][-1]['test_acc']],
            'epochs': [len(r1['history']), len(r2['history'])],
            'repeats': [len(r1s), len(r2s)],
            'steps_per_epoch': [r1['history'][-1]['steps'],
                                r2['history'][-1]['steps']],
            # Where an epoch goes: sampling vs the DF format build vs the
            # training step (seconds, last epoch; 2 GPUs: rank 0).
            'phases_1gpu_s': {k: r1['history'][-1].get(k) for k in
                              ('sample_s', 'format_s', 'step_s')},
            'phases_2gpu_s': {k: r2['history'][-1].get(k) for k in
                              ('sample_s', 'format_s', 'step_s')}}
json.dump(rows, open(os.path.join(out, 'ddp-scaling.json'), 'w'), indent=2)
print('\n| workload, ddp batch | 1 GPU | 2 GPUs | scaling | steps/epoch '
      '1 / 2 GPUs | accuracy 1 / 2 GPUs |')
print('|---|---|---|---|---|---|')
for name, r in rows.items():
    speeds = r.get('graphs_per_s') or r['seeds_per_s']
    acc = r.get('test_metric') or r['test_acc']
    steps = r['steps_per_epoch']
    print(f'| {name} | {speeds[0]:.0f}/s | {speeds[1]:.0f}/s | '
          f'{r["scaling"]:.2f}x | {steps[0]} / {steps[1]} | '
          f'{acc[0]:.4f} / {acc[1]:.4f} |')
for name, r in rows.items():
    if 'phases_1gpu_s' in r:
        print(f'{name}: epoch seconds 1 GPU {r["phases_1gpu_s"]}, '
              f'2 GPUs (rank 0) {r["phases_2gpu_s"]}')
EOF

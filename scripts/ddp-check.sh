#!/usr/bin/env bash
# One call on a 2-GPU machine (nvidia-h200-x2): data-parallel scaling of the
# runner (pattern-gps) and of sampled Reddit-size training, 1 GPU vs 2 GPUs
# (torchrun, NCCL, NVLink multicast off), the same epochs and seed. Writes
# $OUT/ddp-scaling.json (throughput ratio and final accuracies per workload)
# and the logs; prints the table last.
#
#   run (kind nvidia-h200-x2): bash scripts/ddp-check.sh
#   EPOCHS=5 PATTERN_SIZE=2000 REDDIT_EPOCHS=3 STAGES="build pattern reddit"
#   (the defaults; all stages fit one 10-minute call)
set -u
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 \
  NVSHMEM_DISABLE_NVLS=1
export TORCH_CUDA_ARCH_LIST=${TORCH_CUDA_ARCH_LIST:-9.0}
export MAX_JOBS=${MAX_JOBS:-16}
export PYTHONPATH=.${PYTHONPATH:+:$PYTHONPATH}
export PYG_DFGNN_CACHE=${PYG_DFGNN_CACHE:-$PWD/build/pdf_cache}
export PYTHONUNBUFFERED=1
OUT=${OUT:-./ddp-out}
RUNS=$(mktemp -d)
mkdir -p "$OUT"
STAGES=${STAGES:-"build pattern reddit"}
EPOCHS=${EPOCHS:-5}
PATTERN_SIZE=${PATTERN_SIZE:-2000}  # training graphs (val/test: 1/5 each)
REDDIT_EPOCHS=${REDDIT_EPOCHS:-3}
PY=${PYTHON:-python}
has() { [[ " $STAGES " == *" $1 "* ]]; }
stage() {  # stage NAME TIMEOUT_S CMD...
  local name=$1 limit=$2 t=$(date +%s)
  shift 2
  echo "=== $name: $*"
  timeout --kill-after=10 "$limit" "$@" >"$OUT/$name.log" 2>&1
  echo "--- $name rc=$? $(( $(date +%s) - t ))s"
  grep -v Warning "$OUT/$name.log" | tail -n 6
}
nvidia-smi --query-gpu=name,memory.total --format=csv,noheader
has build && stage build 200 $PY -c \
  "from pyg_dfgnn.ops._loader import build; build(verbose=False)"
if has pattern; then
  # The 1-GPU run generates and caches PATTERN first.
  stage pattern-1gpu 150 $PY -m pyg_dfgnn train \
    --cfg configs/pattern-gps.yaml optim.max_epoch=$EPOCHS \
    dataset.size=$PATTERN_SIZE out_dir=$RUNS/1gpu train.progress_bar=False
  stage pattern-2gpu 120 $PY -m torch.distributed.run --nproc_per_node=2 \
    -m pyg_dfgnn train --cfg configs/pattern-gps.yaml \
    optim.max_epoch=$EPOCHS dataset.size=$PATTERN_SIZE \
    out_dir=$RUNS/2gpu train.progress_bar=False
  cp $RUNS/1gpu/*/*/results.json "$OUT/pattern-1gpu.json" 2>/dev/null
  cp $RUNS/2gpu/*/*/results.json "$OUT/pattern-2gpu.json" 2>/dev/null
fi
if has reddit; then
  stage reddit-1gpu 90 $PY examples/sampled_reddit.py \
    --epochs $REDDIT_EPOCHS --json "$OUT/reddit-1gpu.json"
  stage reddit-2gpu 90 $PY -m torch.distributed.run --nproc_per_node=2 \
    examples/sampled_reddit.py --epochs $REDDIT_EPOCHS \
    --json "$OUT/reddit-2gpu.json"
fi
$PY - "$OUT" <<'EOF'
import json, os, sys
out = sys.argv[1]
def load(name):
    path = os.path.join(out, name)
    return json.load(open(path)) if os.path.exists(path) else None
rows = {}
p1, p2 = load('pattern-1gpu.json'), load('pattern-2gpu.json')
if p1 and p2:
    # Epoch 0 carries one-time costs (warm-up); compare the later epochs.
    def speed(r):
        h = r['history'][1:] or r['history']
        return sum(e['graphs_per_s'] for e in h) / len(h)
    rows['pattern-gps'] = {
        'graphs_per_s': [speed(p1), speed(p2)],
        'scaling': speed(p2) / speed(p1),
        'test_metric': [p1['final']['test_metric'],
                        p2['final']['test_metric']],
        'epochs': [p1['epochs_done'], p2['epochs_done']]}
r1, r2 = load('reddit-1gpu.json'), load('reddit-2gpu.json')
if r1 and r2:
    def speed(r):
        h = r['history'][1:] or r['history']
        return sum(e['seeds_per_s'] for e in h) / len(h)
    rows['sampled-reddit'] = {
        'seeds_per_s': [speed(r1), speed(r2)],
        'scaling': speed(r2) / speed(r1),
        'test_acc': [r1['history'][-1]['test_acc'],
                     r2['history'][-1]['test_acc']],
        'epochs': [len(r1['history']), len(r2['history'])],
        # Where a 1-GPU epoch goes: sampling vs the DF format build vs
        # the training step (seconds, last epoch).
        'phases_1gpu_s': {k: r1['history'][-1].get(k) for k in
                          ('sample_s', 'format_s', 'step_s')}}
json.dump(rows, open(os.path.join(out, 'ddp-scaling.json'), 'w'), indent=2)
print('\n| workload | 1 GPU | 2 GPUs | scaling | accuracy 1 / 2 GPUs |')
print('|---|---|---|---|---|')
for name, r in rows.items():
    speeds = r.get('graphs_per_s') or r['seeds_per_s']
    acc = r.get('test_metric') or r['test_acc']
    print(f'| {name} | {speeds[0]:.0f}/s | {speeds[1]:.0f}/s | '
          f'{r["scaling"]:.2f}x | {acc[0]:.4f} / {acc[1]:.4f} |')
if 'sampled-reddit' in rows:
    print('1-GPU epoch, seconds:', rows['sampled-reddit']['phases_1gpu_s'])
EOF

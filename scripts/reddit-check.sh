#!/usr/bin/env bash
# One GPU call: the Reddit-size examples at full size (232,965 nodes, 114.6M
# edges). Builds the kernels, then sampled training (DF-GNN, then PyG's
# convs for a few steps) and full-graph training (DF-GNN next to PyG, whose
# out-of-memory is caught); JSON and logs to $OUT, a summary table last.
#
#   run: bash scripts/reddit-check.sh        (OUT defaults to ./reddit-out)
#   STAGES="sampled full-gat" bash scripts/reddit-check.sh    (a subset)
set -u
export PYG_DFGNN_CACHE=${PYG_DFGNN_CACHE:-$PWD/build/pdf_cache}
source "$(dirname "${BASH_SOURCE[0]}")/device-env.sh"
OUT=${OUT:-./reddit-out}
mkdir -p "$OUT"
STAGES=${STAGES:-"build sampled full-gat sampled-pyg full-transformer"}
PY=${PYTHON:-python}
has() { [[ " $STAGES " == *" $1 "* ]]; }
stage() {  # stage NAME TIMEOUT_S CMD...
  local name=$1 limit=$2 t=$(date +%s)
  shift 2
  echo "=== $name: $*"
  timeout --kill-after=5 "$limit" "$@" 2>&1 | grep -v Warning \
    | tee "$OUT/$name.log" | tail -n 12
  echo "--- $name rc=${PIPESTATUS[0]} $(( $(date +%s) - t ))s"
}
nvidia-smi --query-gpu=name,memory.total --format=csv,noheader
has build && stage build 200 $PY -c \
  "from pyg_dfgnn.ops._loader import build; build(verbose=False)"
has sampled && stage sampled 90 $PY examples/sampled_reddit.py --epochs 2 \
  --json "$OUT/sampled-dfgnn.json"
has full-gat && stage full-gat 60 $PY examples/full_graph_reddit.py \
  --conv gat --json "$OUT/full-gat.json"
has sampled-pyg && stage sampled-pyg 45 $PY examples/sampled_reddit.py \
  --backend pyg --max-steps 40 --eval-batches 5 \
  --json "$OUT/sampled-pyg.json"
has full-transformer && stage full-transformer 60 $PY \
  examples/full_graph_reddit.py --conv transformer \
  --json "$OUT/full-transformer.json"
$PY - "$OUT" <<'EOF'
import glob, json, os, sys
print('\n| run | backend | result |\n|---|---|---|')
for f in sorted(glob.glob(os.path.join(sys.argv[1], '*.json'))):
    r = json.load(open(f))
    if r['example'] == 'sampled_reddit':
        h = r['history'][-1]
        print(f"| sampled {r['args']['conv']} x{r['world_size']} | "
              f"{r['args']['backend']} | epoch {h['epoch']}: "
              f"{h['epoch_time_s']:.2f} s, {h['seeds_per_s']:.0f} seeds/s, "
              f"sample {h.get('sample_s', 0):.2f} / format "
              f"{h.get('format_s', 0):.2f} / step {h.get('step_s', 0):.2f} s,"
              f" val {h['val_acc']:.4f}, test {h['test_acc']:.4f}, peak "
              f"{r['peak_memory_gib'] or 0:.1f} GiB |")
    else:
        for x in r['runs']:
            res = (f"{x['step_ms_median']:.1f} ms/step" if x['status'] == 'ok'
                   else x['status'])
            print(f"| full {r['args']['conv']} | {x['backend']} | {res}, "
                  f"peak {x.get('peak_gib', 0):.1f} GiB |")
EOF

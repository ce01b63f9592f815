"""Where a training step of the feature rows spends its GPU time.

    python scripts/profile_features.py [row ...]   (rows of
    benchmarks/training_features.py; default: the plain and edge rows)

Builds our conv of each row on the benchmark's graph and prints the CUDA
kernels of five training steps (torch.profiler), heaviest first.
``--once``: one step per row, no profiler (a run under ncu).
``--src-order``: the edges in source order (as coalesced PyG datasets store
them) instead of the benchmark's destination order: the user's edge
attributes are then read in CSC order, not CSR order.
"""
import os
import sys
from pathlib import Path

import torch
from torch.profiler import ProfilerActivity, profile

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / 'benchmarks'))
import training_features as tf  # noqa: E402


SHAPES = False  # --shapes: aten ops with input shapes and callers
ONCE = False  # --once: one step per row, nothing printed
SRC_ORDER = False  # --src-order: edges sorted by source

# Rows that split the benchmark's combined row into its features.
DIAGNOSTIC = {
    'gatv2-edge': tf.Config('gatv2-edge', 'gatv2', (tf.IN_CHANNELS, 16),
                            dict(heads=8, edge_dim=tf.EDGE_DIM)),
    'gatv2-dropout': tf.Config('gatv2-dropout', 'gatv2',
                               (tf.IN_CHANNELS, 16),
                               dict(heads=8, dropout=0.2)),
}


def main(rows) -> None:
    dev = torch.device('cuda')
    edge_index, n = tf.make_graph(dev)
    if SRC_ORDER:
        edge_index = edge_index[:, edge_index[0].argsort(stable=True)]
    for name in rows:
        cfg = tf.BY_NAME.get(name) or DIAGNOSTIC[name]
        _, ours = tf.build_pair(cfg, dev, 0)
        x = torch.randn(n, tf.IN_CHANNELS, device=dev, requires_grad=True)
        ea = None if not cfg.edge_dim else torch.randn(
            edge_index.size(1), cfg.edge_dim, device=dev, requires_grad=True)
        inputs = dict(x=x, edge_index=edge_index, edge_attr=ea,
                      leaves=[t for t in (x, ea) if t is not None])
        step = tf.Step(cfg, inputs, None)
        with torch.no_grad():
            inputs['grad'] = torch.randn_like(step.forward(ours))
        run = step(ours)
        if ONCE:
            run()
            torch.cuda.synchronize()
            continue
        for _ in range(3):
            run()
        torch.cuda.synchronize()
        acts = [ProfilerActivity.CUDA] + ([ProfilerActivity.CPU]
                                          if SHAPES else [])
        with profile(activities=acts, record_shapes=SHAPES,
                     with_stack=SHAPES) as prof:
            for _ in range(5):
                run()
            torch.cuda.synchronize()
        print(f'=== {name}: {cfg.describe()}, per step')
        events = [e for e in prof.key_averages()
                  if e.device_time_total > 0]
        events.sort(key=lambda e: -e.device_time_total)
        total = sum(e.device_time_total for e in events) / 5
        print(f'{total / 1e3:8.3f} ms total')
        for e in events[:int(os.environ.get('PROFILE_TOP', '12'))]:
            print(f'{e.device_time_total / 5e3:8.3f} ms {e.count // 5:3d}x '
                  f'{e.key[:90]}')
        if SHAPES:  # the aten ops behind the gathers / scatters, by caller
            ops = prof.key_averages(group_by_input_shape=True,
                                    group_by_stack_n=4)
            for e in sorted(ops, key=lambda e: -e.device_time_total)[:8]:
                if e.key.startswith('aten::'):
                    print(f'  {e.device_time_total / 5e3:8.3f} ms {e.key} '
                          f'{e.input_shapes} {e.stack[:4]}')


if __name__ == '__main__':
    flags = ('--shapes', '--once', '--src-order')
    args = [a for a in sys.argv[1:] if a not in flags]
    SHAPES = '--shapes' in sys.argv[1:]
    ONCE = '--once' in sys.argv[1:]
    SRC_ORDER = '--src-order' in sys.argv[1:]
    main(args or ['gat', 'gat-edge', 'gt', 'gt-edge',
                          'gatv2-edge-dropout'])

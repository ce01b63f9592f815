"""A / B of GAT's node terms in one process (session 14): the GEMM form
(pyg_dfgnn/nn/conv/node_ops.py) against the product-and-sum form, module
training steps of benchmarks/modules.py, interleaved and repeated (host-
bound steps of small graphs move by +-15% between runs).

    python scripts/ab_node_scores.py [--graphs zinc-like,mnist-like]
"""
import argparse
import sys
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parents[1]
sys.path[:0] = [str(ROOT), str(ROOT / 'benchmarks')]
import modules as mb  # noqa: E402
from graphs import make_graph  # noqa: E402
from timing import Timer  # noqa: E402

import pyg_dfgnn.nn.conv.gat_conv as gat_conv  # noqa: E402

VARIANTS = {'gemm': lambda x, att, _: gat_conv.node_scores(x, att, 1e9),
            'sum': lambda x, att, _: (x * att).sum(dim=-1)}
SHIPPED = gat_conv.node_scores


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument('--graphs', default='zinc-like,mnist-like,cluster-like')
    p.add_argument('--convs', default='gat,gat-8h')
    p.add_argument('--dtype', default='fp32,bf16')
    p.add_argument('--repeats', type=int, default=2)
    args = p.parse_args()
    dev = torch.device('cuda')
    timer = Timer(dev, warmup_ms=25, rep_ms=150)
    print(f"{'graph':13s} {'conv':7s} dtype  " +
          '  '.join(f'{v:>12s}' for v in VARIANTS) + '   (fwd+bwd ms)')
    for graph in args.graphs.split(','):
        edge_index, n = make_graph(graph, dev, 0)
        for conv in args.convs.split(','):
            for dtype in args.dtype.split(','):
                times = {v: [] for v in VARIANTS}
                for _ in range(args.repeats):
                    for v, fn in VARIANTS.items():
                        gat_conv.node_scores = fn
                        row = mb.bench_pair(conv, graph, edge_index, n, dtype,
                                            timer, dev, 0)
                        times[v].append(row['ours_fb'])
                print(f'{graph:13s} {conv:7s} {dtype:5s}  ' + '  '.join(
                    f"{min(t):5.3f}/{max(t):5.3f}" for t in times.values()),
                    flush=True)
        gat_conv.node_scores = SHIPPED


if __name__ == '__main__':
    main()

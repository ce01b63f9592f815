"""GPU time of our kernels per forward + backward of the public op, from the
profiler (kernel durations, not CUDA events around the call): on small
graphs a call is host-bound and event timings measure the host, which moves
+-60 % between runs of the same library.

    PYG_DFGNN_LIBRARY=... python scripts/kernel_times.py \
        [graph[@scale]:HxF:dtype:kind[:dropout[:es]],...] [--json out.json]

kind 'add' takes [N, H] node scores; dropout (default 0) trains with that
attention dropout; ``es``: an [E, H] edge score term too (GAT's edge_dim,
with its gradient); ``@scale`` shrinks the graph (benchmarks/graphs.py).
Besides the named graphs: ``uniform-N-D`` (N nodes, mean in-degree D,
uniform random sources) and ``batch-S-D`` (1,024 graphs of S nodes, each
node drawing D sources of its graph).
"""
import argparse
import json
import os
import sys

import torch
from torch.profiler import ProfilerActivity, profile

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path[:0] = [ROOT, os.path.join(ROOT, 'benchmarks')]
from graphs import GraphSpec, make_dfgraph  # noqa: E402
from kernels import DTYPES  # noqa: E402

DEFAULT = ','.join(f'{g}:{s}:{d}:{k}' for g in ('pubmed-like', 'cora-like',
                                                 'arxiv-like')
                   for s in ('1x128', '4x32') for d in ('bf16', 'fp16')
                   for k in ('dot', 'gatv2'))


def make_graph_of(name, dev):
    """``(DFGraph, edge_index, num_nodes)`` of a case's graph name."""
    name, _, scale = name.partition('@')
    kind, *nums = name.split('-')
    spec = name
    if kind in ('uniform', 'batch') and len(nums) == 2 and all(
            x.isdigit() for x in nums):
        a, deg = int(nums[0]), int(nums[1])
        spec = GraphSpec('uniform', num_nodes=a, num_edges=a * deg) \
            if kind == 'uniform' else GraphSpec(
                'batch', nodes_per_graph=a, avg_in_degree=deg,
                num_graphs=1024)
    return make_dfgraph(spec, dev, scale=float(scale or 1))


def case_inputs(case: str, dev) -> tuple:
    """``(graph, kind, q, k, v, extra, grad, dropout, edge_score)`` of a
    case ``graph:HxF:dtype:kind[:dropout[:es]]``: seeded random inputs (q,
    k, v and the edge score requiring grad; ``extra`` GATv2's ``att`` or
    nothing; ``grad`` the output's upstream gradient)."""
    name, shape, dt, kind, *opt = case.split(':')
    with_es = opt[1:] == ['es']
    if len(opt) > 2 or (len(opt) == 2 and not with_es):
        raise ValueError(f"case '{case}': after the kind, a dropout and "
                         f"'es' at most")
    p_drop = float(opt[0]) if opt else 0.0
    h, f = (int(x) for x in shape.split('x'))
    dtype = DTYPES[dt]
    graph, _, n = make_graph_of(name, dev)
    gen = torch.Generator(device=dev).manual_seed(0)
    qk_shape = (n, h) if kind == 'add' else (n, h, f)
    q, k, v = (torch.randn(*shape_, device=dev, dtype=dtype,
                           generator=gen).requires_grad_()
               for shape_ in (qk_shape, qk_shape, (n, h, f)))
    extra = (torch.randn(h, f, device=dev, dtype=dtype,
                         generator=gen),) if kind == 'gatv2' else ()
    grad = torch.randn(n, h, f, device=dev, dtype=dtype, generator=gen)
    es = torch.randn(graph.num_edges, h, device=dev, dtype=dtype,
                     generator=gen).requires_grad_() \
        if with_es else None
    return graph, kind, q, k, v, extra, grad, p_drop, es


def main():
    from pyg_dfgnn.ops import fused_attention
    p = argparse.ArgumentParser()
    p.add_argument('cases', nargs='?', default=DEFAULT)
    p.add_argument('--steps', type=int, default=20)
    p.add_argument('--json', default=None)
    args = p.parse_args()
    dev = torch.device('cuda')
    rows = []
    for case in args.cases.split(','):
        graph, kind, q, k, v, extra, grad, p_drop, es = case_inputs(case,
                                                                    dev)

        def step():
            out = fused_attention(graph, kind, v, q, k, *extra,
                                  dropout=p_drop, training=p_drop > 0,
                                  edge_score=es)
            out.backward(grad)
        for _ in range(3):
            step()
        torch.cuda.synchronize()
        with profile(activities=[ProfilerActivity.CUDA]) as prof:
            for _ in range(args.steps):
                step()
            torch.cuda.synchronize()
        per = {}
        for e in prof.key_averages():
            if 'pyg_dfgnn' in e.key and e.device_time_total > 0:
                per[e.key] = e.device_time_total / args.steps / 1e3
        total = sum(per.values())
        rows.append(dict(case=case, ms=total, kernels=per))
        top = max(per, key=per.get) if per else ''
        print(f'{case:28s} {total:8.4f} ms  (top: {top[:50]})', flush=True)
    if args.json:
        with open(args.json, 'w') as fh:
            json.dump(rows, fh, indent=1)


if __name__ == '__main__':
    main()

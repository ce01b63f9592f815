"""The short-owner kernels (a warp per row / column) against the block
kernels (SMMF + the rows / cols passes), same process, same inputs: fused
op forward and forward+backward (through autograd) per graph, score kind
and H x F, with ``PYG_DFGNN_SHORT_ROWS`` = 0 (block) and 1 (short wherever
the shapes allow), interleaved. For setting the rule in
``kernels/short_rows.cuh``.

    python scripts/short_vs_block.py [--graphs pattern-like@32,...]
        [--shapes 4x16,1x128] [--kinds add,dot] [--dtype bfloat16]
        [--json out.json] [--once]

``name@G`` takes G graphs of a batch graph (``scale`` = G / its count).
"""
import argparse
import json
import os
import sys

import torch

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path[:0] = [ROOT, os.path.join(ROOT, 'benchmarks')]


def timed(fn):
    from bench_backward import time_ms  # median of per-call CUDA events
    return time_ms(fn, reps=30, warmup=5)


def main():
    from graphs import GRAPHS, make_dfgraph

    from pyg_dfgnn.ops import fused_attention
    p = argparse.ArgumentParser()
    p.add_argument('--graphs', default='pattern-like@32,cluster-like@32,'
                   'pattern-like,mnist-like,zinc-like')
    p.add_argument('--shapes', default='4x16,8x16,1x128')
    p.add_argument('--kinds', default='add,dot')
    p.add_argument('--dtype', default='float32',
                   choices=['float32', 'float16', 'bfloat16'])
    p.add_argument('--json', default=None)
    p.add_argument('--once', action='store_true',
                   help='one forward + backward of the short kernels per '
                   'case, untimed (for ncu)')
    args = p.parse_args()
    dtype = getattr(torch, args.dtype)
    dev = torch.device('cuda')
    rows = []
    for gname in args.graphs.split(','):
        name, _, count = gname.partition('@')
        scale = int(count) / GRAPHS[name].num_graphs if count else 1.0
        graph, _, n = make_dfgraph(name, dev, scale=scale)
        for kind in args.kinds.split(','):
            for shape in args.shapes.split(','):
                H, F = map(int, shape.split('x'))
                gen = torch.Generator(device=dev).manual_seed(0)
                def rnd(*shape, grad=True):
                    x = torch.randn(*shape, device=dev, generator=gen)
                    return x.to(dtype).requires_grad_(grad)

                v = rnd(n, H, F)
                qk_shape = (n, H) if kind == 'add' else (n, H, F)
                q, k = rnd(*qk_shape), rnd(*qk_shape)
                g = rnd(n, H, F, grad=False)

                def fwd():
                    with torch.no_grad():
                        fused_attention(graph, kind, v, q, k)

                def fb():
                    out = fused_attention(graph, kind, v, q, k)
                    torch.autograd.grad(out, (v, q, k), g)

                if args.once:
                    os.environ['PYG_DFGNN_SHORT_ROWS'] = '1'
                    fb()
                    torch.cuda.synchronize()
                    os.environ.pop('PYG_DFGNN_SHORT_ROWS')
                    print(gname, kind, shape, 'E', graph.num_edges, 'rows', n,
                          flush=True)
                    continue
                res = {}
                for mode in ('0', '1', '0', '1'):
                    os.environ['PYG_DFGNN_SHORT_ROWS'] = mode
                    res.setdefault(mode, []).append((timed(fwd), timed(fb)))
                os.environ.pop('PYG_DFGNN_SHORT_ROWS')
                best = {m: (min(t[0] for t in r), min(t[1] for t in r))
                        for m, r in res.items()}
                row = dict(graph=gname, nodes=n, edges=graph.num_edges,
                           kind=kind, shape=shape, dtype=args.dtype,
                           block_fwd=best['0'][0], short_fwd=best['1'][0],
                           block_fb=best['0'][1], short_fb=best['1'][1])
                rows.append(row)
                print(f"{gname:18s} {kind:4s} {shape:6s} E={graph.num_edges:8d}"
                      f"  fwd {row['block_fwd']:.4f} -> {row['short_fwd']:.4f}"
                      f"  f+b {row['block_fb']:.4f} -> {row['short_fb']:.4f}"
                      f"  x{row['block_fb'] / row['short_fb']:.2f}",
                      flush=True)
    if args.json:
        with open(args.json, 'w') as f:
            json.dump(rows, f, indent=1)


if __name__ == '__main__':
    main()

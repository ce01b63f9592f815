"""Host cost per call of the fused op's layers (GPU), to find where the
autograd path's time above the kernels goes on small graphs.

    python scripts/host_overhead.py [--graph cora-like] [--shape 1x128]
        [--dtype fp32] [--iters 2000]

Each line: microseconds per call of a loop of that step alone (host-bound
loops: the GPU is idle most of the time on cora-like), then the GPU time of
the same step (CUDA events, for comparison).
"""
import argparse
import os
import sys
import time

import torch

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path[:0] = [ROOT, os.path.join(ROOT, 'benchmarks')]
from graphs import make_dfgraph  # noqa: E402
from kernels import DTYPES  # noqa: E402

import pyg_dfgnn  # noqa: E402
from pyg_dfgnn.ops import cuda  # noqa: E402


def per_call_us(fn, iters):
    for _ in range(20):
        fn()
    torch.cuda.synchronize()
    t = time.perf_counter()
    for _ in range(iters):
        fn()
    torch.cuda.synchronize()
    return (time.perf_counter() - t) / iters * 1e6


def main():
    p = argparse.ArgumentParser()
    p.add_argument('--graph', default='cora-like')
    p.add_argument('--shape', default='1x128')
    p.add_argument('--dtype', default='fp32', choices=tuple(DTYPES))
    p.add_argument('--iters', type=int, default=2000)
    p.add_argument('--profile', action='store_true',
                   help="also the profiler's CPU ops and CUDA runtime calls "
                   "inside 100 calls of the raw ops")
    args = p.parse_args()
    dev = torch.device('cuda')
    graph, _, n = make_dfgraph(args.graph, dev)
    colptr, csc_row, csc_perm = graph.csc()
    heads, feats = (int(x) for x in args.shape.split('x'))
    q, k, v = (torch.randn(n, heads, feats, device=dev,
                           dtype=DTYPES[args.dtype]) for _ in range(3))
    qq, kk, vv = (t.clone().requires_grad_() for t in (q, k, v))
    go = torch.randn_like(v)
    cuda.available()
    op = torch.ops.pyg_dfgnn
    plan = cuda._plan(graph, 'dot', q, v, None, backward=True)
    _, lse, *_ = op.fused_attention_fwd(graph.rowptr, graph.col, 0, q, k, v, None,
                                    1.0, 0.2, *plan[:4])
    steps = {
        'torch.empty (floor of an op)': lambda: torch.empty(
            n, heads, feats, device=dev, dtype=v.dtype),
        'x + 1 (floor of a launch)': lambda: v + 1,
        'fwd op (raw)': lambda: op.fused_attention_fwd(
            graph.rowptr, graph.col, 0, q, k, v, None, 1.0, 0.2, *plan[:4]),
        'bwd op (raw)': lambda: op.fused_attention_bwd(
            go, graph.rowptr, graph.col, colptr, csc_row, csc_perm, 0, q, k, v,
            None, lse, 1.0, 0.2, *cuda.bwd_plan_args(plan)),
        'fused op, no grad': lambda: op.fused_attention(
            graph.rowptr, graph.col, None, None, None, 0, q, k, v, None, 1.0,
            0.2, *plan),
        'fused op, grad (node)': lambda: op.fused_attention(
            graph.rowptr, graph.col, colptr, csc_row, csc_perm, 0, qq, kk, vv,
            None, 1.0, 0.2, *plan),
        'cuda.fused_attention_cuda, grad': lambda: cuda.fused_attention_cuda(
            graph, 'dot', vv, qq, kk, None, 1.0, 0.2),
        'public fused_attention, grad': lambda: pyg_dfgnn.fused_attention(
            graph, 'dot', vv, qq, kk, scale=1.0),
    }

    def node_grad():
        out = op.fused_attention(graph.rowptr, graph.col, colptr, csc_row,
                                 csc_perm, 0, qq, kk, vv, None, 1.0, 0.2,
                                 *plan)[0]
        torch.autograd.grad(out, (qq, kk, vv), go)

    def public_grad():
        out = pyg_dfgnn.fused_attention(graph, 'dot', vv, qq, kk, scale=1.0)
        torch.autograd.grad(out, (qq, kk, vv), go)

    def floor_grad():  # the autograd engine alone, one CUDA op
        torch.autograd.grad(vv * 2.0, (vv, ), go)

    steps['x * 2 + autograd.grad (floor)'] = floor_grad
    steps['fused op + autograd.grad'] = node_grad
    steps['public op + autograd.grad'] = public_grad
    print(f'== host cost per call, {args.graph}, {args.shape} {args.dtype}, '
          f'{torch.cuda.get_device_name()}')
    for name, fn in steps.items():
        print(f'{name:34s} {per_call_us(fn, args.iters):8.1f} us')
    if args.profile:
        from torch.profiler import ProfilerActivity, profile
        for name in ('fwd op (raw)', 'bwd op (raw)'):
            with profile(activities=[ProfilerActivity.CPU,
                                     ProfilerActivity.CUDA]) as prof:
                for _ in range(100):
                    steps[name]()
                torch.cuda.synchronize()
            print(f'== {name}: 100 calls')
            print(prof.key_averages().table(sort_by='self_cpu_time_total',
                                            row_limit=18))


if __name__ == '__main__':
    main()

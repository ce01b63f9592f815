"""Times the fused backward (``fused_attention_bwd``) on the anchor graphs.

    python benchmarks/bench_backward.py [--graphs pattern mnist ...]
        [--dtypes float32 bfloat16] [--plain] [--json out.json]

Prints one row per (graph, kind, dtype, H x F): forward ms (the forward
kernels, when registered), backward ms (median of CUDA-event timings after
warm-up), and the backward's HBM floor (each input read once, each gradient
written once) for scale. Both ops get the graph's row windows and the
backward its column windows (``DFGraph.row_windows`` / ``col_windows`` with
the capacities of :mod:`pyg_dfgnn.ops.cuda`), as the autograd path does for
SMMF; ``--plain`` passes none (fixed / plain blocks). Graphs are generated
on the GPU with the anchors' shapes (benchmarks/../shared/anchors.md);
nothing is downloaded.
"""
import argparse
import json
import math
import os
import statistics
import sys

import torch

sys.path.insert(0, os.path.join(os.path.dirname(__file__), '..'))
from pyg_dfgnn.graph import DFGraph  # noqa: E402

KINDS = {'dot': 0, 'add': 1, 'gatv2': 2}


def batch_graph(n_graphs, nodes, pairs, dev, gen):
    """`n_graphs` graphs of `nodes` nodes, `pairs` random (deduplicated)
    edges each."""
    src = torch.randint(0, nodes, (n_graphs, pairs), device=dev,
                        generator=gen)
    dst = torch.randint(0, nodes, (n_graphs, pairs), device=dev,
                        generator=gen)
    off = (torch.arange(n_graphs, device=dev) * nodes).view(-1, 1)
    key = ((dst + off) * (n_graphs * nodes) + src + off).view(-1).unique()
    n = n_graphs * nodes
    return torch.stack([key % n, key // n]), n


def random_graph(n, e, dev, gen):
    src = torch.randint(0, n, (e, ), device=dev, generator=gen)
    dst = torch.randint(0, n, (e, ), device=dev, generator=gen)
    key = (dst * n + src).unique()
    return torch.stack([key % n, key // n]), n


def powerlaw_graph(n, e, dev, gen):
    """Destination degree ~ rank^-0.5 (super nodes), sources uniform."""
    w = torch.arange(1, n + 1, device=dev, dtype=torch.float64).pow(-0.5)
    dst = torch.multinomial(w.float(), e, replacement=True, generator=gen)
    src = torch.randint(0, n, (e, ), device=dev, generator=gen)
    return torch.stack([src, dst]), n


GRAPHS = {
    'cora': lambda d, g: random_graph(2708, 10556, d, g),
    'pubmed': lambda d, g: random_graph(19717, 88648, d, g),
    'mnist': lambda d, g: batch_graph(1024, 71, 71 * 8, d, g),
    'cluster': lambda d, g: batch_graph(1024, 117, 117 * 37 + 1100, d, g),
    'pattern': lambda d, g: batch_graph(1024, 119, 119 * 51, d, g),
    'reddit': lambda d, g: powerlaw_graph(232965, 23_000_000, d, g),
}


def time_ms(fn, reps=20, warmup=3):
    for _ in range(warmup):
        fn()
    ts = []
    for _ in range(reps):
        a = torch.cuda.Event(enable_timing=True)
        b = torch.cuda.Event(enable_timing=True)
        a.record()
        fn()
        b.record()
        b.synchronize()
        ts.append(a.elapsed_time(b))
    return statistics.median(ts)


def floor_us(kind, n_src, n_dst, E, H, F, es, bw=4.16e12):
    """Each of q, k, v, dO, lse read once, dq, dk, dv written once, plus the
    index arrays col, csc_row, csc_perm (int32) and rowptr, colptr once (the
    transient [E, H, 2] fp32 buffer between the passes is not counted)."""
    D = 1 if kind == 'add' else F
    reads = (n_dst * H * (D + F) + n_src * H * (D + F)) * es + n_dst * H * 4
    writes = (n_dst * H * D + n_src * H * (D + F)) * es
    idx = 3 * E * 4 + 2 * (n_src + n_dst) * 8
    return (reads + writes + idx) / bw * 1e6


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument('--graphs', nargs='+', default=['cora', 'pubmed', 'mnist',
                                                    'cluster', 'pattern'])
    ap.add_argument('--kinds', nargs='+', default=['dot'])
    ap.add_argument('--dtypes', nargs='+', default=['float32', 'bfloat16'])
    ap.add_argument('--heads', nargs='+', default=['1x128', '4x32'])
    ap.add_argument('--reps', type=int, default=20)
    ap.add_argument('--json', default=None)
    ap.add_argument('--plain', action='store_true',
                    help='no row / column windows (plain blocks)')
    args = ap.parse_args()

    from pyg_dfgnn.ops import cuda
    if not cuda.available():
        sys.exit('kernels unavailable')
    ops = torch.ops.pyg_dfgnn
    dev = torch.device('cuda')
    gen = torch.Generator(device=dev).manual_seed(0)
    rows = []
    for gname in args.graphs:
        ei, n = GRAPHS[gname](dev, gen)
        graph = DFGraph.from_edge_index(ei, num_nodes=n)
        colptr, csc_row, csc_perm = graph.csc()
        E = graph.num_edges
        max_deg = int(graph.max_in_degree)
        for kind in args.kinds:
            for hf in args.heads:
                H, F = map(int, hf.split('x'))
                for dname in args.dtypes:
                    dt = getattr(torch, dname)
                    v = torch.randn(n, H, F, device=dev, dtype=dt)
                    if kind == 'add':
                        q = torch.randn(n, H, device=dev, dtype=dt)
                        k = torch.randn(n, H, device=dev, dtype=dt)
                        att = None
                    else:
                        q = torch.randn(n, H, F, device=dev, dtype=dt)
                        k = torch.randn(n, H, F, device=dev, dtype=dt)
                        att = (torch.randn(H, F, device=dev, dtype=dt) /
                               math.sqrt(F) if kind == 'gatv2' else None)
                    scale = 1 / math.sqrt(F)
                    kid = KINDS[kind]
                    win, span, cwin, cspan = None, 0, None, 0
                    if not args.plain:
                        win, span = graph.row_windows(
                            cuda._stage_capacity(kind, q, v))
                        cwin, cspan = graph.col_windows(
                            cuda._col_stage_capacity(kind, q, v))

                    def fwd():
                        return ops.fused_attention_fwd(
                            graph.rowptr, graph.col, kid, q, k, v, att, scale,
                            0.2, 0, max_deg, win, span)
                    try:
                        out, lse, *_ = fwd()
                        fwd_ms = time_ms(fwd, args.reps)
                    except Exception as e:  # forward not there yet
                        print(f'# forward unavailable: {e}'.splitlines()[0])
                        out = torch.randn(n, H, F, device=dev, dtype=dt)
                        lse = torch.zeros(n, H, device=dev)
                        fwd_ms = float('nan')
                    dout = torch.randn_like(out)

                    def bwd():
                        return ops.fused_attention_bwd(
                            dout, graph.rowptr, graph.col, colptr, csc_row,
                            csc_perm, kid, q, k, v, att, lse, scale, 0.2, win,
                            span, cwin, cspan, graph.max_in_degree,
                            graph.max_out_degree)
                    bwd_ms = time_ms(bwd, args.reps)
                    fl = floor_us(kind, n, n, E, H, F, v.element_size())
                    row = dict(graph=gname, kind=kind, dtype=dname, H=H, F=F,
                               nodes=n, edges=E, max_in_degree=max_deg,
                               stage_span=span, col_stage_span=cspan,
                               fwd_ms=fwd_ms, bwd_ms=bwd_ms,
                               fwd_bwd_ms=fwd_ms + bwd_ms, bwd_floor_us=fl)
                    rows.append(row)
                    print(f"{gname:8s} {kind:5s} {dname:8s} {H}x{F:<4d} "
                          f"E={E:>9d} fwd {fwd_ms:7.3f} ms  bwd {bwd_ms:7.3f}"
                          f" ms  fwd+bwd {fwd_ms + bwd_ms:7.3f} ms  "
                          f"(bwd floor {fl:6.1f} us)", flush=True)
                    del v, q, k, out, lse, dout
        del graph, ei
        torch.cuda.empty_cache()
    if args.json:
        with open(args.json, 'w') as f:
            json.dump(dict(device=torch.cuda.get_device_name(), rows=rows), f,
                      indent=1)


if __name__ == '__main__':
    main()

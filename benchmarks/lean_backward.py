"""Training-step time and peak memory of the DF convs with the backward's
(p, t) edge buffer stored or recomputed (lean), on large graphs.

    python benchmarks/lean_backward.py [--graphs reddit-like-1/5,reddit-like]
        [--scale 1.0] [--out results.json]

For each graph and conv: one training step (forward + backward, the graph
given as a prebuilt DFGraph; inputs 128 features) with
``PYG_DFGNN_BWD_STORE_MB`` huge (every buffer stored) and 0 (every backward
lean); by default the kernels store the buffer up to 512 MiB. Prints a table
and writes JSON.
"""
import argparse
import os
import sys
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
import graphs  # noqa: E402
import timing  # noqa: E402

CONVS = {
    'gat-h8': lambda: __import__('pyg_dfgnn.nn', fromlist=['x']).DFGATConv(
        128, 16, heads=8, add_self_loops=False),
    'gt-h8': lambda: __import__(
        'pyg_dfgnn.nn', fromlist=['x']).DFTransformerConv(128, 16, heads=8),
}
MODES = (('stored', '1000000'), ('lean', '0'))


def main(argv=None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument('--graphs', default='reddit-like-1/5,reddit-like')
    ap.add_argument('--convs', default=','.join(CONVS))
    ap.add_argument('--scale', type=float, default=1.0)
    ap.add_argument('--out', default=None)
    args = ap.parse_args(argv)
    dev = torch.device('cuda' if torch.cuda.is_available() else 'cpu')
    timer = timing.Timer(dev, warmup_ms=50, rep_ms=300, min_reps=3)
    rows, table = [], []
    for gname in args.graphs.split(','):
        g, edge_index, n = graphs.make_dfgraph(gname, dev, scale=args.scale)
        del edge_index  # (the convs get the prebuilt graph)
        x = torch.randn(n, 128, device=dev, requires_grad=True)
        for cname in args.convs.split(','):
            conv = CONVS[cname]().to(dev)
            params = [x] + list(conv.parameters())
            grad = None

            def step():
                out = conv(x, g)
                torch.autograd.grad(out, params, grad)

            with torch.no_grad():
                grad = torch.randn_like(conv(x, g))
            for mode, limit in MODES:
                os.environ['PYG_DFGNN_BWD_STORE_MB'] = limit
                timing.free_memory(dev)
                mb = timing.guard_oom(lambda: timing.peak_memory_mb(step, dev))
                ms = timing.guard_oom(lambda: timer(step))
                row = dict(graph=gname, conv=cname, mode=mode,
                           num_edges=int(g.num_edges), ms=ms, peak_mb=mb,
                           allocated_mb=torch.cuda.memory_allocated(dev) /
                           2**20 if dev.type == 'cuda' else None)
                rows.append(row)
                table.append([gname, cname, mode, f'{g.num_edges / 1e6:.1f}M',
                              timing.fmt(ms), timing.fmt(mb, 0),
                              timing.fmt(row['allocated_mb'], 0)])
            del conv, params
        del g, x
        timing.free_memory(dev)
    os.environ.pop('PYG_DFGNN_BWD_STORE_MB', None)
    timing.print_table(['graph', 'conv', 'backward', 'edges', 'step ms',
                        'step peak MB', 'held MB'], table)
    print('step peak: memory of one training step beyond what was held '
          'before it (graph, inputs, weights: held MB)')
    if args.out:
        timing.save_json(args.out, dict(benchmark='lean_backward',
                                        env=timing.environment(dev),
                                        rows=rows))
        print(f'saved {args.out}')


if __name__ == '__main__':
    main()

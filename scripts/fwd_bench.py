"""Forward-kernel timings per strategy (SMMF / PMF) on the anchor graphs.

    python scripts/fwd_bench.py [--graphs pattern-like,...] [--dtype fp32]

Times the raw forward op (torch.ops.pyg_dfgnn.fused_attention_fwd) and the
op's fwd+bwd through autograd, 'dot' kind, Q pre-scaled, for H x F = 1x128
and 4x32; prints one table row per (graph, shape, strategy) and the DF-GNN
anchor of shared/anchors.md. Feeds benchmarks/NOTES.md.
"""
import argparse
import json
import os
import sys

import torch

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path[:0] = [ROOT, os.path.join(ROOT, 'benchmarks')]
from graphs import make_dfgraph  # noqa: E402
from timing import Timer, gpu_family  # noqa: E402

# DF-GNN fwd / fwd+bwd ms (anchors.md); H100 where the doc gives H100 figures
DFGNN = {
    'h200': {('cora-like', '1x128'): (0.031, 0.074),
             ('cora-like', '4x32'): (0.031, None),
             ('pubmed-like', '1x128'): (0.050, 0.154),
             ('mnist-like', '1x128'): (0.181, 0.530),
             ('mnist-like', '4x32'): (0.307, None),
             ('cluster-like', '1x128'): (0.812, 2.20),
             ('cluster-like', '4x32'): (1.37, None),
             ('pattern-like', '1x128'): (1.044, 2.79),
             ('pattern-like', '4x32'): (1.72, None),
             ('reddit-like-1/5', '1x128'): (15.6, None),
             ('reddit-like-1/5', '4x32'): (31.5, None)},
}
DFGNN['h100'] = dict(DFGNN['h200'])
DFGNN['h100'].update({('pattern-like', '1x128'): (1.052, 2.81),
                      ('cluster-like', '1x128'): (0.829, 2.20),
                      ('mnist-like', '1x128'): (0.186, 0.543),
                      ('reddit-like-1/5', '1x128'): (16.4, None)})


def main(argv=None):
    p = argparse.ArgumentParser()
    p.add_argument('--graphs', default='cora-like,pubmed-like,mnist-like,'
                   'cluster-like,pattern-like')
    p.add_argument('--dtype', default='fp32')
    p.add_argument('--out', default=None)
    p.add_argument('--sweep', default='8:1,16:1,32:1,16:1:64',
                   help='SMMF rows:windows_per_block[:stage_KB] variants '
                   'timed (fwd only) besides the default; "" for none')
    args = p.parse_args(argv)
    from pyg_dfgnn.ops import cuda
    assert cuda.available()
    dev = torch.device('cuda')
    dtype = {'fp32': torch.float32, 'bf16': torch.bfloat16,
             'fp16': torch.float16}[args.dtype]
    fam = (gpu_family(dev) or 'h200').lower()
    fam = fam if fam in DFGNN else 'h200'
    timer = Timer(dev)
    rows, records = [], []
    for name in args.graphs.split(','):
        graph, _, n = make_dfgraph(name, dev)
        graph.csc()
        for shape, (h, f) in (('1x128', (1, 128)), ('4x32', (4, 32))):
            g = torch.Generator(device=dev).manual_seed(0)
            q, k, v = (torch.randn(n, h, f, device=dev, generator=g,
                                   dtype=dtype) for _ in range(3))
            q = q / f**0.5
            auto = graph.strategy(h)
            for strat in ('smmf', 'pmf') if auto == 'smmf' else ('pmf', ):
                sid = 0 if strat == 'smmf' else 1

                def fwd():
                    return torch.ops.pyg_dfgnn.fused_attention_fwd(
                        graph.rowptr, graph.col, 0, q, k, v, None, 1.0, 0.2,
                        sid, graph.max_in_degree)

                t_fwd = timer(fwd)
                qq, kk, vv = (t.detach().requires_grad_() for t in (q, k, v))
                go = torch.randn_like(v[:graph.num_dst])

                def fwd_bwd():
                    out = cuda.fused_attention_cuda(graph, 'dot', vv, qq, kk,
                                                    None, 1.0, 0.2,
                                                    strategy=strat)
                    torch.autograd.grad(out, (qq, kk, vv), go)

                try:
                    t_fb = timer(fwd_bwd)
                except RuntimeError as e:  # backward stub / failure
                    print('fwd+bwd failed:', str(e)[:120])
                    t_fb = float('nan')
                a_fwd, a_fb = DFGNN[fam].get((name, shape), (None, None))
                rec = dict(graph=name, shape=shape, strategy=strat,
                           auto=strat == auto, dtype=args.dtype,
                           fwd_ms=t_fwd, fwd_bwd_ms=t_fb, dfgnn_fwd_ms=a_fwd,
                           dfgnn_fwd_bwd_ms=a_fb, edges=graph.num_edges,
                           max_in_degree=graph.max_in_degree)
                records.append(rec)
                rows.append(
                    f'{name:13s} {shape:6s} {strat:4s}{"*" if rec["auto"] else " "} '
                    f'fwd {t_fwd:8.4f} ms  (DF-GNN {a_fwd or float("nan"):6.3f}, '
                    f'x{(a_fwd or float("nan")) / t_fwd:5.2f})  fwd+bwd '
                    f'{t_fb:8.4f} ms (DF-GNN {a_fb or float("nan"):6.3f})')
        del graph
        torch.cuda.empty_cache()
    sweep = [tuple(int(x) for x in v.split(':'))
             for v in args.sweep.split(',') if v]
    if sweep:
        srows = []
        for name in args.graphs.split(','):
            if name.startswith('reddit'):  # PMF graph: no SMMF sweep
                continue
            graph, _, n = make_dfgraph(name, dev)
            for shape, (h, f) in (('1x128', (1, 128)), ('4x32', (4, 32))):
                g = torch.Generator(device=dev).manual_seed(0)
                q, k, v = (torch.randn(n, h, f, device=dev, generator=g,
                                       dtype=dtype) for _ in range(3))
                line = f'{name:13s} {shape:6s}'
                for r, w, *kb in sweep:
                    os.environ['PYG_DFGNN_SMMF_ROWS'] = str(r)
                    os.environ['PYG_DFGNN_SMMF_WPB'] = str(w)
                    os.environ['PYG_DFGNN_SMMF_STAGE_KB'] = str(
                        kb[0] if kb else 0)
                    t = timer(lambda: torch.ops.pyg_dfgnn.fused_attention_fwd(
                        graph.rowptr, graph.col, 0, q, k, v, None, 1.0, 0.2,
                        0, graph.max_in_degree))
                    records.append(dict(graph=name, shape=shape,
                                        strategy=f'smmf r{r} w{w} s{kb}',
                                        dtype=args.dtype, fwd_ms=t))
                    line += f' {t:8.4f}'
                srows.append(line)
                for var in ('ROWS', 'WPB', 'STAGE_KB'):
                    os.environ.pop(f'PYG_DFGNN_SMMF_{var}')
            del graph
        print('\n== SMMF fwd ms by rows:windows_per_block[:stage_KB] '
              + ' '.join(':'.join(map(str, v)) for v in sweep))
        for line in srows:
            print(line)
    print(f'\n== forward strategies, {torch.cuda.get_device_name()} '
          f'({args.dtype}; * = auto pick; x = DF-GNN / ours)')
    for r in rows:
        print(r)
    if args.out:
        with open(args.out, 'w') as fh:
            json.dump(dict(device=torch.cuda.get_device_name(),
                           records=records), fh, indent=1)


if __name__ == '__main__':
    main()

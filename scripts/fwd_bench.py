"""Forward-kernel timings per strategy (SMMF / PMF) on the anchor graphs.

    python scripts/fwd_bench.py [--graphs pattern-like,...] [--dtype fp32]

Times the raw forward op (torch.ops.pyg_dfgnn.fused_attention_fwd), the
forward + backward ops called directly (as DF-GNN's kernels are timed; the
backward gets the variant's row windows and, but for `smmf-plain`, the
graph's column windows, so both of its passes stage like the forward) and
the user-facing op's fwd+bwd through autograd; 'dot' kind, Q pre-scaled,
H x F = 1x128 and 4x32 (`--shapes`). Variants: SMMF with graph-aligned staged windows
(`smmf`), SMMF without (`smmf-plain`), PMF, and the tensor-core windows
(`tc`; fp32 through 3xTF32; `tc-tf32`: fp32's opt-in 1xTF32 forward, the
rows / cols passes after it; `tc-tf32-bwd`: both TC passes in 1xTF32;
`tc-bwd`: the 3xTF32 TC backward where the plan takes the rows / cols
passes; `tc-fwd`, `tc-pair`, `smmf-tc-bwd`: fixed strategy ids, only when
`--variants` names them) where the graph has windows of <= 128
sources. Prints one row per (graph,
shape, variant) with the DF-GNN anchor of shared/anchors.md. Feeds
benchmarks/NOTES.md.
"""
import argparse
import json
import os
import sys

import torch

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path[:0] = [ROOT, os.path.join(ROOT, 'benchmarks'),
               os.path.join(ROOT, 'scripts')]
from kernel_times import make_graph_of  # noqa: E402

# Strategy ids by name, timed only when --variants names them: the TC
# forward with the rows / cols passes after it (3), both TC passes (2), the
# SMMF forward with the TC backward (4); fp32: 3xTF32 products.
FIXED_TC_VARIANTS = {'tc-fwd': 3, 'tc-pair': 2, 'smmf-tc-bwd': 4}
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
    p.add_argument('--shapes', default='1x128,4x32',
                   help='H x F pairs, e.g. 1x128,4x32,2x64,8x16')
    p.add_argument('--variants', default=None,
                   help='only these, e.g. smmf,tc-tf32,tc-tf32-bwd')
    p.add_argument('--out', default=None)
    args = p.parse_args(argv)
    keep = args.variants.split(',') if args.variants else []
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
        graph, _, n = make_graph_of(name, dev)  # (also batch-S-D, ...)
        colptr, csc_row, csc_perm = graph.csc()
        for shape in args.shapes.split(','):
            h, f = (int(x) for x in shape.split('x'))
            g = torch.Generator(device=dev).manual_seed(0)
            q, k, v = (torch.randn(n, h, f, device=dev, generator=g,
                                   dtype=dtype) for _ in range(3))
            q = q / f**0.5
            auto = graph.strategy(h)
            windows, span = graph.row_windows(
                cuda._stage_capacity('dot', q, v))
            col_windows, col_span = graph.col_windows(
                cuda._col_stage_capacity('dot', q, v))
            variants = [('smmf', 0, windows, span), ('smmf-plain', 0, None, 0),
                        ('pmf', 1, None, 0)]
            if auto != 'smmf':
                variants = variants[2:]
            if cuda._tc_takes('dot', q, v) and \
                    graph.max_in_degree <= cuda.TC_MAX_DEGREE:
                try:  # the op's own TC plan (2: the backward's TC too)
                    plan = cuda._plan(graph, 'dot', q, v, cuda.TC,
                                      backward=True)
                    variants.append(('tc', plan[0], plan[2], plan[3]))
                    if dtype == torch.float32:
                        # opt-in 1xTF32: the forward alone, both TC passes
                        variants.append(('tc-tf32', cuda.TC_TF32_STRATEGY,
                                         plan[2], plan[3]))
                        variants.append(('tc-tf32-bwd',
                                         cuda.TC_TF32_BWD_STRATEGY, plan[2],
                                         plan[3]))
                        if plan[0] == 3:  # the 3xTF32 TC backward too
                            variants.append(('tc-bwd', 2, plan[2], plan[3]))
                    # fixed strategy ids, when asked for by name (the
                    # automatic thresholds' comparisons in every dtype)
                    for strat, sid in FIXED_TC_VARIANTS.items():
                        if strat in keep:
                            variants.append((strat, sid, plan[2], plan[3]))
                except ValueError:  # no windows of <= 128 sources
                    pass
            if keep:
                variants = [x for x in variants if x[0] in keep]
            for strat, sid, win, stage in variants:
                cwin, cstage = (None, 0) if strat == 'smmf-plain' else (
                    col_windows, col_span)

                def fwd():
                    return torch.ops.pyg_dfgnn.fused_attention_fwd(
                        graph.rowptr, graph.col, 0, q, k, v, None, 1.0, 0.2,
                        sid, graph.max_in_degree, win, stage)

                t_fwd = timer(fwd)
                go = torch.randn_like(v[:graph.num_dst])

                def ops_fwd_bwd():  # the two ops, no autograd (as DF-GNN's)
                    _, lse, *_ = fwd()
                    torch.ops.pyg_dfgnn.fused_attention_bwd(
                        go, graph.rowptr, graph.col, colptr, csc_row,
                        csc_perm, 0, q, k, v, None, lse, 1.0, 0.2, win, stage,
                        cwin, cstage, graph.max_in_degree,
                        graph.max_out_degree, strategy=sid)

                t_ops = timer(ops_fwd_bwd)
                t_fb = float('nan')
                # (the strategies the public op can be asked for)
                if strat in ('smmf', 'pmf', 'tc'):
                    qq, kk, vv = (t.detach().requires_grad_()
                                  for t in (q, k, v))

                    def fwd_bwd():  # the user-facing op through autograd
                        out = cuda.fused_attention_cuda(
                            graph, 'dot', vv, qq, kk, None, 1.0, 0.2,
                            strategy=strat)
                        torch.autograd.grad(out, (qq, kk, vv), go)

                    t_fb = timer(fwd_bwd)
                a_fwd, a_fb = DFGNN[fam].get((name, shape), (None, None))
                is_auto = strat == auto
                rec = dict(graph=name, shape=shape, strategy=strat,
                           auto=is_auto, dtype=args.dtype, fwd_ms=t_fwd,
                           ops_fwd_bwd_ms=t_ops, fwd_bwd_ms=t_fb,
                           dfgnn_fwd_ms=a_fwd, dfgnn_fwd_bwd_ms=a_fb,
                           edges=graph.num_edges, stage_span=stage,
                           windows=0 if win is None else win.numel() - 1,
                           col_stage_span=cstage,
                           col_windows=0 if cwin is None else cwin.numel() - 1,
                           max_in_degree=graph.max_in_degree)
                records.append(rec)
                nan = float('nan')
                rows.append(
                    f'{name:13s} {shape:6s} {strat:10s}{"*" if is_auto else " "}'
                    f' fwd {t_fwd:7.4f} (DF-GNN {a_fwd or nan:6.3f}, '
                    f'x{(a_fwd or nan) / t_fwd:5.2f})  fwd+bwd ops '
                    f'{t_ops:7.4f} autograd {t_fb:7.4f} (DF-GNN '
                    f'{a_fb or nan:6.3f}, x{(a_fb or nan) / t_ops:5.2f})')
        del graph
        torch.cuda.empty_cache()
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

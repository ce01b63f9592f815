"""Run the SMMF forward and the backward once per case for `ncu`
(kernel-level profile); mode ``tc``: the tensor-core windows' forward and
backward (strategy 2); ``pmf``: PMF's forward and the backward without
windows.

    ncu --kernel-name regex:"smmf_fwd|bwd_kernel|tc_" --section ... \
        python scripts/profile_kernels.py [graph:HxF:staged|plain|tc|pmf[:dtype],...]
"""
import os
import sys

import torch

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path[:0] = [ROOT, os.path.join(ROOT, 'benchmarks')]
from graphs import make_dfgraph  # noqa: E402
from kernels import DTYPES  # noqa: E402


def main():
    from pyg_dfgnn.ops import cuda
    assert cuda.available()
    dev = torch.device('cuda')
    cases = sys.argv[1].split(',') if len(sys.argv) > 1 else [
        'pattern-like:1x128:staged', 'pattern-like:1x128:plain',
        'pubmed-like:1x128:plain']
    for case in cases:
        name, shape, mode, *dt = case.split(':')
        if mode not in ('staged', 'plain', 'tc', 'pmf'):
            raise SystemExit(f"{case}: mode must be staged, plain, tc or "
                             f"pmf (got '{mode}')")
        dtype = DTYPES[dt[0] if dt else 'fp32']
        h, f = (int(x) for x in shape.split('x'))
        graph, _, n = make_dfgraph(name, dev)
        q, k, v = (torch.randn(n, h, f, device=dev, dtype=dtype)
                   for _ in range(3))
        strategy = 1 if mode == 'pmf' else 0
        win, span, cwin, cspan = None, 0, None, 0  # plain / pmf
        if mode == 'tc':
            plan = cuda._plan(graph, 'dot', q, v, cuda.TC, backward=True)
            strategy = plan[0]
            win, span, cwin, cspan = plan[2:6]
        elif mode == 'staged':
            win, span = graph.row_windows(cuda._stage_capacity('dot', q, v))
            cwin, cspan = graph.col_windows(
                cuda._col_stage_capacity('dot', q, v))
        print(case, 'strategy', strategy, 'windows',
              None if win is None else win.numel() - 1, 'span', span,
              flush=True)
        _, lse, *_ = torch.ops.pyg_dfgnn.fused_attention_fwd(
            graph.rowptr, graph.col, 0, q, k, v, None, 1.0, 0.2, strategy,
            graph.max_in_degree, win, span)
        colptr, csc_row, csc_perm = graph.csc()
        torch.ops.pyg_dfgnn.fused_attention_bwd(
            torch.randn_like(v), graph.rowptr, graph.col, colptr, csc_row,
            csc_perm, 0, q, k, v, None, lse, 1.0, 0.2, win, span, cwin,
            cspan, graph.max_in_degree, graph.max_out_degree,
            strategy=strategy)
        torch.cuda.synchronize()


if __name__ == '__main__':
    main()

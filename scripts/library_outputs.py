"""Outputs and gradients of the fused op under the loaded library, saved
or compared bit for bit (a kernel change meant to keep results the same:
run once per library, PYG_DFGNN_LIBRARY pointing at each).

    PYG_DFGNN_LIBRARY=old.so python scripts/library_outputs.py CASES --save a.pt
    PYG_DFGNN_LIBRARY=new.so python scripts/library_outputs.py CASES --compare a.pt

CASES: graph:HxF:dtype:kind[:dropout],... as scripts/kernel_times.py.
"""
import argparse
import os
import sys

import torch

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path[:0] = [ROOT, os.path.join(ROOT, 'benchmarks'),
                os.path.join(ROOT, 'scripts')]
from kernel_times import case_inputs  # noqa: E402
from pyg_dfgnn.ops import fused_attention  # noqa: E402


def outputs(case: str) -> list:
    graph, kind, q, k, v, extra, g_out, p_drop, es = case_inputs(case,
                                                                  'cuda')
    torch.manual_seed(0)
    out = fused_attention(graph, kind, v, q, k, *extra, dropout=p_drop,
                          training=p_drop > 0, edge_score=es)
    grads = torch.autograd.grad(out, [v, q, k] + ([es] if es is not None
                                                  else []), g_out)
    return [t.detach().cpu() for t in (out, *grads)]


def main() -> int:
    p = argparse.ArgumentParser()
    p.add_argument('cases')
    p.add_argument('--save')
    p.add_argument('--compare')
    args = p.parse_args()
    results = {c: outputs(c) for c in args.cases.split(',')}
    if args.save:
        torch.save(results, args.save)
        return 0
    ref = torch.load(args.compare)
    differ = 0
    for case, tensors in results.items():
        same = [torch.equal(a, b) for a, b in zip(tensors, ref[case])]
        differ += not all(same)
        print(f'{case:36s} out / d v / d q / d k (/ d es) identical: '
              f'{same}')
    return 1 if differ else 0


if __name__ == '__main__':
    sys.exit(main())

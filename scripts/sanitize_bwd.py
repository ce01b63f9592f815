"""Small representative backward cases for compute-sanitizer.

    compute-sanitizer --tool memcheck  python scripts/sanitize_bwd.py
    compute-sanitizer --tool racecheck python scripts/sanitize_bwd.py
    ... scripts/sanitize_bwd.py tc       (the tensor-core cases only)

Covers every score kind, the plain and the staged (row / column windows of
batched small graphs) blocks of both passes, heavy owners (a super node),
empty rows/columns, the scalar (F = 17) and 16-byte (F = 32) layouts, fp32
and bf16, int32 and int64 indices; the tensor-core backward after the TC
and the SMMF forward; the short-owner passes (bwd_short_kernel.cuh, forced
with PYG_DFGNN_SHORT_ROWS=1). Build the kernels once beforehand
(outside the sanitizer) to keep the run short. Exits non-zero if a gradient
is off.
"""
import importlib.util
import os
import sys
from pathlib import Path
from unittest import mock

import torch

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
spec = importlib.util.spec_from_file_location(
    'test_backward_cuda', ROOT / 'tests' / 'test_backward_cuda.py')
tb = importlib.util.module_from_spec(spec)
spec.loader.exec_module(tb)

CASES = [
    # graph, n, kind, dtype, H, F, D, idx64, stage (max_nodes of the row /
    # column windows; None: plain blocks)
    ('batch', 120, 'dot', torch.float32, 2, 32, 32, False, None),
    ('batch', 120, 'dot', torch.float32, 2, 32, 32, False, 150),
    ('super', 300, 'dot', torch.float32, 1, 17, 17, True, None),
    ('isolated', 80, 'add', torch.bfloat16, 3, 32, 32, False, None),
    ('batch', 120, 'add', torch.bfloat16, 3, 17, 17, False, 150),
    ('batch', 120, 'gatv2', torch.float32, 2, 32, 32, False, None),
    ('batch', 120, 'gatv2', torch.bfloat16, 2, 32, 32, False, 150),
    ('super', 300, 'gatv2', torch.bfloat16, 1, 16, 16, False, None),
    # fp32 H * D = 128: the rows pass's key-row lanes
    ('batch', 120, 'dot', torch.float32, 4, 32, 32, False, 150),
    ('batch', 120, 'gatv2', torch.float32, 8, 16, 16, False, None),
    # ... in half precision the item groups below a mean in-degree of 16
    ('batch', 120, 'gatv2', torch.bfloat16, 1, 128, 128, False, 150),
    ('batch', 120, 'dot', torch.float16, 4, 32, 32, False, None),
    # ... and on dense graphs the rows pass's LANES kernels (half
    # precision; 'add' in every dtype), staged and in segments of a long
    # owner
    ('dense', 120, 'gatv2', torch.bfloat16, 1, 128, 128, False, 150),
    ('dense-super', 120, 'dot', torch.float16, 4, 32, 32, False, None),
    ('dense', 120, 'add', torch.float32, 8, 16, 16, False, 150),
    ('dense-super', 120, 'add', torch.bfloat16, 1, 128, 128, False, None),
    ('empty', 5, 'dot', torch.float32, 1, 8, 8, False, None),
]

# The short-owner passes (a warp per row / column; several owners per warp
# for bf16 1 x 128), forced on these small graphs.
SHORT_CASES = [
    ('batch', 120, 'dot', torch.float32, 1, 128, 128, False, None),
    ('batch', 120, 'dot', torch.bfloat16, 1, 128, 128, True, None),
    ('isolated', 80, 'add', torch.bfloat16, 3, 8, 8, False, None),
    ('empty', 5, 'dot', torch.float32, 2, 8, 8, False, None),
]


# Tensor-core backward (bwd_tc_kernel.cuh) on dense batches: strategy 'tc'
# (TC forward, sid 2) and the SMMF forward + TC backward (sid 4: picked
# without a strategy where only the backward pays; no D has that now, so
# the forward's D = 16 threshold is raised for it).
TC_CASES = [
    # strategy, dtype, H, D = F, graph sizes
    ('tc', torch.bfloat16, 2, 32, [100, 37, 1, 90]),
    ('tc', torch.float32, 1, 64, [128, 20]),
    ('tc', torch.float16, 1, 128, [64, 64]),
    # more heads: 4 x 32, 8 x 32, fp32 8 x 16
    ('tc', torch.bfloat16, 4, 32, [100, 37, 1, 90]),
    ('tc', torch.float16, 8, 32, [128, 20]),
    ('tc', torch.float32, 8, 16, [100, 37, 1, 90]),
    (None, torch.bfloat16, 3, 16, [100, 37, 1, 90]),
]


def tc_cases() -> int:
    sys.path.insert(0, str(ROOT / 'tests'))
    import test_tc_windows_cuda as tt
    from pyg_dfgnn.graph import DFGraph
    from pyg_dfgnn.ops import cuda
    bad = 0
    for i, (strategy, dtype, heads, dh, sizes) in enumerate(TC_CASES):
        g = torch.Generator().manual_seed(i)
        ei, n = tt.dense_batch(
            sizes, tt.rule_degree(cuda, cuda.TC_BWD_MIN_EDGES, dh, sizes) + 2,
            g)
        graph = DFGraph.from_edge_index(ei.cuda(), num_nodes=n)
        tag = f'{strategy} {dtype} H={heads} D={dh}'
        # (no strategy: only the backward pays -> strategy 4)
        raised = {dh: (1 << 20, 0)} if strategy is None else {}
        try:
            with mock.patch.dict(cuda.TC_FWD_MIN_EDGES, raised):
                tt.check(cuda, graph, *tt.inputs(n, heads, dh, dtype, g),
                         dtype, tag, strategy=strategy)
            print('ok ', 'tc-bwd', tag, flush=True)
        except AssertionError as e:
            bad += 1
            print('BAD', 'tc-bwd', tag, e, flush=True)
    # fp32 through the ops: 1xTF32 (strategy 6) and 3xTF32 (2) at D = 128
    # and 32 (H = 3 / 4, isolated rows, a one-node graph)
    for dh, one_tf32, heads in ((128, True, 3), (32, True, 3),
                                (128, False, 3), (32, True, 4)):
        tag = f'fp32 H={heads} D={dh} {"1xTF32" if one_tf32 else "3xTF32"}'
        try:
            tt.test_tc_fp32_backward_products(dh, one_tf32, heads)
            print('ok ', 'tc-bwd', tag, flush=True)
        except AssertionError as e:
            bad += 1
            print('BAD', 'tc-bwd', tag, e, flush=True)
    return bad


def main() -> int:
    bad = tc_cases()
    if sys.argv[1:] == ['tc']:  # the tensor-core cases only
        return 1 if bad else 0
    for i, (g, n, kind, dtype, H, F, D, idx64, stage) in \
            enumerate(CASES + SHORT_CASES):
        if i == len(CASES):
            os.environ['PYG_DFGNN_SHORT_ROWS'] = '1'
        errs = tb.run_case(g, n, kind, dtype, H, F, D, idx64=idx64, seed=1,
                           stage=stage)
        ok = all(e <= tb.TOL[dtype] for e in errs.values())
        bad += not ok
        print(f"{'ok ' if ok else 'BAD'} {g:9s} {kind:5s} {str(dtype):15s} "
              f"{'staged' if stage else 'short ' if i >= len(CASES) else 'plain ':6s} "
              f"H={H} F={F}: " +
              ' '.join(f'{k}={v:.1e}' for k, v in errs.items()))
    return 1 if bad else 0


if __name__ == '__main__':
    sys.exit(main())

"""Small representative backward cases for compute-sanitizer.

    compute-sanitizer --tool memcheck  python scripts/sanitize_bwd.py
    compute-sanitizer --tool racecheck python scripts/sanitize_bwd.py

Covers every score kind, the plain and the staged (row / column windows of
batched small graphs) blocks of both passes, heavy owners (a super node),
empty rows/columns, the scalar (F = 17) and 16-byte (F = 32) layouts, fp32
and bf16, int32 and int64 indices. Build the kernels once beforehand
(outside the sanitizer) to keep the run short. Exits non-zero if a gradient
is off.
"""
import importlib.util
import sys
from pathlib import Path

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
    ('empty', 5, 'dot', torch.float32, 1, 8, 8, False, None),
]


def main() -> int:
    bad = 0
    for g, n, kind, dtype, H, F, D, idx64, stage in CASES:
        errs = tb.run_case(g, n, kind, dtype, H, F, D, idx64=idx64, seed=1,
                           stage=stage)
        ok = all(e <= tb.TOL[dtype] for e in errs.values())
        bad += not ok
        print(f"{'ok ' if ok else 'BAD'} {g:9s} {kind:5s} {str(dtype):15s} "
              f"{'staged' if stage else 'plain ':6s} "
              f"H={H} F={F}: " +
              ' '.join(f'{k}={v:.1e}' for k, v in errs.items()))
    return 1 if bad else 0


if __name__ == '__main__':
    sys.exit(main())

"""Small representative forward cases for compute-sanitizer.

    compute-sanitizer --tool memcheck  python scripts/sanitize_cases.py
    compute-sanitizer --tool racecheck python scripts/sanitize_cases.py
    ... scripts/sanitize_cases.py tc       (the tensor-core cases only)

Every score kind x strategy (SMMF, PMF with multi-segment rows; tensor-core
windows for 'dot'; SMMF's short-row kernel, forced), the 16-byte
(F = 32) and scalar (F = 17) paths, fp32 and bf16, int32 and int64 indices,
empty rows and a super node. Build the kernels once beforehand (outside the
sanitizer). Exits non-zero if an output is off.
"""
import importlib.util
import os
import random
import sys
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
spec = importlib.util.spec_from_file_location(
    'test_kernels_cuda', ROOT / 'tests' / 'test_kernels_cuda.py')
tk = importlib.util.module_from_spec(spec)
spec.loader.exec_module(tk)

CASES = [
    # kind, dtype, strategy, graph, H, D, F, index dtype
    ('dot', torch.float32, 'smmf', 'batch', 2, 32, 32, None),
    ('dot', torch.bfloat16, 'pmf', 'super', 1, 17, 17, torch.int64),
    ('add', torch.float32, 'smmf', 'isolated', 3, 1, 17, None),
    ('add', torch.float16, 'pmf', 'super', 4, 1, 32, None),
    ('gatv2', torch.float32, 'pmf', 'bipartite', 2, 32, 32, None),
    ('gatv2', torch.bfloat16, 'smmf', 'super', 1, 8, 8, None),
    ('dot', torch.float32, 'smmf', 'empty', 2, 8, 8, None),
    # SMMF windows staging K / V in shared memory (batch graphs)
    ('add', torch.bfloat16, 'smmf', 'batch', 4, 1, 32, None),
    ('gatv2', torch.float32, 'smmf', 'batch', 3, 17, 17, None),
    ('dot', torch.float16, 'smmf', 'batch', 1, 128, 128, None),
    # fp32 H * D = 128: the SDDMM with lanes over the key row
    ('dot', torch.float32, 'smmf', 'batch', 4, 32, 32, None),
    ('gatv2', torch.float32, 'smmf', 'batch', 8, 16, 16, None),
    ('dot', torch.float32, 'smmf', 'super', 1, 128, 128, None),
    # ... in half precision the item groups below a mean in-degree of 16,
    # the LANES kernels (four features a lane: 8-byte reads) above it
    ('gatv2', torch.bfloat16, 'smmf', 'batch', 8, 16, 16, None),
    ('gatv2', torch.float16, 'smmf', 'super', 1, 128, 128, None),
    ('gatv2', torch.bfloat16, 'smmf', 'dense', 1, 128, 128, None),
    ('dot', torch.float16, 'smmf', 'dense', 4, 32, 32, None),
    # tensor-core windows (mma fragments, count matrix in shared memory)
    ('dot', torch.bfloat16, 'tc', 'batch', 3, 32, 32, None),
    ('dot', torch.float16, 'tc', 'batch', 1, 128, 128, None),
    ('dot', torch.float32, 'tc', 'batch', 2, 64, 64, None),
    # fp32 at D = 128: K and V of a head in turn in one buffer
    ('dot', torch.float32, 'tc', 'batch', 1, 128, 128, None),
    # more heads of small D
    ('dot', torch.bfloat16, 'tc', 'batch', 4, 32, 32, None),
    ('dot', torch.float32, 'tc', 'batch', 8, 16, 16, None),
]

# SMMF's short-row kernel (fwd_rows_kernel.cuh), forced on small graphs
SHORT_ROWS = [
    ('dot', torch.float32, 'smmf', 'tiny', 1, 128, 128, None),
    ('add', torch.bfloat16, 'smmf', 'tiny', 3, 1, 8, None),
    ('dot', torch.bfloat16, 'smmf', 'isolated', 1, 128, 128, None),
    ('dot', torch.float32, 'smmf', 'empty', 2, 8, 8, None),
]


def main() -> int:
    from pyg_dfgnn.ops import cuda
    assert cuda.available(), 'CUDA kernels unavailable'
    failed = 0
    cases = CASES + SHORT_ROWS
    if sys.argv[1:] == ['tc']:  # the tensor-core cases only
        cases = [c for c in CASES if c[2] == 'tc']
    for i, (kind, dtype, strategy, graph, heads, d, f, idx) in \
            enumerate(cases):
        if i == len(CASES):
            os.environ['PYG_DFGNN_SHORT_ROWS'] = '1'
        try:
            tk.run_case(cuda, random.Random(i), kind, dtype, strategy, graph,
                        heads, d, f, grad=False, index_dtype=idx)
            print('ok  ', kind, dtype, strategy, graph, flush=True)
        except AssertionError as e:
            failed += 1
            print('FAIL', kind, dtype, strategy, graph, e, flush=True)
    torch.cuda.synchronize()
    return 1 if failed else 0


if __name__ == '__main__':
    sys.exit(main())

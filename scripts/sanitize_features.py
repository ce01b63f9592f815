"""Training-feature cases for compute-sanitizer (forward and backward).

    compute-sanitizer --tool memcheck  python scripts/sanitize_features.py
    compute-sanitizer --tool racecheck python scripts/sanitize_features.py
    ... scripts/sanitize_features.py projection    (the cases of one prefix)

Edge terms of every kind (TransformerConv's shared key-value term too), the
attention weights with a gradient in a permuted order, and dropout (up to 36
heads), the SDDMMs with lanes over the key row (fp32 H * D = 128), in SMMF
(staged batch windows) and PMF (a super node), fp32 and bf16, scalar (F = 17)
and vector paths; the short-owner kernels with features (forced); the raw
edge attribute kernels and GATv2's projected edge keys. Cases from
tests/test_features_cuda.py and tests/test_edge_attr_cuda.py; exits non-zero
if one is off.
"""
import importlib.util
import os
import sys
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / 'tests'))
spec = importlib.util.spec_from_file_location(
    'test_features_cuda', ROOT / 'tests' / 'test_features_cuda.py')
tf = importlib.util.module_from_spec(spec)
spec.loader.exec_module(tf)
spec = importlib.util.spec_from_file_location(
    'test_edge_attr_cuda', ROOT / 'tests' / 'test_edge_attr_cuda.py')
te = importlib.util.module_from_spec(spec)
spec.loader.exec_module(te)

CASES = [  # kind, edge terms, dtype, strategy, graph
    ('add', 'es+ev', torch.float32, 'smmf', 'batch'),
    ('add', 'es', torch.bfloat16, 'pmf', 'super'),
    ('dot', 'kv', torch.float32, 'smmf', 'batch'),
    ('dot', 'ek+ev', torch.bfloat16, 'pmf', 'super'),
    ('dot', 'es+ev', torch.float32, 'smmf', 'batch'),
    ('dot', 'es', torch.bfloat16, 'pmf', 'super'),
    ('gatv2', 'ek+ev', torch.float32, 'pmf', 'uniform'),
    ('gatv2', 'ek', torch.bfloat16, 'smmf', 'batch'),
]
EDGE_ATTR = [  # raw edge attribute kernels: fill, graph, dtype, shared M
    ('mean', 'super', torch.float32, False),
    ('mean', 'super', torch.float32, True),
    ('const', 'random', torch.bfloat16, True),
    ('const', 'random', torch.bfloat16, False),
    ('none', 'one', torch.float32, True), ('add', 'empty', torch.float16, True),
    ('add', 'random', torch.float32, True)]
VECTOR_ROWS = [  # heads, D_e, fill, dtype, shared M: the lane-group
    # kernel (per-node M) and the edge-parallel ones (shared M)
    (4, 16, 'mean', torch.float32, False),
    (3, 12, 'const', torch.bfloat16, False),
    (8, 64, 'none', torch.float32, False),
    (8, 16, 'mean', torch.float32, True),
    (4, 128, 'const', torch.bfloat16, True),
    (1, 300, 'mean', torch.float32, True)]
PROJECTION = [  # GATv2's projected edge keys: fill, graph, dtype, D_e, H * F
    ('mean', 'super', torch.float32, 16, 128),
    ('const', 'random', torch.bfloat16, 5, 260),
    ('none', 'one', torch.float32, 3, 4),
    ('add', 'empty', torch.float16, 8, 64),
    ('add', 'random', torch.float32, 12, 36)]
DROPOUT = [  # kind, strategy, dtype, heads (36: beyond the bits per edge)
    ('add', 'smmf', torch.float32, 6), ('dot', 'pmf', torch.bfloat16, 2),
    ('gatv2', 'smmf', torch.float32, 36)]

KEY_ROW = [  # the SDDMMs with lanes over the key row: kind, H, D, graph, p
    ('dot', 4, 32, 'batch', 0.3), ('gatv2', 8, 16, 'super', 0.3),
    ('dot', 1, 128, 'isolated', 0.0)]


LINKED = [  # d edge_attr's two terms in one scatter: H, D_e, fill, graph
    (4, 16, 'none', 'super', torch.float32), (12, 16, 'mean', 'random',
                                              torch.bfloat16),
    (3, 5, 'add', 'super', torch.float32)]


def linked_case(*args):
    import pytest
    with pytest.MonkeyPatch.context() as mp:
        te.test_linked_terms_match_reference(*args, mp)


SHORT = [  # short-owner kernels with features: kind, dtype, dropout, graph
    ('add', torch.float32, 0.4, 'batch'),
    ('add', torch.float32, 0.0, 'batch'),  # (the edge score alone)
    ('dot', torch.bfloat16, 0.4, 'isolated'),
    ('dot', torch.float32, 0.0, 'uniform')]


def short_case(kind, dtype, dropout, graph_kind):
    """test_short_owner_kernels_with_features' check without its profiler
    (CUPTI beside the sanitizer)."""
    os.environ['PYG_DFGNN_SHORT_ROWS'] = '1'
    graph, t, gen = tf.short_owner_case(
        f'short{kind}{dtype}{dropout}{graph_kind}', kind, 'es', dtype,
        graph_kind)
    torch.manual_seed(5)
    tf.check_case(tf._cuda(), graph, kind, t, 'smmf', dtype, dropout, gen=gen)


def main() -> int:
    failed = 0
    runs = [(tf.test_edge_terms_and_weights, c[:4] + (c[4], ), ' '.join(
        map(str, c))) for c in CASES] + [
            (tf.test_dropout_uses_one_mask_forward_and_backward, c,
             'dropout ' + ' '.join(map(str, c))) for c in DROPOUT] + [
                 (tf.test_smmf_key_row_lanes, c,
                  'key row ' + ' '.join(map(str, c))) for c in KEY_ROW] + [
                 (te.test_dots_and_sums_match_reference, c,
                  'edge_attr ' + ' '.join(map(str, c))) for c in EDGE_ATTR] + [
                 (te.test_vector_rows_match_reference, c,
                  'edge_attr vector rows ' + ' '.join(map(str, c)))
                 for c in VECTOR_ROWS] + [
                 (linked_case, c, 'edge_attr linked ' + ' '.join(map(str, c)))
                 for c in LINKED] + [
                 (short_case, c,
                  'short ' + ' '.join(map(str, c))) for c in SHORT] + [
                 (te.check_projection, c + (i, ),
                  'projection ' + ' '.join(map(str, c)))
                 for i, c in enumerate(PROJECTION)]
    only = sys.argv[1] if len(sys.argv) > 1 else ''  # a name prefix
    for fn, args, name in runs:
        if not name.startswith(only):
            continue
        try:
            fn(*args)
            print('ok  ', name, flush=True)
        except AssertionError as e:
            failed += 1
            print('FAIL', name, e, flush=True)
        os.environ.pop('PYG_DFGNN_SHORT_ROWS', None)
    torch.cuda.synchronize()
    return 1 if failed else 0


if __name__ == '__main__':
    sys.exit(main())

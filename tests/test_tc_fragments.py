"""The tensor-core window kernels' fragment bookkeeping (staging order,
per-lane loads, mma fragment layouts of the PTX ISA, accumulators reused
as A fragments) mirrored in NumPy against dense attention
(scripts/tc_fragment_check.py): CPU, catches an index slip before a GPU
run does."""
import importlib.util
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def test_tc_fragment_bookkeeping():
    spec = importlib.util.spec_from_file_location(
        'tc_fragment_check', ROOT / 'scripts' / 'tc_fragment_check.py')
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    mod.main()


def test_tc_auto_plan_on_dense_dot_only(monkeypatch):
    """The tensor-core windows picked without being asked (ops/cuda.py,
    shapes, host bounds and the windows' count only): 'dot' with D = F the
    TC kernels take, multiplicities within a byte, rules of edges against
    rows and windows (tc_rule_degree). fp16 / bf16: TC forward (3, the rows
    / cols passes after it) from TC_FWD_MIN_EDGES[D], with the TC backward
    (2) from TC_BWD_MIN_EDGES[D], SMMF forward + TC backward (4) where only
    the backward pays, else none. fp32: TC forward (3) from
    TC_FWD_MIN_EDGES_FP32[D], its 3xTF32 TC backward behind it (2) from
    TC_BWD_MIN_EDGES_FP32[D]; under 1xTF32 products (one_tf32) the
    TC_TF32_* rules (_plan maps 3 / 2 to 5 / 6). Smaller windows need a
    higher mean degree."""
    import math

    import torch
    from pyg_dfgnn.graph import DFGraph
    from pyg_dfgnn.ops import cuda

    def graph(n, degree):  # a batch of two graphs of n / 2 nodes
        gen = torch.Generator().manual_seed(0)
        dst = torch.arange(n).repeat_interleave(degree)
        src = torch.randint(0, n // 2, (n * degree, ), generator=gen)
        src = src + (dst >= n // 2) * (n // 2)
        return DFGraph.from_edge_index(torch.stack([src, dst]), num_nodes=n)

    windows, _ = graph(64, 8).graph_row_windows(cuda.TC_MAX_SOURCES)
    rows = 64 / (windows.numel() - 1)

    def need(table, d, rows=rows):  # smallest whole degree meeting a rule
        return math.ceil(cuda.tc_rule_degree(table[d], rows))

    def qv(dtype, d=32, f=32, heads=2):
        return (torch.zeros(64, heads, d, dtype=dtype),
                torch.zeros(64, heads, f, dtype=dtype))

    def sid(g, *args, backward=True, kind='dot', one_tf32=False):
        plan = cuda._tc_auto_plan(g, kind, *args, backward, one_tf32)
        return None if plan is None else plan[0]

    for table in (cuda.TC_FWD_MIN_EDGES, cuda.TC_BWD_MIN_EDGES,
                  cuda.TC_FWD_MIN_EDGES_FP32, cuda.TC_TF32_FWD_MIN_EDGES):
        for d in (16, 32, 64, 128):  # (per_window >= 0)
            assert need(table, d, 32.0) >= need(table, d, 117.0), d
    for dtype in (torch.float16, torch.bfloat16):
        for d in (16, 32, 64, 128):
            args = qv(dtype, d, d, 128 // d)
            t_fwd = need(cuda.TC_FWD_MIN_EDGES, d)
            t_bwd = need(cuda.TC_BWD_MIN_EDGES, d)
            lo, hi = min(t_fwd, t_bwd), max(t_fwd, t_bwd)
            both, one, sparse = graph(64, hi), graph(64, lo), \
                graph(64, lo - 1)
            assert sid(both, *args) == 2
            assert sid(both, *args, backward=False) == 3
            assert sid(one, *args) == (2 if t_fwd == t_bwd else
                                       3 if t_fwd < t_bwd else 4)
            assert sid(one, *args, backward=False) == (
                3 if t_fwd == lo else None)
            assert sid(sparse, *args) is None
            assert sid(sparse, *args, backward=False) is None
            assert sid(both, *args, kind='add') is None
        dense = graph(64, need(cuda.TC_FWD_MIN_EDGES, 32) + 8)
        assert sid(dense, *qv(dtype, 32, 64)) is None
        assert sid(dense, *qv(dtype, 24, 24)) is None
    # where only the backward pays (a raised forward rule): SMMF forward +
    # TC backward with a backward, nothing without
    with monkeypatch.context() as m:
        m.setitem(cuda.TC_FWD_MIN_EDGES, 64, (1 << 20, 0))
        bwd_only = graph(64, need(cuda.TC_BWD_MIN_EDGES, 64))
        assert sid(bwd_only, *qv(torch.bfloat16, 64, 64, 2)) == 4
        assert sid(bwd_only, *qv(torch.bfloat16, 64, 64, 2),
                   backward=False) is None
    # fp32 (3xTF32): the TC forward from its own rule with the rows / cols
    # passes behind it; from a higher degree the 3xTF32 TC backward, never
    # without the TC forward
    for d in (16, 32, 64, 128):
        args = qv(torch.float32, d, d, 128 // d)
        t_fwd = need(cuda.TC_FWD_MIN_EDGES_FP32, d)
        t_bwd = need(cuda.TC_BWD_MIN_EDGES_FP32, d)
        assert t_fwd < t_bwd <= cuda.TC_MAX_DEGREE
        assert t_fwd > need(cuda.TC_FWD_MIN_EDGES, d)
        assert sid(graph(64, t_fwd - 1), *args, backward=False) is None
        assert sid(graph(64, t_fwd), *args) == 3
        assert sid(graph(64, t_fwd), *args, backward=False) == 3
        assert sid(graph(64, t_bwd - 1), *args) == 3
        assert sid(graph(64, t_bwd), *args) == 2
        assert sid(graph(64, t_fwd), *args, kind='add') is None
        assert sid(graph(64, t_fwd), *qv(torch.float64, d, d, 1)) is None
        with monkeypatch.context() as m:
            m.setitem(cuda.TC_FWD_MIN_EDGES_FP32, d, (1 << 20, 0))
            assert sid(graph(64, t_bwd), *args) is None
    # in-degree 300: a multiplicity could pass a byte
    assert sid(graph(64, cuda.TC_MAX_DEGREE + 45), *qv(torch.bfloat16)) \
        is None
    # fp32 with 1xTF32 products: the TC forward from its own rule, the TC
    # backward behind it; below 3xTF32's
    for d in (16, 32, 64, 128):
        args = qv(torch.float32, d, d, 128 // d)
        t_fwd = need(cuda.TC_TF32_FWD_MIN_EDGES, d)
        t_bwd = need(cuda.TC_TF32_BWD_MIN_EDGES, d)
        assert t_fwd < t_bwd and t_fwd < need(cuda.TC_FWD_MIN_EDGES_FP32, d)
        assert t_bwd < need(cuda.TC_BWD_MIN_EDGES_FP32, d)
        assert sid(graph(64, t_bwd), *args, one_tf32=True) == 2
        assert sid(graph(64, t_bwd), *args, backward=False,
                   one_tf32=True) == 3
        assert sid(graph(64, t_fwd), *args, one_tf32=True) == 3
        assert sid(graph(64, t_fwd), *args) is None  # (3xTF32's is higher)
        assert sid(graph(64, t_fwd - 1), *args, one_tf32=True) is None

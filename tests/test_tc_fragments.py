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
    shapes and host bounds only): 'dot' with D = F the TC kernels take,
    multiplicities within a byte. fp16 / bf16: TC forward (3, the rows /
    cols passes after it) from TC_FWD_MIN_MEAN_DEGREE[D], with the TC
    backward (2) from TC_BWD_MIN_MEAN_DEGREE[D]; SMMF forward + TC backward
    (4) where only the backward pays, else none. fp32: TC forward (3) from
    TC_FWD_MIN_MEAN_DEGREE_FP32[D], the TC backward only with 1xTF32
    products (2 behind the TC forward: _plan maps 3 / 2 to 5 / 6)."""
    import torch
    from pyg_dfgnn.graph import DFGraph
    from pyg_dfgnn.ops import cuda

    def graph(n, degree):  # a batch of two graphs of n / 2 nodes
        gen = torch.Generator().manual_seed(0)
        dst = torch.arange(n).repeat_interleave(degree)
        src = torch.randint(0, n // 2, (n * degree, ), generator=gen)
        src = src + (dst >= n // 2) * (n // 2)
        return DFGraph.from_edge_index(torch.stack([src, dst]), num_nodes=n)

    def qv(dtype, d=32, f=32, heads=2):
        return (torch.zeros(64, heads, d, dtype=dtype),
                torch.zeros(64, heads, f, dtype=dtype))

    def sid(g, *args, backward=True, kind='dot', one_tf32=False):
        plan = cuda._tc_auto_plan(g, kind, *args, backward, one_tf32)
        return None if plan is None else plan[0]

    fwd_dense = graph(64, cuda.TC_BWD_MIN_MEAN_DEGREE[32])
    for dtype in (torch.float16, torch.bfloat16):
        for d in (16, 32, 64, 128):
            args = qv(dtype, d, d, 128 // d)
            t_fwd, t_bwd = (cuda.TC_FWD_MIN_MEAN_DEGREE[d],
                            cuda.TC_BWD_MIN_MEAN_DEGREE[d])
            # (measured: the forward pays first at every D)
            assert t_fwd <= t_bwd, d
            both, fwd_only, sparse = (graph(64, t_bwd), graph(64, t_fwd),
                                      graph(64, t_fwd - 1))
            assert sid(both, *args) == 2
            assert sid(both, *args, backward=False) == 3
            assert sid(fwd_only, *args) == (2 if t_fwd == t_bwd else 3)
            assert sid(fwd_only, *args, backward=False) == 3
            assert sid(sparse, *args) is None
            assert sid(sparse, *args, backward=False) is None
            assert sid(both, *args, kind='add') is None
        assert sid(fwd_dense, *qv(dtype, 32, 64)) is None
        assert sid(fwd_dense, *qv(dtype, 24, 24)) is None
    # where only the backward pays (a raised forward threshold): SMMF
    # forward + TC backward with a backward, nothing without
    with monkeypatch.context() as m:
        m.setitem(cuda.TC_FWD_MIN_MEAN_DEGREE, 16, 1 << 20)
        bwd_only = graph(64, cuda.TC_BWD_MIN_MEAN_DEGREE[16])
        assert sid(bwd_only, *qv(torch.bfloat16, 16, 16, 8)) == 4
        assert sid(bwd_only, *qv(torch.bfloat16, 16, 16, 8),
                   backward=False) is None
    # fp32 (3xTF32): the TC forward from its own thresholds, with the rows /
    # cols passes behind it (no TC backward unasked)
    t_fp32 = cuda.TC_FWD_MIN_MEAN_DEGREE_FP32[32]
    assert t_fp32 > cuda.TC_BWD_MIN_MEAN_DEGREE[32]
    assert sid(fwd_dense, *qv(torch.float32)) is None
    fp32_dense = graph(64, t_fp32)
    assert sid(fp32_dense, *qv(torch.float32)) == 3
    assert sid(fp32_dense, *qv(torch.float32), backward=False) == 3
    assert sid(graph(64, t_fp32 - 1), *qv(torch.float32),
               backward=False) is None
    assert sid(fp32_dense, *qv(torch.float32), kind='add') is None
    assert sid(fp32_dense, *qv(torch.float64)) is None
    # in-degree 300: a multiplicity could pass a byte
    assert sid(graph(64, cuda.TC_MAX_DEGREE + 45), *qv(torch.bfloat16)) \
        is None
    # fp32 with 1xTF32 products (its windows own their sources: two
    # graphs): the TC forward from its own thresholds, the TC backward
    # behind it from TC_TF32_BWD_MIN_MEAN_DEGREE, D = 128 too; never alone
    for d in (32, 64, 128):
        args = qv(torch.float32, d, d, 1)
        t_fwd, t_bwd = (cuda.TC_TF32_FWD_MIN_MEAN_DEGREE[d],
                        cuda.TC_TF32_BWD_MIN_MEAN_DEGREE[d])
        assert t_fwd < t_bwd and t_fwd < cuda.TC_FWD_MIN_MEAN_DEGREE_FP32[d]
        both, fwd, none = (graph(64, t_bwd), graph(64, t_fwd),
                           graph(64, t_fwd - 1))
        assert sid(both, *args, one_tf32=True) == 2
        assert sid(both, *args, backward=False, one_tf32=True) == 3
        assert sid(fwd, *args, one_tf32=True) == 3
        assert sid(fwd, *args) is None  # (3xTF32's threshold is higher)
        assert sid(none, *args, one_tf32=True) is None
        assert sid(graph(64, cuda.TC_FWD_MIN_MEAN_DEGREE_FP32[d]), *args) == 3
    # D = 16: 3xTF32's forward threshold, no TC backward
    dense16 = graph(64, cuda.TC_FWD_MIN_MEAN_DEGREE_FP32[16])
    assert sid(dense16, *qv(torch.float32, 16, 16, 8), one_tf32=True) == 3

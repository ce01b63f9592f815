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


def test_tc_backward_pays_on_dense_half_precision_dot_only():
    """Strategy 4's rule (ops/cuda.py, shapes and host bounds only): fp16 /
    bf16 'dot' with D = F the TC kernels take, mean in-degree >= the
    threshold, multiplicities within a byte."""
    import torch
    from pyg_dfgnn.graph import DFGraph
    from pyg_dfgnn.ops import cuda

    def graph(n, degree):
        dst = torch.arange(n).repeat_interleave(degree)
        src = torch.randint(0, n, (n * degree, ),
                            generator=torch.Generator().manual_seed(0))
        return DFGraph.from_edge_index(torch.stack([src, dst]), num_nodes=n)

    t = cuda.TC_BWD_MIN_MEAN_DEGREE
    dense, sparse = graph(64, t), graph(64, t - 1)

    def qv(dtype, d=32, f=32, heads=2):
        return (torch.zeros(64, heads, d, dtype=dtype),
                torch.zeros(64, heads, f, dtype=dtype))

    for dtype in (torch.float16, torch.bfloat16):
        assert cuda._tc_backward_pays(dense, 'dot', *qv(dtype))
        assert not cuda._tc_backward_pays(sparse, 'dot', *qv(dtype))
        assert not cuda._tc_backward_pays(dense, 'dot', *qv(dtype, 32, 64))
        assert not cuda._tc_backward_pays(dense, 'dot', *qv(dtype, 24, 24))
        assert not cuda._tc_backward_pays(dense, 'add', *qv(dtype))
    assert not cuda._tc_backward_pays(dense, 'dot', *qv(torch.float32))
    # in-degree 300: a multiplicity could pass a byte
    assert not cuda._tc_backward_pays(graph(64, cuda.TC_MAX_DEGREE + 45),
                                      'dot', *qv(torch.bfloat16))

"""Linear layers of one input with one backward node (pyg_dfgnn/nn/conv/
linear_ops.py) against the layers: values, every gradient, unused outputs,
autocast dtypes, where the node is used; the convs that use it against
PyG's."""
import pytest
import torch
from torch_geometric.nn.dense.linear import Linear

from pyg_dfgnn.nn.conv import linear_ops

MANY = linear_ops.LINEARS_MIN_EDGES  # edges from which the node is used

DEVICES = ['cpu', pytest.param('cuda', marks=pytest.mark.cuda)]


def grads(outs, inputs, seed=0, retain=False):
    gen = torch.Generator().manual_seed(seed)
    ups = [torch.randn(o.shape, generator=gen, dtype=torch.float64).to(o)
           for o in outs]
    return torch.autograd.grad(outs, inputs, ups, allow_unused=True,
                               retain_graph=retain)


def layers(sizes, bias, dtype=torch.float64, device='cpu'):
    torch.manual_seed(1)
    return [Linear(16, out, bias=b).to(device, dtype)
            for out, b in zip(sizes, bias)]


@pytest.mark.parametrize('device', DEVICES)
@pytest.mark.parametrize('sizes,bias', [
    ((8, 8, 8, 8), (True,) * 4), ((5, 7), (True, False)), ((3,), (True,)),
    ((96, 96), (True, True))])  # 96: the GEMV column sums on CUDA
def test_linears_match_the_layers(sizes, bias, device):
    mods = layers(sizes, bias, device=device)
    x = torch.randn(9, 16, dtype=torch.float64, device=device,
                    requires_grad=True)
    got = linear_ops.linears(x, mods, MANY)
    want = tuple(m(x) for m in mods)
    params = [p for m in mods for p in m.parameters()]
    for a, b in zip(got, want):
        assert torch.allclose(a, b)
    for a, b in zip(grads(got, [x] + params), grads(want, [x] + params)):
        assert torch.allclose(a, b)
    assert len({o.grad_fn for o in got}) == 1 or len(mods) == 1


def test_linears_with_an_unused_output_and_no_input_grad():
    mods = layers((6, 4, 5), (True, True, False))
    x = torch.randn(7, 16, dtype=torch.float64, requires_grad=True)
    q, k, v = linear_ops.linears(x, mods, MANY)
    got = torch.autograd.grad((q.sum() + v.pow(2).sum()),
                              [x] + list(mods[0].parameters()) +
                              list(mods[1].parameters()), allow_unused=True)
    want = torch.autograd.grad((mods[0](x).sum() + mods[2](x).pow(2).sum()),
                               [x] + list(mods[0].parameters()) +
                               list(mods[1].parameters()), allow_unused=True)
    for a, b in zip(got, want):
        assert (a is None and b is None) or torch.allclose(a, b)
    # nothing flows back into x: the weights' gradients only
    x = torch.randn(7, 16, dtype=torch.float64)
    out = linear_ops.linears(x, mods[:2], MANY)
    d_w = torch.autograd.grad(out[1].sum(), mods[1].weight)[0]
    assert torch.allclose(d_w, x.sum(0).expand(4, 16))


def test_linears_run_lazy_layers_as_themselves():
    lazy = [Linear(-1, 4), Linear(-1, 3)]
    x = torch.randn(5, 6)
    out = linear_ops.linears(x, lazy, MANY)
    assert [o.shape for o in out] == [(5, 4), (5, 3)]
    assert all(m.weight.shape[1] == 6 for m in lazy)


def test_linears_under_autocast_cast_as_autocast_does():
    mods = layers((8, 8), (True, True), dtype=torch.float32)
    x = torch.randn(10, 16, requires_grad=True)
    with torch.autocast('cpu', dtype=torch.bfloat16):
        got = linear_ops.linears(x, mods, MANY)
        want = tuple(m(x) for m in mods)
    assert all(o.dtype == torch.bfloat16 for o in got)
    params = [p for m in mods for p in m.parameters()]
    g_got = grads(got, [x] + params)
    g_want = grads(want, [x] + params)
    for a, b, p in zip(g_got, g_want, [x] + params):
        assert a.dtype == p.dtype == torch.float32
        assert torch.allclose(a, b, rtol=2e-2, atol=2e-2)


def test_linears_keep_autograd_nodes_below_the_edge_bound():
    mods = layers((4, 4), (True, True))
    x = torch.randn(3, 16, dtype=torch.float64, requires_grad=True)
    few = linear_ops.linears(x, mods, MANY - 1)
    many = linear_ops.linears(x, mods, MANY)
    assert few[0].grad_fn is not few[1].grad_fn
    assert many[0].grad_fn is many[1].grad_fn


@pytest.mark.parametrize('device', DEVICES)
@pytest.mark.parametrize('width', [3, 128])
def test_column_sum_is_the_sum(device, width):
    g = torch.randn(1000, width, dtype=torch.float64, device=device)
    assert torch.allclose(linear_ops.column_sum(g), g.sum(0))
    assert linear_ops.column_sum(g[:0]).shape == (width,)


@pytest.mark.parametrize('device', DEVICES)
@pytest.mark.parametrize('rows,width', [(1000, 128), (7, 128), (0, 128),
                                        (50, 3)])
@pytest.mark.parametrize('gpu_bound', [True, False])
def test_add_bias_is_the_sum(device, rows, width, gpu_bound):
    """Values and both gradients of ``out + bias``; the GEMV form where it
    applies (a GPU-bound step, 64+ columns, a bias gradient asked for), a
    cached ones column reused and grown across row counts."""
    gen = torch.Generator().manual_seed(rows)
    out, bias = (torch.randn(*shape, generator=gen).to(device)
                 .requires_grad_() for shape in ((rows, width), (width,)))
    got = linear_ops.add_bias(out, bias, gpu_bound)
    want = out + bias
    assert torch.equal(got, want)
    up = torch.randn(rows, width, generator=gen).to(device)
    for a, b in zip(torch.autograd.grad(got, (out, bias), up),
                    torch.autograd.grad(want, (out, bias), up)):
        assert torch.allclose(a, b, rtol=1e-5, atol=1e-4)  # (sum orders)
    gemv = gpu_bound and rows > 0 and width >= 64
    assert ('Addmm' in got.grad_fn.name()) == gemv, got.grad_fn.name()
    assert linear_ops.add_bias(out, None, gpu_bound) is out
    with torch.no_grad():  # no bias gradient: the plain sum
        assert torch.equal(linear_ops.add_bias(out, bias, gpu_bound), want)


@pytest.mark.parametrize('device', DEVICES)
def test_gpu_bound_from_edge_bytes(device):
    """CUDA steps from GPU_BOUND_EDGE_BYTES (edges x row bytes), never on
    the CPU."""
    edges = linear_ops.GPU_BOUND_EDGE_BYTES // (128 * 4)
    fp32 = torch.empty(5, 1, 128, device=device)
    half = fp32.to(torch.bfloat16)
    cuda = device == 'cuda'
    assert linear_ops.gpu_bound(fp32, edges) == cuda
    assert not linear_ops.gpu_bound(fp32, edges - 1)
    assert not linear_ops.gpu_bound(half, edges)
    assert linear_ops.gpu_bound(half, 2 * edges) == cuda


@pytest.mark.cuda
def test_add_bias_under_autocast_promotes_as_pyg():
    """A half-precision ``out`` and a float32 bias give float32, as PyG's
    ``out + bias`` does under autocast."""
    out = torch.randn(300, 128, device='cuda', dtype=torch.bfloat16)
    bias = torch.randn(128, device='cuda', requires_grad=True)
    with torch.autocast('cuda', dtype=torch.bfloat16):
        got = linear_ops.add_bias(out, bias, True)
    assert got.dtype == torch.float32
    assert torch.equal(got, out + bias)


@pytest.mark.parametrize('device', DEVICES)
@pytest.mark.parametrize('conv,kwargs,bipartite', [
    ('TransformerConv', dict(heads=2), False),
    ('TransformerConv', dict(heads=2, beta=True), True),
    ('TransformerConv', dict(heads=3, concat=False, root_weight=False),
     False),
    ('TransformerConv', dict(heads=2, root_weight=False), True),
    ('GATv2Conv', dict(heads=2), False),
    ('GATv2Conv', dict(heads=2, share_weights=True), False)])
def test_convs_with_the_node_match_pyg(monkeypatch, conv, kwargs, bipartite,
                                      device):
    import torch_geometric.nn as pyg_nn

    import pyg_dfgnn.nn as df_nn
    monkeypatch.setattr(linear_ops, 'LINEARS_MIN_EDGES', 0)
    torch.manual_seed(0)
    dtype = torch.float64 if device == 'cpu' else torch.float32
    ref = getattr(pyg_nn, conv)(16, 80, **kwargs).to(device, dtype)
    ours = getattr(df_nn, 'DF' + conv)(16, 80, **kwargs).to(device, dtype)
    ours.load_state_dict(ref.state_dict())
    n = 12  # 80 channels: the bias gradients take the GEMV on CUDA
    ei = torch.randint(0, n, (2, 40), device=device)
    x = torch.randn(n, 16, dtype=dtype, device=device, requires_grad=True)
    inp = (x, torch.randn(n, 16, dtype=dtype, device=device,
                          requires_grad=True)) if bipartite else x
    leaves = list(inp) if bipartite else [x]
    got, want = ours(inp, ei), ref(inp, ei)
    tol = dict(rtol=1e-4, atol=1e-5) if dtype == torch.float32 else {}
    assert torch.allclose(got, want, **tol)
    g_got = grads([got], leaves + list(ours.parameters()))
    g_want = grads([want], leaves + list(ref.parameters()))
    for a, b in zip(g_got, g_want):
        assert (a is None) == (b is None)
        # a key bias's gradient is 0 up to rounding (softmax is shift-free)
        assert a is None or torch.allclose(a, b, **tol) or \
            b.abs().max() < 1e-4 * max(g.abs().max() for g in g_want
                                       if g is not None)

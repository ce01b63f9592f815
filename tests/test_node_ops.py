"""The convs' per-node pieces with lean backwards (pyg_dfgnn/nn/conv/
node_ops.py) against plain autograd: values and every gradient, float64
gradcheck on the CPU; on a GPU, that the convs' training step takes them
(and autocast keeps working)."""
import pytest
import torch
from torch_geometric.nn.dense.linear import Linear as PyGLinear

from pyg_dfgnn.nn.conv import node_ops


@pytest.mark.parametrize('shape', [(7, 5), (3, 4, 5), (0, 5)])
def test_linear_function_gradcheck(shape):
    gen = torch.Generator().manual_seed(0)
    x = torch.randn(*shape, generator=gen, dtype=torch.float64,
                    requires_grad=True)
    w = torch.randn(6, 5, generator=gen, dtype=torch.float64,
                    requires_grad=True)
    b = torch.randn(6, generator=gen, dtype=torch.float64,
                    requires_grad=True)
    assert torch.autograd.gradcheck(node_ops._Linear.apply, (x, w, b))
    out = node_ops._Linear.apply(x, w, b)
    assert torch.allclose(out, torch.nn.functional.linear(x, w, b))


def test_add_bias_function_gradcheck():
    gen = torch.Generator().manual_seed(1)
    x = torch.randn(9, 2, 4, generator=gen, dtype=torch.float64,
                    requires_grad=True)
    b = torch.randn(4, generator=gen, dtype=torch.float64,
                    requires_grad=True)
    assert torch.autograd.gradcheck(node_ops._AddBias.apply, (x, b))
    g = torch.randn(9, 2, 4, generator=gen, dtype=torch.float64)
    gb, = torch.autograd.grad(node_ops._AddBias.apply(x, b), b, g)
    assert torch.allclose(gb, g.sum((0, 1)))


@pytest.mark.parametrize('heads,channels,n', [(1, 8, 11), (3, 5, 7),
                                              (8, 2, 0)])
def test_node_scores_match_product_sum(heads, channels, n):
    gen = torch.Generator().manual_seed(2)
    x = torch.randn(n, heads, channels, generator=gen, dtype=torch.float64,
                    requires_grad=True)
    att = torch.randn(1, heads, channels, generator=gen,
                      dtype=torch.float64, requires_grad=True)
    got = node_ops.node_scores(x, att)
    want = (x * att).sum(-1)
    assert got.shape == (n, heads)
    assert torch.allclose(got, want)
    g = torch.randn(n, heads, generator=gen, dtype=torch.float64)
    for a, b in zip(torch.autograd.grad(got, (x, att), g),
                    torch.autograd.grad(want, (x, att), g)):
        assert torch.allclose(a, b)


def test_linear_falls_back_off_cuda_and_for_lazy_layers():
    lin = PyGLinear(-1, 4)
    x = torch.randn(3, 5)
    for _ in range(2):  # the lazy call initialises the layer, then a CPU one
        out = node_ops.linear(lin, x)
        assert out.shape == (3, 4)
        assert out.grad_fn.name() != '_LinearBackward'


@pytest.mark.cuda
@pytest.mark.parametrize('autocast', [False, True])
def test_linear_and_bias_on_cuda_match_autograd(autocast):
    if not torch.cuda.is_available():
        pytest.skip('no GPU')
    torch.manual_seed(0)
    lin = PyGLinear(32, 16).cuda()
    bias = torch.nn.Parameter(torch.randn(16, device='cuda'))
    x = torch.randn(1000, 32, device='cuda', requires_grad=True)
    g = torch.randn(1000, 16, device='cuda')
    with torch.autocast('cuda', dtype=torch.bfloat16, enabled=autocast):
        out = node_ops.add_bias(node_ops.linear(lin, x), bias)
        ref = lin(x) + bias
    assert out.grad_fn.name() == '_AddBiasBackward'
    assert out.grad_fn.next_functions[0][0].name() == '_LinearBackward'
    got = torch.autograd.grad(out, (x, lin.weight, lin.bias, bias), g)
    want = torch.autograd.grad(ref, (x, lin.weight, lin.bias, bias), g)
    tol = 2e-2 if autocast else 1e-5
    for a, b in zip(got, want):
        assert a.dtype == b.dtype
        assert (a - b).norm() <= tol * b.norm()

"""GAT's node terms as a GEMM (pyg_dfgnn/nn/conv/node_ops.py) against the
product-and-sum form: values and both gradients, every head layout."""
import pytest
import torch

from pyg_dfgnn.nn.conv import node_ops


@pytest.mark.parametrize('heads,channels,n', [(1, 8, 11), (3, 5, 7),
                                              (8, 2, 0)])
def test_node_scores_match_product_sum(heads, channels, n):
    gen = torch.Generator().manual_seed(2)
    x = torch.randn(n, heads, channels, generator=gen, dtype=torch.float64,
                    requires_grad=True)
    att = torch.randn(1, heads, channels, generator=gen,
                      dtype=torch.float64, requires_grad=True)
    got = node_ops.node_scores(x, att, 1.0)
    want = (x * att).sum(-1)
    assert got.shape == (n, heads)
    assert torch.allclose(got, want)
    g = torch.randn(n, heads, generator=gen, dtype=torch.float64)
    for a, b in zip(torch.autograd.grad(got, (x, att), g),
                    torch.autograd.grad(want, (x, att), g)):
        assert torch.allclose(a, b)


@pytest.mark.parametrize('dtype,degree,gemm', [
    (torch.float32, 2.0, True), (torch.bfloat16, 2.0, False),
    (torch.bfloat16, 40.0, True), (torch.float16, 15.9, False)])
def test_node_scores_form_by_dtype_and_density(dtype, degree, gemm):
    """Half precision keeps the product-and-sum form on sparse graphs."""
    x = torch.randn(6, 2, 4, dtype=dtype, requires_grad=True)
    att = torch.randn(1, 2, 4, dtype=dtype, requires_grad=True)
    out = node_ops.node_scores(x, att, degree)
    assert ('Mm' in out.grad_fn.name()) == gemm, out.grad_fn.name()
    want = (x.double() * att.double()).sum(-1)
    assert (out.double() - want).abs().max() <= 5e-2 * want.abs().max()


@pytest.mark.parametrize('heads,channels,n', [(1, 8, 11), (3, 5, 7),
                                              (8, 2, 0)])
def test_node_score_pair_matches_two_product_sums(heads, channels, n):
    """Both terms of one x by one GEMM: the values, d x (one accumulation
    instead of two) and both d att, every head layout."""
    gen = torch.Generator().manual_seed(3)
    x = torch.randn(n, heads, channels, generator=gen, dtype=torch.float64,
                    requires_grad=True)
    att_src, att_dst = (torch.randn(1, heads, channels, generator=gen,
                                    dtype=torch.float64, requires_grad=True)
                        for _ in range(2))
    src, dst = node_ops.node_score_pair(x, att_src, att_dst, 1.0, True)
    want_src, want_dst = (x * att_src).sum(-1), (x * att_dst).sum(-1)
    assert src.shape == dst.shape == (n, heads)
    assert torch.allclose(src, want_src) and torch.allclose(dst, want_dst)
    g_src, g_dst = (torch.randn(n, heads, generator=gen, dtype=torch.float64)
                    for _ in range(2))
    wrt = (x, att_src, att_dst)
    got = torch.autograd.grad((src, dst), wrt, (g_src, g_dst))
    want = torch.autograd.grad((want_src, want_dst), wrt, (g_src, g_dst))
    for a, b in zip(got, want):
        assert torch.allclose(a, b)
    if n:
        assert 'Split' in src.grad_fn.name()
        assert 'Mm' in src.grad_fn.next_functions[0][0].name()


@pytest.mark.parametrize('dtype,degree,gpu_bound', [
    (torch.bfloat16, 2.0, True), (torch.float32, 40.0, False)])
def test_node_score_pair_apart(dtype, degree, gpu_bound):
    """Two terms apart: sparse half precision (product-and-sum form) or a
    host-bound step (two GEMVs, fewer host ops than the pair)."""
    x = torch.randn(6, 2, 4, dtype=dtype, requires_grad=True)
    att_src, att_dst = torch.randn(2, 1, 2, 4, dtype=dtype)
    src, dst = node_ops.node_score_pair(x, att_src, att_dst, degree,
                                        gpu_bound)
    assert 'Split' not in src.grad_fn.name()
    assert torch.equal(src, node_ops.node_scores(x, att_src, degree))
    assert torch.equal(dst, node_ops.node_scores(x, att_dst, degree))

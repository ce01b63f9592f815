"""GPU tests of ``pyg_dfgnn::fused_attention``, the differentiable op whose
autograd runs in C++ (``kernels/autograd.cpp``): gradients only for the
inputs that require them, ``att`` absent or present, strided inputs, the
missing-CSC error, in-place edits of the result, no-grad and inference
calls, and agreement with the reference's gradients."""
import pytest
import torch

from pyg_dfgnn.graph import DFGraph
from pyg_dfgnn.ops.reference import fused_attention_reference

pytestmark = pytest.mark.cuda

KIND_IDS = {'dot': 0, 'add': 1, 'gatv2': 2}


def _cuda():
    from pyg_dfgnn.ops import cuda
    if not torch.cuda.is_available() or not cuda.available():
        pytest.skip('CUDA kernels unavailable')
    return cuda


def _graph(n: int = 60, e: int = 400, seed: int = 0) -> DFGraph:
    g = torch.Generator().manual_seed(seed)
    ei = torch.randint(0, n, (2, e), generator=g)
    return DFGraph.from_edge_index(ei.cuda(), num_nodes=n)


def _inputs(kind, n, heads=2, d=8, f=8, seed=0):
    g = torch.Generator().manual_seed(seed)

    def rnd(*shape):
        return torch.randn(*shape, generator=g).cuda()

    v = rnd(n, heads, f)
    if kind == 'add':
        return v, rnd(n, heads), rnd(n, heads), None
    att = rnd(heads, d) if kind == 'gatv2' else None
    return v, rnd(n, heads, d), rnd(n, heads, d), att


def _call(graph, kind, v, q, k, att, csc=True):
    colptr, csc_row, csc_perm = graph.csc() if csc else (None, None, None)
    return torch.ops.pyg_dfgnn.fused_attention(
        graph.rowptr, graph.col, colptr, csc_row, csc_perm, KIND_IDS[kind], q,
        k, v, att, 0.5, 0.2, 1, graph.max_in_degree, None, 0, None, 0)


@pytest.mark.parametrize('kind', ['dot', 'add', 'gatv2'])
@pytest.mark.parametrize('wanted', ['value', 'query', 'key', 'att', 'all'])
def test_grads_only_for_inputs_that_require_them(kind, wanted):
    _cuda()
    if wanted == 'att' and kind != 'gatv2':
        pytest.skip('only gatv2 has att')
    graph = _graph()
    names = ('value', 'query', 'key', 'att')
    tensors = dict(zip(names, _inputs(kind, graph.num_src)))
    for name, t in tensors.items():
        if t is not None and wanted in (name, 'all'):
            t.requires_grad_()
    out, lse, _ = _call(graph, kind, tensors['value'], tensors['query'],
                     tensors['key'], tensors['att'])
    assert out.requires_grad and not lse.requires_grad
    grad_out = torch.randn_like(out)
    out.backward(grad_out)
    ref_in = {n: (t.detach().double().requires_grad_(t.requires_grad)
                  if t is not None else None) for n, t in tensors.items()}
    ref, _ = fused_attention_reference(graph, kind, ref_in['value'],
                                       ref_in['query'], ref_in['key'],
                                       ref_in['att'], 0.5, 0.2)
    ref.backward(grad_out.double())
    for name, t in tensors.items():
        if t is None:
            continue
        if t.requires_grad:
            assert t.grad is not None, name
            torch.testing.assert_close(t.grad.double(), ref_in[name].grad,
                                       rtol=1e-4, atol=1e-5)
        else:
            assert t.grad is None, name


def test_strided_inputs_are_accepted():
    _cuda()
    graph = _graph()
    v, q, k, _ = _inputs('dot', graph.num_src)
    q_t = q.permute(2, 1, 0).contiguous().requires_grad_()  # [D, H, N]
    strided = q_t.permute(2, 1, 0)
    assert not strided.is_contiguous()
    out, _, _ = _call(graph, 'dot', v, strided, k, None)
    ref, _, _ = _call(graph, 'dot', v, q.requires_grad_(), k, None)
    torch.testing.assert_close(out, ref)
    out.sum().backward()
    ref.sum().backward()
    torch.testing.assert_close(q_t.grad.permute(2, 1, 0), q.grad)


def test_backward_without_csc_raises():
    _cuda()
    graph = _graph()
    v, q, k, _ = _inputs('dot', graph.num_src)
    out, _, _ = _call(graph, 'dot', v.requires_grad_(), q, k, None, csc=False)
    with pytest.raises(RuntimeError, match='no CSC was built'):
        out.sum().backward()


def test_in_place_edit_of_result_keeps_backward():
    # The backward reads only lse, not the output: the result is returned
    # as is (no copy) and editing it in place still gives the right
    # gradients (those of the reference through the same relu).
    _cuda()
    graph = _graph()
    v, q, k, _ = _inputs('dot', graph.num_src)
    v.requires_grad_()
    out, _, _ = _call(graph, 'dot', v, q, k, None)
    out.relu_()
    assert out._version > 0 and bool((out >= 0).all())
    (grad, ) = torch.autograd.grad(out.square().sum(), v)
    v64 = v.detach().double().requires_grad_()
    ref, _ = fused_attention_reference(graph, 'dot', v64, q.double(),
                                       k.double(), None, 0.5, 0.2)
    (expected, ) = torch.autograd.grad(ref.relu().square().sum(), v64)
    torch.testing.assert_close(grad.double(), expected, rtol=1e-4, atol=1e-5)


def test_no_grad_and_inference_calls_record_nothing():
    _cuda()
    graph = _graph()
    v, q, k, _ = _inputs('dot', graph.num_src)
    ref, _, _ = _call(graph, 'dot', v, q, k, None, csc=False)
    v.requires_grad_()
    with torch.no_grad():
        out, _, _ = _call(graph, 'dot', v, q, k, None, csc=False)
    assert out.grad_fn is None
    torch.testing.assert_close(out, ref)
    with torch.inference_mode():  # the op's CUDA kernel, below autograd
        out, _, _ = _call(graph, 'dot', v, q, k, None, csc=False)
    torch.testing.assert_close(out, ref)


def test_public_op_backward_matches_reference():
    cuda = _cuda()
    graph = _graph(seed=1)
    v, q, k, att = _inputs('gatv2', graph.num_src, seed=1)
    for t in (v, q, k, att):
        t.requires_grad_()
    out = cuda.fused_attention_cuda(graph, 'gatv2', v, q, k, att, 1.0, 0.2)
    grads = torch.autograd.grad(out.square().sum(), (v, q, k, att))
    ref, _ = fused_attention_reference(graph, 'gatv2', v, q, k, att, 1.0, 0.2)
    ref_grads = torch.autograd.grad(ref.square().sum(), (v, q, k, att))
    for a, b in zip(grads, ref_grads):  # fp32: relative error <= 1e-5
        assert ((a - b).norm() / b.norm()).item() <= 1e-5


@pytest.mark.parametrize('kind', ['dot', 'add', 'gatv2'])
def test_public_op_plans_col_windows_for_backward(kind):
    # a batch of small graphs: the plan gives both passes windows (built only
    # for the grad path) and the gradients still match the reference
    cuda = _cuda()
    g = torch.Generator().manual_seed(2)
    parts, off = [], 0
    for n in (40, 17, 60, 33, 25, 50):
        parts.append(torch.randint(0, n, (2, 6 * n), generator=g) + off)
        off += n
    graph = DFGraph.from_edge_index(torch.cat(parts, 1).cuda(), num_nodes=off)
    v, q, k, att = _inputs(kind, off, heads=2, d=16, f=16, seed=2)
    plan = cuda._plan(graph, kind, q, v, 'smmf')
    assert plan[4] is None and plan[5] == 0  # no backward: no col windows
    leaves = [t for t in (v, q, k, att) if t is not None]
    for t in leaves:
        t.requires_grad_()
    out = cuda.fused_attention_cuda(graph, kind, v, q, k, att, 0.5, 0.2,
                                    strategy='smmf')
    plan = cuda._plan(graph, kind, q, v, 'smmf', backward=True)
    assert plan[2] is not None and plan[4] is not None
    cols, span = graph.col_windows(cuda._col_stage_capacity(kind, q, v))
    assert plan[4] is cols and plan[5] == span > 0
    grads = torch.autograd.grad(out.square().sum(), leaves)
    ref, _ = fused_attention_reference(graph, kind, v, q, k, att, 0.5, 0.2)
    ref_grads = torch.autograd.grad(ref.square().sum(), leaves)
    for a, b in zip(grads, ref_grads):
        assert ((a - b).norm() / b.norm()).item() <= 1e-5


@pytest.mark.parametrize('kind', ['dot', 'add', 'gatv2'])
@pytest.mark.parametrize('dtype,heads,f', [
    (torch.float32, 8, 6), (torch.float32, 3, 7),
    (torch.bfloat16, 2, 12), (torch.float16, 4, 6)])
def test_heads_padded_to_vectors_match_the_reference(kind, dtype, heads, f):
    """The public op runs heads of a width that is no whole number of
    16-byte vectors zero-padded to one (cluster-gps's 8 x 6): output,
    attention weights, dropout's mask and gradients as the reference."""
    from pyg_dfgnn.ops import fused_attention, kernel_width
    _cuda()
    assert kernel_width(f, dtype) > f  # the padded path is what runs
    graph = _graph(n=90, e=900, seed=3)
    ins = [t if t is None else t.to(dtype).requires_grad_()
           for t in _inputs(kind, graph.num_src, heads, f, f, seed=4)]
    v, q, k, att = ins
    scale = f**-0.5 if kind == 'dot' else 1.0
    perm = torch.randperm(graph.num_edges, device='cuda')
    out, alpha = fused_attention(graph, kind, v, q, k, att, scale=scale,
                                 return_attention=True, attention_perm=perm)
    assert out.shape == (graph.num_dst, heads, f) and out.dtype == dtype
    grad = torch.randn_like(out)
    leaves = [t for t in ins if t is not None]
    got = torch.autograd.grad((out, alpha), leaves,
                              (grad, torch.ones_like(alpha)))
    ref_in = [t if t is None else t.detach().double().requires_grad_()
              for t in ins]
    ref, ref_alpha = fused_attention_reference(graph, kind, *ref_in, scale,
                                               0.2)
    ref_alpha = ref_alpha.new_empty(ref_alpha.shape).index_copy(0, perm,
                                                                ref_alpha)
    want = torch.autograd.grad(
        (ref, ref_alpha), [t for t in ref_in if t is not None],
        (grad.double(), torch.ones_like(ref_alpha)))
    tol = dict(rtol=1e-4, atol=1e-5) if dtype == torch.float32 else \
        dict(rtol=3e-2, atol=3e-2)
    torch.testing.assert_close(out.double(), ref, **tol)
    torch.testing.assert_close(alpha.double(), ref_alpha, **tol)
    for g, w in zip(got, want):
        assert g.shape == w.shape
        torch.testing.assert_close(g.double(), w, **tol)
    # dropout: the mask is per (edge, head), the same as the unpadded
    # heads' (the scalar rows, called directly)
    torch.manual_seed(7)
    a = fused_attention(graph, kind, v, q, k, att, scale=scale, dropout=0.5,
                        training=True, return_attention=True)[1]
    torch.manual_seed(7)
    b = _cuda().fused_attention_cuda(graph, kind, v, q, k, att, scale, 0.2,
                                     dropout=0.5, attention='after_dropout')[1]
    assert torch.equal(a == 0, b == 0) and (a == 0).any()
    torch.testing.assert_close(a.double(), b.double(), **tol)

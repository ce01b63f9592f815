"""The reference fused op (CPU path of fused_attention): gradients, equality
with a plain PyG-utils implementation, edge cases and input checks."""
import pytest
import torch
import torch.nn.functional as F
from torch_geometric.utils import scatter, softmax

from pyg_dfgnn import DFGraph, fused_attention

KINDS = ['dot', 'add', 'gatv2']


def random_graph(n_src, n_dst, e, seed=0, empty_rows=()):
    gen = torch.Generator().manual_seed(seed)
    ei = torch.stack([torch.randint(0, n_src, (e, ), generator=gen),
                      torch.randint(0, n_dst, (e, ), generator=gen)])
    for i in empty_rows:  # move their edges to destination 0
        ei[1, ei[1] == i] = 0
    return ei


def make_inputs(kind, n_src, n_dst, e, heads=2, d=3, f=4, edge=True,
                dtype=torch.float64, seed=0, requires_grad=False):
    gen = torch.Generator().manual_seed(seed)

    def rnd(*shape):
        t = torch.randn(*shape, generator=gen, dtype=dtype)
        return t.requires_grad_(requires_grad)

    inp = {'value': rnd(n_src, heads, f)}
    if kind == 'add':
        inp['query'], inp['key'] = rnd(n_dst, heads), rnd(n_src, heads)
        if edge:
            inp['edge_score'] = rnd(e, heads)
    else:
        inp['query'], inp['key'] = rnd(n_dst, heads, d), rnd(n_src, heads, d)
        if kind == 'gatv2':
            inp['att'] = rnd(heads, d)
        if edge:
            inp['edge_key'] = rnd(e, heads, d)
            if kind == 'dot':
                inp['edge_score'] = rnd(e, heads)
    if edge:
        inp['edge_value'] = rnd(e, heads, f)
    return inp


def pyg_attention(edge_index, n_dst, kind, value, query, key, att=None,
                  scale=1.0, negative_slope=0.2, edge_score=None,
                  edge_key=None, edge_value=None):
    """Straightforward message passing with torch_geometric.utils, in the
    input edge order."""
    src, dst = edge_index
    if kind == 'dot':
        k = key[src] if edge_key is None else key[src] + edge_key
        s = (query[dst] * k).sum(-1) * scale
        if edge_score is not None:
            s = s + edge_score
    elif kind == 'add':
        s = query[dst] + key[src]
        if edge_score is not None:
            s = s + edge_score
        s = F.leaky_relu(s, negative_slope)
    else:
        z = query[dst] + key[src]
        if edge_key is not None:
            z = z + edge_key
        s = (F.leaky_relu(z, negative_slope) * att).sum(-1)
    alpha = softmax(s, dst, num_nodes=n_dst)
    msg = value[src] if edge_value is None else value[src] + edge_value
    out = scatter(msg * alpha.unsqueeze(-1), dst, 0, dim_size=n_dst,
                  reduce='sum')
    return out, alpha


def to_csr_order(graph, inp):
    """Edge tensors of `inp` (input order) in the graph's CSR order."""
    out = dict(inp)
    if graph.perm is not None:
        for key in ('edge_score', 'edge_key', 'edge_value'):
            if key in out:
                out[key] = out[key][graph.perm.long()]
    return out


@pytest.mark.parametrize('kind', KINDS)
@pytest.mark.parametrize('edge', [False, True])
@pytest.mark.parametrize('n_src,n_dst,e', [(9, 9, 40), (6, 11, 30),
                                           (40, 25, 300)])
def test_equals_pyg_utils(kind, edge, n_src, n_dst, e):
    ei = random_graph(n_src, n_dst, e, seed=n_src + e, empty_rows=(1, 3))
    graph = DFGraph.from_edge_index(ei, size=(n_src, n_dst))
    inp = make_inputs(kind, n_src, n_dst, e, edge=edge, seed=e)
    kw = dict(scale=0.7, negative_slope=0.1)
    ref_out, ref_alpha = pyg_attention(ei, n_dst, kind, **inp, **kw)
    out, alpha = fused_attention(graph, kind, **to_csr_order(graph, inp),
                                 **kw, return_attention=True)
    torch.testing.assert_close(out, ref_out, rtol=1e-12, atol=1e-12)
    torch.testing.assert_close(alpha, ref_alpha[graph.perm.long()],
                               rtol=1e-12, atol=1e-12)
    # Empty rows give exactly zero; other rows' weights sum to one.
    assert bool((out[[1, 3]] == 0).all())
    sums = torch.zeros(n_dst, alpha.size(1), dtype=alpha.dtype).index_add(
        0, graph.row, alpha)
    nonempty = graph.in_degree > 0
    torch.testing.assert_close(sums[nonempty], torch.ones_like(
        sums[nonempty]))
    # Without return_attention only the output comes back.
    out2 = fused_attention(graph, kind, **to_csr_order(graph, inp), **kw)
    assert torch.equal(out2, out)


def test_equals_pyg_utils_in_float32():
    ei = random_graph(30, 30, 200, seed=1)
    graph = DFGraph.from_edge_index(ei, num_nodes=30)
    for kind in KINDS:
        inp = make_inputs(kind, 30, 30, 200, dtype=torch.float32)
        ref_out, _ = pyg_attention(ei, 30, kind, **inp)
        out = fused_attention(graph, kind, **to_csr_order(graph, inp))
        assert out.dtype == torch.float32
        torch.testing.assert_close(out, ref_out, rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize('kind', KINDS)
@pytest.mark.parametrize('edge', [False, True])
def test_gradcheck(kind, edge):
    n_src, n_dst, e = 5, 6, 16
    ei = random_graph(n_src, n_dst, e, seed=2, empty_rows=(4, ))
    graph = DFGraph.from_edge_index(ei, size=(n_src, n_dst))
    inp = make_inputs(kind, n_src, n_dst, e, heads=2, d=3, f=2, edge=edge,
                      seed=3, requires_grad=True)
    names = list(inp)

    def fn(*tensors):
        return fused_attention(graph, kind, **dict(zip(names, tensors)),
                               scale=0.6, negative_slope=0.2)

    assert torch.autograd.gradcheck(fn, tuple(inp.values()))


def test_gradients_equal_pyg_utils():
    ei = random_graph(12, 10, 50, seed=4, empty_rows=(2, ))
    graph = DFGraph.from_edge_index(ei, size=(12, 10))
    for kind in KINDS:
        inp = make_inputs(kind, 12, 10, 50, seed=5, requires_grad=True)
        grad = torch.randn(10, 2, 4, dtype=torch.float64)
        ref_out, _ = pyg_attention(ei, 10, kind, **inp)
        ref_grads = torch.autograd.grad(ref_out, list(inp.values()), grad)
        out = fused_attention(graph, kind, **to_csr_order(graph, inp))
        grads = torch.autograd.grad(out, list(inp.values()), grad)
        for name, g, rg in zip(inp, grads, ref_grads):
            torch.testing.assert_close(g, rg, rtol=1e-10, atol=1e-12,
                                       msg=f'{kind}: grad of {name}')


@pytest.mark.parametrize('kind', KINDS)
def test_no_edges(kind):
    for n_src, n_dst in [(4, 6), (1, 1), (0, 3)]:
        graph = DFGraph.from_edge_index(torch.empty(2, 0, dtype=torch.long),
                                        size=(n_src, n_dst))
        inp = make_inputs(kind, n_src, n_dst, 0, requires_grad=True)
        out, alpha = fused_attention(graph, kind, **inp,
                                     return_attention=True)
        assert out.shape == (n_dst, 2, 4) and bool((out == 0).all())
        assert alpha.shape == (0, 2)
        out.sum().backward()
        if n_src:
            assert bool((inp['value'].grad == 0).all())


@pytest.mark.parametrize('kind', KINDS)
def test_single_node_with_self_loop(kind):
    graph = DFGraph.from_edge_index(torch.tensor([[0], [0]]), num_nodes=1)
    inp = make_inputs(kind, 1, 1, 1)
    out, alpha = fused_attention(graph, kind, **inp, return_attention=True)
    # One in-edge: weight 1, output = its message.
    torch.testing.assert_close(alpha, torch.ones(1, 2, dtype=torch.float64))
    torch.testing.assert_close(out, inp['value'] + inp['edge_value'])


def test_dropout_applies_to_attention():
    ei = random_graph(20, 20, 120, seed=6)
    graph = DFGraph.from_edge_index(ei, num_nodes=20)
    inp = make_inputs('dot', 20, 20, 120, edge=False)
    plain = fused_attention(graph, 'dot', **inp)
    # Inactive outside training.
    assert torch.equal(fused_attention(graph, 'dot', **inp, dropout=0.5),
                       plain)
    torch.manual_seed(0)
    out, alpha = fused_attention(graph, 'dot', **inp, dropout=0.5,
                                 training=True, return_attention=True)
    dropped = alpha == 0
    assert 0.2 < float(dropped.double().mean()) < 0.8
    # The output is aggregated with the returned (dropped) weights.
    msg = inp['value'][graph.col.long()] * alpha.unsqueeze(-1)
    want = torch.zeros_like(out).index_add(0, graph.row, msg)
    torch.testing.assert_close(out, want)


def _base(kind='dot'):
    ei = random_graph(5, 4, 12, seed=7)
    graph = DFGraph.from_edge_index(ei, size=(5, 4))
    return graph, make_inputs(kind, 5, 4, 12, edge=False)


@pytest.mark.parametrize('kind,change,err,match', [
    ('dot', {'value': torch.zeros(5, 2, 4, dtype=torch.long)}, TypeError,
     "'value' must be floating"),
    ('dot', {'value': torch.zeros(5, 8, dtype=torch.float64)}, ValueError,
     r"'value' must have shape \[N_src, H, F\]"),
    ('dot', {'value': torch.zeros(6, 2, 4, dtype=torch.float64)}, ValueError,
     "'value' has 6 source nodes"),
    ('dot', {'value': torch.zeros(5, 2, 4, device='meta')}, ValueError,
     "'graph' is on cpu but 'value' is on meta"),
    ('dot', {'query': torch.zeros(4, 2, 3)}, TypeError,
     "'query' has dtype torch.float32"),
    ('dot', {'query': [[0.0]]}, TypeError, "'query' must be a Tensor"),
    ('dot', {'query': torch.zeros(3, 2, 3, dtype=torch.float64)}, ValueError,
     r"'query' must have shape \[4, 2, 3\]"),
    ('dot', {'key': torch.zeros(5, 2, 2, dtype=torch.float64)}, ValueError,
     r"'key' must have shape \[5, 2, 3\]"),
    ('dot', {'key': torch.zeros(5, 2, 3, dtype=torch.float64,
                                device='meta')}, ValueError,
     "'key' is on meta"),
    ('add', {'query': torch.zeros(4, 3, dtype=torch.float64)}, ValueError,
     r"'query' must have shape \[4, 2\]"),
    ('gatv2', {'att': None}, ValueError, "needs 'att'"),
    ('gatv2', {'att': torch.zeros(2, 4, dtype=torch.float64)}, ValueError,
     r"'att' must have shape \[2, 3\]"),
    ('gatv2', {'edge_score': torch.zeros(12, 2, dtype=torch.float64),
               'att': torch.zeros(2, 3, dtype=torch.float64)},
     ValueError, "'edge_score' is not used by kind 'gatv2'"),
    ('add', {'edge_score': torch.zeros(11, 2, dtype=torch.float64)},
     ValueError, r"'edge_score' must have shape \[12, 2\]"),
    ('add', {'edge_key': torch.zeros(12, 2, 3, dtype=torch.float64)},
     ValueError, "'edge_key' is not used by kind 'add'"),
    ('gatv2', {'edge_key': torch.zeros(12, 2, 2, dtype=torch.float64)},
     ValueError, r"'edge_key' must have shape \[12, 2, 3\]"),
    ('dot', {'edge_value': torch.zeros(12, 2, 3, dtype=torch.float64)},
     ValueError, r"'edge_value' must have shape \[12, 2, 4\]"),
    ('dot', {'edge_value': torch.zeros(12, 2, 4)}, TypeError,
     "'edge_value' has dtype torch.float32"),
    ('dot', {'kind': 'mul'}, ValueError, "'kind' must be one of"),
    ('dot', {'dropout': 1.5}, ValueError, r"'dropout' must be in \[0, 1\]"),
    ('dot', {'dropout': -0.1}, ValueError, "'dropout' must be in"),
    ('dot', {'graph': torch.tensor([[0], [0]])}, TypeError,
     "'graph' must be a DFGraph"),
])
def test_check_inputs_errors(kind, change, err, match):
    graph, inp = _base(kind)
    args = dict(graph=graph, kind=kind, **inp)
    args.update(change)
    if args.get('att', 0) is None:
        del args['att']
    with pytest.raises(err, match=match):
        fused_attention(**args)


def test_stale_graph_is_rejected():
    ei = random_graph(5, 5, 12, seed=8)
    graph = DFGraph.from_edge_index(ei, num_nodes=5)
    inp = make_inputs('dot', 5, 5, 12, edge=False)
    fused_attention(graph, 'dot', **inp)
    ei[0, 0] = (ei[0, 0] + 1) % 5
    with pytest.raises(ValueError, match='stale'):
        fused_attention(graph, 'dot', **inp)


def test_kernel_width_pads_heads_to_vectors_by_at_most_a_third():
    from pyg_dfgnn.ops import kernel_width
    f32, bf16 = torch.float32, torch.bfloat16
    assert [kernel_width(f, f32) for f in (1, 2, 3, 5, 6, 7, 9, 10, 16)] == \
        [1, 2, 4, 5, 8, 8, 12, 12, 16]
    assert [kernel_width(f, bf16) for f in (6, 10, 12, 20, 64)] == \
        [8, 10, 16, 24, 64]
    assert kernel_width(6, torch.float64) == 6  # (no fp64 kernels)

"""GAT's edge term formed inside the short-row kernels from the raw edge
attributes (kernels/ops.h, EdgeProj; pyg_dfgnn.ops.cuda.projection_fused)
against the float64 reference (GPU only): output and every gradient (query,
key, value, edge_attr, the folded matrix) for each self-loop fill, graph
kind (random, super node, no edges, one node), dtype and several head
shapes (H = 3, De < F, two rows per warp in half precision); outputs
poisoned first. The path is asserted to be taken (and not where it must
not be), and GATConv with edge_dim against PyG with copied weights."""
import random
import zlib

import pytest
import torch

from pyg_dfgnn.ops import cuda as _cuda
from pyg_dfgnn.ops import fused_attention
from test_edge_attr_cuda import CASES, TOL, check_conv_against_pyg, map_case
from test_kernels_cuda import poison_allocator, rel_err

pytestmark = pytest.mark.cuda

# (H, F, De): one row per warp, H = 3 (an idle head group of lanes),
# De < F, one head; in half precision F = 16 is two lanes a head and H = 8
# two rows per warp.
SHAPES = {torch.float32: [(8, 16, 16), (3, 8, 4), (1, 32, 8), (4, 16, 8)],
          torch.float16: [(8, 16, 16), (3, 16, 8), (2, 32, 24)],
          torch.bfloat16: [(8, 16, 16), (3, 16, 8), (1, 8, 8)]}


@pytest.fixture
def taken(monkeypatch):
    """Counts the calls that took the projected path."""
    calls = []
    original = _cuda._edge_attr_score_call

    def spy(*args, **kwargs):
        out = original(*args, **kwargs)
        calls.append(out is not None)
        return out

    monkeypatch.setattr(_cuda, '_edge_attr_score_call', spy)
    return calls


def projected_case(fill, kind, dtype, heads, f_out, dim, seed):
    """-> (inputs on the GPU in ``dtype``, their float64 copies, the graph,
    the map (and its float64 twin), the generator)"""
    ei, n, loops, fill_value, structure, gen = map_case(fill, kind, seed)

    def rnd(*shape, scale=1.0):
        return (torch.randn(*shape, generator=gen) * scale).to('cuda', dtype)

    edge_attr = rnd(ei.size(1), dim)
    emap = structure.edge_attr_map(ei, edge_attr, fill_value)
    assert emap is not None
    inputs = dict(value=rnd(n, heads, f_out), query=rnd(n, heads),
                  key=rnd(n, heads), edge_attr=edge_attr,
                  mat=rnd(heads, dim, scale=0.5))
    for t in inputs.values():
        t.requires_grad_()
    inputs64 = {k: v.detach().double().requires_grad_()
                for k, v in inputs.items()}
    emap64 = emap if emap.fill_row is None else \
        type(emap)(**{**emap.__dict__, 'fill_row': emap.fill_row.double()})
    return inputs, inputs64, structure.graph, emap, emap64, gen


def run(graph, emap, t):
    return fused_attention(graph, 'add', t['value'], t['query'], t['key'],
                           negative_slope=0.2,
                           edge_attr_score=(emap, t['edge_attr'], t['mat']))


@pytest.mark.parametrize('fill,kind,dtype', CASES)
def test_projected_edge_score_matches_reference(fill, kind, dtype, taken,
                                                monkeypatch):
    _cuda.available()
    # (every graph on the short rows, super nodes too: the rule is tested
    # below)
    monkeypatch.setenv('PYG_DFGNN_SHORT_ROWS', '1')
    seed = zlib.crc32(f'proj{fill}{kind}{dtype}'.encode())
    heads, f_out, dim = random.Random(seed).choice(SHAPES[dtype])
    inputs, inputs64, graph, emap, emap64, gen = projected_case(
        fill, kind, dtype, heads, f_out, dim, seed)
    poison_allocator()
    out = run(graph, emap, inputs)
    ref = run(graph, emap64, inputs64)  # (float64: the reference)
    assert taken[0]
    assert out.shape == ref.shape and torch.isfinite(out).all()
    assert rel_err(out, ref) <= TOL[dtype]
    g = torch.randn(out.shape, generator=gen).to(out)
    names = list(inputs)
    got = torch.autograd.grad((out * g).sum(), [inputs[k] for k in names])
    want = torch.autograd.grad((ref * g.double()).sum(),
                               [inputs64[k] for k in names],
                               allow_unused=True)
    for name, a, b, t in zip(names, got, want, inputs64.values()):
        b = torch.zeros_like(t) if b is None else b
        assert a.shape == b.shape and torch.isfinite(a).all(), name
        assert rel_err(a, b, floor=1e-3) <= 2 * TOL[dtype], name
    if fill != 'none' and inputs['edge_attr'].size(0) > 0:
        # the removed input self-loop reads nothing: zero gradient
        assert bool((got[names.index('edge_attr')][0] == 0).all())


@pytest.mark.parametrize('dtype', [torch.float32, torch.bfloat16])
def test_projected_edge_score_is_deterministic(dtype, taken):
    _cuda.available()
    inputs, _, graph, emap, _, gen = projected_case(
        'mean', 'random', dtype, 8, 16, 16, 7)
    runs = []
    for _ in range(2):
        out = run(graph, emap, inputs)
        runs.append((out,) + torch.autograd.grad(out.square().sum(),
                                                 list(inputs.values())))
    assert taken == [True, True]
    for a, b in zip(*runs):
        assert torch.equal(a, b)


def test_projected_path_only_where_the_kernels_take_it(taken, monkeypatch):
    """Shapes the short rows cannot take fall back to the [E, H] score (and
    still match): De not a multiple of the vector width, De > F, dropout,
    the block kernels by the rule."""
    _cuda.available()
    cases = [(8, 16, 6, {}), (2, 8, 16, {}), (8, 16, 16, dict(dropout=0.3)),
             (8, 16, 16, dict(rows='0'))]
    for heads, f_out, dim, opts in cases:
        taken.clear()
        if 'rows' in opts:
            monkeypatch.setenv('PYG_DFGNN_SHORT_ROWS', opts['rows'])
        inputs, inputs64, graph, emap, emap64, _ = projected_case(
            'mean', 'random', torch.float32, heads, f_out, dim, 3)
        p = opts.get('dropout', 0.0)
        out = fused_attention(
            graph, 'add', inputs['value'], inputs['query'], inputs['key'],
            dropout=p, training=True,
            edge_attr_score=(emap, inputs['edge_attr'], inputs['mat']))
        assert taken[0] is False, (heads, f_out, dim, opts)
        if p == 0:
            assert rel_err(out, run(graph, emap64, inputs64)) <= 1e-5
        monkeypatch.delenv('PYG_DFGNN_SHORT_ROWS', raising=False)


@pytest.mark.parametrize('kwargs', [
    dict(heads=8, edge_dim=16), dict(heads=4, edge_dim=8, fill_value='add'),
    dict(heads=2, edge_dim=4, fill_value=0.3, concat=False),
    dict(heads=3, edge_dim=8, add_self_loops=False)])
@pytest.mark.parametrize('dtype', [torch.float32, torch.bfloat16])
def test_gat_with_projected_edge_term_matches_pyg(kwargs, dtype, taken):
    """DFGATConv(edge_dim) takes the projected path (F = 16 channels a head)
    and matches PyG's GATConv: output and every gradient. The attention
    weights asked for by the check keep the [E, H] score; a call without
    them takes the projection."""
    check_conv_against_pyg('GATConv', 'DFGATConv', kwargs, dtype, 16)
    import pyg_dfgnn.nn as df_nn
    torch.manual_seed(1)
    n = 120
    ei = torch.randint(0, n, (2, 900), device='cuda')
    x = torch.randn(n, 24, device='cuda')
    ea = torch.randn(ei.size(1), kwargs['edge_dim'], device='cuda')
    conv = df_nn.DFGATConv(24, 16, **kwargs).cuda()
    taken.clear()
    with torch.autocast('cuda', dtype, enabled=dtype != torch.float32):
        conv(x, ei, ea).float().sum().backward()
    assert taken == [kwargs['edge_dim'] % (4 if dtype == torch.float32
                                          else 8) == 0]

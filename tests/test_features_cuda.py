"""The fused kernels' training features against the reference (GPU only):
edge terms (score / key / value, TransformerConv's shared key-value term),
attention weights (before / after dropout, in a given edge order, with their
own gradient) and attention dropout (keep rate, the backward's regenerated
mask, seeding, CUDA graph replays), in both strategies and every dtype.

The reference runs in float64 on the same (rounded) inputs; a dropout case
takes the kernels' own mask (read off the weights they return after dropout)
so that outputs and gradients are compared exactly.
"""
import math
import random
import zlib

import pytest
import torch

from pyg_dfgnn.graph import DFGraph
from pyg_dfgnn.ops.reference import fused_attention_reference
from test_kernels_cuda import (poison_allocator, random_graph, rel_err,
                               template_args)

pytestmark = pytest.mark.cuda

TOL_OUT = {torch.float32: 2e-5, torch.float16: 1e-2, torch.bfloat16: 1e-2}
TOL_GRAD = {torch.float32: 1e-4, torch.float16: 2e-2, torch.bfloat16: 2e-2}
# kind -> the edge terms of a case: es (score), ek (key), ev (value), kv (one
# tensor as key and value: TransformerConv's [E, H, F] way), es+ev (its way
# from raw edge attributes: a score term, weights into the message)
EDGE_TERMS = {'add': ('es', 'es+ev'),
              'dot': ('ek', 'ev', 'kv', 'ek+ev', 'es', 'es+ev'),
              'gatv2': ('ek', 'ek+ev')}



def smmf_level(name: str) -> int:
    """The training-feature level (FEAT) of an smmf_fwd_kernel<T, KIND,
    VEC, FEAT, LANES> profiler name."""
    return int(template_args(name)[3])


def bwd_kernel_level(name: str) -> int:
    """FEAT of a bwd_kernel<T, I, KIND, VEC, COLS, FEAT, LEAN, ...> name."""
    return int(template_args(name)[5])


def short_kernel_level(name: str) -> int:
    """FEAT of a short-owner kernel's name: rows_fwd_kernel /
    short_rows_bwd_kernel / short_cols_bwd_kernel<T, I, KIND, VW, NV, FEAT,
    WALK>."""
    return int(template_args(name)[5])

def _cuda():
    from pyg_dfgnn.ops import cuda
    if not torch.cuda.is_available() or not cuda.available():
        pytest.skip('CUDA kernels unavailable')
    return cuda


def make_case(kind, terms, graph, heads, d, f, dtype, gen):
    def rnd(*shape, s=1.0):
        x = torch.randn(*shape, generator=gen) * s
        return x.to('cuda', dtype).requires_grad_()

    n_src, n_dst, e = graph.num_src, graph.num_dst, graph.num_edges
    t = dict(value=rnd(n_src, heads, f))
    if kind == 'add':
        t['query'], t['key'] = rnd(n_dst, heads), rnd(n_src, heads)
    else:
        t['query'], t['key'] = rnd(n_dst, heads, d), rnd(n_src, heads, d)
        if kind == 'gatv2':
            t['att'] = rnd(heads, d, s=d**-0.5)
    parts = terms.split('+')
    if 'es' in parts:
        t['edge_score'] = rnd(e, heads)
    if 'ek' in parts:
        t['edge_key'] = rnd(e, heads, d)
    if 'ev' in parts:
        t['edge_value'] = rnd(e, heads, f)
    if 'kv' in parts:
        t['edge_key'] = t['edge_value'] = rnd(e, heads, d)
    return t


def fused(cuda, graph, kind, t, strategy, dropout=0.0, attention=None,
          perm=None):
    return cuda.fused_attention_cuda(
        graph, kind, t['value'], t['query'], t['key'], t.get('att'), 0.7,
        0.2, strategy, edge_score=t.get('edge_score'),
        edge_key=t.get('edge_key'), edge_value=t.get('edge_value'),
        dropout=dropout, attention=attention, attention_perm=perm)


def reference(graph, kind, t, dropout=0.0, mask=None, dropped=True):
    t64 = {k: v.detach().double().requires_grad_() for k, v in t.items()}
    if t.get('edge_key') is not None and t.get('edge_key') is \
            t.get('edge_value'):
        t64['edge_value'] = t64['edge_key']
    out, alpha = fused_attention_reference(
        graph, kind, t64['value'], t64['query'], t64['key'], t64.get('att'),
        0.7, 0.2, t64.get('edge_score'), t64.get('edge_key'),
        t64.get('edge_value'), dropout, mask is not None,
        attention_dropped=dropped, dropout_mask=mask)
    return out, alpha, t64


def grads_of(loss, tensors):
    names = [k for k in tensors if not (k == 'edge_value' and tensors.get(
        'edge_key') is tensors['edge_value'])]
    gs = torch.autograd.grad(loss, [tensors[k] for k in names],
                             allow_unused=True)
    return {k: (torch.zeros_like(tensors[k]) if g is None else g)
            for k, g in zip(names, gs)}


def assert_grads_close(got, ref, dtype):
    """Every gradient in ``got`` against the float64 reference's."""
    for name, g in got.items():
        err = rel_err(g, ref[name])
        assert err <= TOL_GRAD[dtype], f'{name}: rel. err {err:.2e}'


def cuda_kernels(fn):
    """``(fn(), the CUDA kernels it ran)``: names up to their argument
    lists (the template arguments say which instantiation ran)."""
    with torch.profiler.profile(
            activities=[torch.profiler.ProfilerActivity.CUDA]) as prof:
        result = fn()
        torch.cuda.synchronize()
    return result, [e.name.split('(')[0] for e in prof.events()]


def check_case(cuda, graph, kind, t, strategy, dtype, dropout=0.0,
               dropped=True, gen=None):
    """Fused out / alpha / all gradients vs float64 reference; returns the
    kernels' keep mask (CSR order) when dropout > 0."""
    e, heads = graph.num_edges, t['value'].shape[1]
    perm = torch.randperm(e, generator=gen).cuda()
    attention = 'after_dropout' if dropped else 'before_dropout'
    poison_allocator()
    out, alpha = fused(cuda, graph, kind, t, strategy, dropout, attention,
                       perm)
    assert torch.isfinite(out).all() and torch.isfinite(alpha).all()
    alpha_csr = alpha.index_select(0, perm)
    mask = None
    if dropout > 0:
        if dropped:
            mask = alpha_csr != 0
        else:  # the weights before dropout do not show the mask
            raise ValueError('dropout cases return the dropped weights')
    ref_out, ref_alpha, t64 = reference(graph, kind, t, dropout, mask,
                                        dropped)
    assert rel_err(out, ref_out) <= TOL_OUT[dtype]
    assert rel_err(alpha_csr, ref_alpha) <= TOL_OUT[dtype]
    g_out = torch.randn(out.shape, generator=gen).to(out)
    g_alpha = torch.randn(alpha.shape, generator=gen).to(alpha)
    got = grads_of((out * g_out).sum() + (alpha * g_alpha).sum(), t)
    ref = grads_of((ref_out * g_out.double()).sum() + (
        ref_alpha * g_alpha.index_select(0, perm).double()).sum(), t64)
    for name, g in got.items():
        assert torch.isfinite(g).all(), name
    assert_grads_close(got, ref, dtype)
    return mask


CASES = []
for kind, terms_list in EDGE_TERMS.items():
    for terms in terms_list:
        for dtype in (torch.float32, torch.float16, torch.bfloat16):
            for strategy in ('smmf', 'pmf'):
                CASES.append((kind, terms, dtype, strategy))


@pytest.mark.parametrize('kind,terms,dtype,strategy', CASES)
@pytest.mark.parametrize('graph_kind', ['uniform', 'batch', 'super',
                                        'isolated', 'empty'])
def test_edge_terms_and_weights(kind, terms, dtype, strategy, graph_kind):
    cuda = _cuda()
    seed = zlib.crc32(f'{kind}{terms}{dtype}{strategy}{graph_kind}'.encode())
    rng = random.Random(seed)
    gen = torch.Generator().manual_seed(seed)
    ei, size = random_graph(graph_kind, rng)
    graph = DFGraph.from_edge_index(ei.cuda(), size=size)
    heads = rng.choice((1, 3, 4))
    f = rng.choice((3, 8, 17, 32))
    d = f if kind == 'gatv2' or 'kv' in terms else rng.choice((8, 17, 32))
    t = make_case(kind, terms, graph, heads, d, f, dtype, gen)
    check_case(cuda, graph, kind, t, strategy, dtype,
               dropped=rng.random() < 0.5, gen=gen)


@pytest.mark.parametrize('kind', ['dot', 'gatv2'])
@pytest.mark.parametrize('heads,d', [(1, 128), (2, 64), (4, 32), (8, 16)])
@pytest.mark.parametrize('graph_kind', ['batch', 'super', 'isolated'])
@pytest.mark.parametrize('dropout', [0.0, 0.3])
def test_smmf_key_row_lanes(kind, heads, d, graph_kind, dropout):
    """fp32 rows of H * D = 128 (one vector per lane): the SMMF forward's
    SDDMM with lanes over the key row and eight edges per transposing sum
    -- rows of any length (not a multiple of 8, empty, a super node), every
    edge term, the weights and dropout -- against the reference."""
    cuda = _cuda()
    seed = zlib.crc32(f'{kind}{heads}{graph_kind}{dropout}'.encode())
    gen = torch.Generator().manual_seed(seed)
    ei, size = random_graph(graph_kind, random.Random(seed))
    graph = DFGraph.from_edge_index(ei.cuda(), size=size)
    for terms in EDGE_TERMS[kind]:
        t = make_case(kind, terms, graph, heads, d, d, torch.float32, gen)
        torch.manual_seed(seed)
        check_case(cuda, graph, kind, t, 'smmf', torch.float32,
                   dropout=dropout, gen=gen)


@pytest.mark.parametrize('kind', ['add', 'dot', 'gatv2'])
@pytest.mark.parametrize('strategy', ['smmf', 'pmf'])
@pytest.mark.parametrize('dtype', [torch.float32, torch.bfloat16])
@pytest.mark.parametrize('heads', [2, 6, 36])
def test_dropout_uses_one_mask_forward_and_backward(kind, strategy, dtype,
                                                    heads):
    """Out and every gradient equal the reference run with the mask the
    forward drew (read off its returned weights): the backward regenerated
    the same mask. Edge terms on, graph with a super node. Heads: one quad
    of Philox words, a partial second quad, and more heads than the
    backward's per-edge dropout bits hold (kDropBitHeads = 32)."""
    cuda = _cuda()
    gen = torch.Generator().manual_seed(7)
    ei, size = random_graph('super', random.Random(3))
    graph = DFGraph.from_edge_index(ei.cuda(), size=size)
    terms = EDGE_TERMS[kind][-1]
    t = make_case(kind, terms, graph, heads, 16, 16, dtype, gen)
    torch.manual_seed(0)
    mask = check_case(cuda, graph, kind, t, strategy, dtype, dropout=0.4,
                      gen=gen)
    assert 0 < mask.float().mean() < 1


def test_dropout_keep_rate_per_head():
    cuda = _cuda()
    n, deg, heads, p = 4000, 12, 4, 0.3
    src = torch.randint(0, n, (n * deg, ))
    dst = torch.arange(n).repeat_interleave(deg)
    graph = DFGraph.from_edge_index(torch.stack([src, dst]).cuda(),
                                    size=(n, n))
    gen = torch.Generator().manual_seed(1)
    t = make_case('add', 'es', graph, heads, 1, 8, torch.float32, gen)
    with torch.no_grad():
        _, alpha = fused(cuda, graph, 'add', t, None, p, 'after_dropout')
    e = graph.num_edges
    sigma = math.sqrt(p * (1 - p) / e)
    kept = (alpha != 0).float().mean(0)
    assert ((kept - (1 - p)).abs() <= 3 * sigma).all(), kept.tolist()
    # kept weights are scaled by 1 / (1 - p)
    _, plain = fused(cuda, graph, 'add', t, None, 0.0, 'after_dropout')
    keep = alpha != 0
    assert torch.allclose(alpha[keep], plain.detach()[keep] / (1 - p),
                          rtol=1e-5, atol=1e-7)


def test_dropout_seeding_and_strategies():
    """torch.manual_seed reproduces a run (outputs and gradients), another
    seed draws another mask, SMMF and PMF draw the same mask."""
    cuda = _cuda()
    ei, size = random_graph('batch', random.Random(5))
    graph = DFGraph.from_edge_index(ei.cuda(), size=size)
    gen = torch.Generator().manual_seed(2)
    t = make_case('dot', 'kv', graph, 2, 16, 16, torch.float32, gen)

    def run(seed, strategy='smmf'):
        torch.manual_seed(seed)
        out, alpha = fused(cuda, graph, 'dot', t, strategy, 0.5,
                           'after_dropout')
        g = torch.autograd.grad(out.square().sum(), [t['query'],
                                                     t['edge_key']])
        return alpha.detach(), out.detach(), g

    a1, o1, g1 = run(11)
    a2, o2, g2 = run(11)
    a3, _, _ = run(12)
    a4, o4, _ = run(11, 'pmf')
    assert torch.equal(a1, a2) and torch.equal(o1, o2)
    assert all(torch.equal(x, y) for x, y in zip(g1, g2))
    assert not torch.equal(a1 != 0, a3 != 0)
    assert torch.equal(a1 != 0, a4 != 0)
    assert rel_err(o4, o1) <= 1e-5


def test_dropout_under_cuda_graph_replay():
    """A captured forward draws a new mask at each replay (the generator's
    graph-safe offset), and each replay's output matches its own mask."""
    cuda = _cuda()
    ei, size = random_graph('uniform', random.Random(9))
    graph = DFGraph.from_edge_index(ei.cuda(), size=size)
    gen = torch.Generator().manual_seed(3)
    t = make_case('add', 'es', graph, 2, 1, 8, torch.float32, gen)
    t = {k: v.detach() for k, v in t.items()}
    fused(cuda, graph, 'add', t, None, 0.5, 'after_dropout')  # warm up
    torch.cuda.synchronize()
    cg = torch.cuda.CUDAGraph()
    with torch.cuda.graph(cg):
        out, alpha = fused(cuda, graph, 'add', t, None, 0.5,
                           'after_dropout')
    masks = []
    for _ in range(2):
        cg.replay()
        torch.cuda.synchronize()
        mask = alpha != 0
        ref, _, _ = reference(graph, 'add', t, 0.5, mask)
        assert rel_err(out, ref) <= TOL_OUT[torch.float32]
        masks.append(mask.clone())
    assert not torch.equal(masks[0], masks[1])


def test_weights_only_gradient():
    """A loss of the returned weights alone (the output unused)."""
    cuda = _cuda()
    ei, size = random_graph('uniform', random.Random(4))
    graph = DFGraph.from_edge_index(ei.cuda(), size=size)
    gen = torch.Generator().manual_seed(4)
    t = make_case('gatv2', 'ek', graph, 3, 8, 8, torch.float32, gen)
    _, alpha = fused(cuda, graph, 'gatv2', t, None, 0.0, 'before_dropout')
    got = grads_of(alpha.square().sum(), t)
    _, ref_alpha, t64 = reference(graph, 'gatv2', t, dropped=False)
    ref = grads_of(ref_alpha.square().sum(), t64)
    for name, g in got.items():
        assert rel_err(g, ref[name]) <= 1e-4, name


def check_edge_conv_level(conv, kind, level, seed, attention=None,
                          bwd_level=None):
    """A training step of ``conv`` (16 -> 2 heads, edge_dim 4) on 600 nodes
    in graphs of 20 ran the block kernels of score kind ``kind`` (0 'dot',
    1 'add') at feature ``level`` in the forward and ``bwd_level`` (default
    the same) in both backward passes. ``attention``: the weights returned
    and left out of the loss ('unused') or summed into it ('loss')."""
    bwd_level = level if bwd_level is None else bwd_level
    gen = torch.Generator().manual_seed(seed)
    n = 600  # small graphs: SMMF blocks (the test pins the short kernels off)
    dst = torch.arange(n).repeat_interleave(8)
    src = dst - dst % 20 + torch.randint(0, 20, (n * 8, ), generator=gen)
    ei = torch.stack([src, dst]).cuda()
    x = torch.randn(n, 16, device='cuda', requires_grad=True)
    ea = torch.randn(ei.size(1), 4, device='cuda', requires_grad=True)

    def step():
        out = conv(x, ei, ea,
                   return_attention_weights=True if attention else None)
        loss = (out[0] if attention else out).sum()
        if attention == 'loss':
            loss = loss + out[1][1].square().sum()
        loss.backward()

    _, names = cuda_kernels(step)
    fwd = [m for m in names if f'smmf_fwd_kernel<float, {kind},' in m]
    bwd = [m for m in names if f'bwd::bwd_kernel<float, int, {kind},' in m]
    assert fwd and all(smmf_level(m) == level for m in fwd)
    assert len(bwd) == 2 and all(
        bwd_kernel_level(m) == bwd_level for m in bwd), bwd


@pytest.mark.parametrize('dropout,attention,level,bwd_level', [
    (0.0, None, 1, 1), (0.3, None, 2, 2), (0.0, 'unused', 2, 1),
    (0.0, 'loss', 2, 3)])
def test_feature_level_of_gat_edge_kernels(dropout, attention, level,
                                          bwd_level, monkeypatch):
    """GAT's edge term alone runs the block kernels instantiated with the
    edge score only (training_features.cuh's level 1: no dropout / weights /
    edge key-value code); with dropout, the full feature kernels; with the
    weights but no dropout, the full forward, and the level-3 backward (the
    weights' gradient without dropout's code) where the loss uses them, else
    level 1 (no gradient reaches them)."""
    _cuda()
    monkeypatch.setenv('PYG_DFGNN_SHORT_ROWS', '0')  # (narrow heads)
    from pyg_dfgnn.nn import DFGATConv
    conv = DFGATConv(16, 8, heads=2, edge_dim=4, dropout=dropout).cuda()
    check_edge_conv_level(conv, 1, level, seed=7, attention=attention,
                          bwd_level=bwd_level)


@pytest.mark.parametrize('dropout,level', [(0.0, 3), (0.3, 2)])
def test_feature_level_of_transformer_edge_kernels(dropout, level,
                                                  monkeypatch):
    """TransformerConv's edge term without dropout runs the 'dot' block
    kernels instantiated with the edge score and the weights only (level 3:
    no dropout / edge key-value code); with dropout, the full feature
    kernels."""
    _cuda()
    monkeypatch.setenv('PYG_DFGNN_SHORT_ROWS', '0')  # (narrow heads)
    from pyg_dfgnn.nn import DFTransformerConv
    conv = DFTransformerConv(16, 8, heads=2, edge_dim=4,
                             dropout=dropout).cuda()
    check_edge_conv_level(conv, 0, level, seed=8)


SHORT_KERNELS = ('rows_fwd_kernel', 'short_rows_bwd_kernel',
                 'short_cols_bwd_kernel')


def short_owner_case(tag, kind, terms, dtype, graph_kind):
    """A random graph of ``graph_kind`` and 2 x 16 inputs with ``terms``,
    seeded by ``tag``: (graph, inputs, generator) for the short-owner
    tests (and scripts/sanitize_features.py)."""
    seed = zlib.crc32(tag.encode())
    gen = torch.Generator().manual_seed(seed)
    ei, size = random_graph(graph_kind, random.Random(seed))
    graph = DFGraph.from_edge_index(ei.cuda(), size=size)
    return graph, make_case(kind, terms, graph, 2, 16, 16, dtype, gen), gen


def dropout_only_run(cuda, graph, kind, t, dtype, gen):
    """Dropout 0.4 with no other feature (no weights returned) through the
    SMMF path: out and every gradient against the reference with the mask
    that the all-level call of the same seed returns (its weights after
    dropout). Returns (the reference out, the CUDA kernels that ran)."""
    torch.manual_seed(7)
    with torch.no_grad():  # the mask: the weights after dropout (level 2)
        _, alpha = fused(cuda, graph, kind, t, 'smmf', 0.4, 'after_dropout')
    mask = alpha != 0
    torch.manual_seed(7)
    poison_allocator()

    def step():
        out = fused(cuda, graph, kind, t, 'smmf', 0.4)  # (no weights)
        g_out = torch.randn(out.shape, generator=gen).to(out)
        return out, g_out, grads_of((out * g_out).sum(), t)

    (out, g_out, got), names = cuda_kernels(step)
    ref_out, _, t64 = reference(graph, kind, t, 0.4, mask)
    assert rel_err(out, ref_out) <= TOL_OUT[dtype]
    assert_grads_close(got, grads_of((ref_out * g_out.double()).sum(), t64),
                       dtype)
    return ref_out, names


@pytest.mark.parametrize('kind', ['add', 'dot'])
@pytest.mark.parametrize('dtype', [torch.float32, torch.bfloat16])
@pytest.mark.parametrize('graph_kind', ['batch', 'uniform'])
def test_short_owner_kernels_dropout_only(kind, dtype, graph_kind,
                                          monkeypatch):
    """Dropout with no other feature runs the short kernels instantiated
    with dropout alone (training_features.cuh's level 4), checked against
    the reference; the block kernels, where they take over, draw the same
    mask."""
    cuda = _cuda()
    graph, t, gen = short_owner_case(
        f'dropout-only{kind}{dtype}{graph_kind}', kind, '', dtype, graph_kind)
    monkeypatch.setenv('PYG_DFGNN_SHORT_ROWS', '1')
    ref_out, names = dropout_only_run(cuda, graph, kind, t, dtype, gen)
    ran = [m for m in names if any(k in m for k in SHORT_KERNELS)]
    if graph.num_edges > 0:
        assert len(ran) == 3 and all(short_kernel_level(m) == 4
                                     for m in ran), ran
    monkeypatch.setenv('PYG_DFGNN_SHORT_ROWS', '0')
    torch.manual_seed(7)
    out_block = fused(cuda, graph, kind, t, 'smmf', 0.4)
    assert rel_err(out_block, ref_out) <= TOL_OUT[dtype]


@pytest.mark.parametrize('kind', ['add', 'dot'])
@pytest.mark.parametrize('dtype', [torch.float32, torch.bfloat16])
@pytest.mark.parametrize('heads,d', [(4, 32), (1, 128), (3, 17)])
def test_block_kernels_dropout_only(kind, dtype, heads, d, monkeypatch):
    """Dropout with no other feature in the SMMF forward and the block
    backward passes (level 4; the key-row lanes at 4 x 32 / 1 x 128 fp32),
    checked against the reference."""
    cuda = _cuda()
    seed = zlib.crc32(f'block-dropout{kind}{dtype}{heads}'.encode())
    gen = torch.Generator().manual_seed(seed)
    ei, size = random_graph('batch', random.Random(seed))
    graph = DFGraph.from_edge_index(ei.cuda(), size=size)
    t = make_case(kind, '', graph, heads, d, d, dtype, gen)
    monkeypatch.setenv('PYG_DFGNN_SHORT_ROWS', '0')
    _, names = dropout_only_run(cuda, graph, kind, t, dtype, gen)
    if graph.num_edges > 0:
        assert any('smmf_fwd_kernel' in m and smmf_level(m) == 4
                   for m in names), names
        assert any('bwd::bwd_kernel' in m and bwd_kernel_level(m) == 4
                   for m in names), names


@pytest.mark.parametrize('kind', ['add', 'dot'])
@pytest.mark.parametrize('dtype', [torch.float32, torch.bfloat16])
@pytest.mark.parametrize('dropout', [0.0, 0.4])
@pytest.mark.parametrize('graph_kind', ['batch', 'uniform', 'isolated'])
@pytest.mark.parametrize('slices', ['1', '2', '4'])
def test_short_owner_kernels_with_features(kind, dtype, dropout, graph_kind,
                                           slices, monkeypatch):
    """The warp-per-owner kernels with the edge score, dropout and the
    attention weights (and their gradient), 1, 2 or 4 vectors a lane: out,
    weights and every gradient against the reference with the kernels' own
    mask; all three short kernels ran; the mask is SMMF's (same seed, same
    weights)."""
    cuda = _cuda()
    graph, t, gen = short_owner_case(
        f'short{kind}{dtype}{dropout}{graph_kind}{slices}', kind, 'es', dtype,
        graph_kind)
    monkeypatch.setenv('PYG_DFGNN_SHORT_ROWS', '1')
    monkeypatch.setenv('PYG_DFGNN_SHORT_SLICES', slices)
    torch.manual_seed(5)
    _, names = cuda_kernels(
        lambda: check_case(cuda, graph, kind, t, 'smmf', dtype, dropout,
                           gen=gen))
    ran = {k for m in names for k in SHORT_KERNELS if k in m}
    if graph.num_edges > 0:
        assert ran == set(SHORT_KERNELS), ran
    if dropout > 0:  # the same mask as the block kernels draw
        torch.manual_seed(6)
        with torch.no_grad():
            _, short = fused(cuda, graph, kind, t, 'smmf', dropout,
                             'after_dropout')
        monkeypatch.setenv('PYG_DFGNN_SHORT_ROWS', '0')
        torch.manual_seed(6)
        with torch.no_grad():
            _, block = fused(cuda, graph, kind, t, 'smmf', dropout,
                             'after_dropout')
        assert torch.equal(short != 0, block != 0)


@pytest.mark.parametrize('kind', ['add', 'dot'])
@pytest.mark.parametrize('dtype', [torch.float32, torch.bfloat16])
@pytest.mark.parametrize('use_weights', [False, True])
def test_weights_gradient_only_when_used(kind, dtype, use_weights,
                                         monkeypatch):
    """Weights returned only for inspection (the loss does not use them)
    reach the backward as no gradient: the plain (level 0) backward kernels
    run. Used in the loss, the weights-gradient level (3) runs. Both give
    the reference's gradients."""
    cuda = _cuda()
    graph, t, gen = short_owner_case(f'weights-grad{kind}{dtype}', kind, '',
                                     dtype, 'batch')
    monkeypatch.setenv('PYG_DFGNN_SHORT_ROWS', '1')
    perm = torch.randperm(graph.num_edges, generator=gen).cuda()
    poison_allocator()

    def step():
        out, alpha = fused(cuda, graph, kind, t, 'smmf', 0.0,
                           'before_dropout', perm)
        g_out = torch.randn(out.shape, generator=gen).to(out)
        g_alpha = torch.randn(alpha.shape, generator=gen).to(alpha)
        loss = (out * g_out).sum()
        if use_weights:
            loss = loss + (alpha * g_alpha).sum()
        return g_out, g_alpha, grads_of(loss, t)

    (g_out, g_alpha, got), names = cuda_kernels(step)
    bwd = [m for m in names
           if 'short_rows_bwd' in m or 'short_cols_bwd' in m]
    assert len(bwd) == 2, names
    level = 3 if use_weights else 0
    assert all(short_kernel_level(m) == level for m in bwd), bwd
    ref_out, ref_alpha, t64 = reference(graph, kind, t, dropped=False)
    ref_loss = (ref_out * g_out.double()).sum()
    if use_weights:  # (alpha in the user's order: CSR edge e at perm[e])
        ref_loss = ref_loss + (
            ref_alpha * g_alpha.index_select(0, perm).double()).sum()
    assert_grads_close(got, grads_of(ref_loss, t64), dtype)


@pytest.mark.parametrize('kind', ['add', 'dot'])
@pytest.mark.parametrize('dtype', [torch.float16, torch.bfloat16])
@pytest.mark.parametrize('dropout', [0.0, 0.4])
def test_block_rows_with_short_half_cols(kind, dtype, dropout, monkeypatch):
    """Half precision on a dense batch (mean in-degree >= 16, columns of at
    most 61 edges) with one row of every node (> 64: 2 x 64 heads are not
    narrow): the automatic rule runs the block rows pass and the short cols
    pass, which reads the rows pass's (p, ds) and D_i and draws the same
    dropout mask. Out, the weights and every gradient against the
    reference."""
    cuda = _cuda()
    monkeypatch.delenv('PYG_DFGNN_SHORT_ROWS', raising=False)
    seed = zlib.crc32(f'half-cols{kind}{dtype}{dropout}'.encode())
    gen = torch.Generator().manual_seed(seed)
    ei, size = random_graph('dense', random.Random(seed))
    every = torch.arange(size[0])  # row 0 from every node: a long row
    ei = torch.cat([ei, torch.stack([every, torch.zeros_like(every)])], 1)
    ei = torch.unique(ei, dim=1)
    graph = DFGraph.from_edge_index(ei.cuda(), size=size)
    t = make_case(kind, 'es', graph, 2, 64, 64, dtype, gen)
    torch.manual_seed(seed)
    _, names = cuda_kernels(lambda: check_case(
        cuda, graph, kind, t, 'smmf', dtype, dropout=dropout, gen=gen))
    rows = [m for m in names if 'bwd::bwd_kernel<' in m]
    assert any('short_cols_bwd_kernel' in m for m in names), names
    assert not any('short_rows_bwd_kernel' in m for m in names), names
    assert rows and all(template_args(m)[4] == 'false' for m in rows), rows

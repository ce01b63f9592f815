"""The short-owner kernels against the float64 reference (GPU only): the
forward's warp per row (kernels/fwd_rows_kernel.cuh) and the backward's
warp-per-row / warp-per-column passes (kernels/bwd_short_kernel.cuh),
forced on small graphs with PYG_DFGNN_SHORT_ROWS=1: molecule-sized batches,
isolated rows, N = 1, E = 0, H = 3, one lane per head, several owners per
warp, 1, 2 or 4 vectors a lane (PYG_DFGNN_SHORT_SLICES), 'dot' and 'add',
every dtype; outputs poisoned first. The launches
are checked with the profiler: the shapes they do not take run the block
kernels, and the automatic rule takes them for many short owners only (>=
16,384 warps, mean degree <= 8, longest <= 64; rows and columns apart in
the backward).
"""
import math
import zlib

import pytest
import torch

from pyg_dfgnn.graph import DFGraph
from pyg_dfgnn.ops.reference import fused_attention_reference
from test_kernels_cuda import make_inputs, poison_allocator, rel_err

pytestmark = pytest.mark.cuda

TOL_OUT = {torch.float32: 2e-5, torch.float16: 1e-2, torch.bfloat16: 1e-2}
TOL_GRAD = {torch.float32: 1e-4, torch.float16: 2e-2, torch.bfloat16: 2e-2}


def _cuda():
    from pyg_dfgnn.ops import cuda
    if not torch.cuda.is_available() or not cuda.available():
        pytest.skip('CUDA kernels unavailable')
    return cuda


def molecules(gen, graphs=40, nodes=23, draws=2):
    """A batch of small sparse graphs (in-degree ~2, some rows empty)."""
    src = torch.randint(0, nodes, (graphs, nodes * draws), generator=gen)
    dst = torch.randint(0, nodes, (graphs, nodes * draws), generator=gen)
    off = (torch.arange(graphs) * nodes).view(-1, 1)
    ei = torch.stack([(src + off).flatten(), (dst + off).flatten()])
    return ei, graphs * nodes


def graph_of(name, gen):
    if name == 'molecules':
        return molecules(gen)
    if name == 'isolated':  # every other destination without edges
        ei, n = molecules(gen)
        return ei[:, ei[1] % 2 == 0], n
    if name == 'many-molecules':  # 34,500 rows: short_slices' sizes
        return molecules(gen, graphs=1500)
    if name == 'many-isolated':
        ei, n = molecules(gen, graphs=1500)
        return ei[:, ei[1] % 2 == 0], n
    if name == 'one':
        return torch.tensor([[0], [0]]), 1
    return torch.empty(2, 0, dtype=torch.long), 5  # 'empty'


SHORT_KERNELS = ('rows_fwd_kernel', 'short_rows_bwd_kernel',
                 'short_cols_bwd_kernel')


def short_kernels_run(fn, slices=None):
    """(fn's result, the short-owner kernels among its launches); with
    `slices`, each of them must have run with that many vectors a lane
    (their template arguments: T, I, KIND, VW, NV, FEAT)."""
    with torch.profiler.profile(
            activities=[torch.profiler.ProfilerActivity.CUDA]) as prof:
        result = fn()
        torch.cuda.synchronize()
    names = {k for e in prof.events() for k in SHORT_KERNELS if k in e.name}
    if slices is not None:  # one count for all, or {kernel: count}
        for e in prof.events():
            for k in SHORT_KERNELS:
                if k in e.name:
                    args = e.name[e.name.index('<') + 1:e.name.rindex('>')]
                    want = slices[k] if isinstance(slices, dict) else slices
                    assert int(args.split(',')[4]) == want, e.name
    return result, names


def expected_slices(env, f, vw):
    """short_slices' rule: the vectors a lane PYG_DFGNN_SHORT_SLICES asks
    for, halved until the head holds them."""
    nv = int(env) if env in ('2', '4') else 1
    while nv > 1 and f % (vw * nv) != 0:
        nv //= 2
    return nv


@pytest.mark.parametrize('graph', ['molecules', 'isolated', 'one', 'empty'])
@pytest.mark.parametrize('kind', ['dot', 'add'])
@pytest.mark.parametrize('dtype', [torch.float32, torch.float16,
                                   torch.bfloat16])
@pytest.mark.parametrize('heads,f', [(1, 128), (4, 32), (3, 8), (8, 16),
                                     (2, 128), (3, 17)])
@pytest.mark.parametrize('slices', ['1', '2', '4'])
def test_short_rows_match_reference(graph, kind, dtype, heads, f, slices,
                                    monkeypatch):
    monkeypatch.setenv('PYG_DFGNN_SHORT_SLICES', slices)
    vw = 16 // dtype.itemsize
    check_short(graph, kind, dtype, heads, f,
                expected_slices(slices, f, vw), f'{slices}', monkeypatch)


# short_slices' rule (kernels/short_rows.cuh) per kernel: 'add' 4 vectors
# a lane everywhere; 'dot' forward 16 elements a lane with >= 4 lanes a
# head, rows pass 4 (>= 4 lanes a head; fp32 one edge a step) or 1, cols
# pass fp32 4 / half 1 (>= 4 lanes a head); fewer where a pass would have
# under 4,096 warps. Where the forward and the rows pass differ they form
# a row's scores with different sums: the gradients must still match the
# reference.
@pytest.mark.parametrize('graph,kind,dtype,heads,f,fwd,rows,cols', [
    ('many-molecules', 'dot', torch.float32, 1, 128, 4, 4, 4),
    ('many-isolated', 'dot', torch.float32, 1, 128, 4, 4, 4),
    ('many-molecules', 'dot', torch.float32, 4, 32, 2, 1, 2),
    ('many-molecules', 'dot', torch.bfloat16, 1, 128, 2, 4, 1),
    ('many-isolated', 'dot', torch.bfloat16, 1, 128, 2, 4, 1),
    ('many-molecules', 'dot', torch.float16, 4, 32, 1, 1, 1),
    ('many-molecules', 'add', torch.float32, 1, 128, 4, 4, 4),
    ('many-isolated', 'add', torch.bfloat16, 8, 16, 2, 2, 2),
    ('molecules', 'add', torch.float32, 1, 128, 1, 1, 1),  # 920 rows
    ('molecules', 'dot', torch.bfloat16, 1, 128, 1, 1, 1),
])
def test_short_slices_rule(graph, kind, dtype, heads, f, fwd, rows, cols,
                           monkeypatch):
    monkeypatch.delenv('PYG_DFGNN_SHORT_SLICES', raising=False)
    check_short(graph, kind, dtype, heads, f,
                {'rows_fwd_kernel': fwd, 'short_rows_bwd_kernel': rows,
                 'short_cols_bwd_kernel': cols}, 'rule', monkeypatch)


def check_short(graph, kind, dtype, heads, f, nv, salt, monkeypatch):
    """One case forced onto the short kernels (each run with ``nv``
    vectors a lane: a count or {kernel: count}): out and the gradients
    against the float64 reference, outputs poisoned first."""
    cuda = _cuda()
    monkeypatch.setenv('PYG_DFGNN_SHORT_ROWS', '1')
    gen = torch.Generator().manual_seed(
        zlib.crc32(f'{graph}{kind}{dtype}{heads}{f}{salt}'.encode()))
    ei, n = graph_of(graph, gen)
    g = DFGraph.from_edge_index(ei.cuda(), size=(n, n))
    value, query, key, _ = make_inputs(kind, n, n, heads, f, f, dtype, gen,
                                       True)
    scale = 1.0 / math.sqrt(f) if kind == 'dot' else 1.0
    vw = 16 // value.element_size()
    expect_rows = f % vw == 0 and heads * f <= 32 * vw and (
        kind == 'add' or (f // vw) & (f // vw - 1) == 0)
    poison_allocator()

    def run():
        return cuda.fused_attention_cuda(g, kind, value, query, key, None,
                                         scale, 0.2, strategy='smmf')
    out, ran = short_kernels_run(run, nv)
    assert ran == ({'rows_fwd_kernel'} if expect_rows else set())
    assert torch.isfinite(out).all(), 'unwritten or non-finite output'
    leaves = [value, query, key]
    ref_leaves = [t.detach().double().requires_grad_() for t in leaves]
    ref, _ = fused_attention_reference(g, kind, *ref_leaves, None,
                                             scale, 0.2)
    tag = f'{graph} {kind} {dtype} H={heads} F={f} NV={nv}'
    assert rel_err(out, ref) <= TOL_OUT[dtype], tag
    g_out = torch.randn(out.shape, generator=gen).to('cuda', dtype)
    poison_allocator()
    grads, ran = short_kernels_run(
        lambda: torch.autograd.grad(out, leaves, g_out), nv)
    assert ran == ({'short_rows_bwd_kernel', 'short_cols_bwd_kernel'}
                   if expect_rows else set())
    ref_grads = torch.autograd.grad(ref, ref_leaves, g_out.double(),
                                    allow_unused=True)
    for name, gv, rg in zip(('value', 'query', 'key'), grads, ref_grads):
        rg = torch.zeros_like(gv, dtype=torch.float64) if rg is None else rg
        assert torch.isfinite(gv).all(), f'grad_{name}: {tag}'
        err = rel_err(gv, rg, floor=1e-2 if dtype == torch.float32 else 1.0)
        assert err <= TOL_GRAD[dtype], f'grad_{name} {err:.2e}: {tag}'


# The persistent launches (short_rows.cuh's launch_short_walk): with the
# grid capped by PYG_DFGNN_SHORT_PERSIST the walking kernels' blocks walk
# many groups (virtual blocks), loading the next group's edge range ahead;
# each owner is still formed by one warp the same way, so out and the
# gradients equal, bit for bit, those of the kernels without the walk, one
# group a block ('0'), training features too.
@pytest.mark.parametrize('kind,dtype,heads,f,feature', [
    ('dot', torch.float32, 1, 128, None),
    ('dot', torch.bfloat16, 1, 128, None),
    ('dot', torch.float32, 4, 32, None),
    ('dot', torch.float16, 3, 8, 'score'),
    ('add', torch.float32, 1, 128, 'dropout'),
    ('add', torch.bfloat16, 8, 16, 'score'),
])
@pytest.mark.parametrize('blocks', ['1', '3'])
def test_persistent_walk_equals_one_group_a_block(kind, dtype, heads, f,
                                                  feature, blocks,
                                                  monkeypatch):
    cuda = _cuda()
    monkeypatch.setenv('PYG_DFGNN_SHORT_ROWS', '1')
    gen = torch.Generator().manual_seed(zlib.crc32(
        f'persist{kind}{dtype}{heads}{f}{feature}{blocks}'.encode()))
    ei, n = graph_of('isolated', gen)  # 920 rows, half of them empty
    g = DFGraph.from_edge_index(ei.cuda(), size=(n, n))
    value, query, key, _ = make_inputs(kind, n, n, heads, f, f, dtype, gen,
                                       True)
    es = (torch.randn(g.num_edges, heads, generator=gen)
          .to('cuda', dtype).requires_grad_()) if feature == 'score' else None
    leaves = [value, query, key] + ([es] if es is not None else [])
    g_out = torch.randn(n, heads, f, generator=gen).to('cuda', dtype)

    def run(persist):
        monkeypatch.setenv('PYG_DFGNN_SHORT_PERSIST', persist)
        torch.cuda.manual_seed(7)
        poison_allocator()
        out, ran = short_kernels_run(lambda: cuda.fused_attention_cuda(
            g, kind, value, query, key, None, 0.25, 0.2, strategy='smmf',
            edge_score=es, dropout=0.3 if feature == 'dropout' else 0.0))
        assert ran == {'rows_fwd_kernel'}
        grads = torch.autograd.grad(out, leaves, g_out)
        return [out] + list(grads)

    one_each, walked = run('0'), run(blocks)
    for name, a, b in zip(('out', 'value', 'query', 'key', 'edge_score'),
                          one_each, walked):
        assert torch.isfinite(a).all(), name
        assert torch.equal(a, b), f'{name}: {kind} {dtype} H={heads} F={f}'


def rule_run(cuda, ei, size, heads, f, dtype, gen):
    """The short-owner kernels a 'dot' forward + backward ran (SMMF, the
    automatic rule unless PYG_DFGNN_SHORT_ROWS says otherwise)."""
    g = DFGraph.from_edge_index(ei.cuda(), size=(size, size))
    value, query, key, _ = make_inputs('dot', size, size, heads, f, f,
                                       dtype, gen, True)

    def step():
        out = cuda.fused_attention_cuda(g, 'dot', value, query, key, None,
                                        0.1, 0.2, strategy='smmf')
        return torch.autograd.grad(out, [value, query, key],
                                   torch.ones_like(out))
    return short_kernels_run(step)[1]


def test_automatic_rule(monkeypatch):
    """Taken for owners whose longest has at most 64 edges, at any size
    (920 rows too) and mean degree (10 and 20; in fp32 and bf16); not for
    long ones, or with PYG_DFGNN_SHORT_ROWS=0. The backward decides rows
    (in-degree) and columns (out-degree) apart."""
    cuda = _cuda()
    gen = torch.Generator().manual_seed(0)
    many, n_many = molecules(gen, graphs=1500)  # 34,500 rows, in-degree ~2
    few, n_few = molecules(gen)  # 920 rows
    n = 20000
    sparse = torch.randint(0, n, (2, 10 * n), generator=gen)  # mean 10
    dense = torch.randint(0, n, (2, 20 * n), generator=gen)  # mean 20
    fan = torch.stack([torch.arange(200), torch.zeros(200, dtype=torch.long)])
    star = torch.cat([many, fan], dim=1)  # one row of 200 > 64
    hub = torch.cat([many, fan.flip(0)], dim=1)  # one column of 200
    rows = {'rows_fwd_kernel', 'short_rows_bwd_kernel'}
    cols = {'short_cols_bwd_kernel'}
    f32, b16 = torch.float32, torch.bfloat16
    for ei, size, dtype, env, expect in [
            (many, n_many, f32, None, rows | cols),
            (many, n_many, b16, None, rows | cols),
            (many, n_many, f32, '0', set()),
            (few, n_few, f32, None, rows | cols),
            (few, n_few, b16, None, rows | cols),
            (sparse, n, f32, None, rows | cols),
            (sparse, n, b16, None, rows | cols),
            (dense, n, f32, None, rows | cols),
            (dense, n, b16, None, rows | cols),
            (dense, n, b16, '0', set()),
            (star, n_many, f32, None, cols),
            (hub, n_many, f32, None, rows)]:
        if env is None:
            monkeypatch.delenv('PYG_DFGNN_SHORT_ROWS', raising=False)
        else:
            monkeypatch.setenv('PYG_DFGNN_SHORT_ROWS', env)
        ran = rule_run(cuda, ei, size, 1, 128, dtype, gen)
        assert ran == expect, (size, dtype, env, ran)


def test_automatic_rule_narrow_heads(monkeypatch):
    """Narrow heads (<= 4 lanes a head: 4 x 16 in fp32) take the short
    kernels up to a longest owner of 256 (rows and columns apart), wide
    heads (1 x 128) up to 64: a dense graph with one row and one column of
    ~130 is short for the narrow heads only."""
    cuda = _cuda()
    monkeypatch.delenv('PYG_DFGNN_SHORT_ROWS', raising=False)
    gen = torch.Generator().manual_seed(1)
    n = 3000
    dense = torch.randint(0, n, (2, 30 * n), generator=gen)  # mean 30
    fan = torch.stack([torch.arange(300), torch.zeros(300, dtype=torch.long)])
    star = torch.cat([dense, fan], dim=1)  # one row of ~330 > 256
    mid = torch.cat([dense, fan[:, :100], fan[:, :100].flip(0)], dim=1)
    rows = {'rows_fwd_kernel', 'short_rows_bwd_kernel'}
    cols = {'short_cols_bwd_kernel'}
    for ei, (heads, f), expect in [(dense, (4, 16), rows | cols),
                                   (dense, (1, 128), rows | cols),
                                   (mid, (4, 16), rows | cols),
                                   (mid, (1, 128), set()),
                                   (star, (4, 16), cols),
                                   (star.flip(0), (4, 16), rows)]:
        ran = rule_run(cuda, ei, n, heads, f, torch.float32, gen)
        assert ran == expect, (heads, f, ran)

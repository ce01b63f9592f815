"""The fused CUDA kernels against the PyTorch reference (GPU only).

Every case draws a fresh random graph and inputs: each score kind x dtype x
strategy (SMMF / PMF) over a spread of H, D, F (vector and scalar paths) and
degrees (no edges, isolated nodes, a super node connected to every source,
bipartite graphs, batches of small graphs). The reference runs in float64 on
the same (rounded) inputs; outputs are checked for NaN after poisoning the
allocator, and all gradients are compared through the fused backward.
"""
import math
import random

import pytest
import torch

from pyg_dfgnn.graph import DFGraph
from pyg_dfgnn.ops import fused_attention
from pyg_dfgnn.ops.reference import fused_attention_reference

pytestmark = pytest.mark.cuda

KINDS = ('dot', 'add', 'gatv2')
DTYPES = (torch.float32, torch.float16, torch.bfloat16)
STRATEGIES = ('smmf', 'pmf')
GRAPHS = ('uniform', 'isolated', 'super', 'bipartite', 'batch', 'empty',
          'tiny')
FEATS = (1, 3, 8, 17, 32, 72, 128, 256)
TOL_OUT = {torch.float32: 2e-5, torch.float16: 1e-2, torch.bfloat16: 1e-2}
TOL_GRAD = {torch.float32: 1e-4, torch.float16: 2e-2, torch.bfloat16: 2e-2}
NUM_CASES = 252  # >= 200 randomized cases; multiple of 3 * 3 * 2 * 7


def _cuda():
    from pyg_dfgnn.ops import cuda
    if not torch.cuda.is_available() or not cuda.available():
        pytest.skip('CUDA kernels unavailable')
    return cuda


def poison_allocator(nbytes: int = 64 << 20) -> None:
    """Fill cached device memory with NaN so unwritten outputs show."""
    t = torch.empty(nbytes // 4, device='cuda')
    t.fill_(float('nan'))
    del t


def random_graph(kind: str, rng: random.Random, device='cuda'):
    """-> (edge_index [2, E], (N_src, N_dst))"""
    g = torch.Generator().manual_seed(rng.randrange(2**31))
    if kind == 'empty':
        n_src, n_dst = rng.randint(0, 20), rng.randint(1, 20)
        return torch.empty(2, 0, dtype=torch.long), (n_src, n_dst)
    if kind == 'tiny':
        return torch.tensor([[0], [0]]), (1, 1)
    if kind in ('batch', 'dense'):  # batch of small dense-ish graphs
        # ('dense': mean in-degree >= 16, the half-precision LANES kernels)
        b, n = rng.randint(2, 12), rng.randint(40 if kind == 'dense' else 5,
                                               60)
        deg = 24 if kind == 'dense' else rng.randint(1, n)
        src = torch.randint(0, n, (b, n * deg), generator=g)
        dst = torch.randint(0, n, (b, n * deg), generator=g)
        off = (torch.arange(b) * n).view(-1, 1)
        ei = torch.stack([(src + off).flatten(), (dst + off).flatten()])
        ei = torch.unique(ei, dim=1)
        return ei, (b * n, b * n)
    n_src = rng.randint(1, 400)
    n_dst = n_src if kind != 'bipartite' else rng.randint(1, 400)
    e = rng.randint(0, 8 * n_dst)
    src = torch.randint(0, n_src, (e, ), generator=g)
    dst = torch.randint(0, n_dst, (e, ), generator=g)
    if kind == 'isolated':  # half the destinations get no edges
        dst = dst - dst % 2
    if kind == 'super':  # one node connected to all others, long rows
        n_src = n_dst = rng.choice((300, 700, 2000))
        e = rng.randint(0, 4 * n_dst)
        src = torch.randint(0, n_src, (e, ), generator=g)
        dst = torch.randint(0, n_dst, (e, ), generator=g)
        hub = rng.randrange(n_dst)
        src = torch.cat([src, torch.arange(n_src)])
        dst = torch.cat([dst, torch.full((n_src, ), hub)])
    ei = torch.stack([src, dst])
    if rng.random() < 0.5:  # shuffled edge order (DFGraph sorts)
        ei = ei[:, torch.randperm(ei.size(1), generator=g)]
    return ei, (n_src, n_dst)


def make_inputs(kind, n_src, n_dst, heads, d, f, dtype, gen, grad):
    def rnd(*shape):
        x = torch.randn(*shape, generator=gen, dtype=torch.float32)
        x = x.to('cuda', dtype)
        return x.requires_grad_(grad)

    value = rnd(n_src, heads, f)
    if kind == 'add':
        query, key, att = rnd(n_dst, heads), rnd(n_src, heads), None
    else:
        query, key = rnd(n_dst, heads, d), rnd(n_src, heads, d)
        att = rnd(heads, d) if kind == 'gatv2' else None
    return value, query, key, att


def template_args(name: str) -> list:
    """The template arguments of a kernel's profiler name."""
    return name.split('(', 1)[0].split('<', 1)[1].rsplit('>', 1)[0].split(', ')


def rel_err(a, b, floor: float = 0.0):
    """||a - b|| / max(||b||, floor * sqrt(numel)): relative, with an
    absolute floor for results that are ~0 (e.g. d score of a one-edge row,
    where a low-precision backward leaves rounding noise)."""
    a, b = a.double(), b.double()
    den = max(b.norm().item(), floor * math.sqrt(max(b.numel(), 1)))
    num = (a - b).norm().item()
    if den == 0:
        return num
    return num / den


def case_config(i: int):
    rng = random.Random(1000 + i + 7919 * torch.initial_seed() % 1000)
    kind = KINDS[i % 3]
    dtype = DTYPES[(i // 3) % 3]
    strategy = STRATEGIES[(i // 9) % 2]
    graph_kind = GRAPHS[(i // 18) % len(GRAPHS)]
    heads = rng.choice((1, 1, 2, 3, 4, 8))
    f = rng.choice(FEATS)
    d = f if kind == 'gatv2' and rng.random() < 0.5 else rng.choice(FEATS)
    if graph_kind == 'super' and heads * f > 256:  # keep the case quick
        f = max(1, 256 // heads)
    return rng, kind, dtype, strategy, graph_kind, heads, d, f


def run_case(cuda, rng, kind, dtype, strategy, graph_kind, heads, d, f,
             grad=True, index_dtype=None):
    ei, (n_src, n_dst) = random_graph(graph_kind, rng)
    graph = DFGraph.from_edge_index(ei.cuda(), size=(n_src, n_dst))
    if index_dtype is not None:
        graph = DFGraph(graph.rowptr, graph.col.to(index_dtype), n_src)
    gen = torch.Generator().manual_seed(rng.randrange(2**31))
    value, query, key, att = make_inputs(kind, n_src, n_dst, heads, d, f,
                                         dtype, gen, grad)
    scale = 1.0 / math.sqrt(d) if kind == 'dot' else 1.0
    slope = rng.choice((0.2, 0.01))
    poison_allocator()
    out = cuda.fused_attention_cuda(graph, kind, value, query, key, att,
                                    scale, slope, strategy=strategy)
    assert out.shape == (n_dst, heads, f) and out.dtype == dtype
    assert torch.isfinite(out).all(), 'unwritten or non-finite output'

    leaves = [t for t in (value, query, key, att) if t is not None]
    ref_leaves = [t.detach().double().requires_grad_(grad) for t in leaves]
    rv, rq, rk = ref_leaves[:3]
    ra = ref_leaves[3] if att is not None else None
    ref, _ = fused_attention_reference(graph, kind, rv, rq, rk, ra, scale,
                                       slope)
    # (initial seed: case_config's draw; torch.manual_seed(it) redraws it)
    tag = (f'{kind} {dtype} {strategy} {graph_kind} H={heads} D={d} F={f} '
           f'N=({n_src},{n_dst}) E={graph.num_edges} '
           f'initial seed {torch.initial_seed()}')
    err = rel_err(out, ref)
    assert err <= TOL_OUT[dtype], f'out rel err {err:.2e}: {tag}'
    if not grad:
        return
    g_out = torch.randn(out.shape, generator=gen).to('cuda', dtype)
    poison_allocator()
    grads = torch.autograd.grad(out, leaves, g_out)
    ref_grads = torch.autograd.grad(ref, ref_leaves, g_out.double(),
                                    allow_unused=True)
    for name, gv, rg in zip(('value', 'query', 'key', 'att'), grads,
                            ref_grads):
        rg = torch.zeros_like(gv, dtype=torch.float64) if rg is None else rg
        assert gv.shape == rg.shape, f'grad_{name} shape: {tag}'
        assert torch.isfinite(gv).all(), f'grad_{name} non-finite: {tag}'
        # absolute floor: a bf16/fp16 backward reuses the rounded output,
        # so d score of a one-edge row is rounding noise around 0; in fp32
        # too where the forward's lse and the backward's recomputed score
        # differ by an ulp (gatv2 / PMF: p = 1 - 1e-7), and a graph of
        # mostly 0-1 edge rows leaves grad_query ~0 (noise ~1e-6 per
        # element: 1.8e-4 and 3.1e-4 against a floor of 1e-2, sessions 13)
        err = rel_err(gv, rg,
                      floor=1e-1 if dtype == torch.float32 else 1.0)
        tol = TOL_GRAD[dtype]
        assert err <= tol, f'grad_{name} rel err {err:.2e}: {tag}'


@pytest.mark.parametrize('i', range(NUM_CASES))
def test_random_case(i):
    cuda = _cuda()
    run_case(cuda, *case_config(i))


@pytest.mark.parametrize('short', ['0', '1'])
@pytest.mark.parametrize('strategy', STRATEGIES)
@pytest.mark.parametrize('kind', KINDS)
def test_one_edge_rows_give_exact_zero_score_gradients(kind, strategy, short,
                                                       monkeypatch):
    """Rows of one edge (or none): the softmax is exactly 1 whatever the
    backward's recomputed score rounds to, so the query gradient is exactly
    0 (block rows pass and short-owner kernels, after either forward; D =
    256 for gatv2, where the forward's and backward's sums of 256 terms
    differ by ulps: 1.2e-4 against the 1e-4 bound in a random case), and
    the others are the reference's."""
    cuda = _cuda()
    monkeypatch.setenv('PYG_DFGNN_SHORT_ROWS', short)
    gen = torch.Generator().manual_seed(11)
    n_src, n_dst = 139, 306
    dst = torch.randperm(n_dst, generator=gen)[:200]  # 106 empty rows
    src = torch.randint(0, n_src, (200, ), generator=gen)
    graph = DFGraph.from_edge_index(torch.stack([src, dst]).cuda(),
                                    size=(n_src, n_dst))
    d = 256 if kind == 'gatv2' else 32
    value, query, key, att = make_inputs(kind, n_src, n_dst, 4, d, d,
                                         torch.float32, gen, True)
    scale = 1.0 / math.sqrt(d) if kind == 'dot' else 1.0
    poison_allocator()
    out = cuda.fused_attention_cuda(graph, kind, value, query, key, att,
                                    scale, 0.2, strategy=strategy)
    leaves = [t for t in (value, query, key, att) if t is not None]
    g_out = torch.randn(out.shape, generator=gen).to(out)
    grads = torch.autograd.grad(out, leaves, g_out)
    assert torch.equal(grads[1], torch.zeros_like(grads[1])), \
        f'grad_query max {grads[1].abs().max().item():.2e}'
    ref_leaves = [t.detach().double().requires_grad_() for t in leaves]
    ref, _ = fused_attention_reference(
        graph, kind, *ref_leaves[:3],
        ref_leaves[3] if att is not None else None, scale, 0.2)
    ref_grads = torch.autograd.grad(ref, ref_leaves, g_out.double())
    for name, g, rg in zip(('value', 'query', 'key', 'att'), grads,
                           ref_grads):
        err = rel_err(g, rg, floor=1e-1)
        assert err <= TOL_GRAD[torch.float32], f'grad_{name}: {err:.2e}'


@pytest.mark.parametrize('strategy', STRATEGIES)
@pytest.mark.parametrize('kind', KINDS)
def test_int64_col(kind, strategy):
    cuda = _cuda()
    rng = random.Random(5)
    run_case(cuda, rng, kind, torch.float32, strategy, 'uniform', 2, 32, 32,
             grad=False, index_dtype=torch.int64)


# (dtype, H, D) where a key row is 1..32 16-byte vectors and a head 1..32
LANES_SHAPES = [(torch.float32, h, d) for h, d in
                ((1, 4), (2, 4), (1, 8), (4, 8), (1, 32), (4, 32), (1, 128),
                 (8, 16), (2, 64))] + \
               [(torch.bfloat16, h, d) for h, d in
                ((1, 8), (2, 8), (1, 16), (4, 32), (2, 64), (1, 128))]


@pytest.mark.parametrize('kind', ('dot', 'gatv2'))
@pytest.mark.parametrize('dtype,heads,d', LANES_SHAPES)
def test_pmf_sddmm_lanes_shapes(kind, dtype, heads, d):
    """PMF's SDDMM with the key row over the lanes (every head width G =
    1..32 vectors of the transposing sum, rows of 1..32 vectors, so 1..32
    edges per step), on a super-node graph with short and empty rows, fp32
    and bf16, forward and backward against the reference."""
    cuda = _cuda()
    rng = random.Random(f'{kind}-{dtype}-{heads}-{d}')
    run_case(cuda, rng, kind, dtype, 'pmf', 'super', heads, d, 16)


def test_pmf_sddmm_lanes_kernel_is_used():
    """The lanes SDDMM runs where its shapes allow (1 x 128 fp32), the
    item-parallel one elsewhere (3 heads: a key row of 3 x 16 floats)."""
    cuda = _cuda()
    from torch.profiler import ProfilerActivity, profile
    ei, (n, _) = random_graph('super', random.Random(2))
    graph = DFGraph.from_edge_index(ei.cuda(), num_nodes=n)
    names = {}
    for heads, d in ((1, 128), (3, 16)):
        gen = torch.Generator().manual_seed(0)
        value, query, key, _ = make_inputs('dot', n, n, heads, d, d,
                                           torch.float32, gen, False)
        with profile(activities=[ProfilerActivity.CUDA]) as prof:
            cuda.fused_attention_cuda(graph, 'dot', value, query, key, None,
                                      0.1, 0.2, strategy='pmf')
            torch.cuda.synchronize()
        names[heads] = ' '.join(e.name for e in prof.events())
    assert 'pmf_sddmm_lanes_kernel' in names[1]
    assert 'pmf_sddmm_kernel' in names[3]
    assert 'pmf_sddmm_lanes_kernel' not in names[3]


@pytest.mark.parametrize('heads,f', [(1, 128), (4, 32), (3, 17)])
@pytest.mark.parametrize('kind', KINDS)
def test_one_node_connected_to_all(kind, heads, f):
    """A hub of degree N - 1 = 19,999: SMMF falls back where it must."""
    cuda = _cuda()
    n = 20000
    src = torch.arange(1, n)
    ei = torch.stack([torch.cat([src, src]),
                      torch.cat([torch.zeros(n - 1, dtype=torch.long),
                                 src.flip(0)])])
    graph = DFGraph.from_edge_index(ei.cuda(), num_nodes=n)
    gen = torch.Generator().manual_seed(3)
    value, query, key, att = make_inputs(kind, n, n, heads, f, f,
                                         torch.float32, gen, False)
    ref, _ = fused_attention_reference(graph, kind, value.double(),
                                       query.double(), key.double(),
                                       None if att is None else att.double(),
                                       0.1, 0.2)
    for strategy in STRATEGIES:
        poison_allocator()
        out = cuda.fused_attention_cuda(graph, kind, value, query, key, att,
                                        0.1, 0.2, strategy=strategy)
        assert torch.isfinite(out).all()
        assert rel_err(out, ref) <= TOL_OUT[torch.float32], strategy


def test_public_op_routes_to_kernels():
    _cuda()
    rng = random.Random(11)
    ei, (n_src, n_dst) = random_graph('uniform', rng)
    graph = DFGraph.from_edge_index(ei.cuda(), size=(n_src, n_dst))
    gen = torch.Generator().manual_seed(1)
    v, q, k, _ = make_inputs('dot', n_src, n_dst, 2, 16, 16, torch.float32,
                             gen, False)
    out = fused_attention(graph, 'dot', v, q, k, scale=0.25)
    ref, _ = fused_attention_reference(graph, 'dot', v, q, k, None, 0.25)
    assert rel_err(out, ref) <= 1e-5
    # float64 has no kernel: the reference answers instead of an error
    out64 = fused_attention(graph, 'dot', v.double(), q.double(), k.double(),
                            scale=0.25)
    assert out64.dtype == torch.float64 and rel_err(out64, ref) <= 1e-5


def test_lse_matches_reference():
    _cuda()  # loads the kernels (skips without them)
    rng = random.Random(2)
    ei, (n_src, n_dst) = random_graph('isolated', rng)
    graph = DFGraph.from_edge_index(ei.cuda(), size=(n_src, n_dst))
    gen = torch.Generator().manual_seed(2)
    v, q, k, _ = make_inputs('dot', n_src, n_dst, 3, 8, 8, torch.float32, gen,
                             False)
    from pyg_dfgnn.ops.reference import edge_scores
    s = edge_scores(graph, 'dot', q.double(), k.double(), None, 0.5, 0.2)
    row = graph.row.view(-1, 1).expand_as(s)
    m = torch.full((n_dst, 3), float('-inf'), dtype=torch.float64,
                   device='cuda').scatter_reduce(0, row, s, 'amax',
                                                 include_self=False)
    ssum = torch.zeros_like(m).scatter_add(0, row,
                                           (s - m[graph.row]).exp())
    ref_lse = m + torch.log(ssum + 1e-16)
    for strategy in (0, 1):
        out, lse, *_ = torch.ops.pyg_dfgnn.fused_attention_fwd(
            graph.rowptr, graph.col, 0, q, k, v, None, 0.5, 0.2, strategy,
            graph.max_in_degree)
        assert lse.dtype == torch.float32 and lse.shape == (n_dst, 3)
        has = graph.in_degree > 0
        assert torch.allclose(lse[has].double(), ref_lse[has], rtol=1e-5,
                              atol=1e-5)
        assert torch.isneginf(lse[~has]).all()
        assert (out[~has] == 0).all()


@pytest.mark.parametrize('kind', KINDS)
@pytest.mark.parametrize('dtype', DTYPES)
def test_staged_windows_match_plain_and_reference(kind, dtype):
    """SMMF with graph-aligned windows (K / V staged in shared memory), a
    stage span too small for some windows (those read global memory) and
    no windows give the reference's output and lse."""
    _cuda()
    rng = random.Random(11)
    sizes = [rng.randint(1, 90) for _ in range(40)] + [150]
    parts, off = [], 0
    for n in sizes:
        e = n * rng.randint(1, 12)
        parts.append(torch.randint(0, n, (2, e)) + off)
        off += n
    graph = DFGraph.from_edge_index(torch.cat(parts, 1).cuda(), num_nodes=off)
    gen = torch.Generator().manual_seed(0)
    v, q, k, att = make_inputs(kind, off, off, 2, 24, 16, dtype, gen, False)
    windows, span = graph.row_windows(1000)
    assert windows is not None and span >= 150
    ref, _ = fused_attention_reference(graph, kind, v.double(), q.double(),
                                       k.double(), None if att is None else
                                       att.double(), 0.5, 0.2)
    kid = {'dot': 0, 'add': 1, 'gatv2': 2}[kind]
    results = []
    for win, stage in ((windows, span), (windows, 100), (None, 0)):
        poison_allocator()
        out, lse, *_ = torch.ops.pyg_dfgnn.fused_attention_fwd(
            graph.rowptr, graph.col, kid, q, k, v, att, 0.5, 0.2, 0,
            graph.max_in_degree, win, stage)
        assert rel_err(out, ref) <= TOL_OUT[dtype]
        results.append((out, lse))
    for out, lse in results[1:]:
        assert torch.allclose(lse, results[0][1], rtol=1e-5, atol=1e-5)


def test_bad_inputs_raise():
    cuda = _cuda()
    graph = DFGraph.from_edge_index(torch.tensor([[0, 1], [1, 0]]).cuda())
    v = torch.randn(2, 1, 4, device='cuda')
    with pytest.raises(TypeError, match='value'):
        cuda.fused_attention_cuda(graph, 'dot', v.long(), v, v, None, 1.0,
                                  0.2)
    with pytest.raises(ValueError, match='kind'):
        cuda.fused_attention_cuda(graph, 'mul', v, v, v, None, 1.0, 0.2)
    v_strided = torch.randn(4, 1, 2, device='cuda').permute(2, 1, 0)
    assert not v_strided.is_contiguous()
    with pytest.raises(RuntimeError, match='contiguous'):
        torch.ops.pyg_dfgnn.fused_attention_fwd(
            graph.rowptr, graph.col, 0, v, v, v_strided, None, 1.0, 0.2, 0,
            -1)


def test_torch_compile_fullgraph():
    cuda = _cuda()
    rng = random.Random(3)
    ei, (n_src, n_dst) = random_graph('batch', rng)
    graph = DFGraph.from_edge_index(ei.cuda(), size=(n_src, n_dst))
    graph.csc()  # built once outside, as a conv's cache would
    gen = torch.Generator().manual_seed(3)
    v, q, k, _ = make_inputs('dot', n_src, n_dst, 2, 16, 16, torch.float32,
                             gen, True)

    def layer(v, q, k):
        out = cuda.fused_attention_cuda(graph, 'dot', v * 2.0, q, k, None,
                                        0.25, 0.2)
        return torch.relu(out).sum()

    compiled = torch.compile(layer, fullgraph=True)
    loss = compiled(v, q, k)
    grads = torch.autograd.grad(loss, (v, q, k))
    ref_loss = layer(v, q, k)
    ref_grads = torch.autograd.grad(ref_loss, (v, q, k))
    assert torch.allclose(loss, ref_loss, rtol=1e-5)
    for a, b in zip(grads, ref_grads):
        assert rel_err(a, b) <= 1e-5


def test_torch_compile_public_op_fullgraph():
    """The public op (input checks included) traces without graph breaks."""
    _cuda()
    rng = random.Random(4)
    ei, (n_src, n_dst) = random_graph('uniform', rng)
    graph = DFGraph.from_edge_index(ei.cuda(), size=(n_src, n_dst))
    gen = torch.Generator().manual_seed(4)
    v, q, k, att = make_inputs('gatv2', n_src, n_dst, 2, 8, 8, torch.float32,
                               gen, False)

    def layer(v, q, k, att):
        return fused_attention(graph, 'gatv2', v, q, k, att,
                               negative_slope=0.2)

    out = torch.compile(layer, fullgraph=True)(v, q, k, att)
    ref, _ = fused_attention_reference(graph, 'gatv2', v, q, k, att, 1.0,
                                       0.2)
    assert rel_err(out, ref) <= 1e-5


@pytest.mark.cuda
@pytest.mark.parametrize('kind', ['dot', 'gatv2'])
@pytest.mark.parametrize('dtype', [torch.bfloat16, torch.float16])
@pytest.mark.parametrize('dense', [True, False])
def test_half_lanes_kernels_by_density(kind, dtype, dense, monkeypatch):
    """Half precision, H * D = 128, SMMF: the four-feature-lane kernels
    (LANES) from a mean in-degree of 16, the item-group ones below; both
    against the reference."""
    from torch.profiler import ProfilerActivity, profile
    monkeypatch.setenv('PYG_DFGNN_SHORT_ROWS', '0')  # the block kernels
    cuda = _cuda()
    g = torch.Generator().manual_seed(7)
    n, deg = 64, (24 if dense else 4)
    src = torch.randint(0, n, (n * deg,), generator=g)
    dst = torch.arange(n).repeat_interleave(deg)
    ei = torch.stack([src, dst]).unique(dim=1)
    graph = DFGraph.from_edge_index(ei.cuda(), size=(n, n))
    assert (graph.num_edges >= 16 * n) == dense
    value, query, key, att = make_inputs(kind, n, n, 4, 32, 32, dtype, g,
                                         False)
    with profile(activities=[ProfilerActivity.CUDA]) as prof:
        out = cuda.fused_attention_cuda(graph, kind, value, query, key, att,
                                        0.2, 0.2, strategy='smmf')
        torch.cuda.synchronize()
    names = [e.key for e in prof.key_averages() if 'smmf_fwd' in e.key]
    assert len(names) == 1, names
    assert template_args(names[0])[-1] == ('true' if dense else 'false'), \
        names
    ref, _ = fused_attention_reference(
        graph, kind, *(t.double() for t in (value, query, key)),
        None if att is None else att.double(), 0.2, 0.2)
    assert rel_err(out, ref) <= TOL_OUT[dtype]

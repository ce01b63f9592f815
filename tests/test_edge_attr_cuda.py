"""The raw edge attribute kernels (kernels/edge_attr_rows.cu) against the
float64 reference (GPU only): dots and sums, forward and every gradient, for
each self-loop fill, shared (edge-parallel kernels) and per-node matrices
(row kernel), odd sizes (H = 3, D_e = 3), empty rows, a super node, N = 1,
E = 0, unused input rows; outputs poisoned first. And the convs that use
them against PyG on the GPU."""
import random
import zlib

import pytest
import torch

from pyg_dfgnn.nn.conv.utils import clear_graph_cache, resolve_graph
from pyg_dfgnn.ops.edge_attr import edge_attr_dots, edge_attr_sums
from test_kernels_cuda import poison_allocator, rel_err

pytestmark = pytest.mark.cuda

TOL = {torch.float32: 1e-5, torch.float16: 1e-2, torch.bfloat16: 1e-2}


def _kernels():
    from pyg_dfgnn.ops import cuda
    if not torch.cuda.is_available() or not cuda.available():
        pytest.skip('CUDA kernels unavailable')


def make_graph(kind, rng):
    g = torch.Generator().manual_seed(rng.randrange(2**31))
    if kind == 'empty':
        return torch.empty(2, 0, dtype=torch.long), 7
    if kind == 'one':
        return torch.tensor([[0], [0]]), 1
    n = rng.randint(2, 200)
    e = rng.randint(1, 6 * n)
    ei = torch.randint(0, n, (2, e), generator=g)
    if kind == 'super':  # node 0 gets ~3000 edges
        ei = torch.cat([ei, torch.stack([
            torch.randint(0, n, (3000, ), generator=g),
            torch.zeros(3000, dtype=torch.long)])], dim=1)
    ei[1, ei[1] == 1] = 2  # an empty row (before loops)
    ei[:, 0] = torch.tensor([3 % n, 3 % n])  # an input self-loop
    return ei, n


CASES = [(fill, kind, dtype)
         for fill in ('none', 'mean', 'add', 'const')
         for kind in ('random', 'super', 'empty', 'one')
         for dtype in (torch.float32, torch.float16, torch.bfloat16)]


@pytest.mark.parametrize('shared', [False, True])  # edge / row kernels
@pytest.mark.parametrize('fill,kind,dtype', CASES)
def test_dots_and_sums_match_reference(fill, kind, dtype, shared):
    seed = zlib.crc32(f'{fill}{kind}{dtype}'.encode())
    heads, dim = random.Random(seed + 1).choice([(1, 16), (3, 3), (8, 16),
                                                 (16, 32), (4, 5)])
    check_dots_and_sums(fill, kind, dtype, shared, heads, dim, seed)


# Rows in vectors, every width: per-node matrices in the lane-group kernel
# (H <= 8; D_e 4 .. 128: 1 .. 32 lanes per edge, idle lanes at D_e 12, 36;
# H = 16 stays on the row kernel), a shared one in the edge-parallel
# kernels (D_e 4 .. 300: 1 .. 75 column vectors per tile row; a d x / d M
# tile of 16 / 13 edges at D_e 256 / 300).
@pytest.mark.parametrize('heads,dim', [(1, 4), (2, 8), (3, 12), (4, 16),
                                       (8, 16), (5, 36), (4, 128), (8, 64),
                                       (16, 8), (1, 300), (2, 256)])
@pytest.mark.parametrize('fill', ['none', 'mean', 'const'])
@pytest.mark.parametrize('dtype', [torch.float32, torch.bfloat16])
@pytest.mark.parametrize('shared', [False, True])
def test_vector_rows_match_reference(heads, dim, fill, dtype, shared):
    seed = zlib.crc32(f'group{heads}{dim}{fill}{dtype}{shared}'.encode())
    check_dots_and_sums(fill, 'super', dtype, shared, heads, dim, seed)


def map_case(fill, kind, seed):
    """A graph of ``kind`` on the GPU with the loops ``fill`` asks for, its
    structure, and a generator for the case's tensors."""
    _kernels()
    clear_graph_cache()
    rng = random.Random(seed)
    gen = torch.Generator().manual_seed(seed)
    ei, n = make_graph(kind, rng)
    ei = ei.cuda()
    loops = None if fill == 'none' else n
    fill_value = {'none': None, 'mean': 'mean', 'add': 'add',
                  'const': 0.5}[fill]
    structure = resolve_graph(ei, n, n, ei.device, loops=loops)
    return ei, n, loops, fill_value, structure, gen


def check_dots_and_sums(fill, kind, dtype, shared, heads, dim, seed):
    ei, n, loops, fill_value, structure, gen = map_case(fill, kind, seed)
    e_in = ei.size(1)

    def rnd(*shape):
        x = torch.randn(*shape, generator=gen).to('cuda', dtype)
        return x.requires_grad_()

    edge_attr = rnd(e_in, dim)
    emap = structure.edge_attr_map(ei, edge_attr, fill_value)
    assert emap is not None
    e = emap.num_edges
    node_mat = rnd(1 if shared else n, heads, dim)
    weight = rnd(e, heads)
    x64 = edge_attr.detach().double().requires_grad_()
    m64 = node_mat.detach().double().requires_grad_()
    w64 = weight.detach().double().requires_grad_()
    emap64 = emap if emap.fill_row is None else \
        type(emap)(**{**emap.__dict__, 'fill_row': emap.fill_row.double()})

    poison_allocator()
    dots = edge_attr_dots(emap, edge_attr, node_mat)
    sums = edge_attr_sums(emap, edge_attr, weight)
    from pyg_dfgnn.ops.edge_attr import (edge_attr_dots_reference,
                                         edge_attr_sums_reference)
    ref_dots = edge_attr_dots_reference(emap64, x64, m64)
    ref_sums = edge_attr_sums_reference(emap64, x64, w64)
    assert dots.shape == ref_dots.shape and sums.shape == ref_sums.shape
    assert rel_err(dots, ref_dots) <= TOL[dtype]
    assert rel_err(sums, ref_sums) <= TOL[dtype]
    g_dots = torch.randn(dots.shape, generator=gen).to(dots)
    g_sums = torch.randn(sums.shape, generator=gen).to(sums)
    got = torch.autograd.grad((dots * g_dots).sum() + (sums * g_sums).sum(),
                              (edge_attr, node_mat, weight))
    want = torch.autograd.grad(
        (ref_dots * g_dots.double()).sum() + (
            ref_sums * g_sums.double()).sum(), (x64, m64, w64),
        allow_unused=True)  # (no edge reads edge_attr when E_in = 0)
    want = [torch.zeros_like(t) if g is None else g
            for g, t in zip(want, (x64, m64, w64))]
    for name, a, b in zip(('edge_attr', 'node_mat', 'weight'), got, want):
        assert torch.isfinite(a).all(), name
        assert rel_err(a, b, floor=1e-3) <= 2 * TOL[dtype], name
    if loops is not None and e_in > 0:  # the removed input self-loop
        assert bool((got[0][0] == 0).all())


# The dots' backward writing both terms of d x (EdgeTermsLink): the weights
# depend on the dots, as TransformerConv's attention weights on its scores.
@pytest.mark.parametrize('heads,dim', [(4, 16), (12, 16), (3, 5)])
@pytest.mark.parametrize('fill,kind', [('none', 'random'), ('none', 'super'),
                                       ('mean', 'random'), ('add', 'super'),
                                       ('const', 'random'), ('none', 'empty'),
                                       ('mean', 'one'), ('none', 'one')])
@pytest.mark.parametrize('dtype', [torch.float32, torch.bfloat16])
def test_linked_terms_match_reference(heads, dim, fill, kind, dtype,
                                      monkeypatch):
    from pyg_dfgnn.ops import edge_attr as ea
    seed = zlib.crc32(f'link{heads}{dim}{fill}{kind}{dtype}'.encode())
    ei, n, loops, fill_value, structure, gen = map_case(fill, kind, seed)
    x = torch.randn(ei.size(1), dim, generator=gen).to('cuda', dtype)
    emap = structure.edge_attr_map(ei, x, fill_value)
    m = torch.randn(n, heads, dim, generator=gen).to('cuda', dtype)
    w0 = torch.randn(emap.num_edges, heads, generator=gen).to('cuda', dtype)
    g_dots = torch.randn(emap.num_edges, heads, generator=gen).cuda()
    g_sums = torch.randn(n, heads, dim, generator=gen).cuda()
    emap64 = emap if emap.fill_row is None else \
        type(emap)(**{**emap.__dict__, 'fill_row': emap.fill_row.double()})
    seconds = []
    rows_op = ea._rows_op
    monkeypatch.setattr(ea, '_rows_op', lambda *args: seconds.append(
        len(args) > 7 and args[7] is not None) or rows_op(*args))

    def chain(x, m, w0, dots_fn, sums_fn):
        dots = dots_fn(x, m)
        sums = sums_fn(x, torch.sigmoid(dots) * w0)
        return (dots * g_dots.to(dots)).sum() + (sums * g_sums.to(sums)).sum()

    leaves = [t.detach().requires_grad_() for t in (x, m, w0)]
    poison_allocator()
    link = ea.EdgeTermsLink()
    got = torch.autograd.grad(chain(
        *leaves, lambda x, m: ea.edge_attr_dots(emap, x, m, link),
        lambda x, w: ea.edge_attr_sums(emap, x, w, link)), leaves)
    assert link.handed is None
    assert seconds.count(True) == (1 if ea.link_supported(heads, dim)
                                   else 0)
    ref = [t.detach().double().requires_grad_() for t in (x, m, w0)]
    want = torch.autograd.grad(chain(
        *ref, lambda x, m: ea.edge_attr_dots_reference(emap64, x, m),
        lambda x, w: ea.edge_attr_sums_reference(emap64, x, w)), ref,
        allow_unused=True)
    # PyTorch's own float32 ops on the chain set the bar too: a row's loop
    # that sums ~3,000 others ('add' on the super node) costs them ~5e-5.
    # On the GPU and on the CPU: the GPU's scatter sums are unordered, so
    # their error moves between runs (1.1e-5 in one, below the kernels'
    # fixed 9.3e-5 / 3, session 28); the CPU's is the same every run.
    def want_float32(device):
        fields = {k: v.to(device) if isinstance(v, torch.Tensor) else v
                  for k, v in emap.__dict__.items()}
        if emap.fill_row is not None:
            fields['fill_row'] = fields['fill_row'].float()
        emap32 = type(emap)(**fields)
        ref32 = [t.detach().float().to(device).requires_grad_()
                 for t in (x, m, w0)]
        return torch.autograd.grad(chain(
            *ref32, lambda x, m: ea.edge_attr_dots_reference(emap32, x, m),
            lambda x, w: ea.edge_attr_sums_reference(emap32, x, w)), ref32,
            allow_unused=True)

    for name, a, b, gpu32, cpu32, t in zip(
            ('edge_attr', 'node_mat', 'w0'), got, want,
            want_float32(x.device), want_float32('cpu'), ref):
        b = torch.zeros_like(t) if b is None else b
        bars = [rel_err(torch.zeros_like(t) if b32 is None else
                        b32.to(t.device), b, floor=1e-3)
                for b32 in (gpu32, cpu32)]
        tol = max(2 * TOL[dtype], 3 * max(bars))
        assert torch.isfinite(a).all(), name
        assert rel_err(a, b, floor=1e-3) <= tol, name

    # A pass without the dots' backward drops what the sums handed: the
    # next pass (the dots alone) must not add it.
    link = ea.EdgeTermsLink()
    dots = ea.edge_attr_dots(emap, leaves[0], leaves[1], link)
    sums = ea.edge_attr_sums(emap, leaves[0], torch.sigmoid(dots) * leaves[2],
                             link)
    torch.autograd.grad((sums * g_sums.to(sums)).sum(), leaves[2],
                        retain_graph=True)
    assert link.handed is None
    alone = torch.autograd.grad((dots * g_dots.to(dots)).sum(), leaves[0])[0]
    ref_alone = torch.autograd.grad(
        (ea.edge_attr_dots_reference(emap64, ref[0], ref[1]) *
         g_dots.double()).sum(), ref[0], allow_unused=True)[0]
    if ref_alone is None:
        ref_alone = torch.zeros_like(ref[0])
    assert rel_err(alone, ref_alone, floor=1e-3) <= 2 * TOL[dtype]


def test_deterministic():
    _kernels()
    ei = torch.randint(0, 300, (2, 5000), device='cuda')
    structure = resolve_graph(ei, 300, 300, ei.device, loops=300)
    x = torch.randn(5000, 16, device='cuda', requires_grad=True)
    emap = structure.edge_attr_map(ei, x, 'mean')
    m = torch.randn(1, 8, 16, device='cuda', requires_grad=True)
    runs = []
    for _ in range(2):
        t = edge_attr_dots(emap, x, m)
        runs.append((t,) + torch.autograd.grad(t.square().sum(), (x, m)))
    for a, b in zip(*runs):
        assert torch.equal(a, b)


CONVS = [('GATConv', 'DFGATConv', dict(heads=3, edge_dim=5)),
         ('GATConv', 'DFGATConv', dict(heads=2, edge_dim=4, fill_value=0.3)),
         ('GATConv', 'DFGATConv', dict(heads=2, edge_dim=4, fill_value='add',
                                       concat=False)),
         ('TransformerConv', 'DFTransformerConv', dict(heads=3, edge_dim=5)),
         ('TransformerConv', 'DFTransformerConv',
          dict(heads=2, edge_dim=7, beta=True, concat=False))]


@pytest.mark.parametrize('pyg_name,our_name,kwargs', CONVS)
@pytest.mark.parametrize('dtype', [torch.float32, torch.bfloat16])
def test_convs_with_raw_edge_attributes_match_pyg(pyg_name, our_name,
                                                   kwargs, dtype):
    check_conv_against_pyg(pyg_name, our_name, kwargs, dtype, 11)


def check_conv_against_pyg(pyg_name, our_name, kwargs, dtype, channels):
    """Our conv against PyG's with the same weights (24 -> ``channels``
    per head) on a graph with input self-loops: output, attention weights
    and every gradient, fp32 or under bf16 autocast; returns the names of
    the CUDA kernels our conv ran."""
    _kernels()
    import torch_geometric.nn as pyg_nn

    import pyg_dfgnn.nn as df_nn
    torch.manual_seed(0)
    n = 150
    ei = torch.randint(0, n, (2, 1200), device='cuda')
    ei[:, :4] = 7  # input self-loops (removed by GAT)
    x = torch.randn(n, 24, device='cuda')
    edge_attr = torch.randn(ei.size(1), kwargs['edge_dim'], device='cuda',
                            requires_grad=True)
    ref = getattr(pyg_nn, pyg_name)(24, channels, **kwargs).cuda()
    ours = getattr(df_nn, our_name)(24, channels, **kwargs).cuda()
    ours.load_state_dict(ref.state_dict())
    outs = []
    for conv in (ref, ours):
        with torch.profiler.profile(
                activities=[torch.profiler.ProfilerActivity.CUDA]) as prof:
            with torch.autocast('cuda', dtype,
                                enabled=dtype != torch.float32):
                out, (_, alpha) = conv(x, ei, edge_attr,
                                       return_attention_weights=True)
            g = torch.autograd.grad(out.float().square().sum(),
                                    [edge_attr] + list(conv.parameters()))
            torch.cuda.synchronize()
        outs.append((out, alpha, g))
    tol = 2e-5 if dtype == torch.float32 else 3e-2
    (o1, a1, g1), (o2, a2, g2) = outs
    assert rel_err(o2, o1) <= tol
    assert rel_err(a2, a1) <= tol
    # (the key bias's gradient is zero up to rounding: softmax is
    # shift-invariant; compare each gradient on the scale of all of them)
    scale = max(b.norm().item() for b in g1)
    for a, b in zip(g2, g1):
        assert (a - b).norm().item() <= 5 * tol * max(b.norm().item(),
                                                      1e-3 * scale)
    return ' '.join(e.key for e in prof.key_averages())


# GATv2's edge keys (kernels/edge_attr_project.cu): every fill and graph
# kind, D_e 1 .. 16 (register bounds 4 / 8 / 16, rows in vectors or not),
# H * F of one, two and three lane passes (4, 132, 260: idle lanes).
@pytest.mark.parametrize('fill,kind,dtype', CASES)
def test_projection_matches_reference(fill, kind, dtype):
    seed = zlib.crc32(f'project{fill}{kind}{dtype}'.encode())
    dim, out_dim = random.Random(seed).choice(
        [(1, 4), (3, 132), (4, 128), (5, 260), (8, 64), (16, 128),
         (16, 260), (13, 36)])
    check_projection(fill, kind, dtype, dim, out_dim, seed)


@pytest.mark.parametrize('dim,out_dim', [(1, 4), (3, 132), (4, 128),
                                         (8, 64), (12, 260), (16, 128)])
@pytest.mark.parametrize('fill', ['mean', 'const', 'none'])
def test_projection_widths_match_reference(dim, out_dim, fill):
    seed = zlib.crc32(f'project-width{dim}{out_dim}{fill}'.encode())
    check_projection(fill, 'super', torch.float32, dim, out_dim, seed)


def check_projection(fill, kind, dtype, dim, out_dim, seed):
    from pyg_dfgnn.ops.edge_attr import csr_edge_attr, edge_attr_project
    ei, _, loops, fill_value, structure, gen = map_case(fill, kind, seed)
    edge_attr = torch.randn(ei.size(1), dim, generator=gen).to(
        'cuda', dtype).requires_grad_()
    weight = torch.randn(out_dim, dim, generator=gen).to(
        'cuda', dtype).requires_grad_()
    emap = structure.edge_attr_map(ei, edge_attr, fill_value)
    x64 = edge_attr.detach().double().requires_grad_()
    w64 = weight.detach().double().requires_grad_()
    emap64 = emap if emap.fill_row is None else \
        type(emap)(**{**emap.__dict__, 'fill_row': emap.fill_row.double()})
    poison_allocator()
    key = edge_attr_project(emap, edge_attr, weight)
    ref = csr_edge_attr(emap64, x64) @ w64.t()
    assert key.shape == ref.shape == (emap.num_edges, out_dim)
    assert key.dtype == dtype and torch.isfinite(key).all()
    assert rel_err(key, ref) <= TOL[dtype]
    g = torch.randn(key.shape, generator=gen).to(key)
    got = torch.autograd.grad(key, (edge_attr, weight), g)
    want = torch.autograd.grad(ref, (x64, w64), g.double(),
                               allow_unused=True)
    want = [torch.zeros_like(t) if w is None else w
            for w, t in zip(want, (x64, w64))]
    for name, a, b in zip(('edge_attr', 'weight'), got, want):
        assert a.dtype == dtype and torch.isfinite(a).all(), name
        assert rel_err(a, b, floor=1e-3) <= 2 * TOL[dtype], name
    if loops is not None and ei.size(1) > 0:  # the removed input self-loop
        assert bool((got[0][0] == 0).all())


# fp32 runs the tensor-core backward (with its loops kernel), half precision
# the CUDA-core one.
@pytest.mark.parametrize('dtype,backward', [
    (torch.float32, 'project_bwd_tc_kernel'),
    (torch.bfloat16, 'project_bwd_kernel')])
def test_projection_is_deterministic_and_runs_the_kernels(dtype, backward):
    from pyg_dfgnn.ops.edge_attr import edge_attr_project
    _kernels()
    ei = torch.randint(0, 300, (2, 5000), device='cuda')
    structure = resolve_graph(ei, 300, 300, ei.device, loops=300)
    x = torch.randn(5000, 16, device='cuda', dtype=dtype, requires_grad=True)
    w = torch.randn(128, 16, device='cuda', dtype=dtype, requires_grad=True)
    emap = structure.edge_attr_map(ei, x, 'mean')
    runs = []
    with torch.profiler.profile(
            activities=[torch.profiler.ProfilerActivity.CUDA]) as prof:
        for _ in range(2):
            k = edge_attr_project(emap, x, w)
            runs.append((k,) + torch.autograd.grad(k.square().sum(), (x, w)))
        torch.cuda.synchronize()
    names = ' '.join(e.key for e in prof.key_averages())
    assert 'project_fwd_kernel' in names and backward in names
    if dtype == torch.float32:
        assert 'project_loops_kernel' in names
    for a, b in zip(*runs):
        assert torch.equal(a, b)


# The backward's loops kernel writes each edge's row itself when the op is
# not handed the map's: both give the same bits (fp32: the tensor-core
# backward; De 4 / 8 / 16: the loops kernel's 1, 2 and 4 column groups).
@pytest.mark.parametrize('dim', [4, 8, 16])
@pytest.mark.parametrize('fill', ['mean', 'add', 'const'])
def test_projection_op_builds_edge_rows_when_not_given(dim, fill):
    from pyg_dfgnn.ops.edge_attr import (FILL_IDS, _zero_unused_rows,
                                         csr_edge_attr)
    _kernels()
    clear_graph_cache()
    gen = torch.Generator().manual_seed(zlib.crc32(f'rows{dim}{fill}'.encode()))
    ei = torch.randint(0, 200, (2, 3000), generator=gen).cuda()
    structure = resolve_graph(ei, 200, 200, ei.device, loops=200)
    x = torch.randn(3000, dim, generator=gen).cuda()
    w = torch.randn(64, dim, generator=gen).cuda()
    emap = structure.edge_attr_map(ei, x, 0.5 if fill == 'const' else fill)
    g = torch.randn(emap.num_edges, 64, generator=gen).cuda()
    fill_row = None if emap.fill_row is None else emap.fill_row.to(x.dtype)
    args = (emap.rowptr, emap.index, emap.num_edges, x, FILL_IDS[emap.fill],
            fill_row, w, g, emap.loop_pos)
    assert emap.edge_row is not None
    poison_allocator()
    given = torch.ops.pyg_dfgnn.edge_attr_project(*args, emap.edge_row)
    poison_allocator()
    built = torch.ops.pyg_dfgnn.edge_attr_project(*args)
    for out in (given, built):  # (input self-loops: rows no edge reads)
        _zero_unused_rows(emap, out[1])
    for a, b in zip(given[1:], built[1:]):
        assert torch.isfinite(a).all() and torch.equal(a, b)
    # and d W is the gradient: sum_p g_p x_p^T over the CSR rows
    want = g.double().t() @ csr_edge_attr(emap, x.double())
    assert rel_err(given[2], want) <= 1e-5


@pytest.mark.parametrize('kwargs', [
    dict(heads=3, edge_dim=5),  # H * C = 36: the projection kernels
    dict(heads=2, edge_dim=16, fill_value=0.3, dropout=0.0),
    dict(heads=2, edge_dim=4, fill_value='add', concat=False),
    dict(heads=2, edge_dim=3, share_weights=True)])
@pytest.mark.parametrize('dtype', [torch.float32, torch.bfloat16])
def test_gatv2_with_projected_edge_keys_matches_pyg(kwargs, dtype):
    names = check_conv_against_pyg('GATv2Conv', 'DFGATv2Conv', kwargs,
                                   dtype, 12)
    assert 'project_fwd_kernel' in names and 'project_bwd_kernel' in names

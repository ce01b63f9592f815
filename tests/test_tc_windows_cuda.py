"""Tensor-core windows (kernels/fwd_tc_kernel.cuh, strategy 'tc') against
the float64 reference and against SMMF (GPU only).

Batches of small graphs with duplicate edges, self-loops, isolated nodes and
graphs of one node; every D = F the kernel takes, H = 1 / 3 / 4, fp32
(3xTF32, held to fp32's tolerance), fp16 and bf16; outputs after poisoning the allocator; gradients through the
unchanged backward (which reads the TC forward's lse); a window of more rows
than one count chunk; and the clear errors for what the strategy does not
take."""
import math
import random

import pytest
import torch

from pyg_dfgnn.graph import DFGraph
from pyg_dfgnn.ops.reference import fused_attention_reference

from test_kernels_cuda import _cuda, poison_allocator, rel_err

pytestmark = pytest.mark.cuda

DTYPES = (torch.float32, torch.float16, torch.bfloat16)
# fp32 through 3xTF32: held to the SMMF kernels' fp32 tolerances
TOL_OUT = {torch.float32: 2e-5, torch.float16: 1e-2, torch.bfloat16: 1e-2}
TOL_GRAD = {torch.float32: 1e-4, torch.float16: 2e-2, torch.bfloat16: 2e-2}
# rel_err's absolute floor for gradients that are ~0: a one-node row's d Q
# and d K are 0 exactly (one source), ours the mismatch between the TC
# forward's S (3xTF32, ~2^-21 per product) and the backward's fp32 S times
# |dP| |K| scale -- measured up to 4e-6 per element (1.9e-4 and 4.1e-4 of
# the bound with a floor of 1e-2: random draws, session 25); 1e-1 allows
# 1e-5 per element there and changes nothing where the gradients are O(1)
GRAD_FLOOR = {torch.float32: 1e-1, torch.float16: 1.0, torch.bfloat16: 1.0}


def batch_graph(rng: random.Random, max_nodes: int = 128):
    """A batch of small graphs (sizes 1 .. max_nodes), edges drawn with
    repetition (multi-edges kept), some isolated nodes."""
    g = torch.Generator().manual_seed(rng.randrange(2**31))
    eis, off = [], 0
    for _ in range(rng.randint(1, 9)):
        n = rng.choice((1, 2, rng.randint(3, max_nodes), max_nodes))
        e = rng.randint(0, 6 * n)
        src = torch.randint(0, n, (e, ), generator=g)
        dst = torch.randint(0, n, (e, ), generator=g)
        if rng.random() < 0.3:  # isolated destinations
            dst = dst - dst % 2
        eis.append(torch.stack([src, dst]) + off)
        off += n
    ei = torch.cat(eis, dim=1)
    ei = ei[:, torch.randperm(ei.size(1), generator=g)]
    return ei, off


def inputs(n, heads, dh, dtype, gen, grad=True):
    def rnd(*shape):
        return torch.randn(*shape, generator=gen).to('cuda', dtype) \
            .requires_grad_(grad)
    return rnd(n, heads, dh), rnd(n, heads, dh), rnd(n, heads, dh)


def check(cuda, graph, value, query, key, dtype, tag, grad=True,
          strategy='tc'):
    scale = 1.0 / math.sqrt(query.size(-1))
    poison_allocator()
    out = cuda.fused_attention_cuda(graph, 'dot', value, query, key, None,
                                    scale, 0.2, strategy=strategy)
    assert torch.isfinite(out).all(), f'unwritten output: {tag}'
    leaves = [value, query, key]
    ref_leaves = [t.detach().double().requires_grad_(grad) for t in leaves]
    ref, _ = fused_attention_reference(graph, 'dot', *ref_leaves, None,
                                       scale, 0.2)
    err = rel_err(out, ref)
    assert err <= TOL_OUT[dtype], f'out rel err {err:.2e}: {tag}'
    smmf = cuda.fused_attention_cuda(graph, 'dot', value, query, key, None,
                                     scale, 0.2, strategy='smmf')
    err = rel_err(out, smmf.double())
    assert err <= TOL_OUT[dtype], f'tc vs smmf rel err {err:.2e}: {tag}'
    if not grad:
        return
    g_out = torch.randn_like(out)
    poison_allocator()
    grads = torch.autograd.grad(out, leaves, g_out)
    ref_grads = torch.autograd.grad(ref, ref_leaves, g_out.double())
    for name, gv, rg in zip(('value', 'query', 'key'), grads, ref_grads):
        assert torch.isfinite(gv).all(), f'grad_{name} non-finite: {tag}'
        err = rel_err(gv, rg, floor=GRAD_FLOOR[dtype])
        assert err <= TOL_GRAD[dtype], f'grad_{name} rel err {err:.2e}: {tag}'


@pytest.mark.parametrize('dh', (16, 32, 64, 128))
@pytest.mark.parametrize('heads', (1, 3, 4))
@pytest.mark.parametrize('dtype', DTYPES)
def test_tc_batches(dtype, heads, dh):
    cuda = _cuda()
    rng = random.Random(hash((str(dtype), heads, dh)) % 2**31)
    for _ in range(3):
        ei, n = batch_graph(rng)
        graph = DFGraph.from_edge_index(ei.cuda(), num_nodes=n)
        gen = torch.Generator().manual_seed(rng.randrange(2**31))
        check(cuda, graph, *inputs(n, heads, dh, dtype, gen), dtype,
              f'{dtype} H={heads} D={dh} N={n} E={graph.num_edges}')


@pytest.mark.parametrize('dtype', DTYPES)
def test_tc_complete_graphs(dtype):
    """GPS's global attention: block-diagonal complete graphs (dense
    windows), with a graph of one node."""
    cuda = _cuda()
    sizes = [1, 37, 128, 64, 118]
    ei = torch.cat([torch.cartesian_prod(torch.arange(s), torch.arange(s)).t()
                    + sum(sizes[:i]) for i, s in enumerate(sizes)], dim=1)
    n = sum(sizes)
    graph = DFGraph.from_edge_index(ei.cuda(), num_nodes=n)
    gen = torch.Generator().manual_seed(0)
    check(cuda, graph, *inputs(n, 4, 16, dtype, gen), dtype, 'complete')


@pytest.mark.parametrize('dh', (32, 128))
def test_tc_fp32_one_tf32_product_under_allow_tf32(dh):
    """fp32 under torch.backends.cuda.matmul.allow_tf32: the TC windows
    take one TF32 product per tile -- the forward alone (strategy 5) without
    a backward, both passes (6) with one: within TF32's error of the
    reference, and not the 3xTF32 result (which is within fp32's); the flag
    restored, 3xTF32 again (and the plan cached per flag)."""
    cuda = _cuda()
    g = torch.Generator().manual_seed(5)
    # (dense enough for 3xTF32's forward and 1xTF32's backward)
    sizes = [100, 37, 128, 1, 90]
    degree = max(rule_degree(cuda, cuda.TC_FWD_MIN_EDGES_FP32, dh, sizes),
                 rule_degree(cuda, cuda.TC_TF32_BWD_MIN_EDGES, dh, sizes))
    ei, n = dense_batch(sizes, degree, g)
    graph = DFGraph.from_edge_index(ei.cuda(), num_nodes=n)
    value, query, key = inputs(n, 128 // dh, dh, torch.float32, g)
    scale = 1.0 / math.sqrt(dh)
    ref_leaves = [t.detach().double().requires_grad_()
                  for t in (value, query, key)]
    ref, _ = fused_attention_reference(graph, 'dot', *ref_leaves, None,
                                       scale, 0.2)
    before = torch.backends.cuda.matmul.allow_tf32
    try:
        torch.backends.cuda.matmul.allow_tf32 = True
        # asked for without a backward, and picked unasked with one
        assert cuda._plan(graph, 'dot', query, value, 'tc')[0] == 5
        assert cuda._plan(graph, 'dot', query, value, None,
                          backward=True)[0] == 6
        with torch.no_grad():
            poison_allocator()
            out = cuda.fused_attention_cuda(graph, 'dot', value, query, key,
                                            None, scale, 0.2, strategy='tc')
        err = rel_err(out, ref)
        assert 2e-5 < err <= 5e-3, f'1xTF32 rel err {err:.2e} (tc)'
        poison_allocator()
        out = cuda.fused_attention_cuda(graph, 'dot', value, query, key,
                                        None, scale, 0.2)
        err = rel_err(out, ref)
        assert 2e-5 < err <= 5e-3, f'1xTF32 rel err {err:.2e} (auto)'
        g_out = torch.randn_like(out)
        grads = torch.autograd.grad(out, (value, query, key), g_out)
        ref_grads = torch.autograd.grad(ref, ref_leaves, g_out.double())
        for gv, rg in zip(grads, ref_grads):
            assert rel_err(gv, rg, floor=1e-2) <= 2e-2
    finally:
        torch.backends.cuda.matmul.allow_tf32 = before
    torch.backends.cuda.matmul.allow_tf32 = False
    try:
        # (3xTF32's TC backward from a higher degree)
        bwd_3x = degree >= rule_degree(cuda, cuda.TC_BWD_MIN_EDGES_FP32, dh,
                                       sizes)
        assert cuda._plan(graph, 'dot', query, value, None,
                          backward=True)[0] == (2 if bwd_3x else 3)
        out = cuda.fused_attention_cuda(graph, 'dot', value, query, key,
                                        None, scale, 0.2, strategy='tc')
        assert rel_err(out, ref) <= TOL_OUT[torch.float32]
    finally:
        torch.backends.cuda.matmul.allow_tf32 = before


def test_tc_window_of_more_rows_than_a_chunk():
    """A 600-row window reading 100 sources: counts are built per chunk of
    kTcMaxRows rows (the window staged again per chunk). owner_windows cuts
    at most max_window_rows rows, so the window is put into the graph's
    window cache; the column windows of the backward stay the graph's own
    (graph_windows would serve as both, which a bipartite graph cannot)."""
    cuda = _cuda()
    g = torch.Generator().manual_seed(1)
    n_src, n_dst, e = 100, 600, 3000
    ei = torch.stack([torch.randint(0, n_src, (e, ), generator=g),
                      torch.randint(0, n_dst, (e, ), generator=g)])
    graph = DFGraph.from_edge_index(ei.cuda(), size=(n_src, n_dst))
    graph._windows[('row', cuda.TC_MAX_SOURCES, 64)] = (
        torch.tensor([0, n_dst], device='cuda'), n_src)
    value, _, key = inputs(n_src, 2, 32, torch.bfloat16, g)
    query = torch.randn(n_dst, 2, 32, generator=g).to('cuda', torch.bfloat16)
    check(cuda, graph, value, query.requires_grad_(), key, torch.bfloat16,
          '600-row window')
    value, _, key = inputs(n_src, 2, 32, torch.float32, g)
    query = torch.randn(n_dst, 2, 32, generator=g, device='cpu').cuda()
    check(cuda, graph, value, query.requires_grad_(), key, torch.float32,
          '600-row window fp32')


@pytest.mark.parametrize('repeat_chunk', (0, 1))
def test_tc_repeated_edges_in_one_chunk(repeat_chunk):
    """A 256-row window (two chunks of kTcMaxRows rows) whose repeated
    edges are all in one chunk: the bits find a repeat by atomicOr's old
    word and only then are the chunk's edges counted (the flag stays set for
    the chunks after, whose counts are exact as well)."""
    cuda = _cuda()
    g = torch.Generator().manual_seed(7 + repeat_chunk)
    n_src, n_dst, deg = 64, 256, 8
    src = torch.stack([torch.randperm(n_src, generator=g)[:deg]
                       for _ in range(n_dst)])
    dst = torch.arange(n_dst).repeat_interleave(deg)
    # every fifth row of the chunk: its first edge twice more (3 in all)
    rows = torch.arange(128 * repeat_chunk, 128 * (repeat_chunk + 1), 5)
    ei = torch.cat([torch.stack([src.flatten(), dst]),
                    torch.stack([src[rows, 0], rows]).repeat(1, 2)], dim=1)
    graph = DFGraph.from_edge_index(ei.cuda(), size=(n_src, n_dst))
    graph._windows[('row', cuda.TC_MAX_SOURCES, 64)] = (
        torch.tensor([0, n_dst], device='cuda'), n_src)
    for dtype in (torch.bfloat16, torch.float32):
        value, _, key = inputs(n_src, 3, 32, dtype, g)
        query = torch.randn(n_dst, 3, 32, generator=g).to('cuda', dtype)
        check(cuda, graph, value, query.requires_grad_(), key, dtype,
              f'repeats in chunk {repeat_chunk} {dtype}')


def test_tc_empty_and_single_node():
    cuda = _cuda()
    g = torch.Generator().manual_seed(2)
    for ei, n in ((torch.tensor([[0], [0]]), 1),
                  (torch.tensor([[0, 1], [0, 0]]), 3)):  # rows 1, 2 empty
        graph = DFGraph.from_edge_index(ei.cuda(), num_nodes=n)
        # one window of all rows (a single graph: no cut found)
        graph = DFGraph(graph.rowptr, graph.col, n, graph_windows=(
            torch.tensor([0, n], device='cuda'), n))
        check(cuda, graph, *inputs(n, 3, 16, torch.float16, g),
              torch.float16, f'N={n}')


@pytest.mark.parametrize('dtype', DTYPES)
def test_tc_rows_not_16_byte_aligned(dtype):
    """Q, K, V one element past an aligned address (views into a larger
    buffer): the host hands the TC kernels aligned copies (their fragments
    and cp.async read 4 / 16 bytes at a time)."""
    cuda = _cuda()
    g = torch.Generator().manual_seed(6)
    ei, n = batch_graph(random.Random(6))
    graph = DFGraph.from_edge_index(ei.cuda(), num_nodes=n)

    def shifted(t):
        buf = torch.zeros(t.numel() + 1, dtype=dtype, device='cuda')
        buf[1:].copy_(t.reshape(-1))
        return buf[1:].view_as(t).requires_grad_()

    value, query, key = (shifted(t) for t in inputs(n, 2, 32, dtype, g,
                                                     grad=False))
    assert all(t.data_ptr() % 16 for t in (value, query, key))
    check(cuda, graph, value, query, key, dtype, f'unaligned {dtype}')


def test_tc_errors():
    cuda = _cuda()
    g = torch.Generator().manual_seed(3)
    ei, n = batch_graph(random.Random(4))
    graph = DFGraph.from_edge_index(ei.cuda(), num_nodes=n)

    def call(kind='dot', dtype=torch.bfloat16, d=32, f=32, graph=graph):
        v = torch.randn(graph.num_src, 2, f, generator=g).to('cuda', dtype)
        q = torch.randn(graph.num_dst, 2, d, generator=g).to('cuda', dtype)
        k = torch.randn(graph.num_src, 2, d, generator=g).to('cuda', dtype)
        if kind == 'add':
            q, k = q[..., 0].contiguous(), k[..., 0].contiguous()
        return cuda.fused_attention_cuda(graph, kind, v, q, k, None, 1.0,
                                         0.2, strategy='tc')

    with pytest.raises(ValueError, match='tensor-core'):
        call(kind='add')
    with pytest.raises(ValueError, match='tensor-core'):
        call(d=24, f=24)
    with pytest.raises(ValueError, match='tensor-core'):
        call(d=32, f=64)
    big = torch.randint(0, 300, (2, 3000), generator=g)  # one 300-node graph
    with pytest.raises(ValueError, match='row windows of at most 128'):
        call(graph=DFGraph.from_edge_index(big.cuda(), num_nodes=300))


@pytest.mark.parametrize('dh', (16, 64, 128))
@pytest.mark.parametrize('dtype', DTYPES)
def test_tc_backward_windows(dtype, dh):
    """Windows of <= 128 rows with their own sources: the backward takes
    the tensor-core windows too (strategy 2; fp32 at D = 128 as well since
    session 42)."""
    cuda = _cuda()
    g = torch.Generator().manual_seed(dh)
    sizes, eis, off = [100, 100, 90, 1, 100, 128], [], 0
    for n in sizes:  # multi-edges, self-loops, isolated nodes
        e = 5 * n
        src = torch.randint(0, n, (e, ), generator=g)
        dst = torch.randint(0, n, (e, ), generator=g)
        eis.append(torch.stack([src, dst - dst % 3 if n > 90 else dst]) + off)
        off += n
    graph = DFGraph.from_edge_index(torch.cat(eis, 1).cuda(), num_nodes=off)
    q, k, v = inputs(off, 2, dh, dtype, g)
    plan = cuda._plan(graph, 'dot', q, v, 'tc', backward=True)
    assert plan[0] == 2
    check(cuda, graph, v, q, k, dtype, f'{dtype} D={dh} sid={plan[0]}')


@pytest.mark.parametrize('heads', (3, 4))
@pytest.mark.parametrize('one_tf32', (False, True))
@pytest.mark.parametrize('dh', (16, 32, 64, 128))
def test_tc_fp32_backward_products(dh, one_tf32, heads):
    """The fp32 TC backward called through the ops at every D: 3xTF32
    (strategy 2) within fp32's tolerances, 1xTF32 (strategy 6, its TF32
    forward before it) within TF32's and not within fp32's (so that the
    one product is what ran); H = 3 and 4, multi-edges, isolated rows, a
    graph of one node, gradients poisoned first."""
    cuda = _cuda()
    g = torch.Generator().manual_seed(100 + dh)
    graph, n = isolated_dense_batch(g)
    value, query, key = inputs(n, heads, dh, torch.float32, g, grad=False)
    scale = 1.0 / math.sqrt(dh)
    plan = cuda._plan(graph, 'dot', query, value, 'tc', backward=True)
    sid = 6 if one_tf32 else 2
    ops = torch.ops.pyg_dfgnn
    colptr, csc_row, csc_perm = graph.csc()
    poison_allocator()
    out, lse, *_ = ops.fused_attention_fwd(
        graph.rowptr, graph.col, 0, query, key, value, None, scale, 0.2, sid,
        graph.max_in_degree, plan[2], plan[3])
    g_out = torch.randn(out.shape, generator=g).cuda()
    poison_allocator()
    grads = ops.fused_attention_bwd(
        g_out, graph.rowptr, graph.col, colptr, csc_row, csc_perm, 0, query,
        key, value, None, lse, scale, 0.2, *cuda.bwd_plan_args(plan),
        strategy=sid)
    leaves = [t.double().requires_grad_() for t in (query, key, value)]
    ref, _ = fused_attention_reference(graph, 'dot', leaves[2], leaves[0],
                                       leaves[1], None, scale, 0.2)
    ref_grads = torch.autograd.grad(ref, leaves, g_out.double())
    errs = [rel_err(out, ref)] + [
        rel_err(gv, rg, floor=GRAD_FLOOR[torch.float32])
        for gv, rg in zip(grads[:3], ref_grads)]
    assert all(torch.isfinite(t).all() for t in (out, ) + tuple(grads[:3]))
    if one_tf32:
        assert all(e <= 2e-2 for e in errs), f'1xTF32 rel errs {errs}'
        assert max(errs[1:]) > 2e-5, f'3xTF32-sized errors {errs}'
    else:
        assert errs[0] <= TOL_OUT[torch.float32], f'out {errs[0]:.2e}'
        assert max(errs[1:]) <= TOL_GRAD[torch.float32], f'grads {errs}'


@pytest.mark.parametrize('heads, dh', [(8, 16), (2, 64), (4, 32), (8, 32),
                                       (2, 16), (6, 32)])
@pytest.mark.parametrize('dtype', DTYPES)
def test_tc_many_heads(dtype, heads, dh):
    """Many heads of small D through the TC forward and backward (each
    head's window work repeats per head: session 41's A/B staged them in
    groups, reverted): 8 x 16, 8 x 32, 6 x 32, 2 x 16 / 64, 4 x 32 against
    the reference and SMMF."""
    cuda = _cuda()
    g = torch.Generator().manual_seed(heads * 1000 + dh)
    graph, n = isolated_dense_batch(g)
    value, query, key = inputs(n, heads, dh, dtype, g)
    plan = cuda._plan(graph, 'dot', query, value, 'tc', backward=True)
    assert plan[0] == 2  # the TC forward and backward
    check(cuda, graph, value, query, key, dtype,
          f'{dtype} H={heads} D={dh}')


def isolated_dense_batch(gen):
    """``(DFGraph on CUDA, N)``: graphs of 100, 1, 37, 128 and 90 nodes of
    in-degree 20 (multi-edges, self-loops) with every seventh destination
    isolated."""
    ei, n = dense_batch([100, 1, 37, 128, 90], 20, gen)
    ei = ei[:, ei[1] % 7 != 3]
    return DFGraph.from_edge_index(ei.cuda(), num_nodes=n), n


def dense_batch(sizes, degree, gen):
    """Disjoint graphs of the given sizes, ``degree`` random in-edges per
    node (multi-edges and self-loops kept)."""
    eis, off = [], 0
    for n in sizes:
        dst = torch.arange(n).repeat_interleave(degree)
        src = torch.randint(0, n, (n * degree, ), generator=gen)
        eis.append(torch.stack([src, dst]) + off)
        off += n
    return torch.cat(eis, 1), off


def rule_degree(cuda, table, dh, sizes):
    """The smallest whole in-degree of dense_batch(sizes, .) from which the
    tensor-core rule table[dh] (ops/cuda.py: edges against rows and
    windows) is met: its windows' rows decide (tc_rule_degree)."""
    ei, n = dense_batch(sizes, 8, torch.Generator().manual_seed(0))
    windows, _ = DFGraph.from_edge_index(ei, num_nodes=n).graph_row_windows(
        cuda.TC_MAX_SOURCES)
    return math.ceil(cuda.tc_rule_degree(table[dh],
                                         n / (windows.numel() - 1)))


@pytest.mark.parametrize('dtype', (torch.float16, torch.bfloat16))
def test_smmf_forward_tc_backward_is_picked_and_matches(dtype, monkeypatch):
    """Without a strategy, a dense fp16 / bf16 'dot' batch where only the
    backward's tensor-core windows pay runs SMMF forward and the TC
    backward (strategy 4; the forward's rule is raised here so that the
    band is wide), with the reference's outputs and gradients; sparse
    graphs, fp32 below its rules, other kinds and training features keep
    strategy 0."""
    cuda = _cuda()
    monkeypatch.setitem(cuda.TC_FWD_MIN_EDGES, 16, (1 << 20, 0))
    g = torch.Generator().manual_seed(7)
    sizes = [100, 37, 128, 1, 90]
    degree = rule_degree(cuda, cuda.TC_BWD_MIN_EDGES, 16, sizes) + 2
    assert degree < rule_degree(cuda, cuda.TC_FWD_MIN_EDGES_FP32, 16, sizes)
    ei, n = dense_batch(sizes, degree, g)
    graph = DFGraph.from_edge_index(ei.cuda(), num_nodes=n)
    q, k, v = inputs(n, 8, 16, dtype, g)
    assert cuda._plan(graph, 'dot', q, v, None, backward=True)[0] == 4
    assert cuda._plan(graph, 'dot', q, v, None, backward=False)[0] == 0
    assert cuda._plan(graph, 'dot', q, v, None, backward=True,
                      features=True)[0] == 0
    assert cuda._plan(graph, 'dot', q, v, 'smmf', backward=True)[0] == 0
    q32 = q.detach().float()
    assert cuda._plan(graph, 'dot', q32, q32, None, backward=True)[0] == 0
    check(cuda, graph, v, q, k, dtype, f'{dtype} strategy 4', strategy=None)
    # sparse: the rows / cols passes stay
    ei, n = dense_batch([100, 60], 4, g)
    sparse = DFGraph.from_edge_index(ei.cuda(), num_nodes=n)
    q, _, v = inputs(n, 8, 16, dtype, g)
    assert cuda._plan(sparse, 'dot', q, v, None, backward=True)[0] == 0


@pytest.mark.parametrize('dtype', DTYPES)
@pytest.mark.parametrize('dh', (32, 128))
def test_tc_forward_is_picked_where_dense_and_matches(dtype, dh):
    """Without a strategy, a fp16 / bf16 'dot' batch dense enough for both
    TC passes (TC_FWD_MIN_EDGES[D], TC_BWD_MIN_EDGES[D]) runs the TC
    forward too (strategy 2; 3 without a backward), a fp32 one from
    TC_FWD_MIN_EDGES_FP32[D] the TC forward with the rows / cols passes
    after it (3 either way: 3xTF32's TC backward needs a higher degree);
    one below that keeps what still pays. Outputs and gradients against
    the reference on both graphs (ops/cuda.py::_tc_auto_plan)."""
    cuda = _cuda()
    g = torch.Generator().manual_seed(11)
    fp32 = dtype == torch.float32
    sizes = [100, 37, 128, 1, 90]
    t_fwd = rule_degree(cuda, cuda.TC_FWD_MIN_EDGES_FP32 if fp32 else
                        cuda.TC_FWD_MIN_EDGES, dh, sizes)
    t_bwd = rule_degree(cuda, cuda.TC_BWD_MIN_EDGES_FP32 if fp32 else
                        cuda.TC_BWD_MIN_EDGES, dh, sizes)
    need = t_fwd if fp32 else max(t_fwd, t_bwd)
    assert not fp32 or t_fwd < t_bwd
    heads = 128 // dh
    ei, n = dense_batch(sizes, need, g)
    graph = DFGraph.from_edge_index(ei.cuda(), num_nodes=n)
    q, k, v = inputs(n, heads, dh, dtype, g)
    assert cuda._plan(graph, 'dot', q, v, None, backward=True)[0] == (
        3 if fp32 else 2)
    assert cuda._plan(graph, 'dot', q, v, None, backward=False)[0] == 3
    assert cuda._plan(graph, 'dot', q, v, None, backward=False,
                      features=True)[0] == 0
    check(cuda, graph, v, q, k, dtype, f'{dtype} D={dh} auto TC',
          strategy=None)
    ei, n = dense_batch(sizes, need - 1, g)
    thinner = DFGraph.from_edge_index(ei.cuda(), num_nodes=n)
    q, k, v = inputs(n, heads, dh, dtype, g)
    fwd_pays = need - 1 >= t_fwd
    # (fp32's TC backward only behind its TC forward)
    bwd_pays = need - 1 >= t_bwd and (fwd_pays or not fp32)
    with_bwd = (2 if fwd_pays and bwd_pays else 3 if fwd_pays else
                4 if bwd_pays else 0)
    assert cuda._plan(thinner, 'dot', q, v, None, backward=True)[0] == \
        with_bwd
    assert cuda._plan(thinner, 'dot', q, v, None, backward=False)[0] == (
        3 if fwd_pays else 0)
    check(cuda, thinner, v, q, k, dtype, f'{dtype} D={dh} auto, thinner',
          strategy=None)


def test_tc_plan_without_a_sync():
    """A device batch (graph_windows) decides the tensor-core plan (TC
    forward, with the TC backward) without a host sync: the captured
    training step may not sync."""
    cuda = _cuda()
    g = torch.Generator().manual_seed(8)
    sizes = [100, 120, 64]
    degree = rule_degree(cuda, cuda.TC_BWD_MIN_EDGES, 64, sizes)
    ei, n = dense_batch(sizes, degree, g)
    base = DFGraph.from_edge_index(ei.cuda(), num_nodes=n)
    bounds = torch.tensor([0, 100, 220, 284], device='cuda')
    graph = DFGraph(base.rowptr, base.col, n,
                    max_in_degree=degree,
                    csc=base.csc(), max_out_degree=base.max_out_degree,
                    graph_windows=(bounds, 120))
    q, k, v = inputs(n, 1, 64, torch.bfloat16, g)
    torch.cuda.synchronize()
    torch.cuda.set_sync_debug_mode('error')
    try:
        plan = cuda._plan(graph, 'dot', q, v, None, backward=True)
        fwd_plan = cuda._plan(graph, 'dot', q, v, None, backward=False)
    finally:
        torch.cuda.set_sync_debug_mode(0)
    # (D = 64: the TC forward pays below the backward's degree)
    assert rule_degree(cuda, cuda.TC_FWD_MIN_EDGES, 64, sizes) <= degree
    assert plan[0] == 2 and plan[2] is bounds
    assert fwd_plan[0] == 3 and fwd_plan[2] is bounds
    check(cuda, graph, v, q, k, torch.bfloat16, 'device batch, strategy 2',
          strategy=None)

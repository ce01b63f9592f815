"""GPU tests of the fused backward kernels (``fused_attention_bwd``).

The op gets ``lse`` computed in float64 by the reference (so it is tested on
its own, independent of the forward kernels; it does not read the output) and
its gradients are compared with autograd through
:func:`fused_attention_reference` in float64 on the upcast inputs: rel. error
<= 1e-5 in fp32, <= 1e-2 in fp16/bf16. Without windows both passes run their
plain blocks; with the graph's row / column windows, their staged blocks.
"""
import math
import os
import tempfile
import zlib

import pytest
import torch

from pyg_dfgnn.graph import DFGraph
from pyg_dfgnn.ops.reference import edge_scores, fused_attention_reference

pytestmark = pytest.mark.cuda
if not torch.cuda.is_available():
    pytest.skip('needs a CUDA device', allow_module_level=True)

KINDS = {'dot': 0, 'add': 1, 'gatv2': 2}
TOL = {torch.float32: 1e-5, torch.float16: 1e-2, torch.bfloat16: 1e-2}

_PRIVATE_CPP = r'''
#include <torch/library.h>
#include "ops.h"
TORCH_LIBRARY(pyg_dfgnn_bwd_only, m) { m.def(kFusedAttentionBwdSchema); }
TORCH_LIBRARY_IMPL(pyg_dfgnn_bwd_only, CUDA, m) {
  m.impl("fused_attention_bwd", &fused_attention_bwd_cuda);
}
'''


def bwd_op():
    """The registered op, or (PYG_DFGNN_BWD_PRIVATE=1, or the full build
    failing) a private build of the backward sources alone."""
    if os.environ.get('PYG_DFGNN_BWD_PRIVATE') != '1':
        from pyg_dfgnn.ops import _loader
        if _loader.load_kernels():
            return torch.ops.pyg_dfgnn.fused_attention_bwd
    if not hasattr(bwd_op, 'op'):
        from torch.utils.cpp_extension import load
        from pyg_dfgnn.ops._loader import KERNEL_DIR
        tmp = os.environ.get('PYG_DFGNN_CACHE', tempfile.mkdtemp())
        tmp = os.path.join(tmp, 'bwd_only')
        os.makedirs(tmp, exist_ok=True)
        cpp = os.path.join(tmp, 'bwd_only_ops.cpp')
        with open(cpp, 'w') as f:
            f.write(_PRIVATE_CPP)
        srcs = [cpp] + sorted(
            str(p) for p in KERNEL_DIR.glob('fused_attention_bwd*.cu'))
        load(name='pyg_dfgnn_bwd_only', sources=srcs,
             extra_include_paths=[str(KERNEL_DIR)],
             extra_cuda_cflags=['-O3', '-lineinfo',
                                '--expt-relaxed-constexpr'],
             build_directory=tmp, is_python_module=False)
        bwd_op.op = torch.ops.pyg_dfgnn_bwd_only.fused_attention_bwd
    return bwd_op.op


# ------------------------------------------------------------------ graphs
def make_graph(kind: str, n: int, gen: torch.Generator):
    """(edge_index [2, E], n_src, n_dst) on the CPU."""
    def rnd(hi, size):
        return torch.randint(0, hi, (size, ), generator=gen)

    if kind == 'empty':
        return torch.empty(2, 0, dtype=torch.long), n, n
    if kind == 'single':
        return torch.tensor([[0], [0]]), 1, 1
    if kind == 'random':
        e = 4 * n
        return torch.stack([rnd(n, e), rnd(n, e)]), n, n
    if kind == 'isolated':  # half the nodes have no in- or out-edges
        e = 3 * n
        src, dst = rnd(n // 2, e), rnd(n // 2, e)
        return torch.stack([src, dst + n // 2]), n, n
    if kind == 'bipartite':
        n_src, n_dst = n, max(1, n // 3) + 1
        e = 5 * n
        return torch.stack([rnd(n_src, e), rnd(n_dst, e)]), n_src, n_dst
    if kind == 'super':  # node 0 hears from all, node 1 talks to all
        others = torch.arange(2, n)
        src = torch.cat([others, torch.full_like(others, 1), rnd(n, 2 * n)])
        dst = torch.cat([torch.zeros_like(others), others, rnd(n, 2 * n)])
        return torch.stack([src, dst]), n, n
    if kind in ('dense', 'dense-super'):  # mean in-degree 24 (+ node 0
        # hearing from every node: a long owner in segments)
        sizes = torch.randint(40, 60, (max(2, n // 50), ), generator=gen)
        parts, off = [], 0
        for s in sizes.tolist():
            parts.append(torch.stack([rnd(s, 24 * s),
                                      torch.arange(s).repeat(24)]) + off)
            off += s
        if kind == 'dense-super':
            parts.append(torch.stack([torch.arange(off),
                                      torch.zeros(off, dtype=torch.long)]))
        return torch.cat(parts, 1), off, off
    if kind == 'batch':  # small dense-ish graphs: the staged path
        sizes = torch.randint(5, 60, (max(2, n // 30), ), generator=gen)
        parts, off = [], 0
        for s in sizes.tolist():
            e = s * min(s, 12)
            parts.append(torch.stack([rnd(s, e), rnd(s, e)]) + off)
            off += s
        return torch.cat(parts, 1), off, off
    raise ValueError(kind)


def case_inputs(kind, dtype, H, F, D, n_src, n_dst, gen, dev):
    def rnd(*shape, s=1.0):
        return (torch.randn(*shape, generator=gen) * s).to(dev, dtype)

    v = rnd(n_src, H, F)
    if kind == 'add':
        q, k, att = rnd(n_dst, H), rnd(n_src, H), None
    else:
        q, k = rnd(n_dst, H, D), rnd(n_src, H, D)
        att = rnd(H, D, s=D**-0.5) if kind == 'gatv2' else None
    return q, k, v, att


def reference_grads(graph, kind, q, k, v, att, scale, slope, grad_out):
    """float64 lse and autograd grads on upcast inputs."""
    leaves = [t.detach().double().requires_grad_()
              for t in (q, k, v) + ((att, ) if att is not None else ())]
    q64, k64, v64 = leaves[:3]
    a64 = leaves[3] if att is not None else None
    out, _ = fused_attention_reference(graph, kind, v64, q64, k64, a64, scale,
                                       slope)
    grads = torch.autograd.grad(out, leaves, grad_out.double(),
                                allow_unused=True)
    grads = [torch.zeros_like(t) if g is None else g
             for g, t in zip(grads, leaves)]
    with torch.no_grad():
        s = edge_scores(graph, kind, q64, k64, a64, scale, slope)
        row = graph.row.view(-1, 1).expand_as(s)
        mx = torch.full((graph.num_dst, s.size(1)), float('-inf'),
                        dtype=s.dtype, device=s.device)
        mx = mx.scatter_reduce(0, row, s, 'amax', include_self=False)
        e = (s - mx.index_select(0, graph.row)).exp()
        sm = torch.zeros_like(mx).scatter_add(0, row, e)
        lse = mx + torch.log(sm + 1e-16)
    return lse, grads


def rel_err(x, ref):
    x, ref = x.double(), ref.double()
    den = ref.norm()
    if den == 0:
        return float((x - ref).norm())
    return float((x - ref).norm() / den)


def run_case(gkind, n, kind, dtype, H, F, D, idx64=False, seed=0,
             repeat=1, stage=None):
    """Gradient errors of one case. ``stage`` = max_nodes: pass the graph's
    row windows and column windows (``DFGraph.row_windows`` /
    ``col_windows``) so that both passes stage neighbour rows."""
    dev = torch.device('cuda')
    gen = torch.Generator().manual_seed(seed)
    ei, n_src, n_dst = make_graph(gkind, n, gen)
    graph = DFGraph.from_edge_index(ei.to(dev), size=(n_src, n_dst))
    colptr, csc_row, csc_perm = graph.csc()
    col = graph.col
    if idx64:
        col, csc_row, csc_perm = col.long(), csc_row.long(), csc_perm.long()
    windows = {}
    if stage is not None:
        rows, span = graph.row_windows(stage)
        cols, col_span = graph.col_windows(stage)
        assert rows is not None and cols is not None, 'no windows'
        windows = dict(windows=rows, stage_nodes=span, col_windows=cols,
                       col_stage_nodes=col_span)
    q, k, v, att = case_inputs(kind, dtype, H, F, D, n_src, n_dst, gen, dev)
    scale = 1.0 / math.sqrt(D)
    slope = 0.2
    grad_out = torch.randn(n_dst, H, F, generator=gen).to(dev, dtype)
    lse, ref = reference_grads(graph, kind, q, k, v, att, scale, slope,
                               grad_out)
    runs = [bwd_op()(grad_out, graph.rowptr, col, colptr, csc_row, csc_perm,
                     KINDS[kind], q, k, v, att, lse.float().contiguous(),
                     scale, slope, **windows)
            for _ in range(repeat)]
    torch.cuda.synchronize()
    for other in runs[1:]:  # same inputs -> bitwise the same gradients
        for a, b in zip(runs[0], other):
            assert torch.equal(a, b), 'backward is not deterministic'
    gq, gk, gv, ga = runs[0][:4]
    got = [gq, gk, gv] + ([ga] if att is not None else [])
    errs = {}
    for name, g, r, inp in zip(('query', 'key', 'value', 'att'), got, ref,
                               (q, k, v, att)):
        assert g.dtype == inp.dtype and g.shape == inp.shape, name
        assert torch.isfinite(g).all(), f'{name}: non-finite gradient'
        errs[name] = rel_err(g, r)
    return errs


CASES = []
for kind in ('dot', 'add', 'gatv2'):
    for dtype in (torch.float32, torch.float16, torch.bfloat16):
        for gkind, n, H, F in (('random', 300, 1, 128), ('batch', 600, 4, 32),
                               ('super', 700, 2, 17), ('isolated', 200, 3, 72),
                               ('bipartite', 250, 1, 256),
                               ('random', 150, 8, 1), ('batch', 400, 3, 3)):
            CASES.append((gkind, n, kind, dtype, H, F))


@pytest.mark.parametrize('gkind,n,kind,dtype,H,F', CASES)
def test_backward_matches_reference(gkind, n, kind, dtype, H, F):
    errs = run_case(gkind, n, kind, dtype, H, F, F,
                    seed=zlib.crc32(repr((gkind, n, kind, H, F)).encode()))
    tol = TOL[dtype]
    assert all(e <= tol for e in errs.values()), errs


@pytest.mark.parametrize('kind', ['dot', 'add', 'gatv2'])
@pytest.mark.parametrize('gkind', ['empty', 'single'])
def test_backward_degenerate_graphs(gkind, kind):
    errs = run_case(gkind, 5, kind, torch.float32, 2, 8, 8)
    assert all(e <= 1e-5 for e in errs.values()), errs


@pytest.mark.parametrize('kind', ['dot', 'gatv2'])
def test_backward_int64_index_and_qk_width(kind):
    # int64 col / csc_row, and D != F for 'dot'
    D = 40 if kind == 'dot' else 24
    errs = run_case('super', 600, kind, torch.float32, 2, 24, D, idx64=True)
    assert all(e <= 1e-5 for e in errs.values()), errs


def test_backward_wide_features():
    # F above the small layout (several vectors per lane)
    for dtype, F in ((torch.float32, 512), (torch.bfloat16, 1024)):
        errs = run_case('batch', 300, 'dot', dtype, 1, F, F)
        assert all(e <= TOL[dtype] for e in errs.values()), (dtype, errs)


@pytest.mark.parametrize('kind,dtype,H,F', [
    ('dot', torch.float32, 2, 32), ('add', torch.float32, 1, 17),
    ('gatv2', torch.bfloat16, 3, 16), ('dot', torch.float32, 1, 128)])
def test_backward_long_owners_in_segments(kind, dtype, H, F):
    # node 0 hears from ~4000 nodes and node 1 talks to all of them: both
    # passes split them into segments of 256 edges (partials + combine)
    errs = run_case('super', 4000, kind, dtype, H, F, F, seed=5, repeat=2)
    assert all(e <= TOL[dtype] for e in errs.values()), errs


def test_backward_is_deterministic():
    # heavy owners (block reductions) and the d att partials included
    errs = run_case('super', 900, 'gatv2', torch.float32, 2, 64, 64, seed=3,
                    repeat=3)
    assert all(e <= 1e-5 for e in errs.values()), errs


STAGED_CASES = [(kind, dtype, H, F)
                for kind in ('dot', 'add', 'gatv2')
                for dtype in (torch.float32, torch.bfloat16)
                for H, F in ((1, 128), (4, 32), (3, 17))]


@pytest.mark.parametrize('kind,dtype,H,F', STAGED_CASES)
def test_backward_with_row_and_col_windows(kind, dtype, H, F):
    # both passes staged: the rows pass stages K / V of each row window, the
    # cols pass Q / dO / D of each column window
    errs = run_case('batch', 600, kind, dtype, H, F, F, stage=150,
                    seed=zlib.crc32(repr(('staged', kind, H, F)).encode()))
    assert all(e <= TOL[dtype] for e in errs.values()), errs


@pytest.mark.parametrize('kind,dtype', [
    ('dot', torch.bfloat16), ('dot', torch.float16),
    ('gatv2', torch.bfloat16), ('gatv2', torch.float16),
    ('add', torch.float32), ('add', torch.bfloat16)])
@pytest.mark.parametrize('H,F', [(1, 128), (4, 32)])
@pytest.mark.parametrize('gkind,stage', [('dense', 150), ('dense-super', None),
                                         ('random', None)])
def test_rows_pass_lanes_by_density(kind, dtype, H, F, gkind, stage,
                                    monkeypatch):
    """H * F = 128, 'add' in every dtype and half precision in every kind:
    the rows pass's four-feature-lane kernels (LANES) from a mean in-degree
    of 16 (staged windows, plain blocks with a long owner in segments), the
    item groups below; both against the reference."""
    from torch.profiler import ProfilerActivity, profile
    from test_kernels_cuda import template_args
    monkeypatch.setenv('PYG_DFGNN_SHORT_ROWS', '0')  # the block kernels
    with profile(activities=[ProfilerActivity.CUDA]) as prof:
        errs = run_case(gkind, 900, kind, dtype, H, F, F, stage=stage,
                        seed=zlib.crc32(repr((gkind, kind, H)).encode()))
    assert all(e <= TOL[dtype] for e in errs.values()), errs
    args = [template_args(e.key) for e in prof.key_averages()
            if 'bwd::bwd_kernel<' in e.key]
    rows = [a for a in args if a[4] == 'false']  # COLS
    lanes = 'false' if gkind == 'random' else 'true'
    assert rows and all(a[-1] == lanes for a in rows), args

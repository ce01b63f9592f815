"""CUDA path of the fused op (kernels in ``kernels/``).

The C++ library registers ``torch.ops.pyg_dfgnn.fused_attention_fwd`` /
``fused_attention_bwd`` (CUDA kernels) and the differentiable
``pyg_dfgnn::fused_attention`` (``kernels/autograd.cpp``: its autograd runs in
C++, torchvision's pattern, because a Python ``custom_op`` with
``register_autograd`` costs more host time per call than the kernels of a
small graph take). Here the three get their fake (meta) impls, so that
``torch.compile`` traces calls without graph breaks. Only the row log-sum-exp
``lse`` [N_dst, H] is saved for the backward (no copy of the output: the
backward does not read it); the backward's two passes (CSR rows for dQ, CSC
columns for dK / dV) share a transient float32 [E, H, 2] buffer of per-edge
``(p, p * dp)``: E * H, never E * F.

Training features run in the same kernels: per-edge score / key / value
terms (CSR order), attention dropout (Philox seeded from PyTorch's CUDA
generator; the forward returns its ``(seed, offset)``, the backward
regenerates the mask) and the attention weights, written by the forward only
when asked, in the user's edge order.
"""
import math
from typing import Optional, Tuple

import torch
from torch import Tensor

from pyg_dfgnn.dispatch import SMMF
from pyg_dfgnn.ops._loader import load_kernels

KIND_IDS = {'dot': 0, 'add': 1, 'gatv2': 2}
#: Tensor-core windows (kernels/fwd_tc_kernel.cuh, bwd_tc_kernel.cuh) of at
#: most TC_MAX_SOURCES sources. Strategy ids: 3 = TC forward, 2 = TC forward
#: and backward, 4 = SMMF forward and TC backward; asked for as 'tc' (3 / 2)
#: or picked for dense graphs without being asked (_tc_auto_plan).
TC = 'tc'
#: Strategy id of the TC forward with 1xTF32 products (fp32, opt-in through
#: ``torch.backends.cuda.matmul.allow_tf32``; 3 otherwise); the rows / cols
#: passes after it, as after 3.
TC_TF32_STRATEGY = 5
#: Both TC passes with 1xTF32 products (fp32 under the same flag; 2
#: otherwise). It pays from lower degrees than 3xTF32's backward: H100,
#: session 42, forward + backward ops 0.73 against 1.00 ms (1xTF32 forward,
#: rows / cols passes) on pattern-like 1x128, 0.72 / 0.83 on cluster-like.
TC_TF32_BWD_STRATEGY = 6
TC_MAX_SOURCES = 128
TC_HEAD_DIMS = (16, 32, 64, 128)
#: Edge multiplicities of a window are counted in a byte.
TC_MAX_DEGREE = 255
#: When the tensor-core windows pay without being asked for, per head size
#: D: rules ``(per_row, per_window)``, met by a graph of at least
#: ``per_row * rows + per_window * windows`` edges (its TC_MAX_SOURCES row
#: windows, DFGraph.graph_row_windows). A TC window costs about the same
#: whatever its edges, the SMMF / rows-cols kernels cost per edge, so the
#: mean in-degree from which TC pays, ``per_row + per_window / (rows per
#: window)`` (tc_rule_degree), grows as windows get smaller. Fitted to the
#: crossovers of session 42's kernels (the window as bits; H100,
#: scripts/fwd_bench.py, forward and forward + backward ops) on batches of
#: 1,024 graphs of 117 nodes at mean in-degree 3.9-25 and on windows of 64
#: rows (graphs of 32 and 64 nodes); benchmarks/NOTES.md has the tables.
#:
#: fp16 / bf16 forward (TC forward, the rows / cols passes after it,
#: against SMMF): the TC forward is flat in the degree (~0.09 / 0.09 / 0.11
#: / 0.16 ms at D = 128 / 64 / 32 / 16 on 117-row windows, 0.06 / - / 0.08 /
#: 0.12 on 64-row ones): even near 5.9 / 5.9 / 8.3 / 15 on 117 rows, 7.4 /
#: - / 12 / 19 on 64.
TC_FWD_MIN_EDGES = {16: (10, 560), 32: (4, 510), 64: (4, 210),
                    128: (4, 210)}
#: fp16 / bf16 backward (both TC passes against the TC forward with the
#: rows / cols passes after it): even near 10 / 8.4 / 10.8 / 15 on 117
#: rows, 11 / - / 10.8 / 14.3 on 64. Strategy 2 where both pay, 3 where the
#: forward alone does, SMMF forward + TC backward (4) where the backward
#: alone does (D = 16 on windows of fewer than ~100 rows).
TC_BWD_MIN_EDGES = {16: (15, 0), 32: (11, 0), 64: (7, 155), 128: (8.7, 155)}
#: fp32, 3xTF32 products: the TC forward with the rows / cols passes after
#: it against SMMF, even near 20 / 17.5 / 21 / 22 (D = 128 / 64 / 32 / 16,
#: 117 rows; 64-row windows about the same at D >= 32); the 3xTF32 TC
#: backward behind it (since session 42 cheaper than the passes on the
#: densest batches: pattern-like 1x128 forward + backward ops 1.008 against
#: 1.076 ms) even near 37 / 40 / 36 / 36 on 117 rows, ~48 on 64.
TC_FWD_MIN_EDGES_FP32 = {16: (17, 560), 32: (21, 0), 64: (18, 0),
                         128: (20, 0)}
TC_BWD_MIN_EDGES_FP32 = {16: (23, 1550), 32: (22, 1610), 64: (27, 1550),
                         128: (24, 1550)}
#: The same for fp32 with 1xTF32 products (opt-in, allow_tf32): the TC
#: forward against SMMF even near 12 / 12 / 12.6 / 17.5 on 117 rows, ~15.5
#: on 64; the TC backward behind it even near 24 / 24 / 24 / 26 on 117
#: rows, ~32-34 on 64.
TC_TF32_FWD_MIN_EDGES = {16: (13, 490), 32: (8.5, 480), 64: (8, 490),
                         128: (8, 490)}
TC_TF32_BWD_MIN_EDGES = {16: (15, 1300), 32: (11, 1480), 64: (12.5, 1300),
                         128: (14.5, 1130)}


def tc_rule_degree(rule: Tuple[float, float], rows_per_window: float
                   ) -> float:
    """The mean in-degree from which a tensor-core rule ``(per_row,
    per_window)`` is met on windows of ``rows_per_window`` rows."""
    per_row, per_window = rule
    return per_row + per_window / rows_per_window


_TC_HALF_DTYPES = (torch.float16, torch.bfloat16)
_KERNEL_DTYPES = (torch.float32, torch.float16, torch.bfloat16)
_registered = False
_op = None  # torch.ops.pyg_dfgnn.fused_attention.default, set by _register()


def available() -> bool:
    """True when the CUDA kernels are built and loaded (and registered)."""
    if _registered:
        return True
    if not load_kernels():
        return False
    _register()
    return True


def _fwd_fake(rowptr, col, kind, query, key, value, att, scale,
              negative_slope, strategy, max_in_degree=-1, windows=None,
              stage_nodes=0, edge_score=None, edge_key=None, edge_value=None,
              dropout=0.0, attention=0, attention_perm=None):
    n_dst, heads = rowptr.shape[0] - 1, value.shape[1]
    out = value.new_empty((n_dst, heads, value.shape[2]))
    lse = value.new_empty((n_dst, heads), dtype=torch.float32)
    alpha = value.new_empty((col.shape[0] if attention else 0, heads))
    rng_state = value.new_empty((2 if dropout > 0 else 0, ),
                                dtype=torch.int64)
    return out, lse, alpha, rng_state


def _bwd_fake(grad_out, rowptr, col, colptr, csc_row, csc_perm, kind, query,
              key, value, att, lse, scale, negative_slope, windows=None,
              stage_nodes=0, col_windows=None, col_stage_nodes=0,
              max_in_degree=-1, max_out_degree=-1, edge_score=None,
              edge_key=None, edge_value=None, dropout=0.0, rng_state=None,
              grad_alpha=None, attention=0, attention_perm=None,
              strategy=0):
    def grad_of(t):
        return torch.empty_like(t) if t is not None else \
            value.new_empty((0, ))

    shared = kind == KIND_IDS['dot'] and edge_key is not None and \
        edge_key is edge_value
    return (torch.empty_like(query), torch.empty_like(key),
            torch.empty_like(value), grad_of(att), grad_of(edge_score),
            grad_of(edge_key), grad_of(None if shared else edge_value))


def _fused_fake(rowptr, col, colptr, csc_row, csc_perm, kind, query, key,
                value, att, scale, negative_slope, strategy, max_in_degree,
                windows, stage_nodes, col_windows, col_stage_nodes,
                max_out_degree=-1, edge_score=None, edge_key=None,
                edge_value=None, dropout=0.0, attention=0,
                attention_perm=None):
    return _fwd_fake(rowptr, col, kind, query, key, value, att, scale,
                     negative_slope, strategy, max_in_degree, None, 0,
                     edge_score, edge_key, edge_value, dropout,
                     attention)[:3]


def _edge_rows_fake(rowptr, index, num_edges, edge_attr, fill, fill_row,
                    node_mat, edge_weight, dots, sums, scatter,
                    loop_pos, edge_row, node_mat2=None, edge_weight2=None):
    heads = node_mat.shape[1] if node_mat is not None else \
        edge_weight.shape[1]
    n_rows, dim = rowptr.shape[0] - 1, edge_attr.shape[1]
    return (edge_attr.new_empty((num_edges if dots else 0, heads)),
            edge_attr.new_empty((0 if not sums else 1 if node_mat is not None
                                 and node_mat.shape[0] == 1 else n_rows,
                                 heads, dim), dtype=torch.float32),
            edge_attr.new_empty((edge_attr.shape[0] if scatter else 0, dim)))


def _edge_project_fake(rowptr, index, num_edges, edge_attr, fill, fill_row,
                       weight, grad, loop_pos, edge_row=None):
    out_dim, dim = weight.shape
    backward = grad is not None
    return (edge_attr.new_empty((0 if backward else num_edges, out_dim)),
            edge_attr.new_empty((edge_attr.shape[0] if backward else 0,
                                 dim)),
            edge_attr.new_empty((out_dim if backward else 0, dim),
                                dtype=torch.float32))


def _register() -> None:
    """Fake impls of the C++ ops (once)."""
    global _registered, _op
    if _registered:
        return
    torch.library.register_fake('pyg_dfgnn::fused_attention_fwd')(_fwd_fake)
    torch.library.register_fake('pyg_dfgnn::fused_attention_bwd')(_bwd_fake)
    torch.library.register_fake('pyg_dfgnn::fused_attention')(_fused_fake)
    torch.library.register_fake('pyg_dfgnn::edge_attr_rows')(_edge_rows_fake)
    torch.library.register_fake('pyg_dfgnn::edge_attr_project')(
        _edge_project_fake)
    _op = torch.ops.pyg_dfgnn.fused_attention.default
    _registered = True


def _check_cuda_inputs(value: Tensor, query: Tensor, key: Tensor,
                       att: Optional[Tensor]) -> None:
    if value.dtype not in _KERNEL_DTYPES and value.dtype != torch.float64:
        raise TypeError(f"The CUDA kernels take float32, float16 or bfloat16 "
                        f"(got 'value' of dtype {value.dtype})")
    if value.is_cuda and query.is_cuda and key.is_cuda and (
            att is None or att.is_cuda):
        return
    for name, t in (('value', value), ('query', query), ('key', key),
                    ('att', att)):
        if t is not None and not t.is_cuda:
            raise ValueError(f"'{name}' must be a CUDA tensor")


_SMEM_OPTIN = {}


def _smem_optin(value: Tensor) -> int:
    """Opt-in shared memory per block of ``value``'s device (cached)."""
    dev = value.device.index if value.device.index is not None else \
        torch.cuda.current_device()
    if dev not in _SMEM_OPTIN:
        _SMEM_OPTIN[dev] = torch.cuda.get_device_properties(
            dev).shared_memory_per_block_optin
    return _SMEM_OPTIN[dev]


def _stage_capacity(kind: str, query: Tensor, value: Tensor) -> int:
    """Source nodes whose K and V rows fit one SMMF block's shared memory
    beside its per-warp scratch (the kernel clamps to the exact layout)."""
    heads, f_out = value.shape[1], value.shape[2]
    hd_k = heads if kind == 'add' else heads * query.shape[-1]
    # 32 warps (kSmmfStagedWarps) x (query row padded to 4 floats, 32-edge
    # chunk, m / l / corr)
    scratch = 32 * (((hd_k + 3) // 4 * 4 + heads * 35 + 32) * 4 + 16) + \
        hd_k * 4 + 64
    per_node = (hd_k + heads * f_out) * value.element_size()
    return max(0, (_smem_optin(value) - scratch) // per_node)


def _col_stage_capacity(kind: str, query: Tensor, value: Tensor) -> int:
    """Destination nodes whose Q and dO rows (and fp32 per-head row term)
    fit one block of the backward's cols pass beside its per-warp scratch
    (the kernel clamps to the exact layout)."""
    heads, f_out = value.shape[1], value.shape[2]
    hd_k = heads if kind == 'add' else heads * query.shape[-1]
    hd_att = heads * query.shape[-1] if kind == 'gatv2' else 0
    # 32 warps (kStagedWarps) x (key row unless 'dot', d att partial,
    # d a_src [H], p / ds [2][H][32-edge chunk] fp32, neighbour / edge ids
    # int64 [2][32]) + att fp32 and the block scalars (bwd_layout in
    # kernels/bwd_common.cuh; rows padded to 4 floats, 16 bytes)
    def pad4(n):
        return (n + 3) // 4 * 4

    floats = (0 if kind == 'dot' else pad4(hd_k)) + pad4(hd_att) + heads + \
        2 * heads * 32
    scratch = 32 * ((floats * 4 + 15) // 16 * 16 + 2 * 32 * 8) + \
        pad4(hd_att) * 4 + 16 + 64
    per_node = (hd_k + heads * f_out) * value.element_size() + 4 * heads
    return max(0, (_smem_optin(value) - scratch) // per_node)


def _tc_backward_ok(graph, windows: Tensor, kind: str, query: Tensor,
                    value: Tensor) -> bool:
    """Whether the backward can take the tensor-core windows too
    (kernels/bwd_tc_kernel.cuh): every window of at most TC_MAX_SOURCES
    rows, no source shared by two windows (a block owns its sources' dK,
    dV), D = F <= 128 (fp32 too: 3xTF32, or 1xTF32 under allow_tf32). One
    host sync, cached with the plan."""
    if not _tc_takes(kind, query, value) or \
            graph.max_in_degree > TC_MAX_DEGREE:
        return False
    if graph.graph_windows is not None and windows is graph.graph_windows[0]:
        # graph boundaries of a square batch (row_windows gave them, so
        # their span is <= TC_MAX_SOURCES): each window owns its sources and
        # has no more rows than sources -- decided without a sync
        return True
    if int(windows.diff().max()) > TC_MAX_SOURCES:
        return False
    if graph.num_edges == 0:
        return True
    w = torch.searchsorted(windows[1:], graph.row, right=True)
    n = windows.numel() - 1
    col = graph.col.to(torch.int64)
    lo = torch.full((n, ), graph.num_src, dtype=torch.int64,
                    device=col.device).scatter_reduce_(0, w, col, 'amin')
    hi = torch.full((n, ), -1, dtype=torch.int64,
                    device=col.device).scatter_reduce_(0, w, col, 'amax')
    used = hi >= 0
    lo, hi = lo[used], hi[used]
    order = lo.argsort()
    lo, hi = lo[order], hi[order]
    return bool((hi[:-1] < lo[1:]).all())


def _tc_single_window(graph) -> Tuple[Optional[Tensor], int]:
    """One window of all rows when the whole graph reads at most
    TC_MAX_SOURCES sources (``(None, 0)`` otherwise). owner_windows finds
    no windows in a batch of one graph (no cut), of one node or without
    edges, although the TC kernels take any row count (chunks of 256 rows
    in the forward; the backward's TC path wants <= 128 rows and says so
    in _tc_backward_ok): without this, strategy 'tc' raised for those
    batches (test_tc_batches draws them). One host sync, cached."""
    key = ('tc-single', TC_MAX_SOURCES)
    cache = graph._windows
    if key not in cache:
        span = 0
        if graph.num_edges > 0:
            col = graph.col
            span = int(col.max()) - int(col.min()) + 1
        cache[key] = (None, 0) if span > TC_MAX_SOURCES else (
            torch.tensor([0, graph.num_dst], dtype=torch.int64,
                         device=graph.rowptr.device), span)
    return cache[key]


def _tc_takes(kind: str, query: Tensor, value: Tensor) -> bool:
    """The TC kernels' score kind and head sizes: 'dot' with D = F in
    TC_HEAD_DIMS."""
    return kind == 'dot' and query.shape[-1] == value.shape[2] and \
        value.shape[2] in TC_HEAD_DIMS


def _check_tc(kind: str, query: Tensor, value: Tensor,
              features: bool) -> None:
    """What strategy 'tc' takes, as a Python error (the kernels' host
    entries check it again)."""
    if not _tc_takes(kind, query, value):
        raise ValueError(
            f"strategy '{TC}' (tensor-core windows) takes the 'dot' kind with "
            f"D = F in {TC_HEAD_DIMS} (got '{kind}', D = "
            f"{query.shape[-1] if kind != 'add' else 1}, "
            f"F = {value.shape[2]})")
    if features:
        raise ValueError(
            f"strategy '{TC}' (tensor-core windows) takes no edge terms, "
            f"dropout or attention weights: leave 'strategy' unset")


_PLANS_ATTR = '_dfgnn_cuda_plans'

Plan = Tuple[int, int, Optional[Tensor], int, Optional[Tensor], int, int]


def _tc_dense(graph, kind: str, query: Tensor, value: Tensor,
              min_mean_degree: float) -> bool:
    """Whether the tensor-core windows may pay without being asked for:
    'dot' with D = F the TC kernels take, mean in-degree at least
    ``min_mean_degree``, multiplicities within a byte. Shapes and host-known
    bounds only (no sync)."""
    return (_tc_takes(kind, query, value) and graph.num_dst > 0
            and graph.max_in_degree <= TC_MAX_DEGREE
            and graph.num_edges >= min_mean_degree * graph.num_dst)


def _tc_auto_plan(graph, kind: str, query: Tensor, value: Tensor,
                  backward: bool,
                  one_tf32: bool = False) -> Optional[Tuple[int, Tensor, int]]:
    """``(strategy id, windows, stage_nodes)`` of the tensor-core windows
    for a dense graph asked for no strategy: TC forward (3, the rows / cols
    passes after it; 2 with the TC backward), or SMMF forward on the TC
    windows and TC backward (4) where only the backward pays; ``None``:
    SMMF / PMF. The rules (per head size D, edges against rows and windows:
    tc_rule_degree): fp16 / bf16 TC_FWD_MIN_EDGES, TC_BWD_MIN_EDGES; fp32
    (3xTF32) TC_FWD_MIN_EDGES_FP32 with the TC backward behind the TC
    forward from TC_BWD_MIN_EDGES_FP32; under ``one_tf32`` (1xTF32
    products) TC_TF32_FWD_MIN_EDGES and TC_TF32_BWD_MIN_EDGES, the backward
    behind the forward too (the caller maps 3 / 2 to their 1xTF32 ids).
    The windows' count is their tensor's length, so a graph that brings
    its windows decides without a sync."""
    half = value.dtype in _TC_HALF_DTYPES
    if not half and value.dtype != torch.float32:
        return None
    fwd_table, bwd_table = (
        (TC_FWD_MIN_EDGES, TC_BWD_MIN_EDGES) if half else
        (TC_TF32_FWD_MIN_EDGES, TC_TF32_BWD_MIN_EDGES) if one_tf32 else
        (TC_FWD_MIN_EDGES_FP32, TC_BWD_MIN_EDGES_FP32))
    never = (math.inf, 0)
    d = value.shape[2]
    fwd_rule = fwd_table.get(d, never)
    bwd_rule = bwd_table.get(d, never) if backward else never
    # per_row alone first: a sparser graph builds no windows
    if not (_tc_dense(graph, kind, query, value, fwd_rule[0]) or
            _tc_dense(graph, kind, query, value, bwd_rule[0])):
        return None
    windows, span = graph.graph_row_windows(TC_MAX_SOURCES)
    if windows is None:
        return None
    rows_per_window = graph.num_dst / max(windows.numel() - 1, 1)

    def pays(rule):
        return _tc_dense(graph, kind, query, value,
                         tc_rule_degree(rule, rows_per_window))

    fwd_pays = pays(fwd_rule)
    # (fp32's TC backward was measured behind its TC forward only)
    bwd_pays = (half or fwd_pays) and pays(bwd_rule)
    if bwd_pays and _tc_backward_ok(graph, windows, kind, query, value):
        return (2 if fwd_pays else 4), windows, span
    # (the TC forward with the rows / cols passes after it)
    return (3, windows, span) if fwd_pays else None


def _plan(graph, kind: str, query: Tensor, value: Tensor,
          strategy: Optional[str], backward: bool = False,
          features: bool = False) -> Plan:
    """``(strategy id, max_in_degree, windows, stage_nodes, col_windows,
    col_stage_nodes, max_out_degree)``: the launch arguments that depend only on the graph
    and the feature shapes, cached on the graph per shape (the eager hot
    path then does one dict lookup). The column windows of the backward's
    cols pass are built only when a ``backward`` will run (else ``None,
    0``); ``max_out_degree`` (one host sync per graph) only then too (else
    -1). ``features``: a training feature (edge terms, dropout, attention
    weights) is on, which only SMMF / PMF take."""
    plans = getattr(graph, _PLANS_ATTR, None)
    if plans is None:
        plans = {}
        setattr(graph, _PLANS_ATTR, plans)
    # fp32's tensor-core products as one TF32 mma each, as PyTorch's matmuls
    # under the same flag (~1e-3 relative error; 3xTF32 otherwise, about
    # fp32's accuracy)
    one_tf32 = value.dtype == torch.float32 and \
        torch.backends.cuda.matmul.allow_tf32
    # The device is in the key: DFGraph.to() copies attributes, this dict too.
    key = (kind, value.shape[1], value.shape[2], query.shape[-1],
           value.dtype, value.device, strategy, backward, features, one_tf32)
    plan = plans.get(key)
    if plan is not None:
        return plan
    chosen = strategy is None
    if strategy is None:
        strategy = graph.strategy(value.shape[1])
    if strategy not in ('smmf', 'pmf', TC):
        raise ValueError(f"'strategy' must be 'smmf', 'pmf' or '{TC}' "
                         f"(got '{strategy}')")
    sid = {SMMF: 0, 'pmf': 1, TC: 3}[strategy]
    compiling = torch.compiler.is_compiling()
    if compiling and getattr(graph, 'graph_windows', None) is None:
        # Building windows syncs with the host (a graph break): a graph first
        # seen while tracing runs fixed windows in both passes (not cached,
        # so that eager calls still build the windows).
        return (sid, int(graph.max_in_degree), None, 0, None, 0, -1)
    # (A graph that brings its windows -- the device loader's batches, with
    # their degree bounds -- gives them without a sync, traced too.)
    windows, stage_nodes = None, 0
    if strategy == TC:
        # (the kernel checks kind, dtype and sizes; the windows are the
        # graph's to give)
        windows, stage_nodes = graph.graph_row_windows(TC_MAX_SOURCES)
        if windows is None:
            windows, stage_nodes = _tc_single_window(graph)
        if windows is None:
            raise ValueError(
                f"strategy '{TC}' needs row windows of at most "
                f"{TC_MAX_SOURCES} source nodes each (a batch of small "
                f"graphs); this graph has none")
        if backward and _tc_backward_ok(graph, windows, kind, query, value):
            sid = 2  # the backward's tensor-core windows too
    elif strategy == SMMF:
        tc = _tc_auto_plan(graph, kind, query, value, backward, one_tf32) \
            if chosen and not features else None
        if tc is not None:
            sid, windows, stage_nodes = tc
        else:
            windows, stage_nodes = graph.row_windows(
                _stage_capacity(kind, query, value))
    if one_tf32 and sid in (2, 3):
        sid = TC_TF32_BWD_STRATEGY if sid == 2 else TC_TF32_STRATEGY
    col_windows, col_stage_nodes, max_out_degree = None, 0, -1
    if backward:
        col_windows, col_stage_nodes = graph.col_windows(
            _col_stage_capacity(kind, query, value))
        max_out_degree = graph.max_out_degree
    plan = (sid, int(graph.max_in_degree), windows, stage_nodes, col_windows,
            col_stage_nodes, max_out_degree)
    if not compiling:
        plans[key] = plan
    return plan


def bwd_plan_args(plan: Plan) -> tuple:
    """The trailing arguments of ``fused_attention_bwd`` from a plan:
    ``(windows, stage_nodes, col_windows, col_stage_nodes, max_in_degree,
    max_out_degree)``."""
    return tuple(plan[2:6]) + (plan[1], plan[6])


#: ``attention`` argument of the ops: no weights, before / after dropout.
ATTENTION_IDS = {None: 0, 'before_dropout': 1, 'after_dropout': 2}


def fused_attention_cuda(graph, kind: str, value: Tensor, query: Tensor,
                         key: Tensor, att: Optional[Tensor], scale: float,
                         negative_slope: float,
                         strategy: Optional[str] = None, *,
                         edge_score: Optional[Tensor] = None,
                         edge_key: Optional[Tensor] = None,
                         edge_value: Optional[Tensor] = None,
                         dropout: float = 0.0,
                         attention: Optional[str] = None,
                         attention_perm: Optional[Tensor] = None):
    """Fused attention on CUDA tensors (inputs already validated by
    :func:`pyg_dfgnn.ops.check_inputs`). ``strategy`` overrides the SMMF /
    PMF rule (``'smmf'`` or ``'pmf'``; tests use it) or asks for the
    tensor-core windows of the forward (``'tc'``: 'dot', D = F in
    TC_HEAD_DIMS, no training features, fp32 through 3xTF32 -- or one TF32
    product under ``torch.backends.cuda.matmul.allow_tf32``, in the
    backward's TC windows too; an error otherwise).

    ``dropout`` is the active drop probability (0 outside training);
    ``attention`` (``'before_dropout'`` / ``'after_dropout'``) also returns
    the weights [E, H], row ``attention_perm[e]`` for CSR edge ``e``.
    Returns ``out``, or ``(out, alpha)`` when ``attention`` is set."""
    if kind not in KIND_IDS:
        raise ValueError(f"'kind' must be one of {tuple(KIND_IDS)} "
                         f"(got '{kind}')")
    _check_cuda_inputs(value, query, key, att)
    if attention not in ATTENTION_IDS:
        raise ValueError(f"'attention' must be one of "
                         f"{tuple(ATTENTION_IDS)} (got {attention!r})")
    if value.dtype == torch.float64:  # no fp64 kernels: the exact reference
        from pyg_dfgnn.ops.reference import fused_attention_reference
        out, alpha = fused_attention_reference(
            graph, kind, value, query, key, att, scale, negative_slope,
            edge_score, edge_key, edge_value, dropout, dropout > 0,
            attention_dropped=attention != 'before_dropout')
        if attention is None:
            return out
        if attention_perm is not None:
            alpha = torch.empty_like(alpha).index_copy_(
                0, attention_perm.to(torch.int64), alpha)
        return out, alpha
    if not _registered and not available():
        raise RuntimeError('pyg_dfgnn CUDA kernels are not available')
    backward = torch.is_grad_enabled() and any(
        t is not None and t.requires_grad
        for t in (value, query, key, att, edge_score, edge_key, edge_value))
    features = edge_score is not None or edge_key is not None or \
        edge_value is not None or dropout > 0 or attention is not None
    if strategy == TC:
        _check_tc(kind, query, value, features)
    plan = _plan(graph, kind, query, value, strategy, backward, features)
    colptr = csc_row = csc_perm = None
    if backward:
        colptr, csc_row, csc_perm = graph.csc()
    # The op makes its inputs contiguous and saves only lse for the backward
    # (which does not read the output), so in-place edits of the result
    # (`h.relu_()` on a conv's output view) are legal as with PyG's unfused
    # chain (kernels/autograd.cpp).
    out, _, alpha = _op(graph.rowptr, graph.col, colptr, csc_row, csc_perm,
                        KIND_IDS[kind], query, key, value, att, float(scale),
                        float(negative_slope), *plan, edge_score, edge_key,
                        edge_value, float(dropout), ATTENTION_IDS[attention],
                        attention_perm)
    return out if attention is None else (out, alpha)

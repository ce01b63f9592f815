r"""Raw edge attributes in the fused attention, per destination row.

An :class:`EdgeAttrMap` says which row of the user's ``edge_attr``
[E_in, D_e] each CSR edge ``p`` of a graph reads (``x_p``), and how a row's
self-loop gets its features (PyG's ``fill_value``: the mean or sum of the
row's other edges, or a constant row). Two differentiable products, never
forming a reordered [E, D_e] copy nor an [E, H, F] edge tensor:

* :func:`edge_attr_dots`: :math:`T_{ph} = \langle \mathbf{M}_{ih},
  \mathbf{x}_p \rangle` [E, H] for a per-node (or one shared) matrix
  :math:`\mathbf{M}` [N or 1, H, D_e] -- a score term;
* :func:`edge_attr_sums`: :math:`\mathbf{S}_{ih} = \sum_p W_{ph}
  \mathbf{x}_p` [N, H, D_e] for per-edge weights :math:`W` [E, H] -- an
  aggregated message term.

TransformerConv's edge terms become ``dots`` with
:math:`\mathbf{M}_i = \mathrm{scale}\, \Theta_e^\top \mathbf{q}_i` (the
score :math:`\langle \mathbf{q}_i, \Theta_e \mathbf{x}_p\rangle`) and
``sums`` of the attention weights, projected once per node
(:math:`\sum_p \alpha_p \Theta_e \mathbf{x}_p = \Theta_e \sum_p \alpha_p
\mathbf{x}_p`); GAT's edge term is ``dots`` with the shared
:math:`a_e^\top \Theta_e`. Each one's backward is the other one plus a
scatter of :math:`\partial \mathbf{x}` (``kernels/edge_attr_rows.cu``); the
CPU path (and the oracle of the tests) forms :math:`\mathbf{x}_p` with
PyTorch ops.
"""
from dataclasses import dataclass
from typing import Optional

import torch
from torch import Tensor

from pyg_dfgnn.ops import cuda as _cuda

#: kernel limits (kernels/ops.h): heads and heads * edge_dim
MAX_HEADS, MAX_HEADS_X_DIM = 16, 512
#: edge_attr_project's kernel limit (kernels/ops.h: kEdgeProjectMaxDim)
MAX_PROJECT_DIM = 16
FILL_IDS = {'none': 0, 'mean': 1, 'sum': 2, 'const': 3}


@dataclass
class EdgeAttrMap:
    """How the CSR edges of a graph read the user's edge attributes.

    Args:
        rowptr (Tensor): the graph's CSR row pointer (int64 [N + 1]).
        index (Tensor, optional): int64 [E]: edge ``p`` reads row
            ``index[p]`` of ``edge_attr``; ``index[p] >= num_input`` marks
            the row's self-loop (at most one per row). ``None``: row ``p``.
        num_edges (int): E.
        num_input (int): rows of the user's ``edge_attr``.
        fill (str): the loops' features: ``'none'`` (no loops), ``'mean'``
            / ``'sum'`` of the row's other edges, or ``'const'``
            (``fill_row``).
        fill_row (Tensor, optional): [D_e] for ``'const'``.
        unused_index (Tensor, optional): int64 rows of ``edge_attr`` read
            by no edge (removed self-loops): their gradient is zero. Only
            they are zeroed after the scatter, not all [E_in, D_e] before
            it (0.09 ms per [4.5M, 16] fp32 on an H100).
        loop_pos (Tensor, optional): int64 [N]: each row's self-loop
            entry, -1 for none. Derived from ``index`` (with a fill) when
            not given.
        edge_row (Tensor, optional): int32 [E]: each CSR edge's row.
            Derived from ``rowptr`` (with a fill) when not given.

    The last two are built once with the map (no host sync): the kernels
    read a row's loop and an edge's row instead of scanning for them.
    """
    rowptr: Tensor
    index: Optional[Tensor]
    num_edges: int
    num_input: int
    fill: str = 'none'
    fill_row: Optional[Tensor] = None
    unused_index: Optional[Tensor] = None
    loop_pos: Optional[Tensor] = None
    edge_row: Optional[Tensor] = None

    def __post_init__(self) -> None:
        if self.fill not in ('none', 'mean', 'sum', 'const'):
            raise ValueError(f"'fill' must be 'none', 'mean', 'sum' or "
                             f"'const' (got {self.fill!r})")
        if self.fill == 'none' or self.index is None:
            return
        if self.edge_row is None:
            if self.num_rows > torch.iinfo(torch.int32).max:
                raise ValueError("edge attribute maps take at most 2^31 - 1 "
                                 "rows")
            self.edge_row = self.row().to(torch.int32)
        if self.loop_pos is None:
            edges = torch.arange(self.num_edges, device=self.rowptr.device)
            loop = self.index >= self.num_input
            self.loop_pos = torch.full(
                (self.num_rows, ), -1, dtype=torch.long,
                device=self.rowptr.device).scatter_reduce_(
                    0, self.edge_row.long(), torch.where(loop, edges, -1),
                    'amax')

    @property
    def unused_rows(self) -> bool:
        return self.unused_index is not None

    @property
    def num_rows(self) -> int:
        return self.rowptr.numel() - 1

    def row(self) -> Tensor:
        """Destination row of each CSR edge [E] (int64)."""
        if self.edge_row is not None:
            return self.edge_row.long()
        counts = self.rowptr[1:] - self.rowptr[:-1]
        return torch.repeat_interleave(
            torch.arange(self.num_rows, device=self.rowptr.device), counts,
            output_size=self.num_edges)


def supported(heads: int, edge_dim: int) -> bool:
    """Whether the kernels take ``heads`` heads of ``edge_dim`` features."""
    return 1 <= heads <= MAX_HEADS and heads * edge_dim <= MAX_HEADS_X_DIM


def csr_edge_attr(emap: EdgeAttrMap, edge_attr: Tensor) -> Tensor:
    """``x_p`` for every CSR edge [E, D_e], loops filled (reference)."""
    if emap.index is None:
        return edge_attr
    loop = emap.index >= emap.num_input
    if emap.num_input == 0:
        x = edge_attr.new_zeros((emap.num_edges, edge_attr.size(1)))
    else:
        x = edge_attr.index_select(0, emap.index.masked_fill(loop, 0))
        x = x.masked_fill(loop.unsqueeze(-1), 0.)
    if emap.fill == 'none':
        return x
    row = emap.row()
    if emap.fill == 'const':
        fill = emap.fill_row.to(x.dtype).view(1, -1).expand(
            emap.num_rows, -1)
    else:
        fill = x.new_zeros((emap.num_rows, x.size(1))).index_add(0, row, x)
        if emap.fill == 'mean':
            count = torch.zeros(emap.num_rows, device=x.device,
                                dtype=x.dtype).index_add(
                                    0, row, (~loop).to(x.dtype))
            fill = fill / count.clamp(min=1).unsqueeze(-1)
    return torch.where(loop.unsqueeze(-1), fill.index_select(0, row), x)


def edge_attr_dots_reference(emap: EdgeAttrMap, edge_attr: Tensor,
                             node_mat: Tensor) -> Tensor:
    x = csr_edge_attr(emap, edge_attr)
    m = node_mat if node_mat.size(0) == 1 else node_mat.index_select(
        0, emap.row())
    return (m * x.unsqueeze(1)).sum(-1)


def edge_attr_sums_reference(emap: EdgeAttrMap, edge_attr: Tensor,
                             edge_weight: Tensor) -> Tensor:
    x = csr_edge_attr(emap, edge_attr)
    msg = edge_weight.unsqueeze(-1) * x.unsqueeze(1)
    out = msg.new_zeros((emap.num_rows, ) + tuple(msg.shape[1:]))
    return out.index_add(0, emap.row(), msg)


def _zero_unused_rows(emap: EdgeAttrMap, grad_x: Tensor) -> None:
    # The kernels write d edge_attr only for the rows an edge reads; the
    # others (input self-loops the format removed) are zeroed alone, after.
    if emap.unused_rows:
        grad_x.index_fill_(0, emap.unused_index, 0)


def _rows_op(emap: EdgeAttrMap, edge_attr: Tensor, node_mat, edge_weight,
             dots: bool, sums: bool, scatter: bool, second=None):
    node_mat2, edge_weight2 = second if second is not None else (None, None)
    out = torch.ops.pyg_dfgnn.edge_attr_rows(
        emap.rowptr, emap.index, emap.num_edges, edge_attr,
        FILL_IDS[emap.fill], emap.fill_row, node_mat, edge_weight, dots, sums,
        scatter, emap.loop_pos, emap.edge_row, node_mat2, edge_weight2)
    if scatter:
        _zero_unused_rows(emap, out[2])
    return out


class EdgeTermsLink:
    r"""Joins the backward of an :func:`edge_attr_dots` and an
    :func:`edge_attr_sums` of the same ``edge_attr`` whose weights depend
    on the dots (TransformerConv: the scores' edge term, then the sum of
    the attention weights' edges): the sums' backward leaves its part of
    :math:`\partial \mathbf{x}_p` (:math:`\sum_h W_{ph}
    \partial\mathbf{S}_{ih}`) to the dots' backward, which runs after it
    (the weights' gradient reaches the dots through them) and writes both
    terms in one scatter: one [E_in, D_e] gradient written, not two written
    and then added. A pass in which the dots' backward does not run (no
    gradient asked of ``edge_attr`` or of what made it) drops the handed
    part at its end, so that it never reaches a later pass."""

    def __init__(self) -> None:
        self.handed: Optional[tuple] = None

    def hand(self, grad_sums: Tensor, edge_weight: Tensor) -> None:
        self.handed = (grad_sums, edge_weight)
        torch.autograd.Variable._execution_engine.queue_callback(self.drop)

    def take(self) -> Optional[tuple]:
        handed, self.handed = self.handed, None
        return handed

    def drop(self) -> None:
        self.handed = None


def link_supported(heads: int, edge_dim: int) -> bool:
    """Whether one scatter takes both terms (the kernel stages both
    matrices of a row in shared memory)."""
    return 2 * heads * edge_dim <= MAX_HEADS_X_DIM


class _EdgeAttrDots(torch.autograd.Function):
    @staticmethod
    def forward(ctx, edge_attr: Tensor, node_mat: Tensor,
                emap: EdgeAttrMap, link: Optional[EdgeTermsLink]) -> Tensor:
        ctx.emap, ctx.link = emap, link
        ctx.save_for_backward(edge_attr, node_mat)
        return _rows_op(emap, edge_attr, node_mat, None, True, False,
                        False)[0]

    @staticmethod
    def backward(ctx, grad: Tensor):
        edge_attr, node_mat = ctx.saved_tensors
        need_x, need_m = ctx.needs_input_grad[:2]
        handed = ctx.link.take() if ctx.link is not None else None
        # d M_i = sum_p dT_p x_p (sums), d x_p = sum_h dT_ph M_ih (scatter)
        # (+ sum_h W_ph dS_ih handed over by the linked sums)
        second = handed if need_x else None  # (dS, W)
        _, g_m, g_x = _rows_op(ctx.emap, edge_attr, node_mat,
                               grad.contiguous(), False, need_m, need_x,
                               second)
        if need_m:  # (a shared M's comes summed over the rows)
            g_m = g_m.to(node_mat.dtype)
        return g_x if need_x else None, g_m if need_m else None, None, None


class _EdgeAttrSums(torch.autograd.Function):
    @staticmethod
    def forward(ctx, edge_attr: Tensor, edge_weight: Tensor,
                emap: EdgeAttrMap, link: Optional[EdgeTermsLink]) -> Tensor:
        ctx.emap, ctx.link = emap, link
        ctx.save_for_backward(edge_attr, edge_weight)
        return _rows_op(emap, edge_attr, None, edge_weight, False, True,
                        False)[1].to(edge_attr.dtype)

    @staticmethod
    def backward(ctx, grad: Tensor):
        edge_attr, edge_weight = ctx.saved_tensors
        need_x, need_w = ctx.needs_input_grad[:2]
        grad = grad.to(edge_attr.dtype).contiguous()
        # the linked dots' backward writes this part of d x with its own
        # (a gradient of the weights is what makes it run after this one)
        hand = ctx.link is not None and need_x and need_w
        if hand:
            ctx.link.hand(grad, edge_weight)
        # d W_ph = <dS_ih, x_p> (dots), d x_p = sum_h W_ph dS_ih (scatter)
        scatter = need_x and not hand
        g_w, _, g_x = _rows_op(ctx.emap, edge_attr, grad, edge_weight,
                               need_w, False, scatter)
        return g_x if scatter else None, g_w if need_w else None, None, None


def _use_kernels(edge_attr: Tensor) -> bool:
    return edge_attr.is_cuda and edge_attr.dtype in (
        torch.float32, torch.float16, torch.bfloat16) and _cuda.available()


def edge_attr_dots(emap: EdgeAttrMap, edge_attr: Tensor,
                   node_mat: Tensor,
                   link: Optional[EdgeTermsLink] = None) -> Tensor:
    r""":math:`T_{ph} = \langle \mathbf{M}_{ih}, \mathbf{x}_p \rangle`
    [E, H] for CSR edge ``p`` into row ``i``; ``node_mat`` [N or 1, H, D_e]
    (one row: shared by all nodes), in ``edge_attr``'s dtype. ``link``: see
    :class:`EdgeTermsLink` (a per-row ``node_mat``)."""
    _check(emap, edge_attr, node_mat.shape[1])
    if node_mat.dim() != 3 or node_mat.size(0) not in (1, emap.num_rows) \
            or node_mat.size(2) != edge_attr.size(1):
        raise ValueError(f"'node_mat' must have shape [{emap.num_rows} or 1,"
                         f" H, {edge_attr.size(1)}] (got "
                         f"{list(node_mat.shape)})")
    if _use_kernels(edge_attr):
        if link is not None and node_mat.size(0) != emap.num_rows:
            raise ValueError("a linked 'edge_attr_dots' needs one 'node_mat' "
                             "row per node")
        return _EdgeAttrDots.apply(edge_attr, node_mat.contiguous(), emap,
                                   link)
    return edge_attr_dots_reference(emap, edge_attr, node_mat)


def edge_attr_sums(emap: EdgeAttrMap, edge_attr: Tensor,
                   edge_weight: Tensor,
                   link: Optional[EdgeTermsLink] = None) -> Tensor:
    r""":math:`\mathbf{S}_{ih} = \sum_p W_{ph} \mathbf{x}_p` [N, H, D_e]
    over the CSR edges ``p`` into row ``i``; ``edge_weight`` [E, H] in
    ``edge_attr``'s dtype. ``link``: the one given to the
    :func:`edge_attr_dots` that ``edge_weight`` depends on
    (:class:`EdgeTermsLink`)."""
    _check(emap, edge_attr, edge_weight.shape[-1])
    if edge_weight.shape != (emap.num_edges, edge_weight.size(-1)):
        raise ValueError(f"'edge_weight' must have shape [{emap.num_edges}, "
                         f"H] (got {list(edge_weight.shape)})")
    if _use_kernels(edge_attr):
        return _EdgeAttrSums.apply(edge_attr, edge_weight.contiguous(), emap,
                                   link)
    return edge_attr_sums_reference(emap, edge_attr, edge_weight)


class _EdgeAttrProject(torch.autograd.Function):
    @staticmethod
    def forward(ctx, edge_attr: Tensor, weight: Tensor,
                emap: EdgeAttrMap) -> Tensor:
        ctx.emap = emap
        ctx.save_for_backward(edge_attr, weight)
        return _project_op(emap, edge_attr, weight, None)[0]

    @staticmethod
    def backward(ctx, grad: Tensor):
        edge_attr, weight = ctx.saved_tensors
        # d x_p = W^T (dK_p + the loop's handed share), d W = sum_p dK_p x_p
        _, g_x, g_w = _project_op(ctx.emap, edge_attr, weight,
                                  grad.to(edge_attr.dtype).contiguous())
        return g_x, g_w.to(weight.dtype), None


def _project_op(emap: EdgeAttrMap, edge_attr: Tensor, weight: Tensor,
                grad: Optional[Tensor]):
    fill_row = emap.fill_row  # (made in the user's dtype; autocast casts)
    if fill_row is not None:
        fill_row = fill_row.to(edge_attr.dtype)
    out = torch.ops.pyg_dfgnn.edge_attr_project(
        emap.rowptr, emap.index, emap.num_edges, edge_attr,
        FILL_IDS[emap.fill], fill_row, weight, grad, emap.loop_pos,
        emap.edge_row)
    if grad is not None:
        _zero_unused_rows(emap, out[1])
    return out


def edge_attr_project(emap: EdgeAttrMap, edge_attr: Tensor,
                      weight: Tensor) -> Tensor:
    r""":math:`\mathbf{K}_p = \mathbf{W} \mathbf{x}_p` [E, H * F] for every
    CSR edge ``p`` (a bias-free ``Linear`` of the edge attributes with
    ``weight`` [H * F, D_e], loops filled: GATv2's edge term), in CSR
    order. On CUDA (D_e <= :obj:`MAX_PROJECT_DIM`, H * F a multiple of 4)
    one kernel reads the user's ``edge_attr`` through the map and writes
    K; its backward forms d ``edge_attr`` and d ``weight`` in one pass
    over dK, instead of a reorder, a sparse product for the loops and
    three [E, H * F] GEMMs."""
    if edge_attr.dim() != 2 or edge_attr.size(0) != emap.num_input:
        raise ValueError(f"'edge_attr' must have shape [{emap.num_input}, "
                         f"edge_dim] (got {list(edge_attr.shape)})")
    if weight.dim() != 2 or weight.size(1) != edge_attr.size(1):
        raise ValueError(f"'weight' must have shape [H * F, "
                         f"{edge_attr.size(1)}] (got {list(weight.shape)})")
    if project_supported(weight.size(0), edge_attr.size(1)) and \
            _use_kernels(edge_attr) and weight.dtype == edge_attr.dtype:
        return _EdgeAttrProject.apply(edge_attr, weight.contiguous(), emap)
    return csr_edge_attr(emap, edge_attr) @ weight.t()


def project_supported(out_dim: int, edge_dim: int) -> bool:
    """Whether the projection kernels take [``out_dim``, ``edge_dim``]
    weights."""
    return 1 <= edge_dim <= MAX_PROJECT_DIM and out_dim % 4 == 0


def _check(emap: EdgeAttrMap, edge_attr: Tensor, heads: int) -> None:
    if emap.fill == 'const' and emap.fill_row is None:
        raise ValueError("an EdgeAttrMap with fill 'const' needs its "
                         "'fill_row' (the loops' [D_e] features)")
    if edge_attr.dim() != 2 or edge_attr.size(0) != emap.num_input:
        raise ValueError(f"'edge_attr' must have shape [{emap.num_input}, "
                         f"edge_dim] (got {list(edge_attr.shape)})")
    if edge_attr.is_cuda and not supported(heads, edge_attr.size(1)):
        raise ValueError(f"edge attribute kernels take at most {MAX_HEADS} "
                         f"heads and heads * edge_dim <= {MAX_HEADS_X_DIM} "
                         f"(got {heads} x {edge_attr.size(1)})")


__all__ = ['EdgeAttrMap', 'EdgeTermsLink', 'link_supported',
           'edge_attr_dots', 'edge_attr_sums',
           'edge_attr_project', 'supported', 'project_supported',
           'csr_edge_attr']

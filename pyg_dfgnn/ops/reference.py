"""Pure-PyTorch fused attention: the CPU path and the kernels' test oracle.

Unfused on purpose (gather -> edge softmax -> scatter, as PyG's convs run it)
and differentiable through autograd. Softmax follows
:func:`torch_geometric.utils.softmax` exactly: the row max is subtracted (and
detached), ``1e-16`` is added to the denominator, and rows without edges give
zero output.
"""
from typing import Optional, Tuple

import torch
import torch.nn.functional as F
from torch import Tensor

from pyg_dfgnn.graph import DFGraph


def edge_scores(graph: DFGraph, kind: str, query: Tensor, key: Tensor,
                att: Optional[Tensor], scale: float, negative_slope: float,
                edge_score: Optional[Tensor] = None,
                edge_key: Optional[Tensor] = None) -> Tensor:
    """Unnormalised scores ``s`` [E, H] in CSR edge order (the SDDMM)."""
    row, col = graph.row, graph.col.to(torch.int64)
    if kind == 'dot':
        k = key.index_select(0, col)
        if edge_key is not None:
            k = k + edge_key
        s = (query.index_select(0, row) * k).sum(-1) * scale
        if edge_score is not None:
            s = s + edge_score
    elif kind == 'add':
        s = query.index_select(0, row) + key.index_select(0, col)
        if edge_score is not None:
            s = s + edge_score
        s = F.leaky_relu(s, negative_slope)
    elif kind == 'gatv2':
        z = query.index_select(0, row) + key.index_select(0, col)
        if edge_key is not None:
            z = z + edge_key
        s = (F.leaky_relu(z, negative_slope) * att).sum(-1)
    else:
        raise ValueError(f"Unknown score kind '{kind}'")
    return s


def edge_softmax(graph: DFGraph, s: Tensor) -> Tensor:
    """Softmax of ``s`` [E, H] over each destination's in-edges."""
    row = graph.row.view(-1, 1).expand_as(s)
    s_max = torch.full((graph.num_dst, s.size(1)), float('-inf'),
                       dtype=s.dtype, device=s.device)
    s_max = s_max.scatter_reduce(0, row, s.detach(), 'amax',
                                 include_self=False)
    e = (s - s_max.index_select(0, graph.row)).exp()
    denom = torch.zeros_like(s_max).scatter_add(0, row, e) + 1e-16
    return e / denom.index_select(0, graph.row)


def fused_attention_reference(
    graph: DFGraph,
    kind: str,
    value: Tensor,
    query: Tensor,
    key: Tensor,
    att: Optional[Tensor] = None,
    scale: float = 1.0,
    negative_slope: float = 0.2,
    edge_score: Optional[Tensor] = None,
    edge_key: Optional[Tensor] = None,
    edge_value: Optional[Tensor] = None,
    dropout: float = 0.0,
    training: bool = False,
    attention_dropped: bool = True,
    dropout_mask: Optional[Tensor] = None,
) -> Tuple[Tensor, Tensor]:
    """Returns ``(out [N_dst, H, F], alpha [E, H])``, alpha in CSR order,
    after dropout (GATConv's convention) or, with ``attention_dropped=False``,
    before it (TransformerConv's). ``dropout_mask`` [E, H] (bool, kept
    edges) replaces the random mask: the tests give the kernels' own."""
    s = edge_scores(graph, kind, query, key, att, scale, negative_slope,
                    edge_score, edge_key)
    alpha = edge_softmax(graph, s)
    weights = alpha
    if dropout_mask is not None:
        weights = alpha * dropout_mask.to(alpha.dtype) / (1.0 - dropout)
    else:
        weights = F.dropout(alpha, p=dropout, training=training)
    msg = value.index_select(0, graph.col.to(torch.int64))
    if edge_value is not None:
        msg = msg + edge_value
    msg = msg * weights.unsqueeze(-1)
    out = value.new_zeros((graph.num_dst, ) + tuple(value.shape[1:]))
    out = out.index_add(0, graph.row, msg)
    return out, weights if attention_dropped else alpha

r"""The fused attention op.

For each destination node :math:`i` and head :math:`h`

.. math::
    \mathbf{o}_i = \sum_{j \in \mathcal{N}(i)} \mathrm{softmax}_j(s_{ij})
    \, (\mathbf{v}_j + \mathbf{e}^V_{ij})

with the score kinds

* ``'dot'`` (TransformerConv, AGNN): :math:`s_{ij} = \mathrm{scale} \cdot
  \langle \mathbf{q}_i, \mathbf{k}_j + \mathbf{e}^K_{ij} \rangle +
  a^{E}_{ij}`;
* ``'add'`` (GAT): :math:`s_{ij} = \mathrm{LeakyReLU}(a^{dst}_i + a^{src}_j +
  a^{E}_{ij})`, ``query`` = :math:`a^{dst}` [N_dst, H], ``key`` =
  :math:`a^{src}` [N_src, H];
* ``'gatv2'`` (GATv2): :math:`s_{ij} = \langle \mathbf{a}, \mathrm{LeakyReLU}
  (\mathbf{x}^r_i + \mathbf{x}^l_j + \mathbf{e}^K_{ij}) \rangle`, ``query`` =
  :math:`\mathbf{x}^r`, ``key`` = :math:`\mathbf{x}^l`, ``att`` [H, F].

CUDA tensors run the fused kernels, edge terms, attention dropout and the
attention weights included; CPU tensors (and float64) run
:mod:`pyg_dfgnn.ops.reference`.
"""
from typing import Optional, Tuple, Union

import torch
from torch import Tensor

from pyg_dfgnn.graph import DFGraph
from pyg_dfgnn.ops import cuda as _cuda
from pyg_dfgnn.ops.reference import fused_attention_reference

KINDS = ('dot', 'add', 'gatv2')
_FLOAT_DTYPES = (torch.float16, torch.bfloat16, torch.float32, torch.float64)


def _check_tensor(name: str, t: Tensor, shape: Tuple, dtype: torch.dtype,
                  device: torch.device) -> None:
    # The common case in one expression (this runs on every call).
    if isinstance(t, Tensor) and t.shape == shape and t.dtype == dtype and \
            t.device == device:
        return
    if not isinstance(t, Tensor):
        raise TypeError(f"'{name}' must be a Tensor (got {type(t).__name__})")
    if t.device != device:
        raise ValueError(f"'{name}' is on {t.device} but 'value' is on "
                         f"{device}")
    if t.dtype != dtype:
        raise TypeError(f"'{name}' has dtype {t.dtype} but 'value' has "
                        f"{dtype}")
    if t.dim() != len(shape) or any(
            want is not None and have != want
            for have, want in zip(t.shape, shape)):
        want = [('*' if s is None else s) for s in shape]
        raise ValueError(f"'{name}' must have shape {want} "
                         f"(got {list(t.shape)})")


def check_inputs(graph: DFGraph, kind: str, value: Tensor, query: Tensor,
                 key: Tensor, att: Optional[Tensor] = None,
                 edge_score: Optional[Tensor] = None,
                 edge_key: Optional[Tensor] = None,
                 edge_value: Optional[Tensor] = None) -> None:
    """Clear errors for everything the op cannot take."""
    if not isinstance(graph, DFGraph):
        raise TypeError(f"'graph' must be a DFGraph (got "
                        f"{type(graph).__name__})")
    if kind not in KINDS:
        raise ValueError(f"'kind' must be one of {KINDS} (got '{kind}')")
    if not isinstance(value, Tensor):
        raise TypeError("'value' must be a Tensor")
    if value.dtype not in _FLOAT_DTYPES:
        raise TypeError(f"'value' must be floating point (got {value.dtype})")
    if value.dim() != 3:
        raise ValueError(f"'value' must have shape [N_src, H, F] "
                         f"(got {list(value.shape)})")
    graph.check_fresh()
    n_src, heads, f_out = value.shape
    dev, dt = value.device, value.dtype
    if graph.device != dev:
        raise ValueError(f"'graph' is on {graph.device} but 'value' is on "
                         f"{dev}")
    if n_src != graph.num_src:
        raise ValueError(f"The DFGraph was built for another graph: 'value' "
                         f"has {n_src} source nodes, the graph {graph.num_src}")
    n_dst, e = graph.num_dst, graph.num_edges
    if kind == 'add':
        _check_tensor('query', query, (n_dst, heads), dt, dev)
        _check_tensor('key', key, (n_src, heads), dt, dev)
    else:
        d = query.size(-1) if isinstance(query, Tensor) and query.dim() else 0
        _check_tensor('query', query, (n_dst, heads, d), dt, dev)
        _check_tensor('key', key, (n_src, heads, d), dt, dev)
        if kind == 'gatv2':
            if att is None:
                raise ValueError("kind 'gatv2' needs 'att' of shape [H, D] "
                                 "(D: the query / key width)")
            _check_tensor('att', att, (heads, d), dt, dev)
        if edge_key is not None:
            _check_tensor('edge_key', edge_key, (e, heads, d), dt, dev)
    if edge_score is not None:
        if kind == 'gatv2':
            raise ValueError("'edge_score' is not used by kind 'gatv2'")
        _check_tensor('edge_score', edge_score, (e, heads), dt, dev)
    if edge_key is not None and kind == 'add':
        raise ValueError("'edge_key' is not used by kind 'add'")
    if edge_value is not None:
        _check_tensor('edge_value', edge_value, (e, heads, f_out), dt, dev)


#: elements of one 16-byte vector, the kernels' vector rows
_VECTOR = {torch.float32: 4, torch.float16: 8, torch.bfloat16: 8}


def kernel_width(width: int, dtype: torch.dtype) -> int:
    """The head width the CUDA kernels run heads of ``width`` features at:
    zero-padded to a whole number of 16-byte vectors where that widens them
    by at most a third (the vector rows; unpadded, such heads run the
    scalar rows: cluster-gps's 8 x 6 heads 2x slower, benchmarks/NOTES.md
    "Session 19"), else ``width``. Zero columns change no score and give
    zero output columns."""
    vw = _VECTOR.get(dtype)
    if vw is None or width % vw == 0:
        return width
    padded = width + (-width % vw)
    return padded if 3 * padded <= 4 * width else width


def _pad_last(t: Optional[Tensor], width: int) -> Optional[Tensor]:
    if t is None or t.size(-1) == width:
        return t
    return torch.nn.functional.pad(t, (0, width - t.size(-1)))


_noted = False


def _note_reference_path() -> None:
    """On a machine without CUDA, say once that the reference path runs."""
    global _noted
    if not _noted:
        _noted = True
        if not torch.cuda.is_available():
            from pyg_dfgnn.ops._loader import load_kernels
            load_kernels()  # prints the one-line notice


def fused_attention(
    graph: DFGraph,
    kind: str,
    value: Tensor,
    query: Tensor,
    key: Tensor,
    att: Optional[Tensor] = None,
    *,
    scale: float = 1.0,
    negative_slope: float = 0.2,
    edge_score: Optional[Tensor] = None,
    edge_key: Optional[Tensor] = None,
    edge_value: Optional[Tensor] = None,
    dropout: float = 0.0,
    training: bool = False,
    return_attention: bool = False,
    attention_after_dropout: bool = True,
    attention_perm: Optional[Tensor] = None,
) -> Union[Tensor, Tuple[Tensor, Tensor]]:
    r"""Fused SDDMM -> edge softmax -> SpMM over ``graph``'s CSR.

    Args:
        graph (DFGraph): the graph (edges in CSR order).
        kind (str): ``'dot'``, ``'add'`` or ``'gatv2'``.
        value (Tensor): messages :math:`\mathbf{v}` [N_src, H, F].
        query (Tensor): destination side of the score ([N_dst, H, D], or
            [N_dst, H] for ``'add'``).
        key (Tensor): source side of the score ([N_src, H, D], or
            [N_src, H] for ``'add'``).
        att (Tensor, optional): ``'gatv2'`` attention vector [H, D].
        scale (float): ``'dot'`` score scale.
        negative_slope (float): LeakyReLU slope of ``'add'`` / ``'gatv2'``.
        edge_score (Tensor, optional): per-edge score term [E, H]
            (``'add'``: inside the LeakyReLU; ``'dot'``: added to the scaled
            dot product).
        edge_key (Tensor, optional): per-edge key term [E, H, D]
            (``'dot'``, ``'gatv2'``).
        edge_value (Tensor, optional): per-edge value term [E, H, F].
        dropout (float): dropout on the attention coefficients.
        training (bool): whether dropout is active.
        return_attention (bool): also return alpha [E, H] (differentiable).
        attention_after_dropout (bool): alpha after dropout (GATConv's
            convention) or before it (``False``: TransformerConv's).
        attention_perm (Tensor, optional): CSR edge ``e``'s weights go to
            row ``attention_perm[e]`` of alpha (the kernels write them there
            directly); CSR order without it.

    Edge tensors are in CSR order (``graph.perm`` maps to input order).
    ``dropout`` draws its mask from PyTorch's CUDA generator
    (``torch.manual_seed`` reproduces it) on CUDA, from ``F.dropout`` on the
    CPU.
    """
    check_inputs(graph, kind, value, query, key, att, edge_score, edge_key,
                 edge_value)
    if not 0.0 <= dropout <= 1.0:
        raise ValueError(f"'dropout' must be in [0, 1] (got {dropout})")
    drop = dropout if training else 0.0
    if attention_perm is not None and (
            not isinstance(attention_perm, Tensor)
            or attention_perm.shape != (graph.num_edges, )
            or attention_perm.device != value.device):
        raise ValueError(f"'attention_perm' must be a permutation of the "
                         f"{graph.num_edges} edges on {value.device}")
    # (dropout 1 drops every weight: the kernels' 1 / (1 - p) has no value
    # there, the reference's F.dropout gives the zeros)
    if value.is_cuda and _cuda.available() and drop < 1.0:
        attention = None
        if return_attention:
            attention = ('after_dropout' if attention_after_dropout else
                         'before_dropout')
        f_out = value.size(-1)
        if edge_key is None and edge_value is None:  # (no [E, H, F] copies)
            f_pad = kernel_width(f_out, value.dtype)
            value = _pad_last(value, f_pad)
            if kind != 'add':
                d_pad = kernel_width(query.size(-1), value.dtype)
                query, key = _pad_last(query, d_pad), _pad_last(key, d_pad)
                att = _pad_last(att, d_pad)
        result = _cuda.fused_attention_cuda(
            graph, kind, value, query, key, att, scale, negative_slope,
            edge_score=edge_score, edge_key=edge_key, edge_value=edge_value,
            dropout=drop, attention=attention, attention_perm=attention_perm)
        if value.size(-1) == f_out:
            return result
        if return_attention:
            return result[0][..., :f_out], result[1]
        return result[..., :f_out]
    if not value.is_cuda:
        _note_reference_path()
    out, alpha = fused_attention_reference(
        graph, kind, value, query, key, att, scale, negative_slope,
        edge_score, edge_key, edge_value, drop, training,
        attention_dropped=attention_after_dropout)
    if not return_attention:
        return out
    if attention_perm is not None:
        alpha = alpha.new_empty(alpha.shape).index_copy(
            0, attention_perm.to(torch.int64), alpha)
    return out, alpha


__all__ = ['fused_attention', 'fused_attention_reference', 'check_inputs',
           'kernel_width']

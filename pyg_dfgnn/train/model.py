r"""GPS model (Rampasek et al., GraphGPS) with DF-GNN convs as local layers.

Each :class:`GPSLayer` computes, for node features :math:`X`:

.. math::
    X_L &= \mathrm{Norm}(X + \mathrm{Drop}(\mathrm{MPNN}(X, A)))

    X_G &= \mathrm{Norm}(X + \mathrm{Drop}(\mathrm{MHA}(X)))

    X' &= \mathrm{Norm}(H + \mathrm{FFN}(H)), \quad H = X_L + X_G

where the local MPNN is one of ``DFGAT``, ``DFGATv2``, ``DFTransformer``,
``DFAGNN`` (the fused DF-GNN convs), ``GINE``, ``GCN`` or ``None``, and the
global model is multi-head attention over the nodes of each graph
(``Transformer``) or ``None``.

The global attention is GraphGPS's ``nn.MultiheadAttention`` over graphs
padded to the largest (``to_dense_batch``). With ``backend='dfgnn'`` the same
module's weights run without padding, as ``gt.attn_impl`` says:

* ``'varlen'`` (``'auto'`` on CUDA without attention dropout in effect:
  evaluation, or ``gt.attn_dropout: 0``): PyTorch's memory-efficient attention
  kernel over variable-length segments (each graph's nodes; the padding
  nodes of a captured batch in segments of at most the largest graph),
  ``cu_seqlens`` from the batch's graph bounds -- the kernel nested jagged
  SDPA runs, without the nested tensors' host work;
* ``'fused'`` (``'auto'`` on CUDA while training with attention dropout
  and heads the kernels run as 4 * 2^k features, and on the CPU): our op,
  ``'dot'`` attention over the block-diagonal complete graph of the batch
  (``attn_graph`` of the device loader, :mod:`pyg_dfgnn.train.batching`),
  the dropout mask drawn in the kernels;
* ``'padded'``: GraphGPS's way (``'auto'`` under ``torch.compile``, and
  while training with attention dropout and other head widths: see
  :func:`global_attn_impl`).

H100, pattern-gps, captured step, attention dropout 0.5 (benchmarks/NOTES.md
"Session 17"): our op (the short-owner kernels, D = 16 heads) 213 us per
layer forward + backward against the padded memory-efficient kernel's 198
plus its padding, 2.45 against 2.59 s per epoch. (Session 10, before the
short-owner kernels: our op 5x slower.) Device-loader batches also carry
the dense layout (``dense_index``, ``max_num_nodes``) and the graph
bounds, so every path runs without host syncs.

Batches padded for a captured step carry ``node_mask``: batch norms
(:class:`MaskedBatchNorm1d`) take their statistics from the real nodes only.

``backend='pyg'`` builds every DF conv's PyG twin (``GATConv``, ...) with the
same constructor arguments; the twins hold the same parameters under the same
names, so the two backends are compared on one config and can load each
other's checkpoints.

The attention local layers take ``dropout=gt.local_attn_dropout`` and, with
``dataset.edge_encoder``, ``edge_dim=gt.dim_hidden`` and the encoded edge
features (GraphGPS's GAT local layer: ``GATConv(..., edge_dim=dim_h)``).
"""
from __future__ import annotations

import importlib
from typing import Any, Optional, Tuple

import torch
import torch.nn.functional as F
from torch import Tensor, nn
from torch_geometric.utils import to_dense_batch

from pyg_dfgnn.train.config import (VARLEN_COMPILE_ERROR,
                                    VARLEN_DROPOUT_ERROR, Config,
                                    ConfigError, rwse_times,
                                    split_layer_type)

#: DF conv name -> (class in pyg_dfgnn.nn, PyG twin in torch_geometric.nn).
DF_CONVS = {
    'DFGAT': ('DFGATConv', 'GATConv'),
    'DFGATv2': ('DFGATv2Conv', 'GATv2Conv'),
    'DFTransformer': ('DFTransformerConv', 'TransformerConv'),
    'DFAGNN': ('DFAGNNConv', 'AGNNConv'),
}

#: Local layers that take self-loops from the data (``ToDFGNNFormat(
#: add_self_loops=True)``) instead of adding them in every forward.
SELF_LOOP_LAYERS = ('DFGAT', 'DFGATv2', 'DFAGNN')


def conv_class(local: str, backend: str) -> type:
    """The conv class of a DF local layer for ``backend`` (imported lazily,
    so the PyG backend works without the DF convs)."""
    df_name, pyg_name = DF_CONVS[local]
    if backend == 'pyg':
        return getattr(importlib.import_module('torch_geometric.nn'),
                       pyg_name)
    try:
        module = importlib.import_module('pyg_dfgnn.nn')
        return getattr(module, df_name)
    except (ImportError, AttributeError) as e:
        raise ImportError(
            f"backend 'dfgnn' needs pyg_dfgnn.nn.{df_name}, which could not "
            f"be imported ({e}); use backend=pyg to run on {pyg_name}") from e


def activation(name: str) -> nn.Module:
    return {
        'relu': nn.ReLU, 'gelu': nn.GELU, 'elu': nn.ELU, 'silu': nn.SiLU,
        'leaky_relu': nn.LeakyReLU, 'prelu': nn.PReLU, 'tanh': nn.Tanh,
    }[name]()


def build_local_model(local: str, dim: int, heads: int, backend: str,
                      act: str, attn_dropout: float = 0.0,
                      edge_dim: Optional[int] = None) -> Optional[nn.Module]:
    """The local message-passing layer ``dim -> dim``; ``attn_dropout`` and
    ``edge_dim`` go to the attention convs (DFGAT, DFGATv2, DFTransformer)."""
    if local == 'None':
        return None
    if local in ('DFGAT', 'DFGATv2'):
        # Self-loops (and their edge features) come with the data.
        return conv_class(local, backend)(dim, dim // heads, heads=heads,
                                          dropout=attn_dropout,
                                          edge_dim=edge_dim,
                                          add_self_loops=False)
    if local == 'DFTransformer':
        return conv_class(local, backend)(dim, dim // heads, heads=heads,
                                          dropout=attn_dropout,
                                          edge_dim=edge_dim)
    if local == 'DFAGNN':
        return conv_class(local, backend)(requires_grad=True,
                                          add_self_loops=False)
    from torch_geometric.nn import GCNConv, GINEConv
    if local == 'GINE':
        mlp = nn.Sequential(nn.Linear(dim, dim), activation(act),
                            nn.Linear(dim, dim))
        return GINEConv(mlp)
    if local == 'GCN':
        return GCNConv(dim, dim)
    raise ValueError(f'unknown local model {local!r}')


class MaskedBatchNorm1d(nn.BatchNorm1d):
    r"""``nn.BatchNorm1d`` (same parameters and buffers) whose training
    statistics come from the rows ``mask`` selects (padding rows are
    normalised but not counted). Without a mask it is ``BatchNorm1d``,
    except that ``momentum=None`` (cumulative average) updates the running
    statistics with device ops instead of reading ``num_batches_tracked``
    on the host."""

    def forward(self, x: Tensor, mask: Optional[Tensor] = None) -> Tensor:
        if not (self.training and self.track_running_stats) or (
                mask is None and self.momentum is not None):
            return super().forward(x)
        if mask is None:
            w = None
            count = x.new_full((), float(x.size(0)))
            mean = x.mean(0)
            var = (x - mean).square().mean(0)
        else:
            w = mask.to(x.dtype).unsqueeze(-1)
            count = w.sum()
            mean = (x * w).sum(0) / count
            var = ((x - mean).square() * w).sum(0) / count
        out = (x - mean) * torch.rsqrt(var + self.eps)
        if self.affine:
            out = out * self.weight + self.bias
        with torch.no_grad():
            self.num_batches_tracked.add_(1)
            factor = self.momentum if self.momentum is not None else \
                1.0 / self.num_batches_tracked
            unbiased = var * count / (count - 1).clamp(min=1)
            self.running_mean.lerp_(mean.detach(), factor)
            self.running_var.lerp_(unbiased.detach(), factor)
        return out


def _apply(seq: nn.Module, x: Tensor, mask: Optional[Tensor]) -> Tensor:
    """``seq(x)`` with ``mask`` passed to its batch norms."""
    for module in seq:
        x = module(x, mask) if isinstance(module, MaskedBatchNorm1d) \
            else module(x)
    return x


def padded_attention(attn: nn.MultiheadAttention, x: Tensor,
                     data: Any) -> Tensor:
    """GraphGPS's attention over graphs padded to the largest, through the
    device loader's dense layout (``dense_index``: node -> row of
    ``[num_slots * max_num_nodes]``, padding nodes to one spare row): the
    sizes are known on the host, so no host sync."""
    width, slots = data.max_num_nodes, data.num_slots
    rows = slots * width
    index = data.dense_index
    dense = x.new_zeros(rows + 1, x.size(1)).index_copy(0, index, x)
    real = torch.zeros(rows + 1, dtype=torch.bool, device=x.device)
    real = real.index_fill(0, index, True)[:rows].view(slots, width)
    # An empty slot (fewer graphs than slots) attends to its first row:
    # fully masked rows would make NaN, and NaN * 0 gradients.
    real[:, 0] = True
    dense = dense[:rows].view(slots, width, -1)
    h = attn(dense, dense, dense, key_padding_mask=~real,
             need_weights=False)[0]
    h = torch.cat([h.reshape(rows, -1), h.new_zeros(1, h.size(-1))])
    return h.index_select(0, index)


def fused_global_attention(attn: nn.MultiheadAttention, x: Tensor, graph,
                           training: bool) -> Tensor:
    """``attn`` (its weights, dropout and scaling) as ``'dot'`` fused
    attention over ``graph``, the block-diagonal complete graph of the
    batch: each node attends to the nodes of its graph, as
    ``nn.MultiheadAttention`` with the padding masked."""
    from pyg_dfgnn.ops import fused_attention
    heads, dim = attn.num_heads, x.size(1)
    qkv = F.linear(x, attn.in_proj_weight, attn.in_proj_bias)
    q, k, v = qkv.view(-1, 3, heads, dim // heads).unbind(1)
    out = fused_attention(graph, 'dot', v, q, k,
                          scale=(dim // heads)**-0.5, dropout=attn.dropout,
                          training=training)
    return attn.out_proj(out.reshape(-1, dim))


def varlen_attention(attn: nn.MultiheadAttention, x: Tensor, bounds: Tensor,
                     max_len: int, training: bool) -> Tensor:
    """``attn`` (its weights, dropout and scaling) over the segments
    ``bounds`` (``[S + 1]`` row offsets, non-decreasing, 0 to ``N``; empty
    segments allowed) of at most ``max_len`` rows each, through PyTorch's
    memory-efficient attention kernel with ``cu_seqlens`` (CUDA): each row
    attends to the rows of its segment. ``max_len`` must bound every
    segment (the kernel skips rows past it): the device loader's bounds
    come with their bound; :func:`segment_bounds` gives a PyG batch's."""
    heads, dim = attn.num_heads, x.size(1)
    head_dim = dim // heads
    qkv = F.linear(x, attn.in_proj_weight, attn.in_proj_bias)
    qkv = qkv.view(1, -1, 3, heads, head_dim)
    # The kernel wants D a multiple of its alignment (fp32 4, else 8): zero
    # columns change no score and give zero output columns (SDPA pads alike).
    align = 4 if x.dtype == torch.float32 else 8
    if head_dim % align:
        qkv = F.pad(qkv, (0, -head_dim % align))
    q, k, v = qkv.unbind(2)
    cu = bounds.to(torch.int32)
    p = attn.dropout if training else 0.0
    out = torch.ops.aten._efficient_attention_forward(
        q, k, v, None, cu, cu, max_len, max_len, p, 0,
        torch.is_grad_enabled(), scale=head_dim**-0.5)[0]
    return attn.out_proj(out[..., :head_dim].reshape(-1, dim))


def segment_bounds(data: Any) -> Tuple[Tensor, int]:
    """The graph bounds of a batch and a bound on their segments: the
    device loader's (no sync), or a PyG ``Batch``'s ``ptr`` (one host sync
    for the largest graph, as ``to_dense_batch``'s)."""
    bounds = getattr(data, 'graph_bounds', None)
    if bounds is not None:
        return bounds, max(1, data.max_graph_nodes)
    ptr = data.ptr
    return ptr, max(1, int(ptr.diff().max())) if ptr.numel() > 1 else 1


def fused_attention_pays(head_dim: Optional[int]) -> bool:
    """Whether our op takes GPS's global attention heads of ``head_dim``
    features where it was measured faster than the padded kernel: heads
    the kernels run (:func:`pyg_dfgnn.ops.kernel_width`, fp32: the runner
    trains in fp32) as vector rows of a power-of-two number of lanes (4 *
    2^k features: the short-owner kernels' shapes). pattern-gps, 4 x 16:
    2.59 -> 2.45 s per epoch (session 17); cluster-gps, 8 x 6 run as 8:
    2.85 -> 2.63 s per epoch on 2,000 graphs (session 19; unpadded, in the
    scalar rows, 2x slower than padded). ``None``: unknown, taken."""
    if head_dim is None:
        return True
    from pyg_dfgnn.ops import kernel_width
    width = kernel_width(head_dim, torch.float32)
    lanes = width // 4
    return width % 4 == 0 and lanes > 0 and lanes & (lanes - 1) == 0


def global_attn_impl(impl: str, backend: str, device: Any,
                     compiling: bool = False, dropout: float = 0.0,
                     head_dim: Optional[int] = None) -> str:
    """``gt.attn_impl`` resolved for ``device``: ``'auto'`` is ``'varlen'``
    on CUDA and ``'fused'`` elsewhere (backend pyg: ``'padded'``);
    ``'varlen'`` needs CUDA. On CUDA ``'auto'`` is not ``'varlen'``

    * under ``torch.compile`` (``compiling``): ``'padded'``. PyTorch's fake
      (meta) function of the varlen kernel's backward takes other arguments
      than the op (it lacks ``out``; torch 2.11-2.14), so a compiled
      backward through it fails; and inductor fuses the padded path's
      masking and softmax glue, which makes it faster than our op there
      with dropout too (H100, session 35, compiled GPS layers in CUDA
      graphs: pattern-gps 5.83 against 6.82 ms per step, cluster-gps
      10.43 against 10.90; ``'fused'`` compiles when asked for);
    * with attention ``dropout`` in effect (training): ``'fused'`` (our
      kernels draw the mask and regenerate it in the backward) for the
      head widths :func:`fused_attention_pays` takes, else ``'padded'``. The
      varlen kernel's backward under ``cu_seqlens`` regenerates another
      dropout mask than its forward used (scripts/varlen_dropout_check.py,
      H100, torch 2.11: directional derivative 2.22 vs -4.45 by central
      differences at p = 0.5, exact at p = 0 and on the padded path), and
      a 30-epoch pattern-gps run through it degraded from epoch 5 on
      (train loss 0.31 -> 0.46) while the padded one trained to 86.4."""
    cuda = torch.device(device).type == 'cuda'
    if backend != 'dfgnn':
        return 'padded'
    if impl == 'auto':
        if not cuda:
            return 'fused'
        if compiling:
            return 'padded'
        if dropout > 0:
            return 'fused' if fused_attention_pays(head_dim) else 'padded'
        return 'varlen'
    if impl == 'varlen' and not cuda:
        raise ConfigError("'gt.attn_impl' varlen runs PyTorch's "
                          "memory-efficient attention kernel, on CUDA only "
                          "(use 'fused' or 'padded' on the CPU)")
    if impl == 'varlen' and compiling:
        raise ConfigError(VARLEN_COMPILE_ERROR)
    if impl == 'varlen' and dropout > 0:
        raise ConfigError(VARLEN_DROPOUT_ERROR)
    return impl


class GPSLayer(nn.Module):
    """One GPS layer: local MPNN + global attention + FFN (see module doc)."""

    def __init__(self, dim: int, local: str, glob: str, heads: int,
                 backend: str, act: str = 'relu', dropout: float = 0.0,
                 attn_dropout: float = 0.0, layer_norm: bool = False,
                 batch_norm: bool = True, local_attn_dropout: float = 0.0,
                 edge_features: bool = False, attn_impl: str = 'auto'):
        super().__init__()
        self.local_name, self.global_name = local, glob
        self.backend = backend
        self.attn_impl = attn_impl
        self.dropout = dropout
        # GINE always takes edge features (a DummyEdge one by default).
        self.local_takes_edges = local == 'GINE' or edge_features
        self.local_model = build_local_model(
            local, dim, heads, backend, act, local_attn_dropout,
            dim if edge_features and local != 'GINE' else None)
        self.self_attn = None
        if glob == 'Transformer':
            self.self_attn = nn.MultiheadAttention(
                dim, heads, dropout=attn_dropout, batch_first=True)

        def norm() -> nn.Module:
            if batch_norm:
                return MaskedBatchNorm1d(dim)
            if layer_norm:
                return nn.LayerNorm(dim)
            return nn.Identity()

        self.norm_local = norm() if self.local_model is not None else None
        self.norm_attn = norm() if self.self_attn is not None else None
        self.norm_out = norm()
        self.ff = nn.Sequential(nn.Linear(dim, 2 * dim), activation(act),
                                nn.Dropout(dropout), nn.Linear(2 * dim, dim),
                                nn.Dropout(dropout))

    def forward(self, x: Tensor, edge_index, batch: Tensor,
                edge_attr: Optional[Tensor] = None, data: Any = None,
                mask: Optional[Tensor] = None) -> Tensor:
        """``data`` (the batch) and ``attn_impl`` select the global
        attention's path (backend dfgnn): varlen over the graph bounds,
        fused over ``data.attn_graph`` (when the batch has one); else the
        device loader's dense layout, or ``to_dense_batch``. ``mask`` marks
        the real nodes of a padded batch."""
        parts = []
        if self.local_model is not None:
            if self.local_takes_edges:
                h = self.local_model(x, edge_index, edge_attr)
            else:
                h = self.local_model(x, edge_index)
            h = F.dropout(h, self.dropout, self.training)
            parts.append(_norm(self.norm_local, x + h, mask))
        if self.self_attn is not None:
            impl = global_attn_impl(
                self.attn_impl, self.backend, x.device,
                torch.compiler.is_compiling(),
                self.self_attn.dropout if self.training else 0.0,
                self.self_attn.head_dim)
            attn_graph = getattr(data, 'attn_graph', None)
            if impl == 'varlen' and data is not None:
                h = varlen_attention(self.self_attn, x,
                                     *segment_bounds(data), self.training)
            elif impl == 'fused' and attn_graph is not None:
                h = fused_global_attention(self.self_attn, x, attn_graph,
                                           self.training)
            elif getattr(data, 'dense_index', None) is not None:
                h = padded_attention(self.self_attn, x, data)
            else:
                dense, real = to_dense_batch(x, batch)
                h = self.self_attn(dense, dense, dense,
                                   key_padding_mask=~real,
                                   need_weights=False)[0][real]
            h = F.dropout(h, self.dropout, self.training)
            parts.append(_norm(self.norm_attn, x + h, mask))
        h = parts[0] if len(parts) == 1 else parts[0] + parts[1]
        return _norm(self.norm_out, h + self.ff(h), mask)


#: ``torch.compile`` backend of ``train.compile_layers`` (the CPU tests trace
#: with ``'aot_eager'``: no code generation).
LAYER_COMPILE_BACKEND = 'inductor'
_compiled_layer_forward: Any = None


def compiled_layer_forward():
    """:meth:`GPSLayer.forward` through ``torch.compile`` (inductor's
    default mode, static shapes), one function for every layer: the layer
    is an argument, its parameters inputs of the graph (dynamo inlines
    built-in modules), so the ``gt.layers`` identical layers share one
    compilation per batch shape and mode."""
    global _compiled_layer_forward
    if _compiled_layer_forward is None:
        _compiled_layer_forward = torch.compile(
            GPSLayer.forward, backend=LAYER_COMPILE_BACKEND, dynamic=False)
    return _compiled_layer_forward


def _norm(norm: nn.Module, x: Tensor, mask: Optional[Tensor]) -> Tensor:
    return norm(x, mask) if isinstance(norm, MaskedBatchNorm1d) else norm(x)


class LapPENodeEncoder(nn.Module):
    """Laplacian eigenvector PE with a DeepSet over frequencies (GraphGPS's
    ``LapPE`` / ``DeepSet``): ``phi(eigvec, eigval)`` per frequency, summed,
    concatenated to the linearly embedded node features."""

    def __init__(self, dim_pe: int, layers: int, act: str):
        super().__init__()
        mods = [nn.Linear(2, dim_pe), activation(act)]
        for _ in range(layers - 1):
            mods += [nn.Linear(dim_pe, dim_pe), activation(act)]
        self.phi = nn.Sequential(*mods)

    def forward(self, eigvecs: Tensor, eigvals: Tensor) -> Tensor:
        if self.training:  # eigenvectors are defined up to their sign
            sign = torch.randint(0, 2, (1, eigvecs.size(1)),
                                 device=eigvecs.device) * 2 - 1
            eigvecs = eigvecs * sign
        pe = torch.stack([eigvecs, eigvals.squeeze(-1)], dim=-1)  # [N, F, 2]
        pad = torch.isnan(pe).any(dim=-1, keepdim=True)  # small graphs
        pe = self.phi(torch.nan_to_num(pe, nan=0.0))
        return pe.masked_fill(pad, 0.0).sum(dim=1)


class GPSModel(nn.Module):
    """Node encoder -> ``gt.layers`` GPS layers -> inductive node head.

    ``dim_edge`` / ``num_edge_types`` describe the data's ``edge_attr``
    (:func:`pyg_dfgnn.datasets.edge_attr_info`); the LinearEdge and
    TypeDictEdge encoders need them.
    """

    def __init__(self, cfg: Config, dim_in: int, dim_out: int,
                 num_node_types: Optional[int] = None,
                 dim_edge: Optional[int] = None,
                 num_edge_types: Optional[int] = None):
        super().__init__()
        dim = cfg.gt.dim_hidden
        local, glob = split_layer_type(cfg.gt.layer_type)
        self.local_name = local
        pe, rw = cfg.posenc_LapPE, cfg.posenc_RWSE
        dim_x = dim - (pe.dim_pe if pe.enable else 0) - (
            rw.dim_pe if rw.enable else 0)
        if num_node_types is not None:  # integer node types, e.g. ZINC atoms
            self.node_encoder = nn.Embedding(num_node_types, dim_x)
        else:
            self.node_encoder = nn.Linear(dim_in, dim_x)
        self.pe_encoder = (LapPENodeEncoder(pe.dim_pe, pe.layers, cfg.gnn.act)
                           if pe.enable else None)
        self.rwse_encoder = None
        if rw.enable:  # GraphGPS's RWSE 'Linear' model
            steps = len(rwse_times(rw.kernel.times_func))
            # momentum=None: the running stats average all batches. The
            # inputs are fixed data with tiny variance (~1e-6), so the usual
            # exponential average would keep a trace of its initial var = 1
            # for hundreds of steps and squash the PE in eval mode.
            self.rwse_encoder = nn.Sequential(
                MaskedBatchNorm1d(steps, momentum=None)
                if rw.raw_norm_type == 'BatchNorm' else nn.Identity(),
                nn.Linear(steps, rw.dim_pe))
        self.node_encoder_bn = (MaskedBatchNorm1d(dim)
                                if cfg.dataset.node_encoder_bn else None)
        ds = cfg.dataset
        self.edge_encoder_name = ds.edge_encoder_name if ds.edge_encoder \
            else 'DummyEdge'
        self.edge_encoder = build_edge_encoder(cfg, dim, dim_edge,
                                               num_edge_types)
        if self.edge_encoder is None and local == 'GINE':
            # No edge features: GINE gets a learned dummy edge embedding
            # (GraphGPS's DummyEdge encoder).
            self.edge_encoder = nn.Embedding(1, dim)
        self.edge_encoder_bn = (MaskedBatchNorm1d(dim) if ds.edge_encoder and
                                ds.edge_encoder_bn else None)
        # GAT-like layers find their self-loops in the data (added by
        # ToDFGNNFormat / AddSelfLoops before encoding): their edge features
        # are refilled from the encoded ones, as GATConv fills its own.
        self.refill_loops = local in SELF_LOOP_LAYERS
        # DF local convs take the batch's prebuilt format when it has one.
        self.local_takes_dfgraph = cfg.backend == 'dfgnn' and local in DF_CONVS
        # train.compile_layers: training runs the layers compiled (evaluation
        # eagerly: its unpadded batches would each be a new shape).
        self.compile_layers = bool(cfg.train.compile_layers)

        pre = []
        for _ in range(cfg.gnn.layers_pre_mp):
            pre += [nn.Linear(dim, dim), activation(cfg.gnn.act)]
        self.pre_mp = nn.Sequential(*pre)
        self.layers = nn.ModuleList([
            GPSLayer(dim, local, glob, cfg.gt.n_heads, cfg.backend,
                     cfg.gnn.act, cfg.gt.dropout, cfg.gt.attn_dropout,
                     cfg.gt.layer_norm, cfg.gt.batch_norm,
                     cfg.gt.local_attn_dropout, ds.edge_encoder,
                     cfg.gt.attn_impl)
            for _ in range(cfg.gt.layers)
        ])
        # The inductive node head as GraphGPS's config reads: (Linear-BN-
        # act-dropout) x L-1, Linear. (GraphGPS's code builds it with
        # graphgym's MLP, whose hidden layers take LayerConfig's defaults:
        # Linear-ReLU-L2 norm, no batch norm, no dropout.)
        head = []
        for _ in range(cfg.gnn.layers_post_mp - 1):
            head.append(nn.Linear(dim, dim))
            if cfg.gnn.batchnorm:
                head.append(MaskedBatchNorm1d(dim))
            head += [activation(cfg.gnn.act), nn.Dropout(cfg.gnn.dropout)]
        head.append(nn.Linear(dim, dim_out))
        self.head = nn.Sequential(*head)

    def forward(self, data) -> Tensor:
        """Node logits of a PyG ``Batch`` or a device loader's
        :class:`~pyg_dfgnn.train.batching.GraphBatch` (padding rows
        included; ``data.node_mask`` marks the real ones)."""
        mask = getattr(data, 'node_mask', None)
        x = data.x
        if isinstance(self.node_encoder, nn.Embedding):
            x = self.node_encoder(x.view(x.size(0), -1)[:, 0].long())
        else:
            x = self.node_encoder(x.float())
        if self.pe_encoder is not None:
            x = torch.cat([x, self.pe_encoder(data.EigVecs, data.EigVals)], 1)
        if self.rwse_encoder is not None:
            x = torch.cat([x, _apply(self.rwse_encoder, data.pestat_RWSE,
                                     mask)], 1)
        if self.node_encoder_bn is not None:
            x = self.node_encoder_bn(x, mask)
        edge_attr = self.encode_edges(data, x.size(0), mask)
        x = self.pre_mp(x)
        batch = data.batch
        if batch is None:
            batch = torch.zeros(x.size(0), dtype=torch.long, device=x.device)
        edge_index = data.edge_index
        graph = getattr(data, 'dfgraph', None)
        if graph is not None and self.local_takes_dfgraph:
            edge_index = graph
        compiled = self.compile_layers and self.training
        for i, layer in enumerate(self.layers):
            # The first layer runs eagerly: it fills what the batch's
            # graphs and the kernels cache lazily (graph structures, launch
            # plans, the kernels' load), so that every compiled call sees
            # one state -- a cache filled inside a compiled layer would fail
            # the next layer's guards (a second compilation per shape).
            run = compiled_layer_forward() if compiled and i > 0 else \
                GPSLayer.__call__
            x = run(layer, x, edge_index, batch, edge_attr, data, mask)
        return _apply(self.head, x, mask)

    def encode_edges(self, data, num_nodes: int,
                     mask: Optional[Tensor] = None) -> Optional[Tensor]:
        """The encoded edge features ``[E, dim]`` the local layers get, or
        ``None``. Self-loops of GAT-like layers get GATConv's
        ``fill_value='mean'`` of the *encoded* features of the node's other
        in-edges (0 without any), whatever the data holds for them: the
        transform's mean of raw type ids would mean nothing."""
        if self.edge_encoder is None:
            return None
        edge_index = data.edge_index
        if hasattr(edge_index, 'as_tensor'):  # EdgeIndex: plain tensor ops
            edge_index = edge_index.as_tensor()
        num_edges = edge_index.size(1)
        loop = None
        if self.refill_loops:
            loop = edge_index[0] == edge_index[1]
        if self.edge_encoder_name == 'DummyEdge':
            enc = self.edge_encoder(edge_index.new_zeros(num_edges))
        elif self.edge_encoder_name == 'TypeDictEdge':
            raw = data.edge_attr
            types = (raw if raw.dim() == 1 else raw[:, 0]).long()
            if loop is not None:  # keep the loops' ids valid (refilled)
                types = types.masked_fill(loop, 0)
            enc = self.edge_encoder(types)
        else:  # LinearEdge
            raw = data.edge_attr.reshape(num_edges, -1).float()
            if loop is not None:
                raw = raw.masked_fill(loop.unsqueeze(-1), 0.0)
            enc = self.edge_encoder(raw)
        if self.edge_encoder_bn is not None:
            # Batch statistics over the real edges only (no self-loops to
            # be refilled, no padding edges), without boolean indexing.
            real = None if mask is None else mask.index_select(
                0, edge_index[1])
            if loop is not None:
                real = ~loop if real is None else real & ~loop
            normed = self.edge_encoder_bn(enc, real)
            enc = normed if loop is None else torch.where(
                loop.unsqueeze(-1), enc, normed)
        if loop is not None:
            # Mean over real in-edges without a host sync (no boolean
            # indexing): masked sums and counts.
            dst = edge_index[1]
            real = (~loop).unsqueeze(-1).to(enc.dtype)
            total = enc.new_zeros(num_nodes, enc.size(1)).index_add_(
                0, dst, enc * real)
            count = enc.new_zeros(num_nodes, 1).index_add_(0, dst, real)
            fill = total / count.clamp(min=1)
            enc = torch.where(loop.unsqueeze(-1), fill[dst], enc)
        return enc


def build_edge_encoder(cfg: Config, dim: int, dim_edge: Optional[int],
                       num_edge_types: Optional[int]) -> Optional[nn.Module]:
    """GraphGPS's edge encoder named by ``dataset.edge_encoder_name`` (to
    ``dim``), or ``None`` when ``dataset.edge_encoder`` is off."""
    ds = cfg.dataset
    if not ds.edge_encoder:
        return None
    name = ds.edge_encoder_name
    if name == 'DummyEdge':
        return nn.Embedding(1, dim)
    if dim_edge is None:
        raise ConfigError(f"'dataset.edge_encoder_name' {name} needs edge "
                          f"features, but the dataset has no edge_attr (use "
                          f"DummyEdge, or 'dataset.sbm_edge_attr' for "
                          f"generated SBM graphs)")
    if name == 'LinearEdge':
        return nn.Linear(dim_edge, dim)
    num_types = ds.edge_encoder_num_types
    if num_types is None:
        if num_edge_types is None:
            raise ConfigError("'dataset.edge_encoder_name' TypeDictEdge needs "
                              "edge_attr holding non-negative integer types; "
                              "this dataset's are not (use LinearEdge)")
        num_types = num_edge_types
    elif num_edge_types is not None and num_types < num_edge_types:
        raise ConfigError(f"'dataset.edge_encoder_num_types' ({num_types}) "
                          f"is too small: the data has edge types up to "
                          f"{num_edge_types - 1}")
    return nn.Embedding(num_types, dim)


def build_model(cfg: Config, dim_in: int, dim_out: int,
                num_node_types: Optional[int] = None,
                dim_edge: Optional[int] = None,
                num_edge_types: Optional[int] = None) -> GPSModel:
    return GPSModel(cfg, dim_in, dim_out, num_node_types, dim_edge,
                    num_edge_types)

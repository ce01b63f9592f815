r"""GPS model (Rampasek et al., GraphGPS) with DF-GNN convs as local layers.

Each :class:`GPSLayer` computes, for node features :math:`X`:

.. math::
    X_L &= \mathrm{Norm}(X + \mathrm{Drop}(\mathrm{MPNN}(X, A)))

    X_G &= \mathrm{Norm}(X + \mathrm{Drop}(\mathrm{MHA}(X)))

    X' &= \mathrm{Norm}(H + \mathrm{FFN}(H)), \quad H = X_L + X_G

where the local MPNN is one of ``DFGAT``, ``DFGATv2``, ``DFTransformer``,
``DFAGNN`` (the fused DF-GNN convs), ``GINE``, ``GCN`` or ``None``, and the
global model is dense multi-head attention over the nodes of each graph
(``Transformer``) or ``None``.

``backend='pyg'`` builds every DF conv's PyG twin (``GATConv``, ...) with the
same constructor arguments; the twins hold the same parameters under the same
names, so the two backends are compared on one config and can load each
other's checkpoints.
"""
from __future__ import annotations

import importlib
from typing import Optional

import torch
import torch.nn.functional as F
from torch import Tensor, nn
from torch_geometric.utils import to_dense_batch

from pyg_dfgnn.train.config import Config, rwse_times, split_layer_type

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
                      act: str) -> Optional[nn.Module]:
    """The local message-passing layer ``dim -> dim``."""
    if local == 'None':
        return None
    if local in ('DFGAT', 'DFGATv2'):
        # Attention dropout stays 0: the fused kernels run without it.
        return conv_class(local, backend)(dim, dim // heads, heads=heads,
                                          add_self_loops=False)
    if local == 'DFTransformer':
        return conv_class(local, backend)(dim, dim // heads, heads=heads)
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


class GPSLayer(nn.Module):
    """One GPS layer: local MPNN + global attention + FFN (see module doc)."""

    def __init__(self, dim: int, local: str, glob: str, heads: int,
                 backend: str, act: str = 'relu', dropout: float = 0.0,
                 attn_dropout: float = 0.0, layer_norm: bool = False,
                 batch_norm: bool = True):
        super().__init__()
        self.local_name, self.global_name = local, glob
        self.dropout = dropout
        self.local_model = build_local_model(local, dim, heads, backend, act)
        self.self_attn = None
        if glob == 'Transformer':
            self.self_attn = nn.MultiheadAttention(
                dim, heads, dropout=attn_dropout, batch_first=True)

        def norm() -> nn.Module:
            if batch_norm:
                return nn.BatchNorm1d(dim)
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
                edge_attr: Optional[Tensor] = None) -> Tensor:
        parts = []
        if self.local_model is not None:
            if self.local_name == 'GINE':
                h = self.local_model(x, edge_index, edge_attr)
            else:
                h = self.local_model(x, edge_index)
            h = F.dropout(h, self.dropout, self.training)
            parts.append(self.norm_local(x + h))
        if self.self_attn is not None:
            dense, mask = to_dense_batch(x, batch)
            h = self.self_attn(dense, dense, dense, key_padding_mask=~mask,
                               need_weights=False)[0][mask]
            h = F.dropout(h, self.dropout, self.training)
            parts.append(self.norm_attn(x + h))
        h = parts[0] if len(parts) == 1 else parts[0] + parts[1]
        return self.norm_out(h + self.ff(h))


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
    """Node encoder -> ``gt.layers`` GPS layers -> inductive node head."""

    def __init__(self, cfg: Config, dim_in: int, dim_out: int,
                 num_node_types: Optional[int] = None):
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
                nn.BatchNorm1d(steps, momentum=None)
                if rw.raw_norm_type == 'BatchNorm' else nn.Identity(),
                nn.Linear(steps, rw.dim_pe))
        self.node_encoder_bn = (nn.BatchNorm1d(dim)
                                if cfg.dataset.node_encoder_bn else None)
        # PATTERN/CLUSTER have no edge features: GINE gets a learned dummy
        # edge embedding (GraphGPS's DummyEdge encoder).
        self.edge_encoder = nn.Embedding(1, dim) if local == 'GINE' else None

        pre = []
        for _ in range(cfg.gnn.layers_pre_mp):
            pre += [nn.Linear(dim, dim), activation(cfg.gnn.act)]
        self.pre_mp = nn.Sequential(*pre)
        self.layers = nn.ModuleList([
            GPSLayer(dim, local, glob, cfg.gt.n_heads, cfg.backend,
                     cfg.gnn.act, cfg.gt.dropout, cfg.gt.attn_dropout,
                     cfg.gt.layer_norm, cfg.gt.batch_norm)
            for _ in range(cfg.gt.layers)
        ])
        head = []  # GraphGPS's inductive node head: (Linear-BN-act) x L-1
        for _ in range(cfg.gnn.layers_post_mp - 1):
            head.append(nn.Linear(dim, dim))
            if cfg.gnn.batchnorm:
                head.append(nn.BatchNorm1d(dim))
            head += [activation(cfg.gnn.act), nn.Dropout(cfg.gnn.dropout)]
        head.append(nn.Linear(dim, dim_out))
        self.head = nn.Sequential(*head)

    def forward(self, data) -> Tensor:
        x = data.x
        if isinstance(self.node_encoder, nn.Embedding):
            x = self.node_encoder(x.view(x.size(0), -1)[:, 0].long())
        else:
            x = self.node_encoder(x.float())
        if self.pe_encoder is not None:
            x = torch.cat([x, self.pe_encoder(data.EigVecs, data.EigVals)], 1)
        if self.rwse_encoder is not None:
            x = torch.cat([x, self.rwse_encoder(data.pestat_RWSE)], 1)
        if self.node_encoder_bn is not None:
            x = self.node_encoder_bn(x)
        edge_attr = None
        if self.edge_encoder is not None:
            zeros = torch.zeros(data.edge_index.size(1), dtype=torch.long,
                                device=x.device)
            edge_attr = self.edge_encoder(zeros)
        x = self.pre_mp(x)
        batch = data.batch
        if batch is None:
            batch = torch.zeros(x.size(0), dtype=torch.long, device=x.device)
        for layer in self.layers:
            x = layer(x, data.edge_index, batch, edge_attr)
        return self.head(x)


def build_model(cfg: Config, dim_in: int, dim_out: int,
                num_node_types: Optional[int] = None) -> GPSModel:
    return GPSModel(cfg, dim_in, dim_out, num_node_types)

"""What the Reddit-size examples share: the models, the clear out-of-memory
error, a timer that syncs the GPU, JSON output."""
from __future__ import annotations

import json
import os
import os.path as osp
import sys
import time
from contextlib import contextmanager
from typing import Any, Dict, Iterator, List, Optional

import torch
import torch.nn.functional as F
from torch import Tensor

# The examples run from a checkout without installing the package.
sys.path.insert(0, osp.dirname(osp.dirname(osp.abspath(__file__))))

from pyg_dfgnn.sampler import hop_slices  # noqa: E402

GIB = 2**30


def conv_class(conv: str, backend: str):
    """The DF-GNN conv or its PyG twin."""
    if backend == 'dfgnn':
        from pyg_dfgnn.nn import DFGATConv, DFTransformerConv
        return {'gat': DFGATConv, 'transformer': DFTransformerConv}[conv]
    from torch_geometric.nn import GATConv, TransformerConv
    return {'gat': GATConv, 'transformer': TransformerConv}[conv]


class AttentionGNN(torch.nn.Module):
    r"""``layers`` attention convs (GAT or TransformerConv), ELU and dropout
    between them; hidden layers ``heads`` heads of ``hidden // heads``
    channels, concatenated; the last layer one head of ``out_dim``.

    :meth:`forward` runs the full graph; :meth:`forward_sampled` a
    ``NeighborLoader``-style batch, each layer on the bipartite graph of
    the hops it still needs (sources one hop further than destinations,
    PyG's ``trim_to_layer``), returning the seeds' outputs.
    """
    def __init__(self, conv: str, backend: str, in_dim: int, hidden: int,
                 out_dim: int, layers: int = 2, heads: int = 4,
                 dropout: float = 0.5) -> None:
        super().__init__()
        if hidden % heads:
            raise ValueError(f'hidden {hidden} must be divisible by heads '
                             f'{heads}')
        cls = conv_class(conv, backend)
        self.convs = torch.nn.ModuleList()
        for i in range(layers):
            last = i == layers - 1
            self.convs.append(cls(in_dim if i == 0 else hidden,
                                  out_dim if last else hidden // heads,
                                  heads=1 if last else heads))
        self.dropout = dropout

    def _act(self, x: Tensor, i: int) -> Tensor:
        if i == len(self.convs) - 1:
            return x
        return F.dropout(F.elu(x), self.dropout, self.training)

    def forward(self, x: Tensor, edge_index: Any) -> Tensor:
        for i, conv in enumerate(self.convs):
            x = self._act(conv(x, edge_index), i)
        return x

    def layer_edges(self, edge_index: Tensor, num_sampled_nodes: List[int],
                    num_sampled_edges: List[int]) -> List[Any]:
        """Per layer ``(edge_index prefix, num_src, num_dst)``. Pass the
        same list to :meth:`forward_sampled` after building formats from
        it (the convs' graph cache is keyed on these tensors)."""
        out = []
        for i in range(len(self.convs)):
            n_src, n_dst, n_e = hop_slices(num_sampled_nodes,
                                           num_sampled_edges, i,
                                           len(self.convs))
            out.append((edge_index[:, :n_e], n_src, n_dst))
        return out

    def forward_sampled(self, x: Tensor, layer_edges: List[Any]) -> Tensor:
        for i, (conv, (ei, n_src, n_dst)) in enumerate(
                zip(self.convs, layer_edges)):
            x = self._act(conv((x[:n_src], x[:n_dst]), ei), i)
        return x


def build_formats(model: torch.nn.Module, layer_edges: List[Any],
                  device: torch.device) -> None:
    """Builds (and caches) each layer's DF-GNN format ahead of the forward,
    so that its cost can be timed apart: CSR with the GAT self-loops, and
    the CSC the backward reads."""
    from pyg_dfgnn.nn import DFGATConv
    from pyg_dfgnn.nn.conv.utils import resolve_graph

    for conv, (ei, n_src, n_dst) in zip(model.convs, layer_edges):
        loops = min(n_src, n_dst) if isinstance(conv, DFGATConv) and \
            conv.add_self_loops else None
        graph = resolve_graph(ei, n_src, n_dst, device, loops).graph
        graph.csc()


def sync(device: torch.device) -> None:
    if device.type == 'cuda':
        torch.cuda.synchronize(device)


class Phases:
    """Wall time per named phase, the GPU synced at each boundary."""
    def __init__(self, device: torch.device) -> None:
        self.device = device
        self.seconds: Dict[str, float] = {}

    @contextmanager
    def __call__(self, name: str) -> Iterator[None]:
        sync(self.device)
        t = time.perf_counter()
        yield
        sync(self.device)
        self.seconds[name] = self.seconds.get(name, 0.0) + \
            time.perf_counter() - t


class OutOfMemory(RuntimeError):
    """Out of device memory, with what to change."""


@contextmanager
def memory_guard(what: str, device: torch.device,
                 advice: str) -> Iterator[None]:
    """Turns a CUDA out-of-memory error into one that says what ran, how
    much memory there was and what to change."""
    try:
        yield
    except torch.OutOfMemoryError as e:
        free, total = torch.cuda.mem_get_info(device)
        peak = torch.cuda.max_memory_allocated(device)
        first = str(e).split('\n')[0].split('. GPU')[0]
        raise OutOfMemory(
            f'{what}: out of GPU memory ({first}; peak {peak / GIB:.1f} GiB '
            f'allocated, {total / GIB:.1f} GiB on the device). {advice}'
        ) from None


def gpu_name(device: torch.device) -> str:
    return torch.cuda.get_device_name(device) if device.type == 'cuda' \
        else 'cpu'


def write_json(path: Optional[str], result: Dict[str, Any]) -> None:
    if not path:
        return
    os.makedirs(osp.dirname(osp.abspath(path)), exist_ok=True)
    with open(path, 'w') as f:
        json.dump(result, f, indent=2)
    print(f'results: {path}')

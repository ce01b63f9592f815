"""Uniform neighbour sampling in plain PyTorch, on the graph's device.

PyG's ``NeighborLoader`` samples with ``pyg-lib`` or ``torch-sparse`` on the
CPU. :class:`NeighborSampler` does the same sampling with tensor ops alone,
on whatever device the graph lives (a GPU-resident graph is sampled on the
GPU, no host round trip, no compiled extension). It is a
:class:`torch_geometric.sampler.BaseSampler`, so PyG's
:class:`~torch_geometric.loader.NodeLoader` takes it in place of its own
sampler, and :func:`neighbor_loader` builds that loader (sharded across
ranks under DDP).

Batches come out as ``NeighborLoader``'s do: seeds first, then the nodes of
hop 1, 2, ... (``num_sampled_nodes`` / ``num_sampled_edges`` per hop), edges
``edge_index[0]`` (sampled neighbour) -> ``edge_index[1]`` (node it was
sampled for), grouped by hop. Within a hop the edges run over their
destinations in order, and later hops have later destinations, so the
batch's ``edge_index`` is sorted by destination: the fused convs build their
CSR from it without a sort, for the whole subgraph or for a hop-trimmed
prefix (:func:`hop_slices`).
"""
from __future__ import annotations

from typing import Any, List, Optional, Sequence, Tuple

import torch
from torch import Tensor
from torch_geometric.sampler import (BaseSampler, NodeSamplerInput,
                                     SamplerOutput)

from pyg_dfgnn.graph import _check_index, _ptr


def _choose(deg: Tensor, k: int, generator: Optional[torch.Generator]
            ) -> Tensor:
    """``k`` distinct offsets in ``[0, deg_i)`` per row, uniformly: [R, k]
    (every ``deg_i > k``)."""
    dev = deg.device
    out = torch.empty(deg.numel(), k, dtype=torch.int64, device=dev)
    # Degrees up to 2k: k smallest of random keys over the whole row.
    small = deg <= 2 * k
    if bool(small.any()):
        d = deg[small]
        keys = torch.rand(d.numel(), 2 * k, device=dev, generator=generator)
        keys.masked_fill_(torch.arange(2 * k, device=dev) >= d[:, None], 2.0)
        out[small] = keys.topk(k, dim=1, largest=False).indices
    # Larger degrees: k draws with replacement, duplicates redrawn until
    # none is left (each draw collides with probability < 1/2). The rule
    # treats all offsets alike, so each k-subset is equally likely.
    big = (~small).nonzero().view(-1)
    if big.numel():
        d = deg[big].to(torch.float64)[:, None]
        draw = (torch.rand(big.numel(), k, device=dev, dtype=torch.float64,
                           generator=generator) * d).long()
        while True:
            draw = draw.sort(dim=1).values
            dup = torch.zeros_like(draw, dtype=torch.bool)
            dup[:, 1:] = draw[:, 1:] == draw[:, :-1]
            if not bool(dup.any()):
                break
            fresh = torch.rand(draw.shape, device=dev, dtype=torch.float64,
                               generator=generator) * d
            draw = torch.where(dup, fresh.long(), draw)
        out[big] = draw
    return out


class NeighborSampler(BaseSampler):
    r"""Uniform neighbour sampling without replacement, as PyG's
    ``NeighborSampler`` (homogeneous graphs, ``replace=False``,
    ``subgraph_type='directional'``), in tensor ops on the graph's device.

    Args:
        edge_index (torch.Tensor): ``[2, E]`` edges ``source -> target``;
            a node's neighbours are its sources (incoming edges), as in
            PyG.
        num_nodes (int): number of nodes.
        num_neighbors (list of int): neighbours per node for each hop
            (``-1``: all).
        generator (torch.Generator, optional): random source, on the
            graph's device.

    The graph is kept as CSC (pointer over targets, sorted sources); one
    int64 buffer of ``num_nodes`` entries maps global ids to batch ids.
    """
    def __init__(self, edge_index: Tensor, num_nodes: int,
                 num_neighbors: Sequence[int],
                 generator: Optional[torch.Generator] = None) -> None:
        dev = edge_index.device
        src, dst = edge_index[0], edge_index[1]
        # (the CSR pointer below is built without bounds checks)
        _check_index('edge_index', src, int(num_nodes), 'source')
        _check_index('edge_index', dst, int(num_nodes), 'destination')
        perm = None
        if dst.numel() > 1 and not bool((dst[1:] >= dst[:-1]).all()):
            dst, perm = torch.sort(dst, stable=True)
            src = src.index_select(0, perm)
        self.ptr = _ptr(dst, num_nodes)
        self.src = src.contiguous()
        self.perm = perm  # CSC position -> input edge id
        self.num_nodes = int(num_nodes)
        self.num_neighbors = [int(k) for k in num_neighbors]
        self.generator = generator
        self._local = torch.full((num_nodes, ), -1, dtype=torch.int64,
                                 device=dev)

    @property
    def device(self) -> torch.device:
        return self.ptr.device

    @property
    def edge_permutation(self) -> Optional[Tensor]:
        return None  # sample() already returns input edge ids

    def sample(self, seed: Tensor) -> SamplerOutput:
        """Samples the hops around ``seed`` (distinct global node ids)."""
        dev = self.device
        seed = seed.to(dev, torch.int64)
        local = self._local
        nodes, rows, cols, eids = [seed], [], [], []
        local[seed] = torch.arange(seed.numel(), device=dev)
        n_nodes, n_edges = [seed.numel()], []
        lo, hi = 0, seed.numel()
        try:
            for k in self.num_neighbors:
                frontier = torch.cat(nodes)[lo:hi] if len(nodes) > 1 \
                    else nodes[0][lo:hi]
                start = self.ptr[frontier]
                deg = self.ptr[frontier + 1] - start
                take = deg if k < 0 else deg.clamp_max(k)
                total = int(take.sum())
                dst = torch.repeat_interleave(
                    torch.arange(lo, hi, device=dev), take, output_size=total)
                row = dst - lo
                offset = torch.arange(total, device=dev) - \
                    (take.cumsum(0) - take)[row]
                if k >= 0:
                    sampled = (deg > k).nonzero().view(-1)
                    if sampled.numel():
                        chosen = _choose(deg[sampled], k, self.generator)
                        which = torch.full_like(deg, -1)
                        which[sampled] = torch.arange(sampled.numel(),
                                                      device=dev)
                        w = which[row]
                        hit = w >= 0
                        offset[hit] = chosen[w[hit], offset[hit]]
                eid = start[row] + offset
                nbr = self.src[eid].long()
                new = nbr[local[nbr] < 0].unique()
                local[new] = torch.arange(hi, hi + new.numel(), device=dev)
                nodes.append(new)
                rows.append(local[nbr])
                cols.append(dst)
                eids.append(eid if self.perm is None else self.perm[eid])
                n_nodes.append(new.numel())
                n_edges.append(total)
                lo, hi = hi, hi + new.numel()
            node = torch.cat(nodes)
        finally:
            local[torch.cat(nodes)] = -1
        empty = torch.empty(0, dtype=torch.int64, device=dev)
        return SamplerOutput(
            node=node, row=torch.cat(rows) if rows else empty,
            col=torch.cat(cols) if cols else empty,
            edge=torch.cat(eids) if eids else empty, batch=None,
            num_sampled_nodes=n_nodes, num_sampled_edges=n_edges)

    def sample_from_nodes(self, index: NodeSamplerInput,
                          **kwargs: Any) -> SamplerOutput:
        out = self.sample(index.node)
        out.metadata = (index.input_id, index.time)
        return out

    def sample_from_edges(self, index: Any, neg_sampling: Any = None):
        raise NotImplementedError(
            'pyg_dfgnn.sampler.NeighborSampler samples around nodes only '
            '(node-level tasks); use PyG\'s LinkNeighborLoader for links')


#: NeighborLoader options :func:`neighbor_loader` does not take.
UNSUPPORTED_OPTIONS = ('replace', 'disjoint', 'subgraph_type', 'time_attr',
                       'temporal_strategy', 'weight_attr', 'directed')


def neighbor_loader(data: Any, num_neighbors: Sequence[int],
                    input_nodes: Optional[Tensor], batch_size: int,
                    shuffle: bool = False, drop_last: bool = False,
                    seed: int = 0, rank: int = 0, world_size: int = 1,
                    pad: bool = True, **kwargs: Any):
    """A :class:`~torch_geometric.loader.NodeLoader` over ``data`` with a
    :class:`NeighborSampler` on ``data.edge_index``'s device.

    With ``world_size > 1`` every rank gets its own part of the seeds. With
    ``pad`` (training) a :class:`torch.utils.data.distributed.
    DistributedSampler` gives every rank the same number of batches,
    repeating a few seeds; call ``loader.sampler.set_epoch(e)`` for a new
    order each epoch, as with any distributed sampler. ``pad=False``
    (evaluation) gives each seed to exactly one rank, in order, so that
    counts summed over the ranks count every node once. ``shuffle`` draws
    the order from ``seed`` (and the epoch). DataLoader workers
    (``num_workers``) sample with generators seeded from their own seeds,
    which the loader draws anew every epoch. ``kwargs`` go to
    :class:`~torch_geometric.loader.NodeLoader` / ``DataLoader``.
    """
    from torch.utils.data.distributed import DistributedSampler
    from torch_geometric.data import Data
    from torch_geometric.loader import NodeLoader

    if not isinstance(data, Data):
        raise TypeError(f"neighbor_loader samples homogeneous graphs "
                        f"('Data'), got {type(data).__name__}")
    given = [key for key in UNSUPPORTED_OPTIONS if key in kwargs]
    if given:
        raise ValueError(f"neighbor_loader samples uniformly without "
                         f"replacement, directionally, without time: "
                         f"{given} are not supported (use torch_geometric's "
                         f"NeighborLoader for them)")
    # (each rank its own neighbours; the seed order below is shared)
    gen = torch.Generator(device=data.edge_index.device).manual_seed(
        seed + rank)
    sampler = NeighborSampler(data.edge_index, data.num_nodes, num_neighbors,
                              generator=gen)
    n_input = int(input_nodes.sum()) if input_nodes is not None and \
        input_nodes.dtype == torch.bool else (
            data.num_nodes if input_nodes is None else input_nodes.numel())
    if pad or world_size == 1:
        order: Any = DistributedSampler(
            range(n_input), num_replicas=world_size, rank=rank,
            shuffle=shuffle, seed=seed, drop_last=drop_last)
    else:
        order = range(rank, n_input, world_size)
    if kwargs.get('num_workers', 0) > 0:
        kwargs['worker_init_fn'] = _ReseedSampler(
            sampler, kwargs.get('worker_init_fn'))
    return NodeLoader(data, node_sampler=sampler, input_nodes=input_nodes,
                      batch_size=batch_size, sampler=order,
                      drop_last=drop_last, filter_per_worker=False, **kwargs)


class _ReseedSampler:
    """A DataLoader worker's ``worker_init_fn``: the worker's copy of the
    sampler draws from its worker seed (new every epoch, one per worker)
    instead of replaying the generator state it was copied with."""

    def __init__(self, sampler: 'NeighborSampler',
                 then: Optional[Any] = None) -> None:
        self.sampler, self.then = sampler, then

    def __call__(self, worker_id: int) -> None:
        if self.sampler.generator is not None:
            self.sampler.generator.manual_seed(torch.initial_seed())
        if self.then is not None:
            self.then(worker_id)


def hop_slices(num_sampled_nodes: List[int], num_sampled_edges: List[int],
               layer: int, num_layers: int) -> Tuple[int, int, int]:
    """``(num_src, num_dst, num_edges)`` that layer ``layer`` (0-based) of
    ``num_layers`` needs from a sampled batch: its outputs are the nodes
    that later layers still read, its inputs one hop further, its edges the
    hops between (a prefix of the batch's nodes and edges, PyG's
    ``trim_to_layer``). The last layer computes the seeds only."""
    hops = num_layers - layer
    num_dst = sum(num_sampled_nodes[:hops])
    num_src = sum(num_sampled_nodes[:hops + 1])
    num_edges = sum(num_sampled_edges[:hops])
    return num_src, num_dst, num_edges

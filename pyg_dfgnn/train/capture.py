r"""The training step as CUDA graphs (``torch.cuda.graphs``).

A step of the GPS models launches hundreds of small kernels; run eagerly,
the host issues them slower than the GPU runs them. Captured once per batch
shape and replayed, the whole step (forward, backward, clipping, optimizer,
metric update) costs one launch.

Shapes repeat because the device loader pads batches to a few fixed shapes
per split (:meth:`~pyg_dfgnn.train.batching.GraphStore.size_levels`: graph
slots fixed, the epoch's partial last batch included; nodes, edges and
attention edges padded together to one of 4 levels): one graph is captured
per ``(slots, nodes, edges, attention edges)`` shape. The first
batch of a bucket runs eagerly (the warm-up capture needs: lazily created
handles, optimizer state), the second is captured and replayed, later ones
are copied into the captured batch's tensors and replayed. The step itself
must be sync-free (:func:`~pyg_dfgnn.train.runner.train_step` is, with the
device loader's batches); the optimizer needs ``capturable=True`` and a
tensor learning rate so that the scheduler's changes reach the replays.
"""
from __future__ import annotations

from typing import Any, Callable, Dict, Tuple

import torch
from torch import Tensor

from pyg_dfgnn.graph import DFGraph
from pyg_dfgnn.train.batching import GraphBatch


def batch_key(batch: GraphBatch) -> Tuple[int, ...]:
    """What fixes a batch's tensor shapes (a padded batch's graph-level
    tensors have ``num_slots`` rows whatever its number of graphs)."""
    attn = getattr(batch, 'attn_graph', None)
    padded = getattr(batch, 'node_mask', None) is not None
    return (batch.num_slots if padded else batch.num_graphs, batch.num_nodes,
            batch.edge_index.size(1), -1 if attn is None else attn.num_edges)


def _graph_tensors(g: DFGraph) -> Tuple[Tensor, ...]:
    return (g.rowptr, g.col, *g.csc(), g.graph_windows[0])


def copy_batch(dst: GraphBatch, src: GraphBatch) -> None:
    """Copies ``src``'s tensors into ``dst``'s (same shapes) and its host
    attributes over ``dst``'s."""
    for key, value in src.__dict__.items():
        old = dst.__dict__.get(key)
        if isinstance(value, Tensor):
            old.copy_(value)
        elif isinstance(value, DFGraph):
            for a, b in zip(_graph_tensors(old), _graph_tensors(value)):
                a.copy_(b)
        else:
            dst.__dict__[key] = value


class CapturedStep:
    r"""``step(batch)`` replayed as one CUDA graph per batch shape.

    Args:
        step (callable): the training step, ``step(batch)``; sync-free.
        optimizer: the step's optimizer (its gradients are set to ``None``
            before a capture, so that the graph owns them).
        warmup (int): eager steps per shape before its capture.
    """

    def __init__(self, step: Callable[[Any], None], optimizer,
                 warmup: int = 1) -> None:
        self.step, self.optimizer, self.warmup = step, optimizer, warmup
        self.graphs: Dict[Tuple[int, ...], Tuple[Any, GraphBatch]] = {}
        self.seen: Dict[Tuple[int, ...], int] = {}
        self.replays = self.eager_steps = 0

    def __call__(self, batch: GraphBatch) -> None:
        key = batch_key(batch)
        entry = self.graphs.get(key)
        if entry is not None:
            graph, static = entry
            copy_batch(static, batch)
            graph.replay()
            self.replays += 1
            return
        stream = torch.cuda.Stream()
        stream.wait_stream(torch.cuda.current_stream())
        if self.seen.get(key, 0) < self.warmup:
            self.seen[key] = self.seen.get(key, 0) + 1
            with torch.cuda.stream(stream):  # on a side stream, as capture
                self.step(batch)
            torch.cuda.current_stream().wait_stream(stream)
            self.eager_steps += 1
            return
        self.optimizer.zero_grad(set_to_none=True)
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph, stream=stream):
            self.step(batch)
        self.graphs[key] = (graph, batch)  # its tensors are the inputs
        graph.replay()  # capturing did not run this batch's step
        self.replays += 1

r"""The training step captured: as CUDA graphs (``torch.cuda.graphs``,
:class:`CapturedStep`, ``train.capture: graphs``) or through
``torch.compile`` (:class:`CompiledStep`, ``train.capture: compile``).

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
are copied into the captured batch's tensors (a copy the step owns) and
replayed. The step itself
must be sync-free (:func:`~pyg_dfgnn.train.runner.train_step` is, with the
device loader's batches); the optimizer needs ``capturable=True`` and a
tensor learning rate so that the scheduler's changes reach the replays.

``torch.compile`` takes the same step and the same padded batches, and
fuses the step's many small kernels (the masked batch norms of padded
batches, losses, the optimizer update) besides; on CUDA its
``mode='reduce-overhead'`` replays the compiled graphs as CUDA graphs.

``train.compile_layers`` compiles the GPS layers only
(:func:`~pyg_dfgnn.train.model.compiled_layer_forward`: one compilation
for all layers, ~20 s instead of the whole step's minutes) and runs them
inside :class:`CapturedStep`'s CUDA graphs or eagerly.
"""
from __future__ import annotations

import copy
from typing import Any, Callable, Dict, Optional, Sequence, Tuple

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
    stage = () if g.stage_windows is None else (g.stage_windows[0], )
    return (g.rowptr, g.col, *g.csc(), g.graph_windows[0], *stage)


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


def _owned_copy(batch: GraphBatch) -> GraphBatch:
    """A deep copy of ``batch`` to copy later batches of its shape into:
    its graphs' CSC built (:func:`copy_batch` copies it) and nothing else
    of what their first use caches on them (those come per step, on
    :func:`_fresh_view` copies)."""
    owned = copy.deepcopy(batch)
    for value in owned.__dict__.values():
        if isinstance(value, DFGraph):
            value.csc()
            value._row = None
            for name in [k for k in value.__dict__ if k.startswith('_dfgnn')]:
                del value.__dict__[name]
    return owned


def _fresh_view(owned: GraphBatch) -> GraphBatch:
    """New batch and graph objects over ``owned``'s tensors: what a step
    caches on them stays with that step, as with a new batch from the
    loader (a reused object would fail dynamo's guards: a recompilation).
    The graphs' window caches stay shared: device batches bring their
    windows, so no step builds one."""
    view = copy.copy(owned)
    for key, value in owned.__dict__.items():
        if isinstance(value, DFGraph):
            view.__dict__[key] = copy.copy(value)
    return view


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

    @property
    def captures(self) -> int:
        """CUDA graphs captured so far (one per batch shape)."""
        return len(self.graphs)

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
        # The graph's inputs are a copy owned here: later batches of this
        # shape are copied into it, never into the caller's batch (a list
        # of batches replayed twice would otherwise change under it).
        static = copy.deepcopy(batch)
        self.optimizer.zero_grad(set_to_none=True)
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph, stream=stream):
            self.step(static)
        self.graphs[key] = (graph, static)
        graph.replay()  # capturing did not run this batch's step
        self.replays += 1


class CompiledStep:
    r"""``step(batch)`` through :func:`torch.compile`.

    The whole step function is compiled; dynamo splits it where it does not
    trace: ``optimizer.zero_grad`` (skipped by dynamo; it sets the
    gradients to ``None`` on the host), ``loss.backward()`` (run by the
    autograd engine, through the backward graph that AOTAutograd compiled
    with the forward) and ``optimizer.step()``, which breaks on entry and
    exit by design so that the update compiles as a no-grad graph of its
    own (torch's compiled optimizer). A step is thus three compiled graphs
    (forward, loss and metrics; clipping; the update) and the compiled
    backward. Batches are compiled per shape with ``dynamic=False``: the
    padded batches come in a few fixed shapes, each compiled once with
    static shapes (kernels specialised to them, one CUDA graph each as in
    :class:`CapturedStep`); a dynamic graph would still record one CUDA
    graph per shape, with shape-generic kernels.

    On CUDA the graphs run with ``mode='reduce-overhead'`` (CUDA graphs
    through cudagraph trees); the step must be sync-free as for
    :class:`CapturedStep`, and the optimizer capturable with a tensor
    learning rate (:func:`~pyg_dfgnn.train.runner.make_optimizer`). On the
    CPU inductor's default mode runs.

    With CUDA graphs the compiled step runs on batches it owns, one per
    shape (a deep copy of the first batch of the shape; later batches are
    copied into it), as :class:`CapturedStep` replays: the compiled
    backward keeps forward inputs (the graph format's index tensors, which
    the fused op's backward reads) among its inputs, and cudagraph trees
    take those as static -- a new address each step re-recorded both
    graphs every step (~370 ms per pattern-gps step on an H100 against
    ~25 ms compiled without CUDA graphs).

    The first ``warmup`` steps run eagerly: what is created lazily
    (optimizer state, the kernels' load, one-time notices) then exists
    before tracing instead of being traced once and recompiled.

    Constructing one resets dynamo (:func:`torch.compiler.reset`): the
    compiled code of earlier steps in the process (bench variants run one
    after another) would count against dynamo's recompilation limit of a
    function (8), past which it runs eagerly.

    Args:
        step (callable): the training step, ``step(batch)``; sync-free.
        device: where the step runs.
        static (sequence of Tensor): tensors the step updates in place that
            live across steps (the epoch's metric sums): marked static, so
            that CUDA graphs update them in place instead of skipping the
            graph that writes them.
        warmup (int): eager steps before the compiled ones.
        backend (str): ``torch.compile`` backend (``'inductor'``; the
            tests also trace with ``'aot_eager'``, which compiles nothing).
        cuda_graphs (bool): on CUDA with inductor, replay the graphs as
            CUDA graphs (``mode='reduce-overhead'``); ``False`` runs
            inductor's default mode (diagnostics: what the graphs cost).
        own_inputs (bool, optional): run on batches owned per shape (see
            above); default: where CUDA graphs run.
    """

    def __init__(self, step: Callable[[Any], None], device: Any,
                 static: Sequence[Tensor] = (), warmup: int = 1,
                 backend: str = 'inductor', cuda_graphs: bool = True,
                 own_inputs: Optional[bool] = None) -> None:
        from torch._dynamo.utils import counters
        torch.compiler.reset()
        for t in static:
            torch._dynamo.mark_static_address(t)
        self.step, self.warmup = step, warmup
        self.cuda_graphs = cuda_graphs and \
            torch.device(device).type == 'cuda' and backend == 'inductor'
        self.compiled = torch.compile(
            step, backend=backend, dynamic=False,
            mode='reduce-overhead' if self.cuda_graphs else None)
        self._stats = counters['stats']
        self._graphs_before = self._stats['unique_graphs']
        self.eager_steps = self.compiled_steps = 0
        self.own_inputs = self.cuda_graphs if own_inputs is None \
            else own_inputs
        self.inputs: Dict[Tuple[int, ...], GraphBatch] = {}

    @property
    def captures(self) -> int:
        """Graphs dynamo compiled since this step was made (each a
        compilation; new ones after the first epoch mean that its timing
        includes compile time)."""
        return self._stats['unique_graphs'] - self._graphs_before

    def __call__(self, batch: GraphBatch) -> None:
        if self.eager_steps < self.warmup:
            self.eager_steps += 1
            self.step(batch)
            return
        if self.own_inputs:
            key = batch_key(batch)
            owned = self.inputs.get(key)
            if owned is None:
                owned = self.inputs[key] = _owned_copy(batch)
            else:
                copy_batch(owned, batch)
            batch = _fresh_view(owned)
        if self.cuda_graphs:  # the previous step's outputs are done with
            torch.compiler.cudagraph_mark_step_begin()
        self.compiled(batch)
        self.compiled_steps += 1


#: The ``torch.compile`` backend of ``train.capture: compile`` (tests of
#: the runner's plumbing trace with ``'aot_eager'``: no code generation,
#: seconds instead of a minute of C++ builds on a small CPU).
COMPILE_BACKEND = 'inductor'


def wrap_step(mode: str, step: Callable[[Any], None], optimizer,
              device: Any, static: Sequence[Tensor] = ()) -> Callable:
    """``step`` as ``train.capture`` ``mode`` runs it: ``'graphs'`` (a
    :class:`CapturedStep`), ``'compile'`` (a :class:`CompiledStep`) or
    ``'none'`` (``step`` itself)."""
    if mode == 'graphs':
        return CapturedStep(step, optimizer)
    if mode == 'compile':
        return CompiledStep(step, device, static, backend=COMPILE_BACKEND)
    if mode == 'none':
        return step
    raise ValueError(f"unknown capture mode {mode!r}")

"""What the DF-GNN convs share: turning whatever adjacency the user passes
into a :class:`~pyg_dfgnn.DFGraph` (with PyG's self-loop handling), caching
that graph across calls and conv instances, moving edge features into CSR
order and attention weights back into the user's edge order.

The cache
---------
A user who only swaps ``GATConv`` for ``DFGATConv`` keeps passing the same
``edge_index`` tensor to every layer and every epoch. Building the CSR graph
(a sort, a range check that reads the indices on the host) each time would
cost more than the fused kernel saves, so :func:`resolve_graph` keeps one
:class:`EdgeStructure` per adjacency and configuration in a module-level,
size-bounded cache shared by all conv instances:

* keyed on the adjacency object (a weak reference: the entry dies with the
  tensor) and the configuration (node counts, self-loops);
* validated on every hit by the adjacency's fingerprint (storage pointer,
  shape, device and ``_version``), so an ``edge_index`` modified in place is
  rebuilt, never served stale. The check reads no tensor data: no host sync;
* tensors created in inference mode have no version counter: they are never
  cached (built on every call).
"""
from __future__ import annotations

import weakref
from collections import OrderedDict
from typing import Any, Dict, Optional, Tuple, Union

import torch
from torch import Tensor

from pyg_dfgnn.graph import DFGraph, _fingerprint, to_edge_index

MAX_CACHED_GRAPHS = 64

_cache: 'OrderedDict[Tuple, Tuple[Any, Tuple, EdgeStructure]]' = OrderedDict()
_stats: Dict[str, int] = {'builds': 0, 'hits': 0}


def graph_cache_info() -> Dict[str, int]:
    """``{'builds', 'hits', 'size'}`` of the shared graph cache."""
    return dict(_stats, size=len(_cache))


def clear_graph_cache() -> None:
    """Drop all cached graphs and reset the counters."""
    _cache.clear()
    _stats.update(builds=0, hits=0)


def is_sparse_tensor(adj: Any) -> bool:
    from torch_geometric.typing import SparseTensor
    return isinstance(adj, SparseTensor) and not isinstance(adj, Tensor)


def is_torch_sparse(adj: Any) -> bool:
    return isinstance(adj, Tensor) and adj.layout != torch.strided


def _is_inference(adj: Any) -> bool:
    if is_sparse_tensor(adj):
        return adj.storage.col().is_inference()
    return isinstance(adj, Tensor) and adj.is_inference()


def adjacency_device(adj: Any) -> torch.device:
    if isinstance(adj, DFGraph):
        return adj.device
    if is_sparse_tensor(adj):
        return adj.device()
    return adj.device


class EdgeStructure:
    r"""A graph as the convs run it, plus the maps between edge orders.

    Three edge orders exist: the *input* order (the user's edges), the
    *PyG* order (input edges without self-loops, then one loop per node, as
    :func:`~torch_geometric.utils.add_self_loops` appends them; equal to the
    input order when no loops are added) and the *CSR* order of
    :attr:`graph`.

    Attributes:
        graph (DFGraph): the graph the op runs on (CSR by destination).
        num_input_edges (int): edges of the user's adjacency.
        adj (any): the adjacency PyG's conv would hold after its self-loop
            handling (returned with attention weights); ``None`` when that is
            the user's own adjacency (not kept here, so the cache never keeps
            a user's tensor alive).
        attr_index (Tensor, optional): CSR edge -> row of ``[edge_attr;
            loop_attr]`` (``None``: identity).
        keep (Tensor, optional): input ids of the non-loop edges (when
            self-loops are added).
        kept_dst (Tensor, optional): their destinations (for ``fill_value``
            reductions).
        num_loops (int): self-loops appended (``-1``: none handled).
    """

    def __init__(self, graph: DFGraph, num_input_edges: int,
                 adj: Any = None, attr_index: Optional[Tensor] = None,
                 keep: Optional[Tensor] = None,
                 kept_dst: Optional[Tensor] = None, num_loops: int = -1,
                 kept_dst_in_range: bool = True) -> None:
        self.graph = graph
        self.num_input_edges = num_input_edges
        self.adj = adj
        self.attr_index = attr_index
        self.keep = keep
        self.kept_dst = kept_dst
        self.num_loops = num_loops
        self.kept_dst_in_range = kept_dst_in_range
        self._inv_perm: Optional[Tensor] = None
        self._edge_index: Optional[Tensor] = None

    # ------------------------------------------------------------ edge attrs
    def edge_attr(self, edge_attr: Tensor,
                  fill_value: Any = None) -> Tensor:
        """User-order ``edge_attr`` [E_in, D] -> CSR order [E, D], with the
        self-loops' features made from ``fill_value`` as PyG does."""
        if not isinstance(edge_attr, Tensor):
            raise TypeError(f"'edge_attr' must be a Tensor (got "
                            f"{type(edge_attr).__name__})")
        if not edge_attr.is_floating_point():
            raise TypeError(f"'edge_attr' must be floating point (got "
                            f"{edge_attr.dtype})")
        if edge_attr.device != self.graph.device:
            raise ValueError(f"'edge_attr' is on {edge_attr.device} but the "
                             f"graph is on {self.graph.device}")
        if edge_attr.dim() == 1:
            edge_attr = edge_attr.view(-1, 1)
        if edge_attr.dim() != 2 or edge_attr.size(0) != self.num_input_edges:
            raise ValueError(f"'edge_attr' must have shape "
                             f"[{self.num_input_edges}, edge_dim] (one row "
                             f"per edge; got {list(edge_attr.shape)})")
        if self.num_loops >= 0:
            edge_attr = torch.cat(
                [edge_attr, self._loop_attr(edge_attr, fill_value)], dim=0)
        if self.attr_index is not None:
            edge_attr = edge_attr.index_select(0, self.attr_index)
        return edge_attr

    def _loop_attr(self, edge_attr: Tensor, fill_value: Any) -> Tensor:
        # Same rule as torch_geometric.utils.add_self_loops.
        shape = (self.num_loops, ) + tuple(edge_attr.shape[1:])
        if fill_value is None:
            return edge_attr.new_ones(shape)
        if isinstance(fill_value, (int, float)):
            return edge_attr.new_full(shape, fill_value)
        if isinstance(fill_value, Tensor):
            loop_attr = fill_value.to(edge_attr.device, edge_attr.dtype)
            if loop_attr.dim() != edge_attr.dim():
                loop_attr = loop_attr.unsqueeze(0)
            return loop_attr.expand(shape)
        if isinstance(fill_value, str):
            from torch_geometric.utils import scatter
            if not self.kept_dst_in_range:
                raise ValueError(
                    f"'fill_value' = '{fill_value}' aggregates the features "
                    f"of the edges pointing to each node, but some edges "
                    f"point to destinations >= {self.num_loops} (the nodes "
                    f"that get self-loops); pass a float or Tensor "
                    f"'fill_value' for this bipartite graph")
            assert self.keep is not None and self.kept_dst is not None
            kept = edge_attr.index_select(0, self.keep)
            return scatter(kept, self.kept_dst, 0, self.num_loops,
                           reduce=fill_value)
        raise ValueError(f"'fill_value' must be a float, Tensor or str "
                         f"(got {type(fill_value).__name__})")

    # ------------------------------------------------------------- attention
    def to_user_order(self, alpha: Tensor) -> Tensor:
        """CSR-order alpha -> the order of :meth:`returned_adjacency`."""
        perm = self.graph.perm
        if perm is None:
            return alpha
        if self._inv_perm is None:
            perm = perm.to(torch.int64)
            self._inv_perm = torch.empty_like(perm).scatter_(
                0, perm, torch.arange(perm.numel(), device=perm.device))
        return alpha.index_select(0, self._inv_perm)

    def graph_edge_index(self) -> Tensor:
        """``[2, E]`` edge_index of a user-given DFGraph, in its input
        order."""
        if self._edge_index is None:
            g = self.graph
            ei = torch.stack([g.col.to(torch.int64), g.row], dim=0)
            if g.perm is not None:
                ei = ei[:, self.to_user_order(
                    torch.arange(g.num_edges, device=g.device))]
            self._edge_index = ei
        return self._edge_index


def _check_device(adj: Any, device: torch.device, name: str) -> None:
    adj_device = adjacency_device(adj)
    if adj_device != device:
        raise ValueError(f"'{name}' is on {adj_device} but the node features "
                         f"are on {device}")


def _build(adj: Any, num_src: int, num_dst: int, loops: Optional[int],
           name: str) -> EdgeStructure:
    """Build the structure; ``loops`` = number of self-loops to add (PyG:
    remove existing loops, append ``loops`` new ones), ``None``: keep the
    graph as it is."""
    from torch_geometric import EdgeIndex
    from torch_geometric.utils import add_self_loops, remove_self_loops

    size = (num_src, num_dst)
    if is_sparse_tensor(adj):
        n_in = adj.nnz()
        if loops is not None:
            from torch_geometric.typing import torch_sparse
            adj = torch_sparse.set_diag(adj)
        graph = DFGraph.from_edge_index(adj, size=size, name=name)
        return EdgeStructure(graph, n_in, adj if loops is not None else None,
                             _long(graph.perm))
    if is_torch_sparse(adj):
        n_in = adj._nnz()
        if loops is not None:
            adj = remove_self_loops(adj)[0]
            adj = add_self_loops(adj)[0]
        graph = DFGraph.from_edge_index(adj, size=size, name=name)
        return EdgeStructure(graph, n_in, adj if loops is not None else None,
                             _long(graph.perm))

    if not isinstance(adj, Tensor):
        raise TypeError(f"'{name}' must be a Tensor, EdgeIndex, SparseTensor, "
                        f"torch.sparse tensor or DFGraph (got "
                        f"{type(adj).__name__})")
    # Validates dtype, shape and an EdgeIndex's sparse_size.
    plain, _ = to_edge_index(adj, size, name)
    n_in = plain.size(1)
    if loops is None:
        graph = DFGraph.from_edge_index(adj, size=size, name=name)
        return EdgeStructure(graph, n_in, None, _long(graph.perm))

    keep = (plain[0] != plain[1]).nonzero().view(-1)
    kept_dst = plain[1].index_select(0, keep).to(torch.int64)
    in_range = kept_dst.numel() == 0 or bool(kept_dst.max() < loops)
    # The adjacency PyG's conv would hold (an EdgeIndex stays one):
    with_loops = add_self_loops(remove_self_loops(adj)[0], num_nodes=loops)[0]
    full = with_loops.as_tensor() if isinstance(with_loops, EdgeIndex) \
        else with_loops
    graph = DFGraph.from_edge_index(full, size=size, name=name)
    # PyG-order edge -> row of [edge_attr; loop_attr]:
    source_row = torch.cat([
        keep,
        torch.arange(n_in, n_in + loops, device=keep.device),
    ])
    if graph.perm is not None:
        source_row = source_row.index_select(0, graph.perm.to(torch.int64))
    return EdgeStructure(graph, n_in, with_loops, source_row, keep, kept_dst,
                         loops, in_range)


def _long(t: Optional[Tensor]) -> Optional[Tensor]:
    return None if t is None else t.to(torch.int64)


def _evict(key: Tuple) -> None:
    _cache.pop(key, None)


def resolve_graph(adj: Any, num_src: int, num_dst: int,
                  device: torch.device, loops: Optional[int] = None,
                  name: str = 'edge_index') -> EdgeStructure:
    r"""The :class:`EdgeStructure` of ``adj`` for ``num_src`` source and
    ``num_dst`` destination nodes, from the shared cache when possible.

    Args:
        adj: ``[2, E]`` Tensor, EdgeIndex, SparseTensor (``adj_t``),
            torch.sparse tensor (``adj_t``) or a prebuilt :class:`DFGraph`
            (used as it is: no self-loops are added or removed).
        num_src (int): source nodes (rows of ``x_src``).
        num_dst (int): destination nodes.
        device: where the node features are.
        loops (int, optional): add self-loops to the first ``loops`` nodes
            after removing existing ones (PyG's ``add_self_loops=True``).
        name (str): argument name for error messages.
    """
    if isinstance(adj, DFGraph):
        _check_device(adj, device, name)
        adj.check_sizes(num_src, num_dst)
        # Kept on the graph so the inverse permutation is built once
        # (DFGraph.to() copies attributes, hence the identity check).
        structure = getattr(adj, '_dfgnn_structure', None)
        if structure is None or structure.graph is not adj:
            structure = EdgeStructure(adj, adj.num_edges, None,
                                      _long(adj.perm))
            adj._dfgnn_structure = structure
        return structure
    if not isinstance(adj, Tensor) and not is_sparse_tensor(adj):
        raise TypeError(f"'{name}' must be a Tensor, EdgeIndex, SparseTensor, "
                        f"torch.sparse tensor or DFGraph (got "
                        f"{type(adj).__name__})")
    _check_device(adj, device, name)

    if _is_inference(adj):
        _stats['builds'] += 1
        with torch.inference_mode(False):
            return _build(_clone_adjacency(adj), num_src, num_dst, loops,
                          name)

    key = (id(adj), num_src, num_dst, loops)
    entry = _cache.get(key)
    if entry is not None:
        ref, fingerprint, structure = entry
        if ref() is adj and _fingerprint(adj) == fingerprint:
            _cache.move_to_end(key)
            _stats['hits'] += 1
            return structure
    structure = _build(adj, num_src, num_dst, loops, name)
    _stats['builds'] += 1
    # Fingerprint after the build: it may fill a SparseTensor's lazy fields.
    _cache[key] = (weakref.ref(adj, lambda _, key=key: _evict(key)),
                   _fingerprint(adj), structure)
    _cache.move_to_end(key)
    while len(_cache) > MAX_CACHED_GRAPHS:
        _cache.popitem(last=False)
    return structure


def _clone_adjacency(adj: Any) -> Any:
    """A normal-mode copy of an inference-mode adjacency (the DFGraph needs a
    version counter to track its source)."""
    return adj.clone()


def attention_weights(structure: EdgeStructure, adj: Any, alpha: Tensor,
                      sparse_values: bool = True) -> Any:
    r"""What the PyG conv returns for ``return_attention_weights``.

    Args:
        structure: the structure the forward ran on.
        adj: the user's adjacency.
        alpha (Tensor): attention weights [E, H] in CSR order.
        sparse_values (bool): torch.sparse input gives ``(adj with values
            alpha, alpha)`` (GAT, GATv2) instead of ``(adj, alpha)``
            (TransformerConv).
    """
    alpha = structure.to_user_order(alpha)
    held = structure.adj if structure.adj is not None else adj
    if isinstance(held, DFGraph):
        return structure.graph_edge_index(), alpha
    if is_sparse_tensor(held):
        return held.set_value(alpha, layout='coo')
    if is_torch_sparse(held) and sparse_values:
        from torch_geometric.utils.sparse import set_sparse_value
        return set_sparse_value(held, alpha), alpha
    return held, alpha


def split_node_features(
        x: Any, needs_target: bool = True) -> Tuple[Tensor, Optional[Tensor]]:
    """``x`` or ``(x_src, x_dst)`` -> checked ``(x_src, x_dst)``; a single
    tensor serves as both. ``x_dst`` may be ``None`` unless
    ``needs_target``."""
    if isinstance(x, Tensor):
        check_node_features('x', x)
        return x, x
    if not isinstance(x, (tuple, list)) or len(x) != 2:
        raise TypeError(f"'x' must be a Tensor or a pair (x_src, x_dst) of "
                        f"Tensors (got {type(x).__name__})")
    x_src, x_dst = x
    check_node_features('x[0]', x_src)
    if x_dst is None:
        if needs_target:
            raise ValueError("This conv needs target node features (got "
                             "x[1] = None)")
    else:
        check_node_features('x[1]', x_dst, x_src.device)
    return x_src, x_dst


def check_node_features(name: str, x: Any,
                        device: Optional[torch.device] = None) -> Tensor:
    """``x`` must be a 2-D floating-point tensor (on ``device``)."""
    if not isinstance(x, Tensor):
        raise TypeError(f"'{name}' must be a Tensor (got "
                        f"{type(x).__name__})")
    if not x.is_floating_point():
        raise TypeError(f"'{name}' must be floating point (got {x.dtype})")
    if x.dim() != 2:
        raise ValueError(f"'{name}' must have shape [num_nodes, channels] "
                         f"(got {list(x.shape)})")
    if device is not None and x.device != device:
        raise ValueError(f"'{name}' is on {x.device} but the source node "
                         f"features are on {device}")
    return x


def _adjacency_sizes(adj: Any) -> Tuple[Optional[int], Optional[int]]:
    """``(N_src, N_dst)`` an adjacency knows by itself (``None``: unknown)."""
    from torch_geometric import EdgeIndex
    if isinstance(adj, DFGraph):
        return adj.num_src, adj.num_dst
    if is_sparse_tensor(adj):
        return adj.size(1), adj.size(0)
    if is_torch_sparse(adj):
        return adj.size(1), adj.size(0)
    if isinstance(adj, EdgeIndex):
        return adj.sparse_size(0), adj.sparse_size(1)
    return None, None


def resolve_sizes(adj: Any, size: Any, num_src: int,
                  num_dst: Optional[int]) -> Tuple[int, int]:
    """``(N_src, N_dst)`` from the node features, PyG's ``size`` argument
    and the adjacency, as :class:`MessagePassing` infers them (``N_dst``
    falls back to ``N_src`` when nothing else gives it), with a clear error
    when they disagree."""
    if size is not None and (not isinstance(size, (tuple, list))
                             or len(size) != 2):
        raise ValueError(f"'size' must be a pair (num_src, num_dst) "
                         f"(got {size!r})")
    adj_src, adj_dst = _adjacency_sizes(adj)
    adj_name = ("the DFGraph passed as 'edge_index' (built for another "
                "graph?)" if isinstance(adj, DFGraph) else "'edge_index'")
    sources = [('the source node features', num_src),
               ("'size'", None if size is None else size[0]),
               (adj_name, adj_src)]
    targets = [('the target node features', num_dst),
               ("'size'", None if size is None else size[1]),
               (adj_name, adj_dst)]
    resolved = []
    for what, claims in (('source', sources), ('target', targets)):
        known = [(name, int(n)) for name, n in claims if n is not None]
        for name, n in known[1:]:
            if n != known[0][1]:
                raise ValueError(
                    f"Mismatch in the number of {what} nodes: "
                    f"{known[0][0]} give {known[0][1]}, {name} gives {n}")
        resolved.append(known[0][1] if known else None)
    if resolved[1] is None:
        resolved[1] = resolved[0]
    return resolved[0], resolved[1]


def check_sparse_self_loops(adj: Any, edge_dim: Optional[int],
                            edge_attr: Optional[Tensor]) -> None:
    """PyG cannot add self-loops with edge features to sparse adjacencies
    (SparseTensor: whenever ``edge_dim`` is set; torch.sparse: whenever
    ``edge_attr`` is given)."""
    if (is_sparse_tensor(adj) and edge_dim is not None) or (
            is_torch_sparse(adj) and edge_attr is not None):
        raise NotImplementedError(
            "The usage of 'edge_attr' and 'add_self_loops' simultaneously "
            "is not supported for a sparse 'edge_index' (SparseTensor or "
            "torch.sparse); add the self-loops beforehand and pass "
            "add_self_loops=False")


def check_message_passing_config(conv: Any) -> None:
    """The fused op does what ``aggr='add'`` with source-to-target flow
    does; other MessagePassing configurations are refused."""
    from torch_geometric.nn.aggr import SumAggregation
    if not isinstance(conv.aggr_module, SumAggregation):
        raise ValueError(f"'{conv.__class__.__name__}' only supports "
                         f"aggr='add' (got aggr={conv.aggr!r})")
    if conv.flow != 'source_to_target':
        raise ValueError(f"'{conv.__class__.__name__}' only supports "
                         f"flow='source_to_target' (got flow={conv.flow!r}); "
                         f"pass the flipped edge_index instead")


def check_not_explaining(conv: Any) -> None:
    if getattr(conv, '_explain', None):
        raise NotImplementedError(
            f"'{conv.__class__.__name__}' runs a fused kernel instead of "
            f"'propagate', so explainer edge masks cannot be applied; use "
            f"the torch_geometric conv for explanations")


Adjacency = Union[Tensor, DFGraph, Any]

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
  rebuilt, never served stale. The check reads no tensor data: no host sync
  (writes that bypass the version counter -- ``.data``, a shared NumPy
  array, DLPack -- are not seen: :func:`clear_graph_cache` after them);
* tensors created in inference mode have no version counter: they are never
  cached (built on every call, from a normal-mode copy);
* everything cached is made outside inference mode, so a graph first seen
  under ``torch.inference_mode()`` (evaluation) can be reused for training.
"""
from __future__ import annotations

import dataclasses
import warnings
import weakref
from collections import OrderedDict
from typing import Any, Callable, Dict, Optional, Tuple

import torch
from torch import Tensor
from torch_geometric import EdgeIndex
from torch_geometric.nn.aggr import SumAggregation
from torch_geometric.typing import SparseTensor, torch_sparse
from torch_geometric.utils import add_self_loops, remove_self_loops, scatter
from torch_geometric.utils.sparse import set_sparse_value

from pyg_dfgnn.graph import DFGraph, _fingerprint, to_edge_index
from pyg_dfgnn.ops.edge_attr import EdgeAttrMap

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
    :func:`~torch_geometric.utils.add_self_loops` appends them; the input
    order when no loops are added) and the *CSR* order of :attr:`graph`.

    Only the graph is built eagerly. What only some calls need (the
    self-looped adjacency returned with attention weights, the edge-feature
    maps) is built on first use from the user's adjacency, which the caller
    passes again (the cache guarantees it is the same, unmodified object),
    so that the cache holds no reference to it and little memory beyond the
    graph.

    Args:
        graph (DFGraph): the graph the op runs on (CSR by destination).
        num_input_edges (int): edges of the user's adjacency.
        loops (int, optional): self-loops appended to the first ``loops``
            nodes after removing existing ones (``None``: the user's edges
            as they are).
    """

    def __init__(self, graph: DFGraph, num_input_edges: int,
                 loops: Optional[int] = None) -> None:
        self.graph = graph
        self.num_input_edges = num_input_edges
        self.loops = loops
        self._held: Optional[Tuple[Any, Tuple]] = None
        self._keep: Optional[Tensor] = None
        self._kept_dst: Optional[Tuple[Tensor, bool]] = None
        self._attr_rows: Optional[Tensor] = None
        self._inv_perm: Optional[Tensor] = None
        self._maps: Dict[str, Tuple[Tensor, Tensor]] = {}
        self._emaps: Dict[str, EdgeAttrMap] = {}
        self._graph_edge_index: Optional[Tuple[Tensor, Any]] = None

    # ------------------------------------------------------------ edge attrs
    def edge_attr(self, adj: Any, edge_attr: Tensor, fill_value: Any = None,
                  project: Optional[Callable[[Tensor], Tensor]] = None
                  ) -> Tensor:
        """User-order ``edge_attr`` [E_in, D] -> CSR order [E, D], with the
        self-loops' features made from ``fill_value`` as PyG does.

        ``project`` (a linear map of rows without bias, [*, D] -> [*, D'])
        is applied on the way: before the 'mean' / 'add' fill (which
        commutes with it) and the reordering, so that both move D' columns
        instead of D (GAT's edge term: 8 heads instead of 16 features)."""
        if isinstance(edge_attr, Tensor) and edge_attr.dim() == 1:
            edge_attr = edge_attr.view(-1, 1)
        self._check_edge_attr(edge_attr)
        if self.loops is None:
            if project is not None:
                edge_attr = project(edge_attr)
            perm = self.graph.perm
            if perm is None:
                return edge_attr
            return _TakeRows.apply(edge_attr,
                                   *self._take_maps('perm', perm,
                                                    self.num_input_edges))
        if project is None:
            loop_attr = self._loop_attr(adj, edge_attr, fill_value)
        elif isinstance(fill_value, str) and fill_value in ('mean', 'add',
                                                            'sum'):
            edge_attr = project(edge_attr)
            loop_attr = self._loop_attr(adj, edge_attr, fill_value)
        else:  # constant or non-linear fill: fill first
            loop_attr = project(self._loop_attr(adj, edge_attr, fill_value))
            edge_attr = project(edge_attr)
        rows = torch.cat([edge_attr, loop_attr], dim=0)
        return _TakeRows.apply(rows, *self._take_maps(
            'attr', self._attr_index(adj), rows.size(0)))

    def edge_attr_map(self, adj: Any, edge_attr: Tensor,
                      fill_value: Any = None) -> Optional[EdgeAttrMap]:
        """How the graph's CSR edges read the user's ``edge_attr`` (for the
        raw edge attribute kernels, :mod:`pyg_dfgnn.ops.edge_attr`), the
        self-loops' features following ``fill_value`` as PyG does;
        ``None`` for fills those do not express ('min', 'max', 'mul', a
        fill tensor that requires grad): the caller then forms the rows
        with :meth:`edge_attr`."""
        self._check_edge_attr(edge_attr)
        fill_row: Optional[Tensor] = None
        if self.loops is None:
            fill = 'none'
        elif isinstance(fill_value, str):
            if fill_value not in ('mean', 'add', 'sum'):
                return None
            fill = 'mean' if fill_value == 'mean' else 'sum'
        else:
            fill = 'const'
            fill_row = _fill_row(fill_value, edge_attr)
            if fill_row is None:
                return None
        if fill not in self._emaps:
            self._emaps[fill] = self._build_edge_attr_map(adj, fill)
        emap = self._emaps[fill]
        if fill_row is not None:  # (the value may differ per call)
            emap = dataclasses.replace(emap, fill_row=fill_row)
        return emap

    @torch.compiler.disable
    def _build_edge_attr_map(self, adj: Any, fill: str) -> EdgeAttrMap:
        g = self.graph
        if fill == 'none':
            index = None if g.perm is None else self._take_maps(
                'perm', g.perm, self.num_input_edges)[0]
            return EdgeAttrMap(g.rowptr, index, g.num_edges,
                               self.num_input_edges)
        if fill != 'const':
            self._check_fill_in_range(adj, fill)
        index = self._take_maps('attr', self._attr_index(adj),
                                self.num_input_edges + self.loops)[0]
        unused_index = None  # the user's self-loops, replaced by the fill
        if self._keep_index(adj).numel() < self.num_input_edges:
            ei = _plain_edge_index(adj)
            with _cached_tensors():
                unused_index = (ei[0] == ei[1]).nonzero().view(-1)
        return EdgeAttrMap(g.rowptr, index, g.num_edges,
                           self.num_input_edges, fill, None, unused_index)

    def _check_edge_attr(self, edge_attr: Tensor) -> None:
        if not isinstance(edge_attr, Tensor):
            raise TypeError(f"'edge_attr' must be a Tensor (got "
                            f"{type(edge_attr).__name__})")
        if not edge_attr.is_floating_point():
            raise TypeError(f"'edge_attr' must be floating point (got "
                            f"{edge_attr.dtype})")
        if edge_attr.device != self.graph.device:
            raise ValueError(f"'edge_attr' is on {edge_attr.device} but the "
                             f"graph is on {self.graph.device}")
        if edge_attr.dim() != 2 or edge_attr.size(0) != self.num_input_edges:
            raise ValueError(f"'edge_attr' must have shape "
                             f"[{self.num_input_edges}, edge_dim] (one row "
                             f"per edge; got {list(edge_attr.shape)})")

    @torch.compiler.disable
    def _take_maps(self, name: str, index: Tensor,
                   n_src: int) -> Tuple[Tensor, Tensor]:
        """``(index, inverse)`` for :class:`_TakeRows` (built once)."""
        maps = self._maps
        if name not in maps:
            with _cached_tensors():
                index = index.to(torch.int64)
                inverse = torch.full((n_src, ), index.numel(),
                                     dtype=torch.int64, device=index.device)
                inverse[index] = torch.arange(index.numel(),
                                              device=index.device)
            maps[name] = (index, inverse)
        return maps[name]

    @torch.compiler.disable
    def _keep_index(self, adj: Any) -> Tensor:
        """Input ids of the edges that are no self-loops."""
        if self._keep is None:
            ei = _plain_edge_index(adj)
            with _cached_tensors():
                self._keep = (ei[0] != ei[1]).nonzero().view(-1)
        return self._keep

    @torch.compiler.disable
    def _attr_index(self, adj: Any) -> Tensor:
        """CSR edge -> row of ``[edge_attr; loop_attr]``."""
        if self._attr_rows is None:
            keep = self._keep_index(adj)
            n_in, loops = self.num_input_edges, self.loops
            assert loops is not None
            with _cached_tensors():
                rows = torch.cat([  # in PyG order
                    keep,
                    torch.arange(n_in, n_in + loops, device=keep.device)
                ])
            perm = self.graph.perm
            with _cached_tensors():
                self._attr_rows = rows if perm is None else \
                    rows.index_select(0, perm)
        return self._attr_rows

    def _loop_attr(self, adj: Any, edge_attr: Tensor,
                   fill_value: Any) -> Tensor:
        # Same rule as torch_geometric.utils.add_self_loops.
        assert self.loops is not None
        shape = (self.loops, ) + tuple(edge_attr.shape[1:])
        if fill_value is None:
            return edge_attr.new_ones(shape)
        if isinstance(fill_value, (int, float)):
            return edge_attr.new_full(shape, fill_value)
        if isinstance(fill_value, Tensor):
            loop_attr = fill_value.to(edge_attr.device, edge_attr.dtype)
            if loop_attr.dim() != edge_attr.dim():
                loop_attr = loop_attr.unsqueeze(0)
            return loop_attr.expand(shape)
        if not isinstance(fill_value, str):
            raise ValueError(f"'fill_value' must be a float, Tensor or str "
                             f"(got {type(fill_value).__name__})")
        keep = self._keep_index(adj)
        self._check_fill_in_range(adj, fill_value)
        kept_dst, _ = self._kept_destinations(adj)
        if fill_value in ('mean', 'add', 'sum') and edge_attr.dtype in (
                torch.float32, torch.float64) and edge_attr.dim() == 2:
            # A sparse [loops, E_in] averaging (summing) matrix: one SpMM
            # each way. PyTorch's row gathers -- index_select over the
            # kept edges, scatter_add's backward -- took 2.7 ms each for a
            # [4.5M, 16] edge_attr on an H100 (scripts/profile_features.py).
            a, a_t = self._fill_matrix(adj, fill_value, edge_attr.dtype)
            return _SpMM.apply(edge_attr, a, a_t)
        kept_attr = edge_attr if keep.numel() == edge_attr.size(0) else \
            edge_attr.index_select(0, keep)  # (no input self-loops: all)
        return scatter(kept_attr, kept_dst, 0, self.loops, reduce=fill_value)

    @torch.compiler.disable
    def _fill_matrix(self, adj: Any, fill_value: str,
                     dtype: torch.dtype) -> Tuple[Tensor, Tensor]:
        """[loops, E_in] CSR: 1 / in-degree ('mean') or 1 ('add') at each
        kept edge into a node, so that ``A @ edge_attr`` is the loops'
        fill, and its transpose (for the backward; PyTorch would convert
        ``A`` on every call: 1.3 ms of a 2.1 ms backward at 4.5M edges);
        built once per structure, reduction and dtype (1 / in-degree
        rounded once, to ``dtype``)."""
        maps = self._maps
        key = 'fill-' + ('mean' if fill_value == 'mean' else 'add') + \
            str(dtype)
        if key not in maps:
            keep = self._keep_index(adj)
            kept_dst, _ = self._kept_destinations(adj)
            with _cached_tensors():
                dst, order = torch.sort(kept_dst, stable=True)
                cols = keep.index_select(0, order)
                count = torch.bincount(dst, minlength=self.loops)
                ptr = torch.cat([count.new_zeros(1), count.cumsum(0)])
                val = torch.ones(cols.numel(), dtype=torch.float64,
                                 device=cols.device)
                if fill_value == 'mean':
                    val = val / count.clamp(min=1).index_select(0, dst)
                val = val.to(dtype)
                # transpose: one entry per kept edge, by input edge id
                by_edge = torch.argsort(cols)
                ptr_t = torch.zeros(self.num_input_edges + 1,
                                    dtype=torch.int64, device=cols.device)
                ptr_t[1:].index_fill_(0, keep, 1)
                ptr_t = ptr_t.cumsum(0)
                with warnings.catch_warnings():  # (CSR support is "beta")
                    warnings.simplefilter('ignore')
                    a = torch.sparse_csr_tensor(
                        ptr, cols, val, (self.loops, self.num_input_edges))
                    a_t = torch.sparse_csr_tensor(
                        ptr_t, dst.index_select(0, by_edge),
                        val.index_select(0, by_edge),
                        (self.num_input_edges, self.loops))
            maps[key] = (a, a_t)
        return maps[key]

    def _check_fill_in_range(self, adj: Any, fill_value: str) -> None:
        """An aggregating fill needs every kept edge to point to a node
        that gets a self-loop."""
        if not self._kept_destinations(adj)[1]:
            raise ValueError(
                f"'fill_value' = '{fill_value}' aggregates the features of "
                f"the edges pointing to each node, but some edges point to "
                f"destinations >= {self.loops} (the nodes that get "
                f"self-loops); pass a float or Tensor 'fill_value' for this "
                f"bipartite graph")

    @torch.compiler.disable
    def _kept_destinations(self, adj: Any) -> Tuple[Tensor, bool]:
        """Destinations of the kept edges (int64, for the fill reduction)
        and whether all of them get a self-loop."""
        if self._kept_dst is None:
            keep = self._keep_index(adj)
            with _cached_tensors():
                kept_dst = _plain_edge_index(adj)[1].index_select(0, keep)
                kept_dst = kept_dst.to(torch.int64)
            in_range = kept_dst.numel() == 0 or bool(
                kept_dst.max() < self.loops)
            self._kept_dst = (kept_dst, in_range)
        return self._kept_dst

    # ------------------------------------------------------------- attention
    def to_user_order(self, alpha: Tensor) -> Tensor:
        """CSR-order alpha -> PyG order."""
        if self.graph.perm is None:
            return alpha
        return alpha.index_select(0, self._inverse_perm())

    @torch.compiler.disable
    def _inverse_perm(self) -> Tensor:
        if self._inv_perm is None:
            perm = self.graph.perm
            assert perm is not None
            with _cached_tensors():
                arange = torch.arange(perm.numel(), device=perm.device)
                self._inv_perm = torch.empty_like(perm).scatter_(
                    0, perm.to(torch.int64), arange.to(perm.dtype))
        return self._inv_perm

    @torch.compiler.disable
    def returned_adjacency(self, adj: Any) -> Any:
        """The adjacency PyG's conv holds after its self-loop handling (what
        it returns with attention weights); a DFGraph's edge_index."""
        if isinstance(adj, DFGraph):
            # Rebuilt if the user modified a returned one in place.
            held = self._graph_edge_index
            if held is None or _version_of(held[0]) != held[1]:
                g = self.graph
                with _cached_tensors():
                    ei = torch.stack([g.col.to(torch.int64), g.row], dim=0)
                    ei = ei.index_select(1, self.to_user_order(torch.arange(
                        g.num_edges, device=g.device)))
                self._graph_edge_index = (ei, _version_of(ei))
            return self._graph_edge_index[0]
        if self.loops is None:
            return adj
        # Rebuilt if the user modified a returned one in place.
        if self._held is None or _version_of(self._held[0]) != \
                self._held[1]:
            with _cached_tensors():
                held = with_self_loops(adj, self.loops)
            self._held = (held, _version_of(held))
        return self._held[0]


def _fill_row(fill_value: Any, edge_attr: Tensor) -> Optional[Tensor]:
    """The self-loops' row [D_e] of a constant ``fill_value`` (PyG: ``None``
    is 1), ``None`` when it is no constant row (a tensor of another size or
    one that requires grad)."""
    dim = edge_attr.size(1)
    if fill_value is None:
        return edge_attr.new_ones(dim)
    if isinstance(fill_value, (int, float)):
        return edge_attr.new_full((dim, ), fill_value)
    if isinstance(fill_value, Tensor) and not fill_value.requires_grad and \
            fill_value.numel() == dim:
        return fill_value.to(edge_attr.device, edge_attr.dtype).reshape(dim)
    return None


class _TakeRows(torch.autograd.Function):
    r"""``src[index]`` for a one-to-one ``index`` (an edge permutation,
    possibly skipping rows), as two row *scatters*: forward by ``inverse``
    (``inverse[index[i]] = i``, unused rows to a spare row), backward by
    ``index``. PyTorch's row gather (``index_select``) is several times
    slower than its row scatter on narrow rows: 2.7 vs 0.6 ms for a
    [4.5M, 16] fp32 edge_attr on an H100 (scripts/profile_features.py)."""
    @staticmethod
    def forward(ctx, src: Tensor, index: Tensor, inverse: Tensor) -> Tensor:
        n = index.numel()
        out = src.new_empty((n + 1, ) + tuple(src.shape[1:]))
        out.index_copy_(0, inverse, src)
        ctx.save_for_backward(index)
        ctx.n_src = src.size(0)
        return out[:n]

    @staticmethod
    def backward(ctx, grad: Tensor):
        index, = ctx.saved_tensors
        out = grad.new_zeros((ctx.n_src, ) + tuple(grad.shape[1:]))
        return out.index_copy_(0, index, grad), None, None


class _SpMM(torch.autograd.Function):
    r"""``a @ x`` for a constant sparse CSR ``a`` whose transpose ``a_t``
    is cached: the backward is one SpMM, no per-call conversion.
    (cuSPARSE has no bf16 SpMM backward: no autocast here.)"""
    @staticmethod
    def forward(ctx, x: Tensor, a: Tensor, a_t: Tensor) -> Tensor:
        ctx.a_t = a_t
        with torch.autocast(x.device.type, enabled=False):
            return torch.sparse.mm(a.to(x.dtype), x)

    @staticmethod
    def backward(ctx, grad: Tensor):
        a_t = ctx.a_t
        with torch.autocast(grad.device.type, enabled=False):
            return torch.sparse.mm(a_t.to(grad.dtype),
                                   grad.contiguous()), None, None


def _cached_tensors():
    """Context for making tensors that are cached: never inference tensors,
    so a graph first used under ``torch.inference_mode()`` can later be
    used for training."""
    return torch.inference_mode(False)


def _version_of(adj: Any) -> Optional[Tuple]:
    """The adjacency's fingerprint; ``None`` for inference tensors (no
    version counter; such structures are never cached)."""
    return None if _is_inference(adj) else _fingerprint(adj)


def _plain_edge_index(adj: Any) -> Tensor:
    assert isinstance(adj, Tensor) and adj.layout == torch.strided
    return adj.as_tensor() if isinstance(adj, EdgeIndex) else adj


def with_self_loops(adj: Any, loops: int) -> Any:
    """PyG's self-loop handling of the convs: remove existing loops, add one
    to each of the first ``loops`` nodes (a SparseTensor: ``set_diag``)."""
    if is_sparse_tensor(adj):
        return torch_sparse.set_diag(adj)
    if is_torch_sparse(adj):  # loops on the diagonal of the matrix
        return add_self_loops(remove_self_loops(adj)[0])[0]
    if isinstance(adj, EdgeIndex):  # PyG keeps it an EdgeIndex
        return add_self_loops(remove_self_loops(adj)[0], num_nodes=loops)[0]
    # Same result as PyG's, without its boolean-mask indexing (two orders
    # of magnitude slower than index_select on CPU).
    keep = (adj[0] != adj[1]).nonzero().view(-1)
    loop = torch.arange(loops, device=adj.device).view(1, -1).repeat(2, 1)
    return torch.cat([adj.index_select(1, keep), loop], dim=1)


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

    size = (num_src, num_dst)
    if is_sparse_tensor(adj):
        num_edges = adj.nnz()
    elif is_torch_sparse(adj):
        num_edges = adj._nnz()
    else:
        # Validates dtype, shape and an EdgeIndex's sparse_size first.
        num_edges = to_edge_index(adj, size, name)[0].size(1)
    source = adj
    if loops is not None:
        source = with_self_loops(adj, loops)
        if isinstance(source, EdgeIndex):
            source = source.as_tensor()
    graph = DFGraph.from_edge_index(source, size=size, name=name)
    return EdgeStructure(graph, num_edges, loops)


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
    # Outside torch.compile the cache is called directly: the
    # torch.compiler.disable wrapper costs microseconds per call.
    if torch.compiler.is_compiling():
        if isinstance(adj, DFGraph):
            # No cache to consult: traced, so that a compiled model with
            # the batch's prebuilt graph has no graph break per conv.
            return _dfgraph_structure(adj, num_src, num_dst, device, name)
        return _resolve_graph_untraced(adj, num_src, num_dst, device, loops,
                                       name)
    return _resolve_graph(adj, num_src, num_dst, device, loops, name)


def _dfgraph_structure(adj: DFGraph, num_src: int, num_dst: int,
                       device: torch.device, name: str) -> EdgeStructure:
    _check_device(adj, device, name)
    adj.check_sizes(num_src, num_dst)
    # Kept on the graph so the inverse permutation is built once
    # (DFGraph.to() copies attributes, hence the identity check).
    structure = getattr(adj, '_dfgnn_structure', None)
    if structure is None or structure.graph is not adj:
        structure = EdgeStructure(adj, adj.num_edges)
        adj._dfgnn_structure = structure
    return structure


def _resolve_graph(adj: Any, num_src: int, num_dst: int,
                   device: torch.device, loops: Optional[int],
                   name: str) -> EdgeStructure:
    if isinstance(adj, DFGraph):
        return _dfgraph_structure(adj, num_src, num_dst, device, name)
    if not isinstance(adj, Tensor) and not is_sparse_tensor(adj):
        raise TypeError(f"'{name}' must be a Tensor, EdgeIndex, SparseTensor, "
                        f"torch.sparse tensor or DFGraph (got "
                        f"{type(adj).__name__})")
    _check_device(adj, device, name)

    if _is_inference(adj):
        _stats['builds'] += 1
        with _cached_tensors():
            return _build(adj.clone(), num_src, num_dst, loops, name)

    key = (id(adj), num_src, num_dst, loops)
    entry = _cache.get(key)
    if entry is not None:
        ref, fingerprint, structure = entry
        if ref() is adj and _fingerprint(adj) == fingerprint:
            _cache.move_to_end(key)
            _stats['hits'] += 1
            return structure
    with _cached_tensors():
        structure = _build(adj, num_src, num_dst, loops, name)
    _stats['builds'] += 1
    # Fingerprint after the build: it may fill a SparseTensor's lazy fields.
    _cache[key] = (weakref.ref(adj, lambda _, key=key: _evict(key)),
                   _fingerprint(adj), structure)
    _cache.move_to_end(key)
    while len(_cache) > MAX_CACHED_GRAPHS:
        _cache.popitem(last=False)
    return structure


# Python-side cache: never traced (a graph break under torch.compile).
_resolve_graph_untraced = torch.compiler.disable(_resolve_graph)


def attention_weights(structure: EdgeStructure, adj: Any, alpha: Tensor,
                      sparse_values: bool = True) -> Any:
    r"""What the PyG conv returns for ``return_attention_weights``.

    Args:
        structure: the structure the forward ran on.
        adj: the user's adjacency.
        alpha (Tensor): attention weights [E, H] in PyG's edge order (the
            fused op writes them there given ``attention_perm=
            structure.graph.perm``).
        sparse_values (bool): torch.sparse input gives ``(adj with values
            alpha, alpha)`` (GAT, GATv2) instead of ``(adj, alpha)``
            (TransformerConv).
    """
    held = structure.returned_adjacency(adj)
    if is_sparse_tensor(held):
        return held.set_value(alpha, layout='coo')
    if is_torch_sparse(held) and sparse_values:
        if held.layout == torch.sparse_coo and not held.is_coalesced():
            # set_sparse_value reads indices(), which needs a coalesced COO
            return torch.sparse_coo_tensor(
                held._indices(), alpha, held.shape[:2] + alpha.shape[1:],
                is_coalesced=False), alpha
        return set_sparse_value(held, alpha), alpha
    return held, alpha


def autocast_dtype(t: Tensor) -> Optional[torch.dtype]:
    """Autocast's dtype where autocast is on for ``t``'s device, else
    ``None``."""
    device_type = t.device.type
    if torch.is_autocast_enabled(device_type):
        return torch.get_autocast_dtype(device_type)
    return None


def op_dtype(*tensors: Optional[Tensor]) -> torch.dtype:
    """The dtype the fused op runs in: autocast's where autocast is on for
    the tensors' device (the projections then come out in it while the
    attention parameters stay fp32), else the promoted dtype of all."""
    first = tensors[0]
    assert first is not None
    dtype = autocast_dtype(first)
    if dtype is not None:
        return dtype
    dtype = first.dtype
    for t in tensors[1:]:
        if t is not None:
            dtype = torch.promote_types(dtype, t.dtype)
    return dtype


def cast(dtype: torch.dtype, *tensors: Optional[Tensor]) -> Tuple:
    # t.to(dtype) returns t itself when the dtype matches; reading t.dtype
    # first skips its (microsecond) call in that common case.
    return tuple(t if t is None or t.dtype == dtype else t.to(dtype)
                 for t in tensors)


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


def adjacency_edge_attr(adj: Any) -> Optional[Tensor]:
    """The edge features a sparse adjacency carries as its values, which
    PyG's convs use when no ``edge_attr`` is passed (``T.ToSparseTensor``
    stores ``edge_attr`` there); 1-D values are edge weights, not features
    (``None``)."""
    if is_sparse_tensor(adj):
        value = adj.storage.value()
    elif is_torch_sparse(adj):  # values() refuses an uncoalesced COO
        value = adj._values() if adj.layout == torch.sparse_coo and \
            not adj.is_coalesced() else adj.values()
    else:
        return None
    return value if value is not None and value.dim() > 1 else None


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
    if not isinstance(conv.aggr_module, SumAggregation):
        raise ValueError(f"'{conv.__class__.__name__}' only supports "
                         f"aggr='add' (got aggr={conv.aggr!r})")
    if conv.flow != 'source_to_target':
        raise ValueError(f"'{conv.__class__.__name__}' only supports "
                         f"flow='source_to_target' (got flow={conv.flow!r}); "
                         f"pass the flipped edge_index instead")

"""DFGraph: the sparse format the fused kernels run on.

Edges ``j -> i`` (``edge_index[0] = j`` is the source, ``edge_index[1] = i``
the destination that aggregates, PyG's ``flow='source_to_target'``) are stored

* as CSR by destination: ``rowptr`` [N_dst + 1] (int64) and ``col`` [E]
  (source ids), the layout of the forward and of dQ;
* as CSC by source (built on first use, for dK / dV in the backward):
  ``colptr`` [N_src + 1], ``csc_row`` [E] (destination ids) and ``csc_perm``
  [E] (CSC position -> CSR edge id), so per-edge inputs in CSR order can be
  read without atomics;
* with ``perm`` [E] (CSR edge id -> input edge id, ``None`` if the input was
  already sorted by destination) to move edge attributes into CSR order and
  attention weights back;
* with degree statistics (``in_degree``, ``max_in_degree``) that the SMMF / PMF
  rule in :mod:`pyg_dfgnn.dispatch` reads.

Edge-sized index arrays are int32 while ``N`` and ``E`` fit (half the bytes per
edge for the kernels), int64 otherwise.
"""
from __future__ import annotations

import weakref
from contextlib import contextmanager
from typing import Any, Dict, Iterator, Optional, Tuple

import torch
from torch import Tensor

from pyg_dfgnn.dispatch import choose_strategy

_INT32_MAX = 2**31 - 1


def _index_dtype(*sizes: int) -> torch.dtype:
    return torch.int32 if max(sizes, default=0) <= _INT32_MAX else torch.int64


def _fingerprint(t: Any) -> Optional[Tuple]:
    """What identifies an adjacency's current contents without reading them
    (``None`` for inference tensors, which have no version counter).

    Covers plain tensors, :class:`torch_geometric.EdgeIndex` (a wrapper whose
    own ``_version`` counts in-place ops on the wrapper while ``_data``'s
    counts writes through :meth:`as_tensor`), :mod:`torch.sparse` tensors (one
    version counter shared with their index tensors) and
    :class:`torch_sparse.SparseTensor` (its index tensors).
    """
    if isinstance(t, Tensor):
        if t.is_inference():
            return None
        if t.layout == torch.sparse_csr:
            return (t.layout, t.crow_indices().data_ptr(),
                    t.col_indices().data_ptr(), tuple(t.shape), t._version)
        if t.layout == torch.sparse_coo:
            return (t.layout, t._indices().data_ptr(), tuple(t.shape),
                    t._version)
        data = getattr(t, '_data', None)  # EdgeIndex
        if isinstance(data, Tensor):
            return (data.data_ptr(), tuple(t.shape), t.device, t._version,
                    data._version)
        return (t.data_ptr(), tuple(t.shape), t.device, t._version)
    storage = t.storage  # SparseTensor
    # row / rowptr are filled lazily by other code: fill both now so the
    # fingerprint does not change when that happens.
    parts = [storage.rowptr(), storage.row(), storage.col()]
    if any(p.is_inference() for p in parts):
        return None
    return tuple((p.data_ptr(), p._version) if p is not None else None
                 for p in parts) + (tuple(t.sparse_sizes()), )


# Attribute ToDFGNNFormat sets on the EdgeIndex it produces: the EdgeIndex's
# version (see edge_index_version) when the transform finished.
DFGNN_VERSION_ATTR = '_dfgnn_version'


def edge_index_version(edge_index: Tensor) -> Optional[Tuple[int, int, int]]:
    """``(storage pointer, wrapper version, data version)`` of an EdgeIndex:
    changes whenever its indices are written in place, by any route
    (``None`` for inference tensors, which have no version counter)."""
    data = edge_index._data
    if edge_index.is_inference() or data.is_inference():
        return None
    return (data.data_ptr(), edge_index._version, data._version)


def mark_fresh(edge_index: Tensor) -> None:
    """Record that ``edge_index`` (an EdgeIndex) is in DF-GNN format now."""
    version = edge_index_version(edge_index)
    if version is not None:
        setattr(edge_index, DFGNN_VERSION_ATTR, version)


def check_not_stale(edge_index: Tensor, name: str = 'edge_index') -> None:
    """Raise if an EdgeIndex marked by ToDFGNNFormat changed afterwards.

    Copies (pickling, ``deepcopy``) live in other storage and keep the mark;
    they cannot be judged by version and are left to the data checks.
    """
    recorded = getattr(edge_index, DFGNN_VERSION_ATTR, None)
    if recorded is None:
        return
    now = edge_index_version(edge_index)
    if now is not None and recorded[0] == now[0] and tuple(recorded) != now:
        raise ValueError(
            f"'{name}' is stale: its edges were modified in place after "
            f"ToDFGNNFormat ran, so its sort order and the degree statistics "
            f"stored with it no longer hold. Re-apply ToDFGNNFormat (or pass "
            f"a fresh edge_index).")


def _ptr(index: Tensor, size: int) -> Tensor:
    """Sorted index -> compressed pointer array of length ``size + 1``."""
    if index.numel() == 0:
        return torch.zeros(size + 1, dtype=torch.int64, device=index.device)
    # (contiguous: the CPU kernel ignores strides, reading and writing out of
    # bounds for a strided view)
    return torch._convert_indices_from_coo_to_csr(
        index.to(torch.int64).contiguous(), size, out_int32=False)


class NodeIndexError(ValueError, IndexError):
    """An edge's node index out of range: a ``ValueError`` (bad input) that
    is also the ``IndexError`` PyG's convs raise for it."""


def _check_index(name: str, index: Tensor, bound: int, what: str) -> None:
    if index.numel() == 0:
        return
    lo, hi = torch.aminmax(index)
    lo, hi = int(lo), int(hi)
    if lo < 0:
        raise NodeIndexError(f"'{name}' contains negative {what} indices "
                             f"(found {lo})")
    if hi >= bound:
        raise NodeIndexError(f"'{name}' contains {what} index {hi}, out of "
                             f"range for {bound} {what} nodes")


def _check_same_size(name: str, what: str, sizes: Tuple[int, int],
                     size: Optional[Tuple[int, int]]) -> None:
    """The adjacency's own (N_src, N_dst) must agree with the caller's."""
    if size is not None and (int(size[0]), int(size[1])) != tuple(sizes):
        raise ValueError(
            f"'{name}' is a {what} of sparse_size (N_src, N_dst) = "
            f"{tuple(sizes)} but the graph has (num_src, num_dst) = "
            f"{(int(size[0]), int(size[1]))}")


def to_edge_index(
    adj: Any,
    size: Optional[Tuple[int, int]] = None,
    name: str = 'edge_index',
) -> Tuple[Tensor, Tuple[int, int]]:
    """Turn any supported adjacency into ``(edge_index [2, E], (N_src,
    N_dst))``.

    Accepts a ``[2, E]`` integer tensor, a :class:`torch_geometric.EdgeIndex`,
    a :class:`torch_sparse.SparseTensor` or a :mod:`torch.sparse` COO/CSR
    tensor. Sparse adjacencies follow PyG's convention ``adj_t[i, j]`` = edge
    ``j -> i`` (rows are destinations).
    """
    from torch_geometric import EdgeIndex
    from torch_geometric.typing import SparseTensor

    if isinstance(adj, SparseTensor) and not isinstance(adj, Tensor):
        row, col, _ = adj.coo()  # row = destination
        n_dst, n_src = adj.sparse_sizes()
        _check_same_size(name, 'SparseTensor', (n_src, n_dst), size)
        return torch.stack([col, row], 0), (n_src, n_dst)
    if isinstance(adj, Tensor) and adj.layout != torch.strided:
        if adj.layout == torch.sparse_csr:
            crow, col = adj.crow_indices(), adj.col_indices()
            row = torch.repeat_interleave(
                torch.arange(adj.size(0), device=adj.device), crow.diff())
        elif adj.layout == torch.sparse_coo:
            if adj.sparse_dim() != 2:
                raise ValueError(f"'{name}' must be a 2-D sparse matrix "
                                 f"(got sparse_dim {adj.sparse_dim()})")
            # Uncoalesced entries stay separate edges (coalescing would sum
            # multi-edges into one); the CSR build sorts them if needed.
            row, col = adj._indices()
        else:
            raise TypeError(f"'{name}' has unsupported sparse layout "
                            f"{adj.layout} (expected COO or CSR)")
        sizes = (adj.size(1), adj.size(0))
        _check_same_size(name, 'sparse tensor', sizes, size)
        return torch.stack([col.long(), row.long()], 0), sizes
    if not isinstance(adj, Tensor):
        raise TypeError(f"'{name}' must be a Tensor, EdgeIndex, SparseTensor "
                        f"or torch.sparse tensor (got {type(adj).__name__})")
    if isinstance(adj, EdgeIndex):
        sizes = adj.sparse_size()
        adj = adj.as_tensor()
        if sizes[0] is not None and sizes[1] is not None:
            _check_same_size(name, 'EdgeIndex', sizes, size)
            size = (sizes[0], sizes[1])
    if adj.dtype in (torch.bool, ) or adj.is_floating_point() or \
            adj.is_complex():
        raise TypeError(f"'{name}' must hold integer indices "
                        f"(got dtype {adj.dtype})")
    if adj.dim() != 2 or adj.size(0) != 2:
        raise ValueError(f"'{name}' must have shape [2, num_edges] "
                         f"(got {list(adj.shape)})")
    if size is None:
        n = int(adj.max()) + 1 if adj.numel() > 0 else 0
        size = (n, n)
    return adj, (int(size[0]), int(size[1]))


@contextmanager
def _explain_oom(num_edges: int, n_src: int, n_dst: int,
                 device: torch.device) -> Iterator[None]:
    """An out-of-memory error while building a format, with the graph's
    size and what to do about it (the same exception type, so callers that
    catch it still do)."""
    try:
        yield
    except torch.OutOfMemoryError as e:
        need = num_edges * 8 * 4 / 2**30  # sort keys, values, perm, copy
        raise torch.OutOfMemoryError(
            f"Out of memory on {device} while building the DF-GNN format of "
            f"a graph of {num_edges} edges ({n_src} source / {n_dst} "
            f"destination nodes; the build needs ~{need:.1f} GiB besides "
            f"the graph). Train on sampled subgraphs instead "
            f"(pyg_dfgnn.sampler.neighbor_loader or PyG's NeighborLoader), "
            f"free memory before the first forward, or pass edges already "
            f"sorted by destination (ToDFGNNFormat), which skips the sort. "
            f"({str(e).splitlines()[0]})") from None


def owner_windows(owner: Tensor, nbr: Tensor, n_owner: int, n_nbr: int,
                  max_nodes: int, pack_rows: int,
                  max_window_rows: int) -> Tuple[Optional[Tensor], int]:
    """Windows of consecutive owners of a compressed structure (CSR: owner =
    destination, neighbour = source; CSC: owner = source, neighbour =
    destination) whose neighbours are few and contiguous, for shared-memory
    staging of the neighbours' rows.

    Args:
        owner: owner id of each entry (sorted, any integer dtype).
        nbr: neighbour id of each entry.
        n_owner, n_nbr: number of owner / neighbour nodes.
        max_nodes: the most neighbours one window may read.
        pack_rows: owners per packing bucket (``1``: no packing).
        max_window_rows: longer windows are split into pieces of this many
            owners.

    Returns ``(windows, span)``: ``windows`` int64 [W + 1] owner boundaries
    and ``span`` the most neighbour nodes one window reads, or ``(None, 0)``
    when there is no such structure. Owners are cut where no entry crosses
    the cut (``max(nbr)`` of all owners before it ``<`` ``min(nbr)`` of all
    owners after it): the boundaries between the small graphs of a batch,
    found without a ``batch`` vector. Graphs shorter than ``pack_rows``
    owners are packed together (a window opens at the first graph that
    starts in each bucket of ``pack_rows`` owners). Windowed only if every
    window reads at most ``max_nodes`` neighbours. One host sync.
    """
    n = int(n_owner)
    if nbr.numel() == 0 or n < 2 or max_nodes < 1:
        return None, 0
    dev = nbr.device
    owner, nbr = owner.to(torch.int64), nbr.to(torch.int64)
    own_min = torch.full((n, ), n_nbr, dtype=torch.int64,
                         device=dev).scatter_reduce_(0, owner, nbr, 'amin')
    own_max = torch.full((n, ), -1, dtype=torch.int64,
                         device=dev).scatter_reduce_(0, owner, nbr, 'amax')
    before_max = own_max.cummax(0).values
    after_min = own_min.flip(0).cummin(0).values.flip(0)
    cut = torch.ones(n, dtype=torch.bool, device=dev)
    cut[1:] = before_max[:-1] < after_min[1:]
    starts = cut.nonzero().view(-1)  # host sync (once per graph)
    if starts.numel() < 2:
        return None, 0

    def spans(bounds: Tensor) -> Tensor:
        seg = torch.bucketize(torch.arange(n, device=dev), bounds[1:],
                              right=True)
        k = bounds.numel() - 1
        lo = torch.full((k, ), n_nbr, dtype=torch.int64,
                        device=dev).scatter_reduce_(0, seg, own_min, 'amin')
        hi = torch.full((k, ), -1, dtype=torch.int64,
                        device=dev).scatter_reduce_(0, seg, own_max, 'amax')
        return (hi - lo + 1).clamp_min(0)

    def split_long(bounds: Tensor) -> Tensor:
        # Windows of more than max_window_rows owners (few neighbours, many
        # owners) are split so that one block does not serialise.
        length = bounds.diff()
        chunks = (length + max_window_rows - 1).div(
            max_window_rows, rounding_mode='floor').clamp_min(1)
        if int(chunks.max()) == 1:
            return bounds
        first = torch.repeat_interleave(bounds[:-1], chunks)
        offset = torch.arange(first.numel(), device=dev) - \
            torch.repeat_interleave(chunks.cumsum(0) - chunks, chunks)
        return torch.cat([first + offset * max_window_rows, bounds[-1:]])

    end = torch.tensor([n], device=dev)
    bounds = torch.cat([starts, end])
    if pack_rows > 1:
        bucket = starts // pack_rows
        keep = torch.ones_like(starts, dtype=torch.bool)
        keep[1:] = bucket[1:] != bucket[:-1]
        packed = torch.cat([starts[keep], end])
        span = int(spans(packed).max())
        if span <= max_nodes:
            return split_long(packed), span
    span = int(spans(bounds).max())
    return (split_long(bounds), span) if span <= max_nodes else (None, 0)


def _within(given: Tuple[Tensor, int],
            max_nodes: int) -> Tuple[Optional[Tensor], int]:
    """Given ``(bounds, span)`` windows, or none when a window reads more
    than ``max_nodes`` nodes (the kernels then read global memory)."""
    bounds, span = given
    return (bounds, span) if 1 <= span <= max_nodes else (None, 0)


class DFGraph:
    r"""CSR by destination + CSC by source + permutations + degree stats.

    Build one with :meth:`from_edge_index` (or let the convs do it: they cache
    one per ``edge_index`` tensor). A graph remembers the tensor it was built
    from; :meth:`check_fresh` raises if that tensor was modified in place.

    Whoever knows the structure already (a batch of disjoint graphs built on
    the device) passes it to the constructor so that nothing needs a host
    sync: ``csc``, ``max_out_degree`` and ``graph_windows`` = ``(bounds,
    span)``, graph boundaries that serve as both the row and the column
    windows (graphs are contiguous in both orders), each reading at most
    ``span`` nodes. ``stage_windows`` = ``(bounds, span)``, optional: finer
    row / column windows for the SMMF / PMF staging (graphs split into
    pieces, so that a batch of a few graphs still fills the GPU); a piece
    reads sources that other pieces read too, so the tensor-core backward,
    whose windows must own their sources, keeps ``graph_windows``.
    """
    max_window_rows = 256  # owners of one window (see owner_windows)

    def __init__(self, rowptr: Tensor, col: Tensor, num_src: int,
                 perm: Optional[Tensor] = None,
                 max_in_degree: Optional[int] = None,
                 csc: Optional[Tuple[Tensor, Tensor, Tensor]] = None,
                 max_out_degree: Optional[int] = None,
                 graph_windows: Optional[Tuple[Tensor, int]] = None,
                 stage_windows: Optional[Tuple[Tensor, int]] = None) -> None:
        # The kernels (and some of PyTorch's index ops) read raw memory: a
        # strided view, e.g. row 0 of a transposed [E, 2] tensor, would be
        # read as if it were dense.
        self.rowptr = rowptr.contiguous()
        self.col = col.contiguous()
        self.num_src = int(num_src)
        self.num_dst = rowptr.numel() - 1
        self.perm = None if perm is None else perm.contiguous()
        if max_in_degree is None:
            max_in_degree = int(self.in_degree.max()) if self.num_dst else 0
        self.max_in_degree = int(max_in_degree)
        self._csc: Optional[Tuple[Tensor, Tensor, Tensor]] = csc
        self._max_out_degree: Optional[int] = None if max_out_degree is None \
            else int(max_out_degree)
        if (graph_windows is not None or stage_windows is not None) and \
                self.num_src != self.num_dst:
            # the bounds serve as the column windows too: a bipartite graph
            # would send the backward's cols pass past its sources
            raise ValueError(
                f"'graph_windows' / 'stage_windows' need a graph whose "
                f"sources are its "
                f"destinations (got {self.num_src} sources, {self.num_dst} "
                f"destinations)")
        self.graph_windows = None if graph_windows is None else (
            graph_windows[0], int(graph_windows[1]))
        self.stage_windows = None if stage_windows is None else (
            stage_windows[0], int(stage_windows[1]))
        self._row: Optional[Tensor] = None
        # ('row' | 'col', max_nodes, pack_rows) -> row_windows / col_windows
        self._windows: dict = {}
        self._source: Optional[Tuple] = None  # (weakref, fingerprint)

    # ------------------------------------------------------------------ build
    @classmethod
    def from_edge_index(cls, edge_index: Any,
                        size: Optional[Tuple[int, int]] = None,
                        num_nodes: Optional[int] = None,
                        name: str = 'edge_index') -> 'DFGraph':
        """Build from any adjacency :func:`to_edge_index` accepts.

        Args:
            edge_index: the graph.
            size: ``(N_src, N_dst)`` for bipartite graphs.
            num_nodes: ``N`` for ``N_src = N_dst = N``.
        """
        from torch_geometric import EdgeIndex

        if size is None and num_nodes is not None:
            size = (int(num_nodes), int(num_nodes))
        claims_col_order = False
        if isinstance(edge_index, EdgeIndex):
            check_not_stale(edge_index, name)
            claims_col_order = edge_index.is_sorted_by_col
        ei, (n_src, n_dst) = to_edge_index(edge_index, size, name)
        if n_src < 0 or n_dst < 0:
            raise ValueError(f"'size' must be non-negative (got "
                             f"{(n_src, n_dst)})")
        src, dst = ei[0], ei[1]
        _check_index(name, src, n_src, 'source')
        _check_index(name, dst, n_dst, 'destination')
        idx_dtype = _index_dtype(n_src, n_dst, src.numel())
        perm = None
        # Sort metadata is never trusted: checking the order is O(E).
        if src.numel() > 1 and not bool((dst[1:] >= dst[:-1]).all()):
            if claims_col_order:
                raise ValueError(
                    f"'{name}' is an EdgeIndex with sort_order='col' but its "
                    f"destinations (row 1) are not sorted: it was modified "
                    f"after it was sorted. Re-apply ToDFGNNFormat or sort it "
                    f"again (edge_index.sort_by('col')).")
            with _explain_oom(src.numel(), n_src, n_dst, src.device):
                dst, perm = torch.sort(dst, stable=True)
                src = src.index_select(0, perm)  # 100x faster than src[perm]
                perm = perm.to(idx_dtype)
        with _explain_oom(src.numel(), n_src, n_dst, src.device):
            graph = cls(_ptr(dst, n_dst), src.to(idx_dtype), n_src, perm)
        fingerprint = _fingerprint(edge_index)
        if fingerprint is not None:
            graph._source = (weakref.ref(edge_index), fingerprint)
        return graph

    # ------------------------------------------------------------ properties
    @property
    def num_edges(self) -> int:
        return self.col.numel()

    @property
    def device(self) -> torch.device:
        return self.rowptr.device

    @property
    def in_degree(self) -> Tensor:
        return self.rowptr.diff()

    @property
    def row(self) -> Tensor:
        """Destination of each CSR edge (int64), for the reference path."""
        if self._row is None:
            # Cached: never an inference tensor (autograd could not save it
            # when the graph is reused for training after an inference run).
            with torch.inference_mode(False):
                self._row = torch.repeat_interleave(
                    torch.arange(self.num_dst, device=self.device),
                    self.in_degree, output_size=self.num_edges)
        return self._row

    def csc(self) -> Tuple[Tensor, Tensor, Tensor]:
        """``(colptr, csc_row, csc_perm)``, built once on first use.

        ``csc_row`` and ``csc_perm`` share one dtype: ``col``'s, except that
        ``csc_perm`` holds CSR edge ids (up to ``E``), so both are int64 when
        ``E`` exceeds int32 even if ``col`` is int32.
        """
        if self._csc is None:
            with torch.inference_mode(False):  # cached, as row
                col64 = self.col.to(torch.int64)
                sorted_col, csc_perm = torch.sort(col64, stable=True)
                dtype = torch.promote_types(self.col.dtype,
                                            _index_dtype(self.num_edges))
                self._csc = (_ptr(sorted_col, self.num_src),
                             self.row[csc_perm].to(dtype),
                             csc_perm.to(dtype))
        return self._csc

    @property
    def max_out_degree(self) -> int:
        """The longest CSC column (most destinations of one source); built
        with the CSC, one host sync, cached."""
        if self._max_out_degree is None:
            colptr = self.csc()[0]
            self._max_out_degree = int(colptr.diff().max()) \
                if self.num_src > 0 else 0
        return self._max_out_degree

    def row_windows(self, max_nodes: int,
                    pack_rows: int = 64) -> Tuple[Optional[Tensor], int]:
        """Row windows whose sources are few and contiguous, for SMMF's (and
        the backward rows pass's) shared-memory staging of K / V:
        ``(windows, span)`` with ``windows`` int64 [W + 1] row boundaries and
        ``span`` the most source nodes one window reads, or ``(None, 0)``
        when the graph has no such structure (see :func:`owner_windows`).
        Cached per graph; one host sync when built.
        """
        return self._cached_windows('row', max_nodes, pack_rows)

    def col_windows(self, max_nodes: int,
                    pack_rows: int = 64) -> Tuple[Optional[Tensor], int]:
        """Column windows for the backward cols pass: windows of consecutive
        source nodes (the CSC's owners) whose destinations are few and
        contiguous, so that a block can stage their query / grad_out rows in
        shared memory. ``(windows, span)`` with ``windows`` int64 [W + 1]
        source-node boundaries and ``span`` the most destination nodes one
        window reads, or ``(None, 0)`` (see :func:`owner_windows`). Builds
        the CSC if needed. Cached per graph; one host sync when built.
        """
        return self._cached_windows('col', max_nodes, pack_rows)

    def _cached_windows(self, which: str, max_nodes: int,
                        pack_rows: int) -> Tuple[Optional[Tensor], int]:
        # (getattr: graphs pickled before stage_windows existed)
        given = getattr(self, 'stage_windows', None) or self.graph_windows
        if given is not None:
            return _within(given, max_nodes)
        key = (which, int(max_nodes), int(pack_rows))
        if key not in self._windows:
            with torch.inference_mode(False):  # cached, as row
                if which == 'row':
                    owner, nbr = self.row, self.col
                    n_owner, n_nbr = self.num_dst, self.num_src
                else:
                    colptr, csc_row, _ = self.csc()
                    owner = torch.repeat_interleave(
                        torch.arange(self.num_src, device=self.device),
                        colptr.diff(), output_size=self.num_edges)
                    nbr = csc_row
                    n_owner, n_nbr = self.num_src, self.num_dst
                self._windows[key] = owner_windows(
                    owner, nbr, n_owner, n_nbr, key[1], key[2],
                    self.max_window_rows)
        return self._windows[key]

    def graph_row_windows(self, max_nodes: int
                          ) -> Tuple[Optional[Tensor], int]:
        """:meth:`row_windows`, except that a batch's given graph windows
        (whole graphs, each owning its sources) come before its finer
        ``stage_windows`` (pieces that share sources): the windows of the
        tensor-core backward, whose blocks own their sources' gradients."""
        if self.graph_windows is not None:
            return _within(self.graph_windows, max_nodes)
        return self.row_windows(max_nodes)

    def strategy(self, num_heads: int = 1) -> str:
        """SMMF or PMF for this graph and head count."""
        return choose_strategy(self.max_in_degree, num_heads)

    def __getstate__(self) -> Dict[str, Any]:
        # The link to the source tensor (a weak reference) does not survive
        # pickling: an unpickled graph stands alone, like a prebuilt one.
        state = self.__dict__.copy()
        state['_source'] = None
        return state

    # ---------------------------------------------------------------- checks
    def check_fresh(self) -> None:
        """Raise if the tensor this graph was built from changed in place."""
        # Skipped while torch.compile traces: reading a tensor's version is a
        # graph break, and the eager call before compilation checked it.
        if self._source is None or torch.compiler.is_compiling():
            return
        ref, fingerprint = self._source
        source = ref()
        if source is not None and _fingerprint(source) != fingerprint:
            raise ValueError(
                "The DFGraph format is stale: the 'edge_index' it was built "
                "from was modified in place afterwards. Rebuild it (apply "
                "ToDFGNNFormat again or call DFGraph.from_edge_index).")

    def is_built_from(self, edge_index: Tensor) -> bool:
        """Whether this graph was built from ``edge_index`` as it is now."""
        if self._source is None:
            return False
        ref, fingerprint = self._source
        return ref() is edge_index and _fingerprint(edge_index) == fingerprint

    def check_sizes(self, num_src: int, num_dst: int) -> None:
        if (num_src, num_dst) != (self.num_src, self.num_dst):
            raise ValueError(
                f"The DFGraph was built for another graph: it has "
                f"(num_src, num_dst) = {(self.num_src, self.num_dst)} but the "
                f"node features give {(num_src, num_dst)}")

    # ---------------------------------------------------------------- moving
    def to(self, device: Any) -> 'DFGraph':
        device = torch.device(device)
        if device == self.device:
            return self
        out = DFGraph.__new__(DFGraph)
        out.__dict__.update(self.__dict__)
        out.rowptr = self.rowptr.to(device)
        out.col = self.col.to(device)
        out.perm = None if self.perm is None else self.perm.to(device)
        out._csc = None if self._csc is None else tuple(
            t.to(device) for t in self._csc)
        out._row = None if self._row is None else self._row.to(device)
        out._windows = {}
        for name in ('graph_windows', 'stage_windows'):
            given = getattr(self, name, None)
            if given is not None:
                setattr(out, name, (given[0].to(device), given[1]))
        return out

    def cuda(self) -> 'DFGraph':
        return self.to('cuda')

    def cpu(self) -> 'DFGraph':
        return self.to('cpu')

    def __repr__(self) -> str:
        return (f'{self.__class__.__name__}(num_src={self.num_src}, '
                f'num_dst={self.num_dst}, num_edges={self.num_edges}, '
                f'max_in_degree={self.max_in_degree}, device={self.device})')

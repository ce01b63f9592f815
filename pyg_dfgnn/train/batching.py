r"""GPU-resident graphs: a dataset concatenated once on the device, batches
built there from graph ids by a few vectorised ops.

PyG's ``DataLoader`` collates every batch on the host, graph by graph, and
copies it to the device; the DF convs then build the batch's CSR / CSC on the
device with host syncs. :class:`GraphStore` instead keeps every graph of a
split on the device (node and edge tensors concatenated, edge indices local
to their graph, the per-graph CSC order precomputed) and sizes on the host.
A batch of graph ids then costs host arithmetic on ``B`` sizes and gathers on
the device, with no host sync and no host-to-device copy:

* node / edge / graph attributes: range gathers (``repeat_interleave`` with
  host-known ``output_size``), ``edge_index`` shifted by the node offsets,
  the ``batch`` vector and ``ptr`` - the same tensors as PyG's collation;
* ``dfgraph``: the batch's :class:`~pyg_dfgnn.DFGraph` (CSR, CSC, the
  graph-aligned windows of the kernels' shared-memory staging, degree
  bounds), so that the convs read no sizes from the device;
* ``attn_graph`` (optional): the block-diagonal complete graph of the batch
  (every node attends to the nodes of its graph), for GPS's global attention
  through the fused op instead of padding every graph to the largest;
* padding (optional, for a captured step): every batch padded to one of a
  few fixed shapes per split (:meth:`GraphStore.size_levels`): ``num_slots``
  graph slots (the last, partial batch of an epoch too), and nodes, edges
  and attention edges together to one of ``levels`` caps, geometric from a
  typical full batch to the largest possible one. Padding nodes form a
  segment after the real nodes and carry only self-loops (no edge touches a
  real node); ``node_mask`` marks the real nodes, so that loss, metrics and
  batch-norm statistics skip them.
"""
from __future__ import annotations

import math
from typing import Any, Dict, List, Optional, Sequence, Tuple

import torch
from torch import Tensor

from pyg_dfgnn.graph import DFGraph

_INT32_MAX = 2**31 - 1


class GraphBatch:
    r"""A batch built by :class:`GraphStore`: the attributes of PyG's
    ``Batch`` (``x``, ``y``, ``edge_index``, ``batch``, ``ptr``, ...) plus

    * ``dfgraph`` (:class:`~pyg_dfgnn.DFGraph`, structure given, no host
      sync): the local graph's format;
    * ``attn_graph`` (:class:`~pyg_dfgnn.DFGraph`, optional): the
      block-diagonal complete graph;
    * ``node_mask`` (bool [N], or ``None`` without padding);
    * ``max_num_nodes`` (int): the dense width of the padded-attention
      layout, ``dense_index`` [N] (node -> row ``b * max_num_nodes + i``,
      padding nodes -> row ``num_slots * max_num_nodes``) and
      ``num_slots`` (graph slots of that layout);
    * ``graph_bounds`` [num_slots + k + 1]: row offsets of the graphs, the
      empty slots and the padding nodes' windows (each at most
      ``max_graph_nodes`` rows; the kernels' graph windows and the varlen
      global attention's ``cu_seqlens``);
    * ``num_graphs`` (int, real graphs), ``num_real_nodes`` (int),
      ``graph_count`` (0-d float tensor, ``num_graphs`` on the device).
    """

    def __init__(self, **kwargs: Any) -> None:
        self.__dict__.update(kwargs)

    @property
    def num_nodes(self) -> int:
        return self.batch.numel()

    def keys(self) -> List[str]:
        return list(self.__dict__)

    def __repr__(self) -> str:
        parts = []
        for k, v in self.__dict__.items():
            if isinstance(v, Tensor):
                parts.append(f'{k}={list(v.shape)}')
            elif isinstance(v, (int, float)):
                parts.append(f'{k}={v}')
        return f'GraphBatch({", ".join(parts)})'


#: Padded shapes per split and slot count (:meth:`GraphStore.size_levels`).
LEVELS = 4
#: The smallest level: a full batch's mean sizes plus SPREAD standard
#: deviations (about 7 % of full batches go above it, to the next level).
SPREAD = 1.5
#: Node caps leave room for padding edges up to this fraction of the edge
#: caps (as self-loops of at most the maximum in-degree).
NODE_ROOM = 0.25


def _round_up(x: float, to: int = 32) -> int:
    return -(-int(math.ceil(x)) // to) * to


def bucket(n: int, steps: int = 8) -> int:
    """``n`` rounded up to one of ``steps`` sizes per power of two (so at
    most ``1 / steps`` of padding, and few distinct sizes)."""
    if n <= steps:
        return max(int(n), 1)
    q = 1 << max(0, int(n - 1).bit_length() - 1 - int(math.log2(steps)))
    return -(-int(n) // q) * q


def _collated(dataset) -> Tuple[Any, Dict[str, Tensor]]:
    """``(data, slices)`` of a dataset: an ``InMemoryDataset``'s own storage
    when it is a plain one (no index subset, no transform), else PyG's
    collation of its graphs (once, at build time)."""
    from torch_geometric.data import InMemoryDataset
    from torch_geometric.data.collate import collate
    if isinstance(dataset, InMemoryDataset) and dataset._indices is None \
            and dataset.transform is None and dataset.slices is not None:
        return dataset._data, dataset.slices
    graphs = [dataset[i] for i in range(len(dataset))]
    data, slices, _ = collate(graphs[0].__class__, graphs, increment=False,
                              add_batch=False)
    return data, slices


def _plain(t: Tensor) -> Tensor:
    return t.as_tensor() if hasattr(t, 'as_tensor') else t


def _ranges(starts: Tensor, counts: Tensor, total: int) -> Tuple[Tensor,
                                                                 Tensor]:
    """For segments ``[starts[b], starts[b] + counts[b])`` (device): the
    concatenated indices [total] and the segment of each."""
    seg = torch.repeat_interleave(
        torch.arange(counts.numel(), device=counts.device), counts,
        output_size=total)
    offset = counts.cumsum(0) - counts
    idx = torch.arange(total, device=counts.device) + (starts -
                                                       offset).index_select(
                                                           0, seg)
    return idx, seg


class GraphStore:
    r"""The graphs of one dataset split, concatenated once on ``device``;
    :meth:`batch` builds a :class:`GraphBatch` from graph ids.

    Args:
        dataset: a PyG dataset (``InMemoryDataset`` or a list of ``Data``)
            with ``x``; edges of each graph sorted by destination
            (``ToDFGNNFormat``) for ``dfgraph``.
        device: where the graphs live.
        max_nodes (int, optional): dense width of the padded attention
            layout (default: the largest graph).
    """

    def __init__(self, dataset, device: Any,
                 max_nodes: Optional[int] = None) -> None:
        data, slices = _collated(dataset)
        self.device = device = torch.device(device)
        if 'x' not in slices or 'edge_index' not in slices:
            raise ValueError("the device loader needs graphs with 'x' and "
                             "'edge_index'")
        node_ptr = slices['x'].to(torch.int64)
        edge_ptr = slices['edge_index'].to(torch.int64)
        self.num_graphs = node_ptr.numel() - 1
        # Host-side sizes: a batch's totals are sums over B of them.
        self.num_nodes_host = node_ptr.diff()
        self.num_edges_host = edge_ptr.diff()
        g_of_edge = torch.repeat_interleave(
            torch.arange(self.num_graphs), self.num_edges_host)
        ei = _plain(data.edge_index).to(torch.int64)
        src = ei[0] + node_ptr[g_of_edge]
        dst = ei[1] + node_ptr[g_of_edge]
        n_total = int(node_ptr[-1])
        self.sorted = bool((dst[1:] >= dst[:-1]).all()) if dst.numel() > 1 \
            else True
        in_deg = torch.bincount(dst, minlength=n_total)
        out_deg = torch.bincount(src, minlength=n_total)
        self.max_in_degree = int(in_deg.max()) if n_total else 0
        self.max_out_degree = int(out_deg.max()) if n_total else 0
        self.max_graph_nodes = int(self.num_nodes_host.max()) \
            if self.num_graphs else 0
        self.max_nodes = max(self.max_graph_nodes, int(max_nodes or 0))
        # CSC by source of the whole (disjoint) dataset: a graph's CSC
        # entries occupy the same positions as its CSR edges.
        csc_perm = torch.sort(src, stable=True)[1]
        local_edge = csc_perm - edge_ptr[g_of_edge]
        small = max(self.max_graph_nodes, int(self.num_edges_host.max())
                    if self.num_graphs else 0) <= _INT32_MAX
        idx = torch.int32 if small else torch.int64

        def dev(t: Tensor) -> Tensor:
            return t.to(device)

        self._node_ptr = dev(node_ptr[:-1])
        self._edge_ptr = dev(edge_ptr[:-1])
        self._n_count = dev(self.num_nodes_host)
        self._e_count = dev(self.num_edges_host)
        self._src = dev(ei[0].to(idx))
        self._dst = dev(ei[1].to(idx))
        self._in_deg = dev(in_deg)
        self._out_deg = dev(out_deg)
        self._csc_edge = dev(local_edge.to(idx))
        self._csc_dst = dev(ei[1][csc_perm].to(idx))
        # Every other attribute: gathered by its own slices (node-, edge-
        # and graph-level alike), along its concatenation dimension 0.
        self._attrs: Dict[str, Tuple[Tensor, Tensor, Tensor, Tensor]] = {}
        for key, ptr in slices.items():
            value = data[key]
            if key == 'edge_index' or not isinstance(value, Tensor):
                continue
            inc = data.__inc__(key, value)
            if data.__cat_dim__(key, value) != 0 or isinstance(
                    inc, Tensor) or inc:
                raise ValueError(
                    f"the device loader cannot batch attribute {key!r} "
                    f"(concatenated along another dimension or "
                    f"incremented); use train.loader=pyg")
            ptr = ptr.to(torch.int64)
            counts = ptr.diff()
            self._attrs[key] = (dev(_plain(value).reshape(
                (-1, ) + tuple(value.shape[1:]))), dev(ptr[:-1]), counts,
                dev(counts))
        # Attributes padded with the nodes / edges (sliced like them).
        self._node_keys = [k for k, a in self._attrs.items()
                           if torch.equal(a[2], self.num_nodes_host)]
        self._edge_keys = [k for k, a in self._attrs.items()
                           if torch.equal(a[2], self.num_edges_host)
                           and k not in self._node_keys]
        # Graph-level attributes (one row per graph): padded to the slots.
        self._graph_keys = [k for k, a in self._attrs.items()
                            if k not in self._node_keys
                            and k not in self._edge_keys
                            and bool((a[2] == 1).all())]
        self._levels: Dict[Tuple[int, int, int],
                           List[Tuple[int, int, int]]] = {}

    def __len__(self) -> int:
        return self.num_graphs

    # ------------------------------------------------------------------ sizes
    def sizes(self, ids: Tensor) -> Tuple[int, int, int]:
        """``(nodes, edges, attention edges)`` of the graphs ``ids`` (a CPU
        tensor): host arithmetic only."""
        n = self.num_nodes_host.index_select(0, ids)
        e = self.num_edges_host.index_select(0, ids)
        return int(n.sum()), int(e.sum()), int((n * n).sum())

    def size_levels(self, slots: int, attention: bool,
                    levels: int = LEVELS) -> List[Tuple[int, int, int]]:
        r"""The padded shapes ``[(N, E, E_att)]`` of batches of at most
        ``slots`` graphs, smallest first: at most ``levels`` of them, fixed
        per split (computed once, host arithmetic on the graph sizes).

        For each size (nodes, edges, attention edges ``sum n^2``), the
        smallest cap is a typical full batch plus :data:`SPREAD` standard
        deviations of a random batch's sum, the largest the sum of the
        ``slots`` largest graphs (no batch exceeds it); the caps between are
        geometric. The node caps get room for the padding nodes that carry
        the padding edges (self-loops, at most the dataset's degrees)."""
        key = (int(slots), bool(attention), int(levels))
        cached = self._levels.get(key)
        if cached is not None:
            return cached
        g = self.num_graphs
        b = max(1, min(int(slots), g))
        n = self.num_nodes_host.double()
        sizes = [n, self.num_edges_host.double()]
        if attention:
            sizes.append(n * n)
        caps = []
        for v in sizes:
            top = float(v.topk(b).values.sum()) if g else 1.0
            # Sum of b draws without replacement: its mean and spread.
            fpc = (g - b) / (g - 1) if g > 1 else 0.0
            std = float(v.std()) if g > 1 else 0.0
            base = b * float(v.mean()) + SPREAD * std * math.sqrt(b * fpc) \
                if g else 1.0
            base = max(1.0, min(base, top))
            k = max(1, int(levels))
            caps.append([top if k == 1 else
                         base * (top / base)**(i / (k - 1))
                         for i in range(k)])
        d_in = max(1, self.max_in_degree)
        width = max(1, self.max_nodes)
        out: List[Tuple[int, int, int]] = []
        for i in range(len(caps[0])):
            e_cap = _round_up(caps[1][i])
            ea_cap = _round_up(caps[2][i]) if attention else 0
            # Room for the padding edges of a batch whose edges fall short
            # of the cap by NODE_ROOM of it (fewer nodes move up a level).
            room = max(e_cap * NODE_ROOM / d_in, ea_cap * NODE_ROOM / width)
            shape = (_round_up(caps[0][i] + room + 1), e_cap, ea_cap)
            if not out or shape != out[-1]:
                out.append(shape)
        self._levels[key] = out
        return out

    def padded_sizes(self, ids: Tensor, attention: bool,
                     num_slots: Optional[int] = None,
                     levels: int = LEVELS) -> Tuple[int, int, int]:
        """``(N, E, E_att)`` of the graphs ``ids`` padded to the smallest
        of :meth:`size_levels` that holds them, with enough padding nodes
        (at least one) to carry the padding edges as self-loops of at most
        the dataset's degrees. A batch that none holds (one near the largest
        node count with far fewer edges than the largest: its padding edges
        need more padding nodes than the top level leaves room for; none in
        the shipped configs) gets its sizes rounded up by :func:`bucket`,
        a shape of its own."""
        n, e, ea = self.sizes(ids)
        slots = ids.numel() if num_slots is None else int(num_slots)
        for n_pad, e_pad, ea_pad in self.size_levels(slots, attention,
                                                     levels):
            if e <= e_pad and (ea <= ea_pad or not attention) and \
                    n + self._padding_nodes(e, ea, e_pad, ea_pad,
                                            attention) <= n_pad:
                return n_pad, e_pad, ea_pad
        e_pad = bucket(e)
        ea_pad = bucket(ea) if attention else 0
        need = self._padding_nodes(e, ea, e_pad, ea_pad, attention)
        return bucket(n + need), e_pad, ea_pad

    def _padding_nodes(self, e: int, ea: int, e_pad: int, ea_pad: int,
                       attention: bool) -> int:
        need = max(1, -(-(e_pad - e) // max(1, self.max_in_degree)))
        if attention:
            need = max(need, -(-(ea_pad - ea) // max(1, self.max_nodes)))
        return need

    # ------------------------------------------------------------------ batch
    def batch(self, ids: Tensor, ids_device: Optional[Tensor] = None, *,
              dfgraph: bool = True, attention: bool = False,
              pad: bool = False, num_slots: Optional[int] = None,
              levels: int = LEVELS,
              windows_per_graph: int = 1) -> GraphBatch:
        r"""The batch of graphs ``ids``.

        Args:
            ids (Tensor): graph ids (CPU int64; its sizes are read on the
                host).
            ids_device (Tensor, optional): the same ids on the device (a
                slice of an epoch's permutation uploaded once); copied from
                ``ids`` when not given.
            dfgraph (bool): build ``dfgraph`` (needs destination-sorted
                edges).
            attention (bool): build ``attn_graph``.
            pad (bool): pad nodes and edges to the split's fixed shapes
                (:meth:`padded_sizes`), graph-level attributes and ``ptr``
                to ``num_slots`` graphs (empty slots), so that a batch's
                tensor shapes depend only on its level.
            num_slots (int, optional): graph slots of the window and dense
                layouts (fixed across batches for a captured step; default:
                the number of graphs).
            levels (int): padded shapes per split
                (:meth:`size_levels`).
            windows_per_graph (int): the staging windows of ``dfgraph`` /
                ``attn_graph`` per graph slot (``stage_windows``; 1: the
                graph windows, :func:`windows_per_graph`).
        """
        dev = self.device
        ids = ids.to(torch.int64)
        b = ids.numel()
        if ids_device is None:
            ids_device = ids.to(dev)
        slots = b if num_slots is None else int(num_slots)
        if slots < b:
            raise ValueError(f'num_slots ({slots}) < graphs ({b})')
        n, e, ea = self.sizes(ids)
        if pad:
            n_pad, e_pad, ea_pad = self.padded_sizes(ids, attention, slots,
                                                     levels)
        else:
            n_pad, e_pad, ea_pad = n, e, ea
        ids_d = ids_device
        cnt = self._n_count.index_select(0, ids_d)
        ecnt = self._e_count.index_select(0, ids_d)
        off = cnt.cumsum(0) - cnt
        node_idx, batch = _ranges(self._node_ptr.index_select(0, ids_d), cnt,
                                  n)
        edge_idx, eg = _ranges(self._edge_ptr.index_select(0, ids_d), ecnt, e)
        shift = off.index_select(0, eg)
        src = self._src.index_select(0, edge_idx).to(torch.int64) + shift
        dst = self._dst.index_select(0, edge_idx).to(torch.int64) + shift
        out: Dict[str, Any] = {}
        for key, (value, ptr, counts, counts_d) in self._attrs.items():
            total = int(counts.index_select(0, ids).sum())
            idx, _ = _ranges(ptr.index_select(0, ids_d),
                             counts_d.index_select(0, ids_d), total)
            out[key] = value.index_select(0, idx)
        # Empty slots (padded batches) end where the real graphs end.
        ptr = torch.cat([off, off.new_full((slots - b + 1 if pad else 1, ),
                                           n)])
        n_extra, e_extra = n_pad - n, e_pad - e
        node_mask = None
        if pad:
            node_mask = torch.arange(n_pad, device=dev) < n
            for key in self._graph_keys:  # zero rows for the empty slots
                v = out[key]
                out[key] = torch.cat(
                    [v, v.new_zeros((slots - b, ) + tuple(v.shape[1:]))])
            for keys, extra in ((self._node_keys, n_extra),
                                (self._edge_keys, e_extra)):
                for key in keys:  # zero rows
                    v = out[key]
                    out[key] = torch.cat(
                        [v, v.new_zeros((extra, ) + tuple(v.shape[1:]))])
            pad_deg, loops = _pad_loops(n, n_extra, e_extra, dev)
            src = torch.cat([src, loops])
            dst = torch.cat([dst, loops])
            batch = torch.cat([batch, batch.new_full((n_extra, ), slots)])
        out['edge_index'] = torch.stack([src, dst])
        out['batch'] = batch
        out['ptr'] = ptr
        # Window bounds: graph starts, empty windows for unused slots, then
        # the padding nodes in windows of at most max_graph_nodes rows (each
        # reads only itself). As one window they were one block's serial
        # tail of up to a third of the batch's rows (with up to max_nodes
        # self-loops each in the attention graph) and broke the windows'
        # span. Their count depends on n_pad only: a captured shape keeps
        # the shape of its bounds (empty windows past n_pad).
        rows = max(1, self.max_graph_nodes)
        k = -(-n_pad // rows) if pad else 1
        bounds = torch.cat([
            off, off.new_full((slots - b + 1, ), n),
            (n + rows * torch.arange(1, k + 1, device=dev)).clamp_(max=n_pad)])
        stage = None
        if windows_per_graph > 1 and self.max_graph_nodes > 1:
            # Each graph slot in windows_per_graph pieces of equal rows (empty
            # past a small graph's end: the shape stays fixed), then the
            # padding windows. A piece reads its graph's sources: span as
            # the graph windows'.
            piece = -(-self.max_graph_nodes // windows_per_graph)
            starts = (ptr[:-1, None] + piece * torch.arange(
                windows_per_graph, device=dev)).minimum(ptr[1:, None])
            g = ptr.numel() - 1
            stage = (torch.cat([starts.flatten(), bounds[g:]]),
                     self.max_graph_nodes)
        idx_dtype = self._src.dtype
        if dfgraph:
            if not self.sorted:
                raise ValueError("the device loader's 'dfgraph' needs edges "
                                 "sorted by destination (dataset."
                                 "dfgnn_format: true)")
            deg = self._in_deg.index_select(0, node_idx)
            odeg = self._out_deg.index_select(0, node_idx)
            eoff = ecnt.cumsum(0) - ecnt
            csc_perm = self._csc_edge.index_select(0, edge_idx).to(
                torch.int64) + eoff.index_select(0, eg)
            csc_row = self._csc_dst.index_select(0, edge_idx).to(
                torch.int64) + shift
            if pad:  # padding self-loops: the same order in CSR and CSC
                deg = torch.cat([deg, pad_deg])
                odeg = torch.cat([odeg, pad_deg])
                csc_perm = torch.cat([csc_perm, torch.arange(
                    e, e_pad, device=dev)])
                csc_row = torch.cat([csc_row, loops])
            rowptr = torch.cat([deg.new_zeros(1), deg.cumsum(0)])
            colptr = torch.cat([odeg.new_zeros(1), odeg.cumsum(0)])
            out['dfgraph'] = DFGraph(
                rowptr, src.to(idx_dtype), rowptr.numel() - 1,
                max_in_degree=self.max_in_degree,
                csc=(colptr, csc_row.to(idx_dtype), csc_perm.to(idx_dtype)),
                max_out_degree=self.max_out_degree,
                graph_windows=(bounds, self.max_graph_nodes),
                stage_windows=stage)
        if attention:
            out['attn_graph'] = self._attention_graph(
                cnt, off, batch[:n], n, ea, n_extra, ea_pad - ea, bounds,
                idx_dtype, stage)
        # Padded-attention layout (pyg backend): node -> dense row.
        if pad:
            width = self.max_nodes
        else:
            width = int(self.num_nodes_host.index_select(0, ids).max()) \
                if b else 1
        local = torch.arange(n, device=dev) - off.index_select(0, batch[:n])
        dense_index = batch[:n] * width + local
        if pad:
            dense_index = torch.cat([dense_index, dense_index.new_full(
                (n_extra, ), slots * width)])
        out['dense_index'] = dense_index
        out['graph_bounds'] = bounds
        return GraphBatch(**out, node_mask=node_mask, max_num_nodes=width,
                          max_graph_nodes=self.max_graph_nodes,
                          num_slots=slots, num_graphs=b, num_real_nodes=n,
                          graph_count=torch.full((), float(b), device=dev))

    def _attention_graph(self, cnt: Tensor, off: Tensor, batch: Tensor,
                         n: int, ea: int, n_extra: int, ea_extra: int,
                         bounds: Tensor, idx_dtype: torch.dtype,
                         stage: Optional[Tuple[Tensor, int]] = None
                         ) -> DFGraph:
        """The block-diagonal complete graph: CSR row ``i`` of graph ``g``
        holds all nodes of ``g`` in order; it is symmetric, so its CSC has
        the same pointers and CSC entry (source ``s``, destination ``d``) is
        CSR edge ``(d, s)``."""
        dev = self.device
        acnt = cnt * cnt
        aoff = acnt.cumsum(0) - acnt
        ag = torch.repeat_interleave(torch.arange(cnt.numel(), device=dev),
                                     acnt, output_size=ea)
        size = cnt.index_select(0, ag)
        local = torch.arange(ea, device=dev) - aoff.index_select(0, ag)
        hi = local.div(size, rounding_mode='floor')
        lo = local - hi * size
        # CSR entry (destination hi, source lo); CSC entry (source hi,
        # destination lo) is CSR edge (lo, hi).
        col = lo + off.index_select(0, ag)
        csc_perm = aoff.index_select(0, ag) + lo * size + hi
        node_local = torch.arange(n, device=dev) - off.index_select(0, batch)
        starts = aoff.index_select(0, batch) + node_local * cnt.index_select(
            0, batch)
        rowptr = torch.cat([starts, acnt.new_full((1, ), ea)])
        csc_row = col
        if n_extra:
            deg, node = _pad_loops(n, n_extra, ea_extra, dev)
            col = torch.cat([col, node])
            csc_row = col
            csc_perm = torch.cat([csc_perm, torch.arange(
                ea, ea + ea_extra, device=dev)])
            rowptr = torch.cat([starts, ea + torch.cat([
                deg.new_zeros(1), deg.cumsum(0)])])
        return DFGraph(rowptr, col.to(idx_dtype), rowptr.numel() - 1,
                       max_in_degree=self.max_nodes,
                       csc=(rowptr, csc_row.to(idx_dtype),
                            csc_perm.to(idx_dtype)),
                       max_out_degree=self.max_nodes,
                       graph_windows=(bounds, self.max_graph_nodes),
                       stage_windows=stage)


#: The fewest rows of a staging window piece (windows_per_graph): below it
#: a block's fixed costs (staging the graph's rows) outweigh the parallelism.
MIN_PIECE_ROWS = 16


def auto_windows_per_graph(slots: int, max_graph_nodes: int,
                           device: Any) -> int:
    """Staging windows per graph slot for batches of ``slots`` graphs: as
    many as one wave of blocks holds (a staged block of 1,024 threads and
    ~100 KB of shared memory is alone on its SM), pieces of at least
    MIN_PIECE_ROWS rows; 1 off CUDA. (32 PATTERN graphs on an H100, GAT
    kernels per layer fwd / bwd rows / bwd cols: 1 piece 60 / 118 / 60 us,
    4 pieces (one wave) 43-49 / 75-85 / 42-47, 9 pieces (the former two
    blocks per SM) 56-61 / 96-107 / 57-61, 18 pieces 75 / 127 / 79.)"""
    device = torch.device(device)
    if device.type != 'cuda':
        return 1
    sms = torch.cuda.get_device_properties(device).multi_processor_count
    want = sms // max(1, slots)
    return max(1, min(want, max_graph_nodes // MIN_PIECE_ROWS))


def _pad_loops(start: int, n_extra: int, e_extra: int,
               device: torch.device) -> Tuple[Tensor, Tensor]:
    """Padding edges as self-loops of the padding nodes ``start ..
    start + n_extra`` (destination-sorted, ``ceil(e_extra / n_extra)`` per
    node at most): ``(in-degree of each padding node, node of each edge)``.
    """
    per_node = max(1, -(-e_extra // max(1, n_extra)))
    node = torch.arange(e_extra, device=device).div(per_node,
                                                    rounding_mode='floor')
    deg = torch.zeros(n_extra, dtype=torch.int64, device=device)
    deg.index_add_(0, node, torch.ones_like(node))
    return deg, node + start


class DeviceLoader:
    r"""Batches of a :class:`GraphStore` in the order of the runner's PyG
    ``DataLoader`` (a ``RandomSampler`` over ``generator``): the same
    ``torch.randperm(n, generator=generator)`` per epoch for
    ``shuffle=True``, so both loaders give the same graphs per batch.

    The epoch's permutation is uploaded once; every batch then slices it on
    the device and its sizes on the host.
    """

    def __init__(self, store: GraphStore, batch_size: int,
                 shuffle: bool = False,
                 generator: Optional[torch.Generator] = None,
                 **batch_kwargs: Any) -> None:
        self.store, self.batch_size = store, int(batch_size)
        self.shuffle, self.generator = shuffle, generator
        self.batch_kwargs = batch_kwargs

    def __len__(self) -> int:
        return -(-len(self.store) // self.batch_size)

    def order(self) -> Tensor:
        n = len(self.store)
        # (The runner's DataLoaders draw their workers' seeds from generators
        # of their own: the permutation is all either loader draws.)
        if self.shuffle:
            return torch.randperm(n, generator=self.generator)
        return torch.arange(n)

    def __iter__(self):
        order = self.order()
        order_dev = order.to(self.store.device)
        for start in range(0, order.numel(), self.batch_size):
            ids = order[start:start + self.batch_size]
            yield self.store.batch(
                ids, order_dev[start:start + self.batch_size],
                **self.batch_kwargs)

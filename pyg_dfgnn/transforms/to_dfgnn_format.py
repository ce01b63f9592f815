from typing import Any, Dict, List, Optional, Sequence, Tuple, Union

import numpy as np
import torch
from torch import Tensor

from torch_geometric import EdgeIndex
from torch_geometric.data import Batch, Data, HeteroData
from torch_geometric.edge_index import CatMetadata
from torch_geometric.transforms import BaseTransform
from torch_geometric.typing import SparseTensor
from torch_geometric.utils import add_self_loops, remove_self_loops

from pyg_dfgnn.graph import _check_index, _ptr, mark_fresh, to_edge_index

# Graph-level statistic the transform stores: a 0-dim int64 tensor, which
# DataLoader collation stacks into [num_graphs].
MAX_IN_DEGREE_KEY = 'dfgnn_max_in_degree'


class ToDFGNNFormat(BaseTransform):
    r"""Puts a graph into the layout the DF-GNN fused kernels run on: edges
    sorted by destination (CSR by destination), optionally with GAT-style
    self-loops.

    For a graph given as :obj:`data.edge_index` (a :class:`torch.Tensor` or
    :class:`torch_geometric.EdgeIndex`), the transform

    1. if :obj:`add_self_loops` is set, removes existing self-loops and adds
       one self-loop :math:`(i, i)` per node, exactly as
       :class:`~torch_geometric.nn.conv.GATConv` does
       (:func:`~torch_geometric.utils.remove_self_loops` followed by
       :func:`~torch_geometric.utils.add_self_loops` with :obj:`fill_value`
       for the attributes named in :obj:`attr`);
    2. stably sorts the edges by destination :math:`i` (for
       :obj:`flow="source_to_target"` edges :math:`j \rightarrow i` are
       :obj:`edge_index[:, e] = (j, i)`), permuting every edge-level attribute
       (:meth:`~torch_geometric.data.Data.is_edge_attr`) alike;
    3. stores :obj:`data.edge_index` as an :class:`~torch_geometric.EdgeIndex`
       with :obj:`sort_order="col"` and :obj:`sparse_size=(N, N)` (PyG's
       collation keeps the order over mini-batches) and marks it, so that
       :meth:`pyg_dfgnn.DFGraph.from_edge_index` detects in-place edits made
       afterwards;
    4. stores the maximum in-degree as :obj:`data.dfgnn_max_in_degree`, a
       0-dim tensor (:obj:`[num_graphs]` after batching). The SMMF / PMF
       choice for :math:`H` heads is
       :obj:`pyg_dfgnn.dispatch.choose_strategy(int(max_in_degree.max()), H)`.

    A graph given as :obj:`data.adj_t` (:class:`torch_sparse.SparseTensor` or
    a :mod:`torch.sparse` CSR / COO tensor, rows are destinations) keeps its
    type; it is already sorted by destination (COO is coalesced). Self-loops
    follow the same semantics, with the sparse values filled like an
    attribute in :obj:`attr`.

    .. code-block:: python

        import pyg_dfgnn  # registers torch_geometric.transforms.ToDFGNNFormat
        import torch_geometric.transforms as T

        dataset = MyDataset(root, pre_transform=T.ToDFGNNFormat(
            add_self_loops=True, fill_value='mean'))

    Args:
        add_self_loops (bool, optional): If set to :obj:`True`, replaces the
            self-loops of every node by exactly one, as
            :class:`~torch_geometric.nn.conv.GATConv` (with
            :obj:`add_self_loops=True`) does; the convs must then be built
            with :obj:`add_self_loops=False`. (default: :obj:`False`)
        fill_value (float or torch.Tensor or str, optional): How the
            attributes in :obj:`attr` are filled for the self-loops: a value,
            or a reduction (:obj:`"add"`, :obj:`"mean"`, :obj:`"min"`,
            :obj:`"max"`, :obj:`"mul"`) of the features of the edges pointing
            to the node, as in :func:`~torch_geometric.utils.add_self_loops`.
            (default: :obj:`"mean"`, GATConv's default)
        attr (str or [str], optional): The edge attributes that get
            :obj:`fill_value` for the self-loops. Any other edge-level
            attribute makes :obj:`add_self_loops=True` fail, since its value
            for a self-loop is unknown. (default: :obj:`"edge_attr"`)

    .. note::

        Edge-level attributes are recognised as PyG does: tensors with
        :obj:`num_edges` entries along their concatenation dimension, where
        :obj:`num_edges == num_nodes` is only resolved by an :obj:`"edge"` in
        the name. Index-like keys (containing :obj:`"index"`) and link-level
        supervision (:obj:`edge_label*`, e.g. from
        :class:`~torch_geometric.transforms.RandomLinkSplit`: it belongs to
        :obj:`edge_label_index`, not to the edges) are never permuted, as in
        :class:`~torch_geometric.transforms.ToSparseTensor`.

    .. note::

        Self-loop attributes are filled once, from the edges the graph has
        when the transform runs (as :class:`~torch_geometric.transforms.\
AddSelfLoops` would): a subgraph taken afterwards keeps them. Apply
        :obj:`ToDFGNNFormat` last, after transforms that change the edges
        (PyG 2.8's :func:`~torch_geometric.utils.coalesce` fails on a
        column-sorted :class:`~torch_geometric.EdgeIndex`, so e.g.
        :class:`~torch_geometric.transforms.ToSparseTensor` and
        :class:`~torch_geometric.transforms.RemoveDuplicatedEdges` cannot
        come after it). A :class:`~torch_geometric.data.Batch` stays
        separable: its per-graph slices are updated.
    """
    def __init__(
        self,
        add_self_loops: bool = False,
        fill_value: Union[float, Tensor, str] = 'mean',
        attr: Optional[Union[str, Sequence[str]]] = 'edge_attr',
    ) -> None:
        self.add_self_loops = bool(add_self_loops)
        self.fill_value = fill_value
        if attr is None:
            attr = []
        self.attrs: List[str] = [attr] if isinstance(attr, str) else list(attr)
        self.attr = attr

    def forward(self, data: Any) -> Any:
        if isinstance(data, HeteroData):
            raise TypeError(
                "ToDFGNNFormat supports homogeneous graphs ('Data') only, got "
                "'HeteroData'; convert it with 'to_homogeneous()' first")
        if not isinstance(data, Data):
            raise TypeError(f"ToDFGNNFormat expects a 'Data' object (got "
                            f"{type(data).__name__})")
        has_edge_index = data.get('edge_index', None) is not None
        has_adj_t = data.get('adj_t', None) is not None
        if has_edge_index and has_adj_t:
            raise ValueError(
                "'data' holds both 'edge_index' and 'adj_t'; ToDFGNNFormat "
                "needs exactly one graph (drop one of them)")
        if not has_edge_index and not has_adj_t:
            raise ValueError("'data' has no graph: ToDFGNNFormat needs "
                             "'edge_index' or 'adj_t'")
        if has_edge_index:
            dst, n = self._format_edge_index(data)
        else:
            dst, n = self._format_adj_t(data)
        _store_stats(data, dst, n)
        return data

    # ------------------------------------------------------------ edge_index
    def _format_edge_index(self, data: Data) -> Tuple[Tensor, int]:
        num_nodes = data.num_nodes
        size = None if num_nodes is None else (num_nodes, num_nodes)
        edge_index, (n, _) = to_edge_index(data.edge_index, size,
                                           'edge_index')
        edge_index = edge_index.to(torch.int64)
        _check_index('edge_index', edge_index[0], n, 'source')
        _check_index('edge_index', edge_index[1], n, 'destination')

        edge_attrs = {key: data[key] for key in _edge_attr_keys(data)}
        if self.add_self_loops:
            edge_index, edge_attrs = self._self_loops(data, edge_index,
                                                      edge_attrs, n)

        dst = edge_index[1]
        if dst.numel() > 1 and not bool((dst[1:] >= dst[:-1]).all()):
            perm = torch.sort(dst, stable=True)[1]
            edge_index = edge_index[:, perm]
            edge_attrs = {
                key: _permute(value, perm, data.__cat_dim__(key, value))
                for key, value in edge_attrs.items()
            }
        else:  # Own storage, so edits to the input cannot reach the output.
            edge_index = edge_index.clone()

        for key, value in edge_attrs.items():
            data[key] = value
        out = EdgeIndex(edge_index, sparse_size=(n, n), sort_order='col')
        mark_fresh(out)
        data.edge_index = out
        return edge_index[1], n

    # ----------------------------------------------------------------- adj_t
    def _format_adj_t(self, data: Data) -> Tuple[Tensor, int]:
        adj = data.adj_t
        if isinstance(adj, SparseTensor) and not isinstance(adj, Tensor):
            dst, src, value = adj.coo()
            size = adj.sparse_sizes()
            kind = 'torch_sparse'
        elif isinstance(adj, Tensor) and adj.layout == torch.sparse_csr:
            crow = adj.crow_indices()
            src = adj.col_indices().to(torch.int64)
            dst = torch.repeat_interleave(
                torch.arange(adj.size(0), device=adj.device), crow.diff())
            value, size, kind = adj.values(), _sparse_size(adj), 'csr'
        elif isinstance(adj, Tensor) and adj.layout == torch.sparse_coo:
            size = _sparse_size(adj)
            if not adj.is_coalesced():  # Sorted by destination from now on.
                if _edge_attr_keys(data):
                    raise ValueError(
                        "'adj_t' is an uncoalesced COO tensor with edge-level "
                        "attributes next to it; coalesce it (merging "
                        "duplicate edges) and align them first")
                adj = adj.coalesce()
                data.adj_t = adj
            dst, src = adj.indices()
            value, kind = adj.values(), 'coo'
        else:
            got = type(adj).__name__
            if isinstance(adj, Tensor):
                got += f' with layout {adj.layout}'
            raise TypeError(f"'adj_t' must be a torch_sparse.SparseTensor or "
                            f"a torch.sparse CSR / COO tensor (got {got})")
        if len(size) != 2 or size[0] != size[1]:
            raise ValueError(f"'adj_t' must be a square [N, N] adjacency "
                             f"(got size {list(size)})")
        n = int(size[0])
        if data.num_nodes is not None and data.num_nodes != n:
            raise ValueError(f"'adj_t' has size {list(size)} but 'data' has "
                             f"{data.num_nodes} nodes")

        if self.add_self_loops:
            edge_attrs = {key: data[key] for key in _edge_attr_keys(data)}
            value_key = None
            if value is not None:  # Sparse values are filled as an attribute.
                value_key = '\0adj_t.value'
                edge_attrs[value_key] = value
            edge_index = torch.stack([src.to(torch.int64),
                                      dst.to(torch.int64)], 0)
            edge_index, edge_attrs = self._self_loops(
                data, edge_index, edge_attrs, n, always_fill=value_key)
            src, dst = edge_index[0], edge_index[1]
            # Sparse layouts want (row, col) lexicographic order.
            perm = torch.sort(dst * max(n, 1) + src, stable=True)[1]
            src, dst = src[perm], dst[perm]
            value = None
            for key, attr in edge_attrs.items():
                attr = _permute(attr, perm, 0 if key == value_key else
                                data.__cat_dim__(key, attr))
                if key == value_key:
                    value = attr
                else:
                    data[key] = attr
            if kind == 'torch_sparse':
                adj = SparseTensor(row=dst, col=src, value=value,
                                   sparse_sizes=(n, n), is_sorted=True,
                                   trust_data=True)
            elif kind == 'csr':
                adj = torch.sparse_csr_tensor(
                    _ptr(dst, n).to(adj.crow_indices().dtype),
                    src.to(adj.col_indices().dtype), value, (n, n) +
                    tuple(value.shape[1:]))
            else:
                adj = torch.sparse_coo_tensor(
                    torch.stack([dst, src], 0), value,
                    (n, n) + tuple(value.shape[1:]), is_coalesced=True)
            data.adj_t = adj
        return dst, n

    # ------------------------------------------------------------ self-loops
    def _self_loops(
        self,
        data: Data,
        edge_index: Tensor,
        edge_attrs: Dict[str, Any],
        num_nodes: int,
        always_fill: Optional[str] = None,
    ) -> Tuple[Tensor, Dict[str, Any]]:
        """GATConv's self-loop handling, applied to every edge attribute."""
        unfillable = [
            key for key in edge_attrs
            if key not in self.attrs and key != always_fill
        ]
        if unfillable:
            raise ValueError(
                f"ToDFGNNFormat(add_self_loops=True) cannot fill the "
                f"edge-level attribute(s) {unfillable} for the new self-loops;"
                f" name them in 'attr' (currently {self.attrs}) to fill them "
                f"with fill_value={self.fill_value!r}, or remove them")
        for key in self.attrs:
            if key in data and key not in edge_attrs:
                raise ValueError(
                    f"'{key}' (named in 'attr') is not edge-level: it does "
                    f"not have one entry per edge ({edge_index.size(1)})")
        for key, value in edge_attrs.items():
            if not isinstance(value, Tensor):
                raise TypeError(f"'{key}' must be a Tensor to be filled for "
                                f"self-loops (got {type(value).__name__})")
            if key != always_fill and data.__cat_dim__(key, value) != 0:
                raise ValueError(f"'{key}' must be concatenated along dim 0 "
                                 f"to be filled for self-loops")

        out_attrs: Dict[str, Any] = {}
        loop_free = edge_index
        for key, value in edge_attrs.items():
            loop_free, value = remove_self_loops(edge_index, value)
            out_attrs[key] = add_self_loops(loop_free, value, self.fill_value,
                                            num_nodes)[1]
        if not edge_attrs:
            loop_free, _ = remove_self_loops(edge_index)
        out_index, _ = add_self_loops(loop_free, num_nodes=num_nodes)
        return out_index, out_attrs

    def __repr__(self) -> str:
        return (f'{self.__class__.__name__}(add_self_loops='
                f'{self.add_self_loops}, fill_value={self.fill_value!r}, '
                f'attr={self.attr!r})')


def _edge_attr_keys(data: Data) -> List[str]:
    return [
        key for key in data.keys()
        if key not in ('edge_index', 'adj_t', 'adj') and 'index' not in key
        and not key.startswith('edge_label') and key != MAX_IN_DEGREE_KEY
        and data.is_edge_attr(key)
    ]


def _sparse_size(adj: Tensor) -> Tuple[int, ...]:
    """A torch.sparse adjacency's ``[N, N]`` (dense dims are features)."""
    if adj.sparse_dim() != 2:
        raise ValueError(f"'adj_t' must be a square [N, N] adjacency (got "
                         f"{adj.sparse_dim()} sparse dimensions, shape "
                         f"{list(adj.shape)})")
    return tuple(adj.shape[:2])


def _batch_slices(data: Data) -> Optional[Dict[str, Tensor]]:
    """The slices a :class:`Batch` is separated by (``None`` for a graph or
    a batch that was not collated)."""
    slices = getattr(data, '_slice_dict', None)
    if not isinstance(data, Batch) or not slices or \
            data.get('ptr', None) is None:
        return None
    return slices


def _permute(value: Any, perm: Tensor, dim: int) -> Any:
    if isinstance(value, Tensor):
        return value.index_select(dim, perm.to(value.device))
    if isinstance(value, np.ndarray):
        return np.take(value, perm.cpu().numpy(), axis=dim)
    if isinstance(value, (list, tuple)):
        return type(value)(value[i] for i in perm.tolist())
    raise TypeError(f"Cannot reorder the edge-level attribute of type "
                    f"{type(value).__name__}")


def _store_stats(data: Data, dst: Tensor, num_nodes: int) -> None:
    # num_edges changed or edges moved: forget PyG's attribute-kind cache.
    data._store.__dict__.pop('_cached_attr', None)
    in_degree = torch.bincount(dst.to(torch.int64), minlength=num_nodes)
    slices = _batch_slices(data)
    if slices is None:
        max_in_degree = int(in_degree.max()) if in_degree.numel() else 0
        data[MAX_IN_DEGREE_KEY] = torch.tensor(max_in_degree,
                                               dtype=torch.int64)
        return
    # A batch: per graph, as collation gives it, and the edge-level slices
    # updated (self-loops change each graph's edge count; the sort by
    # destination keeps each graph's edges contiguous, in graph order).
    sizes = data.ptr.cpu().to(torch.int64)  # node offsets [num_graphs + 1]
    num_graphs = sizes.numel() - 1
    graph = torch.repeat_interleave(torch.arange(num_graphs), sizes.diff())
    max_in_degree = torch.zeros(num_graphs, dtype=torch.int64).scatter_reduce(
        0, graph, in_degree.cpu(), 'amax')
    data[MAX_IN_DEGREE_KEY] = max_in_degree
    slices[MAX_IN_DEGREE_KEY] = torch.arange(num_graphs + 1)
    data._inc_dict[MAX_IN_DEGREE_KEY] = torch.zeros(num_graphs,
                                                    dtype=torch.int64)
    edges = torch.bincount(graph.index_select(0, dst.cpu().to(torch.int64)),
                           minlength=num_graphs)
    edge_slices = torch.cat([torch.zeros(1, dtype=torch.int64),
                             edges.cumsum(0)])
    for key in ['edge_index', *_edge_attr_keys(data)]:
        if key in slices and key in data:
            slices[key] = edge_slices
    if isinstance(data.get('edge_index', None), EdgeIndex):
        # what Batch.get_example reads back per graph
        data.edge_index._cat_metadata = CatMetadata(
            nnz=edges.tolist(),
            sparse_size=[(int(end), int(end)) for end in sizes[1:]],
            sort_order=[data.edge_index._sort_order] * num_graphs,
            is_undirected=[False] * num_graphs)

"""ToDFGNNFormat: sorting, attributes, self-loops, sparse inputs, staleness,
bad input and DataLoader batching."""
import copy
import pickle

import pytest
import torch
import torch_geometric
import torch_geometric.transforms as T
from torch_geometric import EdgeIndex
from torch_geometric.data import Batch, Data, HeteroData
from torch_geometric.loader import DataLoader
from torch_geometric.utils import add_self_loops, remove_self_loops

import pyg_dfgnn
from pyg_dfgnn import DFGraph, ToDFGNNFormat, fused_attention
from pyg_dfgnn.dispatch import choose_strategy

try:
    from torch_sparse import SparseTensor
except ImportError:  # pragma: no cover
    SparseTensor = None


def random_data(n, e, seed=0, loops=True, dtype=torch.float64):
    gen = torch.Generator().manual_seed(seed)
    ei = torch.randint(0, n, (2, e), generator=gen) if n else \
        torch.empty(2, 0, dtype=torch.long)
    if loops and e >= 2:  # a few explicit self-loops to be replaced
        ei[1, :2] = ei[0, :2]
    return Data(x=torch.randn(n, 4, generator=gen, dtype=dtype),
                edge_index=ei,
                edge_attr=torch.randn(e, 3, generator=gen, dtype=dtype),
                graph_y=torch.tensor([seed]))


def stable_by_dst(edge_index):
    return torch.sort(edge_index[1], stable=True)[1]


def test_registered_in_pyg_transforms():
    assert T.ToDFGNNFormat is ToDFGNNFormat
    assert 'ToDFGNNFormat' in T.__all__
    assert pyg_dfgnn.ToDFGNNFormat is ToDFGNNFormat
    assert repr(T.ToDFGNNFormat(add_self_loops=True, fill_value=2.0)) == (
        "ToDFGNNFormat(add_self_loops=True, fill_value=2.0, "
        "attr='edge_attr')")


@pytest.mark.parametrize('as_edge_index', [False, True])
def test_sorts_and_permutes_every_edge_attribute(as_edge_index):
    n, e = 12, 40
    data = random_data(n, e, seed=1)
    data.edge_weight = torch.rand(e)
    data.edge_label = torch.randint(0, 5, (e, ))
    data.y = torch.randn(e)  # edge-level: E != N
    data.edge_names = [f'e{i}' for i in range(e)]
    data.node_y = torch.arange(n)
    data.edge_label_index = torch.randint(0, n, (2, e))  # not per edge
    if as_edge_index:
        data.edge_index = EdgeIndex(data.edge_index, sparse_size=(n, n))
    ref = data.clone()
    out = ToDFGNNFormat()(data)

    perm = stable_by_dst(ref.edge_index)
    assert isinstance(out.edge_index, EdgeIndex)
    assert out.edge_index.sort_order == 'col'
    assert out.edge_index.sparse_size() == (n, n)
    assert out.edge_index.dtype == torch.int64
    assert torch.equal(out.edge_index.as_tensor(), ref.edge_index[:, perm])
    for key in ('edge_attr', 'edge_weight', 'y'):
        assert torch.equal(out[key], ref[key][perm]), key
    assert out.edge_names == [ref.edge_names[i] for i in perm.tolist()]
    # edge_label goes with edge_label_index (link-level supervision, as in
    # PyG's ToSparseTensor), not with the edges.
    for key in ('x', 'node_y', 'graph_y', 'edge_label', 'edge_label_index'):
        assert torch.equal(out[key], ref[key]), key
    deg = torch.bincount(ref.edge_index[1], minlength=n)
    assert out.dfgnn_max_in_degree.dim() == 0
    assert int(out.dfgnn_max_in_degree) == int(deg.max())
    graph = DFGraph.from_edge_index(out.edge_index)
    assert graph.perm is None and graph.max_in_degree == int(deg.max())


@pytest.mark.parametrize('add_loops', [False, True])
def test_link_split_labels_stay_with_their_index(add_loops):
    # RandomLinkSplit's train split (undirected) has as many labels as edges:
    # they label edge_label_index's pairs, so they must not move.
    gen = torch.Generator().manual_seed(3)
    ei = torch_geometric.utils.to_undirected(
        torch.randint(0, 30, (2, 60), generator=gen))
    ei = ei[:, ei[0] != ei[1]]
    torch.manual_seed(0)
    train, _, _ = T.RandomLinkSplit(num_val=0.1, num_test=0.1,
                                    is_undirected=True)(
        Data(x=torch.randn(30, 4), edge_index=ei))
    assert train.edge_label.numel() == train.num_edges
    out = ToDFGNNFormat(add_self_loops=add_loops)(train.clone())
    assert torch.equal(out.edge_label, train.edge_label)
    assert torch.equal(out.edge_label_index, train.edge_label_index)


def test_node_attr_with_as_many_rows_as_edges_is_not_permuted():
    # num_nodes == num_edges: PyG's rule, only names with 'edge' are edges.
    data = Data(x=torch.arange(4.), edge_index=torch.tensor([[0, 1, 2, 3],
                                                             [3, 2, 1, 0]]),
                edge_w=torch.arange(4.))
    out = ToDFGNNFormat()(data)
    assert out.x.tolist() == [0., 1., 2., 3.]
    assert out.edge_w.tolist() == [3., 2., 1., 0.]


def test_self_loops_no_attr_equal_pyg():
    data = random_data(9, 30, seed=2)
    del data.edge_attr
    ref_ei, _ = add_self_loops(remove_self_loops(data.edge_index)[0],
                               num_nodes=9)
    out = ToDFGNNFormat(add_self_loops=True)(data)
    assert torch.equal(out.edge_index.as_tensor(),
                       ref_ei[:, stable_by_dst(ref_ei)])
    assert int(out.dfgnn_max_in_degree) == int(
        torch.bincount(ref_ei[1]).max())


FILL_VALUES = [None, 1.5, torch.tensor([0.5, -1., 2.]), 'add', 'mean', 'min',
               'max', 'mul']


@pytest.mark.parametrize('fill_value', FILL_VALUES)
def test_self_loops_equal_gatconv_semantics(fill_value):
    # GATConv: remove_self_loops, then add_self_loops(fill_value=...), here
    # followed by the stable sort by destination. Node 10 is isolated.
    data = random_data(11, 35, seed=3)
    data.edge_index[:, data.edge_index[1] == 10] = 0
    data.edge_index[:, data.edge_index[0] == 10] = 0
    ei, attr = remove_self_loops(data.edge_index, data.edge_attr)
    ei, attr = add_self_loops(ei, attr, fill_value=fill_value, num_nodes=11)
    perm = stable_by_dst(ei)
    out = ToDFGNNFormat(add_self_loops=True, fill_value=fill_value)(data)
    assert torch.equal(out.edge_index.as_tensor(), ei[:, perm])
    assert torch.equal(out.edge_attr, attr[perm])
    # Exactly one self-loop per node.
    src, dst = out.edge_index.as_tensor()
    assert torch.equal(dst[src == dst], torch.arange(11))


def test_self_loops_fill_several_attrs_and_reject_unnamed_ones():
    data = random_data(6, 14, seed=4)
    data.edge_weight = torch.rand(14, dtype=torch.float64)
    with pytest.raises(ValueError, match=r"\['edge_weight'\].*'attr'"):
        ToDFGNNFormat(add_self_loops=True)(data.clone())
    out = ToDFGNNFormat(add_self_loops=True, fill_value='max',
                        attr=['edge_attr', 'edge_weight'])(data.clone())
    for key in ('edge_attr', 'edge_weight'):
        ei, attr = remove_self_loops(data.edge_index, data[key])
        ei, attr = add_self_loops(ei, attr, fill_value='max', num_nodes=6)
        assert torch.equal(out[key], attr[stable_by_dst(ei)])
    with pytest.raises(ValueError, match="'x'.*not edge-level"):
        ToDFGNNFormat(add_self_loops=True, attr=['edge_attr', 'x'])(
            random_data(6, 14, seed=4))


def test_single_node_and_no_edges():
    for n, e in [(1, 0), (1, 1), (5, 0), (0, 0)]:
        data = random_data(n, e, seed=5)
        out = ToDFGNNFormat()(data.clone())
        assert out.edge_index.size(1) == e
        assert int(out.dfgnn_max_in_degree) == (1 if e else 0)
        out = ToDFGNNFormat(add_self_loops=True)(data.clone())
        assert out.edge_index.tolist() == [list(range(n)), list(range(n))]
        assert out.edge_attr.shape == (n, 3)
        assert int(out.dfgnn_max_in_degree) == (1 if n else 0)


def _sparse_inputs(data):
    """(name, adj_t) of the graph of `data`, values = edge_weight."""
    n = data.num_nodes
    ei, w = data.edge_index, data.edge_weight
    coo = torch.sparse_coo_tensor(ei.flip(0), w, (n, n)).coalesce()
    out = [('coo', coo), ('csr', coo.to_sparse_csr())]
    if SparseTensor is not None:
        out.append(('torch_sparse', SparseTensor(
            row=ei[1], col=ei[0], value=w, sparse_sizes=(n, n)).coalesce()))
    return out


def _coalesced_ref(data, fill_value):
    """Reference adj_t content: remove + add self-loops on the coalesced
    edges, then sort by (dst, src)."""
    n = data.num_nodes
    key = data.edge_index[1] * n + data.edge_index[0]
    key, inv = torch.unique(key, return_inverse=True)
    w = torch.zeros(key.numel(), dtype=data.edge_weight.dtype)
    w = w.index_add(0, inv, data.edge_weight)
    ei = torch.stack([key % n, key // n])
    ei, w = remove_self_loops(ei, w)
    ei, w = add_self_loops(ei, w, fill_value=fill_value, num_nodes=n)
    perm = torch.sort(ei[1] * n + ei[0])[1]
    return ei[:, perm], w[perm]


@pytest.mark.parametrize('fill_value', [2.0, 'mean', 'add'])
def test_sparse_adj_t_keeps_type_and_adds_self_loops(fill_value):
    base = random_data(10, 30, seed=6)
    base.edge_weight = torch.rand(30, dtype=torch.float64)
    ref_ei, ref_w = _coalesced_ref(base, fill_value)
    for name, adj_t in _sparse_inputs(base):
        data = Data(x=base.x, adj_t=adj_t)
        out = ToDFGNNFormat(add_self_loops=True, fill_value=fill_value)(data)
        assert type(out.adj_t) is type(adj_t), name
        if name == 'torch_sparse':
            row, col, w = out.adj_t.coo()
        elif name == 'csr':
            assert out.adj_t.layout == torch.sparse_csr
            row = torch.repeat_interleave(torch.arange(10),
                                          out.adj_t.crow_indices().diff())
            col, w = out.adj_t.col_indices(), out.adj_t.values()
        else:
            assert out.adj_t.is_coalesced()
            (row, col), w = out.adj_t.indices(), out.adj_t.values()
        assert torch.equal(torch.stack([col, row]), ref_ei), name
        assert torch.allclose(w, ref_w), name
        assert int(out.dfgnn_max_in_degree) == int(
            torch.bincount(ref_ei[1]).max())
        graph = DFGraph.from_edge_index(out.adj_t)
        assert torch.equal(graph.col.long(), ref_ei[0]) and graph.perm is None


def test_sparse_adj_t_without_self_loops_is_unchanged_and_permutes_attrs():
    base = random_data(10, 30, seed=7)
    base.edge_weight = torch.rand(30, dtype=torch.float64)
    for name, adj_t in _sparse_inputs(base):
        data = Data(x=base.x, adj_t=adj_t)
        out = ToDFGNNFormat()(data)
        assert out.adj_t is adj_t, name
        assert int(out.dfgnn_max_in_degree) == int(
            DFGraph.from_edge_index(adj_t).max_in_degree)
    if SparseTensor is None:
        return
    # Edge attributes stored next to adj_t (ToSparseTensor leaves them in
    # CSR order) follow the self-loop edges.
    data = T.ToSparseTensor(attr='edge_weight')(base.clone())
    ea = data.edge_attr.clone()
    out = ToDFGNNFormat(add_self_loops=True, fill_value=1.0)(data)
    row, col, _ = out.adj_t.coo()
    is_loop = row == col
    assert int(is_loop.sum()) == 10 and out.edge_attr.size(0) == row.numel()
    assert bool((out.edge_attr[is_loop] == 1.0).all())
    assert torch.equal(out.edge_attr[~is_loop],
                       ea[data_loops_removed_mask(base)])


def data_loops_removed_mask(data):
    """Which CSR-sorted edges of `data` (as ToSparseTensor stores them) are
    not self-loops."""
    ei = data.edge_index
    perm = torch.sort(ei[1] * data.num_nodes + ei[0], stable=True)[1]
    ei = ei[:, perm]
    return ei[0] != ei[1]


@pytest.mark.parametrize('how', ['setitem', 'as_tensor', 'add_'])
def test_in_place_change_after_transform_is_stale(how):
    data = ToDFGNNFormat()(random_data(8, 20, seed=8, loops=False))
    graph = DFGraph.from_edge_index(data.edge_index)
    ei = data.edge_index
    if how == 'setitem':
        ei[0, 3] = 1  # keeps dst sorted: only the version check sees it
    elif how == 'as_tensor':
        ei.as_tensor()[0, 3] = 1
    else:
        ei.add_(0)
    with pytest.raises(ValueError, match="stale.*re-apply ToDFGNNFormat"
                       "|stale.*Re-apply ToDFGNNFormat"):
        DFGraph.from_edge_index(data.edge_index)
    with pytest.raises(ValueError, match='stale'):
        graph.check_fresh()
    # Re-applying the transform is the fix.
    data = ToDFGNNFormat()(data)
    DFGraph.from_edge_index(data.edge_index).check_fresh()


def test_copies_are_not_falsely_stale():
    data = ToDFGNNFormat()(random_data(8, 20, seed=9))
    for other in (pickle.loads(pickle.dumps(data)), copy.deepcopy(data),
                  copy.copy(data), data.clone()):
        graph = DFGraph.from_edge_index(other.edge_index)
        assert graph.num_edges == 20
    # The input EdgeIndex is not shared with the output.
    ei = EdgeIndex(torch.tensor([[0, 1], [0, 1]]), sparse_size=(2, 2),
                   sort_order='col')
    data = ToDFGNNFormat()(Data(edge_index=ei, num_nodes=2))
    ei[0, 0] = 1
    assert data.edge_index.tolist() == [[0, 1], [0, 1]]
    DFGraph.from_edge_index(data.edge_index)


@pytest.mark.parametrize('data,err,match', [
    (Data(edge_index=torch.tensor([[0., 1.], [1., 0.]]), num_nodes=2),
     TypeError, "'edge_index'"),
    (Data(edge_index=torch.tensor([0, 1, 1]), num_nodes=2), ValueError,
     r"'edge_index'.*shape"),
    (Data(edge_index=torch.tensor([[0, -1], [1, 0]]), num_nodes=2),
     ValueError, "'edge_index'.*negative"),
    (Data(x=torch.randn(2, 1), edge_index=torch.tensor([[0, 1], [2, 0]])),
     ValueError, "'edge_index'.*out of range"),
    (Data(x=torch.randn(3, 1)), ValueError, "'edge_index' or 'adj_t'"),
    (Data(edge_index=torch.tensor([[0], [1]]), adj_t=torch.eye(2).to_sparse(),
          num_nodes=2), ValueError, 'both'),
    (Data(adj_t=torch.ones(2, 2), num_nodes=2), TypeError, "'adj_t'"),
    (Data(adj_t=torch.ones(2, 3).to_sparse_csr()), ValueError, 'square'),
    (Data(x=torch.randn(3, 1), edge_index=EdgeIndex(
        torch.tensor([[0], [1]]), sparse_size=(2, 2))), ValueError,
     'sparse_size'),
])
def test_bad_input(data, err, match):
    with pytest.raises(err, match=match):
        ToDFGNNFormat()(data)


def test_hetero_data_is_rejected():
    data = HeteroData()
    data['a'].x = torch.randn(3, 2)
    data['a', 'to', 'a'].edge_index = torch.tensor([[0, 1], [1, 2]])
    with pytest.raises(TypeError, match='HeteroData'):
        ToDFGNNFormat()(data)
    with pytest.raises(TypeError, match="'Data'"):
        ToDFGNNFormat()({'edge_index': torch.tensor([[0], [0]])})


# ---------------------------------------------------------------- batching
HEADS, DIM, OUT = 2, 3, 4


def _edge_tensors(edge_attr, lin):
    # Per-edge terms derived from edge features, as a conv with edge_dim does.
    e = edge_attr.size(0)
    proj = edge_attr @ lin  # [E, H*(1 + D + F)]
    score = proj[:, :HEADS]
    key = proj[:, HEADS:HEADS * (1 + DIM)].view(e, HEADS, DIM)
    value = proj[:, HEADS * (1 + DIM):].view(e, HEADS, OUT)
    return score, key, value


def _run(data, kind, params):
    graph = DFGraph.from_edge_index(data.edge_index, num_nodes=data.num_nodes)
    assert graph.perm is None  # the transform put it in CSR order already
    x = data.x
    value = (x @ params['v']).view(-1, HEADS, OUT)
    score, edge_key, edge_value = _edge_tensors(data.edge_attr, params['e'])
    if kind == 'add':
        query, key = x @ params['a_dst'], x @ params['a_src']
        return fused_attention(graph, 'add', value, query, key,
                               edge_score=score, edge_value=edge_value,
                               negative_slope=0.2)
    query = (x @ params['q']).view(-1, HEADS, DIM)
    key = (x @ params['k']).view(-1, HEADS, DIM)
    att = params['att'] if kind == 'gatv2' else None
    return fused_attention(graph, kind, value, query, key, att, scale=0.5,
                           edge_key=edge_key, edge_value=edge_value)


@pytest.mark.parametrize('add_loops', [False, True])
def test_dataloader_batch_equals_per_graph(add_loops):
    transform = ToDFGNNFormat(add_self_loops=add_loops, fill_value='mean')
    sizes = [(7, 25), (1, 0), (12, 60), (3, 0), (20, 45), (1, 1), (5, 30)]
    graphs = [transform(random_data(n, e, seed=10 + i))
              for i, (n, e) in enumerate(sizes)]
    params = _params(0)
    batch = next(iter(DataLoader(graphs, batch_size=len(graphs))))
    assert isinstance(batch.edge_index, EdgeIndex)
    assert batch.edge_index.sort_order == 'col'
    n_total = sum(g.num_nodes for g in graphs)
    assert batch.edge_index.sparse_size() == (n_total, n_total)
    assert batch.dfgnn_max_in_degree.shape == (len(graphs), )
    max_deg = int(batch.dfgnn_max_in_degree.max())
    graph = DFGraph.from_edge_index(batch.edge_index, num_nodes=n_total)
    assert graph.max_in_degree == max_deg
    assert graph.strategy(HEADS) == choose_strategy(max_deg, HEADS)
    for kind in ('dot', 'add', 'gatv2'):
        out = _run(batch, kind, params)
        for i, g in enumerate(graphs):
            lo, hi = int(batch.ptr[i]), int(batch.ptr[i + 1])
            torch.testing.assert_close(out[lo:hi], _run(g, kind, params),
                                       rtol=1e-12, atol=1e-12)
            if g.edge_index.size(1) == 0:
                assert bool((out[lo:hi] == 0).all())
    # Taking one graph back out of the batch keeps the format usable.
    g = batch.get_example(2)
    assert g.edge_index.sort_order == 'col'
    torch.testing.assert_close(_run(g, 'dot', params),
                               _run(graphs[2], 'dot', params))


@pytest.mark.parametrize('add_loops', [False, True])
def test_transformed_batch_stays_separable(add_loops):
    # The transform applied to a collated Batch (e.g. in a training loop):
    # the whole batch runs as one graph, and to_data_list / get_example still
    # give each graph, as the transform gives it per graph.
    transform = ToDFGNNFormat(add_self_loops=add_loops, fill_value='mean')
    sizes = [(7, 25), (1, 0), (12, 60), (3, 0), (20, 45), (1, 1), (5, 30)]
    raw = [random_data(n, e, seed=30 + i) for i, (n, e) in enumerate(sizes)]
    batch = transform(Batch.from_data_list([g.clone() for g in raw]))
    per_graph = [transform(g.clone()) for g in raw]
    assert batch.dfgnn_max_in_degree.tolist() == [
        int(g.dfgnn_max_in_degree) for g in per_graph]
    params = _params(2)
    out = _run(batch, 'dot', params)
    for i, (got, want) in enumerate(zip(batch.to_data_list(), per_graph)):
        assert got.num_nodes == want.num_nodes
        assert torch.equal(got.edge_index.as_tensor(),
                           want.edge_index.as_tensor())
        assert got.edge_index.sparse_size() == want.edge_index.sparse_size()
        assert got.edge_index.sort_order == 'col'
        assert torch.equal(got.edge_attr, want.edge_attr)
        assert int(got.dfgnn_max_in_degree) == int(want.dfgnn_max_in_degree)
        lo, hi = int(batch.ptr[i]), int(batch.ptr[i + 1])
        torch.testing.assert_close(out[lo:hi], _run(got, 'dot', params),
                                   rtol=1e-12, atol=1e-12)
    # ... and batching the separated graphs again gives the same batch.
    again = Batch.from_data_list(batch.to_data_list())
    assert torch.equal(again.edge_index.as_tensor(),
                       batch.edge_index.as_tensor())
    assert torch.equal(again.edge_attr, batch.edge_attr)


def _params(seed=0):
    gen = torch.Generator().manual_seed(seed)
    f64 = dict(generator=gen, dtype=torch.float64)
    return {
        'v': torch.randn(4, HEADS * OUT, **f64),
        'q': torch.randn(4, HEADS * DIM, **f64),
        'k': torch.randn(4, HEADS * DIM, **f64),
        'a_src': torch.randn(4, HEADS, **f64),
        'a_dst': torch.randn(4, HEADS, **f64),
        'att': torch.randn(HEADS, DIM, **f64),
        'e': torch.randn(3, HEADS * (1 + DIM + OUT), **f64),
    }


@pytest.mark.parametrize('kind', ['dot', 'add', 'gatv2'])
def test_transformed_graph_gives_same_output_as_original(kind):
    # Attention is edge-order invariant: the transformed graph (edges and
    # attributes moved together) must give what the raw graph gives through
    # DFGraph.perm.
    data = random_data(15, 70, seed=20, loops=False)
    params = _params(1)
    raw = DFGraph.from_edge_index(data.edge_index, num_nodes=15)
    perm = raw.perm.long()
    x = data.x
    value = (x @ params['v']).view(-1, HEADS, OUT)
    score, edge_key, edge_value = (t[perm] for t in _edge_tensors(
        data.edge_attr, params['e']))
    if kind == 'add':
        want = fused_attention(raw, 'add', value, x @ params['a_dst'],
                               x @ params['a_src'], edge_score=score,
                               edge_value=edge_value, negative_slope=0.2)
    else:
        want = fused_attention(
            raw, kind, value, (x @ params['q']).view(-1, HEADS, DIM),
            (x @ params['k']).view(-1, HEADS, DIM),
            params['att'] if kind == 'gatv2' else None, scale=0.5,
            edge_key=edge_key, edge_value=edge_value)
    out = _run(ToDFGNNFormat()(data.clone()), kind, params)
    torch.testing.assert_close(out, want, rtol=1e-12, atol=1e-12)


def test_reapplying_is_idempotent():
    once = ToDFGNNFormat(add_self_loops=True)(random_data(10, 40, seed=30))
    twice = ToDFGNNFormat(add_self_loops=True)(once.clone())
    assert torch.equal(twice.edge_index.as_tensor(),
                       once.edge_index.as_tensor())
    assert torch.equal(twice.edge_attr, once.edge_attr)
    assert twice.edge_index is not once.edge_index


@pytest.mark.parametrize('layout', ['coo', 'csr'])
def test_sparse_adj_t_with_feature_values(layout):
    # torch.sparse adj_t whose values are edge feature rows ([N, N, D]: the
    # convs take them as edge_attr): N is the sparse part of the shape.
    base = random_data(10, 30, seed=8)
    ref_ei, ref_attr = _coalesced_ref_rows(base, 'mean')
    adj_t = torch_geometric.utils.to_torch_coo_tensor(
        base.edge_index.flip(0), base.edge_attr, size=(10, 10))
    if layout == 'csr':
        adj_t = adj_t.to_sparse_csr()
    out = ToDFGNNFormat()(Data(x=base.x, adj_t=adj_t))
    assert out.adj_t is adj_t
    out = ToDFGNNFormat(add_self_loops=True)(Data(x=base.x, adj_t=adj_t))
    assert out.adj_t.shape == (10, 10, 3)
    coo = out.adj_t.to_sparse_coo().coalesce()
    assert torch.equal(coo.indices().flip(0), ref_ei)
    torch.testing.assert_close(coo.values(), ref_attr)
    with pytest.raises(ValueError, match='3 sparse dimensions'):
        ToDFGNNFormat()(Data(adj_t=torch.zeros(2, 2, 2).to_sparse()))


def _coalesced_ref_rows(data, fill_value):
    """``data``'s edges merged (summing their feature rows, as a sparse
    tensor does), GAT's self-loops added, sorted by (dst, src)."""
    n = data.num_nodes
    key, inv = torch.unique(data.edge_index[1] * n + data.edge_index[0],
                            return_inverse=True)
    rows = torch.zeros(key.numel(), data.edge_attr.size(1),
                       dtype=data.edge_attr.dtype).index_add_(
                           0, inv, data.edge_attr)
    ei = torch.stack([key % n, key // n])
    ei, rows = remove_self_loops(ei, rows)
    ei, rows = add_self_loops(ei, rows, fill_value=fill_value, num_nodes=n)
    perm = torch.sort(ei[1] * n + ei[0])[1]
    return ei[:, perm], rows[perm]


def test_uncoalesced_coo_adj_t_is_coalesced():
    idx = torch.tensor([[1, 0, 1], [0, 1, 0]])  # edge 0 -> 1 twice
    adj_t = torch.sparse_coo_tensor(idx, torch.ones(3), (2, 2))
    out = ToDFGNNFormat()(Data(adj_t=adj_t))
    assert out.adj_t.is_coalesced() and out.adj_t._nnz() == 2
    assert out.adj_t.to_dense().tolist() == [[0., 1.], [2., 0.]]
    with pytest.raises(ValueError, match='uncoalesced'):
        ToDFGNNFormat()(Data(adj_t=adj_t, edge_attr=torch.randn(3, 2)))


def test_inference_mode():
    with torch.inference_mode():
        data = ToDFGNNFormat(add_self_loops=True)(random_data(6, 20, seed=31))
        graph = DFGraph.from_edge_index(data.edge_index)
    assert graph.num_edges == data.edge_index.size(1)
    assert graph.perm is None

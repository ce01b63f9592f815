"""DFGraph: the CSR / CSC format, its permutations, inputs and checks."""
import pytest
import torch
from torch_geometric import EdgeIndex

from pyg_dfgnn import DFGraph
from pyg_dfgnn.dispatch import PMF, SMMF, choose_strategy
from pyg_dfgnn.graph import _index_dtype, to_edge_index

try:
    from torch_sparse import SparseTensor
except ImportError:  # pragma: no cover
    SparseTensor = None


def random_edge_index(n_src, n_dst, e, seed=0):
    gen = torch.Generator().manual_seed(seed)
    return torch.stack([torch.randint(0, n_src, (e, ), generator=gen),
                        torch.randint(0, n_dst, (e, ), generator=gen)])


def sorted_unique(edge_index, n_src):
    """Coalesced: sorted by (dst, src), no duplicates (what sparse layouts
    store)."""
    key = torch.unique(edge_index[1] * n_src + edge_index[0])
    return torch.stack([key % n_src, key // n_src])


def check_invariants(graph, edge_index, n_src, n_dst):
    src, dst = edge_index
    e = src.numel()
    assert graph.num_src == n_src and graph.num_dst == n_dst
    assert graph.num_edges == e
    assert graph.rowptr.dtype == torch.int64
    assert graph.col.dtype == torch.int32
    assert graph.rowptr.shape == (n_dst + 1, ) and int(graph.rowptr[0]) == 0
    assert int(graph.rowptr[-1]) == e
    assert torch.equal(graph.in_degree, torch.bincount(dst, minlength=n_dst))
    want_max = int(graph.in_degree.max()) if n_dst else 0
    assert graph.max_in_degree == want_max
    # perm maps each CSR edge to the input edge it is, in stable order.
    perm = (torch.arange(e) if graph.perm is None else graph.perm.long())
    if graph.perm is not None:
        assert graph.perm.dtype == torch.int32
    assert torch.equal(perm, torch.sort(dst, stable=True)[1])
    assert torch.equal(graph.col.long(), src[perm])
    assert torch.equal(graph.row, dst[perm])
    # CSC: same edges grouped by source, csc_perm points back into CSR order.
    colptr, csc_row, csc_perm = graph.csc()
    assert csc_row.dtype == torch.int32 and csc_perm.dtype == torch.int32
    assert torch.equal(colptr.diff(), torch.bincount(src, minlength=n_src))
    csc_perm = csc_perm.long()
    assert torch.equal(torch.sort(csc_perm)[0], torch.arange(e))
    csc_col = graph.col.long()[csc_perm]
    assert torch.equal(csc_col, torch.repeat_interleave(
        torch.arange(n_src), colptr.diff()))
    assert torch.equal(csc_row.long(), graph.row[csc_perm])
    # Within one source, CSR ids ascend (the backward reads them in order).
    same_src = csc_col[1:] == csc_col[:-1]
    assert bool((csc_perm[1:][same_src] > csc_perm[:-1][same_src]).all())


@pytest.mark.parametrize('n_src,n_dst,e', [(7, 7, 30), (50, 50, 400),
                                           (9, 4, 25), (3, 11, 20),
                                           (100, 100, 5)])
@pytest.mark.parametrize('seed', [0, 1])
def test_invariants_random(n_src, n_dst, e, seed):
    ei = random_edge_index(n_src, n_dst, e, seed)
    size = (n_src, n_dst)
    graph = DFGraph.from_edge_index(ei, size=size)
    check_invariants(graph, ei, n_src, n_dst)
    assert graph.perm is not None  # random edges are not sorted


def test_sorted_input_has_no_perm():
    ei = sorted_unique(random_edge_index(20, 20, 80), 20)
    graph = DFGraph.from_edge_index(ei, num_nodes=20)
    assert graph.perm is None
    check_invariants(graph, ei, 20, 20)


@pytest.mark.parametrize('case', ['empty', 'empty_no_nodes', 'one_node',
                                  'one_node_loop', 'isolated', 'super_node'])
def test_invariants_edge_cases(case):
    n = {'empty': 6, 'empty_no_nodes': 0, 'one_node': 1, 'one_node_loop': 1,
         'isolated': 10, 'super_node': 40}[case]
    if case in ('empty', 'empty_no_nodes', 'one_node'):
        ei = torch.empty(2, 0, dtype=torch.long)
    elif case == 'one_node_loop':
        ei = torch.tensor([[0], [0]])
    elif case == 'isolated':  # Nodes 5..9 have no edges at all.
        ei = random_edge_index(5, 5, 12, seed=3)
    else:  # Every other node points to node 7, plus a few random edges.
        others = torch.tensor([i for i in range(n) if i != 7])
        ei = torch.cat([torch.stack([others, torch.full_like(others, 7)]),
                        random_edge_index(n, n, 15, seed=4)], 1)
        ei = ei[:, torch.randperm(ei.size(1),
                                  generator=torch.Generator().manual_seed(0))]
    graph = DFGraph.from_edge_index(ei, num_nodes=n)
    check_invariants(graph, ei, n, n)
    if case == 'isolated':
        assert bool((graph.in_degree[5:] == 0).all())
    if case == 'super_node':
        assert int(graph.in_degree[7]) >= n - 1
        assert graph.max_in_degree == int(graph.in_degree[7])
    if case.startswith('empty'):
        assert graph.max_in_degree == 0 and graph.row.numel() == 0


def test_strategy_switches_to_pmf_for_super_node():
    # 8 rows of fp32 scores must fit 48 KB: max_in_degree * heads <= 1536.
    assert choose_strategy(1536, 1) == SMMF
    assert choose_strategy(1537, 1) == PMF
    assert choose_strategy(192, 8) == SMMF and choose_strategy(193, 8) == PMF
    assert choose_strategy(0, 1) == SMMF
    small = torch.stack([torch.arange(1, 101), torch.zeros(100).long()])
    assert DFGraph.from_edge_index(small, num_nodes=101).strategy(8) == SMMF
    n = 2000
    star = torch.stack([torch.arange(1, n), torch.zeros(n - 1).long()])
    graph = DFGraph.from_edge_index(star, num_nodes=n)
    assert graph.max_in_degree == n - 1
    assert graph.strategy(1) == PMF and graph.strategy(4) == PMF
    with pytest.raises(ValueError, match='num_heads'):
        choose_strategy(10, 0)


def test_index_dtype_falls_back_to_int64():
    assert _index_dtype(10, 2**31 - 1) == torch.int32
    assert _index_dtype(10, 2**31) == torch.int64
    assert _index_dtype() == torch.int32


def _assert_same_graph(a, b):
    assert torch.equal(a.rowptr, b.rowptr) and torch.equal(a.col, b.col)
    assert (a.num_src, a.num_dst) == (b.num_src, b.num_dst)
    assert (a.perm is None) == (b.perm is None)
    assert a.max_in_degree == b.max_in_degree


@pytest.mark.parametrize('bipartite', [False, True])
def test_input_types_give_identical_graphs(bipartite):
    n_src, n_dst = (30, 12) if bipartite else (25, 25)
    ei = sorted_unique(random_edge_index(n_src, n_dst, 150, seed=5), n_src)
    value = torch.rand(ei.size(1))
    ref = DFGraph.from_edge_index(ei, size=(n_src, n_dst))
    inputs = [
        EdgeIndex(ei, sparse_size=(n_src, n_dst)),
        EdgeIndex(ei, sparse_size=(n_src, n_dst), sort_order='col'),
        torch.sparse_coo_tensor(ei.flip(0), value, (n_dst, n_src)),
        torch.sparse_coo_tensor(ei.flip(0), value,
                                (n_dst, n_src)).to_sparse_csr(),
    ]
    if SparseTensor is not None:
        inputs.append(SparseTensor(row=ei[1], col=ei[0], value=value,
                                   sparse_sizes=(n_dst, n_src)))
        inputs.append(SparseTensor(row=ei[1], col=ei[0],
                                   sparse_sizes=(n_dst, n_src)))
    for adj in inputs:
        _assert_same_graph(DFGraph.from_edge_index(adj), ref)
    # Unsorted inputs: same CSR after sorting, perm maps to input order.
    shuffle = torch.randperm(ei.size(1),
                             generator=torch.Generator().manual_seed(1))
    for adj in (ei[:, shuffle], EdgeIndex(ei[:, shuffle],
                                          sparse_size=(n_src, n_dst))):
        graph = DFGraph.from_edge_index(adj, size=(n_src, n_dst))
        assert torch.equal(graph.rowptr, ref.rowptr)
        assert torch.equal(graph.perm.long(), torch.sort(
            ei[1, shuffle], stable=True)[1])


def test_uncoalesced_coo_keeps_multi_edges():
    idx = torch.tensor([[2, 0, 2, 1], [1, 1, 1, 0]])  # (dst, src), (2,1) twice
    adj = torch.sparse_coo_tensor(idx, torch.ones(4), (3, 2))
    graph = DFGraph.from_edge_index(adj)
    assert graph.num_edges == 4 and (graph.num_src, graph.num_dst) == (2, 3)
    assert graph.in_degree.tolist() == [1, 1, 2]
    assert torch.equal(graph.col.long(), idx[1][graph.perm.long()])


def test_to_edge_index_conventions():
    ei = torch.tensor([[0, 1, 2], [1, 2, 0]])
    assert to_edge_index(ei)[1] == (3, 3)
    assert to_edge_index(ei, size=(5, 4))[1] == (5, 4)
    if SparseTensor is not None:  # adj_t[i, j]: edge j -> i
        adj_t = SparseTensor(row=torch.tensor([1]), col=torch.tensor([0]),
                             sparse_sizes=(2, 3))
        out, size = to_edge_index(adj_t)
        assert out.tolist() == [[0], [1]] and size == (3, 2)


@pytest.mark.parametrize('bad,err,match', [
    (torch.tensor([[0., 1.], [1., 0.]]), TypeError, "'edge_index'.*integer"),
    (torch.tensor([[True], [False]]), TypeError, "'edge_index'.*integer"),
    (torch.tensor([0, 1, 2]), ValueError, r"'edge_index'.*shape \[2, num_e"),
    (torch.zeros(3, 4, dtype=torch.long), ValueError, r"'edge_index'.*shape"),
    (torch.tensor([[0, -1], [1, 0]]), ValueError, "'edge_index'.*negative"),
    (torch.tensor([[0, 1], [1, 5]]), ValueError, "'edge_index'.*out of range"),
    ([[0, 1], [1, 0]], TypeError, "'edge_index' must be a Tensor"),
])
def test_bad_input(bad, err, match):
    with pytest.raises(err, match=match):
        DFGraph.from_edge_index(bad, num_nodes=3)


def test_node_index_errors_are_also_pyg_index_errors():
    # PyG's convs raise IndexError for these: code catching it still does.
    from pyg_dfgnn.nn import DFGATConv
    conv, x = DFGATConv(2, 2), torch.randn(3, 2)
    for ei in (torch.tensor([[0, -1], [1, 0]]),
               torch.tensor([[0, 1], [1, 5]])):
        with pytest.raises(IndexError):
            DFGraph.from_edge_index(ei, num_nodes=3)
        with pytest.raises(IndexError):
            conv(x, ei)


@pytest.mark.parametrize('sorted_input', [True, False])
def test_strided_edge_index(sorted_input):
    # Rows of a transposed [E, 2] tensor are strided views: the CSR must be
    # built from their values, not their memory (PyTorch's CPU coo -> csr
    # ignores strides, reading and writing out of bounds).
    pairs = torch.tensor([[2, 0], [0, 1], [1, 1], [1, 3], [3, 3]])
    if not sorted_input:
        pairs = pairs.flip(0)
    ei = pairs.t()
    assert not ei[1].is_contiguous()
    got = DFGraph.from_edge_index(ei, num_nodes=4)
    want = DFGraph.from_edge_index(ei.contiguous(), num_nodes=4)
    for a, b in ((got.rowptr, want.rowptr), (got.col, want.col)):
        assert torch.equal(a, b) and a.is_contiguous()
    assert got.rowptr.tolist() == [0, 1, 3, 3, 5]
    # one huge sparse bipartite block: out-of-bounds writes crashed here
    src = torch.randint(0, 100000, (2000, ))
    dst = torch.sort(torch.randint(0, 2, (2000, )))[0]
    g = DFGraph.from_edge_index(torch.stack([src, dst], 1).t(),
                                size=(100000, 2))
    assert g.rowptr.tolist() == [0, int((dst == 0).sum()), 2000]
    assert torch.equal(g.col.long(), src)


def test_pickle_round_trip():
    import pickle
    ei = torch.tensor([[0, 1, 2, 2], [1, 2, 0, 1]])
    graph = DFGraph.from_edge_index(ei, num_nodes=3)
    graph.csc()
    for copy in (pickle.loads(pickle.dumps(graph)), _torch_round_trip(graph)):
        assert torch.equal(copy.rowptr, graph.rowptr)
        assert torch.equal(copy.col, graph.col)
        assert torch.equal(copy.perm, graph.perm)
        assert all(torch.equal(a, b) for a, b in zip(copy.csc(),
                                                     graph.csc()))
        copy.check_fresh()  # stands alone: no link to ei
    ei[0, 0] = 2  # the original still sees its source change
    with pytest.raises(ValueError, match='stale'):
        graph.check_fresh()


def _torch_round_trip(obj):
    import io
    buf = io.BytesIO()
    torch.save(obj, buf)
    buf.seek(0)
    return torch.load(buf, weights_only=False)


def test_bad_sizes():
    ei = torch.tensor([[0, 1], [1, 2]])
    with pytest.raises(ValueError, match='source'):
        DFGraph.from_edge_index(ei, size=(1, 3))
    with pytest.raises(ValueError, match='destination'):
        DFGraph.from_edge_index(ei, size=(3, 2))
    with pytest.raises(ValueError, match='EdgeIndex of sparse_size'):
        DFGraph.from_edge_index(EdgeIndex(ei, sparse_size=(3, 3)),
                                num_nodes=4)
    adj_t = torch.sparse_coo_tensor(ei.flip(0), torch.ones(2), (3, 2))
    with pytest.raises(ValueError, match=r'sparse_size.*\(2, 3\)'):
        DFGraph.from_edge_index(adj_t, num_nodes=3)
    if SparseTensor is not None:
        with pytest.raises(ValueError, match='SparseTensor of sparse_size'):
            DFGraph.from_edge_index(SparseTensor.from_torch_sparse_coo_tensor(
                adj_t), size=(3, 3))


def test_edge_index_claiming_col_order_but_unsorted():
    ei = EdgeIndex(torch.tensor([[0, 1, 2], [0, 1, 2]]), sparse_size=(3, 3),
                   sort_order='col')
    DFGraph.from_edge_index(ei)
    ei.as_tensor()[1, 0] = 2  # bypasses EdgeIndex's metadata
    assert ei.is_sorted_by_col
    with pytest.raises(ValueError, match="sort_order='col'.*not sorted"):
        DFGraph.from_edge_index(ei)


@pytest.mark.parametrize('kind', ['tensor', 'edge_index_setitem',
                                  'edge_index_as_tensor', 'csr', 'sparse'])
def test_check_fresh_after_in_place_change(kind):
    ei = torch.tensor([[0, 1, 2], [1, 2, 0]])
    if kind == 'tensor':
        adj = ei
    elif kind.startswith('edge_index'):
        adj = EdgeIndex(ei.clone(), sparse_size=(3, 3))
    elif kind == 'csr':
        adj = torch.sparse_coo_tensor(ei.flip(0), torch.ones(3),
                                      (3, 3)).to_sparse_csr()
    else:
        if SparseTensor is None:
            pytest.skip('torch_sparse not installed')
        adj = SparseTensor(row=ei[1], col=ei[0], sparse_sizes=(3, 3))
    graph = DFGraph.from_edge_index(adj)
    graph.check_fresh()
    assert graph.is_built_from(adj)
    assert not graph.is_built_from(ei.clone())
    if kind == 'tensor':
        adj[0, 0] = 2
    elif kind == 'edge_index_setitem':
        adj[0, 0] = 2
    elif kind == 'edge_index_as_tensor':
        adj.as_tensor()[0, 0] = 2
    elif kind == 'csr':
        adj.col_indices()[0] = 2
    else:
        adj.storage.col()[0] = 2
    with pytest.raises(ValueError, match='stale'):
        graph.check_fresh()
    assert not graph.is_built_from(adj)


def test_to_same_device_and_repr():
    graph = DFGraph.from_edge_index(torch.tensor([[0, 1], [1, 0]]))
    assert graph.to('cpu') is graph and graph.cpu() is graph
    assert 'num_edges=2' in repr(graph) and 'max_in_degree=1' in repr(graph)
    with pytest.raises(ValueError, match='another graph'):
        graph.check_sizes(3, 2)
    graph.check_sizes(2, 2)


@pytest.mark.cuda
@pytest.mark.skipif(not torch.cuda.is_available(), reason='needs CUDA')
def test_cuda_build_equals_cpu_build():
    ei = random_edge_index(300, 200, 3000, seed=9)
    cpu = DFGraph.from_edge_index(ei, size=(300, 200))
    cpu.csc()
    for graph in (DFGraph.from_edge_index(ei.cuda(), size=(300, 200)),
                  cpu.to('cuda')):
        assert graph.device.type == 'cuda'
        assert graph.max_in_degree == cpu.max_in_degree
        for a, b in zip((graph.rowptr, graph.col, graph.perm) + graph.csc(),
                        (cpu.rowptr, cpu.col, cpu.perm) + cpu.csc()):
            assert a.is_cuda and a.dtype == b.dtype
            assert torch.equal(a.cpu(), b)


def test_sparse_tensor_lazy_fields_do_not_make_graph_stale():
    if SparseTensor is None:
        pytest.skip('torch_sparse not installed')
    ei = torch.tensor([[0, 1, 2], [1, 2, 0]])
    for adj in (SparseTensor(row=ei[1], col=ei[0], sparse_sizes=(3, 3)),
                SparseTensor(rowptr=torch.tensor([0, 1, 2, 3]), col=ei[0],
                             sparse_sizes=(3, 3))):
        graph = DFGraph.from_edge_index(adj)
        adj.storage.row(), adj.storage.rowptr()
        adj.fill_cache_()
        graph.check_fresh()
        assert graph.is_built_from(adj)


def test_inference_mode_inputs():
    # Inference tensors have no version counter: built, just not tracked.
    with torch.inference_mode():
        ei = torch.tensor([[0, 1, 2], [2, 0, 1]])
        graph = DFGraph.from_edge_index(ei)
        graph.check_fresh()
        assert not graph.is_built_from(ei)
        check_invariants(graph, ei, 3, 3)


def _batch_edge_index(sizes, deg, seed=0):
    g = torch.Generator().manual_seed(seed)
    parts, off = [], 0
    for n in sizes:
        e = n * deg
        src = torch.randint(0, n, (e, ), generator=g) + off
        dst = torch.randint(0, n, (e, ), generator=g) + off
        parts.append(torch.stack([src, dst]))
        off += n
    return torch.cat(parts, 1), off


def _check_windows(graph, windows, span, which='row'):
    """Windows tile the owners (destinations for 'row', sources for 'col'),
    none longer than max_window_rows, and ``span`` is the most neighbour
    nodes any window reads."""
    if which == 'row':
        ptr, nbr, n = graph.rowptr, graph.col, graph.num_dst
    else:
        ptr, nbr, _ = graph.csc()
        n = graph.num_src
    assert windows.dtype == torch.int64
    assert windows[0] == 0 and windows[-1] == n
    assert bool((windows.diff() > 0).all())
    assert int(windows.diff().max()) <= DFGraph.max_window_rows
    widest = 0
    for a, b in zip(windows[:-1].tolist(), windows[1:].tolist()):
        read = nbr[ptr[a]:ptr[b]].long()
        if read.numel():
            widest = max(widest, int(read.max() - read.min()) + 1)
    assert widest == span


def test_row_windows_follow_the_graphs_of_a_batch():
    sizes = [30, 5, 7, 40, 12, 3, 64, 20]
    ei, n = _batch_edge_index(sizes, 4)
    graph = DFGraph.from_edge_index(ei, num_nodes=n)
    bounds = set(torch.tensor([0] + sizes).cumsum(0).tolist())
    # no packing: one window per graph (isolated rows may cut further)
    windows, span = graph.row_windows(1000, pack_rows=1)
    _check_windows(graph, windows, span)
    assert span <= max(sizes)
    assert bounds <= set(windows.tolist())  # every graph boundary cuts
    # packed: windows are unions of whole graphs, opened once per 64 rows
    windows, span = graph.row_windows(1000, pack_rows=64)
    _check_windows(graph, windows, span)
    assert set(windows.tolist()) <= bounds | set(
        graph.rowptr.diff().eq(0).nonzero().view(-1).tolist())
    assert windows.numel() - 1 < len(sizes)
    # too few sources allowed per window: no windows at all
    assert graph.row_windows(10) == (None, 0)


def test_row_windows_none_without_structure_and_split_long_windows():
    g = torch.Generator().manual_seed(1)
    ei = torch.randint(0, 300, (2, 3000), generator=g)
    graph = DFGraph.from_edge_index(ei, num_nodes=300)
    assert graph.row_windows(10_000) == (None, 0)
    empty = DFGraph.from_edge_index(torch.empty(2, 0, dtype=torch.long),
                                    num_nodes=5)
    assert empty.row_windows(100) == (None, 0)
    # two blocks of 1000 destinations reading 4 sources each: windows are
    # split at max_window_rows so that no block serialises 1000 rows
    dst = torch.arange(2000)
    src = torch.where(dst < 1000, dst % 4, 1000 + dst % 4)
    graph = DFGraph.from_edge_index(torch.stack([src, dst]), num_nodes=2000)
    windows, span = graph.row_windows(100)
    _check_windows(graph, windows, span)
    assert span == 4 and 1000 in windows.tolist()
    assert windows.numel() - 1 == 2 * -(-1000 // DFGraph.max_window_rows)


def test_col_windows_follow_the_graphs_of_a_batch():
    sizes = [30, 5, 7, 40, 12, 3, 64, 20]
    ei, n = _batch_edge_index(sizes, 4, seed=2)
    graph = DFGraph.from_edge_index(ei, num_nodes=n)
    bounds = set(torch.tensor([0] + sizes).cumsum(0).tolist())
    no_out_edges = set(graph.csc()[0].diff().eq(0).nonzero().view(-1).tolist())
    # no packing: one window per graph of sources (isolated ones may cut)
    windows, span = graph.col_windows(1000, pack_rows=1)
    _check_windows(graph, windows, span, 'col')
    assert span <= max(sizes)
    assert bounds <= set(windows.tolist())
    # packed: unions of whole graphs, opened once per 64 sources
    windows, span = graph.col_windows(1000, pack_rows=64)
    _check_windows(graph, windows, span, 'col')
    assert set(windows.tolist()) <= bounds | no_out_edges
    assert windows.numel() - 1 < len(sizes)
    # cached (one build), and the row windows' cache is a different entry
    assert graph.col_windows(1000, pack_rows=64)[0] is windows
    assert graph.row_windows(1000, pack_rows=64)[0] is not windows
    assert graph.col_windows(10) == (None, 0)


def test_col_windows_do_not_cut_across_an_edge():
    # three blocks of 50 nodes; source 70 (block 1) also feeds destination 10
    # (block 0): the source cut at 50 is gone, the one at 100 stays.
    ei, n = _batch_edge_index([50, 50, 50], 6, seed=3)
    ei = torch.cat([ei, torch.tensor([[70], [10]])], 1)
    graph = DFGraph.from_edge_index(ei, num_nodes=n)
    windows, span = graph.col_windows(1000, pack_rows=1)
    _check_windows(graph, windows, span, 'col')
    assert 100 in windows.tolist() and 50 not in windows.tolist()
    assert span >= 61  # the window of source 70 reads destinations 10..70
    assert graph.col_windows(60, pack_rows=1) == (None, 0)


def test_col_windows_none_for_empty_and_single_node_graphs():
    empty = DFGraph.from_edge_index(torch.empty(2, 0, dtype=torch.long),
                                    num_nodes=5)
    assert empty.col_windows(100) == (None, 0)
    single = DFGraph.from_edge_index(torch.tensor([[0], [0]]), num_nodes=1)
    assert single.col_windows(100) == (None, 0)
    g = torch.Generator().manual_seed(1)
    ei = torch.randint(0, 300, (2, 3000), generator=g)
    dense = DFGraph.from_edge_index(ei, num_nodes=300)
    assert dense.col_windows(10_000) == (None, 0)  # no cut anywhere


def test_col_windows_bipartite():
    # 5 blocks: 40 sources each feeding 12 destinations each
    g = torch.Generator().manual_seed(4)
    blocks = torch.arange(5).repeat_interleave(200)
    src = blocks * 40 + torch.randint(0, 40, (1000, ), generator=g)
    dst = blocks * 12 + torch.randint(0, 12, (1000, ), generator=g)
    graph = DFGraph.from_edge_index(torch.stack([src, dst]), size=(200, 60))
    windows, span = graph.col_windows(1000, pack_rows=1)
    _check_windows(graph, windows, span, 'col')
    assert {0, 40, 80, 120, 160, 200} <= set(windows.tolist())
    assert span <= 12
    rows, row_span = graph.row_windows(1000, pack_rows=1)
    _check_windows(graph, rows, row_span, 'row')
    assert rows[-1] == 60 and row_span <= 40


def test_col_windows_equal_row_windows_on_a_symmetric_batch():
    ei, n = _batch_edge_index([30, 5, 7, 40, 12, 3, 64, 20], 3, seed=5)
    ei = torch.cat([ei, ei.flip(0)], 1)
    graph = DFGraph.from_edge_index(ei, num_nodes=n)
    for max_nodes, pack in ((1000, 64), (1000, 1), (64, 64), (63, 1)):
        rows, row_span = graph.row_windows(max_nodes, pack)
        cols, col_span = graph.col_windows(max_nodes, pack)
        assert row_span == col_span
        if max_nodes >= 64:  # the largest graph fits: windowed
            assert rows is not None and torch.equal(rows, cols)
        else:
            assert rows is None and cols is None


def test_csc_index_dtype_follows_the_edge_count():
    # csc_perm holds CSR edge ids: past int32 it and csc_row are int64 even
    # if col is int32 (the edge count is faked: a real one would not fit).
    class HugeGraph(DFGraph):
        num_edges = 2**31

    ei = random_edge_index(6, 6, 20)
    small = DFGraph.from_edge_index(ei, num_nodes=6)
    huge = HugeGraph(small.rowptr, small.col, 6)
    huge._row = small.row
    assert huge.col.dtype == torch.int32
    colptr, csc_row, csc_perm = huge.csc()
    assert csc_row.dtype == csc_perm.dtype == torch.int64
    want = small.csc()
    assert torch.equal(colptr, want[0])
    assert torch.equal(csc_row, want[1].long())
    assert torch.equal(csc_perm, want[2].long())


def test_graph_windows_need_a_square_graph():
    """graph_windows serve as the column windows too: a bipartite graph
    given them would send the backward's cols pass past its sources."""
    ei = torch.tensor([[0, 1, 2], [0, 3, 5]])
    base = DFGraph.from_edge_index(ei, size=(3, 6))
    with pytest.raises(ValueError, match='graph_windows'):
        DFGraph(base.rowptr, base.col, base.num_src,
                graph_windows=(torch.tensor([0, 6]), 3))
    square = DFGraph.from_edge_index(ei, num_nodes=6)
    graph = DFGraph(square.rowptr, square.col, 6,
                    graph_windows=(torch.tensor([0, 6]), 6))
    assert graph.col_windows(64)[1] == 6

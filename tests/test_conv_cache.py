"""The shared graph cache of the DF-GNN convs: one build per graph across
layers, instances and calls; never a stale graph."""
import gc
import weakref

import pytest
import torch
from conv_helpers import make_pair, random_graph, run_both
from torch_geometric import EdgeIndex
from torch_geometric.typing import WITH_TORCH_SPARSE, SparseTensor

import pyg_dfgnn.nn.conv.utils as conv_utils
from pyg_dfgnn import DFGraph
from pyg_dfgnn.nn import (
    DFAGNNConv,
    DFGATConv,
    DFGATv2Conv,
    DFTransformerConv,
    clear_graph_cache,
    graph_cache_info,
)

N, F_IN, C = 9, 6, 4


@pytest.fixture(autouse=True)
def _fresh_cache():
    clear_graph_cache()
    yield
    clear_graph_cache()


def _x(n=N, f=F_IN, seed=0):
    return torch.randn(n, f, generator=torch.Generator().manual_seed(seed))


class DeepGAT(torch.nn.Module):
    def __init__(self, layers=10):
        super().__init__()
        self.convs = torch.nn.ModuleList(
            [DFGATConv(F_IN, F_IN // 2, heads=2) for _ in range(layers)])

    def forward(self, x, edge_index):
        for conv in self.convs:
            x = conv(x, edge_index).relu()
        return x


def test_ten_layers_build_once_per_graph():
    model = DeepGAT(10)
    ei = random_graph(N, N, 30, 1)
    model(_x(), ei)
    assert graph_cache_info() == dict(builds=1, hits=9, size=1)
    model(_x(seed=1), ei).sum().backward()  # training step: still cached
    assert graph_cache_info()['builds'] == 1
    # a new batch (new tensor) builds once more
    model(_x(), random_graph(N, N, 30, 2))
    assert graph_cache_info()['builds'] == 2


def test_builds_counted_at_the_graph_constructor(monkeypatch):
    calls = []
    real = DFGraph.from_edge_index.__func__

    def counting(cls, *args, **kwargs):
        calls.append(1)
        return real(cls, *args, **kwargs)
    monkeypatch.setattr(DFGraph, 'from_edge_index', classmethod(counting))
    convs = [DFGATConv(F_IN, C), DFGATv2Conv(F_IN, C), DFAGNNConv()]
    ei = random_graph(N, N, 20, 1)
    for _ in range(3):
        for conv in convs:
            conv(_x(), ei)
    assert len(calls) == 1  # same self-loop config and sizes: shared


def test_configurations_are_cached_separately():
    ei = random_graph(N, N, 20, 1)
    DFGATConv(F_IN, C)(_x(), ei)  # build 1: self-loops on N nodes
    DFTransformerConv(F_IN, C)(_x(), ei)  # build 2: no self-loops
    DFGATConv(F_IN, C, add_self_loops=False)(_x(), ei)  # shares build 2
    DFAGNNConv()(_x(), ei)  # shares build 1
    DFGATConv(F_IN, C)(_x(N + 2), ei)  # build 3: N + 2 nodes
    assert graph_cache_info() == dict(builds=3, hits=2, size=3)


@pytest.mark.parametrize('name', ['gat', 'gatv2', 'transformer', 'agnn'])
@pytest.mark.parametrize('how', ['setitem', 'copy_', 'sort'])
def test_in_place_modification_rebuilds(name, how):
    args = () if name == 'agnn' else (F_IN, C)
    pyg, df = make_pair(name, *args)
    ei = random_graph(N, N, 20, 1)
    x = _x()
    run_both(pyg, df, dict(x=x), lambda conv, t, _: conv(t['x'], ei))
    if how == 'setitem':
        ei[0, :5] = torch.arange(5)
        ei[1, :5] = 8
    elif how == 'copy_':
        ei.copy_(random_graph(N, N, 20, 7))
    else:
        ei[1] = ei[1].sort().values.clone()
    run_both(pyg, df, dict(x=x), lambda conv, t, _: conv(t['x'], ei))
    assert graph_cache_info()['builds'] == 2


def test_in_place_modification_of_edge_index_wrapper():
    pyg, df = make_pair('gat', F_IN, C)
    plain = random_graph(N, N, 20, 1)
    ei = EdgeIndex(plain.clone(), sparse_size=(N, N))
    run_both(pyg, df, dict(x=_x()), lambda conv, t, _: conv(t['x'], ei))
    ei.as_tensor()[0, 0] = (ei.as_tensor()[0, 0] + 3) % N
    run_both(pyg, df, dict(x=_x()), lambda conv, t, _: conv(t['x'], ei))
    assert graph_cache_info()['builds'] == 2


@pytest.mark.parametrize('name', ['gat', 'gatv2', 'transformer'])
def test_edge_attr_recomputed_per_call(name):
    """The structure (keep mask, permutation) is cached, the filled
    self-loop features depend on the values and are recomputed."""
    pyg, df = make_pair(name, F_IN, C, heads=2, edge_dim=3)
    ei = random_graph(N, N, 20, 1)
    for seed in range(3):
        ea = torch.randn(20, 3, generator=torch.Generator().manual_seed(seed))
        run_both(pyg, df, dict(x=_x(), ea=ea),
                 lambda conv, t, _: conv(t['x'], ei, t['ea'],
                                         return_attention_weights=True))
        ea.mul_(2.0)  # in-place change of edge_attr: nothing cached on it
        run_both(pyg, df, dict(x=_x(), ea=ea),
                 lambda conv, t, _: conv(t['x'], ei, t['ea']))
    assert graph_cache_info()['builds'] == 1


@pytest.mark.parametrize('fmt', ['edge_index', 'sparse_tensor', 'coo', 'csr'])
def test_other_formats_cached(fmt):
    ei = random_graph(N, N, 20, 1)
    ei = torch.unique(ei, dim=1).contiguous()
    if fmt == 'edge_index':
        adj = EdgeIndex(ei, sparse_size=(N, N))
    elif fmt == 'sparse_tensor':
        if not WITH_TORCH_SPARSE:
            pytest.skip('needs torch_sparse')
        adj = SparseTensor(row=ei[1], col=ei[0], sparse_sizes=(N, N))
    else:
        adj = torch.sparse_coo_tensor(ei.flip(0), torch.ones(ei.size(1)),
                                      (N, N)).coalesce()
        if fmt == 'csr':
            adj = adj.to_sparse_csr()
    conv = DFGATConv(F_IN, C)
    for _ in range(4):
        conv(_x(), adj)
    assert graph_cache_info()['builds'] == 1
    assert graph_cache_info()['hits'] == 3


def test_cache_holds_no_strong_reference_and_evicts():
    for loops in (True, False):
        conv = DFGATConv(F_IN, C, add_self_loops=loops)
        ei = random_graph(N, N, 20, 1)
        ref = weakref.ref(ei)
        out, (ei_ret, _) = conv(_x(), ei, return_attention_weights=True)
        del ei_ret, out
        assert graph_cache_info()['size'] == 1
        del ei
        gc.collect()
        assert ref() is None
        assert graph_cache_info()['size'] == 0


def test_cache_is_bounded(monkeypatch):
    monkeypatch.setattr(conv_utils, 'MAX_CACHED_GRAPHS', 4)
    conv = DFAGNNConv()
    graphs = [random_graph(N, N, 10, s) for s in range(7)]
    for g in graphs:
        conv(_x(), g)
    assert graph_cache_info()['size'] == 4
    conv(_x(), graphs[-1])  # most recent stays
    assert graph_cache_info()['builds'] == 7
    conv(_x(), graphs[0])  # oldest was dropped
    assert graph_cache_info()['builds'] == 8


def test_same_id_after_free_is_not_served():
    """A new tensor reusing a freed tensor's id (and maybe its memory) must
    not hit the old entry."""
    pyg, df = make_pair('gat', F_IN, C)
    x = _x()
    for seed in range(5):
        ei = random_graph(N, N, 20, seed)
        run_both(pyg, df, dict(x=x), lambda conv, t, _: conv(t['x'], ei))
        del ei
    assert graph_cache_info()['builds'] == 5


def test_prebuilt_graph_skips_the_cache():
    graph = DFGraph.from_edge_index(random_graph(N, N, 20, 1), num_nodes=N)
    conv = DFTransformerConv(F_IN, C)
    conv(_x(), graph)
    conv(_x(), graph.to('cpu'))
    assert graph_cache_info()['builds'] == 0


def test_stale_prebuilt_graph_is_refused():
    ei = random_graph(N, N, 20, 1)
    graph = DFGraph.from_edge_index(ei, num_nodes=N)
    ei[0, 0] = (ei[0, 0] + 1) % N
    with pytest.raises(ValueError, match='stale'):
        DFGATConv(F_IN, C)(_x(), graph)


def test_returned_edge_index_modified_in_place_is_not_reused():
    pyg, df = make_pair('gat', F_IN, C)
    ei = random_graph(N, N, 20, 1)
    x = _x()
    _, (ei_ret, _) = df(x, ei, return_attention_weights=True)
    ei_ret.fill_(0)  # the user scribbles on what they got back
    res_p, res_d = run_both(
        pyg, df, dict(x=x),
        lambda conv, t, _: conv(t['x'], ei, return_attention_weights=True))
    assert torch.equal(res_d[1][0], res_p[1][0])
    assert graph_cache_info()['builds'] == 1


def test_torch_compile_keeps_the_cache_semantics():
    """The cache is never traced: a compiled conv still builds once and
    rebuilds after an in-place change."""
    pyg, df = make_pair('gat', F_IN, C, heads=2, edge_dim=3)
    compiled = torch.compile(df, backend='eager')  # dynamo is what matters
    ei = random_graph(N, N, 20, 1)
    ea = torch.randn(20, 3)
    for _ in range(2):
        torch.testing.assert_close(compiled(_x(), ei, ea), pyg(_x(), ei, ea))
    assert graph_cache_info()['builds'] == 1
    ei[0, :3] = torch.tensor([4, 5, 6])
    torch.testing.assert_close(compiled(_x(), ei, ea), pyg(_x(), ei, ea))
    assert graph_cache_info()['builds'] == 2


def test_returned_edge_index_of_prebuilt_graph_modified_in_place():
    # Regression: with a DFGraph as input, the edge_index returned with the
    # attention weights was one cached tensor; a user's in-place edit of it
    # showed up in every later return.
    ei = random_graph(N, N, 20, 1)
    graph = DFGraph.from_edge_index(ei, num_nodes=N)
    df = DFGATConv(F_IN, C, add_self_loops=False)
    x = _x()
    _, (ei_ret, _) = df(x, graph, return_attention_weights=True)
    assert torch.equal(ei_ret, ei)
    ei_ret.fill_(0)  # the user scribbles on what they got back
    _, (ei_ret2, alpha) = df(x, graph, return_attention_weights=True)
    assert torch.equal(ei_ret2, ei)
    assert alpha.size(0) == ei.size(1)

"""The four DF-GNN convs against their PyG counterparts (CPU): outputs,
attention weights and gradients with copied weights, state_dict both ways,
every input format, edge cases and bad input."""
import itertools

import pytest
import torch
from conv_helpers import PAIRS, make_pair, random_graph, run_both
from torch_geometric import EdgeIndex
from torch_geometric.typing import WITH_TORCH_SPARSE, SparseTensor
from torch_geometric.utils import add_self_loops, coalesce, remove_self_loops

from pyg_dfgnn import DFGraph
from pyg_dfgnn.nn import (
    DFAGNNConv,
    DFGATConv,
    DFGATv2Conv,
    DFTransformerConv,
    clear_graph_cache,
    graph_cache_info,
)

N, F_IN, C = 7, 5, 4


def _features(n, f, seed):
    return torch.randn(n, f, generator=torch.Generator().manual_seed(seed))


def _call(x_keys=('x', ), ei='ei', ea=None, **kw):
    """A `call` for run_both: conv(x, edge_index, [edge_attr], **kw)."""
    def call(conv, t, is_df):
        x = t[x_keys[0]] if len(x_keys) == 1 else tuple(
            None if k is None else t[k] for k in x_keys)
        args = [x, t[ei]]
        if ea is not None:
            args.append(t[ea])
        return conv(*args, **kw)
    return call


# --------------------------------------------------------------- parameters
@pytest.mark.parametrize('name', ['gat', 'gatv2', 'transformer', 'agnn'])
def test_same_init_and_state_dict_both_ways(name):
    kwargs = {} if name == 'agnn' else dict(heads=3)
    args = () if name == 'agnn' else (F_IN, C)
    pyg_cls, df_cls = PAIRS[name]
    torch.manual_seed(12)
    pyg = pyg_cls(*args, **kwargs)
    torch.manual_seed(12)
    df = df_cls(*args, **kwargs)
    sd_p, sd_d = pyg.state_dict(), df.state_dict()
    assert list(sd_p) == list(sd_d)
    for k in sd_p:  # identical initialisation, not just shapes
        assert torch.equal(sd_p[k], sd_d[k]), k
    assert [n for n, _ in pyg.named_parameters()] == \
        [n for n, _ in df.named_parameters()]
    # reset_parameters draws the same numbers too
    torch.manual_seed(3)
    pyg.reset_parameters()
    torch.manual_seed(3)
    df.reset_parameters()
    for k, v in pyg.state_dict().items():
        assert torch.equal(v, df.state_dict()[k]), k
    other = df_cls(*args, **kwargs)
    other.load_state_dict(sd_p, strict=True)
    fresh = pyg_cls(*args, **kwargs)
    fresh.load_state_dict(other.state_dict(), strict=True)
    for k, v in fresh.state_dict().items():
        assert torch.equal(v, sd_p[k])
    assert repr(df).replace('DF', '') == repr(pyg)


@pytest.mark.parametrize('name,kwargs', [
    ('gat', dict(heads=2, edge_dim=3, residual=True, bias=False)),
    ('gat', dict(in_channels=(3, 5), out_channels=2, concat=False)),
    ('gatv2', dict(heads=2, edge_dim=3, share_weights=True, residual=True)),
    ('gatv2', dict(in_channels=(3, 5), out_channels=2, bias=False)),
    ('transformer', dict(heads=2, edge_dim=3, beta=True)),
    ('transformer', dict(concat=False, beta=True, bias=False)),
    ('transformer', dict(root_weight=False, beta=True)),
    ('agnn', dict(requires_grad=False)),
])
def test_state_dict_variants(name, kwargs):
    kwargs = dict(kwargs)
    args = ()
    if name != 'agnn':
        args = (kwargs.pop('in_channels', F_IN), kwargs.pop('out_channels', C))
    pyg_cls, df_cls = PAIRS[name]
    pyg, df = pyg_cls(*args, **kwargs), df_cls(*args, **kwargs)
    df.load_state_dict(pyg.state_dict(), strict=True)
    pyg.load_state_dict(df.state_dict(), strict=True)
    assert {k: v.shape for k, v in pyg.state_dict().items()} == \
        {k: v.shape for k, v in df.state_dict().items()}
    for attr in ('heads', 'concat', 'dropout', 'edge_dim', 'beta',
                 'root_weight', 'share_weights', 'residual', 'fill_value',
                 'add_self_loops', 'negative_slope', 'requires_grad'):
        if hasattr(pyg, attr) and not isinstance(getattr(pyg, attr),
                                                 torch.Tensor):
            assert getattr(df, attr) == getattr(pyg, attr), attr


# --------------------------------------------------------- GAT / GATv2 grid
GRID = list(itertools.product(
    ['gat', 'gatv2'],  # conv
    [1, 3],  # heads
    [True, False],  # concat
    [True, False],  # add_self_loops
    [None, 2],  # edge_dim
    [(False, True), (True, False)],  # (bias, residual)
))


@pytest.mark.parametrize('name,heads,concat,loops,edge_dim,bias_res', GRID)
def test_gat_family_grid(name, heads, concat, loops, edge_dim, bias_res):
    bias, residual = bias_res
    torch.manual_seed(heads * 7 + edge_dim if edge_dim else heads)
    pyg, df = make_pair(name, F_IN, C, heads=heads, concat=concat,
                        add_self_loops=loops, edge_dim=edge_dim, bias=bias,
                        residual=residual)
    leaves = dict(x=_features(N, F_IN, 1), ei=random_graph(N, N, 20, 2))
    if edge_dim:
        leaves['ea'] = _features(20, edge_dim, 3)
    res_p, res_d = run_both(
        pyg, df, leaves,
        _call(ea='ea' if edge_dim else None, return_attention_weights=True))
    ei_p, ei_d = res_p[1][0], res_d[1][0]
    assert torch.equal(ei_p, ei_d)  # PyG's edge order, loops appended


@pytest.mark.parametrize('name', ['gat', 'gatv2'])
@pytest.mark.parametrize('fill_value', [
    'mean', 'add', 'max', 'min', 'mul', 0.5, None, 'tensor1d', 'tensor2d'
])
def test_fill_value(name, fill_value):
    edge_dim = 3
    if fill_value == 'tensor1d':
        fill_value = torch.tensor([0.1, -0.2, 0.3])
    elif fill_value == 'tensor2d':
        fill_value = torch.tensor([[0.4, 0.5, -0.6]])
    pyg, df = make_pair(name, F_IN, C, heads=2, edge_dim=edge_dim,
                        fill_value=fill_value)
    ei = random_graph(N, N, 16, 5)
    ei[1, ei[1] == 6] = 5  # node 6 has no in-edges: its loop gets the empty
    ei[1, ei[0] == 6] = 4  # reduction
    leaves = dict(x=_features(N, F_IN, 1), ei=ei,
                  ea=_features(16, edge_dim, 2))
    run_both(pyg, df, leaves, _call(ea='ea', return_attention_weights=True))


@pytest.mark.parametrize('name', ['gat', 'gatv2'])
@pytest.mark.parametrize('fill_value', ['mean', 'add'])
def test_fill_value_in_double_precision(name, fill_value):
    # The loops' mean is formed in the edge features' dtype (1 / in-degree
    # is not rounded to fp32 first): float64 agrees to rounding level.
    pyg, df = make_pair(name, F_IN, C, heads=2, edge_dim=3,
                        fill_value=fill_value)
    pyg.double(), df.double()
    ei = random_graph(N, N, 40, 6)
    leaves = dict(x=_features(N, F_IN, 1).double(), ei=ei,
                  ea=_features(40, 3, 2).double())
    run_both(pyg, df, leaves, _call(ea='ea'), atol=1e-13, rtol=1e-12)


@pytest.mark.parametrize('name', ['gat', 'gatv2'])
def test_one_dim_edge_attr(name):
    pyg, df = make_pair(name, F_IN, C, heads=2, edge_dim=1)
    leaves = dict(x=_features(N, F_IN, 1), ei=random_graph(N, N, 12, 1),
                  ea=_features(12, 1, 2).view(-1))
    run_both(pyg, df, leaves, _call(ea='ea'))


def test_gat_ignores_edge_attr_without_edge_dim():
    pyg, df = make_pair('gat', F_IN, C, heads=2)
    leaves = dict(x=_features(N, F_IN, 1), ei=random_graph(N, N, 12, 1),
                  ea=_features(12, 3, 2))
    run_both(pyg, df, leaves, _call(ea='ea'))


# ---------------------------------------------------------------- bipartite
@pytest.mark.parametrize('name', ['gat', 'gatv2', 'transformer'])
@pytest.mark.parametrize('shared_in', [False, True])
@pytest.mark.parametrize('loops', [True, False])
@pytest.mark.parametrize('n_src,n_dst', [(6, 4), (4, 6)])
def test_bipartite(name, shared_in, loops, n_src, n_dst):
    in_ch = F_IN if shared_in else (F_IN, 3)
    kwargs = dict(heads=2, edge_dim=2)
    if name == 'transformer':
        kwargs['beta'] = True
    else:
        kwargs.update(add_self_loops=loops, residual=True)
        if loops:
            kwargs['fill_value'] = 0.25  # str fills need dst < n_loops
    pyg, df = make_pair(name, in_ch, C, **kwargs)
    leaves = dict(xs=_features(n_src, F_IN, 1),
                  xd=_features(n_dst, F_IN if shared_in else 3, 2),
                  ei=random_graph(n_src, n_dst, 14, 3),
                  ea=_features(14, 2, 4))
    run_both(pyg, df, leaves,
             _call(('xs', 'xd'), ea='ea', return_attention_weights=True))


def test_bipartite_mean_fill_value_when_destinations_fit():
    pyg, df = make_pair('gat', (F_IN, 3), C, heads=2, edge_dim=2)
    ei = random_graph(6, 4, 14, 3)
    ei[1] = ei[1] % 4  # all destinations < min(6, 4)
    leaves = dict(xs=_features(6, F_IN, 1), xd=_features(4, 3, 2), ei=ei,
                  ea=_features(14, 2, 4))
    run_both(pyg, df, leaves, _call(('xs', 'xd'), ea='ea'))


@pytest.mark.parametrize('loops', [True, False])
def test_gat_no_target_features_and_size(loops):
    pyg, df = make_pair('gat', (F_IN, 3), C, heads=2, add_self_loops=loops,
                        residual=True)
    leaves = dict(xs=_features(6, F_IN, 1), ei=random_graph(6, 4, 14, 3))
    run_both(pyg, df, leaves,
             _call(('xs', None), size=(6, 4), return_attention_weights=True))
    # with target features and an explicit size
    leaves['xd'] = _features(4, 3, 2)
    run_both(pyg, df, leaves,
             _call(('xs', 'xd'), size=(6, 4), return_attention_weights=True))


@pytest.mark.parametrize('fmt', ['sparse_tensor', 'coo', 'csr', 'dfgraph'])
def test_gat_no_target_features_sizes_from_adjacency(fmt):
    """Without target features and size, the adjacency gives N_dst."""
    pyg, df = make_pair('gat', (F_IN, 3), C, heads=2, add_self_loops=False)
    ei = coalesce(random_graph(6, 4, 14, 3), num_nodes=6)
    ei = ei[:, ei[1] < 3]
    ei = torch.cat([ei, torch.tensor([[0], [3]])], 1)  # N_dst = 4 > 3
    leaves = dict(xs=_features(6, F_IN, 1))

    def call(conv, t, is_df):
        if fmt == 'dfgraph':
            adj = DFGraph.from_edge_index(ei, size=(6, 4)) if is_df else \
                _to_format(ei, 'csr', 6, 4)
        else:
            adj = _to_format(ei, fmt, 6, 4)
        return conv((t['xs'], None), adj)
    res_p, res_d = run_both(pyg, df, leaves, call)
    assert res_d.shape == (4, 2 * C)


def test_gat_non_bipartite_layer_on_bipartite_input():
    pyg, df = make_pair('gat', F_IN, C, heads=2)
    leaves = dict(xs=_features(6, F_IN, 1), xd=_features(4, F_IN, 2),
                  ei=random_graph(6, 4, 10, 3))
    run_both(pyg, df, leaves, _call(('xs', 'xd')))


def test_gat_bipartite_layer_on_single_input():
    pyg, df = make_pair('gat', (F_IN, F_IN), C, heads=2, residual=True)
    leaves = dict(x=_features(N, F_IN, 1), ei=random_graph(N, N, 12, 3))
    run_both(pyg, df, leaves, _call())


# -------------------------------------------------------------- transformer
@pytest.mark.parametrize('heads', [1, 3])
@pytest.mark.parametrize('concat', [True, False])
@pytest.mark.parametrize('beta,root_weight', [(False, True), (True, True),
                                              (True, False)])
@pytest.mark.parametrize('edge_dim', [None, 3])
@pytest.mark.parametrize('bias', [True, False])
def test_transformer_grid(heads, concat, beta, root_weight, edge_dim, bias):
    pyg, df = make_pair('transformer', F_IN, C, heads=heads, concat=concat,
                        beta=beta, root_weight=root_weight,
                        edge_dim=edge_dim, bias=bias)
    leaves = dict(x=_features(N, F_IN, 1), ei=random_graph(N, N, 20, 2))
    if edge_dim:
        leaves['ea'] = _features(20, edge_dim, 3)
    run_both(pyg, df, leaves,
             _call(ea='ea' if edge_dim else None,
                   return_attention_weights=True))


@pytest.mark.parametrize('flag', [None, False, True])
def test_return_attention_weights_flag_semantics(flag):
    x, ei = _features(N, F_IN, 1), random_graph(N, N, 12, 1)
    for name in ('gat', 'gatv2', 'transformer'):
        pyg, df = make_pair(name, F_IN, C)
        out_p = pyg(x, ei, return_attention_weights=flag)
        out_d = df(x, ei, return_attention_weights=flag)
        assert type(out_p) is type(out_d), (name, flag)


# --------------------------------------------------------------------- AGNN
@pytest.mark.parametrize('requires_grad', [True, False])
@pytest.mark.parametrize('loops', [True, False])
@pytest.mark.parametrize('fmt', ['tensor', 'sparse_tensor', 'coo', 'csr'])
def test_agnn(requires_grad, loops, fmt):
    pyg, df = make_pair('agnn', requires_grad=requires_grad,
                        add_self_loops=loops)
    ei = random_graph(N, N, 18, 4)
    leaves = dict(x=_features(N, F_IN, 1), ei=ei)
    if fmt != 'tensor':
        leaves['ei'] = coalesce(ei, num_nodes=N)
    call = _call()
    if fmt != 'tensor':
        def call(conv, t, is_df):
            return conv(t['x'], _to_format(t['ei'], fmt, N, N))
    run_both(pyg, df, leaves, call)


# ------------------------------------------------------------ input formats
def _to_format(ei, fmt, n_src, n_dst):
    if fmt == 'tensor':
        return ei
    if fmt == 'edge_index':
        return EdgeIndex(ei, sparse_size=(n_src, n_dst))
    if fmt == 'sparse_tensor':
        if not WITH_TORCH_SPARSE:
            pytest.skip('needs torch_sparse')
        return SparseTensor(row=ei[1], col=ei[0],
                            sparse_sizes=(n_dst, n_src))
    adj = torch.sparse_coo_tensor(torch.stack([ei[1], ei[0]]),
                                  torch.ones(ei.size(1)),
                                  (n_dst, n_src)).coalesce()
    return adj.to_sparse_csr() if fmt == 'csr' else adj


@pytest.mark.parametrize('name', ['gat', 'gatv2', 'transformer'])
@pytest.mark.parametrize('fmt',
                         ['edge_index', 'sparse_tensor', 'coo', 'csr'])
@pytest.mark.parametrize('loops', [True, False])
@pytest.mark.parametrize('bipartite', [False, True])
def test_input_formats(name, fmt, loops, bipartite):
    n_src, n_dst = (6, 4) if bipartite else (N, N)
    kwargs = dict(heads=2)
    if name != 'transformer':
        kwargs['add_self_loops'] = loops
    elif not loops:
        pytest.skip('TransformerConv has no self-loop option')
    in_ch = (F_IN, 3) if bipartite else F_IN
    pyg, df = make_pair(name, in_ch, C, **kwargs)
    ei = coalesce(random_graph(n_src, n_dst, 16, 7), num_nodes=max(n_src,
                                                                   n_dst))
    leaves = dict(xs=_features(n_src, F_IN, 1), ei=ei)
    if bipartite:
        leaves['xd'] = _features(n_dst, 3, 2)

    def call(conv, t, is_df):
        x = t['xs'] if not bipartite else (t['xs'], t['xd'])
        return conv(x, _to_format(t['ei'], fmt, n_src, n_dst),
                    return_attention_weights=True)

    res_p, res_d = run_both(pyg, df, leaves, call)
    assert type(res_p[1]) is type(res_d[1])


@pytest.mark.parametrize('name', ['gat', 'gatv2', 'transformer'])
@pytest.mark.parametrize('fmt', ['sparse_tensor', 'csr'])
def test_sparse_input_with_edge_attr_no_loops(name, fmt):
    kwargs = dict(heads=2, edge_dim=3)
    if name != 'transformer':
        kwargs['add_self_loops'] = False
    pyg, df = make_pair(name, F_IN, C, **kwargs)
    ei = coalesce(random_graph(N, N, 16, 7), num_nodes=N)
    # edge_attr in the adjacency's CSR (destination-major) order
    adj = _to_format(ei, fmt, N, N)
    leaves = dict(x=_features(N, F_IN, 1), ea=_features(ei.size(1), 3, 2))

    def call(conv, t, is_df):
        return conv(t['x'], adj, t['ea'])
    run_both(pyg, df, leaves, call)


@pytest.mark.parametrize('name', ['gat', 'gatv2'])
@pytest.mark.parametrize('fmt', ['sparse_tensor', 'coo'])
def test_sparse_loops_with_edge_features_not_implemented(name, fmt):
    df = (DFGATConv if name == 'gat' else DFGATv2Conv)(F_IN, C, edge_dim=2)
    ei = coalesce(random_graph(N, N, 10, 1), num_nodes=N)
    with pytest.raises(NotImplementedError, match='add_self_loops'):
        df(_features(N, F_IN, 1), _to_format(ei, fmt, N, N),
           _features(ei.size(1), 2, 2))


@pytest.mark.parametrize('name', ['gat', 'gatv2', 'transformer', 'agnn'])
@pytest.mark.parametrize('loops', [True, False])
def test_prebuilt_dfgraph_used_as_is(name, loops):
    """A DFGraph is used as it is: with one built from the self-looped
    graph, the DF conv matches PyG adding the loops itself."""
    kwargs = {} if name == 'agnn' else dict(heads=2)
    args = () if name == 'agnn' else (F_IN, C)
    if name != 'transformer':
        kwargs['add_self_loops'] = loops
    pyg, df = make_pair(name, *args, **kwargs)
    ei = random_graph(N, N, 15, 8)
    graph_ei = ei
    if loops and name != 'transformer':
        graph_ei = add_self_loops(remove_self_loops(ei)[0], num_nodes=N)[0]
    graph = DFGraph.from_edge_index(graph_ei, num_nodes=N)
    leaves = dict(x=_features(N, F_IN, 1), ei=ei)
    kw = {} if name == 'agnn' else dict(return_attention_weights=True)

    def call(conv, t, is_df):
        return conv(t['x'], graph if is_df else t['ei'], **kw)
    res_p, res_d = run_both(pyg, df, leaves, call)


def test_prebuilt_dfgraph_with_edge_attr():
    pyg, df = make_pair('transformer', F_IN, C, heads=2, edge_dim=3)
    ei = random_graph(N, N, 15, 8)
    graph = DFGraph.from_edge_index(ei, num_nodes=N)
    leaves = dict(x=_features(N, F_IN, 1), ei=ei, ea=_features(15, 3, 3))

    def call(conv, t, is_df):
        return conv(t['x'], graph if is_df else t['ei'], t['ea'],
                    return_attention_weights=True)
    run_both(pyg, df, leaves, call)


# --------------------------------------------------------------- edge cases
@pytest.mark.parametrize('name', ['gat', 'gatv2', 'transformer', 'agnn'])
@pytest.mark.parametrize('case', ['no_edges', 'isolated', 'one_node',
                                  'one_node_no_edges', 'only_self_loops',
                                  'no_nodes'])
@pytest.mark.parametrize('loops', [True, False])
def test_edge_cases(name, case, loops):
    if name == 'transformer' and loops:
        pytest.skip('TransformerConv has no self-loop option')
    n = 1 if case.startswith('one_node') else 0 if case == 'no_nodes' else N
    if case in ('no_edges', 'one_node_no_edges', 'no_nodes'):
        ei = torch.empty(2, 0, dtype=torch.long)
    elif case == 'isolated':  # nodes 3..6 have no edges at all
        ei = torch.tensor([[0, 1, 2, 0], [1, 2, 0, 2]])
    elif case == 'one_node':
        ei = torch.tensor([[0, 0], [0, 0]])
    else:
        ei = torch.arange(n).repeat(2, 1)
    kwargs = dict(add_self_loops=loops)
    args = ()
    if name != 'agnn':
        args = (F_IN, C)
        kwargs['heads'] = 3
    if name == 'transformer':
        kwargs = dict(heads=3, beta=True)
    pyg, df = make_pair(name, *args, **kwargs)
    leaves = dict(x=_features(n, F_IN, 1), ei=ei)
    kw = {} if name == 'agnn' else dict(return_attention_weights=True)
    run_both(pyg, df, leaves, _call(**kw))


def test_int32_edge_index_and_double_precision():
    # PyG runs on int64 indices: its TransformerConv gradients w.r.t. x
    # differ with int32 ones (PyG 2.8), the DF-GNN convs' do not.
    for name in ('gat', 'gatv2', 'transformer'):
        pyg, df = make_pair(name, F_IN, C, heads=2)
        pyg.double()
        df.double()
        leaves = dict(x=_features(N, F_IN, 1).double(),
                      ei=random_graph(N, N, 12, 1))

        def call(conv, t, is_df):
            ei = t['ei'].int() if is_df else t['ei']
            return conv(t['x'], ei, return_attention_weights=True)
        run_both(pyg, df, leaves, call, atol=1e-10, rtol=1e-8)


def test_lazy_in_channels():
    x, ei = _features(N, F_IN, 1), random_graph(N, N, 12, 1)
    for name in ('gat', 'gatv2', 'transformer'):
        pyg_cls, df_cls = PAIRS[name]
        pyg, df = pyg_cls(-1, C, heads=2), df_cls(-1, C, heads=2)
        pyg(x, ei), df(x, ei)  # materialise the lazy weights
        df.load_state_dict(pyg.state_dict())
        run_both(pyg.eval(), df.eval(), dict(x=x, ei=ei), _call())


@pytest.mark.parametrize('name', ['gat', 'gatv2', 'transformer'])
@pytest.mark.parametrize('in_channels,bipartite', [
    (-1, False), (-1, True), ((-1, -1), True), ((F_IN, -1), True)])
@pytest.mark.parametrize('edge_dim', [None, -1])
def test_lazy_layers_draw_pyg_weights(name, in_channels, bipartite,
                                      edge_dim):
    # Lazy layers take their initial weights from the global generator when
    # they first see an input: a seeded model must get PyG's weights, so
    # they are materialised in the order PyG's conv calls them.
    x = _features(N, F_IN, 1)
    x = (x, _features(N - 2, F_IN, 3)) if bipartite else x
    ei = random_graph(N, N - 2 if bipartite else N, 12, 1)
    extra = [_features(12, 3, 2)] if edge_dim else []
    kwargs = dict(heads=2, edge_dim=edge_dim)
    kwargs.update({} if name == 'transformer' else dict(residual=True))
    states = []
    for cls in PAIRS[name]:
        torch.manual_seed(5)
        conv = cls(in_channels, C, **kwargs).eval()
        conv(x, ei, *extra)
        states.append(conv.state_dict())
    assert list(states[0]) == list(states[1])
    for key, want in states[0].items():
        assert torch.equal(states[1][key], want), key


def test_lazy_edge_dim():
    x, ei = _features(N, F_IN, 1), random_graph(N, N, 12, 1)
    ea = _features(12, 3, 2)
    for name in ('gat', 'gatv2', 'transformer'):
        pyg_cls, df_cls = PAIRS[name]
        pyg, df = pyg_cls(F_IN, C, edge_dim=-1), df_cls(F_IN, C, edge_dim=-1)
        pyg(x, ei, ea), df(x, ei, ea)  # materialise lin_edge
        df.load_state_dict(pyg.state_dict())
        run_both(pyg.eval(), df.eval(), dict(x=x, ei=ei, ea=ea),
                 _call(ea='ea'))


@pytest.mark.parametrize('name', ['gat', 'gatv2', 'transformer', 'agnn'])
def test_autocast(name):
    """Under autocast the projections come out in bf16 while attention
    parameters stay fp32: the op runs in the autocast dtype."""
    args = () if name == 'agnn' else (F_IN, C)
    kwargs = {} if name == 'agnn' else dict(heads=2)
    if name in ('gat', 'gatv2', 'transformer'):
        kwargs['edge_dim'] = 2
    pyg, df = make_pair(name, *args, **kwargs)
    x, ei = _features(N, F_IN, 1), random_graph(N, N, 20, 1)
    extra = [] if 'edge_dim' not in kwargs else [_features(20, 2, 2)]
    with torch.autocast('cpu', dtype=torch.bfloat16):
        out_p, out_d = pyg(x, ei, *extra), df(x, ei, *extra)
    torch.testing.assert_close(out_d.float(), out_p.float(), atol=5e-2,
                               rtol=5e-2)


# ------------------------------------------------------------------ dropout
@pytest.mark.parametrize('name', ['gat', 'gatv2', 'transformer'])
def test_dropout_training(name):
    pyg, df = make_pair(name, F_IN, C, heads=2, dropout=0.5)
    x, ei = _features(N, F_IN, 1), random_graph(N, N, 30, 1)
    df.train()
    out, (ei_d, alpha) = df(x, ei, return_attention_weights=True)
    df.eval()
    out_eval, (_, alpha_eval) = df(x, ei, return_attention_weights=True)
    assert out.shape == out_eval.shape
    if name == 'transformer':  # PyG returns the weights before dropout
        torch.testing.assert_close(alpha, alpha_eval)
    else:  # GAT returns them after dropout: zeros and 2x scaled ones
        assert (alpha == 0).any()
        kept = alpha != 0
        torch.testing.assert_close(alpha[kept], 2 * alpha_eval[kept])
    assert not torch.allclose(out, out_eval)
    # dropout=0 in training mode is deterministic and matches PyG
    pyg, df = make_pair(name, F_IN, C, heads=2)
    pyg.train(), df.train()
    run_both(pyg, df, dict(x=x, ei=ei), _call())


@pytest.mark.parametrize('name', ['gat', 'gatv2', 'transformer'])
@pytest.mark.parametrize('edge_dim', [None, 2])
def test_dropout_one_drops_every_weight(name, edge_dim):
    # p = 1 is PyG's too (F.dropout): no attention reaches the output, which
    # is then the bias / skip terms alone, in training mode only.
    pyg, df = make_pair(name, F_IN, C, heads=2, dropout=1.0,
                        edge_dim=edge_dim)
    x, ei = _features(N, F_IN, 1), random_graph(N, N, 30, 1)
    leaves = dict(x=x, ei=ei)
    if edge_dim:
        leaves['ea'] = _features(30, edge_dim, 2)
    call = _call(ea='ea' if edge_dim else None)
    run_both(pyg, df, leaves, call)  # eval: no dropout
    pyg.train(), df.train()
    run_both(pyg, df, leaves, call)


# ---------------------------------------------------------------- inference
def test_inference_mode_tensors():
    pyg, df = make_pair('gat', F_IN, C, heads=2, edge_dim=2)
    x = _features(N, F_IN, 1)
    with torch.inference_mode():
        ei = random_graph(N, N, 12, 1)
        ea = _features(12, 2, 2)
        torch.testing.assert_close(df(x, ei, ea), pyg(x, ei, ea))
        out_d, (ei_d, alpha_d) = df(x, ei, ea, return_attention_weights=True)
        out_p, (ei_p, alpha_p) = pyg(x, ei, ea, return_attention_weights=True)
        torch.testing.assert_close(out_d, out_p)
        torch.testing.assert_close(alpha_d, alpha_p)
        assert torch.equal(ei_d, ei_p)


@pytest.mark.parametrize('name', ['gat', 'gatv2', 'transformer', 'agnn'])
@pytest.mark.parametrize('loops', [True, False])
def test_inference_then_training_on_the_same_graph(name, loops):
    """The graph cached during an inference-mode evaluation is reused for
    training (cached tensors must not be inference tensors)."""
    args = () if name == 'agnn' else (F_IN, C)
    kwargs = dict(heads=2, edge_dim=2) if name != 'agnn' else {}
    if name != 'transformer':
        kwargs['add_self_loops'] = loops
    pyg, df = make_pair(name, *args, **kwargs)
    x, ei = _features(N, F_IN, 1), random_graph(N, N, 20, 1)
    leaves = dict(x=x, ei=ei)
    extra = {}
    if name != 'agnn':
        leaves['ea'] = _features(20, 2, 2)
        extra = dict(ea='ea', return_attention_weights=True)
    with torch.inference_mode():
        _call(**extra)(df, leaves, True)
    pyg.train(), df.train()
    run_both(pyg, df, leaves, _call(**extra))
    assert graph_cache_info()['builds'] == 1


# ---------------------------------------------------------------- bad input
def test_unsupported_message_passing_kwargs():
    with pytest.raises(ValueError, match='aggr'):
        DFGATConv(F_IN, C, aggr='mean')
    with pytest.raises(ValueError, match='flow'):
        DFTransformerConv(F_IN, C, flow='target_to_source')
    with pytest.raises(TypeError):  # as PyG: unknown keyword
        DFGATv2Conv(F_IN, C, not_an_argument=1)
    with pytest.raises(TypeError):  # as PyG: node_dim is fixed
        DFGATConv(F_IN, C, node_dim=1)
    DFAGNNConv(aggr='sum')  # 'sum' is 'add'


def _bad_calls():
    x, ei = _features(N, F_IN, 1), random_graph(N, N, 12, 1)
    gat = DFGATConv(F_IN, C, heads=2, edge_dim=2)
    v2 = DFGATv2Conv(F_IN, C, heads=2)
    tr = DFTransformerConv(F_IN, C, heads=2, edge_dim=2)
    agnn = DFAGNNConv()
    other = DFGraph.from_edge_index(random_graph(5, 5, 8, 1), num_nodes=5)
    oob = ei.clone()
    oob[0, 3] = N
    neg = ei.clone()
    neg[1, 2] = -1
    return [
        (TypeError, 'edge_index', lambda: gat(x, ei.float())),
        (TypeError, 'edge_index', lambda: v2(x, ei.bool())),
        (ValueError, 'edge_index', lambda: gat(x, ei[:1])),
        (ValueError, 'edge_index', lambda: tr(x, torch.cat([ei, ei[:1]]),
                                              torch.randn(12, 2))),
        (ValueError, 'edge_index', lambda: gat(x, oob)),
        (ValueError, 'edge_index', lambda: v2(x, neg)),
        (ValueError, 'edge_index', lambda: agnn(x, oob)),
        (TypeError, 'edge_index', lambda: gat(x, ei.tolist())),
        (ValueError, 'edge_index', lambda: gat(x, ei.to('meta'))),
        (ValueError, 'DFGraph', lambda: gat(x, other)),
        (ValueError, 'DFGraph', lambda: agnn(x, other)),
        (TypeError, "'x'", lambda: gat(x.long(), ei)),
        (TypeError, "'x'", lambda: agnn(x.long(), ei)),
        (ValueError, "'x'", lambda: v2(x[None], ei)),
        (TypeError, "'x'", lambda: tr(None, ei)),
        (TypeError, "'x'", lambda: gat((x, x, x), ei)),
        (ValueError, r"'x\[1\]'",
         lambda: gat((x, x.to('meta')), ei)),
        (ValueError, 'edge_attr', lambda: gat(x, ei, torch.randn(11, 2))),
        (ValueError, 'edge_attr', lambda: tr(x, ei, torch.randn(12, 2, 1))),
        (TypeError, 'edge_attr', lambda: gat(x, ei, torch.ones(12, 2).long())),
        (ValueError, 'edge_attr', lambda: v2(x, ei, torch.randn(12, 2))),
        (ValueError, 'edge_attr', lambda: tr(x, ei)),
        (ValueError, 'size', lambda: gat(x, ei, size=(N + 1, N))),
        (ValueError, 'size', lambda: gat(x, ei, size=(N, N - 1))),
        (ValueError, 'size', lambda: gat(x, ei, size=N)),
        (ValueError, r"x\[1\]", lambda: v2((x, None), ei)),
        (ValueError, "source nodes",
         lambda: gat(x, EdgeIndex(ei, sparse_size=(N + 2, N + 2)))),
        (ValueError, 'source nodes',
         lambda: v2(x, _to_format(ei, 'sparse_tensor', N + 1, N))),
        (ValueError, 'fill_value', lambda: DFGATConv(
            F_IN, C, edge_dim=2, fill_value=[1])(x, ei, torch.randn(12, 2))),
    ]


@pytest.mark.parametrize('case', range(len(_bad_calls())))
def test_bad_input(case):
    error, match, fn = _bad_calls()[case]
    with pytest.raises(error, match=match):
        fn()


@pytest.mark.parametrize('name', ['gat', 'gatv2', 'transformer', 'agnn'])
def test_message_passing_stages_are_refused_not_skipped(name):
    # The fused forward never runs propagate / message / aggregate: their
    # hooks, overrides and TorchScript's generated propagate fail clearly.
    args = () if name == 'agnn' else (F_IN, C)
    df_cls = PAIRS[name][1]
    conv = df_cls(*args)
    for stage in ('propagate', 'message', 'aggregate',
                  'message_and_aggregate', 'edge_update'):
        for kind in ('pre_hook', 'hook'):
            register = getattr(conv, f'register_{stage}_forward_{kind}')
            with pytest.raises(NotImplementedError, match=f"instead of "
                               f"'{stage}'"):
                register(lambda *a: None)
    calls = []
    conv.register_forward_hook(lambda *a: calls.append(1))  # a module hook
    conv(_features(N, F_IN, 1), random_graph(N, N, 12, 1))
    assert calls == [1]
    with pytest.raises(TypeError, match=r"overrides \['message'\]"):
        type('Custom', (df_cls, ), {'message': lambda self, x_j: x_j})
    with pytest.raises(NotImplementedError, match='TorchScript'):
        torch.jit.script(conv)
    with pytest.raises(NotImplementedError, match='TorchScript'):
        torch.jit.script(torch.nn.Sequential(conv))


@pytest.mark.parametrize('name', ['gat', 'gatv2', 'transformer', 'agnn'])
def test_torch_func_transforms_are_refused(name):
    from torch.func import functional_call, grad, vmap
    args = () if name == 'agnn' else (F_IN, C)
    conv = PAIRS[name][1](*args)
    x, ei = _features(N, F_IN, 1), random_graph(N, N, 12, 1)
    params = dict(conv.named_parameters())
    with pytest.raises(NotImplementedError, match='torch.func'):
        grad(lambda p: functional_call(conv, p, (x, ei)).sum())(params)
    with pytest.raises(NotImplementedError, match='torch.func'):
        vmap(lambda x: conv(x, ei))(x.unsqueeze(0))
    # functional_call alone (no transform) runs
    torch.testing.assert_close(functional_call(conv, params, (x, ei)),
                               conv(x, ei))


def test_bipartite_str_fill_value_with_out_of_range_destinations():
    conv = DFGATConv((F_IN, 3), C, edge_dim=2)  # fill_value='mean'
    ei = torch.tensor([[0, 1, 2], [4, 0, 1]])  # destination 4 >= min(3, 5)
    with pytest.raises(ValueError, match='fill_value'):
        conv((_features(3, F_IN, 1), _features(5, 3, 2)), ei,
             torch.randn(3, 2))


def test_explain_mode_refused():
    conv = DFGATConv(F_IN, C)
    conv.explain = True
    with pytest.raises(NotImplementedError, match='explain'):
        conv(_features(N, F_IN, 1), random_graph(N, N, 5, 1))


@pytest.fixture(autouse=True)
def _fresh_cache():
    clear_graph_cache()
    yield
    clear_graph_cache()


@pytest.mark.parametrize('name', ['gat', 'gatv2', 'transformer'])
@pytest.mark.parametrize('fmt', ['sparse_tensor', 'coo', 'csr'])
def test_edge_features_stored_in_sparse_adjacency_values(name, fmt):
    # Regression: PyG uses the >= 2-D values of a sparse adjacency as
    # 'edge_attr' when none is passed (what T.ToSparseTensor produces); the
    # DF convs ignored them (GAT, GATv2: silently wrong) or refused them.
    if fmt == 'sparse_tensor' and not WITH_TORCH_SPARSE:
        pytest.skip('needs torch_sparse')
    kwargs = dict(heads=2, edge_dim=3)
    if name != 'transformer':
        kwargs['add_self_loops'] = False
    pyg, df = make_pair(name, F_IN, C, **kwargs)
    ei = coalesce(random_graph(N, N, 16, 7), num_nodes=N)
    leaves = dict(x=_features(N, F_IN, 1), ea=_features(ei.size(1), 3, 2))

    def call(conv, t, is_df):
        # ei is coalesced by (src, dst); the adjacency is row = dst major
        perm = (ei[1] * N + ei[0]).argsort()
        row, col, val = ei[1][perm], ei[0][perm], t['ea'][perm]
        if fmt == 'sparse_tensor':
            adj = SparseTensor(row=row, col=col, value=val,
                               sparse_sizes=(N, N))
        elif fmt == 'coo':
            adj = torch.sparse_coo_tensor(torch.stack([row, col]), val,
                                          (N, N, 3)).coalesce()
        else:
            crow = torch.cat([row.new_zeros(1),
                              torch.bincount(row, minlength=N).cumsum(0)])
            adj = torch.sparse_csr_tensor(crow, col, val, (N, N, 3))
        return conv(t['x'], adj)

    run_both(pyg, df, leaves, call)


def test_edge_features_in_uncoalesced_coo_values():
    # PyG cannot read an uncoalesced COO; the DF convs keep its duplicate
    # entries as edges, and its values must be read in that same order.
    ei = random_graph(N, N, 16, 7)  # duplicates, unsorted
    ea = _features(ei.size(1), 3, 2)
    adj = torch.sparse_coo_tensor(torch.stack([ei[1], ei[0]]), ea,
                                  (N, N, 3))
    assert not adj.is_coalesced()
    x = _features(N, F_IN, 1)
    df = DFGATConv(F_IN, C, heads=2, edge_dim=3, add_self_loops=False)
    bare = torch.sparse_coo_tensor(torch.stack([ei[1], ei[0]]),
                                   torch.ones(ei.size(1)), (N, N))
    torch.testing.assert_close(df(x, adj), df(x, bare, ea))


@pytest.mark.parametrize('name', ['gat', 'gatv2'])
def test_attention_weights_on_uncoalesced_coo(name):
    # Regression: the forward takes an uncoalesced COO (duplicates stay
    # separate edges) but return_attention_weights crashed in
    # set_sparse_value, which needs coalesced indices.
    ei = random_graph(N, N, 16, 7)
    adj = torch.sparse_coo_tensor(torch.stack([ei[1], ei[0]]),
                                  torch.ones(ei.size(1)), (N, N))
    assert not adj.is_coalesced()
    x = _features(N, F_IN, 1)
    df = (DFGATConv if name == 'gat' else DFGATv2Conv)(
        F_IN, C, heads=2, add_self_loops=False)
    out, (adj_ret, alpha) = df(x, adj, return_attention_weights=True)
    out_ei, (ei_ret, alpha_ei) = df(x, ei, return_attention_weights=True)
    torch.testing.assert_close(out, out_ei)
    assert torch.equal(adj_ret._indices(), adj._indices())
    torch.testing.assert_close(adj_ret._values(), alpha_ei)
    torch.testing.assert_close(alpha, alpha_ei)

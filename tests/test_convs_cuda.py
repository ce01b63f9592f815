"""The four DF-GNN convs on CUDA against their PyG counterparts (outputs and
gradients with copied weights), the cached path without host syncs, and
device-mix errors."""
import pytest
import torch
from conv_helpers import make_pair, random_graph, run_both

from pyg_dfgnn.nn import (
    DFAGNNConv,
    DFGATConv,
    DFGATv2Conv,
    DFTransformerConv,
    clear_graph_cache,
    graph_cache_info,
)

pytestmark = pytest.mark.cuda
DEV = 'cuda'

CONFIGS = [
    ('gat', dict(heads=3)),
    ('gat', dict(heads=1, concat=False, residual=True)),
    ('gat', dict(heads=2, edge_dim=3)),
    ('gat', dict(heads=2, edge_dim=3, fill_value='max', add_self_loops=True)),
    ('gatv2', dict(heads=3)),
    ('gatv2', dict(heads=2, edge_dim=3, share_weights=True)),
    ('gatv2', dict(heads=1, add_self_loops=False, bias=False)),
    ('transformer', dict(heads=3, beta=True)),
    ('transformer', dict(heads=2, edge_dim=3, concat=False)),
    ('transformer', dict(heads=1, root_weight=False)),
    ('agnn', dict()),
    ('agnn', dict(add_self_loops=False, requires_grad=False)),
]


def _graph(kind, n, seed=0):
    g = torch.Generator().manual_seed(seed)
    if kind == 'random':
        ei = random_graph(n, n, 8 * n, seed)
    elif kind == 'super_node':  # one node with a huge in-degree
        ei = random_graph(n, n, 4 * n, seed)
        hub = torch.stack([torch.randint(0, n, (3000, ), generator=g),
                           torch.zeros(3000, dtype=torch.long)])
        ei = torch.cat([ei, hub], 1)
    else:  # 'isolated': the upper half of the nodes has no edges
        ei = random_graph(n // 2, n // 2, 4 * n, seed)
    return ei


@pytest.mark.parametrize('name,kwargs', CONFIGS)
@pytest.mark.parametrize('graph', ['random', 'super_node', 'isolated'])
@pytest.mark.parametrize('channels', [16, 5])
def test_matches_pyg_on_cuda(name, kwargs, graph, channels):
    torch.manual_seed(0)
    n = 300
    args = () if name == 'agnn' else (channels, channels)
    pyg, df = make_pair(name, *args, **kwargs)
    pyg, df = pyg.to(DEV), df.to(DEV)
    ei = _graph(graph, n)
    leaves = dict(x=torch.randn(n, channels), ei=ei)
    if kwargs.get('edge_dim'):
        leaves['ea'] = torch.randn(ei.size(1), kwargs['edge_dim'])
    leaves = {k: v.to(DEV) for k, v in leaves.items()}

    def call(conv, t, is_df):
        args = [t['x'], t['ei']]
        if 'ea' in t:
            args.append(t['ea'])
        return conv(*args)
    run_both(pyg, df, leaves, call, atol=5e-5, rtol=1e-4)
    # the cached second call agrees too
    run_both(pyg, df, leaves, call, atol=5e-5, rtol=1e-4)


@pytest.mark.parametrize('name', ['gat', 'gatv2', 'transformer'])
def test_attention_weights_and_bipartite_on_cuda(name):
    pyg, df = make_pair(name, (8, 6), 8, heads=2)
    pyg, df = pyg.to(DEV), df.to(DEV)
    leaves = dict(xs=torch.randn(40, 8), xd=torch.randn(30, 6),
                  ei=random_graph(40, 30, 300, 1))
    leaves = {k: v.to(DEV) for k, v in leaves.items()}
    run_both(pyg, df, leaves,
             lambda conv, t, _: conv((t['xs'], t['xd']), t['ei'],
                                     return_attention_weights=True),
             atol=5e-5, rtol=1e-4)


@pytest.mark.parametrize('dtype', [torch.float16, torch.bfloat16])
@pytest.mark.parametrize('name', ['gat', 'gatv2', 'transformer', 'agnn'])
def test_half_precision_on_cuda(name, dtype):
    args = () if name == 'agnn' else (16, 8)
    kwargs = {} if name == 'agnn' else dict(heads=2)
    pyg, df = make_pair(name, *args, **kwargs)
    pyg, df = pyg.to(DEV, dtype), df.to(DEV, dtype)
    x = torch.randn(200, 16, device=DEV, dtype=dtype)
    ei = random_graph(200, 200, 1600, 2).to(DEV)
    out_p, out_d = pyg(x, ei), df(x, ei)
    assert out_d.dtype == dtype
    torch.testing.assert_close(out_d.float(), out_p.float(), atol=2e-2,
                               rtol=2e-2)


@pytest.mark.parametrize('name', ['gat', 'gatv2', 'transformer', 'agnn'])
def test_autocast_on_cuda(name):
    args = () if name == 'agnn' else (16, 8)
    kwargs = {} if name == 'agnn' else dict(heads=2)
    pyg, df = make_pair(name, *args, **kwargs)
    pyg, df = pyg.to(DEV), df.to(DEV)
    x = torch.randn(200, 16, device=DEV, requires_grad=True)
    ei = random_graph(200, 200, 1600, 2).to(DEV)
    with torch.autocast('cuda', dtype=torch.float16):
        out_p, out_d = pyg(x, ei), df(x, ei)
    torch.testing.assert_close(out_d.float(), out_p.float(), atol=2e-2,
                               rtol=2e-2)
    out_d.float().sum().backward()
    assert torch.isfinite(x.grad).all()


@pytest.mark.parametrize('name,kwargs', [
    ('gat', dict(heads=2)),
    ('gat', dict(heads=2, edge_dim=3)),  # filled self-loop features
    ('gatv2', dict(heads=2)),
    ('transformer', dict(heads=2, edge_dim=3)),
    ('agnn', dict()),
])
def test_cached_path_has_no_host_sync(name, kwargs):
    clear_graph_cache()
    args = () if name == 'agnn' else (16, 8)
    _, df = make_pair(name, *args, **kwargs)
    df = df.to(DEV).train()
    x = torch.randn(500, 16, device=DEV, requires_grad=True)
    ei = random_graph(500, 500, 4000, 3).to(DEV)
    extra = []
    if kwargs.get('edge_dim'):
        extra.append(torch.randn(4000, 3, device=DEV))
    df(x, ei, *extra).sum().backward()  # builds the graph (syncs allowed)
    torch.cuda.synchronize()
    torch.cuda.set_sync_debug_mode('error')
    try:
        out = df(x, ei, *extra)
        out.sum().backward()
    finally:
        torch.cuda.set_sync_debug_mode(0)
    torch.cuda.synchronize()
    assert graph_cache_info()['builds'] == 1


def test_in_place_change_rebuilds_on_cuda():
    clear_graph_cache()
    pyg, df = make_pair('gat', 16, 8, heads=2)
    pyg, df = pyg.to(DEV), df.to(DEV)
    ei = random_graph(100, 100, 800, 1).to(DEV)
    x = torch.randn(100, 16, device=DEV)
    torch.testing.assert_close(df(x, ei), pyg(x, ei))
    ei[1, :400] = 7
    torch.testing.assert_close(df(x, ei), pyg(x, ei))
    assert graph_cache_info()['builds'] == 2


def test_device_mix_errors():
    x = torch.randn(10, 16, device=DEV)
    ei = random_graph(10, 10, 40, 1)
    conv = DFGATConv(16, 8, edge_dim=2).to(DEV)
    with pytest.raises(ValueError, match='edge_index'):
        conv(x, ei)  # edge_index on the CPU
    with pytest.raises(ValueError, match='edge_attr'):
        conv(x, ei.to(DEV), torch.randn(40, 2))
    with pytest.raises(ValueError, match=r"x\[1\]"):
        DFGATv2Conv(16, 8).to(DEV)((x, x.cpu()), ei.to(DEV))
    for conv in (DFTransformerConv(16, 8).to(DEV), DFAGNNConv().to(DEV)):
        with pytest.raises(ValueError, match='edge_index'):
            conv(x, ei)


@pytest.mark.parametrize('conv', [DFAGNNConv(), DFGATConv(8, 8, bias=False)])
def test_inplace_edit_of_output_keeps_backward(conv):
    # Editing the returned features in place (as PyG allows) must not break
    # the backward (which reads only the inputs and lse, not the output).
    conv = conv.to(DEV)
    x = torch.randn(50, 8, device=DEV, requires_grad=True)
    ei = random_graph(50, 50, 300, 0).to(DEV)
    out = conv(x, ei)
    expected = torch.autograd.grad(out.relu().sum(), x)[0]
    out = conv(x, ei)
    out.relu_()
    (grad, ) = torch.autograd.grad(out.sum(), x)
    torch.testing.assert_close(grad, expected)

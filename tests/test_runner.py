import csv
import json
import math
import os.path as osp

import pytest
import torch

from pyg_dfgnn.__main__ import main
from pyg_dfgnn.datasets import DatasetBundle, build_datasets, edge_attr_info
from pyg_dfgnn.datasets.sbm import generate_sbm_splits
from pyg_dfgnn.train.config import ConfigError, load_config
from pyg_dfgnn.train.model import DF_CONVS, build_model
from pyg_dfgnn.train.runner import (CKPT_FORMAT, CheckpointError,
                                    accuracy_sbm, compute_loss, lr_factor,
                                    run_dir, train, weighted_cross_entropy)

#: Options of a GraphGPS GAT local layer with edge features.
EDGES = ('dataset.edge_encoder=true', 'dataset.edge_encoder_name=TypeDictEdge',
         'dataset.sbm_edge_attr=same_block')


def df_available(local='DFGAT'):
    try:
        import pyg_dfgnn.nn as dfnn
        return hasattr(dfnn, DF_CONVS[local][0])
    except Exception:
        return False


def tiny(tmp_path, *extra):
    """A run small enough for a 2-core CPU in seconds."""
    return load_config(overrides=[
        f'out_dir={tmp_path}/results', f'dataset.dir={tmp_path}/data',
        'dataset.size=16', 'gt.layers=1', 'gt.dim_hidden=8',
        'gnn.dim_inner=8', 'gt.n_heads=2', 'gnn.layers_post_mp=1',
        'train.batch_size=8', 'train.progress_bar=false', 'optim.max_epoch=3',
        'optim.num_warmup_epochs=1', 'backend=pyg', 'num_threads=1',
        'name=tiny', *extra])


def quiet(*args):
    pass


# ------------------------------------------------------------ pieces
def test_accuracy_sbm_is_mean_per_class_recall():
    y = torch.tensor([0, 0, 0, 0, 1])
    pred = torch.tensor([0, 0, 0, 0, 0])
    assert accuracy_sbm(pred, y) == pytest.approx(0.5)  # plain acc 0.8
    assert accuracy_sbm(y, y) == 1.0
    y3 = torch.tensor([0, 1, 1, 2, 2, 2])
    p3 = torch.tensor([0, 1, 0, 2, 2, 0])
    assert accuracy_sbm(p3, y3) == pytest.approx((1 + 0.5 + 2 / 3) / 3)


def test_weighted_cross_entropy_weighs_rare_classes():
    y = torch.tensor([0, 0, 0, 1])
    pred = torch.randn(4, 3)
    w = torch.tensor([1 / 4, 3 / 4, 0.0])  # (n - n_c) / n, absent class 0
    ref = torch.nn.functional.cross_entropy(pred, y, weight=w)
    assert weighted_cross_entropy(pred, y).item() == pytest.approx(ref.item())
    l1 = compute_loss('l1', torch.tensor([[1.0], [3.0]]),
                      torch.tensor([2.0, 2.0]))
    assert l1.item() == pytest.approx(1.0)


def test_cosine_with_warmup_schedule():
    cfg = load_config(overrides=['optim.max_epoch=10',
                                 'optim.num_warmup_epochs=4'])
    f = [lr_factor(cfg, e) for e in range(10)]
    assert f[0] > 0 and f[:4] == sorted(f[:4]) and f[4] == 1.0
    assert f[4:] == sorted(f[4:], reverse=True) and f[-1] < 0.1
    cfg = load_config(overrides=['optim.scheduler=none'])
    assert lr_factor(cfg, 7) == 1.0


@pytest.mark.parametrize('layer_type', [
    'DFGAT+Transformer', 'DFGATv2+None', 'DFTransformer+None',
    'DFAGNN+Transformer', 'GINE+Transformer', 'GCN+None', 'None+Transformer',
])
def test_every_layer_type_runs(tmp_path, layer_type):
    cfg = tiny(tmp_path, f'gt.layer_type={layer_type}', 'gt.layers=2',
               'gt.layer_norm=true', 'gt.batch_norm=false')
    bundle = build_datasets(cfg)
    model = build_model(cfg, bundle.dim_in, bundle.dim_out)
    from torch_geometric.loader import DataLoader
    batch = next(iter(DataLoader(bundle.train, batch_size=4)))
    out = model(batch)
    assert out.shape == (batch.num_nodes, 2)
    out.sum().backward()
    assert all(p.grad is not None for p in model.parameters()
               if p.requires_grad)


@pytest.mark.parametrize('local', list(DF_CONVS))
def test_backends_share_weight_layout(tmp_path, local):
    if not df_available(local):
        pytest.skip(f'pyg_dfgnn.nn.{DF_CONVS[local][0]} not available yet')
    cfg = tiny(tmp_path, f'gt.layer_type={local}+Transformer')
    bundle = build_datasets(cfg)
    torch.manual_seed(0)
    ref = build_model(cfg, bundle.dim_in, bundle.dim_out).eval()
    df_cfg = tiny(tmp_path, f'gt.layer_type={local}+Transformer',
                  'backend=dfgnn')
    df = build_model(df_cfg, bundle.dim_in, bundle.dim_out).eval()
    ref_state, df_state = ref.state_dict(), df.state_dict()
    assert list(ref_state) == list(df_state)
    assert all(ref_state[k].shape == df_state[k].shape for k in ref_state)
    df.load_state_dict(ref_state)
    from torch_geometric.loader import DataLoader
    batch = next(iter(DataLoader(bundle.train, batch_size=4)))
    with torch.no_grad():
        assert torch.allclose(df(batch), ref(batch), atol=1e-4, rtol=1e-4)


def test_dfgnn_backend_error_names_the_way_out(tmp_path, monkeypatch):
    import importlib
    real = importlib.import_module

    def fake(name, *args):
        if name == 'pyg_dfgnn.nn':
            raise ImportError('not built')
        return real(name, *args)

    monkeypatch.setattr(importlib, 'import_module', fake)
    from pyg_dfgnn.train import model as model_mod
    with pytest.raises(ImportError, match='backend=pyg'):
        model_mod.conv_class('DFGAT', 'dfgnn')


# ------------------------------------------------------------- training
def test_training_improves_the_metric(tmp_path):
    # CLUSTER: chance is 1/6; the labelled seed nodes are learnt quickly.
    cfg = tiny(tmp_path, 'dataset.name=CLUSTER', 'dataset.size=64',
               'gt.layer_type=GCN+Transformer', 'gt.dim_hidden=16',
               'gnn.dim_inner=16', 'gt.layers=2', 'optim.max_epoch=6',
               'optim.base_lr=0.01', 'gt.attn_dropout=0.0')
    res = train(cfg, log=quiet)
    hist = res['history']
    assert hist[-1]['train_loss'] < hist[0]['train_loss']
    assert res['best']['val_metric'] > hist[0]['val_metric'] + 0.05
    assert res['best']['val_metric'] > 1 / 6 + 0.05


def test_results_files(tmp_path):
    cfg = tiny(tmp_path)
    res = train(cfg, log=quiet)
    out = run_dir(cfg)
    assert out == osp.join(str(tmp_path), 'results', 'tiny', 'pyg-seed0')
    with open(osp.join(out, 'results.json')) as f:
        saved = json.load(f)
    assert saved['epochs_done'] == 3 and saved['finished']
    assert saved['config']['gt']['layers'] == 1
    assert saved['best']['epoch'] in (0, 1, 2)
    with open(osp.join(out, 'epochs.csv')) as f:
        rows = list(csv.DictReader(f))
    assert [int(r['epoch']) for r in rows] == [0, 1, 2]
    for r in rows:
        assert float(r['epoch_time_s']) > 0 and float(r['graphs_per_s']) > 0
        assert 0 <= float(r['val_metric']) <= 1
        assert not math.isnan(float(r['train_loss']))
    assert osp.exists(osp.join(out, 'ckpt', 'last.pt'))
    assert osp.exists(osp.join(out, 'config.yaml'))
    assert res['num_params'] == sum(
        p.numel() for p in build_model(cfg, 3, 2).parameters())


def test_seeded_runs_are_reproducible(tmp_path):
    a = train(tiny(tmp_path, 'out_dir=' + str(tmp_path / 'a')), log=quiet)
    b = train(tiny(tmp_path, 'out_dir=' + str(tmp_path / 'b')), log=quiet)
    keys = ('train_loss', 'val_loss', 'val_metric', 'test_metric')
    assert [[r[k] for k in keys] for r in a['history']] == \
        [[r[k] for k in keys] for r in b['history']]
    c = train(tiny(tmp_path, 'out_dir=' + str(tmp_path / 'c'), 'seed=1'),
              log=quiet)
    assert c['history'][-1]['train_loss'] != a['history'][-1]['train_loss']


@pytest.mark.parametrize('loader', [
    (), ('train.loader=pyg', ), ('train.loader=pyg', 'train.num_workers=1')])
def test_resume_continues_exactly(tmp_path, loader):
    # (persistent DataLoader workers: their seeds are drawn once per run, so
    # from no generator the order or the dropout masks come from)
    extra = ('gt.dropout=0.2', 'optim.max_epoch=4', *loader)
    full = train(tiny(tmp_path, 'out_dir=' + str(tmp_path / 'full'), *extra),
                 log=quiet)
    cut = tiny(tmp_path, 'out_dir=' + str(tmp_path / 'cut'), *extra)
    part = train(cut, stop_after_epochs=2, log=quiet)
    assert part['epochs_done'] == 2 and not part['finished']
    logs = []
    resumed = train(cut, resume=True, log=logs.append)
    assert any('resumed' in line for line in logs)
    assert resumed['finished'] and resumed['epochs_done'] == 4
    keys = ('epoch', 'train_loss', 'val_loss', 'test_metric')
    assert [[r[k] for k in keys] for r in resumed['history']] == \
        [[r[k] for k in keys] for r in full['history']]


def test_evaluation_and_loader_leave_the_training_alone(tmp_path):
    # Evaluation draws no random numbers (no loader takes the workers' seed
    # from the global generator): how often it runs does not change the
    # training, and both loaders train alike, dropout included.
    losses = []
    for i, extra in enumerate([('train.eval_period=1', ),
                               ('train.eval_period=2', ),
                               ('train.loader=pyg', 'train.eval_period=2')]):
        res = train(tiny(tmp_path, f'out_dir={tmp_path}/r{i}',
                         'gt.dropout=0.2', 'optim.max_epoch=4', *extra),
                    log=quiet)
        losses.append([r['train_loss'] for r in res['history']])
    assert losses[0] == losses[1] == losses[2]


def test_time_limit_stops_resumably(tmp_path):
    cfg = tiny(tmp_path, 'train.time_limit_s=1e-6')
    logs = []
    res = train(cfg, log=logs.append)
    assert res['epochs_done'] == 1 and not res['finished']
    assert any('time limit' in line for line in logs)
    res = train(tiny(tmp_path), resume=True, log=quiet)
    assert res['finished'] and res['epochs_done'] == 3


def test_resume_refuses_other_config_or_missing_ckpt(tmp_path):
    cfg = tiny(tmp_path, 'optim.max_epoch=1')
    with pytest.raises(FileNotFoundError, match='no checkpoint'):
        train(cfg, resume=True, log=quiet)
    train(cfg, log=quiet)
    other = tiny(tmp_path, 'optim.max_epoch=1', 'optim.base_lr=0.1')
    with pytest.raises(ConfigError, match='optim.base_lr'):
        train(other, resume=True, log=quiet)


def test_regression_with_l1(tmp_path):
    # Predict each node's degree / 50 on CLUSTER graphs.
    graphs = generate_sbm_splits('CLUSTER', size=16, seed=0)
    for split in graphs.values():
        for g in split:
            g.y = torch.bincount(g.edge_index[1],
                                 minlength=g.num_nodes).float() / 50
    bundle = DatasetBundle(graphs['train'], graphs['val'], graphs['test'],
                           dim_in=7, dim_out=1, num_node_types=None)
    cfg = tiny(tmp_path, 'dataset.task_type=regression', 'model.loss_fun=l1',
               'metric_best=mae', 'metric_agg=argmin',
               'gt.layer_type=GCN+None', 'optim.max_epoch=4',
               'optim.base_lr=0.01')
    res = train(cfg, bundle=bundle, log=quiet)
    hist = res['history']
    assert hist[-1]['train_loss'] < hist[0]['train_loss']
    assert res['best']['val_metric'] == min(r['val_metric'] for r in hist)


def test_cli_train_and_resume(tmp_path, capsys):
    cfg = tmp_path / 'c.yaml'
    cfg.write_text('gt:\n  layers: 1\n  dim_hidden: 8\n  n_heads: 2\n'
                   'gnn:\n  dim_inner: 8\n  layers_post_mp: 1\n')
    args = ['--cfg', str(cfg), f'out_dir={tmp_path}/r',
            f'dataset.dir={tmp_path}/d', 'dataset.size=8', 'backend=pyg',
            'optim.max_epoch=2', 'train.batch_size=8',
            'train.progress_bar=false']
    assert main(['train', *args]) == 0
    out = capsys.readouterr().out
    assert 'epoch_time_s' in out and 'graphs_per_s' in out
    assert osp.exists(tmp_path / 'r' / 'c' / 'pyg-seed0' / 'results.json')
    assert main(['train', *args, '--resume']) == 0  # nothing left to do
    assert 'resumed' in capsys.readouterr().out


def test_bench_e2e_runs_both_backends(tmp_path, capsys):
    local = 'DFGAT' if df_available('DFGAT') else None
    if local is None:
        pytest.skip('pyg_dfgnn.nn.DFGATConv not available yet')
    cfg = tmp_path / 'b.yaml'
    cfg.write_text('gt:\n  layer_type: DFGAT+Transformer\n  layers: 1\n'
                   '  dim_hidden: 8\n  n_heads: 2\n'
                   'gnn:\n  dim_inner: 8\n  layers_post_mp: 1\n')
    out_dir = tmp_path / 'bench'
    assert main(['bench-e2e', '--cfg', str(cfg), '--epochs', '2',
                 f'out_dir={tmp_path}/r', f'dataset.dir={tmp_path}/d',
                 'dataset.size=8', 'train.batch_size=4',
                 'train.progress_bar=false', '--out', str(out_dir)]) == 0
    text = capsys.readouterr().out
    assert 'speedup' in text and 'dfgnn' in text
    with open(out_dir / 'e2e-b-cpu.json') as f:
        res = json.load(f)
    assert set(res['runs']) == {'pyg', 'pyg-runner', 'dfgnn'}
    assert res['summary']['pyg']['loader'] == 'pyg'
    assert res['summary']['dfgnn']['loader'] == 'device'
    assert res['epochs'] == 2
    assert len(res['runs']['dfgnn']['history']) == 2
    assert res['speedup_epoch_time'] > 0
    # same data, same init, same math: accuracies agree closely on CPU
    assert res['test_metric_delta'] == pytest.approx(0.0, abs=0.05)


def test_integer_node_types_use_an_embedding(tmp_path):
    # ZINC-style inputs: one integer type per node instead of features.
    graphs = generate_sbm_splits('CLUSTER', size=8, seed=0)
    for split in graphs.values():
        for g in split:
            g.x = g.x.argmax(1, keepdim=True)
    bundle = DatasetBundle(graphs['train'], graphs['val'], graphs['test'],
                           dim_in=1, dim_out=6, num_node_types=7)
    cfg = tiny(tmp_path, 'dataset.node_encoder_name=TypeDictNode',
               'optim.max_epoch=1')
    model = build_model(cfg, 1, 6, num_node_types=7)
    assert isinstance(model.node_encoder, torch.nn.Embedding)
    res = train(cfg, bundle=bundle, log=quiet)
    assert res['epochs_done'] == 1


def test_rwse_norm_stats_are_right_after_few_steps(tmp_path):
    # RWSE inputs have variance ~1e-6: an exponential running average would
    # still remember its initial var = 1 after tens of steps and squash the
    # encoding in eval mode (val accuracy at chance while train is high).
    cfg = tiny(tmp_path, 'dataset.node_encoder_name=LinearNode+RWSE',
               'posenc_RWSE.enable=true', 'posenc_RWSE.dim_pe=4')
    bundle = build_datasets(cfg)
    model = build_model(cfg, bundle.dim_in, bundle.dim_out).train()
    from torch_geometric.loader import DataLoader
    batches = list(DataLoader(bundle.train, batch_size=4))
    with torch.no_grad():
        for batch in batches:
            model(batch)
    norm = model.rwse_encoder[0]
    rw = torch.cat([b.pestat_RWSE for b in batches])
    var = rw.var(dim=0)
    steps = var > 0  # P^1_ii = 0 without self-loops
    ratio = norm.running_var[steps] / var[steps]
    assert bool((ratio > 0.5).all() and (ratio < 2).all())


# ---------------------------------- local attention dropout, edge features
def model_for(cfg, bundle):
    return build_model(cfg, bundle.dim_in, bundle.dim_out,
                       bundle.num_node_types, bundle.dim_edge,
                       bundle.num_edge_types)


def first_batch(bundle, size=4):
    from torch_geometric.loader import DataLoader
    return next(iter(DataLoader(bundle.train, batch_size=size)))


@pytest.mark.parametrize('name', ['PATTERN', 'CLUSTER'])
def test_generator_same_block_edge_attr(name):
    plain = generate_sbm_splits(name, size=4, seed=3)
    edged = generate_sbm_splits(name, size=4, seed=3, edge_attr='same_block')
    for split in plain:
        for a, b in zip(plain[split], edged[split]):
            # the same graphs (no random numbers drawn), plus edge_attr
            assert torch.equal(a.edge_index, b.edge_index)
            assert torch.equal(a.x, b.x) and torch.equal(a.y, b.y)
            assert 'edge_attr' not in a
            assert b.edge_attr.dtype == torch.long
            assert b.edge_attr.shape == (b.num_edges, )
            assert set(b.edge_attr.tolist()) == {0, 1}
            src, dst = b.edge_index
            if name == 'CLUSTER':  # the blocks are the labels
                assert torch.equal(b.edge_attr, (b.y[src] == b.y[dst]).long())
            else:  # pattern-pattern edges lie in one block
                both = (b.y[src] == 1) & (b.y[dst] == 1)
                assert bool((b.edge_attr[both] == 1).all())
                assert bool((b.edge_attr[(b.y[src] != b.y[dst])] == 0).all())
    with pytest.raises(ValueError, match='edge_attr must be one of'):
        generate_sbm_splits(name, size=4, edge_attr='random')


@pytest.mark.parametrize('local,loops', [('DFGAT', True),
                                         ('DFTransformer', False)])
@pytest.mark.parametrize('dfgnn_format', [True, False])
def test_datasets_carry_edge_attr(tmp_path, local, loops, dfgnn_format):
    cfg = tiny(tmp_path, f'gt.layer_type={local}+None', *EDGES,
               f'dataset.dfgnn_format={dfgnn_format}')
    bundle = build_datasets(cfg)
    assert (bundle.dim_edge, bundle.num_edge_types) == (1, 2)
    assert 'same_block' in bundle.train.variant  # its own cache
    g = bundle.train[0]
    assert g.edge_attr.size(0) == g.num_edges
    ei = g.edge_index
    ei = ei.as_tensor() if hasattr(ei, 'as_tensor') else ei
    assert int((ei[0] == ei[1]).sum()) == (g.num_nodes if loops else 0)
    plain = build_datasets(tiny(tmp_path, f'gt.layer_type={local}+None'))
    assert (plain.dim_edge, plain.num_edge_types) == (None, None)
    assert 'edge_attr' not in plain.train[0]


def test_edge_attr_info():
    from torch_geometric.data import Data
    ei = torch.tensor([[0, 1, 1], [1, 0, 1]])
    ints = Data(edge_index=ei, edge_attr=torch.tensor([2, 0, 9]))
    floats = Data(edge_index=ei, edge_attr=torch.tensor([[0.5], [1.], [1.]]))
    # the self-loop's value (a mean after ToDFGNNFormat) is not a type
    assert edge_attr_info([ints]) == (1, 3)
    assert edge_attr_info([floats]) == (1, None)
    assert edge_attr_info([Data(edge_index=ei)]) == (None, None)
    more = Data(edge_index=ei, edge_attr=torch.tensor([4, 1, 0]))
    assert edge_attr_info([ints], [more]) == (1, 5)  # over all splits
    assert edge_attr_info([Data(edge_index=ei, edge_attr=torch.ones(3, 4))
                           ]) == (4, 2)
    negative = Data(edge_index=ei, edge_attr=torch.tensor([-1, 0, 0]))
    assert edge_attr_info([negative]) == (1, None)


@pytest.mark.parametrize('encoder', ['TypeDictEdge', 'LinearEdge',
                                     'DummyEdge'])
@pytest.mark.parametrize('local', ['DFGAT', 'DFGATv2'])
@pytest.mark.parametrize('backend', ['pyg', 'dfgnn'])
def test_self_loop_edge_features_follow_gatconv(tmp_path, encoder, local,
                                                backend):
    # The data holds the self-loops (ToDFGNNFormat), the conv is built with
    # add_self_loops=False: it must see what GraphGPS's GATConv(edge_dim=d,
    # add_self_loops=True) computes from the encoded features of the
    # loop-free graph, fill_value='mean' (0 for a node without in-edges).
    if backend == 'dfgnn' and not df_available(local):
        pytest.skip(f'pyg_dfgnn.nn.{DF_CONVS[local][0]} not available yet')
    from torch_geometric.data import Batch, Data
    from torch_geometric.nn import GATConv, GATv2Conv
    from pyg_dfgnn.transforms import ToDFGNNFormat
    cfg = tiny(tmp_path, f'gt.layer_type={local}+None', *EDGES[:1],
               f'dataset.edge_encoder_name={encoder}',
               'dataset.sbm_edge_attr=same_block', f'backend={backend}',
               'dataset.edge_encoder_bn=true')
    torch.manual_seed(0)
    # node 3 has no in-edges; node 0's own self-loop is replaced
    ei = torch.tensor([[1, 2, 0, 3, 0, 2, 3], [0, 0, 1, 1, 2, 2, 0]])
    types = torch.tensor([1, 0, 1, 2, 0, 1, 2])
    raw = Data(x=torch.randn(4, 3), edge_index=ei, edge_attr=types,
               num_nodes=4)
    batch = Batch.from_data_list([ToDFGNNFormat(add_self_loops=True)(
        raw.clone())])
    model = build_model(cfg, 3, 2, None, 1, 3).train()
    x = model.node_encoder(batch.x)
    conv = model.layers[0].local_model
    out = conv(x, batch.edge_index, model.encode_edges(batch, 4))

    twin = (GATConv if local == 'DFGAT' else GATv2Conv)(
        8, 4, heads=2, edge_dim=8)  # adds its loops, fill_value='mean'
    twin.load_state_dict(conv.state_dict())
    feat = {'TypeDictEdge': types, 'LinearEdge': types.float().view(-1, 1),
            'DummyEdge': torch.zeros_like(types)}[encoder]
    keep = ei[0] != ei[1]
    enc = model.edge_encoder_bn(model.edge_encoder(feat[keep]))
    ref = twin(x, ei[:, keep], enc)
    assert torch.allclose(out, ref, atol=1e-5, rtol=1e-5)


@pytest.mark.parametrize('local', ['DFGAT', 'DFGATv2', 'DFTransformer',
                                   'GINE'])
@pytest.mark.parametrize('backend', ['pyg', 'dfgnn'])
def test_local_dropout_and_edge_features_train(tmp_path, local, backend):
    if backend == 'dfgnn' and local in DF_CONVS and not df_available(local):
        pytest.skip(f'pyg_dfgnn.nn.{DF_CONVS[local][0]} not available yet')
    drop = () if local == 'GINE' else ('gt.local_attn_dropout=0.3', )
    cfg = tiny(tmp_path, f'gt.layer_type={local}+Transformer', *EDGES, *drop,
               f'backend={backend}', 'optim.max_epoch=2')
    bundle = build_datasets(cfg)
    model = model_for(cfg, bundle)
    conv = model.layers[0].local_model
    if local != 'GINE':
        assert conv.dropout == 0.3
        assert conv.edge_dim == cfg.gt.dim_hidden
        assert conv.lin_edge is not None
    assert isinstance(model.edge_encoder, torch.nn.Embedding)
    assert model.edge_encoder.num_embeddings == 2
    logs = []
    res = train(cfg, bundle=bundle, log=logs.append)
    assert res['finished'] and all(
        math.isfinite(r['train_loss']) for r in res['history'])
    assert any('edge features TypeDictEdge' in line for line in logs)
    # every parameter, the edge encoder and lin_edge included, is trained
    model = model_for(cfg, bundle).train()
    out = model(first_batch(bundle))
    out.sum().backward()
    assert all(p.grad is not None for p in model.parameters()
               if p.requires_grad)
    assert model.edge_encoder.weight.grad.abs().sum() > 0


@pytest.mark.parametrize('local', ['DFGAT', 'DFGATv2', 'DFTransformer'])
def test_local_attn_dropout_is_active_in_training_only(tmp_path, local):
    cfg = tiny(tmp_path, f'gt.layer_type={local}+None',
               'gt.local_attn_dropout=0.5')
    bundle = build_datasets(cfg)
    model = model_for(cfg, bundle)
    batch = first_batch(bundle)
    model.train()
    assert not torch.equal(model(batch), model(batch))
    model.eval()
    assert torch.equal(model(batch), model(batch))
    no_drop = tiny(tmp_path, f'gt.layer_type={local}+None')
    model = model_for(no_drop, bundle).train()
    assert torch.equal(model(batch), model(batch))


@pytest.mark.parametrize('local', ['DFGAT', 'DFGATv2', 'DFTransformer'])
@pytest.mark.parametrize('encoder', ['TypeDictEdge', 'LinearEdge'])
def test_backends_agree_with_edge_features(tmp_path, local, encoder):
    # Dropout 0: the same weights give the same loss and gradients, and the
    # same seed gives the same weights (the twins share parameter names).
    if not df_available(local):
        pytest.skip(f'pyg_dfgnn.nn.{DF_CONVS[local][0]} not available yet')
    extra = (f'gt.layer_type={local}+Transformer', *EDGES,
             f'dataset.edge_encoder_name={encoder}', 'gt.attn_dropout=0.0',
             'dataset.edge_encoder_bn=true')
    cfg = {b: tiny(tmp_path, *extra, f'backend={b}') for b in ('pyg', 'dfgnn')}
    bundle = build_datasets(cfg['pyg'])
    batch = first_batch(bundle, 8)
    losses, grads, states = {}, {}, {}
    for backend, c in cfg.items():
        torch.manual_seed(0)
        model = model_for(c, bundle).train()
        states[backend] = {k: v.clone()
                           for k, v in model.state_dict().items()}
        loss = compute_loss(c.model.loss_fun, model(batch), batch.y)
        loss.backward()
        losses[backend] = loss.item()
        grads[backend] = {n: p.grad for n, p in model.named_parameters()}
    assert list(states['pyg']) == list(states['dfgnn'])
    assert all(torch.equal(states['pyg'][k], states['dfgnn'][k])
               for k in states['pyg'])
    assert losses['dfgnn'] == pytest.approx(losses['pyg'], rel=1e-5)
    for name, g in grads['pyg'].items():
        assert torch.allclose(grads['dfgnn'][name], g, atol=1e-5,
                              rtol=1e-4), name
    # and a short training run with one seed matches step for step. Without
    # BatchNorm: after a BN the conv's bias has a zero gradient, whose float
    # noise Adam turns into +-lr steps that differ between the backends.
    runs = {b: train(tiny(tmp_path, *extra, f'backend={b}',
                          'gt.batch_norm=false', 'gt.layer_norm=true',
                          'optim.max_epoch=2', f'out_dir={tmp_path}/{b}'),
                     bundle=bundle, log=quiet) for b in cfg}
    for a, b in zip(runs['pyg']['history'], runs['dfgnn']['history']):
        assert b['train_loss'] == pytest.approx(a['train_loss'], rel=1e-4)
        assert b['val_loss'] == pytest.approx(a['val_loss'], rel=1e-4)


def test_edge_encoder_errors(tmp_path):
    cfg = tiny(tmp_path, 'gt.layer_type=DFGAT+None', *EDGES, 'backend=pyg')
    with pytest.raises(ConfigError, match='has no edge_attr'):
        build_model(cfg, 3, 2)  # no edge features in the data
    with pytest.raises(ConfigError, match='non-negative integer types'):
        build_model(cfg, 3, 2, dim_edge=1, num_edge_types=None)
    small = tiny(tmp_path, 'gt.layer_type=DFGAT+None', *EDGES,
                 'dataset.edge_encoder_num_types=2')
    with pytest.raises(ConfigError, match='edge_encoder_num_types.*too small'):
        build_model(small, 3, 2, dim_edge=1, num_edge_types=5)
    model = build_model(small, 3, 2, dim_edge=1, num_edge_types=None)
    assert model.edge_encoder.num_embeddings == 2  # as configured
    linear = tiny(tmp_path, 'gt.layer_type=DFGAT+None', *EDGES,
                  'dataset.edge_encoder_name=LinearEdge')
    model = build_model(linear, 3, 2, dim_edge=4)
    assert model.edge_encoder.in_features == 4


def test_unused_edge_attr_is_noted_and_gine_keeps_its_dummy(tmp_path):
    cfg = tiny(tmp_path, 'gt.layer_type=GINE+None',
               'dataset.sbm_edge_attr=same_block', 'optim.max_epoch=1')
    logs = []
    train(cfg, log=logs.append)
    assert any('edge_attr, unused' in line for line in logs)
    model = build_model(cfg, 3, 2, dim_edge=1, num_edge_types=2)
    assert model.edge_encoder.num_embeddings == 1  # DummyEdge, as before


def test_resume_accepts_checkpoints_older_than_new_keys(tmp_path):
    # A checkpoint written before a key existed resumes when the key holds
    # its default (the behaviour the checkpoint was trained with).
    cfg = tiny(tmp_path, 'optim.max_epoch=2')
    train(cfg, stop_after_epochs=1, log=quiet)
    path = osp.join(run_dir(cfg), 'ckpt', 'last.pt')
    ckpt = torch.load(path, weights_only=False)
    del ckpt['config']['gt']['local_attn_dropout']
    del ckpt['config']['dataset']['sbm_edge_attr']
    torch.save(ckpt, path)
    with pytest.raises(ConfigError, match='gt.local_attn_dropout'):
        train(tiny(tmp_path, 'optim.max_epoch=2', 'gt.layer_type=DFGAT+None',
                   'gt.local_attn_dropout=0.1'), resume=True, log=quiet)
    res = train(cfg, resume=True, log=quiet)
    assert res['finished'] and res['epochs_done'] == 2


def test_edge_config_trains_via_cli(tmp_path, capsys):
    path = osp.join(osp.dirname(osp.dirname(osp.abspath(__file__))),
                    'configs', 'pattern-gps-edge.yaml')
    assert main(['train', '--cfg', path, f'out_dir={tmp_path}/r',
                 f'dataset.dir={tmp_path}/d', 'dataset.size=8',
                 'gt.layers=1', 'optim.max_epoch=1', 'train.batch_size=8',
                 'train.progress_bar=false', 'backend=pyg']) == 0
    out = capsys.readouterr().out
    assert 'local attn dropout 0.2, edge features TypeDictEdge' in out
    assert osp.exists(tmp_path / 'r' / 'pattern-gps-edge' / 'pyg-seed0' /
                      'results.json')


def test_checkpoint_is_weights_only(tmp_path):
    cfg = tiny(tmp_path, 'optim.max_epoch=1')
    train(cfg, log=quiet)
    ckpt = torch.load(osp.join(run_dir(cfg), 'ckpt', 'last.pt'),
                      weights_only=True)
    assert ckpt['format'] == CKPT_FORMAT and ckpt['epoch'] == 0
    assert isinstance(ckpt['config'], dict)


@pytest.mark.parametrize('damage', ['truncated', 'garbage', 'foreign',
                                    'pickled_object'])
def test_resume_refuses_corrupt_or_foreign_checkpoints(tmp_path, damage,
                                                       capsys):
    import argparse
    cfg = tiny(tmp_path, 'optim.max_epoch=2')
    train(cfg, stop_after_epochs=1, log=quiet)
    path = osp.join(run_dir(cfg), 'ckpt', 'last.pt')
    if damage == 'truncated':
        data = open(path, 'rb').read()
        open(path, 'wb').write(data[:len(data) // 2])
    elif damage == 'garbage':
        open(path, 'wb').write(b'not a checkpoint at all')
    elif damage == 'foreign':  # e.g. a bare state dict
        torch.save({'weight': torch.zeros(2)}, path)
    else:  # arbitrary objects are never unpickled
        torch.save({'config': argparse.Namespace(a=1)}, path)
    match = 'not a pyg_dfgnn runner' if damage == 'foreign' else \
        'cannot read the checkpoint'
    with pytest.raises(CheckpointError, match=match):
        train(cfg, resume=True, log=quiet)
    cfg_file = tmp_path / 'c.yaml'
    cfg_file.write_text('name: tiny\n')
    args = [f'{k}={v}' for k, v in (
        ('out_dir', cfg.out_dir), ('dataset.dir', cfg.dataset.dir),
        ('dataset.size', 16), ('gt.layers', 1), ('gt.dim_hidden', 8),
        ('gnn.dim_inner', 8), ('gt.n_heads', 2), ('gnn.layers_post_mp', 1),
        ('train.batch_size', 8), ('train.progress_bar', 'false'),
        ('optim.max_epoch', 2), ('optim.num_warmup_epochs', 1),
        ('backend', 'pyg'), ('num_threads', 1))]
    assert main(['train', '--cfg', str(cfg_file), *args, '--resume']) == 2
    assert 'pyg-dfgnn: error: --resume:' in capsys.readouterr().err


def test_compile_on_cuda_takes_both_backends_silently():
    # (sessions 9-11 warned that the dfgnn backend compiled ~20x slower
    # than CUDA graphs; session 12 found why -- cudagraph trees re-recorded
    # every step, fixed in CompiledStep -- and dropped the warning)
    import warnings
    from pyg_dfgnn.train.runner import capture_mode
    for backend in ('dfgnn', 'pyg'):
        cfg = load_config('configs/pattern-gps.yaml', [
            'train.capture=compile', 'train.loader=device',
            f'backend={backend}'])
        with warnings.catch_warnings():
            warnings.simplefilter('error')
            assert capture_mode(cfg, torch.device('cuda')) == 'compile'

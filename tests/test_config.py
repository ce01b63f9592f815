import glob
import os.path as osp

import pytest

from pyg_dfgnn.__main__ import main
from pyg_dfgnn.train.config import (ConfigError, default_config, load_config,
                                    parse_override, split_layer_type)

ROOT = osp.dirname(osp.dirname(osp.abspath(__file__)))
CONFIGS = sorted(glob.glob(osp.join(ROOT, 'configs', '*.yaml')))


def write(tmp_path, text, name='cfg.yaml'):
    path = tmp_path / name
    path.write_text(text)
    return str(path)


@pytest.mark.parametrize('path', CONFIGS, ids=osp.basename)
def test_shipped_configs_load(path):
    cfg = load_config(path)
    assert cfg.name == osp.splitext(osp.basename(path))[0]
    local, _ = split_layer_type(cfg.gt.layer_type)
    assert cfg.gt.dim_hidden == cfg.gnn.dim_inner


def test_shipped_configs_exist():
    names = {osp.basename(p) for p in CONFIGS}
    assert {'pattern-gps.yaml', 'cluster-gps.yaml', 'pattern-gt.yaml',
            'pattern-gat.yaml', 'demo.yaml', 'pattern-gps-edge.yaml'} <= names


def test_gps_configs_keep_graphgps_hyperparameters():
    p = load_config(osp.join(ROOT, 'configs', 'pattern-gps.yaml'))
    assert (p.gt.layers, p.gt.n_heads, p.gt.dim_hidden) == (6, 4, 64)
    assert (p.gt.dropout, p.gt.attn_dropout) == (0.0, 0.5)
    assert (p.optim.optimizer, p.optim.base_lr, p.optim.weight_decay) == \
        ('adamW', 0.001, 1e-5)
    assert (p.optim.max_epoch, p.optim.num_warmup_epochs) == (100, 5)
    assert p.optim.scheduler == 'cosine_with_warmup'
    assert p.train.batch_size == 32 and p.gnn.layers_post_mp == 3
    assert p.gt.layer_type.split('+') == ['DFGAT', 'Transformer']
    c = load_config(osp.join(ROOT, 'configs', 'cluster-gps.yaml'))
    assert (c.gt.layers, c.gt.n_heads, c.gt.dim_hidden) == (16, 8, 48)
    assert (c.gt.dropout, c.train.batch_size) == (0.1, 16)
    assert c.dataset.name == 'CLUSTER'
    gt = load_config(osp.join(ROOT, 'configs', 'pattern-gt.yaml'))
    assert gt.gt.layer_type == 'DFTransformer+None'


def test_defaults_fill_missing_keys(tmp_path):
    cfg = load_config(write(tmp_path, 'gt:\n  layers: 2\n'))
    assert cfg.gt.layers == 2
    assert cfg.gt.n_heads == default_config().gt.n_heads
    assert cfg.optim.optimizer == 'adamW'


@pytest.mark.parametrize('text,key', [
    ('foo: 1\n', "'foo'"),
    ('gt:\n  n_head: 4\n', "'gt.n_head'"),
    ('posenc_LapPE:\n  eigen:\n    max_freq: 3\n',
     "'posenc_LapPE.eigen.max_freq'"),
])
def test_unknown_key_is_named(tmp_path, text, key):
    with pytest.raises(ConfigError, match=f'unknown key {key}'):
        load_config(write(tmp_path, text))


def test_config_file_problems_are_config_errors(tmp_path):
    path = tmp_path / 'utf16.yaml'
    path.write_text('gt:\n  layers: 2\n', encoding='utf-16')
    with pytest.raises(ConfigError, match='not UTF-8 text'):
        load_config(str(path))
    with pytest.raises(ConfigError, match='is a directory'):
        load_config(str(tmp_path))
    # an empty name override keeps the config file's stem
    assert load_config(write(tmp_path, 'seed: 1\n', 'mine.yaml'),
                       ['name=']).name == 'mine'


def test_unknown_key_suggests_the_close_one(tmp_path):
    with pytest.raises(ConfigError, match="did you mean 'gt.n_heads'"):
        load_config(write(tmp_path, 'gt:\n  n_head: 4\n'))


@pytest.mark.parametrize('override,match', [
    ('gt.layers=abc', "'gt.layers' must be int"),
    ('gt.layers=true', "'gt.layers' must be int"),
    ('gt.layers=-1', "'gt.layers' must be >= 0"),
    ('optim.optimizer=sgd', "'optim.optimizer' must be one of"),
    ('backend=dgl', "'backend' must be one of"),
    ('optim.base_lr=fast', "'optim.base_lr' must be float"),
    ('gt.layer_type=GAT+Transformer', "local model 'GAT'"),
    ('gt.layer_type=DFGAT+Performer', "global model 'Performer'"),
    ('gt.layer_type=DFGAT', "'<local>\\+<global>'"),
    ('gt.dim_hidden=30', "'gt.dim_hidden' \\(30\\) must match"),
    ('dataset.name=ZINC', "'dataset.name' must be PATTERN or CLUSTER"),
    ('dataset.format=OGB-foo', "'dataset.format' must be"),
    ('model.loss_fun=l1', "'model.loss_fun' must be l1 exactly"),
    ('gt=3', "'gt' must be a mapping"),
    ('gt.nheads=3', "unknown key 'gt.nheads'"),
    ('seed', 'key=value'),
    ('dataset.size=0', "'dataset.size' must be >= 1"),
    ('gt.local_attn_dropout=1.0', "'gt.local_attn_dropout' must be < 1.0"),
    ('gt.local_attn_dropout=-0.1',
     "'gt.local_attn_dropout' must be >= 0.0"),
    ('gt.local_attn_dropout=high', "'gt.local_attn_dropout' must be float"),
    ('gt.local_attn_dropout=null',
     "'gt.local_attn_dropout' must not be null"),
    ('gt.dropout=1.5', "'gt.dropout' must be <= 1.0"),
    ('gt.attn_dropout=2', "'gt.attn_dropout' must be <= 1.0"),
    ('dataset.edge_encoder=yes please', "'dataset.edge_encoder' must be bool"),
    ('dataset.edge_encoder_name=Bond',
     "'dataset.edge_encoder_name' must be one of"),
    ('dataset.edge_encoder_num_types=0',
     "'dataset.edge_encoder_num_types' must be >= 1"),
    ('dataset.sbm_edge_attr=random', "'dataset.sbm_edge_attr' must be one of"),
    ('gt.attn_impl=flash', "'gt.attn_impl' must be one of"),
    ('dataset.format=PyG-Foo', r"must be 'SBM' or one of \['PyG-GNNBench"),
    ('optim.base_lr=.nan', "'optim.base_lr' must be a finite number"),
    ('optim.base_lr=.inf', "'optim.base_lr' must be a finite number"),
    ('name=../elsewhere', "'name' must be a folder name"),
    ('name=a/b', "'name' must be a folder name"),
])
def test_bad_values_name_the_key(override, match):
    with pytest.raises(ConfigError, match=match):
        load_config(overrides=[override])


@pytest.mark.parametrize('impl', ['varlen', 'fused'])
def test_attn_impl_is_for_backend_dfgnn(impl):
    with pytest.raises(ConfigError, match="'gt.attn_impl' .* backend dfgnn"):
        load_config(overrides=['backend=pyg', f'gt.attn_impl={impl}'])
    load_config(overrides=['backend=pyg', 'gt.attn_impl=padded'])


def test_attn_impl_resolves_per_device():
    from pyg_dfgnn.train.model import global_attn_impl
    assert global_attn_impl('auto', 'dfgnn', 'cpu') == 'fused'
    assert global_attn_impl('auto', 'dfgnn', 'cuda') == 'varlen'
    assert global_attn_impl('auto', 'pyg', 'cuda') == 'padded'
    assert global_attn_impl('padded', 'dfgnn', 'cpu') == 'padded'
    with pytest.raises(ConfigError, match='CUDA only'):
        global_attn_impl('varlen', 'dfgnn', 'cpu')
    # compiled: PyTorch cannot trace the varlen kernel's backward
    assert global_attn_impl('auto', 'dfgnn', 'cuda', compiling=True) == \
        'padded'
    assert global_attn_impl('auto', 'dfgnn', 'cpu', compiling=True) == \
        'fused'
    with pytest.raises(ConfigError, match='does not compile'):
        global_attn_impl('varlen', 'dfgnn', 'cuda', compiling=True)
    with pytest.raises(ConfigError, match='does not compile'):
        load_config(overrides=['gt.attn_impl=varlen', 'gt.attn_dropout=0',
                               'train.capture=compile'])
    # attention dropout in effect: fused (varlen + dropout is refused),
    # padded under compile
    assert global_attn_impl('auto', 'dfgnn', 'cuda', dropout=0.5) == 'fused'
    # ... for heads the kernels run as 4 * 2^k features (pattern-gps 4 x
    # 16; cluster-gps 8 x 6, zero-padded to 8), padded for others
    for width in (16, 6, 3, 7, 64):
        assert global_attn_impl('auto', 'dfgnn', 'cuda', dropout=0.5,
                                head_dim=width) == 'fused'
    for width in (5, 10, 12, 20, 2):
        assert global_attn_impl('auto', 'dfgnn', 'cuda', dropout=0.5,
                                head_dim=width) == 'padded'
    assert global_attn_impl('auto', 'dfgnn', 'cpu', dropout=0.5,
                            head_dim=6) == 'fused'
    assert global_attn_impl('auto', 'dfgnn', 'cuda', compiling=True,
                            dropout=0.5) == 'padded'
    assert global_attn_impl('fused', 'dfgnn', 'cuda', compiling=True,
                            dropout=0.5) == 'fused'
    assert global_attn_impl('auto', 'dfgnn', 'cpu', dropout=0.5) == 'fused'
    with pytest.raises(ConfigError, match='backward than in its forward'):
        global_attn_impl('varlen', 'dfgnn', 'cuda', dropout=0.5)
    with pytest.raises(ConfigError, match='backward than in its forward'):
        load_config(overrides=['gt.attn_impl=varlen'])  # attn_dropout 0.5
    load_config(overrides=['gt.attn_impl=varlen', 'gt.attn_dropout=0'])


def test_head_divisibility_checked():
    with pytest.raises(ConfigError, match="multiple of 'gt.n_heads'"):
        load_config(overrides=['gt.dim_hidden=30', 'gnn.dim_inner=30'])


def test_overrides_parse_yaml_values():
    assert parse_override('gt.layers=3') == ('gt.layers', 3)
    assert parse_override('optim.base_lr=5e-4') == ('optim.base_lr', '5e-4')
    cfg = load_config(overrides=['optim.base_lr=5e-4', 'dataset.size=null',
                                 'backend=pyg', 'gt.batch_norm=false',
                                 'gt.layer_norm=true'])
    assert cfg.optim.base_lr == pytest.approx(5e-4)  # YAML 1.1 string
    assert cfg.dataset.size is None and cfg.backend == 'pyg'
    assert cfg.gt.layer_norm and not cfg.gt.batch_norm


def test_graphgps_style_float_strings_and_ints(tmp_path):
    cfg = load_config(write(tmp_path, 'optim:\n  weight_decay: 1e-5\n'
                            '  base_lr: 1\n'))
    assert cfg.optim.weight_decay == 1e-5 and cfg.optim.base_lr == 1.0
    assert isinstance(cfg.optim.base_lr, float)


def test_graphgps_only_keys_are_accepted(tmp_path):
    cfg = load_config(write(tmp_path, 'wandb:\n  use: False\n  project: P\n'
                            'model:\n  edge_decoding: dot\n'
                            'gnn:\n  agg: mean\n  normalize_adj: False\n'))
    assert cfg.wandb.project == 'P'


def test_missing_file_and_bad_yaml(tmp_path):
    with pytest.raises(ConfigError, match='does not exist'):
        load_config(str(tmp_path / 'nope.yaml'))
    with pytest.raises(ConfigError, match='invalid YAML'):
        load_config(write(tmp_path, 'gt: [1,\n'))
    with pytest.raises(ConfigError, match="'<root>' must be a mapping"):
        load_config(write(tmp_path, '- 1\n- 2\n'))


def test_lappe_flag_must_match_encoder_name():
    with pytest.raises(ConfigError, match="posenc_LapPE.enable"):
        load_config(overrides=['posenc_LapPE.enable=true'])
    cfg = load_config(overrides=['posenc_LapPE.enable=true',
                                 'dataset.node_encoder_name=LinearNode+LapPE'])
    assert cfg.posenc_LapPE.enable


def test_rwse_options():
    base = ['posenc_RWSE.enable=true', 'posenc_RWSE.dim_pe=8',
            'dataset.node_encoder_name=LinearNode+RWSE']
    assert load_config(overrides=base).posenc_RWSE.enable
    with pytest.raises(ConfigError, match='times_func'):
        load_config(overrides=base + ['posenc_RWSE.kernel.times_func=foo'])
    with pytest.raises(ConfigError, match="'posenc_RWSE.enable'"):
        load_config(overrides=base[1:])
    with pytest.raises(ConfigError, match='smaller than'):
        load_config(overrides=base + ['posenc_RWSE.dim_pe=64'])
    with pytest.raises(ConfigError, match='node_encoder_name'):
        load_config(overrides=['dataset.node_encoder_name=LinearNode+Foo'])


def test_cli_reports_config_errors(tmp_path, capsys):
    path = write(tmp_path, 'gt:\n  n_head: 4\n')
    assert main(['train', '--cfg', path]) == 2
    err = capsys.readouterr().err
    assert "unknown key 'gt.n_head'" in err
    assert main(['show-config', '--cfg', path.replace('cfg', 'x')]) == 2
    assert main(["bench-e2e", "--cfg", path, "--epochs", "0"]) == 2


def test_cli_show_config_applies_overrides(tmp_path, capsys):
    path = write(tmp_path, 'gt:\n  layers: 2\n')
    assert main(['show-config', '--cfg', path, 'gt.layers=5']) == 0
    assert 'layers: 5' in capsys.readouterr().out


# ------------------------------------------- local attention, edge features
def test_new_keys_default_to_the_old_behaviour():
    cfg = default_config()
    assert cfg.gt.local_attn_dropout == 0.0
    assert not cfg.dataset.edge_encoder
    assert cfg.dataset.edge_encoder_name == 'DummyEdge'
    assert cfg.dataset.edge_encoder_num_types is None
    assert cfg.dataset.sbm_edge_attr == 'none'


@pytest.mark.parametrize('path', [p for p in CONFIGS
                                  if 'edge' not in osp.basename(p)],
                         ids=osp.basename)
def test_shipped_configs_keep_no_local_dropout_nor_edges(path):
    cfg = load_config(path)
    assert cfg.gt.local_attn_dropout == 0.0 and not cfg.dataset.edge_encoder
    assert cfg.dataset.sbm_edge_attr == 'none'


def test_edge_config_uses_both():
    e = load_config(osp.join(ROOT, 'configs', 'pattern-gps-edge.yaml'))
    p = load_config(osp.join(ROOT, 'configs', 'pattern-gps.yaml'))
    assert e.gt.local_attn_dropout > 0 and e.gt.layer_type == p.gt.layer_type
    assert e.dataset.edge_encoder and e.dataset.sbm_edge_attr == 'same_block'
    assert e.dataset.edge_encoder_name == 'TypeDictEdge'
    assert e.dataset.edge_encoder_num_types == 2
    same = ('gt', 'gnn', 'optim', 'train', 'posenc_LapPE', 'posenc_RWSE')
    for section in same:  # otherwise pattern-gps.yaml
        a, b = e[section].to_dict(), p[section].to_dict()
        a.pop('local_attn_dropout', None), b.pop('local_attn_dropout', None)
        assert a == b, section


@pytest.mark.parametrize('local', ['DFGAT', 'DFGATv2', 'DFTransformer'])
def test_local_attn_dropout_for_attention_layers(local):
    cfg = load_config(overrides=[f'gt.layer_type={local}+None',
                                 'gt.local_attn_dropout=0.3'])
    assert cfg.gt.local_attn_dropout == 0.3


@pytest.mark.parametrize('local', ['DFAGNN', 'GINE', 'GCN', 'None'])
def test_local_attn_dropout_needs_an_attention_layer(local):
    with pytest.raises(ConfigError, match="'gt.local_attn_dropout' needs an "
                       f"attention local layer.*'{local}'"):
        load_config(overrides=[f'gt.layer_type={local}+Transformer',
                               'gt.local_attn_dropout=0.1'])
    # 0 is the default and fine for every layer
    load_config(overrides=[f'gt.layer_type={local}+Transformer',
                           'gt.local_attn_dropout=0'])


@pytest.mark.parametrize('local', ['DFGAT', 'DFGATv2', 'DFTransformer',
                                   'GINE'])
def test_edge_encoder_for_edge_layers(local):
    cfg = load_config(overrides=[f'gt.layer_type={local}+None',
                                 'dataset.edge_encoder=true',
                                 'dataset.edge_encoder_name=TypeDictEdge',
                                 'dataset.sbm_edge_attr=same_block'])
    assert cfg.dataset.edge_encoder


@pytest.mark.parametrize('local', ['DFAGNN', 'GCN', 'None'])
def test_edge_encoder_needs_an_edge_layer(local):
    with pytest.raises(ConfigError, match="'dataset.edge_encoder' needs a "
                       f"local layer that takes edge features.*'{local}'"):
        load_config(overrides=[f'gt.layer_type={local}+Transformer',
                               'dataset.edge_encoder=true'])


@pytest.mark.parametrize('name', ['LinearEdge', 'TypeDictEdge'])
def test_sbm_edge_encoder_needs_edge_features(name):
    with pytest.raises(ConfigError, match="'dataset.sbm_edge_attr'"):
        load_config(overrides=['dataset.edge_encoder=true',
                               f'dataset.edge_encoder_name={name}'])
    # DummyEdge needs no data; an unused edge_attr is allowed (GraphGPS
    # ignores edge features without an edge encoder)
    load_config(overrides=['dataset.edge_encoder=true'])
    load_config(overrides=['dataset.sbm_edge_attr=same_block'])


def test_dataset_size_only_for_sbm():
    with pytest.raises(ConfigError, match="'dataset.size' only applies"):
        load_config(overrides=['dataset.format=PyG-GNNBenchmarkDataset',
                               'dataset.size=100'])
    load_config(overrides=['dataset.format=PyG-GNNBenchmarkDataset'])


def test_sbm_edge_attr_only_for_sbm():
    with pytest.raises(ConfigError, match="'dataset.sbm_edge_attr' only "
                       "applies to 'dataset.format' SBM"):
        load_config(overrides=['dataset.format=PyG-ZINC',
                               'dataset.name=subset',
                               'dataset.sbm_edge_attr=same_block'])

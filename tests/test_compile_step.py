"""``train.capture: compile`` (the training step through torch.compile) on
the CPU: the config values, the compiled step against the eager one
(inductor), the runner and ``bench-e2e`` with it (traced with
``'aot_eager'``, which generates no code: the plumbing in seconds instead
of a minute of C++ builds per run on a small CPU)."""
import copy
import json
import os.path as osp
import shutil

import pytest
import torch

import pyg_dfgnn.train.capture as capture
import pyg_dfgnn.train.model as gps_model
from pyg_dfgnn.__main__ import main
from pyg_dfgnn.datasets import build_datasets
from pyg_dfgnn.train.bench import (DEFAULT_VARIANTS, VARIANTS,
                                   parse_variants)
from pyg_dfgnn.train.capture import CompiledStep, batch_key
from pyg_dfgnn.train.config import ConfigError, load_config
from pyg_dfgnn.train.model import build_model
from pyg_dfgnn.train.runner import (EpochStats, _config_diff, capture_mode,
                                    make_loaders, make_optimizer, train_step)

ROOT = osp.dirname(osp.dirname(osp.abspath(__file__)))
CPU = torch.device('cpu')


# ------------------------------------------------------------ the config
@pytest.mark.parametrize('value,mode', [
    ('false', 'none'), ('true', 'graphs'), ('none', 'none'),
    ('graphs', 'graphs'), ('compile', 'compile'), ('off', 'none')])
def test_capture_values(value, mode):
    # true / false (configs and overrides written before 'compile')
    # keep their meaning.
    cfg = load_config(overrides=[f'train.capture={value}'])
    assert cfg.train.capture == mode
    assert load_config().train.capture == 'none'


@pytest.mark.parametrize('value,match', [
    ('cudagraphs', "'train.capture' must be one of \\['none', 'graphs', "
     "'compile'\\], got 'cudagraphs'"),
    ('1', "'train.capture' must be str, got int 1"),
    ('null', "'train.capture' must not be null")])
def test_bad_capture_value_is_named(value, match):
    with pytest.raises(ConfigError, match=match):
        load_config(overrides=[f'train.capture={value}'])


def test_checkpoints_with_the_old_bool_resume():
    # A checkpoint's config from before the string values: capture false /
    # true is the same config as none / graphs.
    new = load_config(overrides=['train.capture=graphs']).to_dict()
    old = copy.deepcopy(new)
    old['train']['capture'] = True
    assert _config_diff(old, new) == []
    old['train']['capture'] = False
    assert _config_diff(old, new) == ['train.capture']


def test_capture_mode_needs_the_device_loader():
    cfg = load_config(overrides=['train.capture=compile'])
    assert capture_mode(cfg, CPU) == 'compile'  # the CPU compiles too
    with pytest.raises(ConfigError, match="compile needs 'train.loader' "
                       "device"):
        capture_mode(load_config(overrides=[
            'train.capture=compile', 'train.loader=pyg']), CPU)
    with pytest.raises(ConfigError, match='graphs \\(true\\) needs a CUDA '
                       'device'):
        capture_mode(load_config(overrides=['train.capture=true']), CPU)


def test_compile_optimizer_takes_a_tensor_learning_rate():
    # A float would be a constant of the compiled update (a recompilation
    # at every scheduler step); the scheduler writes the tensor in place.
    cfg = load_config()
    w = torch.nn.Parameter(torch.ones(3))
    opt = make_optimizer(cfg, [w], 'compile')
    lr = opt.param_groups[0]['lr']
    assert isinstance(lr, torch.Tensor) and not opt.param_groups[0]['foreach']
    sched = torch.optim.lr_scheduler.LambdaLR(opt, lambda e: 0.5)
    opt.step()
    sched.step()
    assert opt.param_groups[0]['lr'] is lr and float(lr) == pytest.approx(
        0.5 * cfg.optim.base_lr)
    eager = make_optimizer(cfg, [w])
    assert isinstance(eager.param_groups[0]['lr'], float)


# --------------------------------------------------------- the step itself
def _setup(tmp_path, *extra):
    cfg = load_config(osp.join(ROOT, 'configs', 'demo.yaml'), [
        f'dataset.dir={tmp_path}/d', 'dataset.size=16',
        'train.batch_size=8', 'train.capture=compile', *extra])
    bundle = build_datasets(cfg)
    torch.manual_seed(0)
    model = build_model(cfg, bundle.dim_in, bundle.dim_out)
    loader, _ = make_loaders(cfg, bundle, CPU, model, torch.Generator(),
                             pad=True)
    return cfg, bundle, model, loader


@pytest.fixture
def one_compile_thread():
    """Inductor's C++ builds in this process (no compile worker pool: its
    workers' exit wrote BrokenPipe noise into the test log). Through the
    config's own patch: monkeypatch's undo deletes the option."""
    import torch._inductor.config as inductor_config
    with inductor_config.patch(compile_threads=1):
        yield


@pytest.mark.skipif(shutil.which('c++') is None and shutil.which('g++') is
                    None, reason='inductor builds its CPU kernels with C++')
@pytest.mark.parametrize('own_inputs', [False, True])
def test_compiled_step_matches_eager(tmp_path, one_compile_thread,
                                     own_inputs):
    """Inductor on the CPU: two epochs of padded batches (the first step
    eager, then compiled; demo.yaml's GPS model: fused DFGAT and global
    attention through the reference path, masked batch norms, RWSE), the
    learning rate changed between them; the same steps eagerly on a copy
    of the model. ``own_inputs``: the compiled steps run on batches the
    step owns per shape (as under CUDA graphs), later batches copied in."""
    # One GPS layer, one head layer: inductor's C++ builds take ~40 s.
    cfg, bundle, model, loader = _setup(tmp_path, 'gt.layers=1',
                                        'gnn.layers_post_mp=1')
    twin = copy.deepcopy(model)
    opt = make_optimizer(cfg, model.parameters(), 'compile')
    opt2 = make_optimizer(cfg, twin.parameters())
    scheds = [torch.optim.lr_scheduler.LambdaLR(o, lambda e: 1 / (e + 1))
              for o in (opt, opt2)]
    stats, stats2 = (EpochStats(cfg.metric_best, bundle.dim_out, CPU)
                     for _ in range(2))
    model.train()
    twin.train()
    step = CompiledStep(lambda b: train_step(model, opt, b, cfg, stats),
                        CPU, static=(stats.sums, ), own_inputs=own_inputs)
    # Fresh batches for each epoch, as the runner builds them.
    epochs = []
    for epoch in range(2):
        loader.generator.manual_seed(epoch)
        epochs.append(list(loader))
    keys, captures = set(), []  # shapes of the compiled steps' batches
    for batches in epochs:
        for batch in batches:
            if step.eager_steps == step.warmup:
                keys.add(batch_key(batch))
            step(copy.deepcopy(batch))
        scheds[0].step()
        captures.append(step.captures)
    for batches in epochs:
        for batch in batches:
            train_step(twin, opt2, copy.deepcopy(batch), cfg, stats2)
        scheds[1].step()
    assert step.eager_steps == 1 and step.compiled_steps == 3
    # Dynamo's graphs: forward + loss + metrics (one per padded shape: a
    # graph break in the model would add more), clipping, the update; none
    # recompiled for the second epoch's learning rate.
    assert captures[0] == captures[1] == 2 + len(keys)
    if own_inputs:  # one owned batch per shape, reused across epochs
        assert len(step.inputs) == len(keys)
        assert len(keys) < step.compiled_steps
    ra, rb = stats.result(), stats2.result()
    assert ra['graphs'] == rb['graphs'] == 32
    assert ra['loss'] == pytest.approx(rb['loss'], rel=1e-5)
    # A near-tie argmax may flip (one node: ~1/300 of a class's recall).
    assert ra['metric'] == pytest.approx(rb['metric'], abs=0.01)
    # Adam's first updates are ~lr * sign(grad): rounding-level gradient
    # differences (other summation orders in the fused kernels) can move a
    # weight by up to 2 lr per compiled step.
    bound = 2 * cfg.optim.base_lr * step.compiled_steps
    for (name, a), b in zip(model.state_dict().items(),
                            twin.state_dict().values()):
        assert (a.float() - b.float()).abs().max() <= bound, name


# ------------------------------------------------- the runner and bench-e2e
def test_bench_variants_include_compile():
    assert VARIANTS['dfgnn-compile'] == [
        'backend=dfgnn', 'train.loader=device', 'train.capture=compile']
    assert VARIANTS['pyg-runner-compile'] == [
        'backend=pyg', 'train.loader=device', 'train.capture=compile']
    assert parse_variants(None) == list(DEFAULT_VARIANTS) == [
        'pyg', 'pyg-runner', 'dfgnn']
    assert parse_variants('dfgnn, dfgnn-compile') == ['dfgnn',
                                                      'dfgnn-compile']
    for bad in ('dfgnn,cuda-graphs', 'dfgnn,dfgnn', ''):
        with pytest.raises(ConfigError, match='variants must be distinct'):
            parse_variants(bad)


def _bench_e2e(tmp_path, names: str, layers: int):
    """``bench-e2e`` of a small GPS config on the CPU (3 epochs, 16
    generated graphs) in the variants ``names``; its result JSON."""
    cfg = tmp_path / 'b.yaml'
    cfg.write_text('gt:\n  layer_type: DFGAT+Transformer\n'
                   f'  layers: {layers}\n  dim_hidden: 8\n  n_heads: 2\n'
                   '  attn_dropout: 0.0\n'
                   'gnn:\n  dim_inner: 8\n  layers_post_mp: 1\n'
                   'optim:\n  num_warmup_epochs: 1\n')
    assert main(['bench-e2e', '--cfg', str(cfg), '--epochs', '3',
                 f'out_dir={tmp_path}/r', f'dataset.dir={tmp_path}/d',
                 'dataset.size=16', 'train.batch_size=8',
                 'train.progress_bar=false', 'num_threads=1',
                 '--out', str(tmp_path / 'bench'), '--variants',
                 names]) == 0
    with open(tmp_path / 'bench' / 'e2e-b-cpu.json') as f:
        return json.load(f)


def test_bench_e2e_compares_compiled_and_eager_steps(tmp_path, capsys,
                                                     monkeypatch):
    """The compile variants through bench-e2e and the runner: on the CPU
    their twins run eagerly, on the same data; the compiled runs train
    alike, compile in epoch 0 only (none of the later epochs' times is
    compile time) and are compared in the summary."""
    monkeypatch.setattr(capture, 'COMPILE_BACKEND', 'aot_eager')
    names = 'pyg-runner,pyg-runner-compile,dfgnn,dfgnn-compile'
    res = _bench_e2e(tmp_path, names, layers=1)
    text = capsys.readouterr().out
    assert 'speedup dfgnn-compile vs dfgnn (train.capture none)' in text
    assert list(res['runs']) == names.split(',')
    # the per-variant partial file is gone once the whole result is written
    assert not (tmp_path / 'bench' / 'e2e-b.partial.json').exists()
    summary = res['summary']
    assert res['speedup_epoch_time'] is None  # no pyg variant ran
    # the fastest of each backend's runner variants, compared
    best = res['best_variants']
    assert best['dfgnn'] in ('dfgnn', 'dfgnn-compile')
    assert best['pyg-runner'] in ('pyg-runner', 'pyg-runner-compile')
    for name in ('dfgnn', 'pyg-runner'):
        assert summary[best[name]]['median_epoch_time_s'] == min(
            summary[n]['median_epoch_time_s'] for n in summary
            if n.startswith(name))
    assert res['speedup_vs_best_pyg_runner'] == pytest.approx(
        summary[best['pyg-runner']]['median_epoch_time_s'] /
        summary[best['dfgnn']]['median_epoch_time_s'])
    assert set(res['speedup_compile_vs_graphs']) == {'pyg-runner-compile',
                                                     'dfgnn-compile'}
    for compiled, eager in (('pyg-runner-compile', 'pyg-runner'),
                            ('dfgnn-compile', 'dfgnn')):
        assert summary[compiled]['capture'] == 'compile'
        assert summary[eager]['capture'] == 'none'
        assert summary[eager]['new_captures_after_first_epoch'] is None
        assert summary[compiled]['new_captures_after_first_epoch'] == 0
        hist = res['runs'][compiled]['history']
        assert hist[0]['captures'] > 0
        # Same data, init and math (padded batches, masked batch norms):
        # rounding-level differences only.
        for a, b in zip(hist, res['runs'][eager]['history']):
            assert a['train_loss'] == pytest.approx(b['train_loss'],
                                                    rel=1e-4)
            assert a['val_loss'] == pytest.approx(b['val_loss'], rel=1e-4)


def test_bench_e2e_partial_result_names_the_finished_variants(tmp_path):
    # what a run cut by a time limit leaves behind
    from pyg_dfgnn.train.bench import _write_partial
    run = dict(history=[{'epoch': 0, 'epoch_time_s': 1.5}], best=None,
               final={'val_metric': 0.5}, wall_time_s=2.0, extra='dropped')
    path = _write_partial(str(tmp_path), 'configs/pattern-gps.yaml',
                          ['dataset.size=8'], 3, {'dfgnn': run})
    assert path.endswith('e2e-pattern-gps.partial.json')
    with open(path) as f:
        res = json.load(f)
    assert res['finished'] == ['dfgnn'] and res['epochs'] == 3
    assert res['runs']['dfgnn']['history'][0]['epoch_time_s'] == 1.5
    assert 'extra' not in res['runs']['dfgnn']


# ------------------------------------------------ train.compile_layers
def test_compile_layers_config():
    assert load_config().train.compile_layers is False
    load_config(overrides=['train.compile_layers=true',
                           'train.capture=graphs'])
    with pytest.raises(ConfigError, match="'train.compile_layers' needs "
                       "'train.loader' device"):
        load_config(overrides=['train.compile_layers=true',
                               'train.loader=pyg'])
    with pytest.raises(ConfigError, match='compiled whole already'):
        load_config(overrides=['train.compile_layers=true',
                               'train.capture=compile'])
    with pytest.raises(ConfigError, match='does not compile'):
        load_config(overrides=['train.compile_layers=true',
                               'gt.attn_impl=varlen', 'gt.attn_dropout=0'])
    assert VARIANTS['dfgnn-layers'] == [
        'backend=dfgnn', 'train.loader=device', 'train.compile_layers=true']
    assert VARIANTS['pyg-runner-layers'] == [
        'backend=pyg', 'train.loader=device', 'train.compile_layers=true']


@pytest.fixture
def layers_traced(monkeypatch, fresh_layer_compile):
    """The compiled layers traced with ``'aot_eager'`` (no code
    generation), from a fresh compiled function."""
    monkeypatch.setattr(gps_model, 'LAYER_COMPILE_BACKEND', 'aot_eager')
    return fresh_layer_compile


def test_compiled_layers_train_as_eager_layers(tmp_path, layers_traced):
    """``train.compile_layers``: training runs the GPS layers through one
    compiled function (one graph per padded batch shape, shared by the
    three layers), evaluation runs them eagerly; the steps match eager
    steps of a copy of the model on the same batches."""
    cfg, bundle, model, loader = _setup(
        tmp_path, 'train.capture=none', 'train.compile_layers=true',
        'gt.layers=3')
    twin = copy.deepcopy(model)
    twin.compile_layers = False
    assert model.compile_layers
    opts = [make_optimizer(cfg, m.parameters()) for m in (model, twin)]
    stats = [EpochStats(cfg.metric_best, bundle.dim_out, CPU)
             for _ in range(2)]
    batches = list(loader)
    for m, opt, st in zip((model, twin), opts, stats):
        m.train()
        for batch in batches:
            train_step(m, opt, copy.deepcopy(batch), cfg, st)
    shapes = {batch_key(b) for b in batches}
    # one graph per shape for all three layers (a graph break inside a
    # layer would add more)
    assert layers_traced['unique_graphs'] == len(shapes) > 0
    ra, rb = stats[0].result(), stats[1].result()
    assert ra['graphs'] == rb['graphs'] == 16
    assert ra['loss'] == pytest.approx(rb['loss'], rel=1e-5)
    for (name, a), b in zip(model.state_dict().items(),
                            twin.state_dict().values()):
        assert torch.allclose(a, b, atol=1e-5), name
    model.eval()
    with torch.no_grad():
        model(batches[0])
    assert layers_traced['unique_graphs'] == len(shapes)  # eval: eager


def test_runner_pads_batches_for_compiled_layers(tmp_path, layers_traced):
    """bench-e2e's ``dfgnn-layers`` through the runner on the CPU (eager
    step, compiled layers, padded batches): it trains as ``dfgnn`` does
    on the same data, with a few compilations (padded shapes), not one
    per batch."""
    res = _bench_e2e(tmp_path, 'dfgnn,dfgnn-layers', layers=2)
    graphs = layers_traced['unique_graphs']
    assert 0 < graphs <= 6  # padded shapes: a few, not one per batch
    assert set(res['speedup_compile_vs_graphs']) == {'dfgnn-layers'}
    # Padded against unpadded batches: the same math, rounding-level
    # gradient differences. Biases followed by a batch norm have a zero
    # gradient up to rounding, and Adam moves them by ~lr * its sign, so
    # evaluation sees them (~3e-4 here; dfgnn-compile alike).
    for a, b in zip(res['runs']['dfgnn-layers']['history'],
                    res['runs']['dfgnn']['history']):
        assert a['train_loss'] == pytest.approx(b['train_loss'], rel=1e-4)
        assert a['val_loss'] == pytest.approx(b['val_loss'], rel=2e-3)

"""GPU tests of the runner: no host sync in a training step of any shipped
config (torch.cuda.set_sync_debug_mode('error')), the captured step (CUDA
graphs; torch.compile) against the eager one, short captured runs through
train()."""
import copy
import os.path as osp

import pytest
import torch

import pyg_dfgnn.train.model as gps_model
from pyg_dfgnn.datasets import build_datasets
from pyg_dfgnn.train.capture import CapturedStep, CompiledStep, batch_key
from pyg_dfgnn.train.config import load_config
from pyg_dfgnn.train.model import build_model
from pyg_dfgnn.train.runner import (EpochStats, make_loaders, make_optimizer,
                                    train, train_step)

pytestmark = pytest.mark.cuda
CONFIGS = osp.join(osp.dirname(osp.dirname(osp.abspath(__file__))),
                   'configs')
DEV = torch.device('cuda')


def setup(tmp_path, config, *extra, pad=False, capture='none'):
    cfg = load_config(osp.join(CONFIGS, f'{config}.yaml'), [
        f'dataset.dir={tmp_path}/d', 'dataset.size=24', 'gt.layers=2',
        'train.batch_size=6', 'train.loader=device', *extra])
    bundle = build_datasets(cfg)
    torch.manual_seed(0)
    model = build_model(cfg, bundle.dim_in, bundle.dim_out,
                        bundle.num_node_types, bundle.dim_edge,
                        bundle.num_edge_types).to(DEV)
    opt = make_optimizer(cfg, model.parameters(), capture)
    loader, _ = make_loaders(cfg, bundle, DEV, model,
                             torch.Generator().manual_seed(0), pad)
    stats = EpochStats(cfg.metric_best, bundle.dim_out, DEV)
    return cfg, model, opt, list(loader), stats


@pytest.mark.parametrize('config,backend,attn_impl', [
    ('pattern-gps', 'dfgnn', 'auto'), ('pattern-gps', 'dfgnn', 'fused'),
    ('pattern-gps', 'dfgnn', 'padded'), ('pattern-gps', 'pyg', 'auto'),
    ('pattern-gps-edge', 'dfgnn', 'auto'), ('pattern-gat', 'dfgnn', 'auto'),
    ('pattern-gt', 'dfgnn', 'auto'), ('cluster-gps', 'dfgnn', 'auto'),
    ('demo', 'dfgnn', 'auto')])
@pytest.mark.parametrize('pad', [False, True])
def test_training_step_has_no_host_sync(tmp_path, config, backend, attn_impl,
                                        pad):
    cfg, model, opt, batches, stats = setup(
        tmp_path, config, f'backend={backend}', f'gt.attn_impl={attn_impl}',
        pad=pad)
    model.train()
    sched = torch.optim.lr_scheduler.LambdaLR(opt, lambda e: 0.5)
    train_step(model, opt, batches[0], cfg, stats)  # first-call setup
    torch.cuda.synchronize()
    torch.cuda.set_sync_debug_mode('error')
    try:
        for batch in batches[1:]:
            train_step(model, opt, batch, cfg, stats)
    finally:
        torch.cuda.set_sync_debug_mode(0)
    sched.step()
    assert stats.result()['graphs'] == 24


@pytest.mark.parametrize('config', ['pattern-gps', 'cluster-gps'])
@pytest.mark.parametrize('pad', [False, True])
def test_global_attention_paths_agree(tmp_path, pad, config):
    """The global attention's three paths (varlen segments, the fused op on
    the block-diagonal complete graph, GraphGPS's padding) give one output
    on the real nodes and one gradient, on device batches with padding
    nodes and empty slots (pad) and on the PyG batch's ``ptr`` (varlen);
    cluster-gps's heads of 6 features run the fused op padded to 8."""
    from pyg_dfgnn.train.model import (fused_global_attention,
                                       padded_attention, varlen_attention,
                                       segment_bounds)
    cfg, model, _, batches, _ = setup(
        tmp_path, config, 'gt.attn_impl=fused', pad=pad)
    attn = model.layers[0].self_attn.eval()
    assert attn.head_dim == {'pattern-gps': 16, 'cluster-gps': 6}[config]
    for batch in batches:
        real = batch.num_real_nodes
        x = torch.randn(batch.num_nodes, attn.embed_dim, device=DEV,
                        requires_grad=True)
        g_out = torch.randn(real, attn.embed_dim, device=DEV)
        outs, grads = [], []
        for run in (lambda: varlen_attention(attn, x, *segment_bounds(batch),
                                             False),
                    lambda: fused_global_attention(attn, x, batch.attn_graph,
                                                   False),
                    lambda: padded_attention(attn, x, batch)):
            out = run()[:real]
            outs.append(out)
            grads.append(torch.autograd.grad(out, (x, attn.in_proj_weight),
                                             g_out))
        for out, grad in zip(outs[1:], grads[1:]):
            torch.testing.assert_close(out, outs[0], rtol=1e-4, atol=1e-5)
            torch.testing.assert_close(grad[0][:real], grads[0][0][:real],
                                       rtol=1e-4, atol=1e-5)
            torch.testing.assert_close(grad[1], grads[0][1], rtol=1e-4,
                                       atol=1e-4)
        assert torch.isfinite(grads[0][0]).all()  # padding rows too
    # a PyG batch's ptr (an empty graph among them, the largest graph
    # read on the host), head sizes the kernel takes padded (D = 6, 10)
    bounds = torch.tensor([0, 3, 3, 10, 11], device=DEV)

    class Ptr:
        ptr = bounds
    for dim, heads in ((64, 4), (48, 8), (80, 8)):
        attn = torch.nn.MultiheadAttention(dim, heads, batch_first=True,
                                           device=DEV).eval()
        x = torch.randn(11, dim, device=DEV)
        got = varlen_attention(attn, x, *segment_bounds(Ptr), False)
        for lo, hi in ((0, 3), (3, 10), (10, 11)):
            seg = x[lo:hi].unsqueeze(0)
            want = attn(seg, seg, seg, need_weights=False)[0][0]
            torch.testing.assert_close(got[lo:hi], want, rtol=1e-4,
                                       atol=1e-5)


@pytest.mark.parametrize('kind,dtype', [('add', torch.float32),
                                        ('dot', torch.float32),
                                        ('dot', torch.bfloat16)])
def test_stage_windows_give_the_graph_windows_results(tmp_path, kind, dtype):
    """The fused op on a padded device batch split into staging pieces
    (windows_per_graph) against one window per graph: same outputs and
    gradients (the pieces only change which block runs a row)."""
    from pyg_dfgnn.ops import fused_attention
    from pyg_dfgnn.train.batching import GraphStore
    cfg, _, _, _, _ = setup(tmp_path, 'pattern-gps')
    bundle = build_datasets(cfg)
    store = GraphStore(bundle.train, DEV)
    ids = torch.tensor([4, 1, 9, 0])
    one = store.batch(ids, pad=True, num_slots=6)
    pieces = store.batch(ids, pad=True, num_slots=6, windows_per_graph=7)
    assert pieces.dfgraph.stage_windows is not None
    n, heads, dim = one.num_nodes, 4, 32
    g = torch.Generator(device=DEV).manual_seed(0)
    shape = (n, heads, dim) if kind == 'dot' else (n, heads)
    leaves = [torch.randn(shape, device=DEV, generator=g).to(dtype)
              for _ in range(2)]
    v = torch.randn(n, heads, dim, device=DEV, generator=g).to(dtype)
    leaves = [t.requires_grad_() for t in (v, *leaves)]
    att = None
    results = []
    for batch in (one, pieces):
        out = fused_attention(batch.dfgraph, kind, *leaves, att, scale=0.2)
        grads = torch.autograd.grad(out, leaves, torch.ones_like(out))
        results.append((out, *grads))
    for a, b in zip(*results):
        torch.testing.assert_close(a.float(), b.float(), rtol=1e-5,
                                   atol=1e-5)


# No random draws (dropout, LapPE's sign flips): replays and compiled code
# draw other numbers (Philox offsets, kernels) than eager steps.
def no_random_draws(backend, *extra):
    return (f'backend={backend}', 'gt.attn_dropout=0.0', 'gt.dropout=0.0',
            'posenc_LapPE.enable=false',
            'dataset.node_encoder_name=LinearNode+RWSE', *extra)


def assert_same_training(model, twin, stats, stats2):
    """Weights and epoch sums of a captured / compiled run against the
    eager twin's. Adam's first updates are ~lr * sign(grad): rounding-level
    gradient differences (atomics in scatter ops) move a weight by up to
    2 lr per step (seen on an H100: 1.8e-3 after 12 steps at lr 1e-3)."""
    for (name, a), b in zip(model.state_dict().items(),
                            twin.state_dict().values()):
        assert torch.allclose(a.float(), b.float(), atol=1e-2,
                              rtol=1e-3), name
    ra, rb = stats.result(), stats2.result()
    assert ra['loss'] == pytest.approx(rb['loss'], rel=1e-3)
    assert ra['graphs'] == rb['graphs']


def assert_run_trains(tmp_path, capture):
    cfg = load_config(osp.join(CONFIGS, 'pattern-gps.yaml'), [
        f'dataset.dir={tmp_path}/d', f'out_dir={tmp_path}/r',
        'dataset.size=64', 'gt.layers=2', 'train.batch_size=8',
        'optim.max_epoch=3', f'train.capture={capture}',
        'train.progress_bar=false'])
    res = train(cfg, log=lambda *a: None)
    hist = res['history']
    assert res['finished'] and hist[-1]['train_loss'] < hist[0]['train_loss']
    return hist


@pytest.mark.parametrize('config,backend', [
    ('pattern-gps', 'dfgnn'), ('pattern-gps', 'pyg'), ('pattern-gt',
                                                       'dfgnn')])
def test_captured_step_matches_eager(tmp_path, config, backend):
    cfg, model, opt, batches, stats = setup(
        tmp_path, config, *no_random_draws(backend), pad=True,
        capture='graphs')
    twin = copy.deepcopy(model)
    opt2 = make_optimizer(cfg, twin.parameters(), 'graphs')
    stats2 = EpochStats(cfg.metric_best, 2, DEV)
    model.train()
    twin.train()
    captured = CapturedStep(
        lambda b: train_step(model, opt, b, cfg, stats), opt)
    seq = batches * 3  # repeated shapes: warm-up, capture, replays
    inputs = [b.x.clone() for b in batches]
    for batch in seq:
        captured(batch)
    # replays copy into the step's own batch, never into the caller's
    assert all(torch.equal(b.x, x) for b, x in zip(batches, inputs))
    for batch in seq:
        train_step(twin, opt2, batch, cfg, stats2)
    assert captured.replays > 0 and captured.graphs
    assert_same_training(model, twin, stats, stats2)


def test_captured_run_trains(tmp_path):
    assert_run_trains(tmp_path, 'true')


@pytest.mark.parametrize('config,backend', [
    ('pattern-gps', 'dfgnn'), ('pattern-gps', 'pyg')])
def test_compiled_step_matches_eager(tmp_path, config, backend):
    """train.capture compile: torch.compile(mode='reduce-overhead') of the
    step on padded batches (one eager warm-up step, then compiled ones)
    against eager steps on the same batches."""
    cfg, model, opt, batches, stats = setup(
        tmp_path, config, *no_random_draws(backend, 'train.capture=compile'),
        pad=True, capture='compile')
    twin = copy.deepcopy(model)
    opt2 = make_optimizer(cfg, twin.parameters())
    stats2 = EpochStats(cfg.metric_best, 2, DEV)
    model.train()
    twin.train()
    step = CompiledStep(lambda b: train_step(model, opt, b, cfg, stats),
                        DEV, static=(stats.sums, ))
    # A copy of the batch per step, as the runner builds a new batch each
    # step: a reused batch carries what earlier steps cached on its graphs
    # (a guard failure, i.e. a recompilation).
    seq = batches * 3
    for batch in [copy.deepcopy(b) for b in seq]:
        step(batch)
    for batch in [copy.deepcopy(b) for b in seq]:
        train_step(twin, opt2, batch, cfg, stats2)
    torch.cuda.synchronize()
    assert step.eager_steps == 1 and step.compiled_steps == len(seq) - 1
    # Dynamo's graphs: forward + loss + metrics per padded shape,
    # clipping, the optimizer's update; more mean graph breaks in the
    # CUDA step (the CPU test sees none).
    shapes = len({batch_key(b) for b in seq[1:]})
    assert 0 < step.captures <= 2 + shapes, \
        f'{step.captures} graphs compiled for {shapes} batch shapes'
    assert_same_training(model, twin, stats, stats2)


def test_compiled_run_trains(tmp_path):
    assert assert_run_trains(tmp_path, 'compile')[0]['captures'] > 0


@pytest.mark.parametrize('config,backend', [
    ('pattern-gps', 'dfgnn'), ('cluster-gps', 'dfgnn'),
    ('pattern-gps', 'pyg')])
def test_compiled_layers_in_captured_step_match_eager(tmp_path, config,
                                                      backend,
                                                      fresh_layer_compile):
    """train.compile_layers with capture graphs: the CUDA graphs replay
    inductor's compiled layers; one compilation per padded shape for all
    layers (first layer eager), the same training as eager steps."""
    cfg, model, opt, batches, stats = setup(
        tmp_path, config, *no_random_draws(backend),
        'train.compile_layers=true', 'posenc_RWSE.enable=true',
        'gt.layers=3', pad=True,
        capture='graphs')
    twin = copy.deepcopy(model)
    twin.compile_layers = False
    opt2 = make_optimizer(cfg, twin.parameters(), 'graphs')
    stats2 = EpochStats(cfg.metric_best, stats.num_classes, DEV)
    model.train()
    twin.train()
    captured = CapturedStep(
        lambda b: train_step(model, opt, b, cfg, stats), opt)
    seq = batches * 3
    for batch in seq:
        captured(batch)
    for batch in seq:
        train_step(twin, opt2, batch, cfg, stats2)
    torch.cuda.synchronize()
    assert captured.replays > 0 and captured.graphs
    shapes = len({batch_key(b) for b in seq})
    assert 0 < fresh_layer_compile['unique_graphs'] <= shapes
    assert_same_training(model, twin, stats, stats2)


def test_fused_attention_dropout_under_compile_matches_eager(
        tmp_path, fresh_layer_compile):
    """A GPS layer whose only random draw is the fused global attention's
    dropout mask (cluster-gps, gt.attn_impl fused, compiled or not): from
    the same seed, the compiled layer drops what the eager one drops, in
    its forward and its backward."""
    cfg, model, opt, batches, stats = setup(
        tmp_path, 'cluster-gps', 'gt.dropout=0.0', 'gt.attn_dropout=0.5',
        'gt.attn_impl=fused',
        pad=True, capture='graphs')
    model.train()
    batch = batches[0]
    assert batch.attn_graph is not None
    layer = model.layers[1]
    x0 = torch.randn(batch.x.size(0), cfg.gt.dim_hidden, device=DEV)
    graph = batch.dfgraph if model.local_takes_dfgraph else batch.edge_index
    model.layers[0](x0, graph, batch.batch, None, batch, batch.node_mask)
    outs = []
    for run in (gps_model.GPSLayer.__call__,
                gps_model.compiled_layer_forward()):
        x = x0.clone().requires_grad_()
        torch.manual_seed(1)
        out = run(layer, x, graph, batch.batch, None, batch, batch.node_mask)
        out.square().sum().backward()
        outs.append((out.detach(), x.grad))
    (a, ga), (b, gb) = outs
    assert torch.allclose(a, b, atol=1e-4, rtol=1e-4)
    assert torch.allclose(ga, gb, atol=1e-4, rtol=1e-4)
    # the mask is in effect: another seed drops other scores
    x = x0.clone()
    torch.manual_seed(2)
    c = gps_model.compiled_layer_forward()(
        layer, x, graph, batch.batch, None, batch, batch.node_mask)
    assert not torch.allclose(a, c.detach(), atol=1e-3)

"""Attention dropout, edge features (``edge_dim``) and
``return_attention_weights`` in the fused CUDA kernels: no configuration of
``benchmarks/training_features.py`` reaches the reference path in a training
step, the convs match PyG with copied weights (outputs, attention weights,
gradients of the parameters, ``x`` and ``edge_attr``), and the attention
dropout is seeded, unbiased and the same in the forward and the backward."""
import importlib.util
import math
from pathlib import Path

import pytest
import torch
from conv_helpers import flatten, make_pair, random_graph

import pyg_dfgnn.ops as ops
import pyg_dfgnn.ops.reference as reference

pytestmark = pytest.mark.cuda
DEV = 'cuda'
RTOL = 1e-4  # relative (norm) error of outputs and gradients, fp32


def _load_benchmark():
    path = (Path(__file__).resolve().parents[1] / 'benchmarks' /
            'training_features.py')
    spec = importlib.util.spec_from_file_location('_bench_training_features',
                                                  path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


bench = _load_benchmark()


def _patch_reference(monkeypatch, raising: bool):
    """Replace the reference op (the name the dispatcher calls and the
    defining module's) with a recorder; ``raising`` fails at the call."""
    calls = []

    def recorder(*args, **kwargs):
        calls.append(args[1] if len(args) > 1 else kwargs.get('kind'))
        if raising:
            raise AssertionError('the reference path was reached on CUDA')
        return original(*args, **kwargs)

    original = ops.fused_attention_reference
    monkeypatch.setattr(ops, 'fused_attention_reference', recorder)
    monkeypatch.setattr(reference, 'fused_attention_reference', recorder)
    return calls


@pytest.fixture
def no_reference(monkeypatch):
    return _patch_reference(monkeypatch, raising=True)


@pytest.fixture
def reference_calls(monkeypatch):
    """Records reference-path calls but lets them run, so that a parity
    test reports a wrong result and a fallback separately."""
    return _patch_reference(monkeypatch, raising=False)


# (a) -------------------------------------------------------------------------


@pytest.mark.parametrize('cfg', bench.CONFIGS, ids=lambda c: c.name)
def test_training_step_stays_fused(cfg, no_reference):
    torch.manual_seed(0)
    _, df = make_pair(cfg.conv, *cfg.args, **cfg.kwargs)
    df = df.to(DEV).train()
    ei, n = bench.make_graph(DEV, seed=0, scale=8 / 1024)  # 8 small graphs
    x = torch.randn(n, bench.IN_CHANNELS, device=DEV, requires_grad=True)
    kwargs, leaves = {}, [x]
    if cfg.edge_dim:
        kwargs['edge_attr'] = torch.randn(ei.size(1), cfg.edge_dim,
                                          device=DEV, requires_grad=True)
        leaves.append(kwargs['edge_attr'])
    if cfg.attention:
        kwargs['return_attention_weights'] = True
    out = df(x, ei, **kwargs)
    if cfg.attention:
        out, (_, alpha) = out
        assert alpha.is_cuda and torch.isfinite(alpha).all()
    out.square().mean().backward()
    assert not no_reference, f'reference path reached: {no_reference}'
    for t in leaves + [p for p in df.parameters() if p.requires_grad]:
        assert t.grad is not None and torch.isfinite(t.grad).all()


# (b) -------------------------------------------------------------------------


def _run(conv, leaves, call, seed=0):
    """``call(conv, inputs)`` on fresh requires-grad copies of the float
    leaves, backward of a fixed random weighting of every float output
    (features and attention weights); returns the outputs and the gradients
    of the leaves and parameters."""
    mine = {k: (v.detach().clone().requires_grad_()
                if v.is_floating_point() else v) for k, v in leaves.items()}
    conv.zero_grad(set_to_none=True)
    tensors = flatten(call(conv, mine))
    g = torch.Generator().manual_seed(seed)
    loss = 0.
    for t in tensors:
        if t.is_floating_point() and t.requires_grad:
            w = torch.randn(t.shape, generator=g).to(t.device, t.dtype)
            loss = loss + (t * w).sum()
    loss.backward()
    grads = {f'input {k}': v.grad for k, v in mine.items()
             if v.is_floating_point()}
    grads.update((f'param {k}', p.grad) for k, p in conv.named_parameters())
    return tensors, grads


def _rel(got, want, floor=0.0) -> float:
    got, want = got.double(), want.double()
    return ((got - want).norm() / max(want.norm().item(), floor, 1e-30)).item()


def assert_close_results(pyg_run, df_run, rtol=RTOL):
    """Outputs (edge indices exactly) and gradients of two ``_run``s."""
    (t_p, g_p), (t_d, g_d) = pyg_run, df_run
    assert len(t_p) == len(t_d)
    for i, (a, b) in enumerate(zip(t_p, t_d)):
        assert a.shape == b.shape, (i, a.shape, b.shape)
        if a.is_floating_point():
            assert a.dtype == b.dtype
            assert _rel(b, a) <= rtol, f'output {i}: rel. err {_rel(b, a)}'
        else:  # edge indices: same edges in the same order
            assert torch.equal(a.long(), b.long()), f'output {i} differs'
    assert g_p.keys() == g_d.keys()
    # A gradient that is zero in exact arithmetic (TransformerConv's key
    # bias: softmax ignores a per-row shift) is noise on both sides: it is
    # compared on the scale of the largest gradient instead.
    scale = max(g.double().norm().item() for g in g_p.values()
                if g is not None)
    for k, want in g_p.items():
        got = g_d[k]
        if want is None or got is None:  # no gradient vs zeros
            other = got if want is None else want
            assert other is None or not other.any(), k
            continue
        err = _rel(got, want, floor=1e-3 * scale)
        assert err <= rtol, f'{k}: rel. err {err}'


def assert_matches_pyg(pyg, df, leaves, call, rtol=RTOL):
    assert_close_results(_run(pyg, leaves, call), _run(df, leaves, call),
                         rtol)


def _call(attention=False):
    def call(conv, t):
        x = (t['xs'], t['xd']) if 'xs' in t else t['x']
        kwargs = {'edge_attr': t['ea']} if 'ea' in t else {}
        if attention:
            kwargs['return_attention_weights'] = True
        return conv(x, t['ei'], **kwargs)
    return call


def _leaves(kwargs, n=300, channels=16, seed=0):
    ei = random_graph(n, n, 8 * n, seed)  # unsorted, duplicates, a self-loop
    leaves = dict(x=torch.randn(n, channels), ei=ei)
    if kwargs.get('edge_dim'):
        leaves['ea'] = torch.randn(ei.size(1), kwargs['edge_dim'])
    return {k: v.to(DEV) for k, v in leaves.items()}


def _pair(name, *args, train=True, **kwargs):
    torch.manual_seed(0)
    pyg, df = make_pair(name, *args, **kwargs)
    pyg, df = pyg.to(DEV), df.to(DEV)
    return (pyg.train(), df.train()) if train else (pyg, df)


EDGE_CONFIGS = [
    ('gat', dict(heads=4, edge_dim=6)),  # self-loops, fill_value='mean'
    ('gat', dict(heads=4, edge_dim=6, add_self_loops=False)),
    ('gat', dict(heads=4, edge_dim=6, fill_value=0.5)),
    ('gat', dict(heads=2, edge_dim=6, concat=False, residual=True)),
    ('gatv2', dict(heads=4, edge_dim=6)),
    ('gatv2', dict(heads=4, edge_dim=6, add_self_loops=False)),
    ('gatv2', dict(heads=4, edge_dim=6, fill_value=-1.0)),
    ('gatv2', dict(heads=2, edge_dim=6, share_weights=True)),
    ('transformer', dict(heads=4, edge_dim=6)),
    ('transformer', dict(heads=2, edge_dim=6, concat=False, beta=True)),
]


@pytest.mark.parametrize('name,kwargs', EDGE_CONFIGS)
def test_edge_features_match_pyg(name, kwargs, reference_calls):
    pyg, df = _pair(name, 16, 8, **kwargs)  # dropout 0: train() is exact
    assert_matches_pyg(pyg, df, _leaves(kwargs), _call())
    assert not reference_calls, f'reference path reached: {reference_calls}'


ATTENTION_CONFIGS = [
    ('gat', dict(heads=4)),
    ('gat', dict(heads=4, add_self_loops=False)),
    ('gat', dict(heads=4, edge_dim=6)),
    ('gatv2', dict(heads=4)),
    ('gatv2', dict(heads=4, edge_dim=6)),
    ('transformer', dict(heads=4)),
    ('transformer', dict(heads=4, edge_dim=6)),
]


@pytest.mark.parametrize('name,kwargs', ATTENTION_CONFIGS)
def test_attention_weights_match_pyg(name, kwargs, reference_calls):
    # (edge_index, alpha) as PyG returns them, in PyG's edge order; the
    # loss weighs alpha too, so its gradient is checked as well.
    pyg, df = _pair(name, 16, 8, **kwargs)
    assert_matches_pyg(pyg, df, _leaves(kwargs), _call(attention=True))
    assert not reference_calls, f'reference path reached: {reference_calls}'


@pytest.mark.parametrize('name,kwargs', [
    ('gat', dict(heads=4, dropout=0.6)),
    ('gatv2', dict(heads=4, edge_dim=6, dropout=0.2)),
    ('transformer', dict(heads=4, dropout=0.1)),
    ('transformer', dict(heads=4, edge_dim=6, dropout=0.1)),
])
@pytest.mark.parametrize('attention', [False, True])
def test_dropout_in_eval_mode_matches_pyg(name, kwargs, attention,
                                          reference_calls):
    pyg, df = _pair(name, 16, 8, train=False, **kwargs)
    assert_matches_pyg(pyg, df, _leaves(kwargs), _call(attention))
    assert not reference_calls, f'reference path reached: {reference_calls}'


@pytest.mark.parametrize('add_self_loops', [False, True])
@pytest.mark.parametrize('attention', [False, True])
def test_bipartite_gat_with_edge_features_matches_pyg(add_self_loops,
                                                      attention,
                                                      reference_calls):
    pyg, df = _pair('gat', (8, 6), 8, heads=2, edge_dim=3,
                    add_self_loops=add_self_loops)
    ei = random_graph(40, 30, 300, 1)
    leaves = dict(xs=torch.randn(40, 8), xd=torch.randn(30, 6), ei=ei,
                  ea=torch.randn(300, 3))
    leaves = {k: v.to(DEV) for k, v in leaves.items()}
    assert_matches_pyg(pyg, df, leaves, _call(attention))
    assert not reference_calls, f'reference path reached: {reference_calls}'


# (c) -------------------------------------------------------------------------


def _seeded_step(conv, x, ei, seed):
    torch.manual_seed(seed)
    conv.zero_grad(set_to_none=True)
    x = x.detach().clone().requires_grad_()
    out = conv(x, ei)
    w = torch.randn(out.shape, generator=torch.Generator().manual_seed(1))
    (out * w.to(DEV)).sum().backward()
    grads = [x.grad] + [p.grad for p in conv.parameters()]
    return out.detach(), grads


@pytest.mark.parametrize('name,kwargs', [
    ('gat', dict(heads=4, dropout=0.5)),
    ('gatv2', dict(heads=4, dropout=0.5)),
    ('transformer', dict(heads=4, dropout=0.5)),
])
def test_dropout_is_seeded(name, kwargs, reference_calls):
    _, df = _pair(name, 16, 8, **kwargs)
    leaves = _leaves(kwargs)
    out_a, grads_a = _seeded_step(df, leaves['x'], leaves['ei'], seed=3)
    out_b, grads_b = _seeded_step(df, leaves['x'], leaves['ei'], seed=3)
    out_c, _ = _seeded_step(df, leaves['x'], leaves['ei'], seed=4)
    # first: the reference path's scatter (atomics) is not bitwise repeatable
    assert not reference_calls, f'reference path reached: {reference_calls}'
    assert torch.equal(out_a, out_b)
    for a, b in zip(grads_a, grads_b):  # the backward has no atomics
        assert (a is None and b is None) or torch.equal(a, b)
    assert not torch.equal(out_a, out_c)
    with torch.no_grad():  # and dropout is what changed it
        assert not torch.equal(df.eval()(leaves['x'], leaves['ei']), out_a)


def test_gat_dropout_statistics(reference_calls):
    p, heads, n = 0.3, 4, 2000
    _, df = _pair('gat', 16, 8, heads=heads, dropout=p)
    ei = random_graph(n, n, 20000, 5).to(DEV)
    x = torch.randn(n, 16, device=DEV)
    torch.manual_seed(7)
    out_t, (ei_t, alpha_t) = df(x, ei, return_attention_weights=True)
    df.eval()
    out_e, (ei_e, alpha_e) = df(x, ei, return_attention_weights=True)
    assert torch.equal(ei_t, ei_e)  # same edges, same order
    assert alpha_e.min() > 0  # so a zero in train() mode is a dropped edge
    e = alpha_t.size(0)
    assert e >= 20000

    dropped = alpha_t == 0
    sigma = math.sqrt(p * (1 - p) / e)
    for h in range(heads):
        frac = dropped[:, h].double().mean().item()
        assert abs(frac - p) <= 3 * sigma, (h, frac, p, sigma)
    # each head draws its own mask (as F.dropout on [E, H] does)
    q = p**heads
    frac_all = dropped.all(dim=1).double().mean().item()
    assert abs(frac_all - q) <= 3 * math.sqrt(q * (1 - q) / e), frac_all

    # kept edges carry the eval weights rescaled by 1 / (1 - p)
    kept = ~dropped
    torch.testing.assert_close(alpha_t[kept], alpha_e[kept] / (1 - p),
                               rtol=1e-5, atol=1e-8)
    # per destination: the kept weights sum to the kept eval weights, <= 1
    dst = ei_t[1]
    sum_t = torch.zeros(n, heads, device=DEV).index_add_(
        0, dst, alpha_t * (1 - p))
    sum_e = torch.zeros(n, heads, device=DEV).index_add_(
        0, dst, alpha_e * kept)
    torch.testing.assert_close(sum_t, sum_e, rtol=1e-5, atol=1e-6)
    assert sum_t.max() <= 1 + 1e-5

    # the output is made of exactly these weights
    h = df.lin(x).view(-1, heads, 8)
    want = torch.zeros(n, heads, 8, device=DEV).index_add_(
        0, dst, h[ei_t[0]] * alpha_t.unsqueeze(-1))
    want = want.view(n, -1) + df.bias
    assert _rel(out_t.detach(), want.detach()) <= 1e-5
    assert not reference_calls, f'reference path reached: {reference_calls}'


@pytest.mark.parametrize('name,kwargs', [
    ('gat', dict(heads=4, dropout=0.4)),
    ('gat', dict(heads=4, dropout=0.4, edge_dim=6)),
    ('gatv2', dict(heads=4, dropout=0.4)),
    ('gatv2', dict(heads=4, dropout=0.4, edge_dim=6)),
])
def test_dropout_backward_uses_the_forward_mask(name, kwargs, monkeypatch,
                                                reference_calls):
    # GAT / GATv2 return the weights after dropout: replaying our mask in
    # PyG's F.dropout must give the same outputs and gradients, so the
    # backward dropped the same edges as the forward.
    pyg, df = _pair(name, 16, 8, **kwargs)
    leaves = _leaves(kwargs, seed=2)
    call = _call(attention=True)
    torch.manual_seed(11)
    ours = _run(df, leaves, call)  # outputs: [out, edge_index, alpha]
    alpha = ours[0][-1]
    keep = (alpha != 0).to(alpha.dtype)
    assert 0 < keep.mean() < 1

    real_dropout = torch.nn.functional.dropout

    def replay(input, p=0.5, training=True, inplace=False):
        if input.shape != keep.shape:  # not the attention weights
            return real_dropout(input, p, training, inplace)
        return input * keep / (1 - p)

    with monkeypatch.context() as m:
        m.setattr(torch.nn.functional, 'dropout', replay)
        theirs = _run(pyg, leaves, call)
    assert_close_results(theirs, ours)
    assert not reference_calls, f'reference path reached: {reference_calls}'

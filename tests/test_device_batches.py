"""The device loader (pyg_dfgnn.train.batching) against PyG's collation, its
formats against DFGraph.from_edge_index, padding, and a CPU stand-in for
the GPU sync check: no host read of a device value in a training step."""
import pytest
import torch
from torch.utils.data import RandomSampler
from torch_geometric.data import Batch
from torch_geometric.loader import DataLoader

from pyg_dfgnn.datasets import build_datasets
from pyg_dfgnn.graph import DFGraph
from pyg_dfgnn.ops import fused_attention
from pyg_dfgnn.train.batching import DeviceLoader, GraphStore, bucket
from pyg_dfgnn.train.config import load_config
from pyg_dfgnn.train.model import build_model
from pyg_dfgnn.train.runner import EpochStats, accuracy_sbm, train_step
from pyg_dfgnn.train.runner import make_optimizer


def bundle_of(tmp_path, *extra, cfg='configs/pattern-gps.yaml'):
    cfg = load_config(cfg, [f'dataset.dir={tmp_path}/d', 'dataset.size=12',
                            *extra])
    return cfg, build_datasets(cfg)


def plain(t):
    return t.as_tensor() if hasattr(t, 'as_tensor') else t


@pytest.mark.parametrize('extra', [(), ('dataset.sbm_edge_attr=same_block',
                                        'dataset.name=CLUSTER'),
                                   ('gt.layer_type=DFTransformer+None', )])
def test_batches_match_pyg_collation(tmp_path, extra):
    cfg, bundle = bundle_of(tmp_path, *extra)
    store = GraphStore(bundle.train, 'cpu')
    for ids in ([3, 7, 0, 11], [5], list(range(12))):
        ids = torch.tensor(ids)
        ours = store.batch(ids, attention=True)
        ref = Batch.from_data_list([bundle.train[i] for i in ids.tolist()])
        for key in ref.keys():
            if key == 'num_nodes':
                assert ours.num_nodes == ref.num_nodes
                continue
            assert torch.equal(plain(ref[key]), getattr(ours, key)), key
        assert ours.num_graphs == ref.num_graphs
        # The format is what the convs would build from PyG's batch.
        g = ours.dfgraph
        want = DFGraph.from_edge_index(plain(ref.edge_index),
                                       num_nodes=ref.num_nodes)
        assert torch.equal(g.rowptr, want.rowptr)
        assert torch.equal(g.col.long(), want.col.long())
        for a, b in zip(g.csc(), want.csc()):
            assert torch.equal(a.long(), b.long())
        assert g.max_out_degree >= want.max_out_degree
        assert g.max_in_degree >= want.max_in_degree
        windows, span = g.row_windows(10_000)
        assert torch.equal(windows[:ids.numel() + 1], ref.ptr)
        assert span == store.max_graph_nodes
        assert g.row_windows(span - 1) == (None, 0)
        # The block-diagonal complete graph, against its explicit edges.
        edges = []
        for lo, hi in zip(ref.ptr[:-1].tolist(), ref.ptr[1:].tolist()):
            nodes = torch.arange(lo, hi)
            edges.append(torch.stack([nodes.repeat(hi - lo),
                                      nodes.repeat_interleave(hi - lo)]))
        want = DFGraph.from_edge_index(torch.cat(edges, 1),
                                       num_nodes=ref.num_nodes)
        a = ours.attn_graph
        assert torch.equal(a.rowptr, want.rowptr)
        assert torch.equal(a.col.long(), want.col.long())
        for x, y in zip(a.csc(), want.csc()):
            assert torch.equal(x.long(), y.long())


def test_device_loader_order_matches_dataloader(tmp_path):
    _, bundle = bundle_of(tmp_path)
    store = GraphStore(bundle.train, 'cpu')
    ours = DeviceLoader(store, 5, shuffle=True,
                        generator=torch.Generator().manual_seed(3))
    ref = DataLoader(bundle.train, batch_size=5, sampler=RandomSampler(
        bundle.train, generator=torch.Generator().manual_seed(3)))
    assert len(ours) == len(ref) == 3
    for a, b in zip(ours, ref):
        assert torch.equal(a.x, b.x) and torch.equal(a.y, b.y)


def test_bucket_sizes():
    assert [bucket(n) for n in (1, 8, 9, 100, 3776)] == [1, 8, 9, 104, 3840]
    assert len({bucket(n) for n in range(3500, 4100)}) <= 4


def test_padding_keeps_real_results(tmp_path):
    _, bundle = bundle_of(tmp_path)
    store = GraphStore(bundle.train, 'cpu')
    ids = torch.tensor([4, 1, 9])
    real = store.batch(ids, attention=True)
    pad = store.batch(ids, attention=True, pad=True, num_slots=5)
    n, e = real.num_nodes, real.edge_index.size(1)
    assert pad.num_nodes > n and int(pad.node_mask.sum()) == n
    assert pad.node_mask[:n].all()
    assert torch.equal(pad.edge_index[:, :e], real.edge_index)
    extra = pad.edge_index[:, e:]
    assert (extra >= n).all() and torch.equal(extra[0], extra[1])
    assert pad.dfgraph.in_degree.max() <= pad.dfgraph.max_in_degree
    assert pad.attn_graph.in_degree.max() <= pad.attn_graph.max_in_degree
    assert store.padded_sizes(ids, True, num_slots=5) == (
        pad.num_nodes, pad.edge_index.size(1), pad.attn_graph.num_edges)
    # The fused op (reference path) gives the same real rows.
    torch.manual_seed(0)
    for g_real, g_pad in ((real.dfgraph, pad.dfgraph),
                          (real.attn_graph, pad.attn_graph)):
        q, k, v = (torch.randn(pad.num_nodes, 2, 4) for _ in range(3))
        a = fused_attention(g_real, 'dot', v[:n], q[:n], k[:n], scale=0.5)
        b = fused_attention(g_pad, 'dot', v, q, k, scale=0.5)
        assert torch.allclose(a, b[:n], atol=1e-6)
        for x, y in zip(g_pad.csc(), DFGraph.from_edge_index(
                torch.stack([g_pad.col.long(), g_pad.row]),
                num_nodes=pad.num_nodes).csc()):
            assert torch.equal(x.long(), y.long())


def test_padded_shapes_are_few_and_fixed(tmp_path):
    # A captured step compiles one CUDA graph per padded shape: two epochs
    # of pattern-gps's training order (batch 32, a partial last batch)
    # give at most size_levels' shapes per split, the partial batch none of
    # its own, and no full batch is padded past twice its real sizes.
    from pyg_dfgnn.train.batching import LEVELS
    from pyg_dfgnn.train.capture import batch_key
    cfg = load_config('configs/pattern-gps.yaml', [
        f'dataset.dir={tmp_path}/d', 'dataset.size=120'])
    bundle = build_datasets(cfg)
    size = cfg.train.batch_size
    for split, ds in bundle.splits().items():
        store = GraphStore(ds, 'cpu')
        loader = DeviceLoader(store, size, shuffle=True,
                              generator=torch.Generator().manual_seed(0),
                              attention=True, pad=True, num_slots=size)
        levels = store.size_levels(size, True)
        assert 1 <= len(levels) <= LEVELS
        keys = set()
        for _ in range(2):
            for batch in loader:
                keys.add(batch_key(batch))
                n, e = batch.num_real_nodes, int(batch.node_mask.sum())
                assert n == e
                shape = (batch.num_nodes, batch.edge_index.size(1),
                         batch.attn_graph.num_edges)
                assert shape in levels
                assert batch.ptr.numel() == size + 1
                bounds, span = batch.dfgraph.graph_windows
                rows = store.max_graph_nodes
                assert bounds.numel() == size + 1 + -(-shape[0] // rows)
                # padding nodes too: windows of at most `span` rows
                assert span == rows and int(bounds.diff().max()) <= rows
                assert int(bounds[-1]) == shape[0]
                if batch.num_graphs == size:
                    real = (n, int((batch.edge_index[0] < n).sum()),
                            int((batch.ptr.diff()**2).sum()))
                    for padded, r in zip(shape, real):
                        assert padded <= 2 * r
        assert len(keys) <= len(levels), (split, keys)


@pytest.mark.parametrize('pad', [False, True])
def test_stage_windows_split_each_graph(tmp_path, pad):
    """windows_per_graph pieces per graph slot: in order from 0 to the last
    node, each piece inside one graph (or the padding), at most
    ceil(max_graph_nodes / pieces) rows; the graph windows stay (the TC
    backward's); the shape is fixed for a padded level."""
    _, bundle = bundle_of(tmp_path)
    store = GraphStore(bundle.train, 'cpu')
    rows = store.max_graph_nodes
    shapes = set()
    for ids in (torch.tensor([4, 1, 9]), torch.tensor([2]),
                torch.tensor([0, 3, 5])):
        one = store.batch(ids, attention=True, pad=pad, num_slots=5)
        got = store.batch(ids, attention=True, pad=pad, num_slots=5,
                          windows_per_graph=3)
        for g in (got.dfgraph, got.attn_graph):
            assert torch.equal(g.graph_windows[0],
                               one.dfgraph.graph_windows[0])
            stage, span = g.stage_windows
            assert span == rows
            assert g.row_windows(rows) == g.stage_windows
            assert int(stage[0]) == 0 and int(stage[-1]) == got.num_nodes
            assert (stage.diff() >= 0).all()
            sizes = stage.diff()
            slots = got.ptr.numel() - 1
            assert int(sizes[:3 * slots].max()) <= -(-rows // 3)
            assert int(sizes[3 * slots:].max()) <= rows  # padding windows
            graph_of = torch.bucketize(stage[:-1], got.ptr, right=True)
            last = torch.bucketize(stage[1:] - 1, got.ptr, right=True)
            inside = (graph_of == last) | (stage.diff() == 0)
            assert inside.all()
        shapes.add(got.dfgraph.stage_windows[0].numel())
        assert one.dfgraph.stage_windows is None
    if pad:  # a piece count per slot, whatever the graphs
        assert len(shapes) <= len(store.size_levels(5, True))


def test_partial_batch_pads_graph_level_rows(tmp_path):
    _, bundle = bundle_of(tmp_path)
    graphs = []
    for i in range(len(bundle.train)):
        d = bundle.train[i]
        d.g = torch.tensor([[float(i), 1.0]])  # a graph-level attribute
        graphs.append(d)
    store = GraphStore(graphs, 'cpu')
    a = store.batch(torch.tensor([0, 1, 2, 3]), pad=True, num_slots=4)
    b = store.batch(torch.tensor([5]), pad=True, num_slots=4)
    assert a.g.shape == b.g.shape == (4, 2) and b.num_graphs == 1
    assert torch.equal(b.g[0], torch.tensor([5.0, 1.0]))
    assert not b.g[1:].any()
    assert b.ptr.tolist() == [0] + [b.num_real_nodes] * 4
    assert torch.equal(store.batch(torch.tensor([5])).g, b.g[:1])


@pytest.mark.parametrize('backend', ['dfgnn', 'pyg'])
def test_padded_batch_gives_the_same_model_output(tmp_path, backend):
    # Padding nodes change nothing of the real nodes (eval) and are left
    # out of the batch-norm statistics (train: same running stats).
    cfg, bundle = bundle_of(tmp_path, f'backend={backend}', 'gt.layers=2',
                            'gt.attn_dropout=0.0')
    store = GraphStore(bundle.train, 'cpu')
    ids = torch.tensor([2, 6, 10])
    kw = dict(attention=backend == 'dfgnn', dfgraph=backend == 'dfgnn')
    real, pad = store.batch(ids, **kw), store.batch(ids, pad=True,
                                                    num_slots=4, **kw)
    ref = Batch.from_data_list([bundle.train[i] for i in ids.tolist()])
    torch.manual_seed(0)
    m = build_model(cfg, bundle.dim_in, bundle.dim_out)
    state = {k: v.clone() for k, v in m.state_dict().items()}
    m.eval()
    out_ref = m(ref)
    n = real.num_nodes
    assert torch.allclose(m(real), out_ref, atol=1e-5)
    assert torch.allclose(m(pad)[:n], out_ref, atol=1e-5)
    m.train()
    torch.manual_seed(1)
    a = m(real)
    stats_a = {k: v.clone() for k, v in m.state_dict().items()}
    m.load_state_dict(state)
    torch.manual_seed(1)
    b = m(pad)
    assert (a - b[:n]).abs().max() < 1e-3  # other summation orders
    for k, v in m.state_dict().items():
        assert torch.allclose(v.float(), stats_a[k].float(), atol=1e-5), k


def test_epoch_stats_match_the_host_metrics():
    torch.manual_seed(0)
    pred, y = torch.randn(50, 3), torch.randint(0, 3, (50, ))
    stats = EpochStats('accuracy-SBM', 3, torch.device('cpu'))
    mask = torch.rand(50) > 0.3
    stats.update(pred[:20], y[:20], torch.tensor(1.0), 2)
    stats.update(pred[20:], y[20:], torch.tensor(3.0), 2, mask[20:])
    keep = torch.cat([torch.ones(20, dtype=torch.bool), mask[20:]])
    res = stats.result()
    assert res['loss'] == pytest.approx(2.0)
    assert res['metric'] == pytest.approx(
        accuracy_sbm(pred.argmax(1)[keep], y[keep]))


class _HostRead(RuntimeError):
    pass


@pytest.mark.parametrize('config', ['pattern-gps', 'pattern-gps-edge',
                                    'pattern-gt', 'cluster-gps'])
def test_training_step_reads_nothing_on_the_host(tmp_path, monkeypatch,
                                                 config):
    """CPU stand-in for the GPU test under set_sync_debug_mode('error'):
    with the device loader's batch, a training step (model, loss, clipping,
    metrics) calls none of the ops that sync a GPU stream. The optimizer
    step is left out here: the CPU Adam reads its step counts (CPU
    tensors), the fused CUDA one that the GPU runs does not (the GPU test
    covers it)."""
    cfg, bundle = bundle_of(tmp_path, 'gt.layers=2', 'backend=dfgnn',
                            'dataset.edge_encoder_bn=true'
                            if config == 'pattern-gps-edge' else 'seed=0',
                            cfg=f'configs/{config}.yaml')
    store = GraphStore(bundle.train, 'cpu')
    torch.manual_seed(0)
    model = build_model(cfg, bundle.dim_in, bundle.dim_out,
                        bundle.num_node_types, bundle.dim_edge,
                        bundle.num_edge_types)
    opt = make_optimizer(cfg, model.parameters())
    sched = torch.optim.lr_scheduler.LambdaLR(opt, lambda e: 0.5)
    stats = EpochStats(cfg.metric_best, bundle.dim_out, torch.device('cpu'))
    batches = [store.batch(torch.tensor(ids), attention=True, pad=pad,
                           num_slots=4 if pad else None)
               for ids, pad in (([0, 3, 5], False), ([1, 2, 4], True))]
    model.train()
    train_step(model, opt, batches[0], cfg, stats)  # first-call setup

    in_optimizer = []
    step = opt.step

    def optimizer_step(*args, **kwargs):
        in_optimizer.append(True)
        try:
            return step(*args, **kwargs)
        finally:
            in_optimizer.pop()

    opt.step = optimizer_step

    def refuse(name):
        original = getattr(torch.Tensor if name.startswith('Tensor.') else
                           torch, name.split('.')[1])

        def op(*args, **kwargs):
            if in_optimizer:
                return original(*args, **kwargs)
            raise _HostRead(f'{name} in a training step')
        return op

    with monkeypatch.context() as m:
        for name in ('item', 'tolist', '__bool__', '__int__', '__float__',
                     'nonzero', 'unique', 'cpu', 'numpy'):
            m.setattr(torch.Tensor, name, refuse(f'Tensor.{name}'))
        for name in ('nonzero', 'unique', 'bincount', 'masked_select'):
            m.setattr(torch, name, refuse(f'torch.{name}'))
        # Boolean-mask indexing and repeat_interleave without output_size
        # size their outputs from the data (a sync in C++).
        getitem, setitem = torch.Tensor.__getitem__, torch.Tensor.__setitem__
        repeat = torch.repeat_interleave

        def masked(index):
            parts = index if isinstance(index, tuple) else (index, )
            return any(isinstance(p, torch.Tensor) and p.dtype == torch.bool
                       for p in parts)

        def checked_getitem(self, index):
            if masked(index) and not in_optimizer:
                raise _HostRead('boolean-mask indexing in a training step')
            return getitem(self, index)

        def checked_setitem(self, index, value):
            if masked(index) and not in_optimizer:
                raise _HostRead('boolean-mask indexing in a training step')
            return setitem(self, index, value)

        def checked_repeat(input, repeats=None, *args, **kwargs):
            if isinstance(repeats, torch.Tensor) and \
                    kwargs.get('output_size') is None:
                raise _HostRead('repeat_interleave without output_size')
            return repeat(input, repeats, *args, **kwargs)

        m.setattr(torch.Tensor, '__getitem__', checked_getitem)
        m.setattr(torch.Tensor, '__setitem__', checked_setitem)
        m.setattr(torch, 'repeat_interleave', checked_repeat)
        for batch in batches:
            train_step(model, opt, batch, cfg, stats)
    sched.step()
    assert stats.result()['graphs'] == 9

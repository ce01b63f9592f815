"""Sampled mini-batches: the Reddit-like generator, the tensor-op neighbour
sampler (against PyG's batch layout), the DF convs on hop-trimmed batches,
and the Reddit-size examples at a small scale on the CPU."""
import os.path as osp
import subprocess
import sys

import pytest
import torch

from pyg_dfgnn.datasets.reddit_like import REDDIT_STATS, reddit_like
from pyg_dfgnn.sampler import NeighborSampler, hop_slices, neighbor_loader

ROOT = osp.dirname(osp.dirname(osp.abspath(__file__)))


@pytest.fixture(scope='module')
def graph():
    return reddit_like(0.01, avg_degree=20, seed=0)


def test_reddit_like_shape(graph):
    n = round(REDDIT_STATS['num_nodes'] * 0.01)
    assert graph.num_nodes == n and graph.x.shape == (n, 602)
    assert graph.num_edges == 2 * round(n * 20 / 2)
    src, dst = graph.edge_index
    assert bool((dst[1:] >= dst[:-1]).all())  # CSR order
    assert not bool((src == dst).any())
    # Undirected: both directions of every pair.
    fwd = (src * n + dst).sort().values
    assert torch.equal(fwd, (dst * n + src).sort().values)
    masks = graph.train_mask.long() + graph.val_mask.long() + \
        graph.test_mask.long()
    assert bool((masks == 1).all())
    assert abs(graph.train_mask.float().mean().item() - 0.6586) < 0.01
    homophily = (graph.y[src] == graph.y[dst]).float().mean().item()
    assert 0.6 < homophily < 0.8
    assert torch.equal(reddit_like(0.01, avg_degree=20, seed=0).edge_index,
                       graph.edge_index)


def test_reddit_like_full_size_edge_count():
    # The edge count at scale 1 is Reddit's (checked without generating).
    pairs = round(REDDIT_STATS['num_edges'] / 2)
    assert 2 * pairs == REDDIT_STATS['num_edges']


def _check_batch(out, edge_index, seeds, fanout):
    node, row, col = out.node, out.row, out.col
    assert torch.equal(node[:seeds.numel()], seeds)
    assert node.unique().numel() == node.numel()
    assert sum(out.num_sampled_nodes) == node.numel()
    assert sum(out.num_sampled_edges) == row.numel() == col.numel()
    assert bool((col[1:] >= col[:-1]).all())  # sorted by destination
    # Every sampled edge is an input edge, with its input id.
    assert torch.equal(edge_index[0, out.edge], node[row])
    assert torch.equal(edge_index[1, out.edge], node[col])
    assert out.edge.unique().numel() == out.edge.numel()
    # Per destination min(degree, fanout) edges, hop by hop.
    deg = torch.bincount(edge_index[1], minlength=int(edge_index.max()) + 1)
    lo = 0
    n_lo, n_hi = 0, out.num_sampled_nodes[0]
    for hop, k in enumerate(fanout):
        e = out.num_sampled_edges[hop]
        got = torch.bincount(col[lo:lo + e] - n_lo, minlength=n_hi - n_lo)
        assert torch.equal(got, deg[node[n_lo:n_hi]].clamp_max(k))
        lo += e
        n_lo, n_hi = n_hi, n_hi + out.num_sampled_nodes[hop + 1]


def test_sampler_layout(graph):
    s = NeighborSampler(graph.edge_index, graph.num_nodes, [5, 3],
                        generator=torch.Generator().manual_seed(0))
    seeds = torch.tensor([3, 17, 400, 1000])
    _check_batch(s.sample(seeds), graph.edge_index, seeds, [5, 3])
    # The map from global to batch ids is clean again afterwards.
    assert bool((s._local == -1).all())
    # Unsorted input edges: e_id still names the input edge.
    perm = torch.randperm(graph.num_edges)
    shuffled = graph.edge_index[:, perm]
    s = NeighborSampler(shuffled, graph.num_nodes, [4, -1])
    _check_batch(s.sample(seeds), shuffled, seeds, [4, 10**9])


def test_sampler_uniform_without_replacement():
    # Node 0: 40 in-edges (draw-and-redraw path), node 1: 7 (random keys).
    src = torch.cat([torch.arange(2, 42), torch.arange(2, 9)])
    dst = torch.cat([torch.zeros(40, dtype=torch.long),
                     torch.ones(7, dtype=torch.long)])
    s = NeighborSampler(torch.stack([src, dst]), 42, [5],
                        generator=torch.Generator().manual_seed(1))
    counts = torch.zeros(47)
    runs = 2000
    for _ in range(runs):
        out = s.sample(torch.tensor([0, 1]))
        assert out.edge.unique().numel() == 10
        counts[out.edge] += 1
    for lo, hi in ((0, 40), (40, 47)):
        expected = runs * 5 / (hi - lo)
        chi2 = ((counts[lo:hi] - expected)**2 / expected).sum().item()
        assert chi2 < 3 * (hi - lo - 1) + 20  # far above dof, far below bias


def test_neighbor_loader_matches_pyg_layout(graph):
    pytest.importorskip('torch_sparse')
    from torch_geometric.loader import NeighborLoader
    ours = next(iter(neighbor_loader(graph, [10, 5], graph.train_mask, 64)))
    pyg = next(iter(NeighborLoader(graph, num_neighbors=[10, 5],
                                   input_nodes=graph.train_mask,
                                   batch_size=64)))
    assert ours.batch_size == pyg.batch_size == 64
    assert torch.equal(ours.n_id[:64], pyg.n_id[:64])
    assert torch.equal(ours.y, graph.y[ours.n_id])
    assert torch.equal(ours.x, graph.x[ours.n_id])
    for b in (ours, pyg):  # same orientation: sampled neighbour -> seed side
        assert bool((b.edge_index[1][1:] >= b.edge_index[1][:-1]).all())
        assert int(b.edge_index[1].min()) == 0
    assert bool((ours.edge_index[1, :ours.num_sampled_edges[0]] < 64).all())


def test_neighbor_loader_shards(graph):
    seen = []
    steps = set()
    for rank in range(2):
        ld = neighbor_loader(graph, [3], graph.train_mask, 50, shuffle=True,
                             seed=1, rank=rank, world_size=2)
        ld.sampler.set_epoch(0)
        ids = [b.n_id[:b.batch_size] for b in ld]
        steps.add(len(ids))
        seen.append(torch.cat(ids))
    assert len(steps) == 1  # equal step counts: no rank waits
    both = torch.cat(seen)
    train = graph.train_mask.nonzero().view(-1)
    assert torch.equal(both.unique(), train)  # every seed, padding aside
    assert both.numel() - train.numel() <= 1


def test_unpadded_shards_give_every_seed_once(graph):
    # Evaluation: counts summed over the ranks see each node once.
    val = graph.val_mask.nonzero().view(-1)
    world = 2 if val.numel() % 2 else 3
    assert val.numel() % world
    seen = torch.cat([
        torch.cat([b.n_id[:b.batch_size] for b in neighbor_loader(
            graph, [3], graph.val_mask, 50, rank=rank, world_size=world,
            pad=False)]) for rank in range(world)])
    assert torch.equal(seen.sort().values, val)


def test_workers_sample_anew_every_epoch():
    gen = torch.Generator().manual_seed(0)
    ei = torch.randint(0, 400, (2, 8000), generator=gen)
    from torch_geometric.data import Data
    data = Data(x=torch.randn(400, 2), edge_index=ei)

    def epoch(loader):
        return torch.cat([b.e_id for b in loader])

    torch.manual_seed(0)
    ld = neighbor_loader(data, [3], None, 100, num_workers=2)
    first, second = epoch(ld), epoch(ld)
    assert not torch.equal(first, second)
    torch.manual_seed(0)  # seeded: the same samples again
    again = epoch(neighbor_loader(data, [3], None, 100, num_workers=2))
    assert torch.equal(first, again)


def test_sampler_bad_input():
    ei = torch.randint(0, 50, (2, 300), generator=torch.Generator(
    ).manual_seed(0))
    with pytest.raises(IndexError, match='out of range for 10'):
        NeighborSampler(ei, 10, [2])
    from torch_geometric.data import Data
    data = Data(x=torch.randn(50, 2), edge_index=ei)
    with pytest.raises(ValueError, match=r"\['replace'\] are not supported"):
        neighbor_loader(data, [2], None, 8, replace=True)


@pytest.mark.parametrize('conv', ['gat', 'transformer'])
def test_df_convs_on_trimmed_batches_match_pyg(graph, conv):
    sys.path.insert(0, osp.join(ROOT, 'examples'))
    from common import AttentionGNN
    batch = next(iter(neighbor_loader(graph, [6, 4], graph.train_mask, 32)))
    torch.manual_seed(0)
    ours = AttentionGNN(conv, 'dfgnn', 602, 32, 41, 2, 4, dropout=0.0)
    torch.manual_seed(0)
    ref = AttentionGNN(conv, 'pyg', 602, 32, 41, 2, 4, dropout=0.0)
    ref.load_state_dict(ours.state_dict())
    edges = ours.layer_edges(batch.edge_index, batch.num_sampled_nodes,
                             batch.num_sampled_edges)
    out = ours.forward_sampled(batch.x, edges)
    assert out.shape == (32, 41)
    torch.testing.assert_close(out, ref.forward_sampled(batch.x, edges),
                               atol=1e-4, rtol=1e-4)
    # Trimming changes nothing for the seeds: the whole subgraph agrees.
    full = ours(batch.x, batch.edge_index)[:32]
    torch.testing.assert_close(out, full, atol=1e-4, rtol=1e-4)


def test_hop_slices():
    assert hop_slices([4, 10, 30], [12, 40], 0, 2) == (44, 14, 52)
    assert hop_slices([4, 10, 30], [12, 40], 1, 2) == (14, 4, 12)


def _example(name, *args, timeout=240):
    proc = subprocess.run(
        [sys.executable, osp.join(ROOT, 'examples', name), *args],
        capture_output=True, text=True, timeout=timeout, cwd=ROOT)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    return proc.stdout


def test_sampled_example_learns(tmp_path):
    out = tmp_path / 'r.json'
    _example('sampled_reddit.py', '--scale', '0.01', '--avg-degree', '20',
             '--device', 'cpu', '--epochs', '2', '--batch-size', '128',
             '--hidden', '32', '--fanout', '8,4', '--json', str(out))
    import json
    r = json.loads(out.read_text())
    h = r['history']
    assert h[1]['train_loss'] < h[0]['train_loss']
    assert h[1]['val_acc'] > 0.3  # 41 classes: chance is < 0.1
    assert {'sample_s', 'format_s', 'step_s'} <= set(h[0])


def test_full_graph_example(tmp_path):
    out = tmp_path / 'r.json'
    _example('full_graph_reddit.py', '--scale', '0.005', '--avg-degree',
             '10', '--device', 'cpu', '--steps', '1', '--warmup', '0',
             '--hidden', '16', '--json', str(out))
    import json
    runs = json.loads(out.read_text())['runs']
    assert [r['backend'] for r in runs] == ['dfgnn', 'pyg']
    assert all(r['status'] == 'ok' for r in runs)
    assert abs(runs[0]['final_loss'] - runs[1]['final_loss']) < 1e-4


def test_format_build_out_of_memory_says_what_to_do(monkeypatch):
    from pyg_dfgnn import DFGraph

    def oom(*args, **kwargs):
        raise torch.OutOfMemoryError('CUDA out of memory. Tried to allocate '
                                     '3.00 GiB')
    monkeypatch.setattr(torch, 'sort', oom)
    edge_index = torch.tensor([[0, 1, 2], [2, 0, 1]])
    with pytest.raises(torch.OutOfMemoryError,
                       match=r'3 edges .*sampled subgraphs.*Tried to alloc'):
        DFGraph.from_edge_index(edge_index, num_nodes=3)


@pytest.mark.parametrize('per_rank', [False, True])
def test_sampled_example_under_torchrun(tmp_path, per_rank):
    import json
    import os
    import socket
    with socket.socket() as s:
        s.bind(('127.0.0.1', 0))
        port = s.getsockname()[1]
    out = tmp_path / 'r.json'
    env = dict(os.environ, OMP_NUM_THREADS='1')
    env.pop('WORLD_SIZE', None)
    proc = subprocess.run(
        [sys.executable, '-m', 'torch.distributed.run', '--nproc_per_node=2',
         f'--master_port={port}', osp.join(ROOT, 'examples',
                                           'sampled_reddit.py'),
         '--scale', '0.01', '--avg-degree', '20', '--device', 'cpu',
         '--epochs', '1', '--batch-size', '128', '--hidden', '32',
         '--fanout', '8,4', '--json', str(out)] +
        (['--per-rank-batch'] if per_rank else []),
        capture_output=True, text=True, timeout=240, cwd=ROOT, env=env)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    r = json.loads(out.read_text())
    assert r['world_size'] == 2
    assert proc.stdout.count('epoch 0:') == 1  # rank 0 logs alone
    # Both ranks' seeds together: the epoch covers the training split.
    n_train = int(reddit_like(0.01, avg_degree=20).train_mask.sum())
    h = r['history'][0]
    # Each rank gets ceil(n_train / 2) seeds (DistributedSampler pads);
    # global: 64 per rank and step, per rank: 128 (half the steps).
    per_rank_seeds = -(-n_train // 2)
    assert h['seeds'] == 2 * per_rank_seeds
    if per_rank:
        assert h['steps'] == -(-per_rank_seeds // 128)
        assert h['steps'] < -(-n_train // 128)
    else:
        assert h['steps'] == -(-n_train // 128)

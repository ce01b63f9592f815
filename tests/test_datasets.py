import time

import numpy as np
import pytest
import torch

import pyg_dfgnn.datasets.sbm as sbm
from pyg_dfgnn.datasets import (PUBLISHED_STATS, AddLapPE, AddRWSE,
                                SBMDataset,
                                build_datasets, dataset_stats,
                                generate_sbm_splits, load_pyg_dataset)
from pyg_dfgnn.train.config import load_config


@pytest.fixture(scope='module')
def generated():
    # 1500 graphs per dataset: the per-graph means have ~0.5 % noise.
    return {name: generate_sbm_splits(name, size=1500, seed=0)
            for name in ('PATTERN', 'CLUSTER')}


@pytest.mark.parametrize('name', ['PATTERN', 'CLUSTER'])
def test_statistics_match_published(generated, name):
    stats = dataset_stats(generated[name]['train'])
    pub = PUBLISHED_STATS[name]
    assert stats['num_nodes'] == pytest.approx(pub['num_nodes'], rel=0.03)
    assert stats['num_edges'] == pytest.approx(pub['num_edges'], rel=0.04)
    assert stats['mean_degree'] == pytest.approx(
        pub['num_edges'] / pub['num_nodes'], rel=0.03)
    assert len(stats['class_share']) == pub['num_classes']


def test_class_balance(generated):
    share = dataset_stats(generated['PATTERN']['train'])['class_share']
    # 20 pattern nodes among 5 x 19.5 + 20: 17 % positives.
    assert share[1] == pytest.approx(20 / 117.5, abs=0.01)
    share = dataset_stats(generated['CLUSTER']['train'])['class_share']
    for c in range(6):
        assert share[c] == pytest.approx(1 / 6, abs=0.01)


def test_cluster_signal_and_features(generated):
    for g in generated['CLUSTER']['val'][:50]:
        assert g.x.shape == (g.num_nodes, 7)
        assert torch.equal(g.x.sum(1), torch.ones(g.num_nodes))
        symbol = g.x.argmax(1)
        labelled = symbol > 0
        # exactly one labelled node per cluster, carrying cluster id + 1
        assert int(labelled.sum()) == 6
        assert torch.equal(torch.sort(symbol[labelled] - 1)[0],
                           torch.arange(6))
        assert torch.equal(symbol[labelled] - 1, g.y[labelled])
        sizes = torch.bincount(g.y, minlength=6)
        assert int(sizes.min()) >= 5 and int(sizes.max()) <= 34


def test_pattern_structure(generated):
    for g in generated['PATTERN']['test'][:50]:
        assert g.x.shape == (g.num_nodes, 3)
        assert int(g.y.sum()) == 20
        src, dst = g.edge_index
        # undirected, no self-loops, no duplicates
        assert not bool((src == dst).any())
        keys = set((src * g.num_nodes + dst).tolist())
        assert len(keys) == g.num_edges
        assert keys == set((dst * g.num_nodes + src).tolist())
    # pattern nodes are denser: inner p = 0.5 and joined to all with 0.5
    g = generated['PATTERN']['train'][0]
    deg = torch.bincount(g.edge_index[1], minlength=g.num_nodes).float()
    assert deg[g.y == 1].mean() > deg[g.y == 0].mean()


def test_pattern_instances_shared_across_splits(generated):
    # graph i of every split carries pattern i % 100: same symbols on it
    splits = generated['PATTERN']
    for i in (0, 7):
        a, b = splits['train'][i], splits['val'][i]
        sym_a = torch.sort(a.x[a.y == 1].argmax(1))[0]
        sym_b = torch.sort(b.x[b.y == 1].argmax(1))[0]
        assert torch.equal(sym_a, sym_b)


def test_split_sizes():
    assert sbm.split_sizes('PATTERN', None) == (10000, 2000, 2000)
    assert sbm.split_sizes('CLUSTER', None) == (10000, 1000, 1000)
    assert sbm.split_sizes('PATTERN', 100) == (100, 20, 20)
    assert sbm.split_sizes('CLUSTER', 3) == (3, 1, 1)


def test_generation_is_seeded():
    a = generate_sbm_splits('CLUSTER', size=5, seed=1)['train']
    b = generate_sbm_splits('CLUSTER', size=5, seed=1)['train']
    c = generate_sbm_splits('CLUSTER', size=5, seed=2)['train']
    for ga, gb in zip(a, b):
        assert torch.equal(ga.edge_index, gb.edge_index)
        assert torch.equal(ga.x, gb.x) and torch.equal(ga.y, gb.y)
    assert any(ga.num_nodes != gc.num_nodes or
               not torch.equal(ga.edge_index, gc.edge_index)
               for ga, gc in zip(a, c))


def test_bad_arguments():
    with pytest.raises(ValueError, match='name'):
        generate_sbm_splits('ZINC', 5)
    with pytest.raises(ValueError, match='size'):
        generate_sbm_splits('PATTERN', 0)
    with pytest.raises(ValueError, match='split'):
        SBMDataset('/tmp/unused', 'PATTERN', split='dev', size=2)


def test_cached_on_disk(tmp_path, monkeypatch):
    ds = SBMDataset(str(tmp_path), 'PATTERN', 'train', size=10, seed=3)
    assert len(ds) == 10
    assert len(SBMDataset(str(tmp_path), 'PATTERN', 'val', size=10,
                          seed=3)) == 2

    def boom(*args, **kwargs):
        raise AssertionError('regenerated although cached')

    monkeypatch.setattr(sbm, 'generate_sbm_splits', boom)
    again = SBMDataset(str(tmp_path), 'PATTERN', 'train', size=10, seed=3)
    assert torch.equal(again[4].edge_index, ds[4].edge_index)
    with pytest.raises(AssertionError, match='regenerated'):
        SBMDataset(str(tmp_path), 'PATTERN', 'train', size=10, seed=4)


def test_dfgnn_pre_transform_applied(tmp_path):
    cfg = load_config(overrides=[f'dataset.dir={tmp_path}', 'dataset.size=4',
                                 'gt.layer_type=DFGAT+Transformer'])
    bundle = build_datasets(cfg)
    g = bundle.train[0]
    dst = torch.as_tensor(g.edge_index)[1]
    assert bool((dst[1:] >= dst[:-1]).all())  # sorted by destination
    src = torch.as_tensor(g.edge_index)[0]
    assert int((src == dst).sum()) == g.num_nodes  # GAT's self-loops, once
    assert (bundle.dim_in, bundle.dim_out) == (3, 2)
    # transformer layers take no self-loops
    cfg = load_config(overrides=[f'dataset.dir={tmp_path}', 'dataset.size=4',
                                 'gt.layer_type=DFTransformer+None'])
    g = build_datasets(cfg).train[0]
    ei = torch.as_tensor(g.edge_index)
    assert not bool((ei[0] == ei[1]).any())
    assert bool((ei[1][1:] >= ei[1][:-1]).all())


def test_lap_pe():
    g = generate_sbm_splits('CLUSTER', size=1, seed=0)['train'][0]
    out = AddLapPE(max_freqs=10)(g.clone())
    assert out.EigVecs.shape == (g.num_nodes, 10)
    assert out.EigVals.shape == (g.num_nodes, 10, 1)
    vals = out.EigVals[0, :, 0]
    assert bool((vals[1:] >= vals[:-1] - 1e-6).all())
    gram = out.EigVecs.t() @ out.EigVecs
    assert torch.allclose(gram, torch.eye(10), atol=1e-4)
    # a 3-node path: padded with NaN beyond its 3 eigenpairs
    from torch_geometric.data import Data
    path = Data(edge_index=torch.tensor([[0, 1, 1, 2], [1, 0, 2, 1]]),
                num_nodes=3)
    out = AddLapPE(max_freqs=5)(path)
    assert torch.isnan(out.EigVecs[:, 3:]).all()
    assert not torch.isnan(out.EigVecs[:, :3]).any()
    assert out.EigVals[0, :3, 0].tolist() == pytest.approx([0, 1, 3],
                                                           abs=1e-5)


def test_pyg_dataset_absent_is_a_clear_error_not_a_download(tmp_path,
                                                            monkeypatch):
    import torch_geometric.data.dataset as pyg_dataset_mod
    import torch_geometric.datasets.gnn_benchmark_dataset as gbd

    def no_network(*args, **kwargs):
        raise AssertionError('tried to download')

    monkeypatch.setattr(gbd, 'download_url', no_network, raising=False)
    monkeypatch.setattr(pyg_dataset_mod, 'download_url', no_network,
                        raising=False)
    start = time.time()
    with pytest.raises(FileNotFoundError,
                       match="never downloads.*dataset.format: SBM"):
        load_pyg_dataset('GNNBenchmarkDataset', 'PATTERN', str(tmp_path),
                         'train')
    assert time.time() - start < 5
    cfg = load_config(overrides=['dataset.format=PyG-GNNBenchmarkDataset',
                                 f'dataset.dir={tmp_path}'])
    with pytest.raises(FileNotFoundError, match='PATTERN'):
        build_datasets(cfg)
    with pytest.raises(FileNotFoundError, match='ZINC'):
        load_pyg_dataset('ZINC', 'subset', str(tmp_path), 'train')
    with pytest.raises(ValueError, match='PyG-QM9 is not supported'):
        load_pyg_dataset('QM9', 'x', str(tmp_path), 'train')


def test_pyg_dataset_loads_local_processed_files(tmp_path):
    """A GNNBenchmarkDataset whose processed files are present loads
    (without raw files and without network)."""
    import os
    from torch_geometric.data import InMemoryDataset
    graphs = generate_sbm_splits('PATTERN', size=3, seed=0)
    proc = tmp_path / 'GNNBenchmarkDataset' / 'PATTERN' / 'processed'
    os.makedirs(proc)
    for split in ('train', 'val', 'test'):
        InMemoryDataset.save(graphs[split], str(proc / f'{split}_data.pt'))
    ds = load_pyg_dataset('GNNBenchmarkDataset', 'PATTERN', str(tmp_path),
                          'val')
    assert len(ds) == 1
    assert np.array_equal(ds[0].y.numpy(), graphs['val'][0].y.numpy())


def test_pyg_dataset_processed_per_pre_transform(tmp_path):
    """Processed files are kept per pre-transform variant (PyG only warns
    when a cache was built with other ones, then uses it): a variant reads
    its own folder, never another's."""
    import os
    from torch_geometric.data import InMemoryDataset
    graphs = generate_sbm_splits('PATTERN', size=3, seed=0)
    base = tmp_path / 'GNNBenchmarkDataset' / 'PATTERN' / 'processed'
    os.makedirs(base / 'dfloops')
    for split in ('train', 'val', 'test'):
        InMemoryDataset.save(graphs[split], str(base / 'dfloops' /
                                                f'{split}_data.pt'))
    ds = load_pyg_dataset('GNNBenchmarkDataset', 'PATTERN', str(tmp_path),
                          'val', variant='dfloops')
    assert ds.processed_dir == str(base / 'dfloops') and len(ds) == 1
    with pytest.raises(FileNotFoundError, match='never downloads'):
        load_pyg_dataset('GNNBenchmarkDataset', 'PATTERN', str(tmp_path),
                         'val', variant='df')


def test_graph_level_pyg_dataset_is_refused(tmp_path, monkeypatch):
    # ZINC / MNIST have one target per graph; the runner's head is per node.
    import pyg_dfgnn.datasets as datasets
    from torch_geometric.data import Data
    from pyg_dfgnn.train.config import ConfigError
    graph = Data(x=torch.zeros(5, 1, dtype=torch.long),
                 edge_index=torch.tensor([[0, 1], [1, 0]]),
                 y=torch.tensor([0.5]))
    monkeypatch.setattr(datasets, 'load_pyg_dataset',
                        lambda *a, **k: [graph, graph])
    cfg = load_config(overrides=['dataset.format=PyG-ZINC',
                                 'dataset.name=subset',
                                 f'dataset.dir={tmp_path}'])
    with pytest.raises(ConfigError, match='graph-level targets'):
        build_datasets(cfg)


def test_damaged_generated_split_names_the_fix(tmp_path):
    from pyg_dfgnn.datasets.sbm import DatasetError
    ds = SBMDataset(str(tmp_path), 'PATTERN', 'val', size=3, seed=0)
    with open(ds.processed_paths[1], 'r+b') as f:
        f.truncate(100)
    with pytest.raises(DatasetError, match='damaged.*delete'):
        SBMDataset(str(tmp_path), 'PATTERN', 'val', size=3, seed=0)


def test_rwse_return_probabilities():
    from torch_geometric.data import Data
    # triangle: P^1_ii = 0, P^2_ii = 1/2, P^3_ii = 1/4
    tri = Data(edge_index=torch.tensor([[0, 1, 1, 2, 2, 0],
                                        [1, 0, 2, 1, 0, 2]]), num_nodes=3)
    out = AddRWSE(range(1, 4))(tri)
    assert out.pestat_RWSE.shape == (3, 3)
    assert out.pestat_RWSE[0].tolist() == pytest.approx([0, 0.5, 0.25])
    # on PATTERN, long walks return more often to the denser pattern nodes
    g = generate_sbm_splits('PATTERN', size=1, seed=0)['train'][0]
    rw = AddRWSE(range(1, 17))(g).pestat_RWSE[:, -1]
    assert rw[g.y == 1].mean() > 1.1 * rw[g.y == 0].mean()
    with pytest.raises(ValueError, match='times'):
        AddRWSE([0, 1])

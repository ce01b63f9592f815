"""CPU smoke test of the benchmark graph generators (benchmarks/graphs.py)
and of the kernel and training-features benchmarks' quick paths."""
import importlib.util
import json
import math
from pathlib import Path

import pytest
import torch

BENCH_DIR = Path(__file__).resolve().parents[1] / 'benchmarks'


def _load(name):
    spec = importlib.util.spec_from_file_location(f'_bench_{name}',
                                                  BENCH_DIR / f'{name}.py')
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


graphs = _load('graphs')


def _check_layout(edge_index, num_nodes):
    assert edge_index.dtype == torch.int64 and edge_index.dim() == 2
    assert edge_index.size(0) == 2
    src, dst = edge_index
    assert int(edge_index.min()) >= 0 and int(edge_index.max()) < num_nodes
    key = dst * num_nodes + src
    # sorted by destination (then source) and free of duplicates
    assert bool((key[1:] > key[:-1]).all())


def _expected_distinct(draws: float, pool: int) -> float:
    """Expected distinct values among ``draws`` uniform draws from ``pool``."""
    return pool * (1 - (1 - 1 / pool)**draws)


@pytest.mark.parametrize('name', ['cora-like', 'pubmed-like'])
def test_uniform_graphs_have_exact_sizes(name):
    spec = graphs.GRAPHS[name]
    edge_index, n = graphs.make_graph(name, 'cpu', seed=0)
    _check_layout(edge_index, n)
    assert n == spec.num_nodes
    assert edge_index.size(1) == spec.num_edges
    # uniform sources: no destination holds a large share of the edges
    deg = torch.bincount(edge_index[1], minlength=n)
    assert int(deg.max()) < 10 * spec.num_edges / n


@pytest.mark.parametrize('name', graphs.BATCH_GRAPHS)
def test_batch_graphs_stay_inside_their_graph(name):
    spec = graphs.GRAPHS[name]
    edge_index, n = graphs.make_graph(name, 'cpu', seed=0, scale=0.02)
    _check_layout(edge_index, n)
    num_graphs = round(spec.num_graphs * 0.02)
    assert n == num_graphs * spec.nodes_per_graph
    size = graphs.nodes_per_graph(name)
    assert size == spec.nodes_per_graph
    src, dst = edge_index
    assert bool((src // size == dst // size).all()), 'cross-graph edge'
    want = n * _expected_distinct(spec.avg_in_degree, size)
    assert abs(edge_index.size(1) - want) < 0.03 * want
    assert int(torch.bincount(dst, minlength=n).max()) <= spec.avg_in_degree


def test_full_size_pattern_like_matches_anchor_edge_count():
    # anchors.md: pattern-like has 5.05M edges (51 draws, deduplicated)
    spec = graphs.GRAPHS['pattern-like']
    want = (spec.num_graphs * spec.nodes_per_graph *
            _expected_distinct(spec.avg_in_degree, spec.nodes_per_graph))
    assert abs(want - 5.05e6) < 0.01 * 5.05e6


def test_powerlaw_graph_has_super_nodes():
    scale = 0.01
    spec = graphs.GRAPHS['reddit-like-1/5']
    edge_index, n = graphs.make_graph('reddit-like-1/5', 'cpu', seed=0,
                                      scale=scale)
    _check_layout(edge_index, n)
    assert n == round(spec.num_nodes * scale)
    # degree of rank r ~ c * r**-0.5, c set by the edge budget; sources are
    # uniform, so each row keeps the distinct ones among its draws
    budget = spec.num_edges * scale
    ranks = torch.arange(1, n + 1, dtype=torch.float64)
    draws = (ranks.pow(-0.5) * budget / float(ranks.pow(-0.5).sum())).round()
    want = float(_expected_distinct(draws, n).sum())
    assert abs(edge_index.size(1) - want) < 0.03 * want
    deg = torch.bincount(edge_index[1], minlength=n).sort(descending=True)
    top = _expected_distinct(float(draws[0]), n)
    assert abs(int(deg.values[0]) - top) < 0.05 * top
    # power law: the 100th largest row is ~10x smaller than the largest
    assert 6 < int(deg.values[0]) / int(deg.values[99]) < 14
    assert int(deg.values[-1]) >= 1


def test_generators_are_seeded():
    a, _ = graphs.make_graph('mnist-like', 'cpu', seed=1, scale=0.01)
    b, _ = graphs.make_graph('mnist-like', 'cpu', seed=1, scale=0.01)
    c, _ = graphs.make_graph('mnist-like', 'cpu', seed=2, scale=0.01)
    assert torch.equal(a, b)
    assert not torch.equal(a, c)


def test_make_dfgraph_is_csr_of_the_edges():
    graph, edge_index, n = graphs.make_dfgraph('cora-like', 'cpu', scale=0.1)
    assert graph.num_dst == graph.num_src == n
    assert graph.num_edges == edge_index.size(1)
    assert graph.perm is None  # already sorted by destination
    assert torch.equal(graph.col.long(), edge_index[0])
    assert torch.equal(graph.in_degree,
                       torch.bincount(edge_index[1], minlength=n))


def test_bad_arguments_are_rejected():
    with pytest.raises(ValueError, match='unknown graph'):
        graphs.make_graph('cora', 'cpu')
    with pytest.raises(ValueError, match='scale'):
        graphs.make_graph('cora-like', 'cpu', scale=0)


def test_kernel_benchmark_quick_path(tmp_path):
    kernels = _load('kernels')
    out = tmp_path / 'kernels.json'
    threads = torch.get_num_threads()
    try:
        rows = kernels.main(['--quick', '--device', 'cpu', '--graphs',
                             'cora-like', '--shapes', '4x32', '--scale',
                             '0.05', '--out', str(out)])
    finally:
        torch.set_num_threads(threads)  # main() pins 1 thread on a CPU
    saved = json.loads(out.read_text())
    assert len(rows) == len(saved['rows']) == 1
    row = saved['rows'][0]
    assert row['graph'] == 'cora-like' and row['shape'] == '4x32'
    assert row['err_fwd'] <= 1e-5 and row['err_bwd'] <= 1e-5
    for key in ('ours_fwd', 'unfused_fwd', 'ours_fb', 'unfused_fb'):
        assert math.isfinite(row[key]) and row[key] > 0


def test_training_features_benchmark_quick_path(tmp_path):
    import pyg_dfgnn.ops as ops
    reference = ops.fused_attention_reference
    bench = _load('training_features')
    out = tmp_path / 'training_features.json'
    threads = torch.get_num_threads()
    try:
        rows = bench.main(['--quick', '--device', 'cpu', '--scale', '0.005',
                           '--out', str(out)])
    finally:
        torch.set_num_threads(threads)  # main() pins 1 thread on a CPU
    saved = json.loads(out.read_text())
    assert [r['config'] for r in saved['rows']] == [
        c.name for c in bench.CONFIGS] == [r['config'] for r in rows]
    assert saved['graph']['num_nodes'] == 5 * 110
    assert 35 < saved['graph']['avg_in_degree'] < 45
    for row in saved['rows']:
        assert row['err_fwd'] <= 1e-5 and row['err_bwd'] <= 1e-5, row
        for key in ('pyg_ms', 'ours_ms'):
            assert math.isfinite(row[key]) and row[key] > 0
        # the CPU runs the reference path, and the counter saw it
        assert row['ref_calls'] >= 1
        assert (row['overhead'] is None) == (row['baseline'] is None)
        assert row['gate_time'] is None  # gates only count on CUDA
    assert ops.fused_attention_reference is reference  # un-patched

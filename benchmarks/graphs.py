"""Synthetic graphs with the shapes of the DF-GNN paper's Table 1.

Nothing is downloaded: every graph is generated from a seed on the requested
device (the same seed gives the same graph on the same device type). Edges
``j -> i`` are returned as ``edge_index`` [2, E] (int64; row 0 = source,
row 1 = destination), sorted by destination then source, without duplicates.

* ``cora-like`` / ``pubmed-like``: exactly E distinct uniform random edges.
* ``mnist-like`` / ``cluster-like`` / ``pattern-like``: a batch of 1024 graphs
  of n nodes each; every node draws ``avg_in_degree`` sources uniformly (with
  replacement) from its own graph, duplicates are dropped (so the in-degree
  averages a little less, e.g. ~41.6 of 51 for pattern-like: 5.05M edges).
* ``zinc-like``: 4,096 graphs of 23 nodes, 2 draws per node (~181K edges):
  molecule-sized batches; ``arxiv-like``: 169,343 nodes, 1.17M uniform
  random edges (both from anchors.md's second run).
* ``reddit-like-1/5``: destination of rank r (ranks are a random permutation
  of the nodes) draws ``c * r**-0.5`` uniform sources, c set by the edge
  budget (23M); deduplication leaves the top node ~22.7K in-edges.
* ``reddit-like``: the same at full Reddit scale (114.6M edges; not in
  ``DEFAULT_GRAPHS``).

``scale`` < 1 shrinks node and edge counts (batch graphs: the number of
graphs) for smoke tests on a CPU.

Run ``python benchmarks/graphs.py [--device cuda]`` for a table of the
generated statistics.
"""
import argparse
import time
from dataclasses import dataclass
from typing import Dict, Optional, Tuple, Union

import torch
from torch import Tensor


@dataclass(frozen=True)
class GraphSpec:
    kind: str  # 'uniform' | 'batch' | 'powerlaw'
    num_nodes: int = 0  # uniform / powerlaw: total nodes
    num_edges: int = 0  # uniform / powerlaw: edge budget
    nodes_per_graph: int = 0  # batch
    avg_in_degree: int = 0  # batch: draws per node (before dedup)
    num_graphs: int = 0  # batch
    degree_exponent: float = 0.5  # powerlaw: in-degree ~ rank**-exponent


GRAPHS: Dict[str, GraphSpec] = {
    'cora-like': GraphSpec('uniform', num_nodes=2708, num_edges=10556),
    'pubmed-like': GraphSpec('uniform', num_nodes=19717, num_edges=88648),
    'mnist-like': GraphSpec('batch', nodes_per_graph=71, avg_in_degree=8,
                            num_graphs=1024),
    'cluster-like': GraphSpec('batch', nodes_per_graph=117, avg_in_degree=37,
                              num_graphs=1024),
    'pattern-like': GraphSpec('batch', nodes_per_graph=119, avg_in_degree=51,
                              num_graphs=1024),
    # molecule-sized batches (ZINC / molpcba): 4,096 graphs x 23 nodes
    'zinc-like': GraphSpec('batch', nodes_per_graph=23, avg_in_degree=2,
                           num_graphs=4096),
    'arxiv-like': GraphSpec('uniform', num_nodes=169343,
                            num_edges=1166243),
    'reddit-like-1/5': GraphSpec('powerlaw', num_nodes=232965,
                                 num_edges=23_000_000),
    # full Reddit scale (114.6M edges, ~1.8 GB of edge_index): opt-in only
    'reddit-like': GraphSpec('powerlaw', num_nodes=232965,
                             num_edges=114_615_892),
}
DEFAULT_GRAPHS = tuple(n for n in GRAPHS if n != 'reddit-like')
BATCH_GRAPHS = tuple(n for n, s in GRAPHS.items() if s.kind == 'batch')


def _dedup_sorted(src: Tensor, dst: Tensor, num_nodes: int) -> Tensor:
    """Distinct edges sorted by (destination, source) as ``[2, E]``."""
    key = torch.unique(dst * num_nodes + src)  # sorted
    return torch.stack([key % num_nodes, key // num_nodes], 0)


def _uniform(spec: GraphSpec, scale: float, gen: torch.Generator,
             device: torch.device) -> Tuple[Tensor, int]:
    n = max(2, round(spec.num_nodes * scale))
    e = min(max(1, round(spec.num_edges * scale)), n * n)
    draws = e + 64 + int(e * e / (n * n)) * 2  # expected duplicates + slack
    while True:
        key = torch.randint(n * n, (draws, ), generator=gen, device=device)
        key = torch.unique(key)
        if key.numel() >= e:
            break
        draws *= 2
    pick = torch.randperm(key.numel(), generator=gen, device=device)[:e]
    key = key[pick].sort().values
    return torch.stack([key % n, key // n], 0), n


def _batch(spec: GraphSpec, scale: float, gen: torch.Generator,
           device: torch.device) -> Tuple[Tensor, int]:
    size, deg = spec.nodes_per_graph, spec.avg_in_degree
    num_graphs = max(1, round(spec.num_graphs * scale))
    n = num_graphs * size
    dst = torch.arange(n, device=device).repeat_interleave(deg)
    local = torch.randint(size, (n * deg, ), generator=gen, device=device)
    src = dst - dst % size + local
    return _dedup_sorted(src, dst, n), n


def _powerlaw(spec: GraphSpec, scale: float, gen: torch.Generator,
              device: torch.device) -> Tuple[Tensor, int]:
    n = max(2, round(spec.num_nodes * scale))
    e = max(1, round(spec.num_edges * scale))
    rank = torch.arange(1, n + 1, device=device, dtype=torch.float64)
    weight = rank.pow(-spec.degree_exponent)
    degree = (weight * (e / float(weight.sum()))).round().long().clamp_(max=n)
    node_of_rank = torch.randperm(n, generator=gen, device=device)
    total = int(degree.sum())
    dst = node_of_rank.repeat_interleave(degree, output_size=total)
    src = torch.randint(n, (total, ), generator=gen, device=device)
    return _dedup_sorted(src, dst, n), n


_MAKERS = {'uniform': _uniform, 'batch': _batch, 'powerlaw': _powerlaw}


def make_graph(name: Union[str, GraphSpec], device='cpu', seed: int = 0,
               scale: float = 1.0) -> Tuple[Tensor, int]:
    """``(edge_index [2, E] int64 sorted by destination, num_nodes)`` of a
    named graph, or of a ``GraphSpec`` of one's own."""
    if isinstance(name, GraphSpec):
        spec = name
    elif name in GRAPHS:
        spec = GRAPHS[name]
    else:
        raise ValueError(f"unknown graph '{name}' (have {list(GRAPHS)})")
    if not 0 < scale <= 1:
        raise ValueError(f"'scale' must be in (0, 1] (got {scale})")
    device = torch.device(device)
    gen = torch.Generator(device=device)
    gen.manual_seed(seed)
    return _MAKERS[spec.kind](spec, scale, gen, device)


def make_dfgraph(name: Union[str, GraphSpec], device='cpu', seed: int = 0,
                 scale: float = 1.0):
    """``(DFGraph, edge_index, num_nodes)`` for the fused op."""
    from pyg_dfgnn.graph import DFGraph
    edge_index, num_nodes = make_graph(name, device, seed, scale)
    return DFGraph.from_edge_index(edge_index,
                                   num_nodes=num_nodes), edge_index, num_nodes


def nodes_per_graph(name: str) -> Optional[int]:
    """Nodes of each small graph of a batch graph, else None."""
    spec = GRAPHS[name]
    return spec.nodes_per_graph if spec.kind == 'batch' else None


def stats(edge_index: Tensor, num_nodes: int) -> Dict[str, float]:
    deg = torch.bincount(edge_index[1], minlength=num_nodes)
    e = edge_index.size(1)
    return {
        'num_nodes': num_nodes,
        'num_edges': e,
        'avg_in_degree': e / max(num_nodes, 1),
        'max_in_degree': int(deg.max()) if num_nodes else 0,
        'empty_rows': int((deg == 0).sum()),
    }


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument('--graphs', default=','.join(DEFAULT_GRAPHS),
                        help='comma-separated names')
    parser.add_argument('--device', default='cpu')
    parser.add_argument('--seed', type=int, default=0)
    parser.add_argument('--scale', type=float, default=1.0)
    args = parser.parse_args(argv)
    print(f"{'graph':<16} {'nodes':>9} {'edges':>11} {'avg deg':>8} "
          f"{'max deg':>8} {'empty':>6} {'gen s':>6}")
    for name in args.graphs.split(','):
        t0 = time.perf_counter()
        edge_index, n = make_graph(name, args.device, args.seed, args.scale)
        if edge_index.is_cuda:
            torch.cuda.synchronize()
        dt = time.perf_counter() - t0
        s = stats(edge_index, n)
        print(f"{name:<16} {s['num_nodes']:>9,} {s['num_edges']:>11,} "
              f"{s['avg_in_degree']:>8.2f} {s['max_in_degree']:>8,} "
              f"{s['empty_rows']:>6,} {dt:>6.2f}")


if __name__ == '__main__':
    main()

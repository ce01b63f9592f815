"""PATTERN and CLUSTER, generated offline as Benchmarking-GNNs generates them.

Both are stochastic block models (SBM) with node-level labels:

* **CLUSTER** (semi-supervised clustering): 6 communities of 5..34 nodes
  (uniform), edge probability ``p = 0.55`` inside a community and
  ``q = 0.25`` across. One random node per community carries its community id
  ``r + 1`` as input, all others ``0``; the target is the community of every
  node (6 classes). Features: one-hot over ``{0..6}`` (7 dims), as in PyG's
  ``GNNBenchmarkDataset``. Splits 10k / 1k / 1k.
* **PATTERN** (subgraph detection): 5 communities of 5..34 nodes with
  ``p = 0.5``, ``q = 0.35``, and node symbols drawn uniformly from a
  vocabulary of 3. 100 patterns of 20 nodes (inner edge probability 0.5,
  fixed symbols) are drawn once; each graph gets one of them, joined to every
  community node with probability 0.5. The target is 1 on the pattern's
  nodes, 0 elsewhere (2 classes, ~17 % positives). Features: one-hot symbols
  (3 dims). Splits 10k / 2k / 2k, each pattern appearing in every split.

Node order is shuffled so that position leaks no label. Edges are undirected
(both directions stored), without self-loops.

Neither dataset has edge features. ``edge_attr='same_block'`` adds a
synthetic one, so that the edge-feature path of the models can be run and
tested: ``data.edge_attr[e]`` (int64, 1-d like ZINC's bond types) is 1 when
both ends of edge ``e`` lie in the same block (a CLUSTER community; a
PATTERN community or the pattern itself), else 0. It draws no random numbers,
so the graphs are the same as without it. It gives much of the answer away
(CLUSTER's communities outright; ``configs/demo.yaml`` on PATTERN reaches
0.998 test accuracy-SBM with it, 0.853 without), so scores with it are not
comparable with published ones: it exists to run the edge-feature path.

Published statistics (Dwivedi et al., GraphGPS Table): CLUSTER 117.2 nodes and
4303.9 directed edges per graph; PATTERN 118.9 nodes and 6078.6 directed
edges. The generator of the published PATTERN is not in the paper, so the
parameters above (the paper's) give 117.5 nodes / ~5890 edges, within 3 %.
"""
from __future__ import annotations

import os
import os.path as osp
from typing import Callable, Dict, List, Optional

import numpy as np
import torch
from torch_geometric.data import Data, InMemoryDataset

#: Values of the ``edge_attr`` option (synthetic edge features).
EDGE_ATTRS = ('none', 'same_block')

#: Published per-graph averages (directed edge count = 2 x undirected).
PUBLISHED_STATS: Dict[str, Dict[str, float]] = {
    'CLUSTER': {'num_nodes': 117.20, 'num_edges': 4303.9, 'num_classes': 6},
    'PATTERN': {'num_nodes': 118.89, 'num_edges': 6078.6, 'num_classes': 2},
}

CLUSTER_PARAMS = dict(num_blocks=6, size_min=5, size_max=35, p=0.55, q=0.25,
                      splits=(10000, 1000, 1000))
PATTERN_PARAMS = dict(num_blocks=5, size_min=5, size_max=35, p=0.5, q=0.35,
                      vocab_size=3, pattern_size=20, pattern_p=0.5,
                      pattern_q=0.5, num_patterns=100,
                      splits=(10000, 2000, 2000))


def _block_model(rng: np.random.Generator, blocks: np.ndarray, p: float,
                 q: float) -> np.ndarray:
    """Symmetric boolean adjacency: edge i~j with p if same block, else q."""
    same = blocks[:, None] == blocks[None, :]
    prob = np.where(same, p, q)
    upper = np.triu(rng.random(prob.shape) < prob, k=1)
    return upper | upper.T


def _block_sizes(rng: np.random.Generator, num_blocks: int, size_min: int,
                 size_max: int) -> np.ndarray:
    return rng.integers(size_min, size_max, size=num_blocks)  # max exclusive


def _check_edge_attr(edge_attr: str) -> None:
    if edge_attr not in EDGE_ATTRS:
        raise ValueError(f'edge_attr must be one of {list(EDGE_ATTRS)}, got '
                         f'{edge_attr!r}')


def _to_data(adj: np.ndarray, x: np.ndarray, y: np.ndarray,
             num_features: int, blocks: Optional[np.ndarray] = None) -> Data:
    """``blocks`` (block id per node) given: ``edge_attr`` = same block."""
    row, col = np.nonzero(adj)
    # PyG convention: edge_index[0] = source, edge_index[1] = destination.
    edge_index = torch.from_numpy(np.stack([col, row])).long()
    x_t = torch.nn.functional.one_hot(torch.from_numpy(x).long(),
                                      num_features).float()
    data = Data(x=x_t, edge_index=edge_index, y=torch.from_numpy(y).long(),
                num_nodes=len(y))
    if blocks is not None:
        data.edge_attr = torch.from_numpy(
            (blocks[row] == blocks[col]).astype(np.int64))
    return data


def generate_cluster_graph(rng: np.random.Generator,
                           params: Optional[dict] = None,
                           edge_attr: str = 'none') -> Data:
    """One CLUSTER graph (see module docstring)."""
    _check_edge_attr(edge_attr)
    P = {**CLUSTER_PARAMS, **(params or {})}
    sizes = _block_sizes(rng, P['num_blocks'], P['size_min'], P['size_max'])
    blocks = np.repeat(np.arange(P['num_blocks']), sizes)
    adj = _block_model(rng, blocks, P['p'], P['q'])
    perm = rng.permutation(len(blocks))
    adj, blocks = adj[perm][:, perm], blocks[perm]
    signal = np.zeros(len(blocks), dtype=np.int64)
    for r in range(P['num_blocks']):
        members = np.flatnonzero(blocks == r)
        signal[members[rng.integers(len(members))]] = r + 1
    return _to_data(adj, signal, blocks, P['num_blocks'] + 1,
                    blocks if edge_attr == 'same_block' else None)


def generate_pattern(rng: np.random.Generator,
                     params: Optional[dict] = None) -> tuple:
    """A PATTERN pattern: (adjacency [k, k] bool, symbols [k])."""
    P = {**PATTERN_PARAMS, **(params or {})}
    k = P['pattern_size']
    adj = _block_model(rng, np.zeros(k, dtype=np.int64), P['pattern_p'], 0.0)
    return adj, rng.integers(P['vocab_size'], size=k)


def generate_pattern_graph(rng: np.random.Generator, pattern: tuple,
                           params: Optional[dict] = None,
                           edge_attr: str = 'none') -> Data:
    """One PATTERN graph containing ``pattern`` (see module docstring)."""
    _check_edge_attr(edge_attr)
    P = {**PATTERN_PARAMS, **(params or {})}
    w0, u0 = pattern
    sizes = _block_sizes(rng, P['num_blocks'], P['size_min'], P['size_max'])
    blocks = np.repeat(np.arange(P['num_blocks']), sizes)
    adj = _block_model(rng, blocks, P['p'], P['q'])
    symbols = rng.integers(P['vocab_size'], size=len(blocks))
    link = rng.random((len(u0), len(blocks))) < P['pattern_q']
    adj = np.block([[adj, link.T], [link, w0]])
    symbols = np.concatenate([symbols, u0])
    target = np.concatenate([np.zeros(len(blocks), dtype=np.int64),
                             np.ones(len(u0), dtype=np.int64)])
    perm = rng.permutation(len(target))
    all_blocks = None
    if edge_attr == 'same_block':  # the pattern is a block of its own
        all_blocks = np.concatenate(
            [blocks, np.full(len(u0), P['num_blocks'])])[perm]
    return _to_data(adj[perm][:, perm], symbols[perm], target[perm],
                    P['vocab_size'], all_blocks)


def split_sizes(name: str, size: Optional[int]) -> tuple:
    """(train, val, test) graph counts; ``size`` scales the published split."""
    full = (CLUSTER_PARAMS if name == 'CLUSTER' else PATTERN_PARAMS)['splits']
    if size is None:
        return full
    ratio = size / full[0]
    return (size, ) + tuple(max(1, round(n * ratio)) for n in full[1:])


def generate_sbm_splits(name: str, size: Optional[int] = None,
                        seed: int = 0,
                        edge_attr: str = 'none') -> Dict[str, List[Data]]:
    """All three splits of PATTERN or CLUSTER as lists of :class:`Data`
    (``edge_attr``: see the module docstring)."""
    _check_edge_attr(edge_attr)
    if name not in ('PATTERN', 'CLUSTER'):
        raise ValueError(f"name must be 'PATTERN' or 'CLUSTER', got {name!r}")
    if size is not None and (not isinstance(size, int) or size < 1):
        raise ValueError(f'size must be a positive int or None, got {size!r}')
    rng = np.random.default_rng(seed)
    counts = dict(zip(('train', 'val', 'test'), split_sizes(name, size)))
    if name == 'CLUSTER':
        return {split: [generate_cluster_graph(rng, edge_attr=edge_attr)
                        for _ in range(n)]
                for split, n in counts.items()}
    num_patterns = min(PATTERN_PARAMS['num_patterns'], counts['train'])
    patterns = [generate_pattern(rng) for _ in range(num_patterns)]
    # Graph i of every split holds pattern i % num_patterns, so each pattern
    # is seen in training and evaluated on unseen graphs.
    return {split: [generate_pattern_graph(rng, patterns[i % num_patterns],
                                           edge_attr=edge_attr)
                    for i in range(n)]
            for split, n in counts.items()}


class DatasetError(RuntimeError):
    """A generated dataset file that cannot be read (the message says
    which, and how to regenerate it)."""


class SBMDataset(InMemoryDataset):
    r"""PATTERN or CLUSTER, generated on first use and cached under ``root``.

    The cache lives in ``root/<name>/<variant>/processed`` where the variant
    names ``size``, ``seed`` and ``variant_tag`` (say which ``pre_transform``
    ran), so different settings never read each other's files. Nothing is
    downloaded.

    Args:
        root (str): Root folder of the cache.
        name (str): ``'PATTERN'`` or ``'CLUSTER'``.
        split (str): ``'train'``, ``'val'`` or ``'test'``.
        size (int, optional): Number of training graphs; val/test are scaled
            by the published ratio. ``None`` generates the published 10k.
        seed (int): Seed of the generator (all splits come from one stream).
        edge_attr (str): ``'none'`` or ``'same_block'`` (synthetic edge
            features, see the module docstring).
        transform, pre_transform, pre_filter: as in PyG datasets.
        variant_tag (str): Extra cache key for the ``pre_transform`` used.
    """

    def __init__(self, root: str, name: str = 'PATTERN', split: str = 'train',
                 size: Optional[int] = None, seed: int = 0,
                 transform: Optional[Callable] = None,
                 pre_transform: Optional[Callable] = None,
                 pre_filter: Optional[Callable] = None,
                 variant_tag: str = '', force_reload: bool = False,
                 edge_attr: str = 'none'):
        if name not in ('PATTERN', 'CLUSTER'):
            raise ValueError(f"name must be 'PATTERN' or 'CLUSTER', got "
                             f"{name!r}")
        if split not in ('train', 'val', 'test'):
            raise ValueError(f"split must be 'train', 'val' or 'test', got "
                             f"{split!r}")
        if size is not None and (not isinstance(size, int) or size < 1):
            raise ValueError(f'size must be a positive int or None, got '
                             f'{size!r}')
        _check_edge_attr(edge_attr)
        self.name, self.size, self.seed = name, size, seed
        self.edge_attr = edge_attr
        self.variant = (f"{'full' if size is None else size}-seed{seed}"
                        f"{'' if edge_attr == 'none' else '-' + edge_attr}"
                        f"{'-' + variant_tag if variant_tag else ''}")
        super().__init__(root, transform, pre_transform, pre_filter,
                         force_reload=force_reload)
        path = self.processed_paths[('train', 'val', 'test').index(split)]
        try:
            self.load(path)
        except (RuntimeError, EOFError, OSError, ValueError) as e:
            raise DatasetError(
                f"cannot read the generated split '{path}' ({type(e).__name__}"
                f": {str(e).splitlines()[0] if str(e) else ''}); it is "
                f"damaged (an interrupted write?): delete "
                f"'{self.processed_dir}' to generate it again") from e

    @property
    def raw_file_names(self) -> List[str]:
        return []

    @property
    def processed_dir(self) -> str:
        return osp.join(self.root, self.name, self.variant, 'processed')

    @property
    def processed_file_names(self) -> List[str]:
        return ['train.pt', 'val.pt', 'test.pt']

    def download(self) -> None:  # generated, never downloaded
        pass

    def process(self) -> None:
        splits = generate_sbm_splits(self.name, self.size, self.seed,
                                     self.edge_attr)
        for path, split in zip(self.processed_paths, ('train', 'val', 'test')):
            graphs = splits[split]
            if self.pre_filter is not None:
                graphs = [g for g in graphs if self.pre_filter(g)]
            if self.pre_transform is not None:
                graphs = [self.pre_transform(g) for g in graphs]
            os.makedirs(osp.dirname(path), exist_ok=True)
            self.save(graphs, path)

    def __repr__(self) -> str:
        return f'{self.name}({len(self)}, variant={self.variant})'


def dataset_stats(graphs) -> Dict[str, float]:
    """Per-graph averages: nodes, directed edges, mean degree, class shares."""
    nodes = edges = 0
    counts: Dict[int, int] = {}
    for g in graphs:
        nodes += g.num_nodes
        edges += g.num_edges
        for c, n in zip(*torch.unique(g.y, return_counts=True)):
            counts[int(c)] = counts.get(int(c), 0) + int(n)
    total = sum(counts.values())
    return {
        'num_graphs': len(graphs),
        'num_nodes': nodes / len(graphs),
        'num_edges': edges / len(graphs),
        'mean_degree': edges / nodes,
        'class_share': {c: n / total for c, n in sorted(counts.items())},
    }

"""Datasets for the runner: PATTERN / CLUSTER generated offline, or a PyG
dataset read from local files (``format: PyG-<Dataset>``), never downloaded.
"""
from __future__ import annotations

import os.path as osp
from dataclasses import dataclass
from typing import Any, Callable, Dict, List, Optional, Tuple

import torch

from pyg_dfgnn.datasets.lap_pe import AddLapPE, AddRWSE
from pyg_dfgnn.datasets.sbm import (PUBLISHED_STATS, SBMDataset,
                                    dataset_stats, generate_sbm_splits)

__all__ = ['SBMDataset', 'AddLapPE', 'AddRWSE', 'generate_sbm_splits',
           'dataset_stats', 'PUBLISHED_STATS', 'DatasetBundle', 'build_datasets',
           'load_pyg_dataset', 'edge_attr_info']

#: PyG datasets with a train/val/test ``split`` argument that we can read.
PYG_DATASETS = ('GNNBenchmarkDataset', 'ZINC')


@dataclass
class DatasetBundle:
    """The three splits plus what the model needs to know about them."""
    train: Any
    val: Any
    test: Any
    dim_in: int
    dim_out: int
    num_node_types: Optional[int]  # set when node features are type ids
    dim_edge: Optional[int] = None  # edge_attr columns; None: no edge_attr
    num_edge_types: Optional[int] = None  # set when edge_attr are type ids

    def splits(self) -> Dict[str, Any]:
        return {'train': self.train, 'val': self.val, 'test': self.test}


def _offline(cls: type, variant: str = '') -> type:
    """``cls`` with ``download`` replaced by a clear error (or a no-op when
    the processed files already exist), its processed files in a folder of
    their own per ``variant`` (the pre-transforms: PyG only warns when a
    cache was built with other ones, and then uses it)."""

    def processed_dir(self) -> str:  # (PyG's own without pre-transforms)
        base = super(sub, self).processed_dir
        return osp.join(base, variant) if variant else base

    def download(self) -> None:
        if all(osp.exists(p) for p in self.processed_paths):
            return
        raise FileNotFoundError(
            f"{cls.__name__}: files {self.raw_file_names} not found in "
            f"'{self.raw_dir}' (nor processed files in "
            f"'{self.processed_dir}'); pyg_dfgnn never downloads datasets. "
            f"Copy them there, or use 'dataset.format: SBM' to generate "
            f"PATTERN/CLUSTER offline.")

    sub = type(f'Offline{cls.__name__}', (cls, ), {
        'download': download, 'processed_dir': property(processed_dir)})
    return sub


def load_pyg_dataset(dataset: str, name: str, root: str, split: str,
                     transform: Optional[Callable] = None,
                     pre_transform: Optional[Callable] = None,
                     variant: str = ''):
    """``torch_geometric.datasets.<dataset>`` from local files only;
    processed once per ``variant`` (a name for ``pre_transform``)."""
    import torch_geometric.datasets as pyg_datasets
    if dataset not in PYG_DATASETS:
        raise ValueError(f"'dataset.format' PyG-{dataset} is not supported; "
                         f"supported: {['PyG-' + d for d in PYG_DATASETS]}")
    cls = _offline(getattr(pyg_datasets, dataset), variant)
    if dataset == 'GNNBenchmarkDataset':
        return cls(osp.join(root, dataset), name=name, split=split,
                   transform=transform, pre_transform=pre_transform)
    return cls(osp.join(root, dataset), subset=name == 'subset', split=split,
               transform=transform, pre_transform=pre_transform)


def edge_attr_info(*datasets) -> Tuple[Optional[int], Optional[int]]:
    """``(dim_edge, num_edge_types)`` of the datasets' ``edge_attr``: its
    number of columns (``None`` without ``edge_attr``) and, when its values
    are non-negative whole numbers, 1 + the largest (usable as type ids),
    else ``None``. Self-loops are skipped: ``ToDFGNNFormat`` fills theirs
    with a mean (float, even for integer types), the model refills them."""
    dim_edge: Optional[int] = None
    top, whole = -1, True
    for ds in datasets:
        parts = [ds._data] if hasattr(ds, '_data') else list(ds)
        for data in parts:
            attr = data.get('edge_attr', None)
            if attr is None:
                return None, None
            dim_edge = 1 if attr.dim() == 1 else attr.size(-1)
            ei = data.edge_index
            ei = ei.as_tensor() if hasattr(ei, 'as_tensor') else ei
            attr = attr.view(attr.size(0), -1)[ei[0] != ei[1]]
            if attr.numel():
                whole = whole and bool((attr >= 0).all()) and bool(
                    (attr == attr.floor()).all())
                top = max(top, int(attr.max()))
    if dim_edge is None:
        return None, None
    return dim_edge, (top + 1 if whole else None)


def dfgnn_pre_transform(local_layer: str) -> Optional[Callable]:
    """``ToDFGNNFormat`` as users apply it: edges sorted by destination, and
    the self-loops of GAT-like layers added once here rather than in every
    forward (the convs are then built with ``add_self_loops=False``)."""
    from pyg_dfgnn.train.model import SELF_LOOP_LAYERS
    try:
        from pyg_dfgnn.transforms import ToDFGNNFormat
    except ImportError:  # pragma: no cover - transforms not installed
        return None
    return ToDFGNNFormat(add_self_loops=local_layer in SELF_LOOP_LAYERS)


def build_datasets(cfg) -> DatasetBundle:
    """Train / val / test datasets for a validated config."""
    from torch_geometric.transforms import Compose

    from pyg_dfgnn.train.config import ConfigError, split_layer_type
    from pyg_dfgnn.train.model import SELF_LOOP_LAYERS

    local, _ = split_layer_type(cfg.gt.layer_type)
    transforms: List[Callable] = []
    tags: List[str] = []
    pe = cfg.posenc_LapPE
    if pe.enable:
        transforms.append(AddLapPE(pe.eigen.max_freqs,
                                   pe.eigen.laplacian_norm))
        tags.append(f'lappe{pe.eigen.max_freqs}{pe.eigen.laplacian_norm}')
    if cfg.posenc_RWSE.enable:
        from pyg_dfgnn.train.config import rwse_times
        times = rwse_times(cfg.posenc_RWSE.kernel.times_func)
        transforms.append(AddRWSE(times))
        tags.append(f'rwse{times.start}-{times.stop}')
    df = dfgnn_pre_transform(local) if cfg.dataset.dfgnn_format else None
    needs_loops = local in SELF_LOOP_LAYERS
    if df is not None:
        transforms.append(df)
        tags.append('dfloops' if needs_loops else 'df')
    elif needs_loops:  # the convs skip self-loops: add them in the data
        from torch_geometric.transforms import AddSelfLoops
        # edge_attr (if any) filled as GATConv does; the model refills the
        # loops after encoding anyway.
        transforms.append(AddSelfLoops(attr='edge_attr', fill_value='mean'))
        tags.append('loops')
    pre_transform = Compose(transforms) if transforms else None

    fmt, name, root = cfg.dataset.format, cfg.dataset.name, cfg.dataset.dir
    if fmt == 'SBM':
        splits = [SBMDataset(root, name, split, size=cfg.dataset.size,
                             seed=cfg.dataset.gen_seed,
                             pre_transform=pre_transform,
                             variant_tag='-'.join(tags),
                             edge_attr=cfg.dataset.sbm_edge_attr)
                  for split in ('train', 'val', 'test')]
    else:
        splits = [load_pyg_dataset(fmt[len('PyG-'):], name, root, split,
                                   pre_transform=pre_transform,
                                   variant='-'.join(tags))
                  for split in ('train', 'val', 'test')]
    train = splits[0]
    sample = train[0] if len(train) else None
    if sample is not None and sample.get('y', None) is not None and \
            sample.y.size(0) != sample.num_nodes:
        raise ConfigError(
            f"'dataset.format' {fmt} (name {name!r}) has graph-level targets "
            f"(y has {sample.y.size(0)} entries for {sample.num_nodes} "
            f"nodes); the runner's head is node-level ('gnn.head' "
            f"inductive_node): node-level datasets only (PATTERN, CLUSTER)")
    x = train._data.x if hasattr(train, '_data') else train[0].x
    num_node_types = None
    if x is not None and not torch.is_floating_point(x):
        num_node_types = int(x.max()) + 1
    dim_in = 1 if x is None or x.dim() == 1 else x.size(-1)
    if cfg.dataset.task_type == 'regression':
        dim_out = 1
    else:
        y = train._data.y if hasattr(train, '_data') else train[0].y
        dim_out = int(y.max()) + 1
    dim_edge, num_edge_types = edge_attr_info(*splits)
    return DatasetBundle(*splits, dim_in=dim_in, dim_out=dim_out,
                         num_node_types=num_node_types, dim_edge=dim_edge,
                         num_edge_types=num_edge_types)

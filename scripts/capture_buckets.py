"""Distinct padded batch shapes (CUDA-graph captures) of a config's training
split over a few epochs, on the CPU: the device loader's fixed levels
(``GraphStore.size_levels``) next to the former per-size buckets (1/8 per
power of two on each size, graph count in the key).

    python scripts/capture_buckets.py configs/pattern-gps.yaml --epochs 3 \
        dataset.size=2000
"""
import argparse
import sys

import torch

from pyg_dfgnn.datasets import build_datasets
from pyg_dfgnn.train.batching import DeviceLoader, GraphStore, bucket
from pyg_dfgnn.train.config import load_config
from pyg_dfgnn.train.config import split_layer_type


def old_key(store, ids, attention):
    n, e, ea = store.sizes(ids)
    e_pad = bucket(e)
    ea_pad = bucket(ea) if attention else 0
    need = max(1, -(-(e_pad - e) // max(1, store.max_in_degree)))
    if attention:
        need = max(need, -(-(ea_pad - ea) // max(1, store.max_nodes)))
    return (ids.numel(), bucket(n + need), e_pad, ea_pad)


def main(argv=None):
    p = argparse.ArgumentParser()
    p.add_argument('cfg')
    p.add_argument('--epochs', type=int, default=3)
    p.add_argument('opts', nargs='*')
    a = p.parse_intermixed_args(argv)
    cfg = load_config(a.cfg, a.opts)
    bundle = build_datasets(cfg)
    _, glob = split_layer_type(cfg.gt.layer_type)
    attention = cfg.backend == 'dfgnn' and glob == 'Transformer'
    size = cfg.train.batch_size
    stores = {s: GraphStore(ds, 'cpu') for s, ds in bundle.splits().items()}
    width = max(s.max_graph_nodes for s in stores.values())
    for s in stores.values():
        s.max_nodes = width
    for split, store in stores.items():
        loader = DeviceLoader(store, size, shuffle=True,
                              generator=torch.Generator().manual_seed(0))
        old, new, first_new = set(), set(), []
        ratio = [0.0, 0.0, 0.0]
        for epoch in range(a.epochs):
            order = loader.order()
            for start in range(0, order.numel(), size):
                ids = order[start:start + size]
                old.add(old_key(store, ids, attention))
                shape = store.padded_sizes(ids, attention, size)
                if shape not in new:
                    first_new.append((epoch, start // size))
                new.add(shape)
                real = store.sizes(ids)
                if ids.numel() == size:  # full batches: padding / real
                    for i in range(3):
                        if real[i]:
                            ratio[i] = max(ratio[i], shape[i] / real[i])
        print(f'{a.cfg} {split}: {len(store)} graphs, batch {size}, '
              f'{a.epochs} epochs: shapes before {len(old)}, after '
              f'{len(new)} (first seen at (epoch, step) {first_new}); '
              f'levels {store.size_levels(size, attention)}; max padded/'
              f'real of full batches (N, E, E_att) '
              f'{tuple(round(r, 2) for r in ratio)}')
    return 0


if __name__ == '__main__':
    sys.exit(main())

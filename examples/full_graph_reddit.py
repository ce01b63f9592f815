"""Full-graph training on a Reddit-size graph, on one GPU.

A 2-layer attention GNN (GAT or TransformerConv, ``--hidden`` channels in
``--heads`` heads, then one head over the 41 classes) trains on all
232,965 nodes and 114.6M edges at once: every step a forward and backward
over the whole graph and an Adam step. The run reports time per step (CUDA
events, median) and peak memory per backend; with ``--backends dfgnn,pyg``
PyG's conv runs the same model next, and where it runs out of memory that is
caught and reported instead of ending the run::

    python examples/full_graph_reddit.py --backends dfgnn,pyg \
        --json benchmarks/results/full-graph-reddit.json
    python examples/full_graph_reddit.py --scale 0.01 --avg-degree 20 \
        --device cpu --steps 2            # small, on a CPU
"""
from __future__ import annotations

import argparse
import gc
import os.path as osp
import statistics
import sys
import time
from typing import Any, Dict

import torch
import torch.nn.functional as F

sys.path.insert(0, osp.dirname(osp.abspath(__file__)))

from common import (GIB, AttentionGNN, OutOfMemory, gpu_name,  # noqa: E402
                    memory_guard, sync, write_json)

from pyg_dfgnn.datasets.reddit_like import reddit_like  # noqa: E402


def parse_args(argv=None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split('\n')[0])
    p.add_argument('--scale', type=float, default=1.0)
    p.add_argument('--avg-degree', type=float, default=None)
    p.add_argument('--conv', choices=('gat', 'transformer'), default='gat')
    p.add_argument('--backends', default='dfgnn,pyg',
                   help='comma-separated, run in this order')
    p.add_argument('--hidden', type=int, default=128)
    p.add_argument('--heads', type=int, default=4)
    p.add_argument('--steps', type=int, default=10, help='timed steps')
    p.add_argument('--warmup', type=int, default=2)
    p.add_argument('--lr', type=float, default=5e-3)
    p.add_argument('--seed', type=int, default=0)
    p.add_argument('--device', default='cuda' if torch.cuda.is_available()
                   else 'cpu')
    p.add_argument('--json', default=None)
    return p.parse_args(argv)


def run_backend(backend: str, data, args, device) -> Dict[str, Any]:
    torch.manual_seed(args.seed)
    model = AttentionGNN(args.conv, backend, data.num_features, args.hidden,
                         int(data.y.max()) + 1, 2, args.heads,
                         dropout=0.0).to(device)
    opt = torch.optim.Adam(model.parameters(), lr=args.lr)
    mask = data.train_mask

    def step() -> torch.Tensor:
        out = model(data.x, data.edge_index)
        loss = F.cross_entropy(out[mask], data.y[mask])
        opt.zero_grad(set_to_none=True)
        loss.backward()
        opt.step()
        return loss

    base = torch.cuda.memory_allocated(device) if device.type == 'cuda' \
        else 0
    if device.type == 'cuda':
        torch.cuda.reset_peak_memory_stats(device)
    advice = ('The full graph does not fit: train on sampled mini-batches '
              '(examples/sampled_reddit.py), or lower --hidden / --heads.')
    times = []
    try:
        with memory_guard(f'{backend} {args.conv} full-graph step', device,
                          advice):
            sync(device)
            t = time.perf_counter()
            loss = step()  # builds the DF-GNN format (cached afterwards)
            sync(device)
            first = time.perf_counter() - t
            for i in range(args.warmup + args.steps):
                sync(device)
                t = time.perf_counter()
                loss = step()
                sync(device)
                if i >= args.warmup:
                    times.append(time.perf_counter() - t)
        result = {
            'backend': backend, 'status': 'ok',
            'step_ms_median': 1e3 * statistics.median(times),
            'step_ms_min': 1e3 * min(times),
            'first_step_ms': 1e3 * first, 'final_loss': loss.item(),
        }
    except OutOfMemory as e:
        result = {'backend': backend, 'status': 'out of memory',
                  'error': str(e)}
    if device.type == 'cuda':
        peak = torch.cuda.max_memory_allocated(device)
        result.update(peak_gib=peak / GIB,
                      peak_above_data_gib=(peak - base) / GIB)
    del model, opt
    gc.collect()
    if device.type == 'cuda':
        torch.cuda.empty_cache()
    return result


def main(argv=None) -> Dict[str, Any]:
    args = parse_args(argv)
    device = torch.device(args.device)
    if device.type == 'cuda' and device.index is None:
        device = torch.device('cuda', torch.cuda.current_device())
    t = time.perf_counter()
    data = reddit_like(args.scale, avg_degree=args.avg_degree,
                       seed=args.seed, device=device)
    print(f'graph: {data.num_nodes} nodes, {data.num_edges} edges, '
          f'{data.num_features} features on {device} '
          f'({time.perf_counter() - t:.1f} s); model: 2 x {args.conv}, '
          f'hidden {args.hidden} ({args.heads} heads)')
    runs = []
    for backend in args.backends.split(','):
        r = run_backend(backend, data, args, device)
        runs.append(r)
        mem = f", peak {r['peak_gib']:.1f} GiB " \
            f"({r['peak_above_data_gib']:.1f} above the data)" \
            if 'peak_gib' in r else ''
        if r['status'] == 'ok':
            print(f"{backend:>6}: {r['step_ms_median']:.1f} ms per training "
                  f"step (median of {args.steps}; first step "
                  f"{r['first_step_ms']:.0f} ms incl. the format build)"
                  f"{mem}, loss {r['final_loss']:.4f}")
        else:
            print(f"{backend:>6}: {r['status']}{mem}\n        {r['error']}")
    result = {'example': 'full_graph_reddit', 'args': vars(args),
              'device': gpu_name(device), 'torch': torch.__version__,
              'num_nodes': data.num_nodes, 'num_edges': data.num_edges,
              'runs': runs}
    write_json(args.json, result)
    return result


if __name__ == '__main__':
    main()

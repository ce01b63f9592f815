"""End-to-end comparison: one config trained with ``backend: pyg`` and
``backend: dfgnn`` for the same epochs on the same generated data.

Prints per-epoch training time, throughput and validation metric side by side
and writes ``<out>/e2e-<name>-<device>.json`` with both runs' histories and a
summary (median epoch time without the first, warm-up epoch; speed-up;
final/best metrics).

Two times are reported per epoch: ``epoch_time_s`` (the whole training pass,
batch collation included) and ``compute_time_s`` (forward + backward +
optimizer step only). Both backends share everything but the DF convs (the
global attention, FFN and norms are the same modules), so the end-to-end
speed-up is bounded by the share of time the local convs take; the
``pattern-gat`` / ``pattern-gt`` configs (local layers only) show the conv
speed-up more directly. Use ``--epochs 3`` or more (the first epoch is
excluded from the medians) and ``train.num_workers=4`` on a GPU machine so
that batch collation overlaps with compute.
"""
from __future__ import annotations

import json
import os
import os.path as osp
import statistics
import time
from typing import Any, Dict, List, Optional

from pyg_dfgnn.train.config import load_config

BACKENDS = ('pyg', 'dfgnn')


def _median_epoch_time(history: List[Dict[str, Any]],
                       key: str = 'epoch_time_s') -> float:
    times = [row[key] for row in history]
    steady = times[1:] if len(times) > 1 else times
    return statistics.median(steady)


def bench_e2e(cfg_path: str, epochs: int,
              overrides: Optional[List[str]] = None,
              out_dir: str = 'benchmarks/results',
              log=print) -> Dict[str, Any]:
    """Trains ``cfg_path`` with both backends for ``epochs`` epochs; prints
    the comparison and returns (and writes) the result dict."""
    from pyg_dfgnn.datasets import build_datasets
    from pyg_dfgnn.train.runner import train

    if epochs < 1:
        raise ValueError(f'epochs must be >= 1, got {epochs}')
    runs: Dict[str, Any] = {}
    bundle = None
    for backend in BACKENDS:
        cfg = load_config(cfg_path, list(overrides or []) + [
            f'optim.max_epoch={epochs}', f'backend={backend}',
            'train.enable_ckpt=false'])
        cfg.name = f'{cfg.name}-e2e'
        if bundle is None:  # both backends see the very same graphs
            bundle = build_datasets(cfg)
        log(f'=== backend {backend} ===')
        runs[backend] = train(cfg, bundle=bundle, log=log)

    summary: Dict[str, Any] = {}
    for backend, res in runs.items():
        final = res['final']
        summary[backend] = {
            'median_epoch_time_s': _median_epoch_time(res['history']),
            'median_compute_time_s': _median_epoch_time(res['history'],
                                                        'compute_time_s'),
            'median_graphs_per_s': statistics.median(
                row['graphs_per_s'] for row in res['history']),
            'final_val_metric': final.get('val_metric'),
            'final_test_metric': final.get('test_metric'),
            'best_val_metric': res['best']['val_metric'] if res['best'] else
            None,
            'best_test_metric': res['best']['test_metric'] if res['best']
            else None,
        }
    speedup = (summary['pyg']['median_epoch_time_s'] /
               summary['dfgnn']['median_epoch_time_s'])
    compute_speedup = (summary['pyg']['median_compute_time_s'] /
                       summary['dfgnn']['median_compute_time_s'])
    delta = None
    if summary['pyg']['final_test_metric'] is not None:
        delta = (summary['dfgnn']['final_test_metric'] -
                 summary['pyg']['final_test_metric'])

    metric = runs['pyg']['metric']
    log('')
    log(f"e2e {runs['pyg']['name']} on {runs['pyg']['device_name']}: "
        f"{epochs} epochs, {runs['pyg']['num_params']} params, fused "
        f"kernels: {runs['dfgnn']['fused_kernels']}")
    log(f"{'epoch':>5} {'pyg s':>8} {'dfgnn s':>8} {'speedup':>7} "
        f"{'pyg cmp s':>9} {'dfgnn cmp s':>11} "
        f"{'pyg g/s':>9} {'dfgnn g/s':>9} {'pyg val':>8} {'dfgnn val':>9}")
    for a, b in zip(runs['pyg']['history'], runs['dfgnn']['history']):
        sp = a['epoch_time_s'] / b['epoch_time_s']
        log(f"{a['epoch']:>5} {a['epoch_time_s']:>8.3f} "
            f"{b['epoch_time_s']:>8.3f} {sp:>6.2f}x "
            f"{a['compute_time_s']:>9.3f} {b['compute_time_s']:>11.3f} "
            f"{a['graphs_per_s']:>9.1f} {b['graphs_per_s']:>9.1f} "
            f"{a.get('val_metric', float('nan')):>8.4f} "
            f"{b.get('val_metric', float('nan')):>9.4f}")
    log(f"median epoch time (w/o first): pyg "
        f"{summary['pyg']['median_epoch_time_s']:.3f}s, dfgnn "
        f"{summary['dfgnn']['median_epoch_time_s']:.3f}s -> {speedup:.2f}x")
    log(f"median compute time (fwd+bwd+step, w/o batch loading): pyg "
        f"{summary['pyg']['median_compute_time_s']:.3f}s, dfgnn "
        f"{summary['dfgnn']['median_compute_time_s']:.3f}s -> "
        f"{compute_speedup:.2f}x")
    log(f"final test {metric}: pyg {summary['pyg']['final_test_metric']:.4f},"
        f" dfgnn {summary['dfgnn']['final_test_metric']:.4f}"
        + (f' (delta {delta * 100:+.2f} points)' if delta is not None
           else ''))

    result = {
        'config': cfg_path, 'overrides': list(overrides or []),
        'epochs': epochs, 'metric': metric,
        'device': runs['pyg']['device'],
        'device_name': runs['pyg']['device_name'],
        'num_params': runs['pyg']['num_params'],
        'fused_kernels': runs['dfgnn']['fused_kernels'],
        'dataset_sizes': runs['pyg']['dataset_sizes'],
        'speedup_epoch_time': speedup,
        'speedup_compute_time': compute_speedup, 'test_metric_delta': delta,
        'summary': summary,
        'runs': {k: {kk: v[kk] for kk in ('history', 'best', 'final',
                                           'wall_time_s', 'torch')}
                 for k, v in runs.items()},
        'time': time.strftime('%Y-%m-%dT%H:%M:%SZ', time.gmtime()),
    }
    os.makedirs(out_dir, exist_ok=True)
    device_tag = 'cuda' if result['device'].startswith('cuda') else 'cpu'
    path = osp.join(out_dir, f"e2e-{runs['pyg']['name'][:-4]}-{device_tag}"
                    f".json")
    with open(path, 'w') as f:
        json.dump(result, f, indent=2)
    log(f'wrote {path}')
    result['path'] = path
    return result

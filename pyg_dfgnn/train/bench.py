"""End-to-end comparison: one config trained three ways for the same epochs
on the same generated data:

* ``pyg`` - the PyG backend as GraphGPS runs it: eager, PyG ``DataLoader``
  (host collation, ``train.loader=pyg``);
* ``pyg-runner`` - the PyG backend with every runner improvement that
  applies to it: device-resident batches (``train.loader=device``) and, on
  CUDA, the captured step (``train.capture=true``);
* ``dfgnn`` - our backend with all of them (fused local convs, fused global
  attention over the block-diagonal graph, device batches, captured step).

``dfgnn`` vs ``pyg`` is what a GraphGPS user gains; ``dfgnn`` vs
``pyg-runner`` what our convs and attention buy on top of the runner.

Prints per-epoch training time, throughput and validation metric side by side
and writes ``<out>/e2e-<name>-<device>.json`` with the runs' histories and a
summary (median epoch time without the first, warm-up epoch; speed-ups;
final/best metrics).

Two times are reported per epoch: ``epoch_time_s`` (the whole training pass,
batch building included) and ``compute_time_s`` (the steps: CUDA-event time
on the GPU). Use ``--epochs 3`` or more (the first epoch, which also
captures the step's graphs, is excluded from the medians).
"""
from __future__ import annotations

import json
import os
import os.path as osp
import statistics
import time
from typing import Any, Dict, List, Optional

from pyg_dfgnn.train.config import load_config

#: name -> overrides of the variants compared (``capture`` only on CUDA).
VARIANTS = {
    'pyg': ['backend=pyg', 'train.loader=pyg', 'train.capture=false'],
    'pyg-runner': ['backend=pyg', 'train.loader=device'],
    'dfgnn': ['backend=dfgnn', 'train.loader=device'],
}



def _median_epoch_time(history: List[Dict[str, Any]],
                       key: str = 'epoch_time_s') -> float:
    times = [row[key] for row in history]
    steady = times[1:] if len(times) > 1 else times
    return statistics.median(steady)


def bench_e2e(cfg_path: str, epochs: int,
              overrides: Optional[List[str]] = None,
              out_dir: str = 'benchmarks/results',
              log=print) -> Dict[str, Any]:
    """Trains ``cfg_path`` in the :data:`VARIANTS` for ``epochs`` epochs;
    prints the comparison and returns (and writes) the result dict."""
    import torch

    from pyg_dfgnn.datasets import build_datasets
    from pyg_dfgnn.train.runner import resolve_device, train

    if epochs < 1:
        raise ValueError(f'epochs must be >= 1, got {epochs}')
    runs: Dict[str, Any] = {}
    bundle = None
    for variant, extra in VARIANTS.items():
        cfg = load_config(cfg_path, list(overrides or []) + [
            f'optim.max_epoch={epochs}', 'train.enable_ckpt=false'] + extra)
        if variant != 'pyg':
            cfg.train.capture = resolve_device(cfg).type == 'cuda'
        cfg.name = f'{cfg.name}-e2e-{variant}'
        if bundle is None:  # every variant sees the very same graphs
            bundle = build_datasets(cfg)
        log(f'=== {variant}: ' + ' '.join(extra) +
            (' train.capture=true' if cfg.train.capture else '') + ' ===')
        runs[variant] = train(cfg, bundle=bundle, log=log)
        if torch.cuda.is_available():
            torch.cuda.empty_cache()

    summary: Dict[str, Any] = {}
    for variant, res in runs.items():
        final = res['final']
        summary[variant] = {
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
            'capture': res['config']['train']['capture'],
            'loader': res['config']['train']['loader'],
        }

    def ratio(a: str, b: str, key: str = 'median_epoch_time_s') -> float:
        return summary[a][key] / summary[b][key]

    speedup = ratio('pyg', 'dfgnn')
    speedup_runner = ratio('pyg-runner', 'dfgnn')
    compute_speedup = ratio('pyg', 'dfgnn', 'median_compute_time_s')
    delta = None
    if summary['pyg']['final_test_metric'] is not None:
        delta = (summary['dfgnn']['final_test_metric'] -
                 summary['pyg']['final_test_metric'])

    first = runs['pyg']
    metric = first['metric']
    names = list(runs)
    log('')
    log(f"e2e {cfg_path} on {first['device_name']}: {epochs} epochs, "
        f"{first['num_params']} params, fused kernels: "
        f"{runs['dfgnn']['fused_kernels']}")
    log(f"{'epoch':>5} " + ' '.join(f'{n + " s":>12}' for n in names) + ' '
        + ' '.join(f'{n + " val":>14}' for n in names))
    for rows in zip(*(runs[n]['history'] for n in names)):
        log(f"{rows[0]['epoch']:>5} " +
            ' '.join(f"{r['epoch_time_s']:>12.3f}" for r in rows) + ' ' +
            ' '.join(f"{r.get('val_metric', float('nan')):>14.4f}"
                     for r in rows))
    log('median epoch time (w/o first): ' + ', '.join(
        f"{n} {summary[n]['median_epoch_time_s']:.3f}s" for n in names))
    log(f'speedup dfgnn vs pyg (GraphGPS way): {speedup:.2f}x; vs '
        f'pyg-runner (same runner): {speedup_runner:.2f}x')
    log('median compute time (steps only): ' + ', '.join(
        f"{n} {summary[n]['median_compute_time_s']:.3f}s" for n in names) +
        f' -> dfgnn vs pyg {compute_speedup:.2f}x')
    log(f'final test {metric}: ' + ', '.join(
        f"{n} {summary[n]['final_test_metric']:.4f}" for n in names) +
        (f' (dfgnn - pyg {delta * 100:+.2f} points)' if delta is not None
         else ''))

    result = {
        'config': cfg_path, 'overrides': list(overrides or []),
        'epochs': epochs, 'metric': metric,
        'variants': {k: v for k, v in VARIANTS.items()},
        'device': first['device'], 'device_name': first['device_name'],
        'num_params': first['num_params'],
        'fused_kernels': runs['dfgnn']['fused_kernels'],
        'dataset_sizes': first['dataset_sizes'],
        'speedup_epoch_time': speedup,
        'speedup_vs_pyg_runner': speedup_runner,
        'speedup_compute_time': compute_speedup, 'test_metric_delta': delta,
        'summary': summary,
        'runs': {k: {kk: v[kk] for kk in ('history', 'best', 'final',
                                           'wall_time_s', 'torch')}
                 for k, v in runs.items()},
        'time': time.strftime('%Y-%m-%dT%H:%M:%SZ', time.gmtime()),
    }
    os.makedirs(out_dir, exist_ok=True)
    device_tag = 'cuda' if result['device'].startswith('cuda') else 'cpu'
    name = osp.splitext(osp.basename(cfg_path))[0]
    path = osp.join(out_dir, f'e2e-{name}-{device_tag}.json')
    with open(path, 'w') as f:
        json.dump(result, f, indent=2)
    log(f'wrote {path}')
    result['path'] = path
    return result

"""End-to-end comparison: one config trained several ways for the same
epochs on the same generated data:

* ``pyg`` - the PyG backend as GraphGPS runs it: eager, PyG ``DataLoader``
  (host collation, ``train.loader=pyg``);
* ``pyg-runner`` - the PyG backend with every runner improvement that
  applies to it: device-resident batches (``train.loader=device``) and, on
  CUDA, the captured step (``train.capture=graphs``);
* ``dfgnn`` - our backend with all of them (fused local convs, fused global
  attention over the block-diagonal graph, device batches, captured step);
* ``pyg-runner-compile`` / ``dfgnn-compile`` (not run by default) - the
  same two with the step through ``torch.compile`` instead
  (``train.capture=compile``: inductor, on CUDA ``mode='reduce-overhead'``),
  to compare it with the CUDA graphs of ``pyg-runner`` / ``dfgnn``;
* ``pyg-runner-layers`` / ``dfgnn-layers`` (not run by default) - the CUDA
  graphs of ``pyg-runner`` / ``dfgnn`` replaying GPS layers compiled by
  inductor (``train.compile_layers=true``: one compilation for all layers).

``speedup_vs_best_pyg_runner`` compares the fastest ``dfgnn*`` variant
that ran with the fastest ``pyg-runner*`` one (the PyG backend with every
runner improvement that applies to it).

``dfgnn`` vs ``pyg`` is what a GraphGPS user gains; ``dfgnn`` vs
``pyg-runner`` what our convs and attention buy on top of the runner.
``variants`` (``--variants`` of ``bench-e2e``) picks the ones to run.

Prints per-epoch training time, throughput and validation metric side by side
and writes ``<out>/e2e-<name>-<device>.json`` with the runs' histories and a
summary (median epoch time without the first, warm-up epoch; speed-ups;
final/best metrics).

Two times are reported per epoch: ``epoch_time_s`` (the whole training pass,
batch building included) and ``compute_time_s`` (the steps: CUDA-event time
on the GPU). Use ``--epochs 3`` or more (the first epoch, which also
captures the step's graphs or compiles it, is excluded from the medians;
``new_captures_after_first_epoch`` in the summary says whether later
epochs captured or compiled too, i.e. whether their times include that).
"""
from __future__ import annotations

import json
import os
import os.path as osp
import statistics
import time
from typing import Any, Dict, List, Optional, Sequence, Tuple

from pyg_dfgnn.train.config import ConfigError, load_config

#: name -> overrides of the variants compared; those that name no
#: ``train.capture`` take ``graphs`` on CUDA, ``none`` elsewhere.
VARIANTS = {
    'pyg': ['backend=pyg', 'train.loader=pyg', 'train.capture=none'],
    'pyg-runner': ['backend=pyg', 'train.loader=device'],
    'dfgnn': ['backend=dfgnn', 'train.loader=device'],
    'pyg-runner-compile': ['backend=pyg', 'train.loader=device',
                           'train.capture=compile'],
    'dfgnn-compile': ['backend=dfgnn', 'train.loader=device',
                      'train.capture=compile'],
    'pyg-runner-layers': ['backend=pyg', 'train.loader=device',
                          'train.compile_layers=true'],
    'dfgnn-layers': ['backend=dfgnn', 'train.loader=device',
                     'train.compile_layers=true'],
}
#: What ``bench-e2e`` runs without ``--variants``.
DEFAULT_VARIANTS = ('pyg', 'pyg-runner', 'dfgnn')
#: (compiled variant, its CUDA-graphs twin) pairs compared in the summary.
COMPILE_PAIRS = (('pyg-runner-compile', 'pyg-runner'),
                 ('dfgnn-compile', 'dfgnn'),
                 ('pyg-runner-layers', 'pyg-runner'),
                 ('dfgnn-layers', 'dfgnn'))


def parse_variants(text: Optional[str]) -> List[str]:
    """``'pyg,dfgnn'`` -> ``['pyg', 'dfgnn']`` (``None``:
    :data:`DEFAULT_VARIANTS`)."""
    if text is None:
        return list(DEFAULT_VARIANTS)
    return _check_variants([n.strip() for n in text.split(',')
                            if n.strip()])


def _check_variants(names: Sequence[str]) -> List[str]:
    names = list(names)
    bad = [n for n in names if n not in VARIANTS]
    if bad or not names or len(set(names)) != len(names):
        raise ConfigError(f"variants must be distinct names out of "
                          f"{list(VARIANTS)}, got {names}")
    return names



def _median_epoch_time(history: List[Dict[str, Any]],
                       key: str = 'epoch_time_s') -> float:
    times = [row[key] for row in history]
    steady = times[1:] if len(times) > 1 else times
    return statistics.median(steady)


#: What a result keeps of each variant's run.
_RUN_FIELDS = ('history', 'best', 'final', 'wall_time_s')


def _run_fields(runs: Dict[str, Any], extra: Tuple[str, ...] = ()
                ) -> Dict[str, Any]:
    return {k: {kk: v[kk] for kk in _RUN_FIELDS + extra}
            for k, v in runs.items()}


def _cfg_name(cfg_path: str) -> str:
    return osp.splitext(osp.basename(cfg_path))[0]


def _partial_path(out_dir: str, cfg_path: str) -> str:
    return osp.join(out_dir, f'e2e-{_cfg_name(cfg_path)}.partial.json')


def _write_partial(out_dir: str, cfg_path: str,
                   overrides: Optional[List[str]], epochs: int,
                   runs: Dict[str, Any]) -> str:
    """The histories of the variants that finished, rewritten after each
    one (and removed once the full result is written)."""
    os.makedirs(out_dir, exist_ok=True)
    path = _partial_path(out_dir, cfg_path)
    with open(path, 'w') as f:
        json.dump({
            'config': cfg_path, 'overrides': list(overrides or []),
            'epochs': epochs, 'finished': list(runs),
            'runs': _run_fields(runs),
            'time': time.strftime('%Y-%m-%dT%H:%M:%SZ', time.gmtime()),
        }, f, indent=2)
    return path


def bench_e2e(cfg_path: str, epochs: int,
              overrides: Optional[List[str]] = None,
              out_dir: str = 'benchmarks/results',
              log=print,
              variants: Optional[Sequence[str]] = None) -> Dict[str, Any]:
    """Trains ``cfg_path`` in the ``variants`` (names of :data:`VARIANTS`,
    default :data:`DEFAULT_VARIANTS`) for ``epochs`` epochs; prints the
    comparison and returns (and writes) the result dict. Speed-ups are
    reported for the pairs of variants that ran."""
    import torch

    from pyg_dfgnn.datasets import build_datasets
    from pyg_dfgnn.train.runner import resolve_device, train

    if epochs < 1:
        raise ValueError(f'epochs must be >= 1, got {epochs}')
    names = _check_variants(DEFAULT_VARIANTS if variants is None else
                            variants)
    # Before any training: a result folder that cannot be one fails now.
    os.makedirs(out_dir, exist_ok=True)
    runs: Dict[str, Any] = {}
    bundle = None
    for variant in names:
        extra = VARIANTS[variant]
        cfg = load_config(cfg_path, list(overrides or []) + [
            f'optim.max_epoch={epochs}', 'train.enable_ckpt=false'] + extra)
        if not any(o.startswith('train.capture=') for o in extra):
            cfg.train.capture = 'graphs' if \
                resolve_device(cfg).type == 'cuda' else 'none'
        cfg.name = f'{cfg.name}-e2e-{variant}'
        if bundle is None:  # every variant sees the very same graphs
            bundle = build_datasets(cfg)
        log(f'=== {variant}: ' + ' '.join(
            o for o in extra if not o.startswith('train.capture=')) +
            f' train.capture={cfg.train.capture} ===')
        runs[variant] = train(cfg, bundle=bundle, log=log)
        if torch.cuda.is_available():
            torch.cuda.empty_cache()
        # what ran so far, for a run cut short (a device call's time limit)
        _write_partial(out_dir, cfg_path, overrides, epochs, runs)

    summary: Dict[str, Any] = {}
    for variant, res in runs.items():
        final = res['final']
        captures = [row['captures'] for row in res['history']
                    if 'captures' in row]
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
            # CUDA graphs captured / graphs compiled after epoch 0: > 0
            # means that the medians include warm-up time.
            'new_captures_after_first_epoch': captures[-1] - captures[0]
            if captures else None,
        }

    def ratio(a: str, b: str, key: str = 'median_epoch_time_s'
              ) -> Optional[float]:
        """How many times faster ``b`` is than ``a`` (both ran)."""
        if a not in summary or b not in summary:
            return None
        return summary[a][key] / summary[b][key]

    speedup = ratio('pyg', 'dfgnn')
    speedup_runner = ratio('pyg-runner', 'dfgnn')
    compute_speedup = ratio('pyg', 'dfgnn', 'median_compute_time_s')
    # > 1: the compiled step is faster than the variant's CUDA graphs
    # (eager on the CPU).
    pairs = [(c, g) for c, g in COMPILE_PAIRS if c in runs and g in runs]
    compile_speedup = {c: ratio(g, c) for c, g in pairs}
    compile_compute_speedup = {c: ratio(g, c, 'median_compute_time_s')
                               for c, g in pairs}
    # the fastest of each backend's runner variants that ran
    best = {}
    for prefix in ('dfgnn', 'pyg-runner'):
        ran = [n for n in summary if n.startswith(prefix)]
        if ran:
            best[prefix] = min(
                ran, key=lambda n: summary[n]['median_epoch_time_s'])
    speedup_best = ratio(best['pyg-runner'], best['dfgnn']) \
        if len(best) == 2 else None
    delta = None
    if speedup is not None and \
            summary['pyg']['final_test_metric'] is not None:
        delta = (summary['dfgnn']['final_test_metric'] -
                 summary['pyg']['final_test_metric'])

    first = runs[names[0]]
    metric = first['metric']
    fused = next((runs[n]['fused_kernels'] for n in names
                  if runs[n]['backend'] == 'dfgnn'), None)
    log('')
    log(f"e2e {cfg_path} on {first['device_name']}: {epochs} epochs, "
        f"{first['num_params']} params, fused kernels: {fused}")
    log(f"{'epoch':>5} " + ' '.join(f'{n + " s":>12}' for n in names) + ' '
        + ' '.join(f'{n + " val":>14}' for n in names))
    for rows in zip(*(runs[n]['history'] for n in names)):
        log(f"{rows[0]['epoch']:>5} " +
            ' '.join(f"{r['epoch_time_s']:>12.3f}" for r in rows) + ' ' +
            ' '.join(f"{r.get('val_metric', float('nan')):>14.4f}"
                     for r in rows))
    log('median epoch time (w/o first): ' + ', '.join(
        f"{n} {summary[n]['median_epoch_time_s']:.3f}s" for n in names))
    if speedup is not None:
        log(f'speedup dfgnn vs pyg (GraphGPS way): {speedup:.2f}x' + (
            f'; vs pyg-runner (same runner): {speedup_runner:.2f}x'
            if speedup_runner is not None else ''))
    for c, g in pairs:
        log(f'speedup {c} vs {g} (train.capture '
            f"{summary[g]['capture']}): {compile_speedup[c]:.2f}x epoch "
            f'time, {compile_compute_speedup[c]:.2f}x compute')
    if speedup_best is not None:
        log(f"speedup fastest dfgnn ({best['dfgnn']}) vs fastest PyG runner "
            f"({best['pyg-runner']}): {speedup_best:.2f}x epoch time")
    log('median compute time (steps only): ' + ', '.join(
        f"{n} {summary[n]['median_compute_time_s']:.3f}s" for n in names) +
        (f' -> dfgnn vs pyg {compute_speedup:.2f}x'
         if compute_speedup is not None else ''))
    log(f'final test {metric}: ' + ', '.join(
        f"{n} {summary[n]['final_test_metric']:.4f}" for n in names) +
        (f' (dfgnn - pyg {delta * 100:+.2f} points)' if delta is not None
         else ''))
    late = [n for n in names if summary[n]['new_captures_after_first_epoch']]
    if late:
        log(f'note: {", ".join(late)} captured or compiled after epoch 0: '
            f'their medians include warm-up time (more epochs help)')

    result = {
        'config': cfg_path, 'overrides': list(overrides or []),
        'epochs': epochs, 'metric': metric,
        'variants': {k: VARIANTS[k] for k in names},
        'device': first['device'], 'device_name': first['device_name'],
        'num_params': first['num_params'],
        'fused_kernels': fused,
        'dataset_sizes': first['dataset_sizes'],
        'speedup_epoch_time': speedup,
        'speedup_vs_pyg_runner': speedup_runner,
        'speedup_vs_best_pyg_runner': speedup_best,
        'best_variants': best,
        'speedup_compute_time': compute_speedup, 'test_metric_delta': delta,
        'speedup_compile_vs_graphs': compile_speedup,
        'speedup_compile_vs_graphs_compute': compile_compute_speedup,
        'summary': summary,
        'runs': _run_fields(runs, ('torch', )),
        'time': time.strftime('%Y-%m-%dT%H:%M:%SZ', time.gmtime()),
    }
    os.makedirs(out_dir, exist_ok=True)
    device_tag = 'cuda' if result['device'].startswith('cuda') else 'cpu'
    path = osp.join(out_dir, f'e2e-{_cfg_name(cfg_path)}-{device_tag}.json')
    with open(path, 'w') as f:
        json.dump(result, f, indent=2)
    partial = _partial_path(out_dir, cfg_path)
    if osp.exists(partial):
        os.remove(partial)
    log(f'wrote {path}')
    result['path'] = path
    return result

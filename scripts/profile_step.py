"""Where a training step's time goes (GPU), per variant of the runner: the
same config, model and batches as the runner, free-running ms per step
(batch building included, one sync at the end), GPU kernel time per step
(torch.profiler), the GPU busy fraction (kernel time / wall time) and the
host syncs / copies per step.

Variants: ``pyg`` (PyG backend, PyG DataLoader, eager: as GraphGPS runs
it), ``pyg-runner`` (PyG backend, device loader, step as CUDA graphs),
``dfgnn-eager`` (device loader, eager), ``dfgnn`` (device loader, CUDA
graphs), ``pyg-runner-compile`` / ``dfgnn-compile`` (device loader, step
through torch.compile, mode='reduce-overhead'), ``pyg-runner-layers`` /
``dfgnn-layers`` (CUDA graphs of GPS layers compiled by inductor,
``train.compile_layers``), ``dfgnn-fused`` /
``dfgnn-padded`` (``dfgnn`` with the global attention through our op on
the complete graph / GraphGPS's padding instead of the varlen kernel). Captures and compilation
happen in the ``--steps`` warm-up steps, before the timed ones.

    python scripts/profile_step.py --cfg configs/pattern-gps.yaml \
        [--size 2000] [--steps 40] [--variants dfgnn,dfgnn-compile] \
        [--json out.json] [key=value ...]
"""
import argparse
import json
import os
import sys
import time

import torch

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)

from pyg_dfgnn.train.bench import VARIANTS as BENCH_VARIANTS  # noqa: E402

#: bench-e2e's variants, with the capture it gives them on CUDA (graphs
#: where they name none), and diagnostic ones of its own.
VARIANTS = {
    name: extra + ([] if any(o.startswith('train.capture=') for o in extra)
                   else ['train.capture=graphs'])
    for name, extra in BENCH_VARIANTS.items()}
_GRAPHS = ['backend=dfgnn', 'train.loader=device', 'train.capture=graphs']
VARIANTS.update({
    'dfgnn-eager': ['backend=dfgnn', 'train.loader=device',
                    'train.capture=none'],
    # the global attention's other kernels (gt.attn_impl; 'dfgnn' runs the
    # default: varlen on CUDA, fused with attention dropout)
    'dfgnn-fused': _GRAPHS + ['gt.attn_impl=fused'],
    'dfgnn-padded': _GRAPHS + ['gt.attn_impl=padded'],
    'dfgnn-layers-padded': _GRAPHS + ['train.compile_layers=true',
                                      'gt.attn_impl=padded'],
    # one staging window per graph (train.windows_per_graph=1)
    'dfgnn-graph-windows': _GRAPHS + ['train.windows_per_graph=1'],
})
SYNC_KEYS = ('cudaStreamSynchronize', 'cudaDeviceSynchronize', 'aten::item',
             'aten::_local_scalar_dense', 'aten::nonzero', 'cudaMemcpyAsync')


def training_setup(cfg_path: str, size: int, overrides, bundle, dev):
    """What the runner builds for a training step of ``cfg_path`` with
    ``overrides`` on ``dev`` (the datasets once: ``bundle`` when given):
    ``(cfg, bundle, model, optimizer, train loader, stats, capture)``,
    the model in train mode, seeded as the runner seeds it."""
    from pyg_dfgnn.datasets import build_datasets
    from pyg_dfgnn.train.config import load_config, pads_batches
    from pyg_dfgnn.train.model import build_model
    from pyg_dfgnn.train.runner import (EpochStats, capture_mode,
                                        make_loaders, make_optimizer)
    cfg = load_config(cfg_path, [f'dataset.size={size}',
                                 'train.num_workers=0'] + list(overrides))
    if bundle is None:
        bundle = build_datasets(cfg)
    torch.manual_seed(0)
    model = build_model(cfg, bundle.dim_in, bundle.dim_out,
                        bundle.num_node_types, bundle.dim_edge,
                        bundle.num_edge_types).to(dev)
    capture = capture_mode(cfg, dev)
    opt = make_optimizer(cfg, model.parameters(), capture)
    loader, _ = make_loaders(cfg, bundle, dev, model, torch.Generator(),
                             pads_batches(cfg))
    stats = EpochStats(cfg.metric_best, bundle.dim_out, dev)
    model.train()
    return cfg, bundle, model, opt, loader, stats, capture


def main():
    p = argparse.ArgumentParser()
    p.add_argument('--cfg', default='configs/pattern-gps.yaml')
    p.add_argument('--size', type=int, default=2000)
    p.add_argument('--steps', type=int, default=40)
    p.add_argument('--profile-steps', type=int, default=8)
    p.add_argument('--variants', default='pyg,pyg-runner,dfgnn-eager,dfgnn')
    p.add_argument('--json', default=None)
    p.add_argument('overrides', nargs='*')
    args = p.parse_args()
    from torch.profiler import ProfilerActivity, profile

    from pyg_dfgnn.train.capture import wrap_step
    from pyg_dfgnn.train.runner import train_step

    dev = torch.device('cuda')
    rows = []
    bundle = None
    for name in args.variants.split(','):
        cfg, bundle, model, opt, loader, stats, capture = training_setup(
            args.cfg, args.size, VARIANTS[name] + args.overrides, bundle, dev)

        def step(batch):
            train_step(model, opt, batch, cfg, stats)

        run = wrap_step(capture, step, opt, dev, static=(stats.sums, ))

        def batches(n):
            done = 0
            while True:
                for batch in loader:
                    if done == n:
                        return
                    if cfg.train.loader == 'pyg':
                        batch = batch.to(dev, non_blocking=True)
                    yield batch
                    done += 1

        for b in batches(args.steps):  # warm-up: kernels, captures
            run(b)
        torch.cuda.synchronize()
        t0 = time.perf_counter()
        for b in batches(args.steps):
            run(b)
        torch.cuda.synchronize()
        wall = (time.perf_counter() - t0) / args.steps * 1e3
        with profile(activities=[ProfilerActivity.CPU,
                                 ProfilerActivity.CUDA]) as prof:
            for b in batches(args.profile_steps):
                run(b)
            torch.cuda.synchronize()
        events = prof.key_averages()
        kernel_us = sum(e.self_device_time_total for e in events
                        if e.device_type == torch.autograd.DeviceType.CUDA)
        gpu = kernel_us / args.profile_steps / 1e3
        counts = {e.key: e.count / args.profile_steps for e in events
                  if e.key in SYNC_KEYS}
        row = {'variant': name, 'capture': capture,
               'layer_type': cfg.gt.layer_type,
               'batch_size': cfg.train.batch_size, 'ms_per_step': wall,
               'gpu_ms_per_step': gpu, 'gpu_busy': gpu / wall,
               'per_step': counts}
        rows.append(row)
        print(f'\n== {name}: {cfg.gt.layer_type} x{cfg.gt.layers}, batch '
              f'{cfg.train.batch_size}: {wall:.2f} ms/step free-running, '
              f'GPU kernels {gpu:.2f} ms/step, busy {gpu / wall:.0%}')
        for key, c in sorted(counts.items()):
            print(f'   {key:28s} calls/step {c:6.1f}')
        print(events.table(sort_by='self_device_time_total',
                           row_limit=int(os.environ.get('PROFILE_ROWS', 12)),
                           max_name_column_width=48))
        del model, opt, loader, run
        torch.cuda.empty_cache()
    print(f"\n{'variant':18s} {'ms/step':>8s} {'GPU ms':>8s} {'busy':>6s}")
    for r in rows:
        print(f"{r['variant']:18s} {r['ms_per_step']:8.2f} "
              f"{r['gpu_ms_per_step']:8.2f} {r['gpu_busy']:6.0%}")
    if args.json:
        with open(args.json, 'w') as f:
            json.dump(rows, f, indent=2)


if __name__ == '__main__':
    main()

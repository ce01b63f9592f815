"""Where a training step's time goes, per backend (GPU): the same config,
model and batches as the runner, timed in phases (load, to(device),
forward, backward, optimizer) with a sync after each, then the host ops
with the most self time (torch.profiler) and the number of host syncs.

    python scripts/profile_step.py --cfg configs/pattern-gat.yaml \
        [--size 2000] [--steps 40] [key=value ...]
"""
import argparse
import os
import sys
import time
from collections import defaultdict

import torch

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)


def main():
    p = argparse.ArgumentParser()
    p.add_argument('--cfg', default='configs/pattern-gat.yaml')
    p.add_argument('--size', type=int, default=2000)
    p.add_argument('--steps', type=int, default=40)
    p.add_argument('--profile-steps', type=int, default=8)
    p.add_argument('overrides', nargs='*')
    args = p.parse_args()
    from torch_geometric.loader import DataLoader

    from pyg_dfgnn.datasets import build_datasets
    from pyg_dfgnn.train.config import load_config
    from pyg_dfgnn.train.model import build_model
    from pyg_dfgnn.train.runner import compute_loss, make_optimizer

    dev = torch.device('cuda')
    for backend in ('pyg', 'dfgnn'):
        cfg = load_config(args.cfg, [f'backend={backend}',
                                     f'dataset.size={args.size}',
                                     'train.num_workers=0'] + args.overrides)
        bundle = build_datasets(cfg)
        torch.manual_seed(0)
        model = build_model(cfg, bundle.dim_in, bundle.dim_out,
                            bundle.num_node_types).to(dev)
        opt = make_optimizer(cfg, model.parameters())
        loader = DataLoader(bundle.train, batch_size=cfg.train.batch_size,
                            shuffle=True)
        phases = defaultdict(float)

        def step(batch, timed):
            t = time.perf_counter()

            def mark(name):
                nonlocal t
                if timed:
                    torch.cuda.synchronize()
                    now = time.perf_counter()
                    phases[name] += now - t
                    t = now
            batch = batch.to(dev)
            mark('to(device)')
            pred = model(batch)
            loss = compute_loss(cfg.model.loss_fun, pred, batch.y)
            mark('forward+loss')
            opt.zero_grad(set_to_none=True)
            loss.backward()
            mark('backward')
            if cfg.optim.clip_grad_norm:
                torch.nn.utils.clip_grad_norm_(model.parameters(),
                                               cfg.optim.clip_grad_norm_value)
            opt.step()
            mark('clip+step')
            return loss

        it = iter(loader)
        batches = [next(it) for _ in range(args.steps + 10)]
        for b in batches[:10]:  # warm-up (kernel loads, caches)
            step(b, False)
        torch.cuda.synchronize()
        t0 = time.perf_counter()
        for b in batches[10:]:
            step(b, False).item()
        torch.cuda.synchronize()
        free_run = (time.perf_counter() - t0) / args.steps * 1e3
        for b in batches[10:]:
            step(b, True)
        print(f'\n== {backend}: {cfg.gt.layer_type} x{cfg.gt.layers}, batch '
              f'{cfg.train.batch_size}; ms per step: free-running '
              f'{free_run:.2f} (loss.item() per step, as the runner)')
        for name, s in phases.items():
            print(f'   {name:14s} {s / args.steps * 1e3:8.2f} (synced)')
        from torch.profiler import ProfilerActivity, profile
        with profile(activities=[ProfilerActivity.CPU,
                                 ProfilerActivity.CUDA]) as prof:
            for b in batches[10:10 + args.profile_steps]:
                step(b, False).item()
        table = prof.key_averages().table(sort_by='self_cpu_time_total',
                                          row_limit=25, max_name_column_width=48)
        print(table)
        syncs = [e for e in prof.key_averages()
                 if e.key in ('cudaStreamSynchronize', 'cudaDeviceSynchronize',
                              'cudaMemcpyAsync', 'aten::item',
                              'aten::_local_scalar_dense', 'aten::nonzero')]
        for e in syncs:
            print(f'   {e.key:28s} calls/step {e.count / args.profile_steps:6.1f}'
                  f'  self cpu us/step '
                  f'{e.self_cpu_time_total / args.profile_steps:8.1f}')


if __name__ == '__main__':
    main()

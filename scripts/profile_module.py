"""Where a module-level training step (benchmarks/modules.py's pairs) goes:
wall time per step, the GPU's kernel time per step (busy %), and the
heaviest CUDA kernels.

    python scripts/profile_module.py [--graph zinc-like] [--convs gt,gat]
                                     [--dtype fp32,bf16] [--backend ours]

A step well above its kernel time is host-bound (Python, autograd,
launches); one near it says which kernels to look at. ``--cprofile``: the
Python functions of the steps by their own time, heaviest first.
"""
import argparse
import cProfile
import pstats
import sys
from pathlib import Path

import torch
from torch.profiler import ProfilerActivity, profile

ROOT = Path(__file__).resolve().parents[1]
sys.path[:0] = [str(ROOT), str(ROOT / 'benchmarks')]
import modules as mb  # noqa: E402
from graphs import make_graph  # noqa: E402
from kernels import DTYPES  # noqa: E402

STEPS = 10


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument('--graph', default='zinc-like')
    p.add_argument('--convs', default=','.join(mb.CONVS))
    p.add_argument('--dtype', default='fp32')
    p.add_argument('--backend', default='ours', choices=('ours', 'pyg'))
    p.add_argument('--cprofile', action='store_true')
    args = p.parse_args()
    dev = torch.device('cuda')
    edge_index, n = make_graph(args.graph, dev, 0)
    print(f'{args.graph}: {n:,} nodes, {edge_index.size(1):,} edges')
    for conv in args.convs.split(','):
        for dtype_name in args.dtype.split(','):
            dtype = DTYPES[dtype_name]
            ref, ours, note = mb.build_pair(conv, dev, dtype, 0)
            m = ours if args.backend == 'ours' else ref
            x = torch.randn(n, mb.IN_CHANNELS, device=dev).to(dtype)
            x.requires_grad_(True)
            with torch.no_grad():
                grad = torch.randn_like(m(x, edge_index))

            def step():
                return mb._grads(m, x, edge_index, grad)
            for _ in range(5):
                step()
            torch.cuda.synchronize()
            start, end = (torch.cuda.Event(enable_timing=True)
                          for _ in range(2))
            start.record()
            for _ in range(STEPS):
                step()
            end.record()
            torch.cuda.synchronize()
            wall = start.elapsed_time(end) / STEPS
            with profile(activities=[ProfilerActivity.CUDA]) as prof:
                for _ in range(STEPS):
                    step()
                torch.cuda.synchronize()
            events = [e for e in prof.key_averages()
                      if e.device_time_total > 0]
            events.sort(key=lambda e: -e.device_time_total)
            gpu = sum(e.device_time_total for e in events) / STEPS / 1e3
            print(f'=== {mb.describe(conv)} {dtype_name} ({args.backend}): '
                  f'{wall:.3f} ms/step, kernels {gpu:.3f} ms '
                  f'({100 * gpu / wall:.0f}% busy), '
                  f'{sum(e.count for e in events) // STEPS} launches {note}')
            for e in events[:10]:
                print(f'  {e.device_time_total / STEPS / 1e3:7.3f} ms '
                      f'{e.count // STEPS:3d}x {e.key[:100]}')
            if args.cprofile:
                prof = cProfile.Profile()
                prof.enable()
                for _ in range(STEPS):
                    step()
                torch.cuda.synchronize()
                prof.disable()
                print(f'  Python, {STEPS} steps (tottime, cumtime in s):')
                pstats.Stats(prof).sort_stats('tottime').print_stats(14)


if __name__ == '__main__':
    main()

"""Why a compiled training step is slow (GPU): each step of
``train.capture=compile`` timed on its own (synchronized), with the
padded batch's shape and what dynamo / inductor counted during it
(recompiles, graph breaks, CUDA-graph recordings and skips).

Variants: ``dfgnn`` / ``pyg`` (``backend``; device loader, step through
torch.compile with CUDA graphs, as the runner's ``train.capture=compile``)
and ``dfgnn-nocg`` / ``pyg-nocg`` (the same compiled graphs without CUDA
graphs: inductor's default mode). A step that stays slow long after the
last new shape, with a recording or skip counted in it, points at the
CUDA graphs; one slow in both modes points at the compiled code.

    TORCH_LOGS=recompiles,graph_breaks,cudagraphs \\
        python scripts/compile_steps.py [--variants dfgnn,dfgnn-nocg] \\
        [--steps 40] [--size 2000] [--json out.json] [key=value ...]
"""
import argparse
import json
import os
import sys
import time
from collections import Counter

import torch

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path[:0] = [os.path.dirname(HERE), HERE]
from profile_step import training_setup  # noqa: E402


def snapshot():
    """All of dynamo's counters (``counters[group][key]``), flattened."""
    from torch._dynamo.utils import counters
    return Counter({f'{g}.{k}': v for g, c in counters.items()
                    for k, v in c.items() if isinstance(v, (int, float))})


def main():
    p = argparse.ArgumentParser()
    p.add_argument('--cfg', default='configs/pattern-gps.yaml')
    p.add_argument('--size', type=int, default=2000)
    p.add_argument('--steps', type=int, default=40)
    p.add_argument('--variants', default='dfgnn,dfgnn-nocg')
    p.add_argument('--json', default=None)
    p.add_argument('overrides', nargs='*')
    args = p.parse_args()

    from pyg_dfgnn.train.capture import CompiledStep
    from pyg_dfgnn.train.runner import train_step

    dev = torch.device('cuda' if torch.cuda.is_available() else 'cpu')
    # (CPU: traced with aot_eager, no code generation -- a smoke run)
    compiler = 'inductor' if dev.type == 'cuda' else 'aot_eager'

    def sync():
        if dev.type == 'cuda':
            torch.cuda.synchronize()
    bundle, report = None, []
    for name in args.variants.split(','):
        backend, _, mode = name.partition('-')
        cfg, bundle, model, opt, loader, stats, _ = training_setup(
            args.cfg, args.size, [f'backend={backend}', 'train.loader=device',
                                  'train.capture=compile'] + args.overrides,
            bundle, dev)
        run = CompiledStep(lambda b: train_step(model, opt, b, cfg, stats),
                           dev, static=(stats.sums, ), backend=compiler,
                           cuda_graphs=mode != 'nocg')
        print(f'\n== {name}: step, ms, padded nodes / edges, counters that '
              f'moved', flush=True)
        steps, done, shapes = [], 0, set()
        while done < args.steps:
            for batch in loader:
                if done == args.steps:
                    break
                shape = (batch.num_nodes, batch.edge_index.size(1))
                before = snapshot()
                sync()
                t0 = time.perf_counter()
                run(batch)
                sync()
                ms = (time.perf_counter() - t0) * 1e3
                moved = dict(snapshot() - before)
                new = shape not in shapes
                shapes.add(shape)
                steps.append({'step': done, 'ms': ms, 'nodes': shape[0],
                              'edges': shape[1], 'new_shape': new,
                              'counters': moved})
                print(f'{done:4d} {ms:9.1f} {shape[0]:7d} {shape[1]:8d}'
                      f"{' new' if new else '    '} "
                      + ' '.join(f"{k.splitlines()[0][:60]}+{v}"
                                 for k, v in sorted(moved.items())),
                      flush=True)
                done += 1
        late = [s['ms'] for s in steps[len(steps) // 2:]]
        late.sort()
        median = late[len(late) // 2] if late else float('nan')
        report.append({'variant': name, 'shapes': len(shapes),
                       'median_ms_second_half': median, 'steps': steps})
        print(f'{name}: {len(shapes)} shapes, median step of the second '
              f'half {median:.1f} ms', flush=True)
        del model, opt, loader, run
        torch.cuda.empty_cache()
    print(f"\n{'variant':14s} {'shapes':>6s} {'ms/step (2nd half)':>19s}")
    for r in report:
        print(f"{r['variant']:14s} {r['shapes']:6d} "
              f"{r['median_ms_second_half']:19.1f}")
    if args.json:
        with open(args.json, 'w') as f:
            json.dump(report, f, indent=2)


if __name__ == '__main__':
    main()

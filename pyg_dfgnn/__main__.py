"""Command line: ``python -m pyg_dfgnn`` (or the ``pyg-dfgnn`` script).

    python -m pyg_dfgnn train --cfg configs/pattern-gps.yaml [key=value ...] \
        [--resume]
    python -m pyg_dfgnn bench-e2e --cfg configs/pattern-gps.yaml --epochs 5 \
        [key=value ...] [--out benchmarks/results] \
        [--variants pyg,pyg-runner,dfgnn,pyg-runner-compile,dfgnn-compile]
    python -m pyg_dfgnn show-config --cfg configs/demo.yaml [key=value ...]

Overrides use the config's dotted keys, values parsed as YAML, e.g.
``gt.layers=3 optim.base_lr=5e-4 backend=pyg dataset.size=500``.
"""
from __future__ import annotations

import argparse
import sys
from typing import List, Optional


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog='pyg-dfgnn', description='GraphGPS-style training with DF-GNN '
        'fused attention convs.')
    sub = parser.add_subparsers(dest='command', required=True)

    def common(p: argparse.ArgumentParser) -> None:
        p.add_argument('--cfg', required=True, help='YAML config file')
        p.add_argument('opts', nargs='*', metavar='key=value',
                       help='config overrides, e.g. gt.layers=3')

    p = sub.add_parser('train', help='train a model from a config')
    common(p)
    p.add_argument('--resume', action='store_true',
                   help='continue from the run folder\'s last checkpoint')
    p = sub.add_parser('bench-e2e', help='train backend pyg and dfgnn on the '
                       'same data, compare epoch time and accuracy')
    common(p)
    p.add_argument('--epochs', type=int, required=True)
    p.add_argument('--out', default='benchmarks/results',
                   help='folder of the JSON result')
    from pyg_dfgnn.train.bench import DEFAULT_VARIANTS, VARIANTS
    p.add_argument('--variants', default=None,
                   help=f"comma-separated, out of {', '.join(VARIANTS)} "
                   f"(default: {','.join(DEFAULT_VARIANTS)})")
    p = sub.add_parser('show-config', help='print the full config')
    common(p)
    return parser


def main(argv: Optional[List[str]] = None) -> int:
    from pyg_dfgnn.datasets.sbm import DatasetError
    from pyg_dfgnn.train.config import ConfigError, dump_config, load_config

    args = _parser().parse_args(argv)
    try:
        if args.command == 'bench-e2e':
            if args.epochs < 1:
                raise ConfigError(f'--epochs must be >= 1, got {args.epochs}')
            from pyg_dfgnn.train.bench import bench_e2e, parse_variants
            bench_e2e(args.cfg, args.epochs, args.opts, out_dir=args.out,
                      variants=parse_variants(args.variants))
            return 0
        cfg = load_config(args.cfg, args.opts)
        if args.command == 'show-config':
            print(dump_config(cfg), end='')
            return 0
        from pyg_dfgnn.train.runner import CheckpointError, train
        try:
            train(cfg, resume=args.resume)
        except CheckpointError as e:
            print(f'pyg-dfgnn: error: {e}', file=sys.stderr)
            return 2
        finally:  # torchrun: leave the process group
            from pyg_dfgnn.train import distributed
            distributed.shutdown()
        return 0
    except (ConfigError, OSError, DatasetError) as e:  # (unusable paths)
        print(f'pyg-dfgnn: error: {e}', file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        print('pyg-dfgnn: interrupted (resume with --resume)',
              file=sys.stderr)
        return 130


if __name__ == '__main__':
    sys.exit(main())

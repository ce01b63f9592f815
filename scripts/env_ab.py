"""A/B of kernel variants that environment variables select (another
library through PYG_DFGNN_LIBRARY, or a knob such as PYG_DFGNN_SHORT_ROWS):
`scripts/kernel_times.py` once per variant (a fresh process each, rounds
interleaved), then per case the GPU time of the backward's rows / cols
passes and of everything, per variant (the JSON: also the forward and the
rest).

    python scripts/env_ab.py 'old:PYG_DFGNN_LIBRARY=/tmp/old.so' 'new:' \
        --cases pattern-like:1x128:bf16:gatv2,... [--rounds 2] [--json out.json]
"""
import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


FORWARD = ('smmf_fwd_kernel', 'rows_fwd_kernel', 'pmf_', 'tc_fwd_kernel')


def part_of(kernel: str) -> str:
    """'rows' / 'cols' for the backward's passes (block or short-owner
    kernels), 'fwd' for the forward's, 'other' for the rest."""
    if 'bwd::bwd_kernel<' in kernel:  # <T, I, KIND, VEC, COLS, ...>
        cols = kernel.split('(', 1)[0].split('<', 1)[1].split(', ')[4]
        return 'cols' if cols == 'true' else 'rows'
    if 'short_rows_bwd_kernel' in kernel:
        return 'rows'
    if 'short_cols_bwd_kernel' in kernel:
        return 'cols'
    if any(f in kernel for f in FORWARD):
        return 'fwd'
    return 'other'


def pass_times(row: dict) -> dict:
    """A `kernel_times.py` row's milliseconds per part (part_of)."""
    parts = {'fwd': 0.0, 'rows': 0.0, 'cols': 0.0, 'other': 0.0}
    for kernel, ms in row['kernels'].items():
        parts[part_of(kernel)] += ms
    return parts


def main():
    p = argparse.ArgumentParser()
    p.add_argument('variants', nargs='+', help='name:VAR=VALUE;VAR=VALUE')
    p.add_argument('--cases', required=True)
    p.add_argument('--rounds', type=int, default=1)
    p.add_argument('--json', default=None)
    args = p.parse_args()
    variants = []
    for spec in args.variants:
        name, _, env = spec.partition(':')
        variants.append((name, dict(kv.split('=', 1)
                                    for kv in env.split(';') if kv)))
    # times[variant][case][part] -> list over rounds
    times = {name: {} for name, _ in variants}
    for _ in range(args.rounds):
        for name, env in variants:
            with tempfile.NamedTemporaryFile(suffix='.json') as fh:
                subprocess.run([sys.executable, 'scripts/kernel_times.py',
                                args.cases, '--json', fh.name], cwd=ROOT,
                               env={**os.environ, **env}, check=True,
                               stdout=subprocess.DEVNULL)
                for row in json.load(open(fh.name)):
                    parts = pass_times(row)
                    parts['all'] = row['ms']
                    slot = times[name].setdefault(row['case'], {})
                    for k, v in parts.items():
                        slot.setdefault(k, []).append(v)
    med = {n: {c: {k: statistics.median(v) for k, v in parts.items()}
               for c, parts in cases.items()} for n, cases in times.items()}
    names = [n for n, _ in variants]
    # other: what is neither forward nor a pass (the TC backward)
    print(f"{'case':30s} " + ' '.join(
        f'{n + " fwd/rows/cols/other/all":>38s}' for n in names))
    for case in med[names[0]]:
        cells = []
        for n in names:
            t = med[n][case]
            cells.append(f"{t['fwd']:6.3f} {t['rows']:6.3f} {t['cols']:6.3f} "
                         f"{t['other']:6.3f} {t['all']:7.3f}  ")
        print(f'{case:30s} ' + ' '.join(f'{c:>38s}' for c in cells))
    if args.json:
        with open(args.json, 'w') as fh:
            json.dump({'variants': dict(variants), 'median_ms': med}, fh,
                      indent=1)


if __name__ == '__main__':
    main()

"""Per-pass table of two saved `scripts/kernel_times.py` runs (JSON), case by
case: forward, rows pass and cols pass in microseconds, and B / A per pass
and overall (> 1: A is faster).

    python scripts/compare_kernel_times.py A.json B.json
"""
import argparse
import json
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from env_ab import part_of  # noqa: E402

FORWARD = ('smmf_fwd_kernel', 'rows_fwd_kernel', 'pmf_', 'tc_fwd_kernel')


def passes(row: dict) -> dict:
    out = {}
    for kernel, ms in row['kernels'].items():
        part = part_of(kernel)
        if part == 'other' and any(f in kernel for f in FORWARD):
            part = 'fwd'
        out[part] = out.get(part, 0.0) + ms * 1e3
    return out


def main():
    p = argparse.ArgumentParser()
    p.add_argument('a')
    p.add_argument('b')
    args = p.parse_args()
    runs = []
    for path in (args.a, args.b):
        with open(path) as fh:
            runs.append({r['case']: r for r in json.load(fh)})
    a, b = runs
    print(f"{'case':34s} {'A fwd / rows / cols us':>24s} "
          f"{'B fwd / rows / cols us':>24s}   B/A fwd  rows  cols   all")
    for case in a:
        if case not in b:
            continue
        x, y = passes(a[case]), passes(b[case])

        def ratio(k):
            return y.get(k, 0.0) / x[k] if x.get(k) else float('nan')
        cells = ' '.join(f'{ratio(k):5.2f}' for k in ('fwd', 'rows', 'cols'))
        print(f"{case:34s} "
              + ''.join(f'{x.get(k, 0.0):8.1f}' for k in ('fwd', 'rows', 'cols'))
              + ' ' + ''.join(f'{y.get(k, 0.0):8.1f}'
                              for k in ('fwd', 'rows', 'cols'))
              + f'   {cells} {b[case]["ms"] / a[case]["ms"]:5.2f}'
              + (f"  (other {x['other']:.1f} / {y.get('other', 0.0):.1f})"
                 if 'other' in x else ''))


if __name__ == '__main__':
    main()

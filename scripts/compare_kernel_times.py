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
from env_ab import pass_times  # noqa: E402


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
        x, y = (pass_times(r[case]) for r in (a, b))

        def ratio(k):
            return y[k] / x[k] if x[k] else float('nan')
        cells = ' '.join(f'{ratio(k):5.2f}' for k in ('fwd', 'rows', 'cols'))
        print(f"{case:34s} "
              + ''.join(f'{x[k] * 1e3:8.1f}' for k in ('fwd', 'rows', 'cols'))
              + ' ' + ''.join(f'{y[k] * 1e3:8.1f}'
                              for k in ('fwd', 'rows', 'cols'))
              + f'   {cells} {b[case]["ms"] / a[case]["ms"]:5.2f}'
              + (f"  (other {x['other'] * 1e3:.1f} / {y['other'] * 1e3:.1f})"
                 if x['other'] else ''))


if __name__ == '__main__':
    main()

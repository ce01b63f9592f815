"""Table of the accuracy runs under a state folder of
``scripts/accuracy-check.sh``: per run the epochs done, the test metric of
the last epoch and of the best validation epoch, and the difference to the
``dfgnn`` (else ``dfgnn-layers``) run of the same config (issue 10's gate:
within 0.5 points after the same epochs; the published GraphGPS PATTERN /
CLUSTER figures beside the 100-epoch run).

    python scripts/accuracy_table.py accuracy-state [--out accuracy.json]
"""
import argparse
import glob
import json
import os.path as osp

#: GraphGPS (Rampasek et al. 2022), test accuracy, mean +- std.
PUBLISHED = {'pattern': (86.685, 0.059), 'cluster': (78.016, 0.180)}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split('\n\n')[0])
    parser.add_argument('state')
    parser.add_argument('--out', default=None)
    args = parser.parse_args()
    rows = []
    for path in sorted(glob.glob(osp.join(args.state, '*', '*', '*', '*',
                                          'results.json'))):
        rel = osp.relpath(path, args.state).split(osp.sep)
        r = json.load(open(path))
        final, best = r.get('final') or {}, r.get('best') or {}
        rows.append({
            'config': rel[0], 'run': rel[1], 'epochs': r['epochs_done'],
            'max_epoch': r['config']['optim']['max_epoch'],
            'metric': r['metric'],
            'test_last': final.get('test_metric'),
            'test_at_best_val': best.get('test_metric'),
            'best_epoch': best.get('epoch'),
        })
    # the dfgnn run of the same config and epochs (dfgnn-layers without one)
    ref = {(x['config'], x['epochs']): x for x in rows
           if x['run'] == 'dfgnn-layers'}
    ref.update({(x['config'], x['epochs']): x for x in rows
                if x['run'] == 'dfgnn'})
    print(f"{'config':<14} {'run':<16} {'epochs':>9} {'test last':>10} "
          f"{'test@best':>10} {'d vs dfgnn':>11}  published")
    for x in rows:
        base = ref.get((x['config'], x['epochs']))
        d = None
        if base is not None and x['test_last'] is not None:
            d = 100 * (x['test_last'] - base['test_last'])
        x['points_vs_dfgnn'] = d
        pub = next((f'{m:.3f} +- {s:.3f}' for k, (m, s) in PUBLISHED.items()
                    if k in x['config'] and x['max_epoch'] >= 100), '')

        def pct(v):
            return f'{100 * v:10.3f}' if v is not None else f"{'-':>10}"

        print(f"{x['config']:<14} {x['run']:<16} "
              f"{x['epochs']:>4}/{x['max_epoch']:<4} {pct(x['test_last'])} "
              f"{pct(x['test_at_best_val'])} "
              f"{'' if d is None else f'{d:+.2f}':>11}  {pub}")
    if args.out:
        with open(args.out, 'w') as f:
            json.dump(rows, f, indent=2)


if __name__ == '__main__':
    main()

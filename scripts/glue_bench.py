"""The convs' glue around the fused op, form by form: a bias gradient (the
column sum of an [N, C] gradient) and the backward of several Linear layers
of one input (TransformerConv's query / key / value / skip).

    python scripts/glue_bench.py [--nodes 121856] [--json out.json]

Prints one table (median ms per form, CUDA events); the forms of a row give
the same values (checked against the first, fp32 1e-5 / half 1e-2).
"""
import argparse
import json
import sys

import torch
import torch.nn.functional as F


def timed(fn, reps=30):
    for _ in range(3):
        fn()
    torch.cuda.synchronize()
    times = []
    for _ in range(reps):
        a, b = (torch.cuda.Event(enable_timing=True) for _ in range(2))
        a.record()
        fn()
        b.record()
        b.synchronize()
        times.append(a.elapsed_time(b))
    times.sort()
    return times[len(times) // 2]


def rel(a, b):
    return ((a.float() - b.float()).norm() / b.float().norm().clamp_min(1e-30)).item()


def bias_forms(n, c, dtype, dev):
    g = torch.randn(n, c, device=dev, dtype=dtype)
    ones = torch.ones(n, device=dev, dtype=dtype)
    ones_row = ones.view(1, n)
    forms = {
        'sum(0)': lambda: g.sum(0),
        'mv(g.t, 1)': lambda: torch.mv(g.t(), ones),
        '1 @ g': lambda: (ones_row @ g).view(c),
        'view(64,-1,c).sum': lambda: g[: n - n % 64].view(64, -1, c).sum(1).sum(0)
        + g[n - n % 64:].sum(0),
    }
    return forms


def linear_stack(n, c, k, dtype, dev):
    """k Linear(c, c) of one x: autograd's backward vs a hand-written one."""
    x = torch.randn(n, c, device=dev, dtype=dtype, requires_grad=True)
    ws = [torch.randn(c, c, device=dev, dtype=dtype, requires_grad=True)
          for _ in range(k)]
    bs = [torch.randn(c, device=dev, dtype=dtype, requires_grad=True)
          for _ in range(k)]
    dys = [torch.randn(n, c, device=dev, dtype=dtype) for _ in range(k)]
    ones = torch.ones(n, device=dev, dtype=dtype)

    def autograd():
        outs = [F.linear(x, w, b) for w, b in zip(ws, bs)]
        grads = torch.autograd.grad(outs, [x] + ws + bs, dys)
        return grads

    def by_hand(bias):
        def run():
            with torch.no_grad():
                for w, b in zip(ws, bs):  # the forward's cost
                    F.linear(x, w, b)
                dx = torch.mm(dys[0], ws[0])
                for dy, w in zip(dys[1:], ws[1:]):
                    dx.addmm_(dy, w)
                dw = [torch.mm(dy.t(), x) for dy in dys]
                db = [bias(dy) for dy in dys]
            return [dx] + dw + db
        return run

    return {
        'autograd': autograd,
        'addmm_ + sum(0)': by_hand(lambda g: g.sum(0)),
        'addmm_ + mv': by_hand(lambda g: torch.mv(g.t(), ones)),
    }


def main():
    p = argparse.ArgumentParser()
    p.add_argument('--nodes', type=int, default=121856)
    p.add_argument('--json', default=None)
    args = p.parse_args()
    dev = torch.device('cuda')
    rows = []
    for dtype in (torch.float32, torch.bfloat16):
        tol = 1e-5 if dtype == torch.float32 else 1e-2
        cases = [(f'bias grad [N, {c}]', bias_forms(args.nodes, c, dtype, dev))
                 for c in (16, 128, 512)]
        cases.append(('4 x Linear(128, 128) fwd+bwd',
                      linear_stack(args.nodes, 128, 4, dtype, dev)))
        for name, forms in cases:
            ref = None
            for form, fn in forms.items():
                out = fn()
                out = out if isinstance(out, (list, tuple)) else [out]
                err = 0.0 if ref is None else max(
                    rel(a, b) for a, b in zip(out, ref))
                ref = ref or out
                ms = timed(fn)
                rows.append(dict(case=name, dtype=str(dtype)[6:], form=form,
                                 ms=ms, err=err, ok=err <= tol))
                print(f'{name:32s} {str(dtype)[6:]:9s} {form:22s} '
                      f'{ms:8.4f} ms  err {err:.1e}', flush=True)
    if args.json:
        with open(args.json, 'w') as f:
            json.dump(dict(nodes=args.nodes, rows=rows), f, indent=1)
    bad = [r for r in rows if not r['ok']]
    sys.exit(1 if bad else 0)


if __name__ == '__main__':
    main()

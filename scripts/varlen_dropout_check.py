"""Is the gradient of the global attention consistent with its dropout mask?
(GPU; pattern-gps trained with the varlen kernel and attention dropout 0.5
degraded from epoch 5 on while the padded twin did not.)

For each path (varlen segments through PyTorch's memory-efficient kernel,
GraphGPS's padded nn.MultiheadAttention) and dropout p: f(x) = <out(x), g>
with the RNG reseeded before every forward (so the mask is fixed), the
autograd directional derivative <grad f, d> against the central difference
(f(x + e d) - f(x - e d)) / 2e. A mask the backward regenerates differently
shows as a large relative error at p > 0 only.

Result (H100, torch 2.11+cu130, 2026-11-23): varlen at p = 0.5 gives 2.217
by autograd against -4.445 by differences (BAD); varlen at p = 0 and the
padded path at both p agree to <= 2e-4. So `gt.attn_impl: auto` trains with
the padded path wherever attention dropout is in effect.

    python scripts/varlen_dropout_check.py
"""
import os
import sys

import torch

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def main() -> int:
    from pyg_dfgnn.train.model import varlen_attention
    dev = torch.device('cuda')
    torch.manual_seed(0)
    dim, heads = 64, 4
    attn = torch.nn.MultiheadAttention(dim, heads, batch_first=True,
                                       device=dev)
    bounds = torch.tensor([0, 50, 120, 121, 300], device=dev)
    max_len = 179
    n = int(bounds[-1])
    x = torch.randn(n, dim, device=dev)
    g = torch.randn(n, dim, device=dev)
    d = torch.randn(n, dim, device=dev)

    def varlen(x, p):
        attn.dropout = p
        return varlen_attention(attn, x, bounds, max_len, True)

    def padded(x, p):
        attn.dropout = p
        attn.train()
        parts = []
        dense = x.new_zeros(4, max_len, dim)
        real = torch.zeros(4, max_len, dtype=torch.bool, device=dev)
        for i in range(4):
            lo, hi = int(bounds[i]), int(bounds[i + 1])
            dense[i, :hi - lo] = x[lo:hi]
            real[i, :hi - lo] = True
        real[:, 0] = True
        h = attn(dense, dense, dense, key_padding_mask=~real,
                 need_weights=False)[0]
        for i in range(4):
            lo, hi = int(bounds[i]), int(bounds[i + 1])
            parts.append(h[i, :hi - lo])
        return torch.cat(parts)

    bad = 0
    print(f"{'path':8s} {'p':>4s} {'autograd':>12s} {'numeric':>12s} "
          f"{'rel err':>9s}")
    for name, fn in (('varlen', varlen), ('padded', padded)):
        for p in (0.0, 0.5):
            def f(x):
                torch.manual_seed(1234)
                return (fn(x, p) * g).sum()
            xr = x.clone().requires_grad_()
            grad, = torch.autograd.grad(f(xr), xr)
            auto = float((grad * d).sum())
            with torch.no_grad():
                e = 1e-2
                num = float((f(x + e * d) - f(x - e * d)) / (2 * e))
            # the same mask twice: a forward is deterministic per seed
            with torch.no_grad():
                same = float(f(x)) == float(f(x))
            err = abs(auto - num) / max(abs(num), 1e-6)
            flag = '' if err < 2e-2 and same else '  <-- BAD'
            bad += bool(flag)
            print(f'{name:8s} {p:4.1f} {auto:12.5f} {num:12.5f} {err:9.2e}'
                  f'{"" if same else " (forward not deterministic)"}{flag}')
    return 1 if bad else 0


if __name__ == '__main__':
    sys.exit(main())

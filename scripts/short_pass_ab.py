"""A/B of the short-owner passes of several kernel trees, each built alone
by scripts/short-pass-ab.sh: the forward (rows_fwd_kernel) and the
backward's rows / cols passes, 'dot', no training features, on the graphs
kernel_times.py names (benchmarks/graphs.py's, batch-A-D, uniform-N-D);
per case and pass the outputs bit for bit against the first variant
(poisoned first), then the GPU time of one launch (CUDA events, median of
interleaved rounds). A variant is `LIB.so[:GRID]`: GRID 0 one group a block
(the kernel without the walk), -1 the walk on the resident blocks, k > 0 at
most k blocks. The vectors a lane (NV) are the library's rule
(short_rows.cuh's short_slices) for the case, or --nv's where the head's
features divide (the forward in half precision: 1 or 2).

    python scripts/short_pass_ab.py .devlib/main.so:0 .devlib/new.so:0 \
        .devlib/new.so:-1 [--cases cluster-like:4x32:fp32,...] \
        [--passes fwd,rows,cols] [--nv 1|2|4] [--rounds 5] [--iters 30]
        [--json out.json]
"""
import argparse
import ctypes
import json
import os
import statistics
import sys

import torch

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path[:0] = [os.path.dirname(HERE), HERE]
from kernel_times import make_graph_of  # noqa: E402

CASES = ('cluster-like:4x32:fp32,cluster-like:1x128:fp32,mnist-like:4x32:fp32,'
         'mnist-like:1x128:fp32,zinc-like:4x32:bf16,zinc-like:1x128:fp32,'
         'arxiv-like:1x128:fp32,arxiv-like:1x128:bf16')
PASSES = {'rows': 0, 'cols': 1, 'fwd': 2}


class Ptrs(ctypes.Structure):
    """short_pass_harness.cu's Ptrs."""
    _fields_ = [(n, ctypes.c_void_p) for n in (
        'ptr', 'idx', 'perm', 'own_a', 'own_b', 'nbr_a', 'nbr_b', 'lse',
        'drow', 'ebuf', 'grad_a', 'grad_b')] + [
        ('n_owner', ctypes.c_int64), ('H', ctypes.c_int), ('F', ctypes.c_int),
        ('scale', ctypes.c_float)]


def short_lanes(hf: int, width: int) -> int:
    lanes = 1
    while lanes * width < hf:
        lanes <<= 1
    return lanes


def short_slices(n: int, heads: int, f: int, vw: int, pass_: str) -> int:
    """short_rows.cuh's short_slices for 'dot'."""
    def widest(nv, min_lanes):
        while nv > 1 and (f % (vw * nv) or f // (vw * nv) < min_lanes or
                          n * short_lanes(heads * f, vw * nv) < 4096 * 32):
            nv //= 2
        return nv
    if pass_ == 'fwd':
        return widest(16 // vw, 4)
    if pass_ == 'rows':
        return 4 if widest(4, 4) == 4 else 1
    return 1 if vw > 4 else widest(4, 4)


class Case:
    """A graph's CSR / CSC and seeded features of one case."""

    def __init__(self, case: str, dev):
        name, shape, dt = case.split(':')
        self.heads, self.f = (int(x) for x in shape.split('x'))
        self.bf16 = dt == 'bf16'
        dtype = torch.bfloat16 if self.bf16 else torch.float32
        _, ei, n = make_graph_of(name, dev)  # (kernel_times.py's names)
        src, dst = ei[0], ei[1]
        self.n, self.E = n, src.numel()
        self.rowptr = torch.zeros(n + 1, dtype=torch.long, device=dev)
        self.rowptr[1:] = torch.bincount(dst, minlength=n).cumsum(0)
        self.col = src.int().contiguous()
        perm = torch.argsort(src, stable=True)
        self.perm = perm.int().contiguous()
        self.csc_row = dst[perm].int().contiguous()
        self.colptr = torch.zeros(n + 1, dtype=torch.long, device=dev)
        self.colptr[1:] = torch.bincount(src, minlength=n).cumsum(0)
        gen = torch.Generator(device=dev).manual_seed(0)
        shape3 = (n, self.heads, self.f)
        self.q, self.k, self.v, self.do = (
            torch.randn(*shape3, device=dev, generator=gen).to(dtype)
            for _ in range(4))
        self.scale = self.f ** -0.5
        s = (self.q[dst].float() * self.k[src].float()).sum(-1) * self.scale
        idx = dst[:, None].expand(-1, self.heads)
        m = torch.full((n, self.heads), -1e30, device=dev).scatter_reduce(
            0, idx, s, 'amax')
        z = torch.zeros(n, self.heads, device=dev).index_add_(
            0, dst, (s - m[dst]).exp())
        self.lse = (m + z.log()).contiguous()
        self.dtype, self.dev = dtype, dev

    def outputs(self) -> dict:
        """Poisoned output buffers of one run."""
        nan = float('nan')
        hf = (self.n, self.heads, self.f)
        return dict(
            drow=torch.full((self.n, self.heads), nan, device=self.dev),
            ebuf=torch.full((self.E, self.heads, 2), nan, device=self.dev),
            ga=torch.full(hf, nan, device=self.dev).to(self.dtype),
            gb=torch.full(hf, nan, device=self.dev).to(self.dtype))

    def ptrs(self, pass_: str, out: dict, rows_out: dict = None) -> Ptrs:
        p = Ptrs()
        cols = pass_ == 'cols'
        p.ptr = (self.colptr if cols else self.rowptr).data_ptr()
        p.idx = (self.csc_row if cols else self.col).data_ptr()
        p.perm = self.perm.data_ptr() if cols else 0
        p.own_a = (self.k if cols else self.q).data_ptr()
        p.own_b = self.do.data_ptr()
        p.nbr_a = (self.q if cols else self.k).data_ptr()
        p.nbr_b = (self.do if cols else self.v).data_ptr()
        p.lse = self.lse.data_ptr()
        src = rows_out if cols else out  # cols reads the rows pass's
        p.drow, p.ebuf = src['drow'].data_ptr(), src['ebuf'].data_ptr()
        p.grad_a, p.grad_b = out['ga'].data_ptr(), out['gb'].data_ptr()
        p.n_owner, p.H, p.F, p.scale = self.n, self.heads, self.f, self.scale
        return p


KEYS = {'fwd': ('ga', 'drow'), 'rows': ('ga', 'drow', 'ebuf'),
        'cols': ('ga', 'gb')}


def bits(t: torch.Tensor) -> torch.Tensor:
    return t.view(torch.int32 if t.dtype == torch.float32 else torch.int16)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument('variants', nargs='+', help='LIB.so[:GRID]')
    ap.add_argument('--cases', default=CASES)
    ap.add_argument('--passes', default='fwd,rows,cols')
    ap.add_argument('--nv', type=int, choices=(1, 2, 4), default=None)
    ap.add_argument('--rounds', type=int, default=5)
    ap.add_argument('--iters', type=int, default=30)
    ap.add_argument('--json', default=None)
    args = ap.parse_args()
    variants = []
    for spec in args.variants:
        path, _, grid = spec.rpartition(':') if ':' in spec else (spec, '',
                                                                   '0')
        variants.append((os.path.basename(spec),
                         ctypes.CDLL(os.path.abspath(path)), int(grid)))
    dev = torch.device('cuda')
    ms = ctypes.c_float()

    def launch(lib, pass_, case, nv, p, grid, iters):
        rc = lib.launch(PASSES[pass_], int(case.bf16), nv, ctypes.byref(p),
                        grid, iters, ctypes.byref(ms))
        torch.cuda.synchronize()
        if rc != 0:
            raise RuntimeError(f'CUDA error {rc}')
        return ms.value * 1e3

    results = []
    for spec in args.cases.split(','):
        case = Case(spec, dev)
        vw = 8 if case.bf16 else 4
        rows_out = None
        for pass_ in args.passes.split(','):
            nv = short_slices(case.n, case.heads, case.f, vw, pass_)
            if args.nv is not None:
                nv = args.nv
                while nv > 1 and (case.f % (vw * nv) or (
                        pass_ == 'fwd' and vw * nv > 16)):
                    nv //= 2
            if pass_ == 'cols' and rows_out is None:  # the rows pass's ebuf
                rows_out = case.outputs()
                launch(variants[0][1], 'rows', case,
                       short_slices(case.n, case.heads, case.f, vw, 'rows'),
                       case.ptrs('rows', rows_out), 0, 0)
            outs = {}
            for name, lib, grid in variants:
                outs[name] = case.outputs()
                launch(lib, pass_, case, nv,
                       case.ptrs(pass_, outs[name], rows_out), grid, 0)
            if pass_ == 'rows':
                rows_out = outs[variants[0][0]]
            ref = outs[variants[0][0]]
            same = {name: all(torch.equal(bits(o[k]), bits(ref[k]))
                              for k in KEYS[pass_])
                    for name, o in outs.items()}
            times = {name: [] for name, _, _ in variants}
            for _ in range(args.rounds):
                for name, lib, grid in variants:
                    times[name].append(launch(
                        lib, pass_, case, nv,
                        case.ptrs(pass_, outs[name], rows_out), grid,
                        args.iters))
            us = {name: statistics.median(t) for name, t in times.items()}
            results.append(dict(case=spec, pass_=pass_, nv=nv, us=us,
                                same=same))
            base = us[variants[0][0]]
            print(f'{spec:24s} {pass_:4s} nv{nv} ' + '  '.join(
                f'{name}={t:7.1f}us({t / base:5.3f})'
                f'{"" if same[name] else " DIFF"}'
                for name, t in us.items()), flush=True)
    if args.json:
        with open(args.json, 'w') as f:
            json.dump(dict(device=torch.cuda.get_device_name(),
                           results=results), f, indent=1)


if __name__ == '__main__':
    main()

"""Same-process A/B of the convs' glue around the fused op:
TransformerConv's / GATv2Conv's projections (pyg_dfgnn/nn/conv/
linear_ops.py): 'autograd' (the layers' own backward nodes), 'node' (one
hand-written backward node on every graph) and 'rule' (the node from
``LINEARS_MIN_EDGES`` edges, as shipped); GAT's node terms and the convs'
output bias: 'glue-old' (two node-score GEMMs, ``out + bias``),
'glue-scores' (both node terms by one GEMM, ``node_score_pair``) and
'glue-new' (that and ``add_bias``'s GEMV gradient) on every graph, and
'glue-rule' (those from ``GPU_BOUND_EDGE_BYTES``, as shipped), each with
the shipped projections' rule.

Small-graph steps are host-bound and move +-30% between calls, so the
variants run interleaved in one process, several rounds, and the table
gives each one's median of: wall per step (CUDA events over a burst), host
time to enqueue a step (no sync inside), GPU kernel time (profiler).

    python scripts/ab_glue.py [--graphs zinc-like,pattern-like]
        [--convs gt,gatv2] [--dtype fp32,bf16] [--json out.json]
"""
import argparse
import json
import statistics
import sys
import time
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parents[1]
sys.path[:0] = [str(ROOT), str(ROOT / 'benchmarks')]
import modules as mb  # noqa: E402
from graphs import make_graph  # noqa: E402
from kernels import DTYPES  # noqa: E402

import pyg_dfgnn.nn.conv.gat_conv as gat_conv  # noqa: E402
import pyg_dfgnn.nn.conv.gatv2_conv as gatv2_conv  # noqa: E402
import pyg_dfgnn.nn.conv.linear_ops as lo  # noqa: E402
from pyg_dfgnn.nn.conv.node_ops import node_scores  # noqa: E402

SHIPPED = lo.LINEARS_MIN_EDGES
BOUND = {'autograd': 1 << 62, 'node': 0}


def _two_scores(x, att_src, att_dst, degree, gpu_bound):
    return node_scores(x, att_src, degree), node_scores(x, att_dst, degree)


def _plain_bias(out, bias, gpu_bound):
    return out if bias is None else out + bias


def _always(x, num_edges):
    return x.is_cuda


# (GAT's node-score pair, GAT's bias, GATv2's bias, the convs' gpu_bound)
GLUE_SHIPPED = (gat_conv.node_score_pair, gat_conv.add_bias,
                gatv2_conv.add_bias, gat_conv.gpu_bound)
GLUE = {'glue-old': (_two_scores, _plain_bias, _plain_bias, _always),
        'glue-scores': (gat_conv.node_score_pair, _plain_bias, _plain_bias,
                        _always),
        'glue-new': GLUE_SHIPPED[:3] + (_always,)}


def use(variant):
    lo.LINEARS_MIN_EDGES = BOUND.get(variant, SHIPPED)
    (gat_conv.node_score_pair, gat_conv.add_bias, gatv2_conv.add_bias,
     gat_conv.gpu_bound) = GLUE.get(variant, GLUE_SHIPPED)
    gatv2_conv.gpu_bound = gat_conv.gpu_bound


def measure(step, bursts=5, burst=10):
    walls, hosts = [], []
    for _ in range(bursts):
        torch.cuda.synchronize()
        a, b = (torch.cuda.Event(enable_timing=True) for _ in range(2))
        a.record()
        for _ in range(burst):
            t = time.perf_counter()
            step()
            hosts.append(time.perf_counter() - t)
        b.record()
        b.synchronize()
        walls.append(a.elapsed_time(b) / burst)
    return statistics.median(walls), 1e3 * statistics.median(hosts)


def gpu_time(step, steps=5):
    from torch.profiler import ProfilerActivity, profile
    with profile(activities=[ProfilerActivity.CUDA]) as prof:
        for _ in range(steps):
            step()
        torch.cuda.synchronize()
    return sum(e.device_time_total for e in prof.key_averages()
               if e.device_time_total > 0) / steps / 1e3


def main():
    p = argparse.ArgumentParser()
    p.add_argument('--graphs', default='zinc-like,mnist-like,pattern-like')
    p.add_argument('--convs', default='gt,gatv2')
    p.add_argument('--dtype', default='fp32,bf16')
    p.add_argument('--variants', default='autograd,node,rule')
    p.add_argument('--rounds', type=int, default=3)
    p.add_argument('--no-gpu', action='store_true',
                   help='skip the profiler run (wall and host only)')
    p.add_argument('--json', default=None)
    args = p.parse_args()
    dev = torch.device('cuda')
    variants = args.variants.split(',')
    rows = []
    for graph in args.graphs.split(','):
        edge_index, n = make_graph(graph, dev, 0)
        for conv in args.convs.split(','):
            for dname in args.dtype.split(','):
                dtype = DTYPES[dname]
                ref, ours, _ = mb.build_pair(conv, dev, dtype, 0)
                x = torch.randn(n, mb.IN_CHANNELS, device=dev).to(dtype)
                x.requires_grad_(True)
                grad = torch.randn(n, ours(x, edge_index).size(-1),
                                   device=dev).to(dtype)

                def step():
                    ours.zero_grad(set_to_none=True)
                    x.grad = None
                    ours(x, edge_index).backward(grad)
                res = {v: dict(wall=[], host=[], gpu=[]) for v in variants}
                grads = {}
                for r in range(args.rounds):
                    # each round in another order: no variant always runs
                    # first or after the profiler
                    for v in variants[r % len(variants):] + \
                            variants[:r % len(variants)]:
                        use(v)
                        for _ in range(3):
                            step()
                        if r == 0:
                            grads[v] = [x.grad.clone()] + [
                                p.grad.clone() for p in ours.parameters()]
                        wall, host = measure(step)
                        res[v]['wall'].append(wall)
                        res[v]['host'].append(host)
                        res[v]['gpu'].append(
                            0.0 if args.no_gpu else gpu_time(step))
                base = grads[variants[0]]
                for v in variants:
                    err = max(((a.float() - b.float()).norm() /
                               b.float().norm().clamp_min(1e-30)).item()
                              for a, b in zip(grads[v], base))
                    row = dict(graph=graph, conv=conv, dtype=dname, variant=v,
                               err=err, **{k: statistics.median(vals)
                                           for k, vals in res[v].items()})
                    rows.append(row)
                    print(f'{graph:13s} {conv:6s} {dname} {v:11s} wall '
                          f'{row["wall"]:6.3f}  host {row["host"]:6.3f}  '
                          f'gpu {row["gpu"]:6.3f} ms  err {err:.1e}',
                          flush=True)
    use('rule')
    if args.json:
        with open(args.json, 'w') as f:
            json.dump(rows, f, indent=1)


if __name__ == '__main__':
    main()

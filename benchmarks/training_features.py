"""Training step of the convs with the features that used to leave the fused
kernels: attention dropout, edge features (``edge_dim``) and
``return_attention_weights``, next to the same convs without them.

Each row builds a PyG conv and our conv with the same arguments, copies the
PyG weights into ours (``load_state_dict``) and times one training step of
each in ``train()`` mode on one batch graph (1,024 small graphs of 110 nodes,
in-degree ~40, 128 input channels): forward, then backward of a fixed random
upstream gradient into the parameters, ``x`` and ``edge_attr``. Reported: the
median step (CUDA events), the peak extra memory of one step, PyG / ours
ratios, the overhead of each feature over our plain step of the same conv,
how often the step reached the pure-PyTorch reference path, and the gates:

* time: step >= 5x faster than PyG's;
* mem: peak memory >= 5x lower, >= 2x for rows that build an [E, H, F] edge
  tensor (GATv2 / TransformerConv with ``edge_dim``; GAT folds its edge
  term to [E, H]);
* ovh: step <= 1.30x our plain step of the same conv;
* fused: no reference-path call (CUDA only).

    python benchmarks/training_features.py               # all rows, fp32
    python benchmarks/training_features.py --dtype bf16 --rows gat,gat-edge
    python benchmarks/training_features.py --quick       # smoke run (CPU too)

On a CPU (``--quick``) our convs run the reference path: the run only checks
that the script works; gates are reported on CUDA only.
"""
import contextlib
import os
import sys
from dataclasses import dataclass, field
from typing import Dict, List, Optional

import torch

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path[:0] = [HERE, os.path.dirname(HERE)]  # graphs/timing; pyg_dfgnn
from graphs import GraphSpec, _batch, stats  # noqa: E402
from timing import (guard_oom, Timer, base_parser, default_out,  # noqa: E402
                    environment, fmt,
                    eval_errors, speedup,
                    free_memory, peak_memory_mb, print_table, rel_err,
                    save_json)

IN_CHANNELS, EDGE_DIM = 128, 16
# 50 uniform draws among 110 nodes leave ~40.3 distinct sources per node
GRAPH = GraphSpec('batch', nodes_per_graph=110, avg_in_degree=50,
                  num_graphs=1024)

# gates of the issue
MIN_SPEEDUP, MIN_MEM, MIN_MEM_EDGE_TENSOR, MAX_OVERHEAD = 5.0, 5.0, 2.0, 1.30

PAIRS = {
    'gat': ('GATConv', 'DFGATConv'),
    'gatv2': ('GATv2Conv', 'DFGATv2Conv'),
    'transformer': ('TransformerConv', 'DFTransformerConv'),
    'agnn': ('AGNNConv', 'DFAGNNConv'),
}
DTYPES = {'fp32': None, 'bf16': torch.bfloat16, 'fp16': torch.float16}


@dataclass(frozen=True)
class Config:
    name: str
    conv: str  # key of PAIRS
    args: tuple
    kwargs: Dict = field(default_factory=dict)
    attention: bool = False  # forward(..., return_attention_weights=True)
    baseline: Optional[str] = None  # the plain row of the same conv
    edge_tensor: bool = False  # builds an [E, H, F] edge tensor (mem gate)

    @property
    def edge_dim(self) -> Optional[int]:
        return self.kwargs.get('edge_dim')

    def describe(self) -> str:
        inner = [str(a) for a in self.args]
        inner += [f'{k}={v}' for k, v in self.kwargs.items()]
        if self.attention:
            inner.append('attn')
        return f"{PAIRS[self.conv][0]}({', '.join(inner)})"


GAT, GT = ('gat', (IN_CHANNELS, 16)), ('transformer', (IN_CHANNELS, 32))
CONFIGS = [
    Config('gat', *GAT, dict(heads=8)),
    Config('gat-dropout', *GAT, dict(heads=8, dropout=0.6), baseline='gat'),
    Config('gat-edge', *GAT, dict(heads=8, edge_dim=EDGE_DIM),
           baseline='gat'),
    Config('gat-attn', *GAT, dict(heads=8), attention=True, baseline='gat'),
    Config('gt', *GT, dict(heads=4)),
    Config('gt-dropout', *GT, dict(heads=4, dropout=0.1), baseline='gt'),
    Config('gt-edge', *GT, dict(heads=4, edge_dim=EDGE_DIM), baseline='gt',
           edge_tensor=True),
    Config('gatv2', 'gatv2', (IN_CHANNELS, 16), dict(heads=8)),
    Config('gatv2-edge-dropout', 'gatv2', (IN_CHANNELS, 16),
           dict(heads=8, edge_dim=EDGE_DIM, dropout=0.2), baseline='gatv2',
           edge_tensor=True),
    # PyG's default keeps beta fixed; a trained beta is the harder case
    Config('agnn', 'agnn', (), dict(requires_grad=True)),
]
BY_NAME = {c.name: c for c in CONFIGS}


def make_graph(device, seed: int = 0, scale: float = 1.0):
    """``(edge_index, num_nodes)`` of the batch graph (sorted by destination,
    duplicate-free, no edge leaves its small graph)."""
    gen = torch.Generator(device=device).manual_seed(seed)
    return _batch(GRAPH, scale, gen, torch.device(device))


def build_pair(cfg: Config, device, seed: int):
    """PyG conv and ours with identical weights, both in ``train()`` mode."""
    import torch_geometric.nn as pyg_nn

    import pyg_dfgnn.nn as df_nn
    pyg_name, our_name = PAIRS[cfg.conv]
    torch.manual_seed(seed)
    ref = getattr(pyg_nn, pyg_name)(*cfg.args, **cfg.kwargs).to(device)
    ours = getattr(df_nn, our_name)(*cfg.args, **cfg.kwargs).to(device)
    ours.load_state_dict(ref.state_dict(), strict=True)
    return ref.train(), ours.train()


@contextlib.contextmanager
def count_reference_calls():
    """Counts calls of the pure-PyTorch reference op while active: the name
    the dispatcher calls (``pyg_dfgnn.ops.fused_attention_reference``) and
    the defining module's, in case a caller goes through that one."""
    import pyg_dfgnn.ops as ops
    import pyg_dfgnn.ops.reference as reference
    counter = {'calls': 0}
    saved = {m: m.fused_attention_reference for m in (ops, reference)}

    def wrap(original):
        def counted(*args, **kwargs):
            counter['calls'] += 1
            return original(*args, **kwargs)
        return counted

    try:
        for module, original in saved.items():
            setattr(module, 'fused_attention_reference', wrap(original))
        yield counter
    finally:
        for module, original in saved.items():
            setattr(module, 'fused_attention_reference', original)




class Step:
    """One training step of ``conv``: forward (under autocast for bf16 /
    fp16), backward of ``grad`` into the parameters and the inputs."""

    def __init__(self, cfg: Config, inputs: Dict, autocast_dtype) -> None:
        self.cfg, self.inputs = cfg, inputs
        self.autocast_dtype = autocast_dtype
        self.count = 0

    def clear(self, conv) -> None:
        conv.zero_grad(set_to_none=True)
        for t in self.inputs['leaves']:
            t.grad = None

    def forward(self, conv):
        x, ei, ea = (self.inputs[k] for k in ('x', 'edge_index', 'edge_attr'))
        kwargs = {} if ea is None else {'edge_attr': ea}
        if self.cfg.attention:
            kwargs['return_attention_weights'] = True
        autocast = contextlib.nullcontext() if self.autocast_dtype is None \
            else torch.autocast(x.device.type, dtype=self.autocast_dtype)
        with autocast:
            out = conv(x, ei, **kwargs)
        # the weights are computed; the loss uses the features
        return out[0] if self.cfg.attention else out

    def __call__(self, conv):
        def run():
            self.count += 1
            self.clear(conv)
            out = self.forward(conv)
            out.backward(self.inputs['grad'].to(out.dtype))
            return out
        return run


def _grads(step: Step, conv) -> Dict[str, torch.Tensor]:
    step.clear(conv)
    out = step.forward(conv)
    out.backward(step.inputs['grad'].to(out.dtype))
    res = {'out': out.detach()}
    for name, t in zip(('x', 'edge_attr'), step.inputs['leaves']):
        res[name] = t.grad
    res.update((f'param {n}', p.grad) for n, p in conv.named_parameters())
    step.clear(conv)
    return res


def _grad_error(got: Dict, want: Dict) -> float:
    """Relative error of all gradients (inputs and parameters) taken
    together: a single one can be zero in exact arithmetic."""
    keys = [k for k in sorted(want) if k != 'out' and want[k] is not None]
    if not keys:
        return 0.0
    flat = lambda g: torch.cat([  # noqa: E731
        (g[k] if g.get(k) is not None else torch.zeros_like(want[k])
         ).reshape(-1).double() for k in keys])
    return rel_err(flat(got), flat(want))


def bench_row(cfg: Config, edge_index, num_nodes: int, dtype_name: str,
              timer: Timer, device, seed: int) -> Dict:
    row: Dict = dict(config=cfg.name, module=cfg.describe(), dtype=dtype_name,
                     num_nodes=num_nodes, num_edges=edge_index.size(1),
                     baseline=cfg.baseline, edge_tensor=cfg.edge_tensor)
    ref, ours = build_pair(cfg, device, seed)
    gen = torch.Generator(device=device).manual_seed(seed)
    x = torch.randn(num_nodes, IN_CHANNELS, generator=gen, device=device)
    leaves = [x.requires_grad_()]
    ea = None
    if cfg.edge_dim:
        ea = torch.randn(edge_index.size(1), cfg.edge_dim, generator=gen,
                         device=device).requires_grad_()
        leaves.append(ea)
    inputs = dict(x=x, edge_index=edge_index, edge_attr=ea, leaves=leaves)
    step = Step(cfg, inputs, DTYPES[dtype_name])
    with torch.no_grad():
        shape = step.forward(ref).shape
    inputs['grad'] = torch.randn(shape, generator=gen, device=device)
    free_memory(device)

    def measure(who, conv):
        row[f'{who}_ms'] = guard_oom(lambda: timer(step(conv)))
        step.clear(conv)
        free_memory(device)
        row[f'{who}_mb'] = guard_oom(lambda: peak_memory_mb(step(conv), device))
        step.clear(conv)
        free_memory(device)

    measure('pyg', ref)
    with count_reference_calls() as counter:
        step.count = 0
        measure('ours', ours)
        steps = step.count
    row['ref_calls'] = counter['calls'] / steps if steps else None

    # sanity: in eval() mode (no dropout) both convs agree
    ref.eval(), ours.eval()
    row['err_fwd'], row['err_bwd'] = eval_errors(
        lambda: _grads(step, ours), lambda: _grads(step, ref), _grad_error)
    free_memory(device)

    row['x_time'] = speedup(row['pyg_ms'], row['ours_ms'])
    row['x_mem'] = speedup(row['pyg_mb'], row['ours_mb'])
    return row  # modules and inputs are freed with this frame


def add_gates(rows: List[Dict], cuda: bool) -> None:
    """Overhead over the plain row of the same conv and dtype, and the
    PASS / FAIL of each gate (None where it does not apply)."""
    ours = {(r['config'], r['dtype']): r['ours_ms'] for r in rows}

    def verdict(ok):
        return None if ok is None else ('PASS' if ok else 'FAIL')

    for r in rows:
        base = ours.get((r['baseline'], r['dtype']))
        r['overhead'] = (r['ours_ms'] / base if isinstance(base, float)
                         and isinstance(r['ours_ms'], float) else None)
        min_mem = MIN_MEM_EDGE_TENSOR if r['edge_tensor'] else MIN_MEM
        checks = {
            'gate_time': None if r['x_time'] is None else
            r['x_time'] >= MIN_SPEEDUP,
            'gate_mem': None if r['x_mem'] is None else r['x_mem'] >= min_mem,
            'gate_overhead': None if r['overhead'] is None else
            r['overhead'] <= MAX_OVERHEAD,
            'gate_fused': None if r['ref_calls'] is None else
            r['ref_calls'] == 0,
        }
        for key, ok in checks.items():
            r[key] = verdict(ok if cuda else None)


GATES = ('gate_time', 'gate_mem', 'gate_overhead', 'gate_fused')


def print_rows(rows: List[Dict]) -> None:
    headers = ['config', 'module', 'dtype', 'PyG ms', 'ours ms', 'x time',
               'PyG MB', 'ours MB', 'x mem', 'ovh', 'ref calls', 'time',
               'mem', 'ovh<=1.3', 'fused', 'err fwd', 'err bwd']
    err = lambda e: e if isinstance(e, str) or e is None else f'{e:.1e}'  # noqa
    table = [[r['config'], r['module'], r['dtype'], r['pyg_ms'], r['ours_ms'],
              r['x_time'], r['pyg_mb'], r['ours_mb'], r['x_mem'],
              r['overhead'], r['ref_calls']] +
             [r[g] or '—' for g in GATES] +
             [err(r['err_fwd']), err(r['err_bwd'])] for r in rows]
    print_table(headers, table)
    print(f'ms: median training step (fwd+bwd, train mode); MB: its peak '
          f'extra memory; x = PyG / ours; ovh = ours / our plain step of the '
          f'same conv; ref calls: reference-path calls per step of ours; '
          f'gates: time >= {MIN_SPEEDUP:g}x, mem >= {MIN_MEM:g}x '
          f'({MIN_MEM_EDGE_TENSOR:g}x with an [E, H, F] edge tensor), '
          f'ovh <= {MAX_OVERHEAD}, fused = 0 ref calls; err: ours vs PyG in '
          f'eval mode (output / all gradients)')


def parse_args(argv=None):
    parser = base_parser(
        __doc__, 'training_features',
        'smoke run: short timing (and 1%% of the graphs on a CPU)',
        'fraction of the 1,024 graphs (default 1, 0.01 on a CPU with '
        '--quick)')
    parser.add_argument('--rows', default=','.join(BY_NAME),
                        help=f'comma-separated, from {",".join(BY_NAME)}')
    parser.add_argument('--strict', action='store_true',
                        help='exit 1 if a gate fails')
    args = parser.parse_args(argv)
    for names, known in ((args.rows, BY_NAME), (args.dtype, DTYPES)):
        for n in names.split(','):
            if n not in known:
                parser.error(f"unknown '{n}' (have {list(known)})")
    return args


def main(argv=None) -> List[Dict]:
    args = parse_args(argv)
    device = torch.device(args.device or (
        'cuda' if torch.cuda.is_available() else 'cpu'))
    cuda = device.type == 'cuda'
    scale = args.scale or (0.01 if args.quick and not cuda else 1.0)
    if not cuda:
        torch.set_num_threads(1)  # stable CPU timings on a shared machine
    timer = Timer(device, warmup_ms=10 if args.quick else 25,
                  rep_ms=30 if args.quick else 200,
                  min_reps=3 if args.quick else 5,
                  max_reps=50 if args.quick else 500)
    env = environment(device)
    edge_index, n = make_graph(device, args.seed, scale)
    graph = stats(edge_index, n)
    print(f"device: {env['device']} | torch {env['torch']} | torch_geometric "
          f"{env.get('torch_geometric')} | {n // GRAPH.nodes_per_graph:,} "
          f"graphs, {n:,} nodes, {graph['num_edges']:,} edges, in-degree "
          f"{graph['avg_in_degree']:.1f}", flush=True)
    rows = []
    for name in args.rows.split(','):
        for dtype_name in args.dtype.split(','):
            rows.append(bench_row(BY_NAME[name], edge_index, n, dtype_name,
                                  timer, device, args.seed))
            r = rows[-1]
            print(f"  {r['module']} {dtype_name}: PyG {fmt(r['pyg_ms'])} ms,"
                  f" ours {fmt(r['ours_ms'])} ms, ref calls "
                  f"{fmt(r['ref_calls'])}", flush=True)
    add_gates(rows, cuda)
    failed = [f"{r['config']}/{r['dtype']}: {g[5:]}" for r in rows
              for g in GATES if r[g] == 'FAIL']
    out = args.out or default_out('training_features', device)
    save_json(out, dict(benchmark='training_features', env=env, scale=scale,
                        quick=args.quick, graph=graph,
                        gates=dict(min_speedup=MIN_SPEEDUP, min_mem=MIN_MEM,
                                   min_mem_edge_tensor=MIN_MEM_EDGE_TENSOR,
                                   max_overhead=MAX_OVERHEAD),
                        failed=failed if cuda else None, rows=rows))
    print()
    print_rows(rows)
    if cuda:
        print('gates: ' + ('all PASS' if not failed else
                           f"{len(failed)} FAIL: {', '.join(failed)}"))
        if failed and args.strict:
            sys.exit(1)
    return rows


if __name__ == '__main__':
    main()

"""Module-level benchmark: our convs vs the PyG convs they replace.

Each pair is built with the same constructor arguments and our conv gets the
PyG conv's weights (``load_state_dict``), then on the same input and graph:
forward (no grad) and forward+backward (a training step's compute, input
requiring grad) median times, peak extra memory of the training step, and
the relative error of our output and gradients against PyG's. The PyG
figures of ``shared/anchors.md`` (H200) are kept in the JSON for reference;
PyG is timed live. Prints a table and saves JSON.

    python benchmarks/modules.py                         # batch + small graphs
    python benchmarks/modules.py --graphs reddit-like-1/5 --convs gat,gt
    python benchmarks/modules.py --quick                 # smoke run (CPU too)

Convs of pyg_dfgnn.nn that do not exist (yet) are skipped with a note.
"""
import os
import sys
from typing import Dict, List, Optional

import torch

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path[:0] = [HERE, os.path.dirname(HERE)]  # graphs/timing; pyg_dfgnn
from graphs import DEFAULT_GRAPHS, GRAPHS, make_graph  # noqa: E402
from timing import (guard_oom, Timer, default_out, environment, free_memory, make_parser,
                    resolve_run,  # noqa
                    eval_errors, peak_memory_mb, print_table, rel_err,
                    save_json, speedup, add_tf32_argument, tf32_flag,
                    dtype_label)
from kernels import DTYPES  # noqa: E402

IN_CHANNELS = 128

# name -> (PyG class, our class, constructor args, kwargs)
CONVS = {
    'gt': ('TransformerConv', 'DFTransformerConv', (128, 128), {}),
    'gat': ('GATConv', 'DFGATConv', (128, 128), {}),
    'gat-8h': ('GATConv', 'DFGATConv', (128, 16), {'heads': 8}),
    'gatv2': ('GATv2Conv', 'DFGATv2Conv', (128, 128), {}),
    # PyG's default keeps beta fixed; a trained beta is the harder case
    'agnn': ('AGNNConv', 'DFAGNNConv', (), {'requires_grad': True}),
}

# shared/anchors.md, PyG 2.8 on one H200, fp32: fwd ms, fwd+bwd ms, peak GB
PYG_ANCHORS_H200 = {
    ('pattern-like', 'gt'): (16.5, 41.7, 15.0),
    ('pattern-like', 'gat'): (7.5, 19.9, 10.1),
    ('pattern-like', 'gat-8h'): (21.0, 40.5, 10.8),
    ('pattern-like', 'gatv2'): (19.6, 46.8, 15.0),
    ('pattern-like', 'agnn'): (16.3, 41.0, 15.0),
    ('reddit-like-1/5', 'gt'): (44.7, 109, 39),
    ('reddit-like-1/5', 'gat'): (21.6, 52.4, 26),
}
# anchors.md "Our targets", module level: fwd+bwd speedup, memory ratio
TARGET_FB_BATCH, TARGET_FB_SMALL, TARGET_MEM = 20.0, 25.0, 30.0
SMALL_GRAPHS = ('cora-like', 'pubmed-like')


def describe(name: str) -> str:
    pyg_name, _, args, kwargs = CONVS[name]
    inner = ', '.join([str(a) for a in args] +
                      [f'{k}={v}' for k, v in kwargs.items()])
    return f'{pyg_name}({inner})'


def build_pair(name: str, device, dtype, seed: int):
    """``(pyg_conv, our_conv or None, note)`` with copied weights."""
    import torch_geometric.nn as pyg_nn
    pyg_name, our_name, args, kwargs = CONVS[name]
    torch.manual_seed(seed)
    ref = getattr(pyg_nn, pyg_name)(*args, **kwargs)
    ref = ref.to(device, dtype)
    try:
        import pyg_dfgnn.nn as df_nn
        our_cls = getattr(df_nn, our_name)
    except (ImportError, AttributeError) as e:
        return ref, None, f'{our_name} unavailable ({e.__class__.__name__})'
    ours = our_cls(*args, **kwargs).to(device, dtype)
    try:
        ours.load_state_dict(ref.state_dict())
    except RuntimeError as e:
        return ref, ours, f'weights not copied: {str(e).splitlines()[0]}'
    return ref, ours, ''




def _grads(module: torch.nn.Module, x: torch.Tensor, edge_index,
           grad: torch.Tensor) -> Dict[str, torch.Tensor]:
    """One training step's compute: output, dx and the parameter grads by
    parameter name."""
    module.zero_grad(set_to_none=True)
    x.grad = None
    out = module(x, edge_index)
    out.backward(grad)
    res = {'out': out.detach(), 'x': x.grad}
    res.update((f'param {n}', p.grad) for n, p in module.named_parameters())
    return res


def _grad_error(got: Dict, want: Dict) -> float:
    """Max of the relative errors of dx and of all parameter gradients taken
    together (one parameter's gradient can be zero in exact arithmetic, e.g.
    TransformerConv's key bias, which makes its own relative error noise)."""
    def flat(grads: Dict, like: Dict):
        return torch.cat([
            (grads.get(k) if grads.get(k) is not None else
             torch.zeros_like(like[k])).reshape(-1).double()
            for k in sorted(like) if k.startswith('param ')
            and like[k] is not None])
    errs = [rel_err(got['x'], want['x'])] if want['x'] is not None else []
    if any(k.startswith('param ') and v is not None for k, v in want.items()):
        errs.append(rel_err(flat(got, want), flat(want, want)))
    return max(errs) if errs else 0.0


def bench_pair(conv: str, graph_name: str, edge_index, num_nodes: int,
               dtype_name: str, timer: Timer, device, seed: int) -> Dict:
    dtype = DTYPES[dtype_name]
    row: Dict = dict(graph=graph_name, conv=conv, module=describe(conv),
                     dtype=dtype_name, num_nodes=num_nodes,
                     num_edges=edge_index.size(1))
    ref, ours, note = build_pair(conv, device, dtype, seed)
    row['note'] = note
    gen = torch.Generator(device=device).manual_seed(seed)
    x = torch.randn(num_nodes, IN_CHANNELS, generator=gen, device=device,
                    dtype=torch.float32).to(dtype).requires_grad_(True)
    with torch.no_grad():
        out_shape = ref(x, edge_index).shape
    grad = torch.randn(out_shape, generator=gen, device=device,
                       dtype=torch.float32).to(dtype)
    free_memory(device)

    def fwd(m):
        def run():
            with torch.no_grad():
                return m(x, edge_index)
        return run

    def step(m):
        return lambda: _grads(m, x, edge_index, grad)

    modules = {'pyg': ref, 'ours': ours}
    for who, m in modules.items():
        if m is None:
            for key in ('fwd', 'fb', 'mem_mb'):
                row[f'{who}_{key}'] = None
            continue
        m.train()
        row[f'{who}_fwd'] = guard_oom(lambda: timer(fwd(m)))
        free_memory(device)
        row[f'{who}_fb'] = guard_oom(lambda: timer(step(m)))
        free_memory(device)
        row[f'{who}_mem_mb'] = guard_oom(lambda: peak_memory_mb(step(m), device))
        free_memory(device)

    row['err_fwd'] = row['err_bwd'] = None
    if ours is not None and not note:
        row['err_fwd'], row['err_bwd'] = eval_errors(
            lambda: _grads(ours, x, edge_index, grad),
            lambda: _grads(ref, x, edge_index, grad), _grad_error)
        free_memory(device)

    row['x_fwd'] = speedup(row['pyg_fwd'], row['ours_fwd'])
    row['x_fb'] = speedup(row['pyg_fb'], row['ours_fb'])
    row['x_mem'] = speedup(row['pyg_mem_mb'], row['ours_mem_mb'])
    row['pyg_anchor_h200'] = PYG_ANCHORS_H200.get((graph_name, conv))
    row['target'] = _target(graph_name, row) if x.is_cuda else None
    return row  # modules and inputs are freed with this frame


def _target(graph_name: str, row: Dict) -> Optional[str]:
    """'ok' / 'MISS' against the module targets of anchors.md."""
    if row['x_fb'] is None:
        return None
    want = TARGET_FB_SMALL if graph_name in SMALL_GRAPHS else TARGET_FB_BATCH
    checks = [row['x_fb'] >= want]
    if row['x_mem'] is not None:
        checks.append(row['x_mem'] >= TARGET_MEM)
    return 'ok' if all(checks) else 'MISS'


def print_rows(rows: List[Dict]) -> None:
    headers = ['graph', 'module', 'dtype', 'fwd ms', 'PyG fwd', 'x fwd',
               'f+b ms', 'PyG f+b', 'x f+b', 'MB', 'PyG MB', 'x mem',
               'err fwd', 'err bwd', 'target', 'note']
    err = lambda e: e if isinstance(e, str) or e is None else f'{e:.1e}'  # noqa
    table = [[r['graph'], r['module'], r['dtype'], r['ours_fwd'],
              r['pyg_fwd'], r['x_fwd'], r['ours_fb'], r['pyg_fb'], r['x_fb'],
              r['ours_mem_mb'], r['pyg_mem_mb'], r['x_mem'],
              err(r['err_fwd']), err(r['err_bwd']), r['target'] or '—',
              r['note']] for r in rows]
    print_table(headers, table)
    print('times in ms (medians), fwd without grad, f+b = forward+backward '
          'of a training step; x = PyG / ours; MB = peak extra memory of the '
          'step; err = rel. error of our output / gradients vs PyG')


def main(argv=None) -> List[Dict]:
    parser = make_parser(__doc__, 'modules', ','.join(DEFAULT_GRAPHS),
                         GRAPHS)
    parser.add_argument('--convs', default=','.join(CONVS),
                        help=f'comma-separated, from {",".join(CONVS)}')
    add_tf32_argument(parser)  # (both sides: PyG's linear layers too)
    args = parser.parse_args(argv)

    device, graphs, scale = resolve_run(args, parser)
    convs, dtypes = args.convs.split(','), args.dtype.split(',')
    for name, known in ((graphs, GRAPHS), (convs, CONVS), (dtypes, DTYPES)):
        for n in name:
            if n not in known:
                parser.error(f"unknown '{n}' (have {list(known)})")

    timer = Timer(device, warmup_ms=10 if args.quick else 25,
                  rep_ms=30 if args.quick else 200,
                  max_reps=50 if args.quick else 500)
    env = environment(device)
    print(f"device: {env['device']} | torch {env['torch']} | torch_geometric "
          f"{env.get('torch_geometric')} | scale {scale}")
    rows = []
    with tf32_flag(args.tf32, env):
        for graph_name in graphs:
            edge_index, n = make_graph(graph_name, device, args.seed, scale)
            print(f'{graph_name}: {n:,} nodes, {edge_index.size(1):,} edges',
                  flush=True)
            for conv in convs:
                for dtype_name in dtypes:
                    rows.append(bench_pair(conv, graph_name, edge_index, n,
                                           dtype_name, timer, device,
                                           args.seed))
                    rows[-1]['dtype'] = dtype_label(dtype_name, args.tf32)
                    if rows[-1]['note']:
                        print(f"  {describe(conv)}: {rows[-1]['note']}")
            del edge_index
            free_memory(device)
    print()
    print_rows(rows)
    out = args.out or default_out('modules', device)
    save_json(out, dict(benchmark='modules', env=env, scale=scale,
                        quick=args.quick, rows=rows))
    return rows


if __name__ == '__main__':
    main()

"""Timing, memory and reporting helpers shared by the benchmark scripts."""
import contextlib
import datetime
import json
import os
import platform
import statistics
import subprocess
import time
from typing import Callable, Dict, Iterator, List, Optional, Tuple

import torch


class Timer:
    """Median wall time of a callable: CUDA events on a GPU (after warm-up,
    one event pair per call), ``perf_counter`` on a CPU.

    ``flush_l2`` zeroes a buffer larger than L2 before every timed call (not
    timed) so that small graphs are measured cold instead of L2-resident.
    """

    def __init__(self, device: torch.device, warmup_ms: float = 25.0,
                 rep_ms: float = 100.0, min_reps: int = 5,
                 max_reps: int = 500, flush_l2: bool = False) -> None:
        self.device = torch.device(device)
        self.cuda = self.device.type == 'cuda'
        self.warmup_ms, self.rep_ms = warmup_ms, rep_ms
        self.min_reps, self.max_reps = min_reps, max_reps
        self._flush = None
        if flush_l2 and self.cuda:
            self._flush = torch.empty(256 * 2**20, dtype=torch.int8,
                                      device=self.device)

    def _sync(self) -> None:
        if self.cuda:
            torch.cuda.synchronize(self.device)

    def __call__(self, fn: Callable[[], object]) -> float:
        """Median milliseconds of ``fn()``."""
        fn()
        self._sync()
        t0 = time.perf_counter()
        fn()
        self._sync()
        est_ms = max((time.perf_counter() - t0) * 1e3, 1e-3)
        reps = int(min(self.max_reps, max(self.min_reps,
                                          self.rep_ms / est_ms)))
        for _ in range(int(min(self.max_reps, self.warmup_ms / est_ms))):
            fn()
        if not self.cuda:
            times = []
            for _ in range(reps):
                t0 = time.perf_counter()
                fn()
                times.append((time.perf_counter() - t0) * 1e3)
            return statistics.median(times)
        starts = [torch.cuda.Event(enable_timing=True) for _ in range(reps)]
        ends = [torch.cuda.Event(enable_timing=True) for _ in range(reps)]
        for start, end in zip(starts, ends):
            if self._flush is not None:
                self._flush.zero_()
            start.record()
            fn()
            end.record()
        self._sync()
        return statistics.median(s.elapsed_time(e)
                                 for s, e in zip(starts, ends))


def peak_memory_mb(fn: Callable[[], object],
                   device: torch.device) -> Optional[float]:
    """Peak CUDA memory allocated by ``fn()`` beyond what was allocated
    before it (MB), None on a CPU."""
    if torch.device(device).type != 'cuda':
        return None
    torch.cuda.synchronize(device)
    base = torch.cuda.memory_allocated(device)
    torch.cuda.reset_peak_memory_stats(device)
    fn()
    torch.cuda.synchronize(device)
    return (torch.cuda.max_memory_allocated(device) - base) / 2**20


def is_oom(err: BaseException) -> bool:
    return isinstance(err, torch.cuda.OutOfMemoryError) or (
        isinstance(err, RuntimeError) and 'out of memory' in str(err))


def guard_oom(fn):
    """Run ``fn()``; 'OOM' on out-of-memory instead of raising."""
    try:
        return fn()
    except Exception as e:  # noqa: BLE001 - only OOM is swallowed
        if is_oom(e):
            return 'OOM'
        raise


def free_memory(device: torch.device) -> None:
    if torch.device(device).type == 'cuda':
        torch.cuda.synchronize(device)
        torch.cuda.empty_cache()


def rel_err(out: torch.Tensor, ref: torch.Tensor) -> float:
    """``||out - ref|| / ||ref||`` in float64."""
    ref = ref.double()
    den = ref.norm().item()
    num = (out.double() - ref).norm().item()
    return num / den if den > 0 else num


def speedup(base, ours) -> Optional[float]:
    """``base / ours`` for two measurements; None where either is missing,
    'OOM' or not positive."""
    def measured(v) -> bool:
        return isinstance(v, (int, float)) and not isinstance(v, bool)
    if not measured(base) or not measured(ours) or ours <= 0:
        return None
    return base / ours


def eval_errors(run_ours: Callable[[], Dict], run_ref: Callable[[], Dict],
                grad_error: Callable[[Dict, Dict], float]) -> Tuple:
    """``(err_fwd, err_bwd)`` of two runs returning ``{'out': ..., grads}``
    (output vs output, ``grad_error`` over the gradients); ``('OOM', 'OOM')``
    where either runs out of memory (the reference is skipped then)."""
    got = guard_oom(run_ours)
    want = guard_oom(run_ref) if got != 'OOM' else 'OOM'
    if 'OOM' in (got, want):
        return 'OOM', 'OOM'
    return rel_err(got['out'], want['out']), grad_error(got, want)


def device_name(device: torch.device) -> str:
    if torch.device(device).type == 'cuda':
        return torch.cuda.get_device_name(device)
    return platform.processor() or 'cpu'


def gpu_family(device: torch.device) -> Optional[str]:
    """'H100' / 'H200' (the GPUs the anchors were measured on) or None."""
    name = device_name(device).upper()
    for family in ('H200', 'H100'):
        if family in name:
            return family
    return None


def slug(text: str) -> str:
    return ''.join(c if c.isalnum() else '-' for c in text.lower()).strip('-')


def environment(device: torch.device) -> Dict:
    import pyg_dfgnn
    info = {
        'device': device_name(device),
        'torch': torch.__version__,
        'cuda': torch.version.cuda,
        'pyg_dfgnn': pyg_dfgnn.__version__,
        'python': platform.python_version(),
        'date_utc': datetime.datetime.now(
            datetime.timezone.utc).isoformat(timespec='seconds'),
    }
    try:
        import torch_geometric
        info['torch_geometric'] = torch_geometric.__version__
    except ImportError:
        pass
    try:
        info['git_commit'] = subprocess.run(
            ['git', 'rev-parse', '--short', 'HEAD'], capture_output=True,
            text=True, cwd=os.path.dirname(os.path.abspath(__file__)),
            timeout=10).stdout.strip() or None
    except (OSError, subprocess.SubprocessError):
        info['git_commit'] = None
    return info


def default_out(kind: str, device: torch.device) -> str:
    here = os.path.dirname(os.path.abspath(__file__))
    date = datetime.datetime.now(datetime.timezone.utc).strftime('%Y%m%d-%H%M')
    return os.path.join(here, 'results',
                        f'{kind}-{slug(device_name(device))}-{date}.json')


def save_json(path: str, payload: Dict) -> None:
    os.makedirs(os.path.dirname(os.path.abspath(path)), exist_ok=True)
    with open(path, 'w') as f:
        json.dump(payload, f, indent=1)
    print(f'saved {path}')


def fmt(x, digits: int = 3) -> str:
    """Table cell: numbers to ``digits`` significant digits, strings as is,
    None as '—'."""
    if x is None:
        return '—'
    if isinstance(x, str):
        return x
    if x == 0:
        return '0'
    if abs(x) >= 10**digits:
        return f'{x:.0f}'
    return f'{x:.{digits}g}'


def print_table(headers: List[str], rows: List[List]) -> None:
    cells = [[fmt(c) if not isinstance(c, str) else c for c in row]
             for row in rows]
    widths = [max(len(h), *(len(r[i]) for r in cells)) if cells else len(h)
              for i, h in enumerate(headers)]
    line = ' | '.join(h.rjust(w) for h, w in zip(headers, widths))
    print(line)
    print('-+-'.join('-' * w for w in widths))
    for r in cells:
        print(' | '.join(c.rjust(w) for c, w in zip(r, widths)))


def base_parser(doc: str, kind: str, quick_help: str, scale_help: str):
    """The flags every benchmark takes: --dtype, --quick, --scale,
    --device, --seed, --out (JSON under benchmarks/results/<kind>-...)."""
    import argparse
    parser = argparse.ArgumentParser(
        description=doc.splitlines()[0],
        formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument('--dtype', default='fp32',
                        help='comma-separated: fp32, bf16, fp16')
    parser.add_argument('--quick', action='store_true', help=quick_help)
    parser.add_argument('--scale', type=float, default=None,
                        help=scale_help)
    parser.add_argument('--device', default=None,
                        help='default: cuda if available, else cpu')
    parser.add_argument('--seed', type=int, default=0)
    parser.add_argument('--out', default=None, help='JSON path (default '
                        f'benchmarks/results/{kind}-<gpu>-<date>.json)')
    return parser


def make_parser(doc: str, kind: str, graphs: str, all_graphs):
    """The graph benchmarks' shared CLI; a script adds its own
    flags (``--shapes``, ``--convs``, ...) to ``parser`` before parsing."""
    parser = base_parser(
        doc, kind, 'smoke run: cora-like + pattern-like (tiny cora-like + '
        'mnist-like on a CPU), short timing',
        'shrink the graphs (default 1, 0.05 on a CPU with --quick)')
    parser.add_argument('--graphs', default=graphs,
                        help=f'comma-separated, from {",".join(all_graphs)}')
    return parser


def add_tf32_argument(parser) -> None:
    """``--tf32``: fp32 under torch.backends.cuda.matmul.allow_tf32 (see
    :func:`tf32_flag`)."""
    parser.add_argument('--tf32', action='store_true',
                        help='fp32 under torch.backends.cuda.matmul.'
                        'allow_tf32 (opt-in: the tensor-core windows and '
                        "PyTorch's matmuls take TF32 products; rows "
                        'labelled fp32+tf32)')


@contextlib.contextmanager
def tf32_flag(on: bool, env: Dict) -> Iterator[None]:
    """torch.backends.cuda.matmul.allow_tf32 set while the benchmark runs
    (and recorded in ``env``) where ``on``; restored after."""
    before = torch.backends.cuda.matmul.allow_tf32
    if on:
        torch.backends.cuda.matmul.allow_tf32 = True
        env['allow_tf32'] = True
    try:
        yield
    finally:
        torch.backends.cuda.matmul.allow_tf32 = before


def dtype_label(dtype_name: str, tf32: bool) -> str:
    """A row's dtype: fp32 rows under ``--tf32`` read 'fp32+tf32'."""
    return 'fp32+tf32' if tf32 and dtype_name == 'fp32' else dtype_name


def resolve_run(args, parser) -> tuple:
    """``(device, graphs, scale)`` from the shared CLI flags (``--device``,
    ``--graphs``, ``--scale``, ``--quick``); ``--quick`` picks a small subset
    (and a 5 % scale on the CPU)."""
    device = torch.device(args.device or (
        'cuda' if torch.cuda.is_available() else 'cpu'))
    graphs, scale = args.graphs.split(','), args.scale
    if args.quick:
        if args.graphs == parser.get_default('graphs'):
            graphs = ['cora-like', 'pattern-like'] if device.type == 'cuda' \
                else ['cora-like', 'mnist-like']
        if scale is None and device.type != 'cuda':
            scale = 0.05
    if device.type == 'cpu':
        torch.set_num_threads(1)  # stable CPU timings on a shared machine
    return device, graphs, scale or 1.0

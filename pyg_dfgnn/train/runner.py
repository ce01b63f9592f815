"""Training loop: optimizer, schedule, losses, metrics, logging, checkpoints.

``train(cfg)`` trains a :class:`~pyg_dfgnn.train.model.GPSModel` on the
config's dataset and writes, under ``<out_dir>/<name>/<backend>-seed<seed>/``:

* ``config.yaml`` - the full config the run used;
* ``epochs.csv`` - one row per epoch (loss, metrics, lr, epoch time,
  throughput);
* ``results.json`` - config, per-epoch history, best epoch (by the validation
  ``metric_best``), final metrics, parameter count, device, timings;
* ``ckpt/last.pt`` - model, optimizer, scheduler, history and RNG state, from
  which ``resume=True`` continues bit-for-bit on the CPU. It holds tensors
  and plain containers only and is read with ``torch.load(...,
  weights_only=True)``: resuming never unpickles arbitrary objects.

Runs are seeded: the model init and dropout draw from ``torch.manual_seed(
seed)`` and the training order of epoch ``e`` from a generator seeded with
``(seed, e)``, so a resumed run repeats the uninterrupted one exactly.
"""
from __future__ import annotations

import csv
import json
import math
import os
import os.path as osp
import random
import sys
import time
from typing import Any, Callable, Dict, List, Optional, Tuple

import numpy as np
import torch
import torch.nn.functional as F
from torch import Tensor

from pyg_dfgnn.train.batching import (DeviceLoader, GraphBatch, GraphStore,
                                     auto_windows_per_graph)
from pyg_dfgnn.train import distributed
from pyg_dfgnn.train.config import (Config, ConfigError, canonical_value,
                                    compiles_layers, default_config,
                                    dump_config, pads_batches,
                                    split_layer_type)

#: Config keys that may differ between a run and its resumption.
RESUME_FREE_KEYS = ('device', 'num_threads', 'train.progress_bar',
                    'train.windows_per_graph',
                    'train.num_workers', 'train.loader', 'train.eval_period',
                    'train.ckpt_period', 'train.time_limit_s')

#: Tag of the checkpoints this runner writes (a foreign file is refused).
CKPT_FORMAT = 'pyg_dfgnn.train.ckpt/1'
CKPT_KEYS = ('config', 'epoch', 'model', 'optimizer', 'scheduler', 'history',
             'best', 'rng_cpu')

CSV_FIELDS = ('epoch', 'train_loss', 'train_metric', 'val_loss',
              'val_metric', 'test_loss', 'test_metric', 'lr', 'epoch_time_s',
              'compute_time_s', 'eval_time_s', 'graphs_per_s', 'nodes_per_s')


# --------------------------------------------------------------- plumbing
def set_seed(seed: int) -> None:
    random.seed(seed)
    np.random.seed(seed)
    torch.manual_seed(seed)


def resolve_device(cfg: Config) -> torch.device:
    if cfg.device == 'cuda' and not torch.cuda.is_available():
        raise ConfigError("'device' is cuda but no CUDA device is available")
    if cfg.device == 'auto':
        return torch.device('cuda' if torch.cuda.is_available() else 'cpu')
    return torch.device(cfg.device)


def run_dir(cfg: Config) -> str:
    return osp.join(cfg.out_dir, cfg.name, f'{cfg.backend}-seed{cfg.seed}')


def make_optimizer(cfg: Config, params,
                   capture: str = 'none') -> torch.optim.Optimizer:
    """Adam / AdamW of the config for the step's ``capture`` mode
    (:func:`capture_mode`). The update rule is the same in all of them:

    * ``'graphs'``: fused and capturable (device-side step counts, the
      learning rate a device tensor that the scheduler updates in place);
    * ``'compile'``: the learning rate a tensor too (a float would be a
      constant of the compiled update, recompiled at every scheduler
      step); on CUDA capturable and ``foreach`` (torch's compiled
      optimizer: inductor fuses the update itself, where the fused
      kernel would be an opaque call), on the CPU the single-tensor
      update (a tensor learning rate without ``capturable``, which the
      CPU lacks, rules out ``foreach``).
    """
    cls = torch.optim.AdamW if cfg.optim.optimizer == 'adamW' else \
        torch.optim.Adam
    params = list(params)
    # Fused Adam on the GPU: a few launches per step instead of a Python
    # loop over parameters (2 ms of host time per step of the PATTERN
    # models, whose steps are host-bound); the same update rule.
    cuda = bool(params) and all(p.is_cuda and p.dtype.is_floating_point
                                for p in params)
    lr: Any = cfg.optim.base_lr
    kw: Dict[str, Any] = dict(weight_decay=cfg.optim.weight_decay)
    if capture == 'graphs':
        kw.update(fused=True, capturable=True)
    elif capture == 'compile' and cuda:
        kw.update(capturable=True, foreach=True)
    elif capture == 'compile':
        kw.update(foreach=False)
    else:
        return cls(params, lr=lr, fused=cuda or None, **kw)
    lr = torch.tensor(lr, device=params[0].device)
    return cls(params, lr=lr, **kw)


def lr_factor(cfg: Config, epoch: int) -> float:
    """LR multiplier of epoch ``epoch`` (0-based). ``cosine_with_warmup``:
    linear warm-up to the base LR over ``num_warmup_epochs`` epochs (epoch 0
    already trains, at ``1 / (warmup + 1)``), then half a cosine to 0 at
    ``max_epoch``."""
    if cfg.optim.scheduler == 'none':
        return 1.0
    warmup, total = cfg.optim.num_warmup_epochs, cfg.optim.max_epoch
    if epoch < warmup:
        return (epoch + 1) / (warmup + 1)
    progress = (epoch - warmup) / max(1, total - warmup)
    return max(0.0, 0.5 * (1.0 + math.cos(math.pi * progress)))


def make_scheduler(cfg: Config, opt) -> torch.optim.lr_scheduler.LambdaLR:
    return torch.optim.lr_scheduler.LambdaLR(
        opt, lambda epoch: lr_factor(cfg, epoch))


# ------------------------------------------------------- losses, metrics
def weighted_cross_entropy(pred: Tensor, y: Tensor,
                           mask: Optional[Tensor] = None) -> Tensor:
    """Cross-entropy with class weights ``(n - n_c) / n`` from the batch's
    label counts (rare classes weigh more; absent classes weigh 0), as the
    Benchmarking-GNNs SBM tasks are trained. ``mask`` (bool [N]) keeps the
    real nodes of a padded batch. No host sync (no ``bincount``)."""
    real = pred.new_ones(y.size(0)) if mask is None else mask.to(pred.dtype)
    counts = pred.new_zeros(pred.size(-1)).index_add_(0, y, real)
    total = counts.sum()
    weight = torch.where(counts > 0, (total - counts) / total,
                         torch.zeros_like(counts))
    if mask is None:
        return F.cross_entropy(pred, y, weight=weight)
    w = weight.index_select(0, y) * real
    nll = F.cross_entropy(pred, y, reduction='none')
    return (nll * w).sum() / w.sum()


def compute_loss(loss_fun: str, pred: Tensor, y: Tensor,
                 mask: Optional[Tensor] = None) -> Tensor:
    """The config's loss; ``mask`` (bool [N]) keeps the real nodes."""
    if loss_fun == 'weighted_cross_entropy':
        return weighted_cross_entropy(pred, y, mask)
    if mask is None:
        if loss_fun == 'cross_entropy':
            return F.cross_entropy(pred, y)
        if loss_fun == 'l1':
            return F.l1_loss(pred.view(-1), y.view(-1).float())
    else:
        real = mask.to(pred.dtype)
        if loss_fun == 'cross_entropy':
            nll = F.cross_entropy(pred, y, reduction='none')
        elif loss_fun == 'l1':
            nll = (pred.view(-1) - y.view(-1).to(pred.dtype)).abs()
        else:
            raise ValueError(f'unknown loss {loss_fun!r}')
        return (nll * real).sum() / real.sum()
    raise ValueError(f'unknown loss {loss_fun!r}')


def accuracy_sbm(pred_label: Tensor, y: Tensor) -> float:
    """Mean per-class recall over the classes present in ``y`` (the
    Benchmarking-GNNs "weighted accuracy" of PATTERN / CLUSTER)."""
    recalls = []
    for c in torch.unique(y):
        mask = y == c
        recalls.append((pred_label[mask] == c).float().mean().item())
    return float(np.mean(recalls)) if recalls else float('nan')


def compute_metric(metric: str, pred: Tensor, y: Tensor) -> float:
    if metric == 'mae':
        return (pred.view(-1) - y.view(-1).float()).abs().mean().item()
    label = pred.argmax(dim=-1)
    if metric == 'accuracy':
        return (label == y).float().mean().item()
    return accuracy_sbm(label, y)


class EpochStats:
    """Loss and metric of an epoch, accumulated on the device step by step
    (no host sync) and read once by :meth:`result`.

    Classification keeps a confusion matrix (``accuracy``: its trace;
    ``accuracy-SBM``: the mean recall of the classes present, as
    :func:`accuracy_sbm` of all the epoch's predictions), regression the
    sum of absolute errors. The tensors are updated in place, so that a
    captured step keeps updating them.
    """

    def __init__(self, metric: str, num_classes: int, device: torch.device):
        self.metric = metric
        self.num_classes = num_classes
        width = 1 if metric == 'mae' else num_classes * num_classes
        # [loss sum, graphs, nodes, abs error sum | confusion matrix]
        self.sums = torch.zeros(3 + width, dtype=torch.float64,
                                device=device)

    def reset(self) -> None:
        self.sums.zero_()

    def update(self, pred: Tensor, y: Tensor, loss: Tensor, graphs: Any,
               mask: Optional[Tensor] = None) -> None:
        """Adds a batch (``graphs``: int or 0-d tensor, the loss weight)."""
        pred, loss = pred.detach(), loss.detach()
        real = pred.new_ones(y.size(0)) if mask is None else \
            mask.to(pred.dtype)
        head = torch.stack([loss * graphs, loss.new_zeros(()) + graphs,
                            real.sum()]).to(self.sums.dtype)
        self.sums[:3] += head
        if self.metric == 'mae':
            err = (pred.view(-1) - y.view(-1).to(pred.dtype)).abs() * real
            self.sums[3:] += err.sum().to(self.sums.dtype)
        else:
            cell = y * self.num_classes + pred.argmax(dim=-1)
            self.sums[3:].index_add_(0, cell, real.to(self.sums.dtype))

    def result(self) -> Dict[str, float]:
        """``{'loss', 'metric', 'graphs', 'nodes'}`` (one host sync)."""
        sums = self.sums.cpu()
        loss_sum, graphs, nodes = (float(v) for v in sums[:3])
        rest = sums[3:]
        if self.metric == 'mae':
            metric = float(rest[0]) / nodes if nodes else float('nan')
        else:
            conf = rest.view(self.num_classes, self.num_classes)
            if self.metric == 'accuracy':
                metric = float(conf.trace() / conf.sum()) if nodes else \
                    float('nan')
            else:
                support = conf.sum(1)
                present = support > 0
                metric = float((conf.diagonal()[present] /
                                support[present]).mean()) \
                    if bool(present.any()) else float('nan')
        return {'loss': loss_sum / max(graphs, 1.0), 'metric': metric,
                'graphs': graphs, 'nodes': nodes}


# ------------------------------------------------------------------ loops
def _sync(device: torch.device) -> None:
    if device.type == 'cuda':
        torch.cuda.synchronize(device)


def train_step(model, optimizer, batch, cfg: Config,
               stats: EpochStats) -> None:
    """Forward, loss, metric update, backward, clipping and optimizer step
    of one batch: no host sync (and capturable) when the batch brings its
    format (device loader).

    The order suits ``torch.compile``, which splits the step where dynamo
    does not trace (``zero_grad``, ``backward``, the entry of
    ``optimizer.step``): gradients cleared first and the metrics (of the
    detached predictions) updated before the backward, so that forward,
    loss and metrics make one compiled graph."""
    optimizer.zero_grad(set_to_none=True)
    mask = getattr(batch, 'node_mask', None)
    pred = model(batch)
    loss = compute_loss(cfg.model.loss_fun, pred, batch.y, mask)
    stats.update(pred, batch.y, loss, _graph_weight(batch), mask)
    loss.backward()
    distributed.all_reduce_gradients(model)  # no-op in one process
    if cfg.optim.clip_grad_norm:
        torch.nn.utils.clip_grad_norm_(model.parameters(),
                                       cfg.optim.clip_grad_norm_value)
    optimizer.step()


def eval_step(model, batch, cfg: Config, stats: EpochStats) -> None:
    mask = getattr(batch, 'node_mask', None)
    pred = model(batch)
    loss = compute_loss(cfg.model.loss_fun, pred, batch.y, mask)
    stats.update(pred, batch.y, loss, _graph_weight(batch), mask)


def _graph_weight(batch) -> Any:
    # A device tensor in device-loader batches (a captured step replays
    # batches of different sizes), the host int of PyG's.
    count = getattr(batch, 'graph_count', None)
    return batch.num_graphs if count is None else count


def run_epoch(model, loader, cfg: Config, device: torch.device,
              stats: EpochStats, step: Optional[Callable] = None,
              desc: str = '') -> Dict[str, float]:
    """One pass over ``loader``; trains when ``step`` (``step(batch)``, a
    training step) is given, else evaluates. Nothing reads the device
    until the pass ends."""
    from tqdm import tqdm
    training = step is not None
    model.train(training)
    stats.reset()
    _sync(device)
    start = time.perf_counter()
    bar = tqdm(loader, desc=desc, leave=False, file=sys.stderr,
               disable=not cfg.train.progress_bar, dynamic_ncols=True)
    # Compute time (steps without batch loading): CUDA events around each
    # step on the GPU (read after the pass), host time on the CPU.
    events: List[Tuple[Any, Any]] = []
    compute = 0.0
    steps = 0
    with torch.set_grad_enabled(training):
        for batch in bar:
            steps += 1
            if not isinstance(batch, GraphBatch):  # PyG DataLoader's
                batch = batch.to(device, non_blocking=True)
            if device.type == 'cuda':
                events.append((torch.cuda.Event(enable_timing=True),
                               torch.cuda.Event(enable_timing=True)))
                events[-1][0].record()
            else:
                t0 = time.perf_counter()
            if training:
                step(batch)
            else:
                eval_step(model, batch, cfg, stats)
            if device.type == 'cuda':
                events[-1][1].record()
            else:
                compute += time.perf_counter() - t0
    distributed.all_reduce_(stats.sums)  # all ranks' batches
    result = stats.result()  # waits for the pass
    _sync(device)
    seconds = time.perf_counter() - start
    if events:
        compute = sum(a.elapsed_time(b) for a, b in events) / 1e3
    return {
        'loss': result['loss'], 'metric': result['metric'],
        'time_s': seconds, 'compute_time_s': compute,
        'steps': steps, 'graphs': result['graphs'],
        'graphs_per_s': result['graphs'] / seconds if seconds > 0 else
        float('nan'),
        'nodes_per_s': result['nodes'] / seconds if seconds > 0 else
        float('nan'),
    }


def _format_row(row: Dict[str, Any], header: bool = False) -> str:
    cols = [('epoch', 5, 'd'), ('train_loss', 10, '.4f'),
            ('train_metric', 12, '.4f'), ('val_loss', 8, '.4f'),
            ('val_metric', 10, '.4f'), ('test_metric', 11, '.4f'),
            ('lr', 9, '.2e'), ('epoch_time_s', 12, '.2f'),
            ('graphs_per_s', 12, '.1f')]
    if header:
        return ' '.join(f'{name:>{w}}' for name, w, _ in cols)
    out = []
    for name, w, fmt in cols:
        v = row.get(name)
        if v is None or (isinstance(v, float) and math.isnan(v)):
            out.append(f"{'-':>{w}}")
        else:
            out.append(f'{v:>{w}{fmt}}')
    return ' '.join(out)


def _atomic_save(obj: Any, path: str) -> None:
    tmp = path + '.tmp'
    torch.save(obj, tmp)
    os.replace(tmp, path)


class CheckpointError(RuntimeError):
    """A checkpoint that cannot be resumed from: unreadable, or not written
    by this runner."""


def load_checkpoint(path: str) -> Dict[str, Any]:
    """Reads a runner checkpoint with ``torch.load(weights_only=True)``
    (tensors on the CPU) and checks that it is one.

    Raises:
        CheckpointError: the file is corrupt, holds objects other than
            tensors and plain containers, or lacks the runner's keys.
    """
    try:
        ckpt = torch.load(path, map_location='cpu', weights_only=True)
    except Exception as e:  # truncated zip, bad pickle, forbidden globals
        first = str(e).strip().splitlines()[0] if str(e).strip() else ''
        raise CheckpointError(
            f"--resume: cannot read the checkpoint '{path}' as a tensors-only "
            f"(weights_only) file: {type(e).__name__}: {first}. It is "
            f"corrupt or was not written by this runner; delete it to start "
            f"over.") from e
    fmt = ckpt.get('format') if isinstance(ckpt, dict) else None
    missing = [k for k in CKPT_KEYS if not isinstance(ckpt, dict)
               or k not in ckpt]
    if missing or (fmt is not None and fmt != CKPT_FORMAT) or \
            not isinstance(ckpt['config'], dict):
        what = (f'format {fmt!r}' if fmt not in (None, CKPT_FORMAT) else
                f"no {missing}" if missing else 'a config that is no mapping')
        raise CheckpointError(
            f"--resume: '{path}' is not a pyg_dfgnn runner checkpoint "
            f"({what}); delete it to start over.")
    return ckpt


def _config_diff(a: Dict[str, Any], b: Dict[str, Any], prefix: str = '',
                 defaults: Optional[Dict[str, Any]] = None) -> List[str]:
    """Keys where checkpoint config ``a`` and config ``b`` differ. A key
    missing from ``a`` (a checkpoint older than the key) matches its
    default, which keeps the old behaviour."""
    if defaults is None:
        defaults = default_config().to_dict()
    keys = []
    for k in sorted(set(a) | set(b)):
        key = prefix + k
        va, vb, vd = a.get(k), b.get(k), defaults.get(k)
        if k not in a:
            va = vd
        va = canonical_value(key, va)  # e.g. an older 'train.capture: true'
        if isinstance(va, dict) and isinstance(vb, dict):
            keys += _config_diff(va, vb, key + '.',
                                 vd if isinstance(vd, dict) else {})
        elif va != vb and key not in RESUME_FREE_KEYS:
            keys.append(key)
    return keys


def _is_better(metric_agg: str, new: float, old: Optional[float]) -> bool:
    if old is None or (isinstance(old, float) and math.isnan(old)):
        return not math.isnan(new)
    return new > old if metric_agg == 'argmax' else new < old


def capture_mode(cfg: Config, device: torch.device) -> str:
    """How the training step runs (``train.capture``): ``'none'`` (eager),
    ``'graphs'`` (CUDA graphs: needs CUDA and the device loader) or
    ``'compile'`` (torch.compile: needs the device loader, any device).
    Both captured modes train on padded batches of a few fixed shapes."""
    # A bool set in code after loading still means none / graphs.
    mode = canonical_value('train.capture', cfg.train.capture)
    if mode == 'graphs' and (device.type != 'cuda' or
                             cfg.train.loader != 'device'):
        raise ConfigError("'train.capture' graphs (true) needs a CUDA device "
                          "and 'train.loader' device")
    if mode == 'compile' and cfg.train.loader != 'device':
        raise ConfigError("'train.capture' compile needs 'train.loader' "
                          "device (PyG's DataLoader gives every batch a "
                          "shape of its own: one compilation each)")
    return mode


def make_loaders(cfg: Config, bundle, device: torch.device, model,
                 order: torch.Generator, pad: bool = False):
    """``(train loader, {'val': ..., 'test': ...})``: PyG ``DataLoader``s
    (``train.loader: pyg``, collation on the host) or :class:`DeviceLoader`
    s over the splits concatenated on ``device`` (``device``: batches built
    there with the DF formats the model uses; ``pad``: training batches
    padded to size buckets for a captured step). Both draw the training
    order from ``order`` alike: the same graphs per batch."""
    from pyg_dfgnn.train.model import global_attn_impl
    _, glob = split_layer_type(cfg.gt.layer_type)
    # (raises here, before any epoch, for an impl the device cannot run)
    compiling = compiles_layers(cfg)
    global_attn_impl(cfg.gt.attn_impl, cfg.backend, device,
                     compiling=compiling)
    size = cfg.train.batch_size
    if cfg.train.loader == 'pyg':
        from torch_geometric.loader import DataLoader
        from torch.utils.data import RandomSampler
        kw = dict(batch_size=size, num_workers=cfg.train.num_workers,
                  persistent_workers=cfg.train.num_workers > 0,
                  pin_memory=device.type == 'cuda')
        # ``order`` gives the sampler's permutation alone, one per epoch as
        # the device loader draws it. A loader's own generator draws its
        # workers' base seed when an iterator starts -- once per run with
        # persistent workers, again after a resume -- so it is another one
        # (not ``order``: every later epoch's order would shift; not the
        # global one: every later dropout mask would).
        def workers() -> torch.Generator:
            return torch.Generator().manual_seed(cfg.seed)

        return (DataLoader(bundle.train, sampler=RandomSampler(
            bundle.train, generator=order), generator=workers(), **kw),
                {split: DataLoader(ds, shuffle=False, generator=workers(),
                                   **kw)
                 for split, ds in (('val', bundle.val),
                                   ('test', bundle.test))})
    stores = {split: GraphStore(ds, device)
              for split, ds in bundle.splits().items()}
    width = max(s.max_graph_nodes for s in stores.values())
    for s in stores.values():  # one dense width for every split
        s.max_nodes = width
    pieces = cfg.train.windows_per_graph or auto_windows_per_graph(
        size, stores['train'].max_graph_nodes, device)
    kw: Dict[str, Any] = dict(
        dfgraph=model.local_takes_dfgraph and stores['train'].sorted,
        windows_per_graph=pieces)
    # Batches carry the attention graph where the global attention runs
    # 'fused': training resolves 'auto' with its attention dropout (on
    # CUDA 'fused' for heads fused_attention_pays takes, as the layers
    # resolve it from their own head width), evaluation without.
    def attention(dropout: float) -> bool:
        return glob == 'Transformer' and global_attn_impl(
            cfg.gt.attn_impl, cfg.backend, device, compiling=compiling,
            dropout=dropout,
            head_dim=cfg.gt.dim_hidden // cfg.gt.n_heads) == 'fused'

    train_loader = DeviceLoader(
        stores['train'], size, shuffle=True, generator=order, pad=pad,
        num_slots=size if pad else None,
        attention=attention(cfg.gt.attn_dropout), **kw)
    return train_loader, {split: DeviceLoader(
        stores[split], size, attention=attention(0.0), **kw)
        for split in ('val', 'test')}


def count_parameters(model) -> int:
    return sum(p.numel() for p in model.parameters())


def train(cfg: Config, resume: bool = False, bundle=None,
          stop_after_epochs: Optional[int] = None,
          log: Callable[[str], None] = print) -> Dict[str, Any]:
    """Trains per ``cfg``; returns (and writes) the results dict.

    Args:
        cfg: a validated :class:`Config`.
        resume: continue from ``ckpt/last.pt`` of the run folder.
        bundle: prebuilt :class:`~pyg_dfgnn.datasets.DatasetBundle` (else
            built from ``cfg.dataset``).
        stop_after_epochs: stop (as if interrupted) after this many epochs of
            this call; for testing ``resume``.
        log: where the table rows go.
    """
    from pyg_dfgnn.datasets import build_datasets
    from pyg_dfgnn.train.model import build_model

    if cfg.wandb.use:
        log('note: wandb logging is not supported; wandb.use is ignored')
    if cfg.num_threads:
        torch.set_num_threads(cfg.num_threads)
    dctx = distributed.init(cfg.device)  # torchrun: join its ranks
    device = dctx.device if dctx.enabled else resolve_device(cfg)
    log = dctx.rank0(log)
    if not dctx.is_main:
        cfg.train.progress_bar = False
    set_seed(cfg.seed)
    if bundle is None:
        with distributed.main_first():  # rank 0 generates and caches
            bundle = build_datasets(cfg)
    if getattr(bundle, 'dim_edge', None) is not None and \
            not cfg.dataset.edge_encoder:
        log('note: the dataset has edge_attr, unused without '
            'dataset.edge_encoder')
    set_seed(cfg.seed)  # model init independent of dataset generation
    model = build_model(cfg, bundle.dim_in, bundle.dim_out,
                        bundle.num_node_types,
                        getattr(bundle, 'dim_edge', None),
                        getattr(bundle, 'num_edge_types', None)).to(device)
    distributed.broadcast_parameters(model)
    capture = capture_mode(cfg, device)
    optimizer = make_optimizer(cfg, model.parameters(), capture)
    scheduler = make_scheduler(cfg, optimizer)

    out = run_dir(cfg)
    ckpt_path = osp.join(out, 'ckpt', 'last.pt')
    history: List[Dict[str, Any]] = []
    best: Optional[Dict[str, Any]] = None
    start_epoch = 0
    if resume:
        if not osp.exists(ckpt_path):
            raise FileNotFoundError(
                f"--resume: no checkpoint at '{ckpt_path}' (run without "
                f"--resume first, with the same config)")
        ckpt = load_checkpoint(ckpt_path)
        diff = _config_diff(ckpt['config'], cfg.to_dict())
        if diff:
            raise ConfigError(f"--resume: the config differs from the "
                              f"checkpoint's in {diff}")
        model.load_state_dict(ckpt['model'])
        optimizer.load_state_dict(ckpt['optimizer'])
        scheduler.load_state_dict(ckpt['scheduler'])
        history, best = ckpt['history'], ckpt['best']
        start_epoch = ckpt['epoch'] + 1
        torch.set_rng_state(ckpt['rng_cpu'])
        if device.type == 'cuda' and ckpt.get('rng_cuda') is not None:
            torch.cuda.set_rng_state(ckpt['rng_cuda'], device)
        log(f'resumed from {ckpt_path} at epoch {start_epoch}')
    os.makedirs(osp.join(out, 'ckpt'), exist_ok=True)
    if dctx.is_main:
        with open(osp.join(out, 'config.yaml'), 'w') as f:
            f.write(dump_config(cfg))

    order = torch.Generator()
    train_loader, eval_loaders = make_loaders(cfg, bundle, device, model,
                                              order, pads_batches(cfg))
    train_loader, eval_loaders = distributed.shard_loaders(
        train_loader, eval_loaders, mode=cfg.train.ddp_batch)
    stats = {split: EpochStats(cfg.metric_best, bundle.dim_out, device)
             for split in ('train', 'val', 'test')}

    def step(batch) -> None:
        train_step(model, optimizer, batch, cfg, stats['train'])

    if capture != 'none':
        from pyg_dfgnn.train.capture import wrap_step
        step = wrap_step(capture, step, optimizer, device,
                         static=(stats['train'].sums, ))

    fused = None  # whether the DF convs run the fused CUDA kernels
    if cfg.backend == 'dfgnn' and device.type == 'cuda':
        try:  # load (or JIT-build) now, so epoch 0 does not time the build
            from pyg_dfgnn.ops import cuda as df_cuda
            fused = bool(df_cuda.available())
        except Exception as e:  # pragma: no cover - depends on the build
            log(f'warning: fused kernels failed to load: {e}')
            fused = False
        log('fused CUDA kernels: ' + ('loaded' if fused else
                                      'NOT available, reference path'))
    num_params = count_parameters(model)
    extras = ''
    if cfg.gt.local_attn_dropout:
        extras += f', local attn dropout {cfg.gt.local_attn_dropout}'
    if cfg.dataset.edge_encoder:
        extras += f', edge features {cfg.dataset.edge_encoder_name}'
    log(f"run {cfg.name}: {cfg.gt.layer_type} x{cfg.gt.layers}, "
        f"dim {cfg.gt.dim_hidden}{extras}, backend {cfg.backend}, device "
        f"{device}, {num_params} params, data {cfg.dataset.format}/"
        f"{cfg.dataset.name} {len(bundle.train)}/{len(bundle.val)}/"
        f"{len(bundle.test)} graphs")
    if dctx.enabled:
        per_rank = distributed.per_rank_batch_size(
            cfg.train.batch_size, dctx, cfg.train.ddp_batch)
        log(f'data parallel: {dctx.world_size} ranks x {per_rank} graphs '
            f'per step (train.ddp_batch {cfg.train.ddp_batch}), '
            f'{len(train_loader)} steps per epoch')
    log(_format_row({}, header=True))
    for row in history:
        log(_format_row(row))
    t_run = time.perf_counter()
    done = 0
    for epoch in range(start_epoch, cfg.optim.max_epoch):
        order.manual_seed(cfg.seed * 1_000_003 + epoch)
        lr = float(optimizer.param_groups[0]['lr'])
        tr = run_epoch(model, train_loader, cfg, device, stats['train'],
                       step, desc=f'epoch {epoch} train')
        scheduler.step()
        row: Dict[str, Any] = {
            'epoch': epoch, 'train_loss': tr['loss'],
            'train_metric': tr['metric'], 'lr': lr,
            'epoch_time_s': tr['time_s'],
            'compute_time_s': tr['compute_time_s'],
            'graphs_per_s': tr['graphs_per_s'],
            'nodes_per_s': tr['nodes_per_s'],
            # This rank's steps; the graphs of all ranks together.
            'train_steps': tr['steps'], 'train_graphs': tr['graphs'],
        }
        if hasattr(step, 'captures'):  # so far: new ones mean warm-up time
            row['captures'] = step.captures
        last = epoch == cfg.optim.max_epoch - 1
        if (epoch + 1) % cfg.train.eval_period == 0 or last:
            eval_time = 0.0
            distributed.broadcast_buffers(model)
            for split, loader in eval_loaders.items():
                ev = run_epoch(model, loader, cfg, device, stats[split],
                               desc=f'epoch {epoch} {split}')
                row[f'{split}_loss'] = ev['loss']
                row[f'{split}_metric'] = ev['metric']
                eval_time += ev['time_s']
            row['eval_time_s'] = eval_time
            if _is_better(cfg.metric_agg, row['val_metric'],
                          None if best is None else best['val_metric']):
                best = dict(row)
        history.append(row)
        log(_format_row(row))
        done += 1
        stop = stop_after_epochs is not None and done >= stop_after_epochs
        limit = cfg.train.time_limit_s
        if limit and time.perf_counter() - t_run >= limit and not last:
            stop = True
            log(f'time limit {limit:.0f}s reached after epoch {epoch}; ' + (
                'continue with --resume' if cfg.train.enable_ckpt else
                'no checkpoint (train.enable_ckpt is false): it cannot be '
                'resumed'))
        stop = distributed.any_rank(stop)  # ranks stop together
        if cfg.train.enable_ckpt and dctx.is_main and (
                (epoch + 1) % cfg.train.ckpt_period == 0 or last or stop):
            _atomic_save({
                'format': CKPT_FORMAT, 'config': cfg.to_dict(),
                'epoch': epoch,
                'model': model.state_dict(),
                'optimizer': optimizer.state_dict(),
                'scheduler': scheduler.state_dict(),
                'history': history, 'best': best,
                'rng_cpu': torch.get_rng_state(),
                'rng_cuda': (torch.cuda.get_rng_state(device)
                             if device.type == 'cuda' else None),
            }, ckpt_path)
        if stop:
            break

    finished = bool(history) and history[-1]['epoch'] == \
        cfg.optim.max_epoch - 1
    results = {
        'name': cfg.name, 'backend': cfg.backend, 'seed': cfg.seed,
        'device': str(device),
        'device_name': (torch.cuda.get_device_name(device)
                        if device.type == 'cuda' else 'cpu'),
        'torch': torch.__version__, 'num_params': num_params,
        'fused_kernels': fused,
        'metric': cfg.metric_best, 'epochs_done': len(history),
        'finished': finished, 'wall_time_s': time.perf_counter() - t_run,
        'best': best, 'final': history[-1] if history else None,
        'history': history, 'config': cfg.to_dict(),
        'dataset_sizes': {'train': len(bundle.train), 'val': len(bundle.val),
                          'test': len(bundle.test)},
        'world_size': dctx.world_size,
    }
    if not dctx.is_main:
        return results
    with open(osp.join(out, 'results.json'), 'w') as f:
        json.dump(results, f, indent=2)
    with open(osp.join(out, 'epochs.csv'), 'w', newline='') as f:
        writer = csv.DictWriter(f, fieldnames=CSV_FIELDS,
                                extrasaction='ignore')
        writer.writeheader()
        for row in history:
            writer.writerow({k: row.get(k, '') for k in CSV_FIELDS})
    if best is not None:
        log(f"best epoch {best['epoch']}: val {cfg.metric_best} "
            f"{best['val_metric']:.4f}, test {best['test_metric']:.4f}")
    log(f'results: {osp.join(out, "results.json")}')
    return results

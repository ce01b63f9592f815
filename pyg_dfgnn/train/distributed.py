"""Data-parallel training over ``torch.distributed``, one process per GPU.

``torchrun --nproc_per_node=N -m pyg_dfgnn train --cfg ...`` starts N
processes; :func:`init` reads torchrun's environment (``WORLD_SIZE``,
``RANK``, ``LOCAL_RANK``, ``MASTER_ADDR`` / ``MASTER_PORT``) and joins the
process group: NCCL on GPUs (NVLink multicast off, ``NCCL_NVLS_ENABLE=0``:
on shared hosts it can take GPUs out of service), gloo on CPUs. Without
torchrun (``WORLD_SIZE`` unset or 1) everything here is a no-op and a run
is the plain one-process run.

What a data-parallel run needs besides ``DistributedDataParallel``:

* the training order split over ranks so that each optimizer step sees,
  over all ranks together, the batch a one-process run would see
  (:class:`ShardedOrder`; ``train.batch_size`` stays the global batch);
  or, with ``train.ddp_batch: per_rank`` (weak scaling), each rank takes
  ``batch_size`` samples per step, so that the global batch grows with the
  ranks and an epoch takes ``1 / world_size`` of the steps (the same
  sharded order: every sample still once per epoch);
* metrics over the whole split, not one rank's part (:func:`reduce_sums`,
  :func:`reduce_metric`);
* one writer: logs, progress bars, results and checkpoints on rank 0
  (:attr:`DistContext.is_main`), the others wait at a barrier.
"""
from __future__ import annotations

import datetime
import os
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Any, Callable, Dict, Iterator, List, Optional

import torch
import torch.distributed as dist
from torch import Tensor
from torch.utils.data import Sampler


@dataclass
class DistContext:
    """Where this process stands in the run (``world_size == 1``: alone)."""
    rank: int = 0
    world_size: int = 1
    local_rank: int = 0
    device: torch.device = field(default_factory=lambda: torch.device('cpu'))
    backend: Optional[str] = None

    @property
    def enabled(self) -> bool:
        return self.world_size > 1

    @property
    def is_main(self) -> bool:
        return self.rank == 0

    def rank0(self, fn: Callable[..., None]) -> Callable[..., None]:
        """``fn`` on rank 0, a no-op elsewhere (logging)."""
        if self.is_main:
            return fn
        return lambda *args, **kwargs: None

    def barrier(self) -> None:
        if self.enabled:
            if self.backend == 'nccl':
                dist.barrier(device_ids=[self.device.index])
            else:
                dist.barrier()


#: The context of this process's run (set by :func:`init`).
_current = DistContext()


def current() -> DistContext:
    return _current


def world_size_from_env() -> int:
    return int(os.environ.get('WORLD_SIZE', '1'))


def init(device: str = 'auto', timeout_s: float = 600.0) -> DistContext:
    """Joins torchrun's process group, or returns the one-process context.

    Args:
        device: ``'auto'`` (a GPU per process if there are enough, else the
            CPU), ``'cuda'`` or ``'cpu'``.
        timeout_s: how long a collective waits for the other ranks before
            it fails (a crashed rank ends the run instead of hanging it).
    """
    global _current
    world = world_size_from_env()
    want_cuda = device in ('auto', 'cuda') and torch.cuda.is_available()
    if world <= 1:
        dev = torch.device('cuda' if want_cuda else 'cpu') \
            if device == 'auto' else torch.device(device)
        if dev.type == 'cuda' and dev.index is None and want_cuda:
            # Indexed, as the device of the tensors made on it.
            dev = torch.device('cuda', torch.cuda.current_device())
        _current = DistContext(device=dev)
        return _current
    rank = int(os.environ['RANK'])
    local_rank = int(os.environ.get('LOCAL_RANK', rank))
    if device == 'cuda' and torch.cuda.device_count() <= local_rank:
        raise RuntimeError(
            f'rank {rank} needs GPU {local_rank} but this machine has '
            f'{torch.cuda.device_count()}: start at most that many '
            f'processes per node (torchrun --nproc_per_node)')
    # 'auto' decides alike on every rank (one backend for the group): the
    # GPUs if every process of the node gets one, else the CPU for all.
    local_world = int(os.environ.get('LOCAL_WORLD_SIZE', world))
    use_cuda = want_cuda and torch.cuda.device_count() >= (
        local_world if device == 'auto' else local_rank + 1)
    if use_cuda:
        # Before NCCL's first communicator: multicast off (see the module
        # docstring), whatever the caller's environment says.
        os.environ['NCCL_NVLS_ENABLE'] = '0'
        os.environ['TORCH_SYMM_MEM_DISABLE_MULTICAST'] = '1'
        dev = torch.device('cuda', local_rank)
        torch.cuda.set_device(dev)
        backend = 'nccl'
    else:
        dev, backend = torch.device('cpu'), 'gloo'
    if not dist.is_initialized():
        dist.init_process_group(
            backend, timeout=datetime.timedelta(seconds=timeout_s),
            device_id=dev if use_cuda else None)
    _current = DistContext(rank=dist.get_rank(),
                           world_size=dist.get_world_size(),
                           local_rank=local_rank, device=dev,
                           backend=backend)
    return _current


def shutdown(ctx: Optional[DistContext] = None) -> None:
    """Leaves the process group. Delete DDP models first: a DDP reducer
    destroyed after its group can hang the process at exit."""
    global _current
    ctx = ctx or _current
    if ctx.enabled and dist.is_initialized():
        dist.destroy_process_group()
    _current = DistContext()


def wrap_model(model: torch.nn.Module,
               ctx: DistContext) -> torch.nn.Module:
    """``DistributedDataParallel(model)`` when the run has several ranks.

    Rank 0's initial weights and buffers are broadcast by DDP, so ranks
    agree even if their initialisation differed."""
    if not ctx.enabled:
        return model
    from torch.nn.parallel import DistributedDataParallel
    return DistributedDataParallel(
        model, device_ids=[ctx.local_rank] if ctx.device.type == 'cuda'
        else None)


def unwrap(model: torch.nn.Module) -> torch.nn.Module:
    """The module inside DDP (what checkpoints store)."""
    return getattr(model, 'module', model)


def rank_share(order: Tensor, ctx: DistContext, pad: bool = True
               ) -> Tensor:
    """This rank's part of ``order`` (the same on every rank), taken by
    stride. ``pad``: first wrapped around (as often as needed: fewer
    samples than ranks) to a multiple of ``world_size``, so that every rank
    gets as many samples, hence steps."""
    world, n = ctx.world_size, order.numel()
    if pad and n % world:
        order = torch.cat([order, order.repeat(-(-world // n))[
            :world - n % world]])
    return order[ctx.rank::world]


class ShardedOrder(Sampler):
    r"""This rank's part of a training order, for a DataLoader with
    ``batch_size = global_batch // world_size`` (``ddp_batch`` global) or
    ``batch_size`` (``per_rank``: the global batch is ``batch_size *
    world_size``; the split is the same).

    ``order_fn(epoch)`` gives the order of all ``n`` samples (the same on
    every rank: drawn from the seed and the epoch). It is padded by wrapping
    around to a multiple of ``world_size`` and split by stride, so step ``s``
    of every rank together covers the order's slice ``[s*B, (s+1)*B)`` of
    the global batch ``B``: a one-process run with batch ``B`` and the same
    order sees the same samples per step. Every rank gets the same number of
    samples, hence of steps (a rank with a step less would hang the others
    in the gradient all-reduce).
    """
    def __init__(self, n: int, order_fn: Callable[[int], Tensor],
                 ctx: DistContext) -> None:
        self.n, self.order_fn, self.ctx = n, order_fn, ctx
        self.epoch = 0

    def set_epoch(self, epoch: int) -> None:
        self.epoch = epoch

    def __len__(self) -> int:
        return -(-self.n // self.ctx.world_size)

    def __iter__(self) -> Iterator[int]:
        return iter(rank_share(self.order_fn(self.epoch), self.ctx).tolist())


#: How ``batch_size`` is read under torchrun (``train.ddp_batch``).
DDP_BATCH_MODES = ('global', 'per_rank')


def per_rank_batch_size(batch_size: int, ctx: DistContext,
                        mode: str = 'global') -> int:
    """The batch each rank takes per step. ``mode`` ``'global'``:
    ``batch_size`` is the global batch, each rank takes an equal part
    (strong scaling: the steps per epoch of one process); ``'per_rank'``:
    each rank takes ``batch_size`` (weak scaling: the global batch is
    ``batch_size * world_size``, the steps per epoch divided by
    ``world_size``)."""
    from pyg_dfgnn.train.config import ConfigError
    if mode not in DDP_BATCH_MODES:
        raise ConfigError(f'ddp_batch must be one of {DDP_BATCH_MODES}, '
                          f'got {mode!r}')
    if mode == 'per_rank':
        return batch_size
    if batch_size % ctx.world_size:
        raise ConfigError(
            f'train.batch_size {batch_size} is the global batch and must be '
            f'divisible by the {ctx.world_size} processes; use a multiple of '
            f'{ctx.world_size}')
    return batch_size // ctx.world_size


def reduce_sums(values: Dict[str, float],
                ctx: DistContext) -> Dict[str, float]:
    """Sums each value over the ranks (one all-reduce)."""
    if not ctx.enabled:
        return dict(values)
    keys = sorted(values)
    t = torch.tensor([float(values[k]) for k in keys], dtype=torch.float64,
                     device=ctx.device)
    dist.all_reduce(t)
    return dict(zip(keys, t.tolist()))


def metric_counts(metric: str, pred: Tensor, y: Tensor) -> Tensor:
    """The sums a metric is made of, so that ranks can add theirs up:
    ``mae``: [|error| sum, count]; ``accuracy``: [correct, count];
    ``accuracy-SBM``: [correct per class | count per class]."""
    if metric == 'mae':
        err = (pred.view(-1) - y.view(-1).float()).abs()
        return torch.stack([err.sum().double(),
                            torch.tensor(float(err.numel()),
                                         dtype=torch.float64,
                                         device=err.device)])
    label = pred.argmax(dim=-1)
    if metric == 'accuracy':
        return torch.tensor([float((label == y).sum()), float(y.numel())],
                            dtype=torch.float64, device=pred.device)
    k = pred.size(-1)
    total = torch.bincount(y, minlength=k)[:k]
    correct = torch.bincount(y[label == y], minlength=k)[:k]
    return torch.cat([correct, total]).double()


def metric_from_counts(metric: str, counts: Tensor) -> float:
    if metric in ('mae', 'accuracy'):
        return float(counts[0] / counts[1]) if counts[1] > 0 \
            else float('nan')
    correct, total = counts.view(2, -1)
    present = total > 0  # mean recall over the classes present
    if not bool(present.any()):
        return float('nan')
    return float((correct[present] / total[present]).mean())


def reduce_metric(metric: str, pred: Tensor, y: Tensor,
                  ctx: DistContext) -> float:
    """``metric`` over all ranks' ``(pred, y)``: each rank's sums
    (:func:`metric_counts`) all-reduced, then the metric of the total —
    what one process would compute on the concatenation."""
    counts = metric_counts(metric, pred, y).to(ctx.device)
    if ctx.enabled:
        dist.all_reduce(counts)
    return metric_from_counts(metric, counts.cpu())


def all_ranks_ok(ok: bool, ctx: DistContext) -> bool:
    """Whether every rank says ``ok`` (so that all stop together)."""
    if not ctx.enabled:
        return ok
    t = torch.tensor([0.0 if ok else 1.0], device=ctx.device)
    dist.all_reduce(t)
    return bool(t.item() == 0)


def broadcast_objects(objects: List, ctx: DistContext) -> List:
    """Rank 0's ``objects`` on every rank."""
    if ctx.enabled:
        dist.broadcast_object_list(objects, src=0)
    return objects


# ------------------------------------------------------ runner integration
# The runner's step is sync-free and may be captured as a CUDA graph, so
# gradients are averaged by one all-reduce of a flat buffer between the
# backward and the clipping (what DDP computes, without its autograd hooks;
# NCCL collectives can be captured), rather than by wrapping the model.
def broadcast_parameters(model: torch.nn.Module,
                         ctx: Optional[DistContext] = None) -> None:
    """Rank 0's parameters and buffers on every rank (as DDP starts)."""
    ctx = ctx or _current
    if not ctx.enabled:
        return
    with torch.no_grad():
        for t in list(model.parameters()) + list(model.buffers()):
            dist.broadcast(t.data, src=0)


def broadcast_buffers(model: torch.nn.Module,
                      ctx: Optional[DistContext] = None) -> None:
    """Rank 0's buffers (batch-norm statistics) on every rank, before an
    evaluation, as DDP broadcasts them before each forward."""
    ctx = ctx or _current
    if ctx.enabled:
        for t in model.buffers():
            dist.broadcast(t.data, src=0)


def all_reduce_gradients(model: torch.nn.Module,
                         ctx: Optional[DistContext] = None) -> None:
    """Averages the gradients over the ranks, one all-reduce per dtype (a
    missing gradient counts as zeros, so that every rank sends the same
    buffer)."""
    ctx = ctx or _current
    if not ctx.enabled:
        return
    groups: Dict[torch.dtype, List[torch.nn.Parameter]] = {}
    for p in model.parameters():
        if p.requires_grad:
            groups.setdefault(p.dtype, []).append(p)
    for params in groups.values():
        flat = torch.cat([(p.grad if p.grad is not None
                           else torch.zeros_like(p)).reshape(-1)
                          for p in params])
        dist.all_reduce(flat)
        flat.div_(ctx.world_size)
        offset = 0
        for p in params:
            view = flat[offset:offset + p.numel()].view_as(p)
            offset += p.numel()
            if p.grad is None:
                p.grad = view.clone()
            else:
                p.grad.copy_(view)


@contextmanager
def main_first(ctx: Optional[DistContext] = None) -> Iterator[None]:
    """Rank 0 runs the block first (it generates and caches a dataset),
    the other ranks after it (they read the cache): no two processes write
    the same files."""
    ctx = ctx or _current
    if ctx.enabled and not ctx.is_main:
        ctx.barrier()
    yield
    if ctx.enabled and ctx.is_main:
        ctx.barrier()


def all_reduce_(t: Tensor, ctx: Optional[DistContext] = None) -> Tensor:
    """Sums ``t`` over the ranks in place (epoch statistics)."""
    ctx = ctx or _current
    if ctx.enabled:
        dist.all_reduce(t)
    return t


def any_rank(flag: bool, ctx: Optional[DistContext] = None) -> bool:
    """Whether any rank says ``flag`` (a stop decision all ranks share)."""
    ctx = ctx or _current
    return flag if not ctx.enabled else not all_ranks_ok(not flag, ctx)


class ShardedDeviceLoader:
    r"""A :class:`~pyg_dfgnn.train.batching.DeviceLoader`'s batches split
    over the ranks: the loader's order (the same on every rank) cut as
    :class:`ShardedOrder` cuts it, ``batch_size // world_size`` graphs per
    rank and step (``mode`` ``'per_rank'``: ``batch_size``). Training
    orders are padded by wrap-around to equal step counts (the gradient
    all-reduce needs them); evaluation orders are not, so that every graph
    counts once (evaluation has no collective per batch)."""
    def __init__(self, loader: Any, ctx: DistContext, pad: bool,
                 mode: str = 'global') -> None:
        self.loader, self.ctx, self.pad = loader, ctx, pad
        self.batch_size = per_rank_batch_size(loader.batch_size, ctx, mode)

    def __len__(self) -> int:
        n = len(self.loader.store)
        n = -(-n // self.ctx.world_size) if self.pad else len(
            range(self.ctx.rank, n, self.ctx.world_size))
        return -(-n // self.batch_size)

    def __iter__(self):
        loader = self.loader
        order = rank_share(loader.order(), self.ctx, self.pad)
        order_dev = order.to(loader.store.device)
        kw = dict(loader.batch_kwargs)
        if kw.get('num_slots') is not None:  # padded: a rank's batch size
            kw['num_slots'] = self.batch_size
        for start in range(0, order.numel(), self.batch_size):
            yield loader.store.batch(
                order[start:start + self.batch_size],
                order_dev[start:start + self.batch_size], **kw)


def shard_loaders(train_loader: Any, eval_loaders: Dict[str, Any],
                  ctx: Optional[DistContext] = None, mode: str = 'global'):
    """The runner's loaders, each rank its part (unchanged alone): device
    loaders by :class:`ShardedDeviceLoader`, PyG ``DataLoader`` s by a
    :class:`ShardedOrder` sampler that draws the order as ``DataLoader``
    draws it (same generator, same draws). ``mode``
    (``train.ddp_batch``): what the loaders' ``batch_size`` means, see
    :func:`per_rank_batch_size`; the order and its split do not depend on
    it."""
    ctx = ctx or _current
    if not ctx.enabled:
        return train_loader, eval_loaders
    if hasattr(train_loader, 'store'):
        return (ShardedDeviceLoader(train_loader, ctx, pad=True, mode=mode),
                {k: ShardedDeviceLoader(v, ctx, pad=False, mode=mode)
                 for k, v in eval_loaders.items()})
    return (_sharded_dataloader(train_loader, ctx, shuffle=True, mode=mode),
            {k: _sharded_dataloader(v, ctx, shuffle=False, mode=mode)
             for k, v in eval_loaders.items()})


def _sharded_dataloader(loader: Any, ctx: DistContext, shuffle: bool,
                        mode: str = 'global'):
    from torch.utils.data import DataLoader

    n = len(loader.dataset)
    # The runner's sampler holds the order's generator; the loader's own
    # draws the workers' seeds (make_loaders).
    gen = getattr(loader.sampler, 'generator', None) if shuffle else None

    def order_fn(epoch: int) -> Tensor:
        # RandomSampler's permutation from the order's generator
        return torch.randperm(n, generator=gen) if shuffle else \
            torch.arange(n)

    if shuffle:
        sampler = ShardedOrder(n, order_fn, ctx)
    else:  # evaluation: every sample once, no padding
        sampler = list(range(ctx.rank, n, ctx.world_size))
    return DataLoader(loader.dataset,
                      batch_size=per_rank_batch_size(loader.batch_size, ctx,
                                                     mode),
                      sampler=sampler, generator=loader.generator,
                      num_workers=loader.num_workers,
                      collate_fn=loader.collate_fn,
                      pin_memory=loader.pin_memory,
                      persistent_workers=loader.persistent_workers)

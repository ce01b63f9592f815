"""Node classification on a Reddit-size graph with sampled mini-batches.

Each step samples the ``--fanout`` neighbourhood of a batch of training
nodes (``pyg_dfgnn.sampler.NeighborSampler`` in a PyG ``NodeLoader``: plain
tensor ops on the graph's device, the ``NeighborLoader`` batch layout), then
runs a 2-layer attention GNN of DF-GNN convs on it, each layer on its
hop-trimmed bipartite graph ``((x_src, x_dst), edge_index)``. The DF-GNN
format (CSR with self-loops, CSC for the backward) is built per batch; the
run reports the time of sampling, of that build and of the training step
apart, so one sees which one bounds the epoch.

One GPU, or several with DDP (the global ``--batch-size`` split over ranks;
with ``--per-rank-batch`` each rank samples ``--batch-size`` seeds per step,
so an epoch takes ``1 / world_size`` of the steps)::

    python examples/sampled_reddit.py --epochs 3
    torchrun --nproc_per_node=2 examples/sampled_reddit.py --epochs 3
    torchrun --nproc_per_node=2 examples/sampled_reddit.py --epochs 3 \
        --per-rank-batch
    python examples/sampled_reddit.py --scale 0.01 --avg-degree 20 \
        --device cpu --epochs 1          # small, on a CPU

``--backend pyg`` runs the same model with PyG's convs.
"""
from __future__ import annotations

import argparse
import os.path as osp
import sys
import time
from typing import Any, Dict

import torch
import torch.nn.functional as F

sys.path.insert(0, osp.dirname(osp.abspath(__file__)))

from common import (GIB, AttentionGNN, OutOfMemory, Phases,  # noqa: E402
                    build_formats, gpu_name, memory_guard, write_json)

from pyg_dfgnn.datasets.reddit_like import reddit_like  # noqa: E402
from pyg_dfgnn.sampler import neighbor_loader  # noqa: E402
from pyg_dfgnn.train import distributed  # noqa: E402


def parse_args(argv=None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split('\n')[0])
    p.add_argument('--scale', type=float, default=1.0,
                   help='graph size relative to Reddit (1.0: 232,965 nodes, '
                   '114.6M edges)')
    p.add_argument('--avg-degree', type=float, default=None,
                   help="mean degree (default: Reddit's, ~492)")
    p.add_argument('--conv', choices=('gat', 'transformer'), default='gat')
    p.add_argument('--backend', choices=('dfgnn', 'pyg'), default='dfgnn')
    p.add_argument('--hidden', type=int, default=128)
    p.add_argument('--heads', type=int, default=4)
    p.add_argument('--fanout', default='25,10',
                   help='neighbours per hop, comma-separated (-1: all)')
    p.add_argument('--batch-size', type=int, default=1024,
                   help='seed nodes per step over all ranks (with '
                   '--per-rank-batch: per rank)')
    p.add_argument('--per-rank-batch', action='store_true',
                   help='weak scaling under torchrun: each rank samples '
                   '--batch-size seeds per step (global batch x world '
                   'size, steps per epoch / world size); default: '
                   '--batch-size is split over the ranks')
    p.add_argument('--epochs', type=int, default=1)
    p.add_argument('--max-steps', type=int, default=0,
                   help='stop each epoch after this many steps (0: all)')
    p.add_argument('--eval-batches', type=int, default=0,
                   help='evaluate on this many batches per split (0: all)')
    p.add_argument('--lr', type=float, default=3e-3)
    p.add_argument('--dropout', type=float, default=0.3)
    p.add_argument('--seed', type=int, default=0)
    p.add_argument('--device', default='auto')
    p.add_argument('--json', default=None, help='write the results here')
    return p.parse_args(argv)


@torch.no_grad()
def evaluate(net, loader, ctx, max_batches: int) -> float:
    net.eval()
    counts = torch.zeros(2, dtype=torch.float64, device=ctx.device)
    for i, batch in enumerate(loader):
        if max_batches and i >= max_batches:
            break
        edges = net.layer_edges(batch.edge_index, batch.num_sampled_nodes,
                                batch.num_sampled_edges)
        out = net.forward_sampled(batch.x, edges)
        y = batch.y[:batch.batch_size]
        counts += torch.stack([(out.argmax(-1) == y).sum().double(),
                               torch.tensor(float(y.numel()),
                                            dtype=torch.float64,
                                            device=ctx.device)])
    total = distributed.reduce_sums({'correct': float(counts[0]),
                                     'n': float(counts[1])}, ctx)
    return total['correct'] / max(total['n'], 1.0)


def train_epoch(model, net, loader, optimizer, ctx, args) -> Dict[str, Any]:
    """One epoch; ``model`` is ``net`` as it trains (DDP or not)."""
    model.train()
    phases = Phases(ctx.device)
    loss_sum = correct = seen = steps = 0.0
    t0 = time.perf_counter()
    it = iter(loader)
    while True:
        if args.max_steps and steps >= args.max_steps:
            break
        with phases('sample'):
            batch = next(it, None)
        if batch is None:
            break
        edges = net.layer_edges(batch.edge_index, batch.num_sampled_nodes,
                                batch.num_sampled_edges)
        if args.backend == 'dfgnn':
            with phases('format'):
                build_formats(net, edges, batch.x.device)
        with phases('step'):
            out = model(batch.x, edges)
            y = batch.y[:batch.batch_size]
            loss = F.cross_entropy(out, y)
            optimizer.zero_grad(set_to_none=True)
            loss.backward()
            optimizer.step()
        n = y.numel()
        loss_sum += loss.item() * n
        correct += float((out.argmax(-1) == y).sum())
        seen += n
        steps += 1
    seconds = time.perf_counter() - t0
    tot = distributed.reduce_sums(
        {'loss': loss_sum, 'correct': correct, 'seen': seen}, ctx)
    return {'train_loss': tot['loss'] / max(tot['seen'], 1),
            'train_acc': tot['correct'] / max(tot['seen'], 1),
            'steps': int(steps), 'seeds': int(tot['seen']),
            'epoch_time_s': seconds,
            'seeds_per_s': tot['seen'] / seconds,
            **{f'{k}_s': v for k, v in phases.seconds.items()}}


class Sampled(torch.nn.Module):
    """``net.forward_sampled`` as ``forward``, which DDP calls."""
    def __init__(self, net: AttentionGNN) -> None:
        super().__init__()
        self.net = net

    def forward(self, x, edges):
        return self.net.forward_sampled(x, edges)


def main(argv=None) -> Dict[str, Any]:
    args = parse_args(argv)
    ctx = distributed.init(args.device)
    log = ctx.rank0(print)
    fanout = [int(k) for k in args.fanout.split(',')]
    batch = distributed.per_rank_batch_size(
        args.batch_size, ctx, 'per_rank' if args.per_rank_batch else 'global')
    t = time.perf_counter()
    data = reddit_like(args.scale, avg_degree=args.avg_degree,
                       seed=args.seed, device=ctx.device)
    log(f'graph: {data.num_nodes} nodes, {data.num_edges} edges, '
        f'{data.num_features} features on {ctx.device} '
        f'({time.perf_counter() - t:.1f} s); {ctx.world_size} process(es), '
        f'{batch} seeds per rank and step, fanout {fanout}')
    loaders = {
        split: neighbor_loader(data, fanout, data[f'{split}_mask'], batch,
                               shuffle=split == 'train', seed=args.seed,
                               rank=ctx.rank, world_size=ctx.world_size,
                               pad=split == 'train')
        for split in ('train', 'val', 'test')}

    torch.manual_seed(args.seed)
    net = AttentionGNN(args.conv, args.backend, data.num_features,
                       args.hidden, int(data.y.max()) + 1, len(fanout),
                       args.heads, args.dropout).to(ctx.device)
    model = distributed.wrap_model(Sampled(net), ctx)
    optimizer = torch.optim.Adam(model.parameters(), lr=args.lr)
    if ctx.device.type == 'cuda':
        torch.cuda.reset_peak_memory_stats(ctx.device)

    advice = ('Lower --batch-size or --fanout (the subgraph grows with '
              'both), or run more processes with torchrun.')
    history = []
    for epoch in range(args.epochs):
        loaders['train'].sampler.set_epoch(epoch)
        with memory_guard(f'training epoch {epoch}', ctx.device, advice):
            row = train_epoch(model, net, loaders['train'], optimizer, ctx,
                              args)
            row['val_acc'] = evaluate(net, loaders['val'], ctx,
                                      args.eval_batches)
            row['test_acc'] = evaluate(net, loaders['test'], ctx,
                                       args.eval_batches)
        row['epoch'] = epoch
        history.append(row)
        log(f"epoch {epoch}: loss {row['train_loss']:.4f} train "
            f"{row['train_acc']:.4f} val {row['val_acc']:.4f} test "
            f"{row['test_acc']:.4f} | {row['epoch_time_s']:.2f} s, "
            f"{row['seeds_per_s']:.0f} seeds/s, {row['steps']} steps; "
            f"sample {row.get('sample_s', 0):.2f} s, format "
            f"{row.get('format_s', 0):.2f} s, step {row.get('step_s', 0):.2f}"
            f" s (this rank)")
    result = {
        'example': 'sampled_reddit', 'args': vars(args),
        'world_size': ctx.world_size, 'device': gpu_name(ctx.device),
        'torch': torch.__version__, 'num_nodes': data.num_nodes,
        'num_edges': data.num_edges,
        'peak_memory_gib': (torch.cuda.max_memory_allocated(ctx.device) / GIB
                            if ctx.device.type == 'cuda' else None),
        'history': history,
    }
    if ctx.is_main:
        write_json(args.json, result)
    del model  # DDP's reducer goes before its process group
    distributed.shutdown(ctx)
    return result


if __name__ == '__main__':
    try:
        main()
    except OutOfMemory as e:
        print(f'error: {e}', file=sys.stderr)
        sys.exit(3)

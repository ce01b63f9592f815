"""Data-parallel helpers (pyg_dfgnn.train.distributed) on the CPU: order
sharding, metric sums, and gloo runs of two processes against one."""
import os
import socket

import pytest
import torch
import torch.multiprocessing as mp

from pyg_dfgnn.train import distributed as D


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(('127.0.0.1', 0))
        return s.getsockname()[1]


def _spawn(fn, world: int, *args) -> None:
    """Runs ``fn(rank, world, *args)`` in ``world`` processes with
    torchrun's environment (gloo)."""
    port = _free_port()
    mp.start_processes(_entry, args=(fn, world, port, args), nprocs=world,
                       join=True, start_method='spawn')


def _entry(rank, fn, world, port, args):
    os.environ.update(WORLD_SIZE=str(world), RANK=str(rank),
                      LOCAL_RANK=str(rank), MASTER_ADDR='127.0.0.1',
                      MASTER_PORT=str(port))
    torch.set_num_threads(1)
    ctx = D.init('cpu', timeout_s=60)
    try:
        fn(rank, world, *args)
    finally:
        D.shutdown(ctx)


def test_sharded_order_covers_global_batches():
    order = torch.randperm(11, generator=torch.Generator().manual_seed(0))
    parts = [list(D.ShardedOrder(11, lambda e: order,
                                 D.DistContext(rank=r, world_size=2)))
             for r in range(2)]
    assert len(parts[0]) == len(parts[1]) == 6  # padded: equal steps
    # Step s of both ranks (2 per rank) = the order's slice of 4.
    for s in range(3):
        got = sorted(parts[0][2 * s:2 * s + 2] + parts[1][2 * s:2 * s + 2])
        want = order.tolist() + order[:1].tolist()
        assert got == sorted(want[4 * s:4 * s + 4])


def test_per_rank_batch_size():
    assert D.per_rank_batch_size(16, D.DistContext(world_size=2)) == 8
    with pytest.raises(ValueError, match='divisible'):
        D.per_rank_batch_size(15, D.DistContext(world_size=2))


@pytest.mark.parametrize('metric', ['accuracy', 'accuracy-SBM', 'mae'])
def test_metric_counts_add_up(metric):
    from pyg_dfgnn.train.runner import compute_metric
    g = torch.Generator().manual_seed(0)
    pred = torch.randn(50, 3, generator=g)
    y = torch.randint(0, 3, (50, ), generator=g)
    if metric == 'mae':
        pred = pred[:, :1]
    counts = D.metric_counts(metric, pred[:20], y[:20]) + \
        D.metric_counts(metric, pred[20:], y[20:])
    assert D.metric_from_counts(metric, counts) == pytest.approx(
        compute_metric(metric, pred, y))


def test_one_process_is_a_no_op():
    ctx = D.init('cpu')
    assert not ctx.enabled and ctx.is_main
    m = torch.nn.Linear(2, 2)
    m(torch.ones(1, 2)).sum().backward()
    g = m.weight.grad.clone()
    D.all_reduce_gradients(m)
    assert torch.equal(m.weight.grad, g)
    assert D.shard_loaders('a', {'b': 'c'}) == ('a', {'b': 'c'})


def _grad_check(rank, world, path):
    torch.manual_seed(rank)  # different inits: broadcast makes them agree
    m = torch.nn.Sequential(torch.nn.Linear(3, 4), torch.nn.ReLU(),
                            torch.nn.Linear(4, 1))
    D.broadcast_parameters(m)
    x = torch.arange(24.).view(8, 3) / 10
    part = x[rank::world]
    m(part).pow(2).mean().backward()
    D.all_reduce_gradients(m)
    counts = D.all_reduce_(torch.tensor([1.0, float(rank)]))
    if rank == 0:
        torch.save({'state': m.state_dict(),
                    'grads': [p.grad for p in m.parameters()],
                    'counts': counts, 'any': D.any_rank(rank == 1)}, path)
    else:
        D.any_rank(rank == 1)


def test_gradients_average_over_ranks(tmp_path):
    path = str(tmp_path / 'r0.pt')
    _spawn(_grad_check, 2, path)
    out = torch.load(path)
    m = torch.nn.Sequential(torch.nn.Linear(3, 4), torch.nn.ReLU(),
                            torch.nn.Linear(4, 1))
    m.load_state_dict(out['state'])
    x = torch.arange(24.).view(8, 3) / 10
    # Equal halves: the mean of the rank means is the full batch's mean.
    m(x).pow(2).mean().backward()
    for p, g in zip(m.parameters(), out['grads']):
        torch.testing.assert_close(p.grad, g)
    assert out['counts'].tolist() == [2.0, 1.0]
    assert out['any'] is True

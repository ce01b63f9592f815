"""A Reddit-size node-classification graph, generated offline.

Reddit (Hamilton et al., 2017; PyG's ``torch_geometric.datasets.Reddit``) has
232,965 posts, 114,615,892 directed edges (both directions of 57,307,946
pairs, mean degree ~492, heavy-tailed), 602 features and 41 classes, split
153,431 / 23,831 / 55,703. :func:`reddit_like` generates a graph of the same
shape, scaled by ``scale`` (nodes and edges alike, so the degrees stay
Reddit's) or with a smaller ``avg_degree`` for tests:

* classes drawn with Zipf-like frequencies (Reddit's communities are skewed);
* undirected degrees log-normal (``sigma=1.2``) scaled to the exact edge
  count; each pair stays inside its class with probability ``homophily``,
  otherwise it joins a uniform node (never itself);
* features ``mu[y] + noise``: one node's features alone give a weak signal,
  its neighbourhood a strong one, so graph models beat an MLP here as on
  Reddit.

Edges come sorted by destination, the CSR order the fused kernels read (a
conv on the full graph then builds its format without a sort). Generation
runs on ``device``: the full size takes a few seconds on a GPU; the same
seed gives another graph on another device type.
"""
from __future__ import annotations

from typing import Optional

import torch
from torch_geometric.data import Data

#: Reddit's sizes (PyG's ``Reddit`` dataset).
REDDIT_STATS = dict(num_nodes=232_965, num_edges=114_615_892,
                    num_features=602, num_classes=41,
                    split=(153_431, 23_831, 55_703))


def reddit_like(scale: float = 1.0, *, avg_degree: Optional[float] = None,
                num_features: int = 602, num_classes: int = 41,
                homophily: float = 0.7, signal: float = 0.08,
                seed: int = 0, device: Optional[torch.device] = None) -> Data:
    r"""Generates a Reddit-like graph (see the module docstring).

    Args:
        scale (float): nodes (and, at Reddit's degree, edges) relative to
            Reddit: ``1.0`` is 232,965 nodes and 114,615,892 edges.
        avg_degree (float, optional): mean directed degree; Reddit's
            (~492) if not given.
        num_features (int): feature columns. (default: :obj:`602`)
        num_classes (int): classes. (default: :obj:`41`)
        homophily (float): probability that an edge stays in its class.
        signal (float): scale of the class means against unit noise.
        seed (int): random seed.
        device (torch.device, optional): where to generate and keep the
            graph.

    Returns:
        :class:`~torch_geometric.data.Data` with ``x`` [N, F], ``y`` [N],
        ``edge_index`` [2, E] (int64, sorted by destination) and
        ``train_mask`` / ``val_mask`` / ``test_mask`` in Reddit's ratios.
    """
    device = torch.device(device or 'cpu')
    n = max(int(round(REDDIT_STATS['num_nodes'] * scale)), num_classes)
    if avg_degree is None:
        pairs = int(round(REDDIT_STATS['num_edges'] * scale / 2))
    else:
        pairs = int(round(n * avg_degree / 2))
    g = torch.Generator(device=device).manual_seed(seed)

    # Classes, Zipf-like frequencies; nodes grouped by class for in-class
    # draws (class c's nodes are order[start[c]:start[c] + size[c]]).
    freq = 1.0 / torch.arange(1, num_classes + 1, device=device) ** 0.8
    y = torch.multinomial(freq, n, replacement=True, generator=g)
    order = torch.argsort(y)
    size = torch.bincount(y, minlength=num_classes)
    start = size.cumsum(0) - size

    # Undirected degrees: log-normal weights scaled to exactly `pairs`.
    w = torch.exp(1.2 * torch.randn(n, device=device, generator=g))
    deg = torch.floor(w * (pairs / w.sum())).long()
    rest = pairs - int(deg.sum())
    deg[torch.randperm(n, device=device, generator=g)[:rest]] += 1
    src = torch.repeat_interleave(torch.arange(n, device=device), deg,
                                  output_size=pairs)

    # Partner: same class with probability `homophily`, else uniform.
    u = torch.rand(pairs, device=device, generator=g, dtype=torch.float64)
    c = y[src]
    in_class = order[start[c] + (u * size[c]).long().clamp_max(size[c] - 1)]
    anywhere = torch.randint(0, n, (pairs, ), device=device, generator=g)
    same = torch.rand(pairs, device=device, generator=g) < homophily
    dst = torch.where(same, in_class, anywhere)
    dst = torch.where(dst == src, (dst + 1) % n, dst)  # no self-loops
    del u, c, in_class, anywhere, same

    row = torch.cat([src, dst])
    col = torch.cat([dst, src])
    del src, dst
    col, perm = torch.sort(col, stable=True)
    row = row.index_select(0, perm)
    del perm
    edge_index = torch.stack([row, col])
    del row, col

    mu = signal * torch.randn(num_classes, num_features, device=device,
                              generator=g)
    x = torch.randn(n, num_features, device=device, generator=g)
    x.add_(mu[y])

    tr, va, _ = REDDIT_STATS['split']
    perm = torch.randperm(n, device=device, generator=g)
    n_tr = int(n * tr / REDDIT_STATS['num_nodes'])
    n_va = int(n * va / REDDIT_STATS['num_nodes'])
    masks = []
    for lo, hi in ((0, n_tr), (n_tr, n_tr + n_va), (n_tr + n_va, n)):
        m = torch.zeros(n, dtype=torch.bool, device=device)
        m[perm[lo:hi]] = True
        masks.append(m)
    return Data(x=x, y=y, edge_index=edge_index, num_nodes=n,
                train_mask=masks[0], val_mask=masks[1], test_mask=masks[2])

"""Laplacian eigenvector positional encodings (GraphGPS's ``LapPE``)."""
from __future__ import annotations

import torch
from torch_geometric.data import Data
from torch_geometric.transforms import BaseTransform
from torch_geometric.utils import get_laplacian, to_dense_adj


class AddLapPE(BaseTransform):
    r"""Stores the ``max_freqs`` smallest eigenpairs of the graph Laplacian
    :math:`L = D - A` (``norm='none'``) or :math:`I - D^{-1/2} A D^{-1/2}`
    (``norm='sym'``) as ``data.EigVecs`` [N, max_freqs] (unit L2 norm) and
    ``data.EigVals`` [N, max_freqs, 1] (repeated per node). Graphs with fewer
    than ``max_freqs`` nodes are padded with NaN, which the encoder masks.
    """

    def __init__(self, max_freqs: int = 10, norm: str = 'none'):
        if norm not in ('none', 'sym'):
            raise ValueError(f"norm must be 'none' or 'sym', got {norm!r}")
        self.max_freqs, self.norm = max_freqs, norm

    def forward(self, data: Data) -> Data:
        n = data.num_nodes
        edge_index = data.edge_index
        edge_index = torch.as_tensor(edge_index.as_tensor() if hasattr(
            edge_index, 'as_tensor') else edge_index).long()
        edge_index = edge_index[:, edge_index[0] != edge_index[1]]
        lap_index, lap_weight = get_laplacian(
            edge_index, normalization=None if self.norm == 'none' else 'sym',
            num_nodes=n)
        lap = to_dense_adj(lap_index, edge_attr=lap_weight,
                           max_num_nodes=n)[0].double()
        evals, evecs = torch.linalg.eigh(lap)
        k = min(n, self.max_freqs)
        evecs = evecs[:, :k] / evecs[:, :k].norm(dim=0, keepdim=True).clamp(
            min=1e-12)
        vecs = torch.full((n, self.max_freqs), float('nan'))
        vals = torch.full((n, self.max_freqs), float('nan'))
        vecs[:, :k] = evecs.float()
        vals[:, :k] = evals[:k].float().clamp(min=0)
        data.EigVecs, data.EigVals = vecs, vals.unsqueeze(-1)
        return data

    def __repr__(self) -> str:
        return f'{self.__class__.__name__}({self.max_freqs}, norm={self.norm})'


class AddRWSE(BaseTransform):
    r"""Random-walk structural encoding (GraphGPS's ``RWSE``): the return
    probabilities :math:`(P^k)_{ii}` of the random walk
    :math:`P = D^{-1} A` for every ``k`` in ``times``, stored as
    ``data.pestat_RWSE`` [N, len(times)]. For large ``k`` they approach
    :math:`d_i / 2m`, so attention-only models see node degrees through them.
    """

    def __init__(self, times=range(1, 17)):
        self.times = sorted(int(t) for t in times)
        if not self.times or self.times[0] < 1:
            raise ValueError(f'times must be positive step counts, got '
                             f'{list(times)}')

    def forward(self, data: Data) -> Data:
        n = data.num_nodes
        edge_index = data.edge_index
        edge_index = torch.as_tensor(edge_index.as_tensor() if hasattr(
            edge_index, 'as_tensor') else edge_index).long()
        adj = to_dense_adj(edge_index, max_num_nodes=n)[0].double()
        deg = adj.sum(dim=1, keepdim=True)
        walk = adj / deg.clamp(min=1)
        power = torch.eye(n, dtype=torch.float64)
        out, wanted = [], set(self.times)
        for k in range(1, self.times[-1] + 1):
            power = power @ walk
            if k in wanted:
                out.append(power.diagonal())
        data.pestat_RWSE = torch.stack(out, dim=1).float()
        return data

    def __repr__(self) -> str:
        return f'{self.__class__.__name__}({self.times})'

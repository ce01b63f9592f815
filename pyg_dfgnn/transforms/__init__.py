r"""Transforms that prepare graphs for the fused kernels.

Importing :mod:`pyg_dfgnn` also registers :class:`ToDFGNNFormat` as
:obj:`torch_geometric.transforms.ToDFGNNFormat`, so
``import torch_geometric.transforms as T; T.ToDFGNNFormat()`` works.
"""
import torch_geometric.transforms as _pyg_transforms

from pyg_dfgnn.transforms.to_dfgnn_format import ToDFGNNFormat

_pyg_transforms.ToDFGNNFormat = ToDFGNNFormat
if 'ToDFGNNFormat' not in _pyg_transforms.__all__:
    _pyg_transforms.__all__.append('ToDFGNNFormat')

__all__ = ['ToDFGNNFormat']

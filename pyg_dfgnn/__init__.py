"""pyg_dfgnn: DF-GNN's dynamic-fusion attention kernels as drop-in PyG convs."""
__version__ = '0.1.0'

from pyg_dfgnn.graph import DFGraph  # noqa: E402
from pyg_dfgnn.ops import fused_attention  # noqa: E402
from pyg_dfgnn.transforms import ToDFGNNFormat  # noqa: E402
from pyg_dfgnn import nn, transforms  # noqa: E402

__all__ = ['DFGraph', 'fused_attention', 'ToDFGNNFormat', 'nn', 'transforms',
           '__version__']

"""Neural-network modules of pyg_dfgnn."""
from pyg_dfgnn.nn.conv import (
    DFAGNNConv,
    DFGATConv,
    DFGATv2Conv,
    DFTransformerConv,
    clear_graph_cache,
    graph_cache_info,
)

__all__ = [
    'DFGATConv',
    'DFGATv2Conv',
    'DFTransformerConv',
    'DFAGNNConv',
    'clear_graph_cache',
    'graph_cache_info',
]

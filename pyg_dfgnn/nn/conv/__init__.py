"""Drop-in replacements of PyG's attention convs running the fused op."""
from pyg_dfgnn.nn.conv.gat_conv import DFGATConv
from pyg_dfgnn.nn.conv.gatv2_conv import DFGATv2Conv
from pyg_dfgnn.nn.conv.transformer_conv import DFTransformerConv
from pyg_dfgnn.nn.conv.agnn_conv import DFAGNNConv
from pyg_dfgnn.nn.conv.utils import clear_graph_cache, graph_cache_info

__all__ = [
    'DFGATConv',
    'DFGATv2Conv',
    'DFTransformerConv',
    'DFAGNNConv',
    'clear_graph_cache',
    'graph_cache_info',
]

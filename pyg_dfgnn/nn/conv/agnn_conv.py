from typing import Any

import torch
import torch.nn.functional as F
from torch import Tensor
from torch.nn import Parameter

from pyg_dfgnn.nn.conv.fused_message_passing import FusedMessagePassing
from pyg_dfgnn.nn.conv.utils import (
    cast,
    check_message_passing_config,
    check_node_features,
    op_dtype,
    resolve_graph,
    resolve_sizes,
)
from pyg_dfgnn.ops import fused_attention


class DFAGNNConv(FusedMessagePassing):
    r"""The graph attentional propagation layer from the
    `"Attention-based Graph Neural Network for Semi-Supervised Learning"
    <https://arxiv.org/abs/1803.03735>`_ paper, as one fused DF-GNN kernel
    (edge scores, edge softmax and aggregation in a single pass over the
    graph). A drop-in replacement of
    :class:`torch_geometric.nn.conv.AGNNConv`: same arguments, parameters,
    initialisation, ``state_dict`` and outputs.

    .. math::
        \mathbf{X}^{\prime} = \mathbf{P} \mathbf{X},

    where the propagation matrix :math:`\mathbf{P}` is computed as

    .. math::
        P_{i,j} = \frac{\exp( \beta \cdot \cos(\mathbf{x}_i, \mathbf{x}_j))}
        {\sum_{k \in \mathcal{N}(i)\cup \{ i \}} \exp( \beta \cdot
        \cos(\mathbf{x}_i, \mathbf{x}_k))}

    with trainable parameter :math:`\beta`. This is the fused op's ``'dot'``
    kind with one head: ``query`` :math:`\beta \hat{\mathbf{x}}`, ``key``
    :math:`\hat{\mathbf{x}}` (the L2-normalised features), ``value``
    :math:`\mathbf{x}`.

    The CSR graph the kernel runs on is built once per ``edge_index`` tensor
    (after self-loop handling) and shared by all DF-GNN convs; a graph whose
    ``edge_index`` was modified in place is rebuilt. A prebuilt
    :class:`pyg_dfgnn.DFGraph` can be passed as ``edge_index`` instead; it is
    used as it is (no self-loops are added or removed).

    Args:
        requires_grad (bool, optional): If set to :obj:`False`, :math:`\beta`
            will not be trainable. (default: :obj:`True`)
        add_self_loops (bool, optional): If set to :obj:`False`, will not add
            self-loops to the input graph. (default: :obj:`True`)
        **kwargs (optional): Additional arguments of
            :class:`torch_geometric.nn.conv.MessagePassing` (only
            :obj:`aggr="add"` and :obj:`flow="source_to_target"` are
            supported).

    Shapes:
        - **input:**
          node features :math:`(|\mathcal{V}|, F)`,
          edge indices :math:`(2, |\mathcal{E}|)` (or a
          :class:`~torch_geometric.EdgeIndex`, a
          :class:`torch_sparse.SparseTensor` / :mod:`torch.sparse` ``adj_t``,
          or a :class:`pyg_dfgnn.DFGraph`)
        - **output:** node features :math:`(|\mathcal{V}|, F)`
    """
    def __init__(self, requires_grad: bool = True, add_self_loops: bool = True,
                 **kwargs):
        kwargs.setdefault('aggr', 'add')
        super().__init__(**kwargs)
        check_message_passing_config(self)

        self.requires_grad = requires_grad
        self.add_self_loops = add_self_loops

        if requires_grad:
            self.beta = Parameter(torch.empty(1))
        else:
            self.register_buffer('beta', torch.ones(1))

        self.reset_parameters()

    def reset_parameters(self):
        super().reset_parameters()
        if self.requires_grad:
            self.beta.data.fill_(1)

    def forward(self, x: Tensor, edge_index: Any) -> Tensor:
        r"""Runs the forward pass of the module.

        Args:
            x (torch.Tensor): The input node features.
            edge_index (torch.Tensor, EdgeIndex, SparseTensor, torch.sparse
                tensor or DFGraph): The graph.
        """
        self.check_forward_allowed()
        check_node_features('x', x)
        num_nodes, _ = resolve_sizes(edge_index, None, x.size(0), x.size(0))
        structure = resolve_graph(
            edge_index, num_nodes, num_nodes, x.device,
            num_nodes if self.add_self_loops else None)

        x_norm = F.normalize(x, p=2., dim=-1).unsqueeze(1)
        query = self.beta * x_norm
        dtype = op_dtype(x, query, x_norm)
        value, query, key = cast(dtype, x.unsqueeze(1), query, x_norm)
        out = fused_attention(structure.graph, 'dot', value, query, key)
        return out.squeeze(1)

from typing import Any, Optional, Tuple, Union

import torch
from torch import Tensor
from torch.nn import Parameter
from torch_geometric.nn.dense.linear import (
    Linear,
    is_uninitialized_parameter,
)
from torch_geometric.nn.inits import glorot, zeros

from pyg_dfgnn.nn.conv.fused_message_passing import FusedMessagePassing
from pyg_dfgnn.nn.conv.linear_ops import add_bias, gpu_bound, linears
from pyg_dfgnn.nn.conv.utils import (
    adjacency_edge_attr,
    attention_weights,
    cast,
    check_message_passing_config,
    check_sparse_self_loops,
    op_dtype,
    resolve_graph,
    resolve_sizes,
    split_node_features,
)
from pyg_dfgnn.ops import fused_attention
from pyg_dfgnn.ops.edge_attr import edge_attr_project, project_supported


class DFGATv2Conv(FusedMessagePassing):
    r"""The GATv2 operator from the `"How Attentive are Graph Attention
    Networks?" <https://arxiv.org/abs/2105.14491>`_ paper, as one fused
    DF-GNN kernel (edge scores, edge softmax and aggregation in a single pass
    over the graph). A drop-in replacement of
    :class:`torch_geometric.nn.conv.GATv2Conv`: same arguments, parameters,
    initialisation, ``state_dict`` and outputs.

    .. math::
        \mathbf{x}^{\prime}_i = \sum_{j \in \mathcal{N}(i) \cup \{ i \}}
        \alpha_{i,j}\mathbf{\Theta}_{t}\mathbf{x}_{j},

    with attention coefficients (dynamic attention: the non-linearity sits
    between the two linear maps)

    .. math::
        \alpha_{i,j} = \mathrm{softmax}_j \left( \mathbf{a}^{\top}
        \mathrm{LeakyReLU}\left(\mathbf{\Theta}_{s} \mathbf{x}_i
        + \mathbf{\Theta}_{t} \mathbf{x}_j
        + \mathbf{\Theta}_{e} \mathbf{e}_{i,j} \right)\right),

    where the edge term only exists if :obj:`edge_dim` is set. This is the
    fused op's ``'gatv2'`` kind with ``query`` :math:`\mathbf{\Theta}_{s}
    \mathbf{x}`, ``key`` = ``value`` :math:`\mathbf{\Theta}_{t}\mathbf{x}`.

    The CSR graph the kernel runs on is built once per ``edge_index`` tensor
    (after self-loop handling) and shared by all DF-GNN convs; a graph whose
    ``edge_index`` was modified in place is rebuilt. A prebuilt
    :class:`pyg_dfgnn.DFGraph` can be passed as ``edge_index`` instead; it is
    used as it is (no self-loops are added or removed, whatever
    :obj:`add_self_loops` says) and ``edge_attr`` must follow the edge order
    it was built from.

    Args:
        in_channels (int or tuple): Size of each input sample, or :obj:`-1` to
            derive the size from the first input(s) to the forward method.
            A tuple gives the source and target sizes of a bipartite graph.
        out_channels (int): Size of each output sample (per head).
        heads (int, optional): Number of attention heads. (default: :obj:`1`)
        concat (bool, optional): If set to :obj:`False`, the heads are
            averaged instead of concatenated. (default: :obj:`True`)
        negative_slope (float, optional): LeakyReLU angle of the negative
            slope. (default: :obj:`0.2`)
        dropout (float, optional): Dropout probability of the normalized
            attention coefficients. (default: :obj:`0`)
        add_self_loops (bool, optional): If set to :obj:`False`, will not add
            self-loops to the input graph. (default: :obj:`True`)
        edge_dim (int, optional): Edge feature dimensionality (in case
            there are any). (default: :obj:`None`)
        fill_value (float or torch.Tensor or str, optional): How the edge
            features of added self-loops are made (if :obj:`edge_dim` is
            set): the given value, or the :obj:`"add"`, :obj:`"mean"`,
            :obj:`"min"`, :obj:`"max"` or :obj:`"mul"` reduction of the
            features of the edges pointing to the node.
            (default: :obj:`"mean"`)
        bias (bool, optional): If set to :obj:`False`, the layer will not learn
            an additive bias. (default: :obj:`True`)
        share_weights (bool, optional): If set to :obj:`True`, the same matrix
            is applied to the source and the target node of every edge
            (:math:`\mathbf{\Theta}_{s} = \mathbf{\Theta}_{t}`).
            (default: :obj:`False`)
        residual (bool, optional): If set to :obj:`True`, the layer will add
            a learnable skip-connection. (default: :obj:`False`)
        **kwargs (optional): Additional arguments of
            :class:`torch_geometric.nn.conv.MessagePassing` (only
            :obj:`aggr="add"` and :obj:`flow="source_to_target"` are
            supported).

    Shapes:
        - **input:**
          node features :math:`(|\mathcal{V}|, F_{in})` or
          :math:`((|\mathcal{V_s}|, F_{s}), (|\mathcal{V_t}|, F_{t}))`
          if bipartite,
          edge indices :math:`(2, |\mathcal{E}|)` (or a
          :class:`~torch_geometric.EdgeIndex`, a
          :class:`torch_sparse.SparseTensor` / :mod:`torch.sparse` ``adj_t``,
          or a :class:`pyg_dfgnn.DFGraph`),
          edge features :math:`(|\mathcal{E}|, D)` *(optional)*
        - **output:** node features :math:`(|\mathcal{V}|, H * F_{out})` or
          :math:`((|\mathcal{V}_t|, H * F_{out})` if bipartite.
          If :obj:`return_attention_weights=True`, then
          :math:`((|\mathcal{V}|, H * F_{out}),
          ((2, |\mathcal{E}|), (|\mathcal{E}|, H)))`
          or :math:`((|\mathcal{V_t}|, H * F_{out}), ((2, |\mathcal{E}|),
          (|\mathcal{E}|, H)))` if bipartite, edges in PyG's order (input
          edges without self-loops, then the added self-loops).
    """
    def __init__(
        self,
        in_channels: Union[int, Tuple[int, int]],
        out_channels: int,
        heads: int = 1,
        concat: bool = True,
        negative_slope: float = 0.2,
        dropout: float = 0.0,
        add_self_loops: bool = True,
        edge_dim: Optional[int] = None,
        fill_value: Union[float, Tensor, str] = 'mean',
        bias: bool = True,
        share_weights: bool = False,
        residual: bool = False,
        **kwargs,
    ):
        super().__init__(node_dim=0, **kwargs)
        check_message_passing_config(self)

        self.in_channels = in_channels
        self.out_channels = out_channels
        self.heads = heads
        self.concat = concat
        self.negative_slope = negative_slope
        self.dropout = dropout
        self.add_self_loops = add_self_loops
        self.edge_dim = edge_dim
        self.fill_value = fill_value
        self.residual = residual
        self.share_weights = share_weights

        if isinstance(in_channels, int):
            in_l, in_r = in_channels, in_channels
        else:
            in_l, in_r = in_channels[0], in_channels[1]
        self.lin_l = Linear(in_l, heads * out_channels, bias=bias,
                            weight_initializer='glorot')
        if share_weights:
            self.lin_r = self.lin_l
        else:
            self.lin_r = Linear(in_r, heads * out_channels, bias=bias,
                                weight_initializer='glorot')

        self.att = Parameter(torch.empty(1, heads, out_channels))

        if edge_dim is not None:
            self.lin_edge = Linear(edge_dim, heads * out_channels, bias=False,
                                   weight_initializer='glorot')
        else:
            self.lin_edge = None

        total_out_channels = out_channels * (heads if concat else 1)

        if residual:
            self.res = Linear(in_r, total_out_channels, bias=False,
                              weight_initializer='glorot')
        else:
            self.register_parameter('res', None)

        if bias:
            self.bias = Parameter(torch.empty(total_out_channels))
        else:
            self.register_parameter('bias', None)

        self.reset_parameters()

    def reset_parameters(self):
        super().reset_parameters()
        self.lin_l.reset_parameters()
        self.lin_r.reset_parameters()
        if self.lin_edge is not None:
            self.lin_edge.reset_parameters()
        if self.res is not None:
            self.res.reset_parameters()
        glorot(self.att)
        zeros(self.bias)

    def forward(
        self,
        x: Union[Tensor, Tuple[Tensor, Tensor]],
        edge_index: Any,
        edge_attr: Optional[Tensor] = None,
        return_attention_weights: Optional[bool] = None,
    ):
        r"""Runs the forward pass of the module.

        Args:
            x (torch.Tensor or (torch.Tensor, torch.Tensor)): The input node
                features.
            edge_index (torch.Tensor, EdgeIndex, SparseTensor, torch.sparse
                tensor or DFGraph): The graph.
            edge_attr (torch.Tensor, optional): The edge features.
                (default: :obj:`None`)
            return_attention_weights (bool, optional): If set to
                :obj:`True`, will additionally return the tuple
                :obj:`(edge_index, attention_weights)` (a
                :class:`~torch_sparse.SparseTensor` holding them for
                :class:`~torch_sparse.SparseTensor` input).
                (default: :obj:`None`)
        """
        self.check_forward_allowed()
        H, C = self.heads, self.out_channels
        res: Optional[Tensor] = None

        x_l_in, x_r_in = split_node_features(x)

        if self.res is not None:
            res = self.res(x_r_in)
        num_src, num_dst = resolve_sizes(edge_index, None, x_l_in.size(0),
                                         x_r_in.size(0))
        if edge_attr is None and self.lin_edge is not None:
            edge_attr = adjacency_edge_attr(edge_index)  # as PyG collects it
        loops = None
        if self.add_self_loops:
            check_sparse_self_loops(edge_index, self.edge_dim, edge_attr)
            loops = min(num_src, num_dst)
        structure = resolve_graph(edge_index, num_src, num_dst,
                                  x_l_in.device, loops)

        if self.share_weights and x_r_in is x_l_in:
            x_l = x_r = self.lin_l(x_l_in).view(-1, H, C)
        elif x_r_in is x_l_in:  # one backward node where that pays
            x_l, x_r = (t.view(-1, H, C) for t in linears(
                x_l_in, [self.lin_l, self.lin_r], structure.graph.num_edges))
        else:
            x_l = self.lin_l(x_l_in).view(-1, H, C)
            x_r = self.lin_r(x_r_in).view(-1, H, C)

        edge_key: Optional[Tensor] = None
        if edge_attr is not None:
            if self.lin_edge is None:
                raise ValueError(f"'edge_attr' was given but "
                                 f"'{self.__class__.__name__}' was built "
                                 f"without 'edge_dim'")
            edge_key = self._edge_key(structure, edge_index, edge_attr)

        att = self.att.view(H, C)
        dtype = op_dtype(x_l, x_r, att, edge_key)
        x_l, x_r, att, edge_key = cast(dtype, x_l, x_r, att, edge_key)
        result = fused_attention(
            structure.graph, 'gatv2', x_l, x_r, x_l, att,
            negative_slope=self.negative_slope, edge_key=edge_key,
            dropout=self.dropout, training=self.training,
            return_attention=bool(return_attention_weights),
            attention_perm=structure.graph.perm)
        out, alpha = result if return_attention_weights else (result, None)

        if self.concat:
            out = out.reshape(-1, H * C)
        else:
            out = out.mean(dim=1)
        if res is not None:
            out = out + res
        out = add_bias(out, self.bias,
                       gpu_bound(x_l, structure.graph.num_edges))

        if return_attention_weights:
            return out, attention_weights(structure, edge_index, alpha)
        return out

    def _edge_key(self, structure: Any, adj: Any,
                  edge_attr: Tensor) -> Tensor:
        """lin_edge(e_ij) [E, H, C] in CSR order, loops filled."""
        H, C = self.heads, self.out_channels
        if isinstance(edge_attr, Tensor) and edge_attr.dim() == 1:
            edge_attr = edge_attr.view(-1, 1)
        weight = self.lin_edge.weight
        if edge_attr.is_cuda and \
                not is_uninitialized_parameter(weight) and \
                project_supported(weight.size(0), weight.size(1)):
            emap = structure.edge_attr_map(adj, edge_attr, self.fill_value)
            if emap is not None:  # one kernel from the user's edge_attr
                return edge_attr_project(
                    emap, *cast(op_dtype(edge_attr, weight), edge_attr,
                                weight)).view(-1, H, C)
        edge_attr = structure.edge_attr(adj, edge_attr, self.fill_value)
        return self.lin_edge(edge_attr).view(-1, H, C)

    def __repr__(self) -> str:
        return (f'{self.__class__.__name__}({self.in_channels}, '
                f'{self.out_channels}, heads={self.heads})')

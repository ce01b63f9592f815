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
from pyg_dfgnn.nn.conv.linear_ops import add_bias, gpu_bound
from pyg_dfgnn.nn.conv.node_ops import node_score_pair, node_scores
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
from pyg_dfgnn.ops.edge_attr import edge_attr_dots, supported


class DFGATConv(FusedMessagePassing):
    r"""The graph attentional operator from the `"Graph Attention Networks"
    <https://arxiv.org/abs/1710.10903>`_ paper, as one fused DF-GNN kernel
    (edge scores, edge softmax and aggregation in a single pass over the
    graph). A drop-in replacement of
    :class:`torch_geometric.nn.conv.GATConv`: same arguments, parameters,
    initialisation, ``state_dict`` and outputs.

    .. math::
        \mathbf{x}^{\prime}_i = \sum_{j \in \mathcal{N}(i) \cup \{ i \}}
        \alpha_{i,j}\mathbf{\Theta}_{s}\mathbf{x}_{j},

    with attention coefficients

    .. math::
        \alpha_{i,j} = \mathrm{softmax}_j \left( \mathrm{LeakyReLU}\left(
        \mathbf{a}^{\top}_{t} \mathbf{\Theta}_{t}\mathbf{x}_i
        + \mathbf{a}^{\top}_{s} \mathbf{\Theta}_{s}\mathbf{x}_j
        + \mathbf{a}^{\top}_{e} \mathbf{\Theta}_{e} \mathbf{e}_{i,j}
        \right)\right),

    where the edge term only exists if :obj:`edge_dim` is set, and
    :math:`\mathbf{\Theta}_{s} = \mathbf{\Theta}_{t}` unless the layer is
    bipartite. The per-node terms :math:`\mathbf{a}^{\top}\mathbf{\Theta}
    \mathbf{x}` are the fused op's ``'add'`` query / key.

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
        residual: bool = False,
        **kwargs,
    ):
        kwargs.setdefault('aggr', 'add')
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

        # Bipartite layers transform sources and targets separately:
        self.lin = self.lin_src = self.lin_dst = None
        if isinstance(in_channels, int):
            self.lin = Linear(in_channels, heads * out_channels, bias=False,
                              weight_initializer='glorot')
        else:
            self.lin_src = Linear(in_channels[0], heads * out_channels, False,
                                  weight_initializer='glorot')
            self.lin_dst = Linear(in_channels[1], heads * out_channels, False,
                                  weight_initializer='glorot')

        self.att_src = Parameter(torch.empty(1, heads, out_channels))
        self.att_dst = Parameter(torch.empty(1, heads, out_channels))

        if edge_dim is not None:
            self.lin_edge = Linear(edge_dim, heads * out_channels, bias=False,
                                   weight_initializer='glorot')
            self.att_edge = Parameter(torch.empty(1, heads, out_channels))
        else:
            self.lin_edge = None
            self.register_parameter('att_edge', None)

        total_out_channels = out_channels * (heads if concat else 1)

        if residual:
            self.res = Linear(
                in_channels
                if isinstance(in_channels, int) else in_channels[1],
                total_out_channels,
                bias=False,
                weight_initializer='glorot',
            )
        else:
            self.register_parameter('res', None)

        if bias:
            self.bias = Parameter(torch.empty(total_out_channels))
        else:
            self.register_parameter('bias', None)

        self.reset_parameters()

    def reset_parameters(self):
        super().reset_parameters()
        for lin in (self.lin, self.lin_src, self.lin_dst, self.lin_edge,
                    self.res):
            if lin is not None:
                lin.reset_parameters()
        glorot(self.att_src)
        glorot(self.att_dst)
        glorot(self.att_edge)
        zeros(self.bias)

    def forward(
        self,
        x: Union[Tensor, Tuple[Tensor, Optional[Tensor]]],
        edge_index: Any,
        edge_attr: Optional[Tensor] = None,
        size: Optional[Tuple[int, int]] = None,
        return_attention_weights: Optional[bool] = None,
    ):
        r"""Runs the forward pass of the module.

        Args:
            x (torch.Tensor or (torch.Tensor, torch.Tensor)): The input node
                features (the target features may be :obj:`None`).
            edge_index (torch.Tensor, EdgeIndex, SparseTensor, torch.sparse
                tensor or DFGraph): The graph.
            edge_attr (torch.Tensor, optional): The edge features.
                (default: :obj:`None`)
            size ((int, int), optional): The shape of the adjacency matrix.
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

        x_src_in, x_dst_in = split_node_features(x, needs_target=False)

        if x_dst_in is not None and self.res is not None:
            res = self.res(x_dst_in)
        lin_src = self.lin if self.lin is not None else self.lin_src
        lin_dst = self.lin if self.lin is not None else self.lin_dst
        x_src = lin_src(x_src_in).view(-1, H, C)
        x_dst: Optional[Tensor] = None
        if x_dst_in is x_src_in and self.lin is not None:
            x_dst = x_src
        elif x_dst_in is not None:
            x_dst = lin_dst(x_dst_in).view(-1, H, C)

        num_src, num_dst = resolve_sizes(
            edge_index, size, x_src.size(0),
            None if x_dst is None else x_dst.size(0))

        if edge_attr is None and self.lin_edge is not None:
            edge_attr = adjacency_edge_attr(edge_index)  # as PyG collects it
        loops = None
        if self.add_self_loops:
            check_sparse_self_loops(edge_index, self.edge_dim, edge_attr)
            # Loops only for nodes that are both sources and targets:
            loops = min(num_src, num_dst)
        structure = resolve_graph(edge_index, num_src, num_dst,
                                  x_src.device, loops)

        # Node-level attention terms; the op adds them per edge:
        degree = structure.graph.num_edges / max(num_dst, 1)
        gpu_bound_step = gpu_bound(x_src, structure.graph.num_edges)
        if x_dst is x_src:
            alpha_src, alpha_dst = node_score_pair(
                x_src, self.att_src, self.att_dst, degree, gpu_bound_step)
        else:
            alpha_src = node_scores(x_src, self.att_src, degree)
            if x_dst is None:
                alpha_dst = alpha_src.new_zeros(num_dst, H)
            else:
                alpha_dst = node_scores(x_dst, self.att_dst, degree)

        edge_score: Optional[Tensor] = None
        if edge_attr is not None and self.lin_edge is not None:
            edge_score = self._edge_score(structure, edge_index, edge_attr)

        dtype = op_dtype(x_src, alpha_dst, alpha_src, edge_score)
        x_src, alpha_dst, alpha_src, edge_score = cast(
            dtype, x_src, alpha_dst, alpha_src, edge_score)
        result = fused_attention(
            structure.graph, 'add', x_src, alpha_dst, alpha_src,
            negative_slope=self.negative_slope, edge_score=edge_score,
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
        out = add_bias(out, self.bias, gpu_bound_step)

        if return_attention_weights:
            return out, attention_weights(structure, edge_index, alpha)
        return out

    def _edge_score(self, structure: Any, adj: Any,
                    edge_attr: Tensor) -> Tensor:
        """The edge term a_e^T Theta_e e_ij [E, H] in CSR order."""
        H, C = self.heads, self.out_channels
        if isinstance(edge_attr, Tensor) and edge_attr.dim() == 1:
            edge_attr = edge_attr.view(-1, 1)
        if is_uninitialized_parameter(self.lin_edge.weight):  # lazy edge_dim
            def project(e: Tensor) -> Tensor:
                return (self.lin_edge(e).view(-1, H, C) *
                        self.att_edge).sum(dim=-1)
            return structure.edge_attr(adj, edge_attr, self.fill_value,
                                       project=project)
        # e @ (Theta_e^T a_e): the attention vector folded into the weight
        # instead of materialising [E, H, C]
        weight = self.lin_edge.weight.view(H, C, -1)
        folded = (weight * self.att_edge.view(H, C, 1)).sum(1)
        emap = None
        if supported(H, folded.size(1)):
            emap = structure.edge_attr_map(adj, edge_attr, self.fill_value)
        if emap is None:  # a fill the kernels do not express
            return structure.edge_attr(adj, edge_attr, self.fill_value,
                                       project=lambda e: e @ folded.t())
        # read in the user's order, loops filled in the kernel: no copy
        dtype = torch.promote_types(edge_attr.dtype, folded.dtype)
        return edge_attr_dots(emap, edge_attr.to(dtype),
                              folded.to(dtype).unsqueeze(0))

    def __repr__(self) -> str:
        return (f'{self.__class__.__name__}({self.in_channels}, '
                f'{self.out_channels}, heads={self.heads})')


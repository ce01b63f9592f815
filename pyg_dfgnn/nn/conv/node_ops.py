"""The convs' per-node dense pieces -- linear layers, the output bias, GAT's
node attention terms -- with backwards that avoid PyTorch's column
reductions.

On a batch of small graphs the fused attention is no longer what a training
step waits for (zinc-like, 94K nodes x 128 channels, H100: our kernels
0.2 ms of a GATConv step's 1.2 ms of GPU time). PyTorch forms a bias
gradient, and the gradient of GAT's ``att_src`` / ``att_dst``, as a
reduction over the N rows of an [N, C] tensor (``reduce_kernel``, ~0.1 ms
per [94K, 128] fp32, a fifth of the bandwidth), and GAT's node terms
``(x * att).sum(-1)`` as a product written out and reduced again. Here:

* :func:`linear` / :func:`add_bias`: the bias gradient as the GEMM
  ``ones^T G`` (custom backward; CUDA, eager, grad enabled -- elsewhere the
  module itself runs, and ``torch.compile`` fuses the reduction on its own);
* :func:`node_scores`: ``x @ A`` with ``A`` the block-diagonal [H * C, H]
  matrix of ``att`` (autograd's own backward: two GEMMs).

Same values up to the order of the sums.
"""
import torch
import torch.nn.functional as F
from torch import Tensor
from torch_geometric.nn.dense.linear import Linear as PyGLinear
from torch_geometric.nn.dense.linear import is_uninitialized_parameter


def column_sum(g: Tensor) -> Tensor:
    """``g.sum(0)`` of a 2-D tensor as the GEMM ``ones^T g``."""
    return (g.new_ones(1, g.size(0)) @ g).view(-1)


class _AddBias(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x: Tensor, bias: Tensor) -> Tensor:
        return x + bias

    @staticmethod
    def backward(ctx, g: Tensor):
        gb = column_sum(g.reshape(-1, g.size(-1))) \
            if ctx.needs_input_grad[1] else None
        return g if ctx.needs_input_grad[0] else None, gb


class _Linear(torch.autograd.Function):
    @staticmethod
    @torch.amp.custom_fwd(device_type='cuda')
    def forward(ctx, x: Tensor, weight: Tensor, bias: Tensor) -> Tensor:
        ctx.save_for_backward(x, weight)
        return F.linear(x, weight, bias)

    @staticmethod
    @torch.amp.custom_bwd(device_type='cuda')
    def backward(ctx, g: Tensor):
        x, weight = ctx.saved_tensors
        g2 = g.reshape(-1, g.size(-1))
        gx = gw = gb = None
        if ctx.needs_input_grad[0]:
            gx = (g2 @ weight.to(g2.dtype)).view(*x.shape[:-1], weight.size(1))
        if ctx.needs_input_grad[1]:
            gw = g2.t() @ x.reshape(-1, x.size(-1)).to(g2.dtype)
        if ctx.needs_input_grad[2]:
            gb = column_sum(g2)
        return gx, gw, gb


def _lean(x: Tensor, *params: Tensor) -> bool:
    """Whether the custom backwards apply: a CUDA training step in eager
    mode with a parameter that wants a gradient."""
    return (x.is_cuda and torch.is_grad_enabled()
            and not torch.compiler.is_compiling()
            and any(p.requires_grad for p in params))


def linear(lin: torch.nn.Module, x: Tensor) -> Tensor:
    """``lin(x)`` for a PyG or torch ``Linear``; with a bias, its gradient
    as a GEMM. Lazy layers, hooks and other modules run as they are."""
    bias = getattr(lin, 'bias', None)
    if (type(lin) not in (PyGLinear, torch.nn.Linear) or bias is None
            or is_uninitialized_parameter(lin.weight)
            or lin._forward_hooks or lin._forward_pre_hooks
            or not _lean(x, lin.weight, bias)):
        return lin(x)
    return _Linear.apply(x, lin.weight, bias)


def add_bias(x: Tensor, bias: Tensor) -> Tensor:
    """``x + bias`` (bias over the last dimension), its gradient a GEMM."""
    if not _lean(x, bias):
        return x + bias
    return _AddBias.apply(x, bias)


def node_scores(x: Tensor, att: Tensor) -> Tensor:
    """``(x * att).sum(-1)`` for ``x`` [N, H, C] and ``att`` [1, H, C]: one
    skinny GEMM against the block-diagonal [H * C, H] matrix of ``att``
    (its backward two GEMMs), instead of an [N, H, C] product reduced once
    forward and twice backward."""
    N, H, C = x.shape
    blocks = torch.block_diag(*att.reshape(H, C, 1).unbind(0))
    return x.reshape(N, H * C) @ blocks.to(x.dtype)

"""Several Linear layers of one input (TransformerConv's query / key / value
/ skip, GATv2's two sides) with one hand-written backward node.

Autograd's own backward of these layers cost a TransformerConv(128, 128)
training step more than its attention forward (pattern-like, 122K nodes,
H100, fp32; scripts/glue_bench.py):

* a bias gradient is PyTorch's ``reduce_kernel`` over the N rows of an
  [N, C] gradient: 0.14 ms per [122K, 128] fp32, a fifth of the bandwidth.
  The same sum as a GEMV against a ones vector takes 0.04 ms (bf16: 0.12 ->
  0.03); below ~64 columns the reduction is the faster (0.021 vs 0.037 ms
  at 16);
* every extra use of a tensor adds an [N, C] accumulation kernel to its
  gradient: three for TransformerConv's four projections. Here each
  gradient goes into the one ``d x`` by a GEMM with ``beta = 1``.

Four Linear(128, 128) of one input, forward + backward: autograd 2.20 ms,
this 1.50 (bf16 1.08 -> 0.55). Same values up to the order of the sums.

The node costs host time (a Python backward: ~0.1-0.4 ms per step on the
device's host), so it runs where the step is GPU-bound: graphs of at least
``LINEARS_MIN_EDGES`` edges, or steps captured in a CUDA graph (no host
work when replayed). Same-process A/B (scripts/ab_glue.py, H100, module
fwd + bwd): TransformerConv(128, 128) fp32 -17 / -18 % on pattern- /
cluster-like, GATv2Conv(128, 128) -11 / -12 % (bf16 -10 / -11 %); on
zinc- and mnist-like batches (host-bound steps) +5-24 % -- those keep
autograd's nodes. torch.compile keeps them too: its graph fuses the
accumulations and reductions itself.

Under autocast the inputs are cast once, as autocast would cast them per
layer, and the products run in that dtype; parameter gradients come back in
the parameters' dtype.
"""
from typing import Dict, List, Optional, Sequence, Tuple

import torch
from torch import Tensor
from torch_geometric.nn.dense.linear import is_uninitialized_parameter

from pyg_dfgnn.nn.conv.utils import autocast_dtype

# Columns from which a bias gradient is a GEMV (CUDA): measured, see above.
COLUMN_SUM_GEMV_MIN_WIDTH = 64
# Edges from which a step is GPU-bound enough for the node (see above).
LINEARS_MIN_EDGES = 2_000_000
# Edges x row width x element size from which a GAT-type step is GPU-bound
# enough for ``add_bias``'s and ``node_score_pair``'s forms, which save GPU
# bytes for a few more host ops (~0.08-0.14 ms of host per step on the
# device's host): the fp32 [E, 128] rows of 2M edges. Same-process A/B
# (scripts/ab_glue.py, H200, 9 rounds in rotation, wall per step): GATConv
# fp32 pattern- / cluster-like -7 %, bf16 pattern-like -9 %, heads=8 fp32
# -9 / -10 %, GATv2Conv -3-4 %; host-bound steps (zinc-like, cluster-like
# bf16) +5-23 %, which keep autograd's forms.
GPU_BOUND_EDGE_BYTES = 2_000_000 * 128 * 4


def gpu_bound(x: Tensor, num_edges: int) -> bool:
    """Whether a step of a conv whose fused op reads rows like ``x``'s (an
    [N, ...] tensor) over ``num_edges`` edges trades host ops for GPU bytes
    (see GPU_BOUND_EDGE_BYTES): on CUDA, eager, from that size -- or
    always while a CUDA graph captures (no host work when replayed)."""
    if not x.is_cuda or torch.compiler.is_compiling():
        return False
    if torch.cuda.is_current_stream_capturing():
        return True
    row_bytes = x.numel() // max(x.size(0), 1) * x.element_size()
    return num_edges * row_bytes >= GPU_BOUND_EDGE_BYTES


_ones: Dict[Tuple, Tensor] = {}


def _ones_column(like: Tensor) -> Tensor:
    """[N, 1] ones for ``like`` [N, C] (the GEMV sums' right-hand side): a
    view of one cached vector per device and dtype, grown as needed (not
    while a CUDA graph captures or torch.compile traces: then a fresh
    one)."""
    n = like.size(0)
    key = (like.device, like.dtype)
    ones = _ones.get(key)
    if ones is None or ones.numel() < n:
        ones = like.new_ones(n)
        if not (torch.compiler.is_compiling() or (
                like.is_cuda and torch.cuda.is_current_stream_capturing())):
            _ones[key] = ones
    return ones[:n].view(n, 1)


def column_sum(grad: Tensor) -> Tensor:
    """``grad.sum(0)`` of a 2-D gradient, as a GEMV where that is faster."""
    if grad.is_cuda and grad.size(1) >= COLUMN_SUM_GEMV_MIN_WIDTH \
            and grad.size(0) > 0:
        return torch.mv(grad.t(), _ones_column(grad).view(-1))
    return grad.sum(0)


def add_bias(out: Tensor, bias: Optional[Tensor],
             gpu_bound_step: bool) -> Tensor:
    """``out + bias`` for a 2-D ``out``. In a GPU-bound step (``gpu_bound``
    above) whose bias gradient is asked for, as ``addmm(out, ones, bias)``:
    the same sum, and the bias gradient a GEMV (``ones^T d out``) instead of
    autograd's row reduction (see the module docstring), for ~2 more host
    ops. Under autocast, ``out + bias`` (its promotion to the bias's dtype
    is PyG's result)."""
    if bias is None:
        return out
    if (not gpu_bound_step or out.dim() != 2 or out.dtype != bias.dtype
            or not (bias.requires_grad and torch.is_grad_enabled())
            or out.size(1) < COLUMN_SUM_GEMV_MIN_WIDTH or out.size(0) == 0
            or torch.is_autocast_enabled(out.device.type)):
        return out + bias
    return torch.addmm(out, _ones_column(out), bias.view(1, -1))


class _Linears(torch.autograd.Function):
    """``[x W_k^T + b_k for k]``; ``d x`` accumulated by ``addmm_``."""
    @staticmethod
    def forward(ctx, x: Tensor, count: int, *params: Optional[Tensor]):
        ctx.set_materialize_grads(False)
        weights, biases = params[:count], params[count:]
        ctx.save_for_backward(x, *weights)
        ctx.count = count
        return tuple(torch.nn.functional.linear(x, w, b)
                     for w, b in zip(weights, biases))

    @staticmethod
    def backward(ctx, *grads: Optional[Tensor]):
        x, *weights = ctx.saved_tensors
        count = ctx.count
        need_x = ctx.needs_input_grad[0]
        need_w = ctx.needs_input_grad[2:2 + count]
        need_b = ctx.needs_input_grad[2 + count:]
        x2 = x.reshape(-1, x.size(-1))
        d_x: Optional[Tensor] = None
        d_w: List[Optional[Tensor]] = [None] * count
        d_b: List[Optional[Tensor]] = [None] * count
        for k, grad in enumerate(grads):
            if grad is None:
                continue
            g2 = grad.reshape(-1, grad.size(-1))
            if need_x:
                d_x = torch.mm(g2, weights[k]) if d_x is None \
                    else d_x.addmm_(g2, weights[k])
            if need_w[k]:
                d_w[k] = torch.mm(g2.t(), x2)
            if need_b[k]:  # (False for a None bias)
                d_b[k] = column_sum(g2)
        if d_x is not None:
            d_x = d_x.view(x.shape)
        elif need_x:  # no output was used
            d_x = torch.zeros_like(x)
        return (d_x, None, *d_w, *d_b)


def plain_linear(layer: torch.nn.Module) -> bool:
    """Whether ``layer(x)`` is ``F.linear(x, layer.weight, layer.bias)``:
    not a lazy layer still uninitialised, no hooks."""
    return not (is_uninitialized_parameter(layer.weight)
                or layer._forward_hooks or layer._forward_pre_hooks)


def linears(x: Tensor, layers: Sequence[torch.nn.Module],
            num_edges: int) -> Tuple[Tensor, ...]:
    """``tuple(layer(x) for layer in layers)`` for Linear layers (``weight``
    [out, in], ``bias`` or ``None``) of one input of a graph with
    ``num_edges`` edges: one backward node where that pays (see above);
    layers that are not :func:`plain_linear` run as themselves."""
    capturing = x.is_cuda and torch.cuda.is_current_stream_capturing()
    if len(layers) < 2 or torch.compiler.is_compiling() or not (
            capturing or num_edges >= LINEARS_MIN_EDGES) or not all(
                map(plain_linear, layers)):
        return tuple(layer(x) for layer in layers)
    weights = [layer.weight for layer in layers]
    biases = [layer.bias for layer in layers]
    dtype = autocast_dtype(x)
    if dtype is None:
        return _Linears.apply(x, len(layers), *weights, *biases)
    # autocast casts every input of a linear to its dtype: once here
    def to(t):
        return t if t is None or t.dtype == dtype else t.to(dtype)
    with torch.autocast(x.device.type, enabled=False):
        return _Linears.apply(to(x), len(layers), *map(to, weights),
                              *map(to, biases))

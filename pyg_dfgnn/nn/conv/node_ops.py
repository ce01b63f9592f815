"""GAT's node attention terms ``(x * att).sum(-1)`` as one skinny GEMM.

On a batch of small graphs the fused attention is no longer what a
GATConv training step waits for (zinc-like, 94K nodes x 128 channels, H100:
our kernels 0.2 ms of the step's 1.2 ms of GPU time). The product-and-sum
form writes an [N, H, C] product and reduces it in the forward, and in the
backward forms ``d att`` as a reduction over the N rows of another [N, H, C]
product (PyTorch's ``reduce_kernel``, ~0.1 ms per [94K, 128] fp32, a fifth
of the bandwidth). As ``x @ A``, with ``A`` the block-diagonal [H * C, H]
matrix of ``att``, the forward is one pass over ``x`` and the backward two
GEMMs. Measured in one process (scripts/ab_node_scores.py, H100, module
fwd+bwd): fp32 faster on every graph (cluster-like GATConv 2.13 -> 1.67 ms,
zinc-like 1.22 -> 0.88-1.22); bf16 faster where the attention keeps the GPU
busy (cluster-like 1.62 -> 1.22) but slower on sparse batches whose step is
host- and latency-bound (zinc-like heads=8 0.95 -> 1.18: the K = N GEMMs of
the backward), so half precision keeps the product-and-sum form below a
mean in-degree of 16. Same values up to the order of the sums.

Where one projection feeds both terms (``node_score_pair``), both are one
GEMM against ``[A_src, A_dst]``: one pass over ``x`` in the forward, and in
the backward one GEMM and one accumulation into ``d x`` instead of two each
(autograd adds every use's gradient of ``x`` by an [N, H * C] kernel).
"""
from typing import Dict, Tuple

import torch
from torch import Tensor

_masks: Dict[Tuple, Tensor] = {}

HALF_MIN_MEAN_DEGREE = 16  # fp16 / bf16: the GEMM form from this density


def _block_mask(heads: int, channels: int, like: Tensor) -> Tensor:
    """[H * C, H]: 1 where row h * C + c meets column h; cached in eager
    mode (not made while torch.compile traces or a CUDA graph captures)."""
    key = (heads, channels, like.device, like.dtype)
    mask = _masks.get(key)
    if mask is None:
        mask = torch.eye(heads, device=like.device, dtype=like.dtype)
        mask = mask.repeat_interleave(channels, dim=0)
        if not (torch.compiler.is_compiling() or (
                like.is_cuda and torch.cuda.is_current_stream_capturing())):
            _masks[key] = mask
    return mask


def _gemm_form(x: Tensor, mean_degree: float) -> bool:
    return not (x.dtype in (torch.float16, torch.bfloat16)
                and mean_degree < HALF_MIN_MEAN_DEGREE)


def _score_matrix(att: Tensor, like: Tensor) -> Tensor:
    """[H * C, H]: ``att`` [1, H, C] block-diagonal, in ``like``'s dtype."""
    _, H, C = att.shape
    att = att.to(like.dtype).reshape(H * C, 1)
    return att if H == 1 else att * _block_mask(H, C, like)


def node_scores(x: Tensor, att: Tensor, mean_degree: float) -> Tensor:
    """``(x * att).sum(-1)`` for ``x`` [N, H, C] and ``att`` [1, H, C], on a
    graph of ``mean_degree`` edges per destination."""
    N, H, C = x.shape
    if not _gemm_form(x, mean_degree):
        return (x * att).sum(dim=-1)
    return x.reshape(N, H * C) @ _score_matrix(att, x)


def node_score_pair(x: Tensor, att_src: Tensor, att_dst: Tensor,
                    mean_degree: float,
                    gpu_bound_step: bool) -> Tuple[Tensor, Tensor]:
    """``node_scores`` of one ``x`` [N, H, C] against two ``att`` vectors;
    in a GPU-bound step (linear_ops.gpu_bound: the pair costs ~4 more host
    ops) by one GEMM where the GEMM form applies (the two [N, H]
    results are column blocks of one [N, 2H] product)."""
    if not (gpu_bound_step and _gemm_form(x, mean_degree)):
        return (node_scores(x, att_src, mean_degree),
                node_scores(x, att_dst, mean_degree))
    N, H, C = x.shape
    both = torch.cat([_score_matrix(att_src, x), _score_matrix(att_dst, x)],
                     dim=1)
    src, dst = (x.reshape(N, H * C) @ both).split(H, dim=1)
    return src, dst

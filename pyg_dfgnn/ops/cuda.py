"""CUDA path of the fused op (kernels in ``kernels/``).

The C++ library registers ``torch.ops.pyg_dfgnn.fused_attention_fwd`` /
``fused_attention_bwd`` (CUDA only). Here they are wrapped in one
:func:`torch.library.custom_op`, ``pyg_dfgnn::fused_attention``, with a fake
(meta) implementation and an autograd formula, so that ``torch.compile``
traces calls without graph breaks and the backward runs the fused backward
kernels. Only ``out`` and the row log-sum-exp ``lse`` [N_dst, H] are saved for
the backward; nothing of size E * F.
"""
from typing import Optional, Tuple

import torch
from torch import Tensor

from pyg_dfgnn.dispatch import SMMF
from pyg_dfgnn.ops._loader import load_kernels

KIND_IDS = {'dot': 0, 'add': 1, 'gatv2': 2}
_KERNEL_DTYPES = (torch.float32, torch.float16, torch.bfloat16)
_registered = False


def available() -> bool:
    """True when the CUDA kernels are built and loaded (and registered)."""
    if not load_kernels():
        return False
    _register()
    return True


def _fwd_fake(rowptr, col, kind, query, key, value, att, scale,
              negative_slope, strategy, max_in_degree=-1):
    n_dst = rowptr.shape[0] - 1
    out = value.new_empty((n_dst, value.shape[1], value.shape[2]))
    lse = value.new_empty((n_dst, value.shape[1]), dtype=torch.float32)
    return out, lse


def _bwd_fake(grad_out, rowptr, col, colptr, csc_row, kind, query, key, value,
              att, out, lse, scale, negative_slope):
    grad_att = torch.empty_like(att) if att is not None else \
        value.new_empty((0, ))
    return (torch.empty_like(query), torch.empty_like(key),
            torch.empty_like(value), grad_att)


def _register() -> None:
    """Fake impls of the C++ ops + the differentiable custom op (once)."""
    global _registered, fused_attention_op
    if _registered:
        return
    torch.library.register_fake('pyg_dfgnn::fused_attention_fwd')(_fwd_fake)
    torch.library.register_fake('pyg_dfgnn::fused_attention_bwd')(_bwd_fake)

    @torch.library.custom_op('pyg_dfgnn::fused_attention', mutates_args=())
    def fused_attention_op(rowptr: Tensor, col: Tensor,
                           colptr: Optional[Tensor],
                           csc_row: Optional[Tensor], kind: int,
                           query: Tensor, key: Tensor, value: Tensor,
                           att: Optional[Tensor], scale: float,
                           negative_slope: float, strategy: int,
                           max_in_degree: int) -> Tuple[Tensor, Tensor]:
        return torch.ops.pyg_dfgnn.fused_attention_fwd(
            rowptr, col, kind, query, key, value, att, scale, negative_slope,
            strategy, max_in_degree)

    @fused_attention_op.register_fake
    def _(rowptr, col, colptr, csc_row, kind, query, key, value, att, scale,
          negative_slope, strategy, max_in_degree):
        return _fwd_fake(rowptr, col, kind, query, key, value, att, scale,
                         negative_slope, strategy, max_in_degree)

    def setup_context(ctx, inputs, output):
        (rowptr, col, colptr, csc_row, kind, query, key, value, att, scale,
         negative_slope, _, _) = inputs
        out, lse = output
        ctx.save_for_backward(rowptr, col, colptr, csc_row, query, key, value,
                              att, out, lse)
        ctx.kind, ctx.scale, ctx.negative_slope = kind, scale, negative_slope
        ctx.has_att = att is not None
        ctx.mark_non_differentiable(lse)

    def backward(ctx, grad_out, grad_lse):
        (rowptr, col, colptr, csc_row, query, key, value, att, out,
         lse) = ctx.saved_tensors
        if colptr is None or csc_row is None:
            raise RuntimeError(
                "pyg_dfgnn: the fused op was called without gradients "
                "enabled, so no CSC was built for its backward")
        gq, gk, gv, ga = torch.ops.pyg_dfgnn.fused_attention_bwd(
            grad_out.contiguous(), rowptr, col, colptr, csc_row, ctx.kind,
            query, key, value, att, out, lse, ctx.scale, ctx.negative_slope)
        return (None, None, None, None, None, gq, gk, gv,
                ga if ctx.has_att else None, None, None, None, None)

    fused_attention_op.register_autograd(backward,
                                         setup_context=setup_context)
    globals()['fused_attention_op'] = fused_attention_op
    _registered = True


def _check_cuda_inputs(kind: str, value: Tensor, query: Tensor, key: Tensor,
                       att: Optional[Tensor]) -> None:
    if value.dtype not in _KERNEL_DTYPES + (torch.float64, ):
        raise TypeError(f"The CUDA kernels take float32, float16 or bfloat16 "
                        f"(got 'value' of dtype {value.dtype})")
    for name, t in (('value', value), ('query', query), ('key', key),
                    ('att', att)):
        if t is not None and not t.is_cuda:
            raise ValueError(f"'{name}' must be a CUDA tensor")


def fused_attention_cuda(graph, kind: str, value: Tensor, query: Tensor,
                         key: Tensor, att: Optional[Tensor], scale: float,
                         negative_slope: float,
                         strategy: Optional[str] = None) -> Tensor:
    """Fused attention on CUDA tensors (inputs already validated by
    :func:`pyg_dfgnn.ops.check_inputs`). ``strategy`` overrides the SMMF /
    PMF rule (``'smmf'`` or ``'pmf'``; tests use it)."""
    if kind not in KIND_IDS:
        raise ValueError(f"'kind' must be one of {tuple(KIND_IDS)} "
                         f"(got '{kind}')")
    _check_cuda_inputs(kind, value, query, key, att)
    if value.dtype == torch.float64:  # no fp64 kernels: the exact reference
        from pyg_dfgnn.ops.reference import fused_attention_reference
        return fused_attention_reference(graph, kind, value, query, key, att,
                                         scale, negative_slope)[0]
    if not available():
        raise RuntimeError('pyg_dfgnn CUDA kernels are not available')
    heads = value.shape[1]
    if strategy is None:
        strategy = graph.strategy(heads)
    if strategy not in ('smmf', 'pmf'):
        raise ValueError(f"'strategy' must be 'smmf' or 'pmf' "
                         f"(got '{strategy}')")
    tensors = (query, key, value) + ((att, ) if att is not None else ())
    colptr = csc_row = None
    if torch.is_grad_enabled() and any(t.requires_grad for t in tensors):
        colptr, csc_row, _ = graph.csc()
    out, _ = fused_attention_op(
        graph.rowptr, graph.col, colptr, csc_row, KIND_IDS[kind],
        query.contiguous(), key.contiguous(), value.contiguous(),
        att.contiguous() if att is not None else None, float(scale),
        float(negative_slope), 0 if strategy == SMMF else 1,
        int(graph.max_in_degree))
    # The backward reads `out` (saved by the op); when one will run, hand the
    # caller a copy so that in-place edits of the result (`h.relu_()` on a
    # conv's output view) stay legal, as with PyG's unfused chain.
    return out.clone() if colptr is not None else out


fused_attention_op = None  # set by _register()

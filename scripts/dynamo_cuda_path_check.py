"""Dynamo on the CUDA op's Python path without a GPU.

ops/cuda.py (``_plan``, the windows, the op call) runs on CPU tensors with
the C++ op replaced by a shape-correct stand-in (a custom op with a fake
impl and a zero backward), under ``train.capture=compile`` (``aot_eager``)
of pattern-gps with the dfgnn backend:

    TORCH_LOGS=recompiles,graph_breaks python scripts/dynamo_cuda_path_check.py

Session 9: the same graph breaks (``zero_grad``, ``backward``, the
optimizer's entry) and recompiles (one per padded shape) as on the
reference path, i.e. nothing in the Python path explains dfgnn-compile's
0.5 s per step on the GPU (benchmarks/NOTES.md, "Session 9"). The training
numbers it prints are meaningless (the stand-in computes nothing).
"""
import os
import sys

import torch

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(
    __file__))))

import pyg_dfgnn.nn.conv.gat_conv as gat_conv  # noqa: E402
import pyg_dfgnn.nn.conv.transformer_conv as transformer_conv  # noqa: E402
import pyg_dfgnn.ops as ops  # noqa: E402
import pyg_dfgnn.ops.cuda as cuda  # noqa: E402
import pyg_dfgnn.train.capture as capture  # noqa: E402
from pyg_dfgnn.__main__ import main  # noqa: E402


@torch.library.custom_op('dynamo_check::fused', mutates_args=())
def fused(rowptr: torch.Tensor, query: torch.Tensor, key: torch.Tensor,
          value: torch.Tensor) -> torch.Tensor:
    n = rowptr.numel() - 1
    return value[:1].expand(n, -1, -1) * 0 + (query.sum() + key.sum()) * 0


@fused.register_fake
def _(rowptr, query, key, value):
    return value.new_empty((rowptr.shape[0] - 1, ) + value.shape[1:])


def _setup(ctx, inputs, output):
    ctx.save_for_backward(*inputs[1:])


def _backward(ctx, grad):
    q, k, v = ctx.saved_tensors
    return None, torch.zeros_like(q), torch.zeros_like(k), torch.zeros_like(v)


fused.register_autograd(_backward, setup_context=_setup)


def stand_in(rowptr, col, colptr, csc_row, csc_perm, kind, query, key, value,
             att, scale, slope, *rest):
    """The C++ op's signature and outputs (out, lse, alpha)."""
    out = fused(rowptr, query, key, value)
    return out, out.new_zeros(out.shape[:2]), out.new_zeros(0, out.shape[1])


def fused_attention(graph, kind, value, query, key, att=None, *, scale=1.0,
                    negative_slope=0.2, edge_score=None, edge_key=None,
                    edge_value=None, dropout=0.0, training=False, **_):
    # ops.fused_attention's CUDA branch, taken for CPU tensors
    return cuda.fused_attention_cuda(
        graph, kind, value, query, key, att, scale, negative_slope,
        edge_score=edge_score, edge_key=edge_key, edge_value=edge_value,
        dropout=dropout if training else 0.0)


if __name__ == '__main__':
    capture.COMPILE_BACKEND = 'aot_eager'
    cuda._op, cuda._registered = stand_in, True
    cuda._check_cuda_inputs = lambda *args: None
    cuda._smem_optin = lambda value: 232448  # an H100's opt-in limit
    for module in (ops, gat_conv, transformer_conv):
        module.fused_attention = fused_attention
    main(['train', '--cfg', 'configs/pattern-gps.yaml', 'dataset.size=96',
          'dataset.dir=/tmp/dynamo_check_data', 'train.capture=compile',
          'train.loader=device', 'optim.max_epoch=3', 'device=cpu',
          'train.enable_ckpt=false', 'out_dir=/tmp/dynamo_check_out',
          'train.batch_size=16'] + sys.argv[1:])

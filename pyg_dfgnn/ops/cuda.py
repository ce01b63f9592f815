"""CUDA path of the fused op (kernels in ``kernels/``).

Placeholder until the kernels land: reports the kernels as unavailable so the
reference path runs.
"""


def available() -> bool:
    return False


def fused_attention_cuda(graph, kind, value, query, key, att, scale,
                         negative_slope):
    raise RuntimeError('pyg_dfgnn CUDA kernels are not built')

"""Shared helpers of the conv tests: build a PyG conv and its DF-GNN twin with
the same weights, run both on the same inputs and compare outputs and
gradients (inputs and every parameter)."""
import copy
from typing import Any, Callable, Dict, List, Tuple

import torch
from torch import Tensor
from torch_geometric.nn import AGNNConv, GATConv, GATv2Conv, TransformerConv
from torch_geometric.typing import SparseTensor

from pyg_dfgnn.nn import DFAGNNConv, DFGATConv, DFGATv2Conv, DFTransformerConv

PAIRS = {
    'gat': (GATConv, DFGATConv),
    'gatv2': (GATv2Conv, DFGATv2Conv),
    'transformer': (TransformerConv, DFTransformerConv),
    'agnn': (AGNNConv, DFAGNNConv),
}


def make_pair(name: str, *args, **kwargs) -> Tuple[Any, Any]:
    """PyG conv and DF-GNN conv with identical weights, in eval mode."""
    pyg_cls, df_cls = PAIRS[name]
    pyg = pyg_cls(*args, **kwargs)
    df = df_cls(*args, **kwargs)
    df.load_state_dict(pyg.state_dict(), strict=True)
    # AGNN's beta is 1 after init: move it so its gradient path is tested.
    if name == 'agnn' and pyg.requires_grad:
        with torch.no_grad():
            pyg.beta.fill_(1.7)
            df.beta.fill_(1.7)
    return pyg.eval(), df.eval()


def random_graph(num_src: int, num_dst: int, num_edges: int,
                 seed: int = 0) -> Tensor:
    """Unsorted edges with duplicates and (if square) self-loops."""
    g = torch.Generator().manual_seed(seed)
    src = torch.randint(0, num_src, (num_edges, ), generator=g)
    dst = torch.randint(0, num_dst, (num_edges, ), generator=g)
    ei = torch.stack([src, dst])
    if num_src == num_dst and num_edges >= 2 and num_src > 0:
        ei[:, 0] = 1 % num_src  # make sure a self-loop exists
    return ei


def flatten(result: Any) -> List[Tensor]:
    """All tensors of a conv result, sparse ones as indices + values."""
    if isinstance(result, Tensor):
        if result.layout == torch.sparse_coo:
            result = result.coalesce()
            return [result.indices(), result.values()]
        if result.layout == torch.sparse_csr:
            return [result.crow_indices(), result.col_indices(),
                    result.values()]
        if hasattr(result, 'as_tensor'):  # EdgeIndex
            return [result.as_tensor()]
        return [result]
    if isinstance(result, SparseTensor):
        row, col, value = result.coo()
        return [row, col, value]
    out = []
    for item in result:
        out.extend(flatten(item))
    return out


def run_both(pyg: Any, df: Any, leaves: Dict[str, Tensor],
             call: Callable[[Any, Dict[str, Tensor], bool], Any],
             atol: float = 1e-5, rtol: float = 1e-4,
             seed: int = 0) -> Tuple[Any, Any]:
    """Run ``call(conv, leaves, is_df)`` on both convs with fresh
    requires-grad copies of ``leaves``; assert equal outputs, gradients of
    the float leaves and of every parameter. Returns both results."""
    results, grads = [], []
    for conv, is_df in ((pyg, False), (df, True)):
        mine = {  # index tensors are shared: the graph cache sees one
            k: (v.detach().clone().requires_grad_()
                if v.is_floating_point() else v)
            for k, v in leaves.items()
        }
        conv.zero_grad(set_to_none=True)
        result = call(conv, mine, is_df)
        tensors = flatten(result)
        g = torch.Generator().manual_seed(seed)
        loss = 0.
        for t in tensors:
            if t.is_floating_point() and t.requires_grad:
                w = torch.randn(t.shape, generator=g,
                                dtype=t.dtype).to(t.device)
                loss = loss + (t * w).sum()
        if isinstance(loss, Tensor):
            loss.backward()
        results.append((result, tensors))
        grads.append(({k: v.grad for k, v in mine.items()
                       if v.is_floating_point()},
                      {k: p.grad for k, p in conv.named_parameters()}))

    (res_p, t_p), (res_d, t_d) = results
    assert len(t_p) == len(t_d), (len(t_p), len(t_d))
    for i, (a, b) in enumerate(zip(t_p, t_d)):
        assert a.shape == b.shape, (i, a.shape, b.shape)
        if a.is_floating_point():
            assert a.dtype == b.dtype
            torch.testing.assert_close(b, a, atol=atol, rtol=rtol)
        else:
            assert torch.equal(a.long(), b.long()), i
    (leaf_p, par_p), (leaf_d, par_d) = grads
    for k in leaf_p:
        _assert_grad_close(leaf_d[k], leaf_p[k], f'input {k}', atol, rtol)
    assert par_p.keys() == par_d.keys()
    for k in par_p:
        _assert_grad_close(par_d[k], par_p[k], f'parameter {k}', atol, rtol)
    return res_p, res_d


def _assert_grad_close(got, want, what, atol, rtol):
    if want is None or got is None:
        # One side may see no gradient where the other sees zeros.
        other = got if want is None else want
        assert other is None or not other.any(), what
        return
    torch.testing.assert_close(got, want, atol=atol, rtol=rtol,
                               msg=lambda m: f'{what}: {m}')


def clone_module(m):
    return copy.deepcopy(m)

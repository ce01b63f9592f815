"""The session-9 crash: strategy 3 ('tc') with the 'add' kind straight to
the forward op segfaulted (test_tc_errors) instead of raising its
TORCH_CHECK. Run under gdb for a native backtrace (GPU only)."""
import torch

from pyg_dfgnn.graph import DFGraph
from pyg_dfgnn.ops import cuda

assert cuda.available()
ei = torch.tensor([[0, 1, 2, 1], [0, 0, 1, 2]], device='cuda')
graph = DFGraph.from_edge_index(ei, num_nodes=3)
windows, span = graph.row_windows(128)
if windows is None:
    windows, span = torch.tensor([0, 3], device='cuda'), 3
v = torch.randn(3, 2, 32, device='cuda', dtype=torch.bfloat16)
q = torch.randn(3, 2, device='cuda', dtype=torch.bfloat16)
for kind, query, key in ((1, q, q), (0, v, v)):
    try:
        torch.ops.pyg_dfgnn.fused_attention_fwd(
            graph.rowptr, graph.col, kind, query, key, v, None, 1.0, 0.2, 3,
            graph.max_in_degree, windows, span)
        print('kind', kind, 'ran')
    except RuntimeError as e:
        print('kind', kind, 'raised:', str(e).splitlines()[0][:120])
torch.cuda.synchronize()
print('no crash')

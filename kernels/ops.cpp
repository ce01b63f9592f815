// torch.library registration of the fused attention ops (CUDA kernels in
// fused_attention_fwd.cu / fused_attention_bwd.cu / edge_attr_rows.cu /
// edge_attr_project.cu;
// contract and schemas in ops.h). Python (pyg_dfgnn/ops/cuda.py) adds the fake (meta) impls;
// autograd.cpp the differentiable op.
#include <torch/library.h>

#include "ops.h"

TORCH_LIBRARY(pyg_dfgnn, m) {
  m.def(kFusedAttentionFwdSchema);
  m.def(kFusedAttentionBwdSchema);
  m.def(kEdgeAttrRowsSchema);
  m.def(kEdgeAttrProjectSchema);
}

TORCH_LIBRARY_IMPL(pyg_dfgnn, CUDA, m) {
  m.impl("fused_attention_fwd", &fused_attention_fwd_cuda);
  m.impl("fused_attention_bwd", &fused_attention_bwd_cuda);
  m.impl("edge_attr_rows", &edge_attr_rows_cuda);
  m.impl("edge_attr_project", &edge_attr_project_cuda);
}

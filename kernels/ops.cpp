// torch.library registration of the fused attention ops (CUDA kernels in
// fused_attention_fwd.cu / fused_attention_bwd.cu; contract in ops.h).
// Python (pyg_dfgnn/ops/cuda.py) adds the fake (meta) impls and autograd.
#include <torch/library.h>

#include "ops.h"

namespace {

std::tuple<at::Tensor, at::Tensor> fwd(
    const at::Tensor& rowptr, const at::Tensor& col, int64_t kind,
    const at::Tensor& query, const at::Tensor& key, const at::Tensor& value,
    const c10::optional<at::Tensor>& att, double scale, double negative_slope,
    int64_t strategy, int64_t max_in_degree,
    const c10::optional<at::Tensor>& windows, int64_t stage_nodes) {
  return fused_attention_fwd_cuda(rowptr, col, kind, query, key, value, att,
                                  scale, negative_slope, strategy,
                                  max_in_degree, windows, stage_nodes);
}

std::tuple<at::Tensor, at::Tensor, at::Tensor, at::Tensor> bwd(
    const at::Tensor& grad_out, const at::Tensor& rowptr, const at::Tensor& col,
    const at::Tensor& colptr, const at::Tensor& csc_row,
    const at::Tensor& csc_perm, int64_t kind, const at::Tensor& query,
    const at::Tensor& key, const at::Tensor& value,
    const c10::optional<at::Tensor>& att, const at::Tensor& lse, double scale,
    double negative_slope, const c10::optional<at::Tensor>& windows,
    int64_t stage_nodes, const c10::optional<at::Tensor>& col_windows,
    int64_t col_stage_nodes, int64_t max_in_degree, int64_t max_out_degree) {
  auto grads = fused_attention_bwd_cuda(
      grad_out, rowptr, col, colptr, csc_row, csc_perm, kind, query, key,
      value, att, lse, scale, negative_slope, windows, stage_nodes,
      col_windows, col_stage_nodes, max_in_degree, max_out_degree);
  // A schema output cannot be undefined: no 'att' -> an empty grad_att.
  if (!std::get<3>(grads).defined())
    std::get<3>(grads) = at::empty({0}, value.options());
  return grads;
}

}  // namespace

TORCH_LIBRARY(pyg_dfgnn, m) {
  m.def(
      "fused_attention_fwd(Tensor rowptr, Tensor col, int kind, Tensor query, "
      "Tensor key, Tensor value, Tensor? att, float scale, "
      "float negative_slope, int strategy, int max_in_degree=-1, "
      "Tensor? windows=None, int stage_nodes=0) -> (Tensor, Tensor)");
  m.def(
      "fused_attention_bwd(Tensor grad_out, Tensor rowptr, Tensor col, "
      "Tensor colptr, Tensor csc_row, Tensor csc_perm, int kind, "
      "Tensor query, Tensor key, Tensor value, Tensor? att, Tensor lse, "
      "float scale, float negative_slope, Tensor? windows=None, "
      "int stage_nodes=0, Tensor? col_windows=None, int col_stage_nodes=0, "
      "int max_in_degree=-1, int max_out_degree=-1) "
      "-> (Tensor, Tensor, Tensor, Tensor)");
}

TORCH_LIBRARY_IMPL(pyg_dfgnn, CUDA, m) {
  m.impl("fused_attention_fwd", &fwd);
  m.impl("fused_attention_bwd", &bwd);
}

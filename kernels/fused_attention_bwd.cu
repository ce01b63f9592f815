// Host entry of the fused backward (kernels: bwd_*.cuh, see bwd_common.cuh):
// input checks, output allocation, dtype dispatch. The kernels are
// instantiated per dtype and score kind in
// fused_attention_bwd_{dot,add,gatv2}_{f32,f16,bf16}.cu (nine translation
// units that compile in parallel); here only run_bwd<T>'s kind dispatch.
#include <c10/cuda/CUDAGuard.h>

#include "bwd_launch_template.cuh"
#include "ops.h"

namespace pyg_dfgnn {
namespace bwd {
template void run_bwd<float>(Args&);
template void run_bwd<at::Half>(Args&);
template void run_bwd<at::BFloat16>(Args&);
// (the tensor-core windows' backward: fused_attention_bwd_tc_*.cu)
extern template void run_tc_bwd<float>(Args&, bool);
extern template void run_tc_bwd<at::Half>(Args&, bool);
extern template void run_tc_bwd<at::BFloat16>(Args&, bool);
}  // namespace bwd
}  // namespace pyg_dfgnn

namespace {

void check_tensor(const at::Tensor& t, const char* name,
                  const at::Device& dev) {
  TORCH_CHECK(t.defined(), "fused_attention_bwd: '", name, "' is undefined");
  TORCH_CHECK(t.is_cuda() && t.device() == dev, "fused_attention_bwd: '",
              name, "' must be on ", dev, " (got ", t.device(), ")");
  TORCH_CHECK(t.is_contiguous(), "fused_attention_bwd: '", name,
              "' must be contiguous");
}

void check_shape(const at::Tensor& t, const char* name,
                 std::initializer_list<int64_t> shape) {
  TORCH_CHECK(t.sizes().equals(shape), "fused_attention_bwd: '", name,
              "' has shape ", t.sizes(), ", expected ",
              at::IntArrayRef(shape));
}

}  // namespace

std::tuple<at::Tensor, at::Tensor, at::Tensor, at::Tensor, at::Tensor,
           at::Tensor, at::Tensor>
fused_attention_bwd_cuda(
    const at::Tensor& grad_out, const at::Tensor& rowptr, const at::Tensor& col,
    const at::Tensor& colptr, const at::Tensor& csc_row,
    const at::Tensor& csc_perm, int64_t kind, const at::Tensor& query,
    const at::Tensor& key, const at::Tensor& value,
    const c10::optional<at::Tensor>& att, const at::Tensor& lse, double scale,
    double negative_slope, const c10::optional<at::Tensor>& windows,
    int64_t stage_nodes, const c10::optional<at::Tensor>& col_windows,
    int64_t col_stage_nodes, int64_t max_in_degree, int64_t max_out_degree,
    const c10::optional<at::Tensor>& edge_score,
    const c10::optional<at::Tensor>& edge_key,
    const c10::optional<at::Tensor>& edge_value, double dropout,
    const c10::optional<at::Tensor>& rng_state,
    const c10::optional<at::Tensor>& grad_alpha, int64_t attention,
    const c10::optional<at::Tensor>& attention_perm, int64_t strategy) {
  using pyg_dfgnn::bwd::Args;
  TORCH_CHECK(kind >= 0 && kind <= 2, "fused_attention_bwd: unknown kind ",
              kind);
  TORCH_CHECK(value.defined() && value.is_cuda(),
              "fused_attention_bwd: 'value' must be a CUDA tensor");
  const at::Device dev = value.device();
  // Autograd may hand an expanded (stride-0) gradient: make it dense.
  const at::Tensor dout = grad_out.contiguous();
  for (auto& p : {std::make_pair(&dout, "grad_out"),
                  std::make_pair(&rowptr, "rowptr"),
                  std::make_pair(&col, "col"), std::make_pair(&colptr, "colptr"),
                  std::make_pair(&csc_row, "csc_row"),
                  std::make_pair(&csc_perm, "csc_perm"),
                  std::make_pair(&query, "query"), std::make_pair(&key, "key"),
                  std::make_pair(&value, "value"), std::make_pair(&lse, "lse")})
    check_tensor(*p.first, p.second, dev);
  TORCH_CHECK(value.dim() == 3, "fused_attention_bwd: 'value' must be "
              "[N_src, H, F], got ", value.sizes());
  const int64_t n_src = value.size(0), H = value.size(1), F = value.size(2);
  TORCH_CHECK(H >= 1 && F >= 1, "fused_attention_bwd: H and F must be >= 1");
  TORCH_CHECK(H * F <= (int64_t)1 << 30, "fused_attention_bwd: H*F too large");
  const auto dt = value.scalar_type();
  TORCH_CHECK(dt == at::kFloat || dt == at::kHalf || dt == at::kBFloat16,
              "fused_attention_bwd: dtype must be float32, float16 or "
              "bfloat16 (got ", dt, ")");
  for (auto& p : {std::make_pair(&dout, "grad_out"),
                  std::make_pair(&query, "query"), std::make_pair(&key, "key")})
    TORCH_CHECK(p.first->scalar_type() == dt, "fused_attention_bwd: '",
                p.second, "' has dtype ", p.first->scalar_type(),
                " but 'value' has ", dt);
  TORCH_CHECK(rowptr.scalar_type() == at::kLong &&
                  colptr.scalar_type() == at::kLong,
              "fused_attention_bwd: 'rowptr' and 'colptr' must be int64");
  TORCH_CHECK(col.scalar_type() == at::kInt || col.scalar_type() == at::kLong,
              "fused_attention_bwd: 'col' must be int32 or int64");
  TORCH_CHECK(csc_perm.scalar_type() == at::kInt ||
                  csc_perm.scalar_type() == at::kLong,
              "fused_attention_bwd: 'csc_perm' must be int32 or int64");
  TORCH_CHECK(lse.scalar_type() == at::kFloat,
              "fused_attention_bwd: 'lse' must be float32");
  TORCH_CHECK(rowptr.dim() == 1 && rowptr.size(0) >= 1 && colptr.dim() == 1 &&
                  colptr.size(0) == n_src + 1,
              "fused_attention_bwd: 'rowptr' must be [N_dst + 1] and "
              "'colptr' [N_src + 1]");
  const int64_t n_dst = rowptr.size(0) - 1;
  const int64_t E = col.numel();
  TORCH_CHECK(col.dim() == 1 && csc_row.dim() == 1 && csc_perm.dim() == 1 &&
                  csc_row.numel() == E && csc_perm.numel() == E,
              "fused_attention_bwd: 'col', 'csc_row' and 'csc_perm' must be "
              "1-D of the same length");
  check_shape(dout, "grad_out", {n_dst, H, F});
  check_shape(lse, "lse", {n_dst, H});
  at::Tensor att_t;
  int64_t D = 1;
  if (kind == kAdd) {
    check_shape(query, "query", {n_dst, H});
    check_shape(key, "key", {n_src, H});
  } else {
    TORCH_CHECK(query.dim() == 3, "fused_attention_bwd: 'query' must be "
                "[N_dst, H, D], got ", query.sizes());
    D = query.size(2);
    TORCH_CHECK(D >= 1, "fused_attention_bwd: D must be >= 1");
    TORCH_CHECK(H * D <= (int64_t)1 << 30,
                "fused_attention_bwd: H*D too large");
    check_shape(query, "query", {n_dst, H, D});
    check_shape(key, "key", {n_src, H, D});
    if (kind == kGatv2) {
      TORCH_CHECK(att.has_value() && att->defined(),
                  "fused_attention_bwd: kind gatv2 needs 'att'");
      att_t = *att;
      check_tensor(att_t, "att", dev);
      TORCH_CHECK(att_t.scalar_type() == dt, "fused_attention_bwd: 'att' "
                  "has dtype ", att_t.scalar_type(), " but 'value' has ", dt);
      check_shape(att_t, "att", {H, D});
    }
  }
  // Optional per-edge inputs (CSR order) and the returned weights' gradient.
  auto edge_input = [&](const c10::optional<at::Tensor>& t, const char* name,
                        std::initializer_list<int64_t> shape) -> at::Tensor {
    if (!t.has_value() || !t->defined()) return at::Tensor();
    check_tensor(*t, name, dev);
    TORCH_CHECK(t->scalar_type() == dt, "fused_attention_bwd: '", name,
                "' has dtype ", t->scalar_type(), " but 'value' has ", dt);
    check_shape(*t, name, shape);
    return *t;
  };
  const at::Tensor es = edge_input(edge_score, "edge_score", {E, H});
  const at::Tensor ek = edge_input(edge_key, "edge_key", {E, H, D});
  const at::Tensor ev = edge_input(edge_value, "edge_value", {E, H, F});
  TORCH_CHECK(!es.defined() || kind != kGatv2,
              "fused_attention_bwd: 'edge_score' is not used by 'gatv2'");
  TORCH_CHECK(!ek.defined() || kind != kAdd,
              "fused_attention_bwd: 'edge_key' is not used by 'add'");
  TORCH_CHECK(dropout >= 0.0 && dropout < 1.0,
              "fused_attention_bwd: 'dropout' must be in [0, 1)");
  at::Tensor rng;
  if (dropout > 0.0) {
    TORCH_CHECK(rng_state.has_value() && rng_state->defined(),
                "fused_attention_bwd: dropout needs the forward's "
                "'rng_state'");
    rng = *rng_state;
    check_tensor(rng, "rng_state", dev);
    TORCH_CHECK(rng.scalar_type() == at::kLong && rng.numel() == 2,
                "fused_attention_bwd: 'rng_state' must be int64 [2] (the "
                "forward's)");
  }
  at::Tensor galpha;
  if (grad_alpha.has_value() && grad_alpha->defined()) {
    TORCH_CHECK(attention == 1 || attention == 2,
                "fused_attention_bwd: 'grad_alpha' needs 'attention' 1 "
                "(before dropout) or 2 (after)");
    galpha = grad_alpha->contiguous();
    check_tensor(galpha, "grad_alpha", dev);
    TORCH_CHECK(galpha.scalar_type() == dt, "fused_attention_bwd: "
                "'grad_alpha' has dtype ", galpha.scalar_type(),
                " but 'value' has ", dt);
    check_shape(galpha, "grad_alpha", {E, H});
  }
  at::Tensor aperm;
  if (galpha.defined() && attention_perm.has_value() &&
      attention_perm->defined()) {
    aperm = *attention_perm;
    check_tensor(aperm, "attention_perm", dev);
    TORCH_CHECK((aperm.scalar_type() == at::kInt ||
                 aperm.scalar_type() == at::kLong) &&
                    aperm.dim() == 1 && aperm.numel() == E,
                "fused_attention_bwd: 'attention_perm' must be an int32 / "
                "int64 permutation of the E edges");
  }
  auto check_windows = [&](const c10::optional<at::Tensor>& w,
                           const char* name) -> at::Tensor {
    if (!w.has_value() || !w->defined()) return at::Tensor();
    check_tensor(*w, name, dev);
    TORCH_CHECK(w->scalar_type() == at::kLong && w->dim() == 1 &&
                    w->numel() >= 2,
                "fused_attention_bwd: '", name, "' must be int64 [W + 1] "
                "owner boundaries (DFGraph.row_windows / col_windows)");
    return *w;
  };

  const c10::cuda::CUDAGuard guard(dev);
  Args a;
  a.grad_out = dout;
  a.rowptr = rowptr;
  // The kernels index col / csc_row / csc_perm with one index type.
  const bool idx64 = col.scalar_type() == at::kLong ||
                     csc_row.scalar_type() == at::kLong ||
                     csc_perm.scalar_type() == at::kLong;
  const auto it = idx64 ? at::kLong : at::kInt;
  a.col = col.to(it);
  a.colptr = colptr;
  a.csc_row = csc_row.to(it);
  a.csc_perm = csc_perm.to(it);
  a.edge_score = es;
  a.edge_key = ek;
  a.edge_value = ev;
  a.grad_alpha = galpha;
  a.attention_perm = aperm.defined() ? aperm.to(it) : aperm;
  a.alpha_dropped = attention == 2;
  // TransformerConv's ek = ev: one [E, H, F] gradient (in grad_edge_key)
  a.ekv_shared = kind == kDot && ek.defined() && ev.defined() &&
                 ek.is_same(ev);
  a.drop = pyg_dfgnn::dropout_mask(
      dropout, rng.defined() ? rng.data_ptr<int64_t>() : nullptr);
  a.query = query;
  a.key = key;
  a.value = value;
  a.att = att_t;
  a.lse = lse;
  a.windows = check_windows(windows, "windows");
  a.col_windows = check_windows(col_windows, "col_windows");
  a.stage_nodes = stage_nodes;
  a.col_stage_nodes = col_stage_nodes;
  // Unknown (-1): treated as long (plain blocks then run segments), so the
  // backward never syncs with the host for it.
  a.max_in_degree = max_in_degree;
  a.max_out_degree = max_out_degree;
  a.kind = kind;
  a.scale = scale;
  a.slope = negative_slope;
  a.grad_query = at::empty_like(query);
  a.grad_key = at::empty_like(key);
  a.grad_value = at::empty_like(value);
  // A schema output cannot be undefined: no 'att' -> an empty grad_att.
  a.grad_att = att_t.defined() ? at::empty_like(att_t)
                               : at::empty({0}, value.options());
  auto grad_of = [&](const at::Tensor& t) {
    return t.defined() ? at::empty_like(t) : at::empty({0}, value.options());
  };
  a.grad_edge_score = grad_of(es);
  a.grad_edge_key = grad_of(ek);
  a.grad_edge_value = a.ekv_shared ? at::empty({0}, value.options())
                                   : grad_of(ev);
  // tensor-core windows (conditions: ops.h) after a TC (2, 6) or SMMF (4)
  // forward: both save the same lse; 6: fp32's products as one TF32 mma
  if (strategy == 2 || strategy == 4 || strategy == 6) {
    const int64_t DH = value.size(2);
    TORCH_CHECK(strategy != 6 || dt == at::kFloat,
                "fused_attention_bwd: strategy 6 (1xTF32 tensor-core "
                "windows) takes float32 inputs");
    TORCH_CHECK(kind == kDot && !es.defined() && !ek.defined() &&
                    !ev.defined() && !galpha.defined() && dropout == 0.0 &&
                    it == at::kInt && a.windows.defined() &&
                    // edge multiplicities are counted in a byte
                    max_in_degree >= 0 && max_in_degree <= 255 &&
                    query.size(-1) == DH &&
                    (DH == 16 || DH == 32 || DH == 64 || DH == 128),
                "fused_attention_bwd: tensor-core windows take the 'dot' "
                "kind, int32 indices, row windows, D = F in {16, 32, 64, "
                "128}, in-degrees <= 255 and no training features");
    // (as the forward: the fragments read 4 bytes at a time)
    for (at::Tensor* t : {&a.query, &a.key, &a.value, &a.grad_out})
      *t = aligned16_or_copy(*t);
    switch (dt) {
      case at::kFloat:
        pyg_dfgnn::bwd::run_tc_bwd<float>(a, strategy == 6);
        break;
      case at::kHalf: pyg_dfgnn::bwd::run_tc_bwd<at::Half>(a, false); break;
      default: pyg_dfgnn::bwd::run_tc_bwd<at::BFloat16>(a, false); break;
    }
    a.grad_att.zero_();
    return {a.grad_query,      a.grad_key,      a.grad_value,
            a.grad_att,        a.grad_edge_score, a.grad_edge_key,
            a.grad_edge_value};
  }
  switch (dt) {
    case at::kFloat: pyg_dfgnn::bwd::run_bwd<float>(a); break;
    case at::kHalf: pyg_dfgnn::bwd::run_bwd<at::Half>(a); break;
    default: pyg_dfgnn::bwd::run_bwd<at::BFloat16>(a); break;
  }
  return {a.grad_query,      a.grad_key,      a.grad_value,
          a.grad_att,        a.grad_edge_score, a.grad_edge_key,
          a.grad_edge_value};
}

// Host entry of the fused forward (kernels: fwd_*.cuh, see fwd_common.cuh): input
// checks, output allocation, the SMMF / PMF decision, dtype dispatch. The
// kernels are instantiated in fused_attention_fwd_{smmf,pmf}_{f32,f16,bf16}.cu
// (six translation units that compile in parallel).
#include <ATen/cuda/CUDAGeneratorImpl.h>
#include <c10/cuda/CUDAGuard.h>

#include <mutex>

#include <algorithm>

#include "fwd_launch_template.cuh"
#include "ops.h"

namespace pyg_dfgnn {
namespace fwd {
#define PYG_DFGNN_DECLARE(T)                       \
  extern template void run_smmf<T>(const Launch&); \
  extern template void run_pmf<T>(const Launch&);
PYG_DFGNN_DECLARE(float)
PYG_DFGNN_DECLARE(at::Half)
PYG_DFGNN_DECLARE(at::BFloat16)
#undef PYG_DFGNN_DECLARE
extern template void run_tc<float>(const Launch&);
extern template void run_tc<at::Half>(const Launch&);
extern template void run_tc<at::BFloat16>(const Launch&);
}  // namespace fwd
}  // namespace pyg_dfgnn

namespace {
using namespace pyg_dfgnn;
using namespace pyg_dfgnn::fwd;

void check_cuda(const at::Tensor& t, const char* name, at::Device dev) {
  TORCH_CHECK(t.is_cuda(), "fused_attention_fwd: '", name,
              "' must be a CUDA tensor");
  TORCH_CHECK(t.device() == dev, "fused_attention_fwd: '", name, "' is on ",
              t.device(), " but 'value' is on ", dev);
  TORCH_CHECK(t.is_contiguous(), "fused_attention_fwd: '", name,
              "' must be contiguous");
}

// An optional per-edge input: checked, or undefined when absent.
at::Tensor edge_input(const c10::optional<at::Tensor>& t, const char* name,
                      at::IntArrayRef shape, at::ScalarType dtype,
                      at::Device dev) {
  if (!t.has_value() || !t->defined()) return at::Tensor();
  check_cuda(*t, name, dev);
  TORCH_CHECK(t->scalar_type() == dtype, "fused_attention_fwd: '", name,
              "' has dtype ", t->scalar_type(), " but 'value' has ", dtype);
  TORCH_CHECK(t->sizes().equals(shape), "fused_attention_fwd: '", name,
              "' must have shape ", shape, " (got ", t->sizes(), ")");
  return *t;
}



}  // namespace

std::tuple<at::Tensor, at::Tensor, at::Tensor, at::Tensor>
fused_attention_fwd_cuda(
    const at::Tensor& rowptr, const at::Tensor& col, int64_t kind,
    const at::Tensor& query, const at::Tensor& key, const at::Tensor& value,
    const c10::optional<at::Tensor>& att_opt, double scale,
    double negative_slope, int64_t strategy, int64_t max_in_degree,
    const c10::optional<at::Tensor>& windows_opt, int64_t stage_nodes,
    const c10::optional<at::Tensor>& edge_score_opt,
    const c10::optional<at::Tensor>& edge_key_opt,
    const c10::optional<at::Tensor>& edge_value_opt, double dropout,
    int64_t attention, const c10::optional<at::Tensor>& attention_perm_opt) {
  TORCH_CHECK(kind >= 0 && kind <= 2, "fused_attention_fwd: unknown kind ",
              kind);
  const at::Device dev = value.device();
  check_cuda(value, "value", dev);
  check_cuda(query, "query", dev);
  check_cuda(key, "key", dev);
  check_cuda(rowptr, "rowptr", dev);
  check_cuda(col, "col", dev);
  TORCH_CHECK(rowptr.scalar_type() == at::kLong && rowptr.dim() == 1 &&
                  rowptr.numel() >= 1,
              "fused_attention_fwd: 'rowptr' must be int64 [N_dst + 1]");
  TORCH_CHECK(col.dim() == 1, "fused_attention_fwd: 'col' must be 1-D");
  TORCH_CHECK(value.dim() == 3, "fused_attention_fwd: 'value' must be "
              "[N_src, H, F]");
  const auto dtype = value.scalar_type();
  TORCH_CHECK(query.scalar_type() == dtype && key.scalar_type() == dtype,
              "fused_attention_fwd: 'query', 'key' and 'value' must share a "
              "dtype");
  const int64_t n_dst = rowptr.numel() - 1, n_src = value.size(0);
  const int64_t H = value.size(1), F = value.size(2);
  int64_t D = 1;
  if (kind == kAdd) {
    TORCH_CHECK(query.dim() == 2 && query.size(0) == n_dst &&
                    query.size(1) == H,
                "fused_attention_fwd: 'query' must be [N_dst, H] for 'add'");
    TORCH_CHECK(key.dim() == 2 && key.size(0) == n_src && key.size(1) == H,
                "fused_attention_fwd: 'key' must be [N_src, H] for 'add'");
  } else {
    D = query.size(-1);
    TORCH_CHECK(query.dim() == 3 && query.size(0) == n_dst &&
                    query.size(1) == H,
                "fused_attention_fwd: 'query' must be [N_dst, H, D]");
    TORCH_CHECK(key.dim() == 3 && key.size(0) == n_src && key.size(1) == H &&
                    key.size(2) == D,
                "fused_attention_fwd: 'key' must be [N_src, H, D]");
  }
  at::Tensor att;
  if (kind == kGatv2) {
    TORCH_CHECK(att_opt.has_value() && att_opt->defined(),
                "fused_attention_fwd: 'gatv2' needs 'att'");
    att = *att_opt;
    check_cuda(att, "att", dev);
    TORCH_CHECK(att.scalar_type() == dtype && att.dim() == 2 &&
                    att.size(0) == H && att.size(1) == D,
                "fused_attention_fwd: 'att' must be [H, D] in value's dtype");
  }
  TORCH_CHECK(H >= 1 && F >= 1 && D >= 1,
              "fused_attention_fwd: H, F and D must be >= 1");
  TORCH_CHECK(H * std::max(D, F) < (int64_t(1) << 30),
              "fused_attention_fwd: H * F too large");

  const int64_t n_edges = col.numel();
  const at::Tensor edge_score =
      edge_input(edge_score_opt, "edge_score", {n_edges, H}, dtype, dev);
  const at::Tensor edge_key =
      edge_input(edge_key_opt, "edge_key", {n_edges, H, D}, dtype, dev);
  const at::Tensor edge_value =
      edge_input(edge_value_opt, "edge_value", {n_edges, H, F}, dtype, dev);
  TORCH_CHECK(!edge_score.defined() || kind != kGatv2,
              "fused_attention_fwd: 'edge_score' is not used by 'gatv2'");
  TORCH_CHECK(!edge_key.defined() || kind != kAdd,
              "fused_attention_fwd: 'edge_key' is not used by 'add'");
  TORCH_CHECK(dropout >= 0.0 && dropout < 1.0,
              "fused_attention_fwd: 'dropout' must be in [0, 1) (got ",
              dropout, ")");
  TORCH_CHECK(attention >= 0 && attention <= 2,
              "fused_attention_fwd: 'attention' must be 0 (none), 1 (before "
              "dropout) or 2 (after dropout)");
  at::Tensor attention_perm;
  if (attention > 0 && attention_perm_opt.has_value() &&
      attention_perm_opt->defined()) {
    attention_perm = *attention_perm_opt;
    check_cuda(attention_perm, "attention_perm", dev);
    TORCH_CHECK((attention_perm.scalar_type() == at::kInt ||
                 attention_perm.scalar_type() == at::kLong) &&
                    attention_perm.dim() == 1 &&
                    attention_perm.numel() == n_edges,
                "fused_attention_fwd: 'attention_perm' must be an int32 / "
                "int64 permutation of the E edges");
  }

  const c10::cuda::CUDAGuard guard(dev);
  auto out = at::empty({n_dst, H, F}, value.options());
  auto lse = at::empty({n_dst, H}, value.options().dtype(at::kFloat));
  // (A schema output cannot be undefined: empty tensors when not asked.)
  auto alpha = at::empty({attention > 0 ? n_edges : 0, H}, value.options());
  auto rng_state = at::empty({dropout > 0.0 ? 2 : 0},
                             value.options().dtype(at::kLong));
  DropoutMask drop = dropout_mask(dropout);
  if (drop.active) {
    // Graph-safe under CUDA graph capture: the kernel unpacks the state.
    auto* gen = at::get_generator_or_default<at::CUDAGeneratorImpl>(
        c10::nullopt, at::cuda::detail::getDefaultCUDAGenerator());
    std::lock_guard<std::mutex> lock(gen->mutex_);
    drop.philox = gen->philox_cuda_state(4);
    drop.save = rng_state.data_ptr<int64_t>();
  }
  if (n_dst == 0) return {out, lse, alpha, rng_state};

  if (max_in_degree < 0)
    max_in_degree = n_edges == 0 ? 0 : (rowptr.slice(0, 1) -
                                        rowptr.slice(0, 0, n_dst)).max().item<int64_t>();

  const int vw = 16 / (int)value.element_size();
  const bool vec = F % vw == 0 && (kind == kAdd || D % vw == 0) &&
                   aligned16(value) && aligned16(out) &&
                   (kind == kAdd || (aligned16(query) && aligned16(key))) &&
                   aligned16(att) && aligned16(edge_key) &&
                   aligned16(edge_value);
  const int vw_used = vec ? vw : 1;
  const int qk_group =
      std::min(32, next_pow2((int)((D + vw_used - 1) / vw_used)));
  const int v_group = std::min(32, next_pow2((int)(H * F / vw_used)));

  int device_optin = 0;
  C10_CUDA_CHECK(cudaDeviceGetAttribute(
      &device_optin, cudaDevAttrMaxSharedMemoryPerBlockOptin, dev.index()));

  Launch L{rowptr, col, query, key, value, att, out, lse, at::Tensor(),
           edge_score, edge_key, edge_value,
           attention > 0 ? alpha : at::Tensor(), attention_perm,
           attention == 2, drop,
           kind, n_dst, n_edges, max_in_degree, H, D, F,
           qk_group, v_group, device_optin, 0, vec, scale, negative_slope};
  // tensor-core windows (asked for; 5 / 6: fp32 with 1xTF32 products)
  if (strategy == 2 || strategy == 3 || strategy == 5 || strategy == 6) {
    TORCH_CHECK(strategy < 5 || dtype == at::kFloat,
                "fused_attention_fwd: strategies 5 / 6 (1xTF32 tensor-core "
                "windows) take float32 inputs");
    L.one_tf32 = strategy >= 5;
    TORCH_CHECK(windows_opt.has_value() && windows_opt->defined() &&
                    windows_opt->scalar_type() == at::kLong &&
                    windows_opt->dim() == 1 && windows_opt->numel() >= 2,
                "fused_attention_fwd: tensor-core windows need int64 [W + 1] "
                "row windows of at most ", kTcMaxSrc, " sources each "
                "(DFGraph.row_windows(", kTcMaxSrc, "))");
    check_cuda(*windows_opt, "windows", dev);
    TORCH_CHECK(kind == kDot && col.scalar_type() == at::kInt && D == F &&
                    (D == 16 || D == 32 || D == 64 || D == 128) &&
                    !L.features() && max_in_degree <= kTcMaxDegree,
                "fused_attention_fwd: tensor-core windows take the 'dot' "
                "kind, int32 'col', D = F in {16, 32, 64, 128}, no edge "
                "terms / dropout / attention weights and in-degrees <= ",
                kTcMaxDegree);
    TORCH_CHECK(tc_layout((int)D, value.element_size()).total <=
                    (size_t)device_optin,
                "fused_attention_fwd: tensor-core window too large for the "
                "device's shared memory");
    L.windows = *windows_opt;
    // The MMA fragments and cp.async read 4 / 16 bytes at a time: inputs
    // at an odd offset (views into a larger buffer) run on aligned copies.
    for (at::Tensor* t : {&L.query, &L.key, &L.value})
      *t = aligned16_or_copy(*t);
    if (dtype == at::kFloat)
      run_tc<float>(L);
    else if (dtype == at::kHalf)
      run_tc<at::Half>(L);
    else
      run_tc<at::BFloat16>(L);
    return {out, lse, alpha, rng_state};
  }
  // SMMF needs int32 'col' and its per-warp scratch (query row, one chunk of
  // scores) in shared memory; anything else runs PMF. Graph-aligned windows
  // stage up to `stage_nodes` source rows each, as many as fit.
  // (4: SMMF here, the backward's tensor-core windows after it)
  bool smmf = (strategy == 0 || strategy == 4) && col.scalar_type() == at::kInt &&
              H <= kSmmfMaxHeads;
  if (smmf && windows_opt.has_value() && windows_opt->defined() &&
      stage_nodes > 0) {
    const at::Tensor& windows = *windows_opt;
    check_cuda(windows, "windows", dev);
    TORCH_CHECK(windows.scalar_type() == at::kLong && windows.dim() == 1 &&
                    windows.numel() >= 2,
                "fused_attention_fwd: 'windows' must be int64 [W + 1] row "
                "boundaries from DFGraph.row_windows");
    const size_t base = smmf_launch_layout(L, 0, kSmmfStagedWarps).total;
    const size_t per_node = smmf_launch_layout(L, 1, kSmmfStagedWarps).total -
                            base;
    if (base + per_node <= (size_t)device_optin) {
      L.stage_span = std::min<int64_t>(
          stage_nodes, ((size_t)device_optin - base) / std::max<size_t>(per_node, 1));
      // 16-byte rounding of the two staged arrays
      while (L.stage_span > 0 &&
             smmf_launch_layout(L, L.stage_span, kSmmfStagedWarps).total >
                 (size_t)device_optin)
        --L.stage_span;
      if (L.stage_span > 0) L.windows = windows;
    }
  }
  if (smmf && !L.windows.defined() &&
      smmf_launch_layout(L, 0, kSmmfPlainWarps).total > (size_t)device_optin)
    smmf = false;
  switch (dtype) {
    case at::kFloat: smmf ? run_smmf<float>(L) : run_pmf<float>(L); break;
    case at::kHalf:
      smmf ? run_smmf<at::Half>(L) : run_pmf<at::Half>(L);
      break;
    case at::kBFloat16:
      smmf ? run_smmf<at::BFloat16>(L) : run_pmf<at::BFloat16>(L);
      break;
    default:
      TORCH_CHECK(false, "fused_attention_fwd: unsupported dtype ", dtype,
                  " (expected float32, float16 or bfloat16)");
  }
  return {out, lse, alpha, rng_state};
}

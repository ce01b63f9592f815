// Host entry of the fused forward (kernels in fused_attention_fwd.cuh): input
// checks, output allocation, the SMMF / PMF decision, dtype dispatch. The
// kernels are instantiated in fused_attention_fwd_{smmf,pmf}_{f32,f16,bf16}.cu
// (six translation units that compile in parallel).
#include <c10/cuda/CUDAGuard.h>

#include <algorithm>
#include <cstdlib>

#include "fused_attention_fwd.cuh"
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

int env_int(const char* name, int fallback) {
  const char* v = std::getenv(name);
  return v && *v ? std::atoi(v) : fallback;
}

bool aligned16(const at::Tensor& t) {
  return !t.defined() || t.numel() == 0 ||
         reinterpret_cast<uintptr_t>(t.data_ptr()) % 16 == 0;
}


}  // namespace

std::tuple<at::Tensor, at::Tensor> fused_attention_fwd_cuda(
    const at::Tensor& rowptr, const at::Tensor& col, int64_t kind,
    const at::Tensor& query, const at::Tensor& key, const at::Tensor& value,
    const c10::optional<at::Tensor>& att_opt, double scale,
    double negative_slope, int64_t strategy, int64_t max_in_degree) {
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

  const c10::cuda::CUDAGuard guard(dev);
  auto out = at::empty({n_dst, H, F}, value.options());
  auto lse = at::empty({n_dst, H}, value.options().dtype(at::kFloat));
  if (n_dst == 0) return {out, lse};
  const int64_t n_edges = col.numel();

  if (max_in_degree < 0)
    max_in_degree = n_edges == 0 ? 0 : (rowptr.slice(0, 1) -
                                        rowptr.slice(0, 0, n_dst)).max().item<int64_t>();

  const int vw = 16 / (int)value.element_size();
  const bool vec = F % vw == 0 && (kind == kAdd || D % vw == 0) &&
                   aligned16(value) && aligned16(out) &&
                   (kind == kAdd || (aligned16(query) && aligned16(key))) &&
                   aligned16(att);
  const int vw_used = vec ? vw : 1;
  const int qk_group =
      std::min(32, next_pow2((int)((D + vw_used - 1) / vw_used)));
  const int v_group = std::min(32, next_pow2((int)(H * F / vw_used)));

  int device_optin = 0;
  C10_CUDA_CHECK(cudaDeviceGetAttribute(
      &device_optin, cudaDevAttrMaxSharedMemoryPerBlockOptin, dev.index()));

  // SMMF rows per block: the default window if its smem is modest, else the
  // most rows that fit; PMF if even one row does not fit.
  const int HD_q = kind == kAdd ? (int)H : (int)(H * D);
  const int HD_att = kind == kGatv2 ? (int)(H * D) : 0;
  const size_t ib = col.element_size();
  // Tuning knobs for experiments (benchmarks/NOTES.md), defaults otherwise:
  // PYG_DFGNN_SMMF_ROWS rows per window, PYG_DFGNN_SMMF_WPB windows per block
  // (-1: a persistent grid of 2 blocks per SM).
  const int rows_pref = env_int("PYG_DFGNN_SMMF_ROWS", kSmmfRows);
  int64_t windows_per_block = env_int("PYG_DFGNN_SMMF_WPB", 1);
  int rows = 0;
  if (strategy == 0 && col.scalar_type() == at::kInt) {
    for (int r = std::max(1, rows_pref); r >= 1; --r) {
      const size_t b = smmf_layout(r, r * max_in_degree, (int)H, HD_q,
                                   HD_att, ib).total;
      if (b <= (size_t)kSmmfPreferredSmem || (r == 1 && b <= (size_t)device_optin)) {
        rows = r;
        break;
      }
    }
  }


  // PYG_DFGNN_SMMF_STAGE_KB: smem (KB) for staging a window's K / V rows
  // when its sources are close (0: off).
  int64_t stage_bytes = 0;
  if (rows > 0) {
    const size_t base = smmf_layout(rows, rows * max_in_degree, (int)H, HD_q,
                                    HD_att, ib).total;
    stage_bytes = (int64_t)env_int("PYG_DFGNN_SMMF_STAGE_KB", 0) * 1024;
    stage_bytes = std::max<int64_t>(
        0, std::min<int64_t>(stage_bytes, (int64_t)device_optin - (int64_t)base));
    stage_bytes &= ~int64_t(15);
  }
  if (rows > 0 && windows_per_block < 0) {
    int sms = 0;
    C10_CUDA_CHECK(cudaDeviceGetAttribute(
        &sms, cudaDevAttrMultiProcessorCount, dev.index()));
    const int64_t n_windows = (n_dst + rows - 1) / rows;
    windows_per_block = std::max<int64_t>(1, (n_windows + 2 * sms - 1) / (2 * sms));
  }
  Launch L{rowptr, col, query, key, value, att, out, lse,
           kind, n_dst, n_edges, max_in_degree, H, D, F,
           qk_group, v_group, rows, device_optin, windows_per_block,
           stage_bytes, vec, scale, negative_slope};
  switch (dtype) {
    case at::kFloat: rows ? run_smmf<float>(L) : run_pmf<float>(L); break;
    case at::kHalf:
      rows ? run_smmf<at::Half>(L) : run_pmf<at::Half>(L);
      break;
    case at::kBFloat16:
      rows ? run_smmf<at::BFloat16>(L) : run_pmf<at::BFloat16>(L);
      break;
    default:
      TORCH_CHECK(false, "fused_attention_fwd: unsupported dtype ", dtype,
                  " (expected float32, float16 or bfloat16)");
  }
  return {out, lse};
}

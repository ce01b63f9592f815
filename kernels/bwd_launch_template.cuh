// Host side of the backward kernels: Args (filled by the host entry
// fused_attention_bwd.cu), the passes' launches, run_bwd_kind<T, KIND>
// (the kernels of one dtype and score kind, instantiated per pair in
// fused_attention_bwd_{dot,add,gatv2}_{f32,f16,bf16}.cu, so that the nine
// compile in parallel) and run_bwd<T>, the dtype's dispatch over kinds.
#pragma once

#include <ATen/cuda/CUDAContext.h>
#include <c10/cuda/CUDAException.h>
#include <c10/cuda/CUDAStream.h>

#include <algorithm>
#include <cstdlib>

#include "bwd_common.cuh"
#include "bwd_kernel.cuh"
#include "bwd_short_kernel.cuh"
#include "bwd_tc_kernel.cuh"
#include "dispatch.cuh"

namespace pyg_dfgnn {
namespace bwd {

// Everything the typed host code needs (tensors already checked).
struct Args {
  at::Tensor grad_out, rowptr, col, colptr, csc_row, csc_perm, query, key,
      value, att, lse, windows, col_windows;
  at::Tensor edge_score, edge_key, edge_value;  // CSR order (or undefined)
  at::Tensor grad_alpha, attention_perm;  // (undefined: none / identity)
  bool alpha_dropped, ekv_shared;
  DropoutMask drop;
  int64_t kind, stage_nodes, col_stage_nodes;
  int64_t max_in_degree, max_out_degree;  // longest CSR row / CSC column
  double scale, slope;
  // outputs, allocated by the caller (the edge ones where wanted)
  at::Tensor grad_query, grad_key, grad_value, grad_att;
  at::Tensor grad_edge_score, grad_edge_key, grad_edge_value;
};

template <typename T> void run_bwd(Args& a);
template <typename T> void run_tc_bwd(Args& a, bool one_tf32);
template <typename T, int KIND> void run_bwd_kind(Args& a, int optin,
                                                  bool vec);
// Each (dtype, kind) is instantiated in its own unit, none implicitly.
#define PYG_DFGNN_BWD_KINDS(PREFIX, T)                          \
  PREFIX template void run_bwd_kind<T, kDot>(Args&, int, bool); \
  PREFIX template void run_bwd_kind<T, kAdd>(Args&, int, bool); \
  PREFIX template void run_bwd_kind<T, kGatv2>(Args&, int, bool);
PYG_DFGNN_BWD_KINDS(extern, float)
PYG_DFGNN_BWD_KINDS(extern, at::Half)
PYG_DFGNN_BWD_KINDS(extern, at::BFloat16)

namespace detail {

// One pass's launch: staged windows when given (and the layout fits), else
// plain blocks; warps halved while the per-warp scratch does not fit.
template <typename T, typename I, int KIND, bool VEC, bool COLS, int FEAT,
          bool LEAN, bool LANES>
void launch(const BwdArgs<T, I>& args, const at::Tensor& ptr,
            int64_t n_edges, int64_t max_degree, const at::Tensor& windows,
            int64_t stage_nodes, int optin, at::Tensor* att_part,
            const at::TensorOptions& fopt) {
  auto kernel = bwd_kernel<T, I, KIND, VEC, COLS, FEAT, LEAN, LANES>;
  constexpr int kStaged = kWideBlock<T, KIND, COLS> ? kWideThreads / kWarpSize
                                                    : kStagedWarps;
  const int H = args.H, D = args.D;
  const int HD_k = KIND == kAdd ? H : H * D, HF = H * args.F;
  const int HD_att = KIND == kGatv2 ? H * D : 0;
  auto total = [&](int64_t span, int warps) {
    return bwd_layout(COLS, KIND, (int)span, H, HD_k, HF, HD_att, warps,
                      sizeof(T), LEAN)
        .total;
  };
  int warps = kStaged;
  int64_t span = 0;
  const bool windowed = std::is_same<I, int32_t>::value && windows.defined() &&
                        stage_nodes > 0 && windows.numel() >= 2;
  // The most neighbours a block of `w` warps can stage (<= stage_nodes).
  auto capacity = [&](int w) -> int64_t {
    if (total(1, w) > (size_t)optin) return 0;
    const size_t base = total(0, w), per = total(1, w) - base;
    int64_t c = std::min<int64_t>(
        stage_nodes, ((size_t)optin - base) / std::max<size_t>(per, 1));
    while (c > 0 && total(c, w) > (size_t)optin) --c;
    return c;
  };
  if (windowed) {
    // The windows were cut for the forward's smaller scratch: when 32 warps
    // cannot stage the widest one, 16 warps (half the scratch) may.
    span = capacity(warps);
    if (span < stage_nodes && capacity(kStaged / 2) > span) {
      warps = kStaged / 2;
      span = capacity(warps);
    }
  }
  const bool staged = span > 0;
  if (!staged) {
    warps = kPlainWarps;
    while (warps > 1 && total(0, warps) > (size_t)optin) warps /= 2;
    TORCH_CHECK(total(0, warps) <= (size_t)optin,
                "fused_attention_bwd: H * F = ", HF, " (H * D = ", HD_k,
                ") needs more shared memory per warp than the device has");
  }
  BwdArgs<T, I> a = args;
  // Plain blocks with long owners (super nodes) or an unknown longest
  // owner: segments of kSegEdges edges spread one owner over many warps
  // (bounds known without a sync).
  at::Tensor seg_ptr, slot_ptr, part;
  int64_t units = args.n_owner;
  if (!staged && (max_degree < 0 || max_degree > kSegEdges)) {
    const int64_t n = args.n_owner;
    auto deg = ptr.slice(0, 1) - ptr.slice(0, 0, n);
    auto nseg = deg.add(kSegEdges - 1).div(kSegEdges, "floor").clamp_min(1);
    auto zero = at::zeros({1}, ptr.options());
    seg_ptr = at::cat({zero, nseg.cumsum(0)});
    slot_ptr = at::cat(
        {zero, at::where(nseg > 1, nseg, at::zeros_like(nseg)).cumsum(0)});
    units = n + n_edges / kSegEdges + 1;
    const int64_t W = COLS ? HD_k + HF : 2 * HD_k + H;
    part = at::empty({2 * (n_edges / kSegEdges) + 2, W}, fopt);
    a.seg_ptr = seg_ptr.data_ptr<int64_t>();
    a.slot_ptr = slot_ptr.data_ptr<int64_t>();
    a.part = part.data_ptr<float>();
  }
  const int64_t blocks = staged ? windows.numel() - 1
                                : (units + kPlainOwners - 1) / kPlainOwners;
  if (att_part != nullptr) {
    *att_part = at::empty({std::max<int64_t>(blocks, 0), HD_att}, fopt);
    a.att_part = att_part->data_ptr<float>();
  }
  if (blocks <= 0) return;
  const size_t bytes = total(span, warps);
  if (bytes > 48 * 1024)
    C10_CUDA_CHECK(cudaFuncSetAttribute(
        kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, (int)bytes));
  kernel<<<(unsigned)blocks, warps * kWarpSize, bytes,
           c10::cuda::getCurrentCUDAStream()>>>(
      a, staged ? windows.data_ptr<int64_t>() : nullptr, (int)span);
  C10_CUDA_KERNEL_LAUNCH_CHECK();
  if (seg_ptr.defined()) {
    bwd_combine_kernel<T, KIND, COLS>
        <<<(unsigned)((a.n_owner + 7) / 8), 256, 0,
           c10::cuda::getCurrentCUDAStream()>>>(
            a.seg_ptr, a.slot_ptr, a.part, a.n_owner, H, D, args.F,
            KIND == kDot ? args.scale : 1.f, a.grad_a, a.grad_b, a.drow);
    C10_CUDA_KERNEL_LAUNCH_CHECK();
  }
}

// A pass for short owners (bwd_short_kernel.cuh): a warp per owner (or
// several: short_slices' vectors a lane).
// (instantiated only where it can be taken: the vector kernels)
template <typename T, typename I, int KIND, bool VEC, int FEAT, bool COLS>
void launch_short(const BwdArgs<T, I>& a, int64_t n_edges,
                  int64_t max_degree) {
  if constexpr (KIND != kGatv2 && VEC) {
    constexpr int VW = Vec<T>::kWidth;
    const int nv = short_slices(KIND, a.n_owner, a.H, a.F, VW,
                                COLS ? ShortPass::kCols : ShortPass::kRows);
    const int lanes = short_lanes((int64_t)a.H * a.F, VW * nv);
    const int64_t blocks = short_blocks(a.n_owner, lanes, kShortThreads);
    if (blocks <= 0) return;
    dispatch_slices(nv, [&](auto nv_c) {
      constexpr int NV = decltype(nv_c)::value;
      auto kernel_of = [&](auto walk_c) {
        constexpr bool WALK = decltype(walk_c)::value;
        return COLS ? short_cols_bwd_kernel<T, I, KIND, VW, NV, FEAT, WALK>
                    : short_rows_bwd_kernel<T, I, KIND, VW, NV, FEAT, WALK>;
      };
      const bool walk = short_walk_pays(
          VW > 4, COLS ? ShortPass::kCols : ShortPass::kRows, KIND, lanes, NV,
          a.n_owner, n_edges, max_degree);
      launch_short_walk(
          kernel_of(std::true_type{}), blocks, kShortThreads, walk,
          [&](auto walk_c, int64_t grid) {
            kernel_of(walk_c)<<<(unsigned)grid, kShortThreads, 0,
                                c10::cuda::getCurrentCUDAStream()>>>(a,
                                                                     lanes);
            C10_CUDA_KERNEL_LAUNCH_CHECK();
          });
    });
  }
}

// PYG_DFGNN_BWD_STORE_MB (read per call, so that tests can switch it).
inline double store_limit_bytes() {
  const char* env = std::getenv("PYG_DFGNN_BWD_STORE_MB");
  const double mb = env != nullptr && *env != '\0' ? std::atof(env) : 512.0;
  return mb * 1024.0 * 1024.0;
}

template <typename T, typename I, int KIND, bool VEC, int FEAT>
void run_passes(Args& A, int optin) {
  const int64_t n_dst = A.rowptr.size(0) - 1, n_src = A.colptr.size(0) - 1;
  const int64_t E = A.col.numel();
  const int H = (int)A.value.size(1), F = (int)A.value.size(2);
  const int D = KIND == kAdd ? 1 : (int)A.query.size(2);
  constexpr int VW = VEC ? Vec<T>::kWidth : 1;
  const int slots_k = KIND == kAdd ? 0 : H * D / VW, slots_v = H * F / VW;
  const auto fopt = A.value.options().dtype(at::kFloat);
  // (p, t) per edge and head: 8 * E * H bytes. Above the limit (the
  // largest buffer worth its memory; PYG_DFGNN_BWD_STORE_MB, default 512)
  // the backward is lean: the cols pass recomputes them.
  const bool lean = (double)E * H * 8 > store_limit_bytes();
  auto ebuf = lean ? at::Tensor() : at::empty({E, H, 2}, fopt);
  auto drow = at::empty({n_dst, H}, fopt);
  auto ptr = [](const at::Tensor& t) -> const T* {
    return t.defined() ? t.data_ptr<T>() : nullptr;
  };

  auto out_ptr = [](const at::Tensor& t) -> T* {
    return t.defined() && t.numel() > 0 ? t.data_ptr<T>() : nullptr;
  };
  BwdArgs<T, I> a{};
  a.att = ptr(A.att);
  a.lse = A.lse.data_ptr<float>();
  a.et = {ptr(A.edge_score), ptr(A.edge_key), ptr(A.edge_value)};
  a.drop = A.drop;
  a.ekv_shared = A.ekv_shared;
  a.drow = drow.data_ptr<float>();
  a.ebuf = lean ? nullptr : reinterpret_cast<float2*>(ebuf.data_ptr<float>());
  a.H = H, a.D = D, a.F = F;
  a.galpha = ptr(A.grad_alpha);
  a.aperm = A.grad_alpha.defined() && A.attention_perm.defined()
                ? A.attention_perm.data_ptr<I>() : nullptr;
  a.galpha_dropped = A.alpha_dropped;
  a.item_group = std::min(8, next_pow2((std::max(D, F) + VW - 1) / VW));
  a.scale = (float)A.scale, a.slope = (float)A.slope;
  // Short owners (short_rows.cuh's shapes and rule, rows and columns
  // apart): the warp-per-owner passes; plain path with ebuf stored.
  const char mode = short_rows_mode();
  const bool short_ok =
      VEC && KIND != kGatv2 && !lean &&
      short_shapes(KIND, VEC, H, D, F, VW,
                   A.edge_key.defined() || A.edge_value.defined());
  const bool short_rows =
      short_ok && short_owners(mode, A.max_in_degree, F / VW);
  const bool short_cols =
      short_ok && short_owners(mode, A.max_out_degree, F / VW);

  // rows pass: grad_query, D -> drow, (p, t) -> ebuf
  BwdArgs<T, I> r = a;
  r.ptr = A.rowptr.data_ptr<int64_t>();
  r.idx = A.col.data_ptr<I>();
  r.own_a = ptr(A.query);
  r.own_b = ptr(A.grad_out);
  r.nbr_a = ptr(A.key);
  r.nbr_b = ptr(A.value);
  r.grad_a = A.grad_query.data_ptr<T>();
  r.n_owner = n_dst;
  r.group = std::min(32, next_pow2(std::max(1, slots_k)));
  // 'add' and half precision at H * F = 128 on dense graphs: the LANES
  // kernels (instantiated for the staged path's int32 indices and vector
  // rows)
  constexpr bool kLanesOk = VEC && std::is_same_v<I, int32_t> &&
                            (KIND == kAdd || !std::is_same_v<T, float>) &&
                            FEAT != kFeatAll;
  const bool rows_lanes =
      rows_lanes_fit(KIND, H, D, F) && lanes_dense_graph(E, n_dst);
  auto rows = [&](auto lanes_k) {
    launch<T, I, KIND, VEC, false, FEAT, false, decltype(lanes_k)::value>(
        r, A.rowptr, E, A.max_in_degree, A.windows, A.stage_nodes, optin,
        nullptr, fopt);
  };
  if (short_rows)
    launch_short<T, I, KIND, VEC, FEAT, false>(r, E, A.max_in_degree);
  else if (kLanesOk && rows_lanes)
    rows(std::bool_constant<kLanesOk>{});
  else
    rows(std::false_type{});
  // cols pass: grad_key, grad_value, d att partials
  BwdArgs<T, I> c = a;
  c.ptr = A.colptr.data_ptr<int64_t>();
  c.idx = A.csc_row.data_ptr<I>();
  c.perm = A.csc_perm.data_ptr<I>();
  c.own_a = ptr(A.key);
  c.own_b = ptr(A.value);  // (lean: the owner's value row)
  c.nbr_a = ptr(A.query);
  c.nbr_b = ptr(A.grad_out);
  c.grad_a = A.grad_key.data_ptr<T>();
  c.grad_b = A.grad_value.data_ptr<T>();
  c.g_es = out_ptr(A.grad_edge_score);
  c.g_ek = out_ptr(A.grad_edge_key);
  // ek = ev ('dot'): one gradient, written with the dV slots
  c.g_ev = A.ekv_shared ? c.g_ek : out_ptr(A.grad_edge_value);
  c.n_owner = n_src;
  c.group = std::min(32, next_pow2(slots_k + slots_v));
  at::Tensor att_part;
  if (short_cols) {
    launch_short<T, I, KIND, VEC, FEAT, true>(c, E, A.max_out_degree);
    return;
  }
  PYG_DFGNN_DISPATCH_BOOL(lean, LEAN, [&] {
    launch<T, I, KIND, VEC, true, FEAT, LEAN, false>(
        c, A.colptr, E, A.max_out_degree, A.col_windows, A.col_stage_nodes,
        optin, KIND == kGatv2 ? &att_part : nullptr, fopt);
  });
  if (KIND == kGatv2) A.grad_att.copy_(att_part.sum(0).view({H, D}));
}

}  // namespace detail

template <typename T> void run_bwd(Args& A) {
  const int H = (int)A.value.size(1), F = (int)A.value.size(2);
  const int D = A.kind == kAdd ? 1 : (int)A.query.size(2);
  TORCH_CHECK(H <= kMaxHeads, "fused_attention_bwd: at most ", kMaxHeads,
              " heads (got ", H, ")");
  const int V = Vec<T>::kWidth;
  bool vec = F % V == 0 && (A.kind == kAdd || D % V == 0);
  for (const at::Tensor* t : {&A.grad_out, &A.query, &A.key, &A.value,
                              &A.att, &A.grad_query, &A.grad_key,
                              &A.grad_value, &A.edge_key, &A.edge_value,
                              &A.grad_edge_key, &A.grad_edge_value})
    if (!aligned16(*t)) vec = false;
  int optin = 0;
  C10_CUDA_CHECK(cudaDeviceGetAttribute(
      &optin, cudaDevAttrMaxSharedMemoryPerBlockOptin,
      A.value.get_device()));
  PYG_DFGNN_DISPATCH_KIND(A.kind, [&] { run_bwd_kind<T, KIND>(A, optin, vec); });
}

template <typename T, int KIND> void run_bwd_kind(Args& A, int optin,
                                                  bool vec) {
  PYG_DFGNN_DISPATCH_INDEX(A.col.scalar_type(), "fused_attention_bwd", [&] {
    PYG_DFGNN_DISPATCH_BOOL(vec, VEC, [&] {
      const int level = feature_level(
          A.edge_score.defined(), A.grad_alpha.defined(), A.drop.active,
          A.edge_key.defined() || A.edge_value.defined());
      PYG_DFGNN_DISPATCH_FEAT(level, KIND == kAdd, KIND != kGatv2,
                              KIND != kGatv2, FEAT, [&] {
        detail::run_passes<T, index_t, KIND, VEC, FEAT>(A, optin);
      });
    });
  });
}

// Tensor-core windows (the host entry checked the conditions): a block per
// window; grad_key / grad_value zeroed first (sources in no window).
// one_tf32: fp32's products as one TF32 mma each (opt-in, strategy 6).
template <typename T> void run_tc_bwd(Args& A, bool one_tf32) {
  const int64_t blocks = A.windows.numel() - 1;
  A.grad_key.zero_();
  A.grad_value.zero_();
  if (blocks <= 0) return;
  TcBwdArgs<T> a;
  a.rowptr = A.rowptr.data_ptr<int64_t>();
  a.col = A.col.data_ptr<int32_t>();
  a.q = A.query.data_ptr<T>();
  a.k = A.key.data_ptr<T>();
  a.v = A.value.data_ptr<T>();
  a.dout = A.grad_out.data_ptr<T>();
  a.lse = A.lse.data_ptr<float>();
  a.dq = A.grad_query.data_ptr<T>();
  a.dk = A.grad_key.data_ptr<T>();
  a.dv = A.grad_value.data_ptr<T>();
  a.H = (int)A.value.size(1);
  a.scale = (float)A.scale;
  const int DH = (int)A.value.size(2);
  cudaStream_t stream = c10::cuda::getCurrentCUDAStream();
  auto go = [&](auto kernel) {
    const size_t bytes = tc_bwd_layout(DH, sizeof(T)).total;
    if (bytes > 48 * 1024)
      C10_CUDA_CHECK(cudaFuncSetAttribute(
          kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, (int)bytes));
    kernel<<<(unsigned)blocks, tc_bwd_threads<T>(), bytes, stream>>>(
        a, A.windows.data_ptr<int64_t>());
    C10_CUDA_KERNEL_LAUNCH_CHECK();
  };
  auto by_d = [&](auto one) {
    constexpr bool k1 = decltype(one)::value;
    switch (DH) {
      case 16: go(tc_bwd_kernel<T, 16, k1>); break;
      case 32: go(tc_bwd_kernel<T, 32, k1>); break;
      case 64: go(tc_bwd_kernel<T, 64, k1>); break;
      case 128: go(tc_bwd_kernel<T, 128, k1>); break;
      default:
        TORCH_CHECK(false, "fused_attention_bwd: tensor-core windows take D "
                    "= F in {16, 32, 64, 128}, got ", DH);
    }
  };
  if constexpr (std::is_same<T, float>::value) {
    if (one_tf32) {
      by_d(std::true_type{});
      return;
    }
  }
  by_d(std::false_type{});
}

}  // namespace bwd
}  // namespace pyg_dfgnn

// Host side of the forward kernels: the launch description the host entry
// (fused_attention_fwd.cu) fills, and run_smmf<T> / run_pmf<T>, each
// instantiated per dtype in its own translation unit.
#pragma once

#include <ATen/cuda/CUDAContext.h>
#include <c10/cuda/CUDAException.h>
#include <c10/cuda/CUDAStream.h>

#include <algorithm>
#include <tuple>
#include <type_traits>

#include "dispatch.cuh"
#include "occupancy.cuh"
#include "fwd_alpha_kernel.cuh"
#include "fwd_common.cuh"
#include "fwd_pmf_kernel.cuh"
#include "fwd_rows_kernel.cuh"
#include "fwd_smmf_kernel.cuh"
#include "fwd_tc_kernel.cuh"

namespace pyg_dfgnn {
namespace fwd {

// Everything the host entry decided; run_smmf<T> / run_pmf<T> (one
// instantiation per dtype and strategy, each in its own translation unit so
// they compile in parallel) dispatch index type / VEC / KIND.
struct Launch {
  at::Tensor rowptr, col, query, key, value, att, out, lse;
  at::Tensor windows;  // SMMF: int64 [W + 1] row windows (undefined: plain)
  at::Tensor edge_score, edge_key, edge_value;  // CSR order (or undefined)
  at::Tensor alpha;       // [E, H] attention weights (undefined: not asked)
  at::Tensor alpha_perm;  // CSR edge -> row of alpha (undefined: identity)
  bool alpha_dropped;     // alpha after dropout (GAT) or before
  DropoutMask drop;
  // the level of the above the kernels are instantiated with
  // (training_features.cuh); any: the features
  int feature_level() const {
    return pyg_dfgnn::feature_level(
        edge_score.defined(), alpha.defined(), drop.active,
        edge_key.defined() || edge_value.defined());
  }
  bool features() const { return feature_level() != kFeatNone; }
  int64_t kind, n_dst, n_edges, max_in_degree;
  int64_t H, D, F;
  int qk_group, v_group, device_optin;
  int64_t stage_span;  // SMMF: source rows staged per window (0: none)
  bool vec;
  double scale, negative_slope;
  bool one_tf32 = false;  // TC, fp32: 1xTF32 products (strategy 5, opt-in)
};

template <typename Kernel>
void allow_smem(Kernel kernel, size_t bytes) {
  if (bytes > 48 * 1024)
    C10_CUDA_CHECK(cudaFuncSetAttribute(
        kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, (int)bytes));
}

template <typename scalar_t, typename index_t, bool VEC>
FwdArgs<scalar_t, index_t> make_args(const Launch& L) {
  FwdArgs<scalar_t, index_t> a;
  a.rowptr = L.rowptr.data_ptr<int64_t>();
  a.col = L.col.data_ptr<index_t>();
  a.q = L.query.data_ptr<scalar_t>();
  a.k = L.key.data_ptr<scalar_t>();
  a.v = L.value.data_ptr<scalar_t>();
  auto ptr = [](const at::Tensor& t) -> const scalar_t* {
    return t.defined() ? t.data_ptr<scalar_t>() : nullptr;
  };
  a.att = ptr(L.att);
  a.out = L.out.data_ptr<scalar_t>();
  a.lse = L.lse.data_ptr<float>();
  a.et = {ptr(L.edge_score), ptr(L.edge_key), ptr(L.edge_value)};
  a.drop = L.drop;
  a.scores = nullptr;
  a.n_dst = L.n_dst;
  a.H = (int)L.H, a.D = (int)L.D, a.F = (int)L.F;
  a.qk_group = L.qk_group, a.v_group = L.v_group;
  a.scale = (float)L.scale, a.slope = (float)L.negative_slope;
  return a;
}

// Shared memory of an SMMF launch (host side of smmf_layout).
inline SmmfLayout smmf_launch_layout(const Launch& L, int64_t span,
                                     int warps) {
  const int HD = (int)(L.H * L.D);
  const int HD_k = L.kind == kAdd ? (int)L.H : HD;
  return smmf_layout((int)span, (int)L.H, HD_k, (int)(L.H * L.F),
                     L.kind == kGatv2 ? HD : 0, warps,
                     L.value.element_size());
}

// The kernels' raw scores, only where the attention weights are asked.
inline at::Tensor scores_buffer(const Launch& L) {
  return L.alpha.defined() ? at::empty({L.n_edges, L.H},
                                       L.value.options().dtype(at::kFloat))
                           : at::Tensor();
}

// The attention weights from the raw scores, once lse is final.
template <typename scalar_t>
void run_alpha(const Launch& L, const at::Tensor& scores) {
  if (!L.alpha.defined() || L.n_edges == 0) return;
  DropoutMask drop = L.drop;
  drop.active = drop.active && L.alpha_dropped;
  drop.saved = drop.save;  // written by the forward kernel
  const auto perm_type = L.alpha_perm.defined() ? L.alpha_perm.scalar_type()
                                                : at::kLong;
  PYG_DFGNN_DISPATCH_INDEX(perm_type, "fused_attention_fwd", [&] {
    auto launch = [&](auto kernel) {
      kernel<<<(unsigned)((L.n_edges + kThreads - 1) / kThreads), kThreads,
               0, c10::cuda::getCurrentCUDAStream()>>>(
          L.rowptr.data_ptr<int64_t>(), L.n_dst, scores.data_ptr<float>(),
          L.lse.data_ptr<float>(),
          L.alpha_perm.defined() ? L.alpha_perm.data_ptr<index_t>()
                                 : nullptr,
          drop, L.alpha.data_ptr<scalar_t>(), L.n_edges, (int)L.H);
      C10_CUDA_KERNEL_LAUNCH_CHECK();
    };
    if (L.H % 4 == 0)
      launch(alpha_kernel<scalar_t, index_t, 4>);
    else
      launch(alpha_kernel<scalar_t, index_t, 1>);
  });
}

// Whether SMMF's rows go to the short-row kernel (fwd_rows_kernel.cuh):
// no edge key / value, the shapes and the rule of short_rows.cuh.
inline bool short_rows(const Launch& L, int vw) {
  return short_shapes(L.kind, L.vec, L.H, L.D, L.F, vw,
                      L.edge_key.defined() || L.edge_value.defined()) &&
         short_owners(short_rows_mode(), L.max_in_degree, (int)(L.F / vw));
}

template <typename scalar_t>
void run_rows(const Launch& L) {
  constexpr int VW = Vec<scalar_t>::kWidth;
  const int nv =
      short_slices(L.kind, L.n_dst, L.H, L.F, VW, ShortPass::kFwd);
  const int lanes = short_lanes(L.H * L.F, VW * nv);
  const int64_t blocks = short_blocks(L.n_dst, lanes, kThreads);
  if (blocks <= 0) return;
  auto a = make_args<scalar_t, int32_t, true>(L);
  const at::Tensor scores = scores_buffer(L);
  if (scores.defined()) a.scores = scores.data_ptr<float>();
  cudaStream_t stream = c10::cuda::getCurrentCUDAStream();
  PYG_DFGNN_DISPATCH_KIND(L.kind, [&] {
    if constexpr (KIND != kGatv2) {
      // (levels 3 and 4 for both kinds: the weights without dropout's
      // registers, dropout without the others')
      PYG_DFGNN_DISPATCH_FEAT(L.feature_level(), KIND == kAdd, true, true,
                              FEAT, [&] {
        dispatch_slices(nv, [&](auto nv_c) {
          constexpr int NV = decltype(nv_c)::value;
          const bool walk =
              short_walk_pays(VW > 4, ShortPass::kFwd, KIND, lanes, NV,
                              L.n_dst, L.n_edges, L.max_in_degree);
          launch_short_walk(
              rows_fwd_kernel<scalar_t, int32_t, KIND, VW, NV, FEAT, true>,
              blocks, kThreads, walk, [&](auto walk_c, int64_t grid) {
                rows_fwd_kernel<scalar_t, int32_t, KIND, VW, NV, FEAT,
                                decltype(walk_c)::value>
                    <<<(unsigned)grid, kThreads, 0, stream>>>(a, lanes);
                C10_CUDA_KERNEL_LAUNCH_CHECK();
              });
        });
      });
    }
  });
  run_alpha<scalar_t>(L, scores);
}

// SMMF (int32 col only: the host routes int64-indexed graphs to PMF); short
// rows take run_rows.
template <typename scalar_t>
void run_smmf(const Launch& L) {
  using index_t = int32_t;
  TORCH_CHECK(L.col.scalar_type() == at::kInt,
              "fused_attention_fwd: SMMF needs int32 'col'");
  if (short_rows(L, Vec<scalar_t>::kWidth)) {
    run_rows<scalar_t>(L);
    return;
  }
  const bool windowed = L.windows.defined();
  const int warps = windowed ? kSmmfStagedWarps : kSmmfPlainWarps;
  const int64_t span = windowed ? L.stage_span : 0;
  const size_t bytes = smmf_launch_layout(L, span, warps).total;
  const int64_t blocks = windowed
                             ? L.windows.numel() - 1
                             : (L.n_dst + kSmmfPlainRows - 1) / kSmmfPlainRows;
  if (blocks <= 0) return;
  cudaStream_t stream = c10::cuda::getCurrentCUDAStream();
  const at::Tensor scores = scores_buffer(L);
  // Half precision with H * D = 128 on dense graphs: the LANES kernels
  // (the SDDMM's four-feature lanes, fwd_smmf_kernel.cuh; instantiated for
  // vector rows and kinds with a key row). fp32 takes those lanes in its
  // one kind of kernel.
  const bool dense = feature_lanes_fit(L.H * L.D, L.D) &&
                     lanes_dense_graph(L.n_edges, L.n_dst);
  PYG_DFGNN_DISPATCH_BOOL(L.vec, VEC, [&] {
    auto a = make_args<scalar_t, index_t, VEC>(L);
    if (scores.defined()) a.scores = scores.data_ptr<float>();
    PYG_DFGNN_DISPATCH_KIND(L.kind, [&] {
     PYG_DFGNN_DISPATCH_FEAT(L.feature_level(), KIND == kAdd, KIND == kDot,
                             KIND != kGatv2, FEAT, [&] {
      auto go = [&](auto kernel) {
        allow_smem(kernel, bytes);
        kernel<<<(unsigned)blocks, warps * kWarpSize, bytes, stream>>>(
            a, windowed ? L.windows.data_ptr<int64_t>() : nullptr,
            kSmmfPlainRows, (int)span);
        C10_CUDA_KERNEL_LAUNCH_CHECK();
      };
      constexpr bool kLanesOk =
          VEC && KIND != kAdd && !std::is_same_v<scalar_t, float>;
      if (kLanesOk && dense)
        go(smmf_fwd_kernel<scalar_t, KIND, VEC, FEAT, kLanesOk>);
      else
        go(smmf_fwd_kernel<scalar_t, KIND, VEC, FEAT, false>);
     });
    });
  });
  run_alpha<scalar_t>(L, scores);
}

// PMF's SDDMM with a key row's vectors over the lanes (pmf_sddmm_lanes_kernel):
// 16-byte vectors, a key row of <= 32 of them and a head of >= 1, both
// powers of two ('add' has no key rows).
inline bool sddmm_lanes(const Launch& L, int vw) {
  const int64_t HD = L.H * L.D;
  auto pow2 = [](int64_t x) { return x > 0 && (x & (x - 1)) == 0; };
  const int64_t kMax = int64_t{1} << 31;  // its 32-bit offsets
  return L.vec && L.kind != kAdd && L.D % vw == 0 && pow2(HD / vw) &&
         HD / vw <= kWarpSize && pow2(L.D / vw) && L.n_edges * L.H < kMax &&
         L.key.numel() < kMax && L.query.numel() < kMax &&
         (!L.edge_key.defined() || L.edge_key.numel() < kMax);
}

inline int ilog2(int64_t x) {
  int k = 0;
  while ((int64_t{1} << (k + 1)) <= x) ++k;
  return k;
}

template <typename scalar_t>
void run_pmf(const Launch& L) {
  const int64_t n_dst = L.n_dst, n_edges = L.n_edges, H = L.H, F = L.F;
  cudaStream_t stream = c10::cuda::getCurrentCUDAStream();
  const auto fopts = L.value.options().dtype(at::kFloat);
  // 'add' without attention weights: no scores buffer (E * H * 4 bytes,
  // 3.7 GB at full Reddit size with 8 heads); the softmax kernel forms them.
  const bool add_scores = L.kind == kAdd && !L.alpha.defined();
  auto scores = add_scores ? at::Tensor() : at::empty({n_edges, H}, fopts);
  // Segments: ceil(deg / kSegEdges) per row (>= 1, empty rows write zeros);
  // rows of several segments get partial slots, merged by the combine kernel.
  auto deg = L.rowptr.slice(0, 1) - L.rowptr.slice(0, 0, n_dst);
  auto nseg = deg.add(kSegEdges - 1).div(kSegEdges, "floor").clamp_min(1);
  auto zero = at::zeros({1}, L.rowptr.options());
  auto seg_ptr = at::cat({zero, nseg.cumsum(0)});
  auto slot_ptr = at::cat(
      {zero, at::where(nseg > 1, nseg, at::zeros_like(nseg)).cumsum(0)});
  const int64_t seg_bound = n_dst + n_edges / kSegEdges + 1;
  const int64_t slot_bound = L.max_in_degree > kSegEdges
                                 ? 2 * (n_edges / kSegEdges) + 2 : 0;
  auto part_acc = at::empty({slot_bound, H * F}, fopts);
  auto part_ml = at::empty({slot_bound, 2 * H}, fopts);
  const size_t per_warp_floats = ((2 * H + H * kTileEdges) + 1) & ~1;
  const size_t bytes =
      (size_t)kWarps * (per_warp_floats + 2 * kTileEdges) * 4;
  TORCH_CHECK(bytes <= (size_t)L.device_optin,
              "fused_attention_fwd: too many heads (", H, ")");
  PYG_DFGNN_DISPATCH_INDEX(L.col.scalar_type(), "fused_attention_fwd", [&] {
    PYG_DFGNN_DISPATCH_BOOL(L.vec, VEC, [&] {
      const auto a = make_args<scalar_t, index_t, VEC>(L);
      constexpr int VW = Vec<scalar_t>::kWidth;
      const int64_t sms =
          at::cuda::getCurrentDeviceProperties()->multiProcessorCount;
      const int64_t row_vecs = H * L.D / VW, head_vecs = L.D / VW;
      if (n_edges > 0 && !add_scores && sddmm_lanes(L, VW)) {
        // a run of >= 8 steps per warp, up to 32 while ~48 warps per SM
        // still have work
        const int64_t step_edges = 8 * (kWarpSize / row_vecs);
        const int64_t steps = std::min<int64_t>(
            32, std::max<int64_t>(
                    1, n_edges / (step_edges * sms * 48)));
        const int64_t edges_per_warp = steps * step_edges;
        const int64_t warps = (n_edges + edges_per_warp - 1) / edges_per_warp;
        const int64_t blocks = (warps + kWarps - 1) / kWarps;
        PYG_DFGNN_DISPATCH_KIND(L.kind, [&] {
         PYG_DFGNN_DISPATCH_FEAT(L.feature_level(), false, false, false, FEAT,
                                 [&] {
          if constexpr (KIND != kAdd) {
            pmf_sddmm_lanes_kernel<scalar_t, index_t, KIND, FEAT>
                <<<(unsigned)blocks, kThreads, 0, stream>>>(
                    a, scores.data_ptr<float>(), ilog2(row_vecs),
                    ilog2(head_vecs), (int)edges_per_warp);
            C10_CUDA_KERNEL_LAUNCH_CHECK();
          }
         });
        });
      } else if (n_edges > 0 && !add_scores) {
        const int group = L.kind == kAdd ? 1 : L.qk_group;
        const int64_t items = n_edges * H;
        const int64_t items_per_warp =
            (int64_t)(kWarpSize / group) * kUnroll * 4;
        const int64_t warps = (items + items_per_warp - 1) / items_per_warp;
        const int64_t blocks = (warps + kWarps - 1) / kWarps;
        PYG_DFGNN_DISPATCH_KIND(L.kind, [&] {
         PYG_DFGNN_DISPATCH_FEAT(L.feature_level(), false, false, false, FEAT,
                                 [&] {
          pmf_sddmm_kernel<scalar_t, index_t, KIND, VEC, FEAT>
              <<<(unsigned)blocks, kThreads, 0, stream>>>(
                  a, scores.data_ptr<float>(), items_per_warp);
          C10_CUDA_KERNEL_LAUNCH_CHECK();
         });
        });
      }
     PYG_DFGNN_DISPATCH_FEAT(L.feature_level(), false, false, false, FEAT,
                                 [&] {
      PYG_DFGNN_DISPATCH_BOOL(add_scores, ADD_SCORES, [&] {
      auto go = [&](auto kernel) {
        allow_smem(kernel, bytes);
        // persistent warps: as many blocks as are resident at once
        const int per_sm = resident_blocks_per_sm(kernel, kThreads, bytes);
        const int64_t resident = std::max(1, per_sm) * (int64_t)sms;
        const int64_t blocks =
            std::min((seg_bound + kWarps - 1) / kWarps, resident);
        kernel<<<(unsigned)blocks, kThreads, bytes, stream>>>(
            a, add_scores ? nullptr : scores.data_ptr<float>(),
            seg_ptr.data_ptr<int64_t>(), slot_ptr.data_ptr<int64_t>(),
            part_acc.data_ptr<float>(), part_ml.data_ptr<float>(), seg_bound);
        C10_CUDA_KERNEL_LAUNCH_CHECK();
      };
      // A lane with one feature vector of the row (H * F <= 32 vectors):
      // one accumulator, eight neighbour rows in flight instead of four.
      if constexpr (VEC) {
        if (H * F / Vec<scalar_t>::kWidth <= L.v_group) {
          go(pmf_softmax_spmm_kernel<scalar_t, index_t, VEC, FEAT, ADD_SCORES,
                                     true>);
          return;
        }
      }
      go(pmf_softmax_spmm_kernel<scalar_t, index_t, VEC, FEAT, ADD_SCORES,
                                 false>);
      });
     });
    });
  });
  if (L.max_in_degree > kSegEdges) {
    pmf_combine_kernel<scalar_t>
        <<<(unsigned)((n_dst + kWarps - 1) / kWarps), kThreads, 0, stream>>>(
            seg_ptr.data_ptr<int64_t>(), slot_ptr.data_ptr<int64_t>(),
            part_acc.data_ptr<float>(), part_ml.data_ptr<float>(),
            L.out.data_ptr<scalar_t>(), L.lse.data_ptr<float>(), n_dst,
            (int)H, (int)F);
    C10_CUDA_KERNEL_LAUNCH_CHECK();
  }
  run_alpha<scalar_t>(L, scores);
}

// Tensor-core windows: 'dot', D = F in {16, 32, 64, 128}, no training
// features, int32 'col', windows of <= kTcMaxSrc sources, in-degree <=
// kTcMaxDegree (the host entry checked all of it). A block per window.
template <typename scalar_t>
void run_tc(const Launch& L) {
  const int64_t blocks = L.windows.numel() - 1;
  if (blocks <= 0) return;
  const auto a = make_args<scalar_t, int32_t, true>(L);
  cudaStream_t stream = c10::cuda::getCurrentCUDAStream();
  auto go = [&](auto kernel, int DH) {
    const size_t bytes = tc_layout(DH, sizeof(scalar_t)).total;
    allow_smem(kernel, bytes);
    kernel<<<(unsigned)blocks, kTcThreads, bytes, stream>>>(
        a, L.windows.data_ptr<int64_t>());
    C10_CUDA_KERNEL_LAUNCH_CHECK();
  };
  auto by_d = [&](auto one_tf32) {
    constexpr bool k1 = decltype(one_tf32)::value;
    switch (L.D) {
      case 16: go(tc_fwd_kernel<scalar_t, 16, k1>, 16); break;
      case 32: go(tc_fwd_kernel<scalar_t, 32, k1>, 32); break;
      case 64: go(tc_fwd_kernel<scalar_t, 64, k1>, 64); break;
      case 128: go(tc_fwd_kernel<scalar_t, 128, k1>, 128); break;
      default:
        TORCH_CHECK(false, "fused_attention_fwd: tensor-core windows take "
                    "D = F in {16, 32, 64, 128} (got ", L.D, ")");
    }
  };
  if constexpr (std::is_same<scalar_t, float>::value) {
    if (L.one_tf32) {
      by_d(std::true_type{});
      return;
    }
  }
  by_d(std::false_type{});
}

}  // namespace fwd
}  // namespace pyg_dfgnn

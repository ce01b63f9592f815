// PMF forward kernels (see fwd_common.cuh), for rows too long for SMMF's
// shared memory: a. edge-parallel SDDMM, b. softmax + SpMM a warp per
// segment of <= kSegEdges edges, c. the merge of long rows' segments.
#pragma once

#include "fwd_common.cuh"
#include "row_tiles.cuh"

namespace pyg_dfgnn {
namespace fwd {

// a. edge-parallel SDDMM: scores[e, h] for all edges.
template <typename T, typename I, int KIND, bool VEC, int FEAT>
__global__ void __launch_bounds__(kThreads)
    pmf_sddmm_kernel(FwdArgs<T, I> a, float* __restrict__ scores,
                     int64_t items_per_warp) {
  constexpr int VW = Width<T, VEC>::kVW;
  const int H = a.H, D = a.D;
  const int64_t HD = (int64_t)H * D;
  const int64_t n_items = a.rowptr[a.n_dst] * H;
  const int lane = threadIdx.x % kWarpSize;
  const int64_t gw = ((int64_t)blockIdx.x * blockDim.x + threadIdx.x) / kWarpSize;
  const int64_t start = gw * items_per_warp;
  const int64_t end = n_items < start + items_per_warp ? n_items : start + items_per_warp;
  if (start >= end) return;
  const int G = KIND == kAdd ? 1 : a.qk_group, ng = kWarpSize / G;
  const int g = lane / G, lg = lane % G;
  int64_t r = find_row(a.rowptr, a.n_dst, (start + g) / H);
  for (int64_t base = start; base < end; base += kUnroll * ng) {
    float acc[kUnroll];
    int64_t ii[kUnroll];
#pragma unroll
    for (int u = 0; u < kUnroll; ++u) {
      const int64_t it = base + u * ng + g;
      acc[u] = 0.f;
      ii[u] = -1;
      if (it < end) {
        const int64_t e = it / H;
        const int h = (int)(it - e * H);
        while (a.rowptr[r + 1] <= e) ++r;
        ii[u] = it;
        const int64_t j = (int64_t)a.col[e];
        if constexpr (KIND == kAdd) {
          float x = to_float(a.q[r * H + h]) + to_float(a.k[j * H + h]);
          if (kHasScore<FEAT> && a.et.es != nullptr)
            x += to_float(a.et.es[it]);
          acc[u] = leaky_relu(x, a.slope);
        } else {
          acc[u] = score_part_global<KIND, T, VW>(
              a.q + r * HD + (int64_t)h * D, a.k + j * HD + (int64_t)h * D,
              a.att + (int64_t)h * D, D, lg * VW, G * VW, a.slope,
              (kHasEdgeKV<FEAT> && a.et.ek != nullptr) ? a.et.ek + it * D
                                                       : nullptr);
        }
      }
    }
#pragma unroll
    for (int u = 0; u < kUnroll; ++u) {
      const float s = KIND == kAdd ? acc[u] : group_sum(acc[u], G);
      if (lg == 0 && ii[u] >= 0) {
        float sc = KIND == kDot ? s * a.scale : s;
        if (KIND == kDot && (kHasScore<FEAT> && a.et.es != nullptr))
          sc += to_float(a.et.es[ii[u]]);
        scores[ii[u]] = sc;
      }
    }
  }
}

// a'. the same SDDMM with a key row's 16-byte vectors over the lanes, where
// a key row (H * D) is S <= 32 vectors and a head's D is G of them (both
// powers of two): a warp walks a run of consecutive edges, 32 / S edges a
// step and eight steps before it sums: each lane's eight partial dot
// products are summed over its head's G lanes by one transposing butterfly
// (transpose_sum<8>: 7 + log2(G / 8) shuffles for eight edges instead of
// 8 log2(G)), the query vector stays in registers while the row lasts, and
// the (edge, head) index division and per-item row walk of (a.) go. (a.)
// spent ~3x these instructions per edge and was issue-bound on reddit-like.
// (<= 85 registers; 128 with the edge keys' eight vectors in flight too)
template <typename T, typename I, int KIND, int FEAT>
__global__ void __launch_bounds__(kThreads, kHasEdgeKV<FEAT> ? 2 : 3)
    pmf_sddmm_lanes_kernel(FwdArgs<T, I> a, float* __restrict__ scores,
                           int row_vecs_log2, int head_vecs_log2,
                           int edges_per_warp) {
  // 32-bit offsets throughout (the host checked E * H, the key / query /
  // edge-key sizes < 2^31): half the address arithmetic per edge.
  constexpr int VW = Vec<T>::kWidth;
  constexpr int U = 8;  // steps summed at once (transpose_sum<8>)
  using Raw = RawVec<T, VW>;
  const int H = a.H, HD = a.H * a.D;
  const int n_edges = (int)a.rowptr[a.n_dst];
  const int lane = threadIdx.x % kWarpSize;
  const int S = 1 << row_vecs_log2, G = 1 << head_vecs_log2;
  const int sub = lane >> row_vecs_log2, s = lane & (S - 1);
  const int h = s >> head_vecs_log2;
  const int edges_per_step = kWarpSize >> row_vecs_log2;
  const int64_t gw =
      ((int64_t)blockIdx.x * blockDim.x + threadIdx.x) / kWarpSize;
  if (gw * edges_per_warp >= n_edges) return;
  const int start = (int)(gw * edges_per_warp);
  const int end = min(n_edges - start, edges_per_warp) + start;
  // this lane's vector of every key / query / edge-key row
  const T* __restrict__ k_lane = a.k + s * VW;
  const T* __restrict__ q_lane = a.q + s * VW;
  constexpr bool kEdgeKeys = kHasEdgeKV<FEAT>;
  const T* __restrict__ ek_lane =
      kEdgeKeys && a.et.ek != nullptr ? a.et.ek + s * VW : nullptr;
  float att[VW];
  if constexpr (KIND != kDot) load_vec<T, VW>(a.att + s * VW, att);
  int r = (int)find_row(a.rowptr, a.n_dst, start + sub);
  int row_end = (int)a.rowptr[r + 1];
  int q_row = -1;
  float q[VW];
  const bool writer = transpose_writer<8>(lane, G);
  const int item0 = transpose_item<8>(lane, G);
  // (a warp-uniform loop: the transposing sum needs every lane)
  for (int step0 = start; step0 < end; step0 += U * edges_per_step) {
    const int base = step0 + sub;
    Raw kr[U], er[kEdgeKeys ? U : 1];
#pragma unroll
    for (int u = 0; u < U; ++u) {
      const int e = base + u * edges_per_step;
      kr[u] = Raw{};
      if constexpr (kEdgeKeys) er[u] = Raw{};
      if (e < end) {
        kr[u] = load_raw<T, VW>(k_lane + (int)a.col[e] * HD);
        if constexpr (kEdgeKeys) {
          if (ek_lane != nullptr)
            er[u] = load_raw<T, VW>(ek_lane + e * HD);
        }
      }
    }
    float acc[U];
#pragma unroll
    for (int u = 0; u < U; ++u) {
      const int e = base + u * edges_per_step;
      acc[u] = 0.f;
      if (e < end) {
        while (row_end <= e) row_end = (int)a.rowptr[++r + 1];
        if (r != q_row) {
          load_vec<T, VW>(q_lane + r * HD, q);
          q_row = r;
        }
        float kx[VW];
        unpack_vec<T, VW>(kr[u], kx);
        if constexpr (kEdgeKeys) {
          if (ek_lane != nullptr) {
            float ex[VW];
            unpack_vec<T, VW>(er[u], ex);
#pragma unroll
            for (int i = 0; i < VW; ++i) kx[i] += ex[i];
          }
        }
        acc[u] = score_vec<KIND, VW>(q, kx, att, a.slope, 0.f);
      }
    }
    const int k = transpose_sum<8>(acc, G);
    if (writer) {
#pragma unroll
      for (int i = 0; i < U; ++i) {
        const int e = base + (item0 + i) * edges_per_step;
        if (i < k && e < end) {
          const int it = e * H + h;
          float sc = KIND == kDot ? acc[i] * a.scale : acc[i];
          if (KIND == kDot && (kHasScore<FEAT> && a.et.es != nullptr))
            sc += to_float(a.et.es[it]);
          scores[it] = sc;
        }
      }
    }
  }
}

// b. softmax + SpMM, a warp per segment. ADD_SCORES: 'add' scores computed
// here (a scalar op per edge and head, the same as the SDDMM's) instead of
// read from an [E, H] buffer that then never exists.
// ONE_SLOT: a lane owns one feature vector (H * F <= 32 vectors): one
// accumulator and eight neighbour rows in flight per lane.
template <typename T, typename I, bool VEC, int FEAT, bool ADD_SCORES,
          bool ONE_SLOT>
__global__ void __launch_bounds__(kThreads)
    pmf_softmax_spmm_kernel(FwdArgs<T, I> a, const float* __restrict__ scores,
                            const int64_t* __restrict__ seg_ptr,
                            const int64_t* __restrict__ slot_ptr,
                            float* __restrict__ part_acc,
                            float* __restrict__ part_ml, int64_t n_seg_bound) {
  constexpr int VW = Width<T, VEC>::kVW;
  constexpr int SLOTS = ONE_SLOT ? 1 : Width<T, VEC>::kSlots;
  constexpr int UNROLL = ONE_SLOT ? 2 * kUnroll : kUnroll;
  extern __shared__ __align__(16) unsigned char smem[];
  const int H = a.H, F = a.F;
  const int warp = threadIdx.x / kWarpSize, lane = threadIdx.x % kWarpSize;
  // per warp: m [H] | l [H] | p [H][kTileEdges] | j [kTileEdges] (int64)
  const int per_warp_floats = ((2 * H + H * kTileEdges) + 1) & ~1;
  float* s_m = reinterpret_cast<float*>(smem) +
               (size_t)warp * (per_warp_floats + 2 * kTileEdges);
  float* s_l = s_m + H;
  float* s_p = s_l + H;
  int64_t* s_j = reinterpret_cast<int64_t*>(s_m + per_warp_floats);

  // Persistent warps taking segments round-robin: with a warp per segment,
  // a block's warps of short segments idled until its longest was done
  // (25 % achieved occupancy of 37.5 % on reddit-like).
  const int64_t n_seg = min(n_seg_bound, seg_ptr[a.n_dst]);
  for (int64_t seg = (int64_t)blockIdx.x * kWarps + warp; seg < n_seg;
       seg += (int64_t)gridDim.x * kWarps) {
    __syncwarp();  // the last segment's reads of s_m / s_l / s_p are done
    const int64_t r = find_row(seg_ptr, a.n_dst, seg);
    const int64_t kseg = seg - seg_ptr[r];
    const int64_t nseg = seg_ptr[r + 1] - seg_ptr[r];
    const int64_t es = a.rowptr[r] + kseg * kSegEdges;
    const int64_t ee = es + kSegEdges < a.rowptr[r + 1] ? es + kSegEdges
                                                        : a.rowptr[r + 1];
    const int n = ee > es ? (int)(ee - es) : 0;
    auto score = [&](int64_t e, int h) -> float {
      if constexpr (ADD_SCORES) {
        float x = to_float(a.q[r * H + h]) +
                  to_float(a.k[(int64_t)a.col[e] * H + h]);
        if (kHasScore<FEAT> && a.et.es != nullptr)
          x += to_float(a.et.es[e * H + h]);
        return leaky_relu(x, a.slope);
      } else {
        return scores[e * H + h];
      }
    };

    // pass 1: max and sum per head
    for (int h = 0; h < H; ++h) {
      float m = -INFINITY;
      for (int e = lane; e < n; e += kWarpSize)
        m = fmaxf(m, score(es + e, h));
      m = warp_max(m);
      float sum = 0.f;
      for (int e = lane; e < n; e += kWarpSize)
        sum += expf(score(es + e, h) - m);
      sum = warp_sum(sum);
      if (lane == 0) s_m[h] = m, s_l[h] = sum;
    }
    __syncwarp();

    // pass 2: exp tiles in smem, SpMM
    const int64_t HF = (int64_t)H * F;
    const int slots = (int)(HF / VW);
    const int group = a.v_group;
    const int ls = lane % group, sub = lane / group;
    auto v_row = [&](int e) -> const T* { return a.v + s_j[e] * HF; };
    auto get_p = [&](int e, int h) -> float { return s_p[h * kTileEdges + e]; };
    uint64_t seed, offset;
    drop_begin<FEAT>(a.drop, seed, offset);
    for (int c0 = 0; c0 < slots; c0 += group * SLOTS) {
      float acc[SLOTS][VW];
      int hs[SLOTS];
      begin_pass<VW, SLOTS>(acc, hs, c0, ls, group, H, F);
      for (int t0 = 0; t0 < n; t0 += kTileEdges) {
        const int tn = min(kTileEdges, n - t0);
        __syncwarp();
        for (int x = lane; x < tn * H; x += kWarpSize) {
          const int e = x / H, h = x - e * H;
          s_p[h * kTileEdges + e] =
              expf(score(es + t0 + e, h) - s_m[h]) *
              drop_factor<FEAT>(a.drop, seed, offset, es + t0 + e, h);
        }
        if (lane < tn) s_j[lane] = (int64_t)a.col[es + t0 + lane];
        __syncwarp();
        spmm_accumulate<T, VW, SLOTS, UNROLL>(acc, slots, c0, group, ls, sub, 0,
                                              tn, hs, v_row, get_p);
        if (kHasEdgeKV<FEAT> && a.et.ev != nullptr)
          spmm_accumulate<T, VW, SLOTS, UNROLL>(
              acc, slots, c0, group, ls, sub, 0, tn, hs,
              [&](int e) -> const T* { return a.et.ev + (es + t0 + e) * HF; },
              get_p);
      }
      reduce_edge_groups<VW, SLOTS>(acc, group);
      if (sub == 0) {
#pragma unroll
        for (int s = 0; s < SLOTS; ++s) {
          const int sl = c0 + ls + s * group;
          if (sl < slots) {
            if (nseg == 1) {
              const float inv = 1.f / (s_l[hs[s]] + 1e-16f);
#pragma unroll
              for (int i = 0; i < VW; ++i) acc[s][i] *= inv;
              store_vec<T, VW>(a.out + r * HF + (int64_t)sl * VW, acc[s]);
            } else {
              float* dst =
                  part_acc + (slot_ptr[r] + kseg) * HF + (int64_t)sl * VW;
#pragma unroll
              for (int i = 0; i < VW; ++i) dst[i] = acc[s][i];
            }
          }
        }
      }
    }
    for (int h = lane; h < H; h += kWarpSize) {
      if (nseg == 1) {
        a.lse[r * H + h] =
            n > 0 ? s_m[h] + logf(s_l[h] + 1e-16f) : -INFINITY;
      } else {
        float* ml = part_ml + (slot_ptr[r] + kseg) * 2 * H;
        ml[h] = s_m[h];
        ml[H + h] = s_l[h];
      }
    }
  }  // segments
}

// c. merge the segments of rows longer than one segment; a warp per row.
template <typename T>
__global__ void __launch_bounds__(kThreads)
    pmf_combine_kernel(const int64_t* __restrict__ seg_ptr,
                       const int64_t* __restrict__ slot_ptr,
                       const float* __restrict__ part_acc,
                       const float* __restrict__ part_ml, T* __restrict__ out,
                       float* __restrict__ lse, int64_t n_dst, int H, int F) {
  const int warp = threadIdx.x / kWarpSize, lane = threadIdx.x % kWarpSize;
  const int64_t r = (int64_t)blockIdx.x * kWarps + warp;
  if (r >= n_dst) return;
  const int64_t nseg = seg_ptr[r + 1] - seg_ptr[r];
  if (nseg <= 1) return;
  const int64_t slot0 = slot_ptr[r];
  const int64_t HF = (int64_t)H * F;
  for (int64_t f = lane; f < HF; f += kWarpSize) {
    const int h = (int)(f / F);
    float M = -INFINITY;
    for (int64_t k = 0; k < nseg; ++k)
      M = fmaxf(M, part_ml[(slot0 + k) * 2 * H + h]);
    float L = 0.f, acc = 0.f;
    for (int64_t k = 0; k < nseg; ++k) {
      const float w = expf(part_ml[(slot0 + k) * 2 * H + h] - M);
      L = fmaf(part_ml[(slot0 + k) * 2 * H + H + h], w, L);
      acc = fmaf(part_acc[(slot0 + k) * HF + f], w, acc);
    }
    out[r * HF + f] = from_float<T>(acc / (L + 1e-16f));
    if (f - (int64_t)h * F == 0) lse[r * H + h] = M + logf(L + 1e-16f);
  }
}

}  // namespace fwd
}  // namespace pyg_dfgnn

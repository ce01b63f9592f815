// Short rows (molecule-sized batches, graphs of low in-degree): a warp per
// row (or 32 / lanes rows where fewer lanes hold one), each lane one
// VW-vector of the row's H * F features, an online softmax per head in
// registers, two edges in flight; no shared memory, no block phases.
// SMMF's block of 8 warps spent its time in the machinery around 32-edge
// chunks (row counter, staged query, per-head softmax reductions) when a
// row has ~2 edges (zinc-like under ncu: 33% of DRAM bandwidth, 1.2
// eligible warps per scheduler). Plain path only (no training features),
// 'dot' (D = F) and 'add'; the host takes it where rows are short and
// many (below) and one vector per lane covers H * F. Same lse / out
// conventions as SMMF.
#pragma once

#include "fwd_common.cuh"

namespace pyg_dfgnn {
namespace fwd {

// Where the host takes it (session 13, H100, against SMMF in one run):
// faster on zinc-like (mean in-degree 2), arxiv-like (6.9, longest 21)
// and mnist-like (7.6) at 1x128 and 4x32, fp32 and bf16; slower on the
// small cora- / pubmed-like 1x128 (2.7K / 19.7K rows: a row's edges one
// step after another leave too few warps to hide the latency).
constexpr int kRowsMaxMeanDegree = 8;    // E / N_dst at most
constexpr int kRowsMaxDegree = 64;       // longest row (a warp walks it)
constexpr int64_t kRowsMinRows = 32768;  // rows at least

// Lanes of one row: the fewest (a power of two) that hold its H * F
// features in vectors of VW; a warp takes 32 / lanes rows.
__host__ __device__ inline int rows_lanes(int64_t hf, int vw) {
  int l = 1;
  while ((int64_t)l * vw < hf) l <<= 1;
  return l;
}

template <typename T, typename I, int KIND, int VW>
__global__ void __launch_bounds__(kThreads)
    rows_fwd_kernel(FwdArgs<T, I> a, int lanes) {
  static_assert(KIND == kDot || KIND == kAdd, "rows: 'dot' or 'add'");
  const int lane = threadIdx.x % kWarpSize;
  const int per_warp = kWarpSize / lanes;
  const int64_t row =
      ((int64_t)blockIdx.x * kWarps + threadIdx.x / kWarpSize) * per_warp +
      lane / lanes;
  const bool has_row = row < a.n_dst;
  const int H = a.H, F = a.F, HF = H * F;
  const int c0 = (lane % lanes) * VW;  // this lane's features [c0, c0 + VW)
  const bool on = has_row && c0 < HF;
  const int h = on ? c0 / F : 0;
  const int G = F / VW;  // lanes of one head ('dot': a power of two <= 32)
  float q[VW], qh = 0.f;
#pragma unroll
  for (int i = 0; i < VW; ++i) q[i] = 0.f;
  if constexpr (KIND == kDot) {
    if (on) load_vec<T, VW>(a.q + row * HF + c0, q);
  } else {
    qh = on ? to_float(a.q[row * H + h]) : 0.f;
  }
  // the score of source j for this lane's head (all lanes of a head agree;
  // every lane of the warp takes part in the shuffles)
  auto score = [&](int64_t j, const float (&k)[VW]) -> float {
    if constexpr (KIND == kDot) {
      float s = 0.f;
#pragma unroll
      for (int i = 0; i < VW; ++i) s = fmaf(q[i], k[i], s);
      for (int o = G / 2; o > 0; o >>= 1)
        s += __shfl_xor_sync(kFullMask, s, o);
      return s * a.scale;
    } else {
      return leaky_relu(qh + to_float(a.k[j * H + h]), a.slope);
    }
  };
  const int64_t elo = has_row ? a.rowptr[row] : 0;
  const int64_t ehi = has_row ? a.rowptr[row + 1] : 0;
  // steps of two edges: the longest of the warp's rows (warp-uniform)
  const unsigned steps =
      __reduce_max_sync(kFullMask, (unsigned)((ehi - elo + 1) / 2));
  float m = -INFINITY, l = 0.f, acc[VW];
#pragma unroll
  for (int i = 0; i < VW; ++i) acc[i] = 0.f;
  for (unsigned st = 0; st < steps; ++st) {
    const int64_t e = elo + 2 * (int64_t)st;
    const bool one = e < ehi, two = e + 1 < ehi;
    const int64_t j0 = one ? (int64_t)a.col[e] : 0;
    const int64_t j1 = two ? (int64_t)a.col[e + 1] : j0;
    float k0[VW], k1[VW], v0[VW], v1[VW];
#pragma unroll
    for (int i = 0; i < VW; ++i) k0[i] = k1[i] = v0[i] = v1[i] = 0.f;
    if (on && one) {
      if constexpr (KIND == kDot) {
        load_vec<T, VW>(a.k + j0 * HF + c0, k0);
        load_vec<T, VW>(a.k + j1 * HF + c0, k1);
      }
      load_vec<T, VW>(a.v + j0 * HF + c0, v0);
      load_vec<T, VW>(a.v + j1 * HF + c0, v1);
    }
    const float s0 = score(j0, k0), s1r = score(j1, k1);
    if (!one) continue;  // (this row is done; the shuffles above ran)
    const float s1 = two ? s1r : -INFINITY;
    const float m_new = fmaxf(m, fmaxf(s0, s1));
    const float corr = expf(m - m_new);  // 0 on the first edge
    const float p0 = expf(s0 - m_new), p1 = two ? expf(s1 - m_new) : 0.f;
    l = fmaf(l, corr, p0 + p1);
#pragma unroll
    for (int i = 0; i < VW; ++i)
      acc[i] = fmaf(p1, v1[i], fmaf(p0, v0[i], acc[i] * corr));
    m = m_new;
  }
  if (!on) return;
  const float inv = 1.f / (l + 1e-16f);
#pragma unroll
  for (int i = 0; i < VW; ++i) acc[i] *= inv;
  store_vec<T, VW>(a.out + row * HF + c0, acc);
  if (c0 % F == 0)  // the head's first lane
    a.lse[row * H + h] = ehi > elo ? m + logf(l + 1e-16f) : -INFINITY;
}

}  // namespace fwd
}  // namespace pyg_dfgnn

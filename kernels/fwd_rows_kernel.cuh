// Short rows (molecule-sized batches, graphs of low in-degree): a warp per
// row (or 32 / lanes rows where fewer lanes hold one; short_rows.cuh), each
// lane NV VW-vectors of the row's H * F features, an online softmax per
// head in registers, S edges a step; no shared memory, no block phases.
// SMMF's block of 8 warps spent its time in the machinery around 32-edge
// chunks (row counter, staged query, per-head softmax reductions) when a
// row has ~2 edges (zinc-like under ncu: 33% of DRAM bandwidth, 1.2
// eligible warps per scheduler). 'dot' (D = F) and 'add'; the training
// features of level FEAT (training_features.cuh) except edge keys / values:
// the edge score, dropout (the same Philox mask as SMMF's) and the raw
// scores for the attention weights. The host takes it by short_rows.cuh's
// rule. Same lse / out conventions as SMMF.
#pragma once

#include "fwd_common.cuh"
#include "short_rows.cuh"

namespace pyg_dfgnn {
namespace fwd {

// Resident blocks per SM the kernel is held to (0: no bound): the edge
// score alone took 58 registers (4 blocks) against the plain kernel's 40
// (6), and gat-edge's forward ran +33% over plain GAT's; held to 5, no
// spill with 4-wide vectors (8-wide half spilled 12 bytes; with the
// weights, 20 bytes and slower: gat-attn's forward 0.553 -> 0.594 ms).
// Dropout alone ('add'): 61 registers, held to 5 with 12 bytes spilled
// (one local access in the loop).
template <int KIND, int FEAT, int VW>
inline constexpr int kRowsFwdMinBlocks =
    VW <= 4 && (FEAT == kFeatScore || (FEAT == kFeatDropout && KIND == kAdd))
        ? 5
        : 0;

// NV: vectors a lane (short_rows.cuh's slices; the bound is for NV = 1).
template <typename T, typename I, int KIND, int VW, int NV, int FEAT>
__global__ void __launch_bounds__(kThreads,
                                  NV == 1 ? kRowsFwdMinBlocks<KIND, FEAT, VW>
                                          : 0)
    rows_fwd_kernel(FwdArgs<T, I> a, int lanes) {
  static_assert(KIND == kDot || KIND == kAdd, "rows: 'dot' or 'add'");
  static_assert(sizeof(I) == 4, "rows: int32 neighbour indices");
  constexpr int EW = VW * NV;  // a lane's elements
  constexpr int S = kShortStep<KIND, EW>;  // edges a step
  const int H = a.H, F = a.F, HF = H * F;
  const OwnerLane o = owner_lane<VW, NV>(lanes, a.n_dst, H, F);
  const int64_t row = o.owner;
  const bool has_row = o.has, on = o.on;
  const int c0 = o.c0, h = o.h, G = o.G, sv = G * VW;
  float q[EW], qh = 0.f;
#pragma unroll
  for (int i = 0; i < EW; ++i) q[i] = 0.f;
  if constexpr (KIND == kDot) {
    if (on) load_slices<T, VW, NV>(a.q + row * HF + c0, sv, q);
  } else {
    qh = on ? to_float(a.q[row * H + h]) : 0.f;
  }
  // This lane's columns of the neighbour rows and its head's edge scores
  // as base pointers: per edge a 32x32-bit wide multiply (neighbour j, an
  // int32 index) or a pointer step (the edge score) instead of 64-bit index
  // products -- the kernel is issue-bound (ncu, gat / gat-edge: a warp
  // issues ~0.8 per scheduler cycle), and those products were a third of
  // the loop's instructions.
  const T* k_lane = KIND == kDot ? a.k + c0 : a.k + h;
  const int k_stride = KIND == kDot ? HF : H;
  const T* v_lane = a.v + c0;
  const T* es = kHasScore<FEAT> ? a.et.es : nullptr;
  float* sc_out = kHasWeights<FEAT> ? a.scores : nullptr;
  uint64_t seed, offset;
  drop_begin<FEAT>(a.drop, seed, offset);
  DropoutBatch<FEAT> drop(H, lanes);
  const int64_t elo = has_row ? a.rowptr[row] : 0;
  const int64_t ehi = has_row ? a.rowptr[row + 1] : 0;
  // the head's edge scores of this row, S per step (stepped whether or
  // not there are any: no null test in the loop)
  const bool has_es = es != nullptr && on;
  const T* es_lane = (has_es ? es : a.q) + elo * H + h;
  const int64_t es_step = S * (int64_t)H;
  // 'add': the score of an edge from source j, its edge score `term` (all
  // lanes of a head agree)
  auto score = [&](int j, float term) -> float {
    return leaky_relu(qh + to_float(k_lane[(int64_t)j * k_stride]) + term,
                      a.slope);
  };
  // steps of S edges: the longest of the warp's rows (warp-uniform)
  const unsigned steps =
      __reduce_max_sync(kFullMask, (unsigned)((ehi - elo + S - 1) / S));
  float m = -INFINITY, l = 0.f, acc[EW];
#pragma unroll
  for (int i = 0; i < EW; ++i) acc[i] = 0.f;
  for (unsigned st = 0; st < steps; ++st) {
    const int64_t e = elo + S * (int64_t)st;
    const bool one = e < ehi, two = S == 2 && e + 1 < ehi;
    int j[S];
    j[0] = one ? (int)a.col[e] : 0;
    if constexpr (S == 2) j[1] = two ? (int)a.col[e + 1] : j[0];
    float kx[S][EW], vx[S][EW];
#pragma unroll
    for (int u = 0; u < S; ++u)
#pragma unroll
      for (int i = 0; i < EW; ++i) kx[u][i] = vx[u][i] = 0.f;
    if (on && one) {
      if constexpr (KIND == kDot) {
#pragma unroll
        for (int u = 0; u < S; ++u)
          load_slices<T, VW, NV>(k_lane + (int64_t)j[u] * HF, sv, kx[u]);
      }
#pragma unroll
      for (int u = 0; u < S; ++u)
        load_slices<T, VW, NV>(v_lane + (int64_t)j[u] * HF, sv, vx[u]);
    }
    float t[S];
#pragma unroll
    for (int u = 0; u < S; ++u) t[u] = 0.f;
    if (has_es && one) {
      t[0] = to_float(es_lane[0]);
      if constexpr (S == 2)
        if (two) t[1] = to_float(es_lane[H]);
    }
    es_lane += es_step;
    float s[S];
    if constexpr (KIND == kDot) {
      float d[S];
#pragma unroll
      for (int u = 0; u < S; ++u) d[u] = lane_dot<EW>(q, kx[u]);
      // Half precision: both sums in one butterfly (head_sums, -2 to -5 %
      // on mnist- / zinc-like). fp32: one at a time -- the butterfly's
      // registers (47 -> 50) cost a resident block, +5 to +8 % (H100,
      // session 31).
      if constexpr (S == 2 && VW == 8) {
        head_sums<2>(d, G);
      } else {
#pragma unroll
        for (int u = 0; u < S; ++u) d[u] = group_sum(d[u], G);
      }
#pragma unroll
      for (int u = 0; u < S; ++u) s[u] = fmaf(d[u], a.scale, t[u]);
    } else {
#pragma unroll
      for (int u = 0; u < S; ++u) s[u] = score(j[u], t[u]);
    }
    // the aggregation takes the dropped p / (1 - drop), the row sum p
    float f[S];
    drop.template step<S>(a.drop, seed, offset, elo, e, st, h, f);
    if (!one) continue;  // (this row is done; the shuffles above ran)
    if constexpr (S == 2) s[1] = two ? s[1] : -INFINITY;
    if (sc_out != nullptr && on && c0 % F == 0) {  // the head's first lane
      sc_out[e * H + h] = s[0];
      if constexpr (S == 2)
        if (two) sc_out[(e + 1) * H + h] = s[1];
    }
    float m_new, p[S];
    if constexpr (S == 2)
      m_new = fmaxf(m, fmaxf(s[0], s[1]));
    else
      m_new = fmaxf(m, s[0]);
    const float corr = expf(m - m_new);  // 0 on the first edge
    p[0] = expf(s[0] - m_new);
    if constexpr (S == 2) {
      p[1] = two ? expf(s[1] - m_new) : 0.f;
      l = fmaf(l, corr, p[0] + p[1]);
#pragma unroll
      for (int i = 0; i < EW; ++i)
        acc[i] = fmaf(p[1] * f[1], vx[1][i],
                      fmaf(p[0] * f[0], vx[0][i], acc[i] * corr));
    } else {
      l = fmaf(l, corr, p[0]);
#pragma unroll
      for (int i = 0; i < EW; ++i)
        acc[i] = fmaf(p[0] * f[0], vx[0][i], acc[i] * corr);
    }
    m = m_new;
  }
  if (!on) return;
  const float inv = 1.f / (l + 1e-16f);
#pragma unroll
  for (int i = 0; i < EW; ++i) acc[i] *= inv;
  store_slices<T, VW, NV>(a.out + row * HF + c0, sv, acc);
  if (c0 % F == 0)  // the head's first lane
    a.lse[row * H + h] = ehi > elo ? m + logf(l + 1e-16f) : -INFINITY;
}

}  // namespace fwd
}  // namespace pyg_dfgnn

// Short rows (molecule-sized batches, graphs of low in-degree): a warp per
// row (or 32 / lanes rows where fewer lanes hold one; short_rows.cuh), each
// lane NV VW-vectors of the row's H * F features, an online softmax per
// head in registers, two edges in flight; no shared memory, no block phases.
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

// A walk with NV > 1 (no training features): the blocks the kernel without
// the walk keeps -- the walk's state took 4-16 registers more (ptxas, fp32
// 'dot' 16 elements a lane 117 -> 125, 'add' 80 -> 88).
template <int KIND, int FEAT, int VW, int NV, bool WALK>
inline constexpr int kRowsFwdBlocks =
    NV == 1                ? kRowsFwdMinBlocks<KIND, FEAT, VW>
    : !WALK || FEAT != kFeatNone ? 0
    : VW * NV == 16        ? (KIND == kDot ? 2 : 3)
    : KIND == kAdd && VW * NV == 32 ? 2
                                    : 0;

// NV: vectors a lane (short_rows.cuh's slices). WALK: a persistent launch
// (launch_short_walk): block b walks virtual blocks b, b + gridDim.x, ...
// with the next group's range loaded and its ids asked into L2 ahead; else
// one group a block, nothing ahead.
template <typename T, typename I, int KIND, int VW, int NV, int FEAT,
          bool WALK>
__global__ void __launch_bounds__(
    kThreads, kRowsFwdBlocks<KIND, FEAT, VW, NV, WALK>)
    rows_fwd_kernel(FwdArgs<T, I> a, int lanes) {
  static_assert(KIND == kDot || KIND == kAdd, "rows: 'dot' or 'add'");
  static_assert(sizeof(I) == 4, "rows: int32 neighbour indices");
  constexpr int EW = VW * NV;  // a lane's elements
  const int H = a.H, F = a.F, HF = H * F;
  const T* es = kHasScore<FEAT> ? a.et.es : nullptr;
  float* sc_out = kHasWeights<FEAT> ? a.scores : nullptr;
  uint64_t seed, offset;
  drop_begin<FEAT>(a.drop, seed, offset);
  // the first group's range
  OwnerWalk w = owner_walk<VW, NV>(lanes, a.n_dst, H, F);
  const bool lane_on = w.lane.on;
  const int c0 = w.lane.c0, h = w.lane.h, G = w.lane.G, sv = G * VW;
  int64_t elo, ehi;
  owner_range(a.rowptr, w, 0, elo, ehi);
#pragma unroll 1
  for (; __any_sync(kFullMask, w.has()); w.owner += w.step) {
    const int64_t row = w.owner;
    const bool on = lane_on && w.has();
    // the next group's range (its ptr entries in L2 since a group ago)
    int64_t nlo = 0, nhi = 0;
    if constexpr (WALK) {
      owner_range(a.rowptr, w, 1, nlo, nhi);
      prefetch_range(a.rowptr, w, 2);
    }
    float q[EW], qh = 0.f;
#pragma unroll
    for (int i = 0; i < EW; ++i) q[i] = 0.f;
    if constexpr (KIND == kDot) {
      if (on) load_slices<T, VW, NV, true>(a.q + row * HF + c0, sv, q);
    } else {
      qh = on ? to_float(a.q[row * H + h]) : 0.f;
    }
    // This lane's columns of the neighbour rows and its head's edge scores
    // as base pointers: per edge a 32x32-bit wide multiply (neighbour j, an
    // int32 index) or a pointer step (the edge score) instead of 64-bit
    // index products -- the kernel is issue-bound (ncu, gat / gat-edge: a
    // warp issues ~0.8 per scheduler cycle), and those products were a
    // third of the loop's instructions.
    const T* k_lane = KIND == kDot ? a.k + c0 : a.k + h;
    const int k_stride = KIND == kDot ? HF : H;
    const T* v_lane = a.v + c0;
    DropoutBatch<FEAT> drop(H, lanes);
    // the head's edge scores of this row, two per step (stepped whether or
    // not there are any: no null test in the loop)
    const bool has_es = es != nullptr && on;
    const T* es_lane = (has_es ? es : a.q) + elo * H + h;
    const int64_t es_step = 2 * (int64_t)H;
    // 'add': the score of an edge from source j, its edge score `term` (all
    // lanes of a head agree)
    auto score = [&](int j, float term) -> float {
      return leaky_relu(qh + to_float(k_lane[(int64_t)j * k_stride]) + term,
                        a.slope);
    };
    // steps of two edges: the longest of the warp's rows (warp-uniform)
    const unsigned steps =
        __reduce_max_sync(kFullMask, (unsigned)((ehi - elo + 1) / 2));
    float m = -INFINITY, l = 0.f, acc[EW];
#pragma unroll
    for (int i = 0; i < EW; ++i) acc[i] = 0.f;
    for (unsigned st = 0; st < steps; ++st) {
      const int64_t e = elo + 2 * (int64_t)st;
      const bool one = e < ehi, two = e + 1 < ehi;
      I j0, j1;
      edge_ids<2>(a.col, e, ehi, j0, j1);
      const int i0 = (int)j0, i1 = two ? (int)j1 : i0;
      float k0[EW], k1[EW], v0[EW], v1[EW];
#pragma unroll
      for (int i = 0; i < EW; ++i) k0[i] = k1[i] = v0[i] = v1[i] = 0.f;
      if (on && one) {
        if constexpr (KIND == kDot) {
          load_slices<T, VW, NV, true>(k_lane + (int64_t)i0 * HF, sv, k0);
          load_slices<T, VW, NV, true>(k_lane + (int64_t)i1 * HF, sv, k1);
        }
        load_slices<T, VW, NV, true>(v_lane + (int64_t)i0 * HF, sv, v0);
        load_slices<T, VW, NV, true>(v_lane + (int64_t)i1 * HF, sv, v1);
      }
      // ahead: at the first step, the next group's ids into L2
      if (WALK && st == 0 && nlo < nhi) prefetch_l2(a.col + nlo);
      float t0 = 0.f, t1 = 0.f;
      if (has_es && one) {
        t0 = to_float(es_lane[0]);
        if (two) t1 = to_float(es_lane[H]);
      }
      es_lane += es_step;
      float s0, s1r;
      if constexpr (KIND == kDot) {
        float d[2] = {lane_dot<EW>(q, k0), lane_dot<EW>(q, k1)};
        // Half precision: both sums in one butterfly (head_sums, -2 to -5 %
        // on mnist- / zinc-like). fp32: one at a time -- the butterfly's
        // registers (47 -> 50) cost a resident block, +5 to +8 % (H100,
        // session 31).
        if constexpr (VW == 8) {
          head_sums<2>(d, G);
        } else {
          d[0] = group_sum(d[0], G);
          d[1] = group_sum(d[1], G);
        }
        s0 = fmaf(d[0], a.scale, t0);
        s1r = fmaf(d[1], a.scale, t1);
      } else {
        s0 = score(i0, t0);
        s1r = score(i1, t1);
      }
      // the aggregation takes the dropped p / (1 - drop), the row sum p
      float f[2];
      drop.step(a.drop, seed, offset, elo, e, st, h, f);
      if (!one) continue;  // (this row is done; the shuffles above ran)
      const float s1 = two ? s1r : -INFINITY;
      if (sc_out != nullptr && on && c0 % F == 0) {  // the head's first lane
        sc_out[e * H + h] = s0;
        if (two) sc_out[(e + 1) * H + h] = s1;
      }
      const float m_new = fmaxf(m, fmaxf(s0, s1));
      const float corr = expf(m - m_new);  // 0 on the first edge
      const float p0 = expf(s0 - m_new), p1 = two ? expf(s1 - m_new) : 0.f;
      l = fmaf(l, corr, p0 + p1);
#pragma unroll
      for (int i = 0; i < EW; ++i)
        acc[i] = fmaf(p1 * f[1], v1[i], fmaf(p0 * f[0], v0[i], acc[i] * corr));
      m = m_new;
    }
    if (on) {
      const float inv = 1.f / (l + 1e-16f);
#pragma unroll
      for (int i = 0; i < EW; ++i) acc[i] *= inv;
      store_slices<T, VW, NV>(a.out + row * HF + c0, sv, acc);
      if (c0 % F == 0)  // the head's first lane
        a.lse[row * H + h] = ehi > elo ? m + logf(l + 1e-16f) : -INFINITY;
    }
    if constexpr (!WALK) break;
    // the next group: its range loaded and its ids in L2
    elo = nlo, ehi = nhi;
  }
}

}  // namespace fwd
}  // namespace pyg_dfgnn

// The score kinds (ScoreKind in ops.h) as per-lane partial sums over a
// feature slice of one (edge, head) item; lanes of an item's group add their
// parts with group_sum / group8_sum:
//   kDot   <q_i, k_j (+ ek_ij)>                      (scaled by the caller)
//   kGatv2 <att, leaky_relu(q_i + k_j (+ ek_ij))>
//   kAdd   leaky_relu(q_i + k_j (+ es_ij)), a scalar per head, formed where
//          it is used (no feature slice).
// score_part reads the query row from shared memory (fp32), score_part_global
// from global memory; dot_part is the backward cols pass's <nb, own + e>.
#pragma once

#include "numeric.cuh"
#include "ops.h"
#include "vector_io.cuh"

namespace pyg_dfgnn {

// ------------------------------------------------------------ math
__device__ __forceinline__ float leaky_relu(float x, float slope) {
  return x > 0.f ? x : x * slope;
}
// d leaky_relu / dx (PyG / torch: slope for x <= 0).
__device__ __forceinline__ float leaky_relu_grad(float x, float slope) {
  return x > 0.f ? 1.f : slope;
}

// One element's share of an (edge, head) score added to acc: q k ('dot')
// or att leaky_relu(q + k) ('gatv2'; att unused for 'dot').
template <int KIND>
__device__ __forceinline__ float score_elem(float q, float k, float att,
                                            float slope, float acc) {
  if constexpr (KIND == kDot)
    return fmaf(q, k, acc);
  else
    return fmaf(att, leaky_relu(q + k, slope), acc);
}

// score_elem over one VW-vector.
template <int KIND, int VW>
__device__ __forceinline__ float score_vec(const float (&q)[VW],
                                           const float (&k)[VW],
                                           const float (&att)[VW],
                                           float slope, float acc) {
#pragma unroll
  for (int i = 0; i < VW; ++i)
    acc = score_elem<KIND>(q[i], k[i], att[i], slope, acc);
  return acc;
}

// Partial score of one (edge, head) item over this lane's share of D.
// e_row (nullptr: none) is the edge's key term, added to the key row.
template <int KIND, typename T, int VW>
__device__ __forceinline__ float score_part(const float* q_row,
                                            const T* k_row, const float* att,
                                            int D, int d0, int dstep,
                                            float slope,
                                            const T* e_row = nullptr) {
  float acc = 0.f;
  for (int d = d0; d < D; d += dstep) {
    float kx[VW], qx[VW];
    load_vec<T, VW>(k_row + d, kx);
    if (e_row != nullptr) add_vec<T, VW>(e_row + d, kx);
    load_smem<VW>(q_row + d, qx);
    float ax[VW];
    if constexpr (KIND != kDot) load_smem<VW>(att + d, ax);
    acc = score_vec<KIND, VW>(qx, kx, ax, slope, acc);
  }
  return acc;
}

// Partial <nb, own + e> of one (edge, head) item over this lane's share of
// D: the owner's row `own` in shared memory (fp32), the neighbour's `nb`
// and the edge's term `e` (nullptr: none) added to the owner's side. (The
// backward's cols pass: <q_i, k_j + ek_ij> and <dO_i, v_j + ev_ij> with j
// the owner.)
template <typename T, int VW>
__device__ __forceinline__ float dot_part(const float* own, const T* nb,
                                          const T* e_row, int D, int d0,
                                          int dstep) {
  float acc = 0.f;
  for (int d = d0; d < D; d += dstep) {
    float ox[VW], nx[VW];
    load_smem<VW>(own + d, ox);
    if (e_row != nullptr) add_vec<T, VW>(e_row + d, ox);
    load_vec<T, VW>(nb + d, nx);
#pragma unroll
    for (int i = 0; i < VW; ++i) acc = fmaf(nx[i], ox[i], acc);
  }
  return acc;
}

// score_part with the query row read from global memory (PMF SDDMM).
template <int KIND, typename T, int VW>
__device__ __forceinline__ float score_part_global(const T* q_row,
                                                   const T* k_row,
                                                   const T* att, int D,
                                                   int d0, int dstep,
                                                   float slope,
                                                   const T* e_row) {
  float acc = 0.f;
  for (int d = d0; d < D; d += dstep) {
    float kx[VW], qx[VW];
    load_vec<T, VW>(k_row + d, kx);
    if (e_row != nullptr) add_vec<T, VW>(e_row + d, kx);
    load_vec<T, VW>(q_row + d, qx);
    float ax[VW];
    if constexpr (KIND != kDot) load_vec<T, VW>(att + d, ax);
    acc = score_vec<KIND, VW>(qx, kx, ax, slope, acc);
  }
  return acc;
}

}  // namespace pyg_dfgnn

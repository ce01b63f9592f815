// Raw edge attributes with a matrix M_i per row (TransformerConv's edge
// terms, M_i = scale Theta_e^T q_i) and x rows in vectors: a warp per row
// whose lanes form groups of G, one CSR edge per group, each lane kVW
// columns of the edge's x row (so a group reads the row as one contiguous
// range, 32 / G edges per warp step). The lanes-over-edges row kernel
// (edge_rows_kernel) read whole x rows per lane and its sums put lanes over
// the H * De outputs with scalar loads; it stays for H > 8 and rows that do
// not come in vectors.
//   dots     per-lane partial products, summed over the group by a
//            transposing butterfly (transpose_sum: each lane keeps its heads)
//   sums     per-lane [H][kVW] accumulators, summed over the warp's groups
//            once at the end of the row
//   scatter  a lane's kVW columns of sum_h w'_h M_ih, one vector store
// Self-loops as in the row kernel: the loop's dot is the mean / sum of the
// others' (or <M_i, fill_row>), its weight is handed to the others.
#pragma once

#include "edge_attr_common.cuh"

namespace pyg_dfgnn {
namespace edge_rows {

// The group width for De columns: the fewest lanes that cover the row in
// vectors of kVW, a power of two (0: the rows are too wide for one warp).
__host__ __device__ __forceinline__ int edge_group_lanes(int De) {
  int g = 1;
  while (g * kVW < De) g <<= 1;
  return g <= kWarpSize ? g : 0;
}

// SUMS: sums (and maybe scatter), no dots; else dots and / or scatter --
// the [MAXH][kVW] accumulators and the dots' registers are never live
// together (the host takes dots with sums to the row kernel).
// Blocks per SM: the sums launches are bound by load latency (the forward
// sums and the backward's sums + scatter take the same time), so 4 heads'
// sums take a fifth block at 48 registers (a few spills to L1).
template <bool SUMS, int MAXH>
constexpr int kGroupBlocks = SUMS ? (MAXH > 4 ? 3 : 5) : 4;

template <typename T, int MAXH, bool SUMS>
__global__ void __launch_bounds__(kThreads, kGroupBlocks<SUMS, MAXH>)
    edge_groups_kernel(Args<T> a, int G) {
  static_assert(kVW == 4, "the group kernel reads M in float4");
  const bool dots = !SUMS && a.dots != nullptr;
  __shared__ __align__(16) float s_m[kWarps][kEdgeRowsMaxHD];
  __shared__ float s_wl[kWarps][2 * kEdgeRowsMaxHeads];
  __shared__ float s_fill[kEdgeRowsMaxHD];
  const int H = a.H, De = a.De;
  if (a.fill == 3)
    for (int i = threadIdx.x; i < De; i += kThreads)
      s_fill[i] = to_float(a.fill_row[i]);
  __syncthreads();
  const int warp = threadIdx.x / kWarpSize, lane = threadIdx.x % kWarpSize;
  const int64_t row = (int64_t)blockIdx.x * kWarps + warp;
  if (row >= a.n_rows) return;
  float* m = s_m[warp];
  float* wl = s_wl[warp];
  const RowStart rs = begin_row(a, row, lane, m, wl);
  const int64_t lo = rs.lo, hi = rs.hi, loop_p = rs.loop_p;

  // (G is a power of two: masks and shifts, not integer division, in the
  // per-edge code)
  const int gmask = G - 1, slots = kWarpSize / G, slot = lane >> (__ffs(G) - 1);
  const int lg = lane & gmask;
  const int col = lg * kVW;  // this lane's first column
  const bool has_col = col < De;
  // the dots' M slice of this lane in registers for the row, up to 4
  // heads (per edge, the shared-memory reads of M were a quarter of the
  // kernel's instructions; 8 heads' slices would spill)
  constexpr int kRegH = !SUMS && MAXH <= 4 ? MAXH : 1;
  float mr[kRegH][kVW];
#pragma unroll
  for (int h = 0; h < kRegH; ++h)
#pragma unroll
    for (int i = 0; i < kVW; ++i)
      mr[h][i] = dots && h < H && has_col ? m[h * De + col + i] : 0.f;
  // the heads whose dots this lane holds after their group sums
  // (transpose_sum over the G lanes: `held` of them from head0), and
  // whether it writes them (G > MAXH: G / MAXH lanes hold each head)
  const int held = transpose_count<MAXH>(G);
  const int head0 = transpose_item<MAXH>(lane, G);
  const bool writer = transpose_writer<MAXH>(lane, G);
  float dsum[MAXH];  // the row's dots (for its loop), per held head
  float acc[SUMS ? MAXH : 1][kVW];
#pragma unroll
  for (int h = 0; h < MAXH; ++h) dsum[h] = 0.f;
#pragma unroll
  for (int h = 0; h < (SUMS ? MAXH : 1); ++h)
#pragma unroll
    for (int i = 0; i < kVW; ++i) acc[h][i] = 0.f;

  for (int64_t b = lo; b < hi; b += slots) {  // (warp-uniform)
    const int64_t p = b + slot;
    int64_t r = a.n_in;  // past the row: like the loop, nothing to do
    if (p < hi) r = a.index != nullptr ? a.index[p] : p;
    const bool live = r < a.n_in;  // (group-uniform)
    float xv[kVW];
#pragma unroll
    for (int i = 0; i < kVW; ++i) xv[i] = 0.f;
    if (live && has_col) load_vec<T, kVW>(a.x + r * De + col, xv);
    if (dots) {
      float part[MAXH];
#pragma unroll
      for (int h = 0; h < MAXH; ++h) {
        float4 mv = make_float4(0.f, 0.f, 0.f, 0.f);
        if constexpr (kRegH == MAXH)
          mv = make_float4(mr[h][0], mr[h][1], mr[h][2], mr[h][3]);
        else if (h < H && has_col)
          mv = *reinterpret_cast<const float4*>(m + h * De + col);
        part[h] = fmaf(mv.x, xv[0], fmaf(mv.y, xv[1],
                  fmaf(mv.z, xv[2], mv.w * xv[3])));
      }
      // the group's sums, transposed: ~MAXH shuffles where a butterfly
      // per head took MAXH log2 G
      transpose_sum<MAXH>(part, G);
      if (live && writer)
#pragma unroll
        for (int i = 0; i < MAXH; ++i)
          if (i < held && head0 + i < H) {
            a.dots[p * H + head0 + i] = from_float<T>(part[i]);
            dsum[i] += part[i];
          }
    }
    if (SUMS || a.scatter != nullptr) {
      float wv[MAXH];
#pragma unroll
      for (int h = 0; h < MAXH; ++h)
        wv[h] = live && h < H ? to_float(a.w[p * H + h]) + wl[h] : 0.f;
      if constexpr (SUMS) {
#pragma unroll
        for (int h = 0; h < MAXH; ++h)
#pragma unroll
          for (int i = 0; i < kVW; ++i)
            acc[h][i] = fmaf(wv[h], xv[i], acc[h][i]);
      }
      if (a.scatter != nullptr && live && has_col) {
        // g += w'_h M_h over the heads: M's slice in shared memory
        float g[kVW] = {0.f, 0.f, 0.f, 0.f};
        auto add_term = [&](int h, float wt, const float* mm) {
          const float4 mv = *reinterpret_cast<const float4*>(mm + h * De + col);
          g[0] = fmaf(wt, mv.x, g[0]);
          g[1] = fmaf(wt, mv.y, g[1]);
          g[2] = fmaf(wt, mv.z, g[2]);
          g[3] = fmaf(wt, mv.w, g[3]);
        };
#pragma unroll
        for (int h = 0; h < MAXH; ++h)
          if (h < H) add_term(h, wv[h], m);
        if (a.m2 != nullptr)  // (the second term: after M in shared m)
#pragma unroll
          for (int h = 0; h < MAXH; ++h)
            if (h < H)
              add_term(h,
                       to_float(a.w2[p * H + h]) + wl[kEdgeRowsMaxHeads + h],
                       m + H * De);
        store_vec<T, kVW>(a.scatter + r * De + col, g);
      }
    }
  }

  if (dots && loop_p >= 0) {
    if (a.fill == 3) {
      write_loop_dots(a, m, s_fill, rs, dsum, lane);
    } else {  // the row's dots summed over the slots, per held head
#pragma unroll
      for (int i = 0; i < MAXH; ++i)
        for (int o = G; o < kWarpSize; o <<= 1)
          dsum[i] += __shfl_xor_sync(kFullMask, dsum[i], o);
      if (slot == 0 && writer)
#pragma unroll
        for (int i = 0; i < MAXH; ++i)
          if (i < held && head0 + i < H)
            a.dots[loop_p * H + head0 + i] =
                from_float<T>(dsum[i] * rs.share);
    }
  }

  if constexpr (SUMS) {
    if (a.sums == nullptr) return;
#pragma unroll
    for (int h = 0; h < MAXH; ++h) {
      if (h >= H) break;  // (warp-uniform)
#pragma unroll
      for (int i = 0; i < kVW; ++i)
        for (int o = G; o < kWarpSize; o <<= 1)
          acc[h][i] += __shfl_xor_sync(kFullMask, acc[h][i], o);
      if (slot != 0 || !has_col) continue;
      if (a.fill == 3 && loop_p >= 0) {
        const float wloop = to_float(a.w[loop_p * H + h]);
#pragma unroll
        for (int i = 0; i < kVW; ++i)
          acc[h][i] = fmaf(wloop, s_fill[col + i], acc[h][i]);
      }
      store_vec<float, kVW>(a.sums + row * H * De + h * De + col, acc[h]);
    }
  }
}

}  // namespace edge_rows
}  // namespace pyg_dfgnn

// The tensor-core windows' adjacency as bits, their walk over a window's
// edges and their base-2 softmax (forward and backward TC kernels).
//
// Mask: a window chunk's edge (row r, source c) is bit tc_mask_bit<T>(c) of
// word r * kTcMaskWords + tc_mask_word<T>(c) -- the accumulator layout: lane
// (g, q) of a 16-row strip reads words (r0 + g) * 4 + q and (r0 + g + 8) * 4
// + q once a head and finds element i of 8-tile t at bit 2 t + (i & 1)
// (tc_mask_has), where MmaTile<T>::column(q, i) is that element's column.
// The backward's source strips read the transposed mask (word c * 4 +
// tc_mask_word<T>(r)) the same way. Before, every element of every head
// read its byte of a [rows][sources] count matrix from shared memory;
// multiplicities (a repeated edge) are found while the bits are set
// (atomicOr's old word) and only then counted in bytes.
#pragma once

#include <cstdint>

#include "mma_tiles.cuh"

namespace pyg_dfgnn {

constexpr int kTcMaskWords = 4;  // a row's words: one a quad lane
constexpr float kLog2e = 1.4426950408889634f;
constexpr float kLn2 = 0.6931471805599453f;

// Quad lane whose accumulators hold column c (of its 8-tile) and the bit of
// source / row c in that lane's word.
template <typename T>
__device__ __forceinline__ int tc_mask_word(int c) {
  return MmaTile<T>::kTf32 ? (c & 3) : ((c & 7) >> 1);
}
template <typename T>
__device__ __forceinline__ uint32_t tc_mask_bit(int c) {
  const int j = MmaTile<T>::kTf32 ? ((c >> 2) & 1) : (c & 1);
  return 1u << (2 * (c >> 3) + j);
}
// Whether accumulator element i of 8-tile t has an edge (w: the lane's word
// of that row / source).
__device__ __forceinline__ bool tc_mask_has(uint32_t w, int t, int i) {
  return (w >> (2 * t + (i & 1))) & 1u;
}

// 2^x by the MUFU unit alone (ex2.approx.ftz: ~2 ulp, 0 for -inf). The TC
// kernels' softmax runs in base 2: scores times scale log2(e), so that p is
// one subtraction (or fma) and one ex2 instead of expf's ~8 instructions.
__device__ __forceinline__ float tc_exp2(float x) {
  float y;
  asm("ex2.approx.ftz.f32 %0, %1;" : "=f"(y) : "f"(x));
  return y;
}

// f(r, c) for every edge of rows [row0, row0 + n_rows) (r: the window row,
// c: col[e]). Warp w takes rows w, w + kWarps, ...: their bounds come from
// one load a lane, and kGroup rows' column ids are loaded before any is
// used, so that a warp waits for global memory about deg / 32 times per
// kGroup rows instead of twice a row and once per 32 edges.
template <int kWarps, int kGroup = 4, typename F>
__device__ __forceinline__ void tc_window_edges(
    const int64_t* __restrict__ rowptr, const int32_t* __restrict__ col,
    int64_t row0, int n_rows, int warp, int lane, F&& f) {
  for (int base = warp; base < n_rows; base += kWarps * kWarpSize) {
    const int r_l = base + kWarps * lane;  // this lane's row
    int64_t lo = 0;
    int deg = 0;
    if (r_l < n_rows) {
      lo = rowptr[row0 + r_l];
      deg = (int)(rowptr[row0 + r_l + 1] - lo);
    }
    const int mine = min(kWarpSize, (n_rows - base + kWarps - 1) / kWarps);
    for (int k = 0; k < mine; k += kGroup) {  // (warp-uniform)
      int64_t e0[kGroup];
      int d[kGroup], d_max = 0;
#pragma unroll
      for (int u = 0; u < kGroup; ++u) {
        e0[u] = __shfl_sync(kFullMask, lo, (k + u) % kWarpSize);
        d[u] = __shfl_sync(kFullMask, deg, (k + u) % kWarpSize);
        if (k + u >= mine) d[u] = 0;
        d_max = max(d_max, d[u]);
      }
      for (int off = lane; off - lane < d_max; off += kWarpSize) {
        int c[kGroup];
#pragma unroll
        for (int u = 0; u < kGroup; ++u)
          c[u] = off < d[u] ? col[e0[u] + off] : -1;
#pragma unroll
        for (int u = 0; u < kGroup; ++u)
          if (c[u] >= 0) f(base + kWarps * (k + u), c[u]);
      }
    }
  }
}

}  // namespace pyg_dfgnn

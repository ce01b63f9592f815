// Shared pieces of the raw edge attribute kernels (edge_attr_rows.cu): the
// launch constants, the kernels' arguments, and the per-edge products of one
// x row with a matrix M held in shared memory (dots and scatter).
#pragma once

#include <ATen/ATen.h>

#include "numeric.cuh"
#include "vector_io.cuh"
#include "ops.h"

namespace pyg_dfgnn {
namespace edge_rows {

constexpr int kWarps = 8;
constexpr int kThreads = kWarps * kWarpSize;
constexpr int kOut = 8;     // sums: outputs per lane per pass
constexpr int kUnroll = 4;  // sums: edges in flight
constexpr int kVW = 4;      // elements per vector load of an x row

template <typename T>
struct Args {
  const int64_t* __restrict__ rowptr;
  const int64_t* __restrict__ index;  // nullptr: identity
  const T* __restrict__ x;            // [n_in, De]
  const T* __restrict__ fill_row;     // [De] (fill 3)
  const T* __restrict__ m;            // [rows or 1, H, De]
  const T* __restrict__ w;            // [E, H]
  T* __restrict__ dots;               // [E, H]
  float* __restrict__ sums;           // [rows, H, De]
  T* __restrict__ scatter;            // [n_in, De]
  // scatter's second term (or nullptr): d x_p += sum_h w2[p, h] m2[i, h],
  // staged in shared memory after M (2 H De <= kEdgeRowsMaxHD)
  const T* __restrict__ m2;           // [rows, H, De]
  const T* __restrict__ w2;           // [E, H]
  const int64_t* __restrict__ loop_pos;  // [rows]: loop entry, -1 (fill != 0)
  const int32_t* __restrict__ edge_row;  // [E]: each edge's row (fill != 0)
  int64_t n_rows, n_in, n_edges, m_stride;
  int H, De, fill;
  bool vec;  // De % kVW == 0: x rows in vectors of kVW
};

// Host: an optional tensor argument of op `op` (undefined when absent),
// checked to be on `dev`, contiguous.
inline at::Tensor optional_input(const c10::optional<at::Tensor>& t,
                                 const char* op, const char* name,
                                 at::Device dev) {
  if (!t.has_value() || !t->defined()) return at::Tensor();
  TORCH_CHECK(t->is_cuda() && t->device() == dev, op, ": '", name,
              "' must be on ", dev);
  return t->contiguous();
}

// dots (acc[h] = <M_h, x>) and scatter (g = sum_h wv[h] M_h) of one x row,
// VW elements at a time; M in shared memory.
template <typename T, int MAXH, int VW>
__device__ __forceinline__ void row_dots(const T* xr, const float* m, int H,
                                         int De, float (&acc)[MAXH]) {
  for (int d = 0; d < De; d += VW) {
    float xv[VW];
    load_vec<T, VW>(xr + d, xv);
#pragma unroll
    for (int h = 0; h < MAXH; ++h)
      if (h < H)
#pragma unroll
        for (int i = 0; i < VW; ++i)
          acc[h] = fmaf(m[h * De + d + i], xv[i], acc[h]);
  }
}
template <typename T, int MAXH, int VW>
__device__ __forceinline__ void row_scatter(T* gr, const float* m, int H,
                                            int De, const float (&wv)[MAXH],
                                            const float (&wv2)[MAXH],
                                            bool second) {
  const float* m2 = m + H * De;  // (the second term's matrix, if any)
  for (int d = 0; d < De; d += VW) {
    float g[VW];
#pragma unroll
    for (int i = 0; i < VW; ++i) g[i] = 0.f;
#pragma unroll
    for (int h = 0; h < MAXH; ++h)
      if (h < H)
#pragma unroll
        for (int i = 0; i < VW; ++i) g[i] = fmaf(wv[h], m[h * De + d + i], g[i]);
    if (second)
#pragma unroll
      for (int h = 0; h < MAXH; ++h)
        if (h < H)
#pragma unroll
          for (int i = 0; i < VW; ++i)
            g[i] = fmaf(wv2[h], m2[h * De + d + i], g[i]);
    store_vec<T, VW>(gr + d, g);
  }
}

// row_dots / row_scatter of user row r, in vectors where the rows allow.
template <typename T, int MAXH>
__device__ __forceinline__ void edge_dots(const Args<T>& a, int64_t r,
                                          const float* m, float (&acc)[MAXH]) {
  if (a.vec)
    row_dots<T, MAXH, kVW>(a.x + r * a.De, m, a.H, a.De, acc);
  else
    row_dots<T, MAXH, 1>(a.x + r * a.De, m, a.H, a.De, acc);
}
template <typename T, int MAXH>
__device__ __forceinline__ void edge_scatter(const Args<T>& a, int64_t r,
                                             const float* m,
                                             const float (&wv)[MAXH],
                                             const float (&wv2)[MAXH]) {
  const bool second = a.m2 != nullptr;
  if (a.vec)
    row_scatter<T, MAXH, kVW>(a.scatter + r * a.De, m, a.H, a.De, wv, wv2,
                              second);
  else
    row_scatter<T, MAXH, 1>(a.scatter + r * a.De, m, a.H, a.De, wv, wv2,
                            second);
}

// What a row's loop hands each of its `count` other edges: 1 / count of
// its weight or dot for fill 1 (the loop's x is their mean), all of it for
// fill 2 (their sum); 1 for fill 3 (a constant row: nothing handed).
__device__ __forceinline__ float loop_share(int fill, int64_t count) {
  return fill == 1 ? (count > 0 ? 1.f / (float)count : 0.f) : 1.f;
}

// The self-loop entry of CSR row `row` (at most one per row), -1 if none:
// from the map's loop_pos (built once per graph), not a scan of the row.
template <typename T>
__device__ __forceinline__ int64_t row_loop(const Args<T>& a, int64_t row) {
  return a.fill != 0 ? a.loop_pos[row] : -1;
}

// The start of row `row` in the row kernels (one warp): M_i into the
// warp's shared m (when given; the second term's m2_i after it), the row's
// loop entry, the share of the loop each other edge takes, and the loop
// weight handed to them (wl[h]; the second term's at wl[kEdgeRowsMaxHeads
// + h]).
struct RowStart {
  int64_t lo, hi, loop_p;
  float share;
};
template <typename T>
__device__ __forceinline__ RowStart begin_row(const Args<T>& a, int64_t row,
                                              int lane, float* m,
                                              float* wl) {
  const int H = a.H;
  const int HD = H * a.De;
  if (a.m != nullptr)
    for (int i = lane; i < HD; i += kWarpSize)
      m[i] = to_float(a.m[row * a.m_stride + i]);
  if (a.m2 != nullptr)
    for (int i = lane; i < HD; i += kWarpSize)
      m[HD + i] = to_float(a.m2[row * HD + i]);
  RowStart rs;
  rs.lo = a.rowptr[row], rs.hi = a.rowptr[row + 1];
  rs.loop_p = row_loop(a, row);
  const int64_t count = rs.hi - rs.lo - (rs.loop_p >= 0 ? 1 : 0);
  // fill 1: the loop's x is the mean of `count` rows; fill 2: their sum
  rs.share = loop_share(a.fill, count);
  const bool handed = rs.loop_p >= 0 && (a.fill == 1 || a.fill == 2);
  if (a.w != nullptr && lane < H)
    wl[lane] = handed ? to_float(a.w[rs.loop_p * H + lane]) * rs.share : 0.f;
  if (a.w2 != nullptr && lane < H)
    wl[kEdgeRowsMaxHeads + lane] =
        handed ? to_float(a.w2[rs.loop_p * H + lane]) * rs.share : 0.f;
  __syncwarp();
  return rs;
}

// The row's loop dot, after its other edges: <M_i, fill_row> (fill 3), or
// the others' sum (per-lane partials in dsum) times the share.
template <typename T, int MAXH>
__device__ __forceinline__ void write_loop_dots(const Args<T>& a,
                                                const float* m,
                                                const float* s_fill,
                                                const RowStart& rs,
                                                const float (&dsum)[MAXH],
                                                int lane) {
  const int H = a.H, De = a.De;
  if (a.fill == 3) {
    for (int h = lane; h < H; h += kWarpSize) {
      float s = 0.f;
      for (int d = 0; d < De; ++d) s = fmaf(m[h * De + d], s_fill[d], s);
      a.dots[rs.loop_p * H + h] = from_float<T>(s);
    }
  } else {
#pragma unroll
    for (int h = 0; h < MAXH; ++h) {
      if (h >= H) break;  // (warp-uniform)
      const float s = warp_sum(dsum[h]);
      if (lane == 0) a.dots[rs.loop_p * H + h] = from_float<T>(s * rs.share);
    }
  }
}

}  // namespace edge_rows
}  // namespace pyg_dfgnn

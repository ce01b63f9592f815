// Raw edge attributes with one matrix M [H, De] shared by every row (GAT's
// edge term a_e^T Theta_e x_p): edge-parallel kernels, for the products do
// not depend on the row. The row kernel's warp per row left its lanes idle
// on short rows and chained three dependent loads per edge; here a thread
// takes one CSR edge and a block's [256, H] slice of dots / weights moves
// through shared memory as one coalesced range.
//   dots:   shared_dots_kernel (edges), then loop_dots_kernel (rows with a
//           self-loop: the mean / sum of the row's other dots, or <M, fill>)
//   d x, d M: loop_weights_kernel (rows: the loop's weight handed to the
//           row's other edges), shared_grad_kernel (edges: d x = sum_h w'_h
//           M_h into the user's row, and d M = w'^T x as per-block partials
//           that the host entry sums).
// Each user row is read by at most one CSR edge, so d x needs no atomics:
// deterministic like the row kernel.
#pragma once

#include "edge_attr_common.cuh"

namespace pyg_dfgnn {
namespace edge_rows {

constexpr int kEdgeThreads = 256;
constexpr int kFoldCols = 16;  // shared_grad: x columns staged per pass

// The CSR row holding edge p: the last row with rowptr[row] <= p.
__device__ __forceinline__ int64_t row_of_edge(const int64_t* rowptr,
                                               int64_t n_rows, int64_t p) {
  int64_t lo = 0, hi = n_rows - 1;
  while (lo < hi) {
    const int64_t mid = (lo + hi + 1) / 2;
    if (rowptr[mid] <= p) lo = mid; else hi = mid - 1;
  }
  return lo;
}

template <typename T>
__device__ __forceinline__ void load_shared_mat(const Args<T>& a, float* m) {
  for (int i = threadIdx.x; i < a.H * a.De; i += blockDim.x)
    m[i] = to_float(a.m[i]);
}

// dots[p, :] = <M_h, x_p> for the non-loop edges (loops: 0, filled by
// loop_dots_kernel).
template <typename T, int MAXH>
__global__ void __launch_bounds__(kEdgeThreads)
    shared_dots_kernel(Args<T> a) {
  __shared__ float s_m[kEdgeRowsMaxHD];
  __shared__ float s_out[kEdgeThreads * MAXH];
  load_shared_mat(a, s_m);
  __syncthreads();
  const int H = a.H, De = a.De;
  const int64_t p0 = (int64_t)blockIdx.x * kEdgeThreads;
  const int64_t p = p0 + threadIdx.x;
  float acc[MAXH];
#pragma unroll
  for (int h = 0; h < MAXH; ++h) acc[h] = 0.f;
  if (p < a.n_edges) {
    const int64_t r = a.index != nullptr ? a.index[p] : p;
    if (r < a.n_in) edge_dots(a, r, s_m, acc);
  }
#pragma unroll
  for (int h = 0; h < MAXH; ++h)
    if (h < H) s_out[threadIdx.x * H + h] = acc[h];
  __syncthreads();
  const int64_t left = a.n_edges - p0;
  const int n = (int)(left < kEdgeThreads ? left : kEdgeThreads) * H;
  for (int i = threadIdx.x; i < n; i += kEdgeThreads)
    a.dots[p0 * H + i] = from_float<T>(s_out[i]);
}

// The loops' dots (after shared_dots_kernel): warp per row.
template <typename T, int MAXH>
__global__ void __launch_bounds__(kThreads) loop_dots_kernel(Args<T> a) {
  const int warp = threadIdx.x / kWarpSize, lane = threadIdx.x % kWarpSize;
  const int64_t row = (int64_t)blockIdx.x * kWarps + warp;
  if (row >= a.n_rows) return;
  const int H = a.H, De = a.De;
  const int64_t lo = a.rowptr[row], hi = a.rowptr[row + 1];
  const int64_t loop_p = row_loop(a, lo, hi, lane);
  if (loop_p < 0) return;
  if (a.fill == 3) {
    for (int h = lane; h < H; h += kWarpSize) {
      float s = 0.f;
      for (int d = 0; d < De; ++d)
        s = fmaf(to_float(a.m[h * De + d]), to_float(a.fill_row[d]), s);
      a.dots[loop_p * H + h] = from_float<T>(s);
    }
    return;
  }
  const int64_t count = hi - lo - 1;
  const float share = loop_share(a.fill, count);
  float acc[MAXH];
#pragma unroll
  for (int h = 0; h < MAXH; ++h) acc[h] = 0.f;
  for (int64_t p = lo + lane; p < hi; p += kWarpSize) {
    if (p == loop_p) continue;
#pragma unroll
    for (int h = 0; h < MAXH; ++h)
      if (h < H) acc[h] += to_float(a.dots[p * H + h]);
  }
#pragma unroll
  for (int h = 0; h < MAXH; ++h) {
    if (h >= H) break;  // (warp-uniform)
    const float s = warp_sum(acc[h]);
    if (lane == 0) a.dots[loop_p * H + h] = from_float<T>(s * share);
  }
}

// Per row, the weight of its loop: handed to the row's other edges (fill 1
// / 2: w[loop] * share) or kept for d M with the fill row (fill 3); 0
// without a loop. Warp per row; out [rows, H].
template <typename T>
__global__ void __launch_bounds__(kThreads)
    loop_weights_kernel(Args<T> a, float* __restrict__ out) {
  const int warp = threadIdx.x / kWarpSize, lane = threadIdx.x % kWarpSize;
  const int64_t row = (int64_t)blockIdx.x * kWarps + warp;
  if (row >= a.n_rows) return;
  const int64_t lo = a.rowptr[row], hi = a.rowptr[row + 1];
  const int64_t loop_p = row_loop(a, lo, hi, lane);
  const int64_t count = hi - lo - 1;
  const float share = loop_share(a.fill, count);
  for (int h = lane; h < a.H; h += kWarpSize)
    out[row * a.H + h] =
        loop_p < 0 ? 0.f : to_float(a.w[loop_p * a.H + h]) * share;
}

// For each non-loop edge p reading user row r: w' = w[p] (+ its row's
// handed loop weight), d x[r] = sum_h w'_h M_h (scatter) and, with
// `partial`, d M = sum_p w'_p x_p^T folded in: the tile's w' stay in
// shared memory, its x rows are staged kFoldCols columns at a time, thread
// groups over the (h, column) outputs sum the tile's edges in order, and
// the block's running sums (s_acc) leave once as partial[block] (summed on
// the host: deterministic). Persistent blocks stride over tiles of
// kEdgeThreads edges. (Session 11's first version wrote w' in the user's
// order and summed w'^T x in a second kernel: 0.38 + 0.39 ms on gat-edge.)
template <typename T, int MAXH>
__global__ void __launch_bounds__(kEdgeThreads)
    shared_grad_kernel(Args<T> a, const float* __restrict__ loop_w,
                       float* __restrict__ partial) {
  __shared__ float s_m[kEdgeRowsMaxHD];
  __shared__ float s_w[kEdgeThreads * MAXH];
  __shared__ float s_x[kEdgeThreads * kFoldCols];
  __shared__ float s_part[kEdgeThreads];
  __shared__ float s_acc[kEdgeRowsMaxHD];
  __shared__ int64_t s_r[kEdgeThreads];
  load_shared_mat(a, s_m);
  const int H = a.H, De = a.De, HD = H * De, t = threadIdx.x;
  for (int i = t; i < HD; i += kEdgeThreads) s_acc[i] = 0.f;
  const int64_t tiles = (a.n_edges + kEdgeThreads - 1) / kEdgeThreads;
  for (int64_t tile = blockIdx.x; tile < tiles; tile += gridDim.x) {
    const int64_t p0 = tile * kEdgeThreads;
    const int64_t left = a.n_edges - p0;
    const int n = (int)(left < kEdgeThreads ? left : kEdgeThreads) * H;
    __syncthreads();  // (the previous tile is consumed)
    for (int i = t; i < n; i += kEdgeThreads) s_w[i] = to_float(a.w[p0 * H + i]);
    __syncthreads();
    const int64_t p = p0 + t;
    int64_t r = a.n_in;  // (past the tile, or a loop: no user row)
    if (p < a.n_edges) r = a.index != nullptr ? a.index[p] : p;
    float wv[MAXH];
#pragma unroll
    for (int h = 0; h < MAXH; ++h)
      wv[h] = h < H && r < a.n_in ? s_w[t * H + h] : 0.f;
    if (r < a.n_in && loop_w != nullptr && a.fill != 3) {
      const float* lw = loop_w + row_of_edge(a.rowptr, a.n_rows, p) * H;
#pragma unroll
      for (int h = 0; h < MAXH; ++h)
        if (h < H) wv[h] += lw[h];
    }
    if (r < a.n_in && a.scatter != nullptr) edge_scatter(a, r, s_m, wv);
    if (partial == nullptr) continue;  // (block-uniform)
    // this thread's w' (0 for loops and past the tile) replaces its slice
#pragma unroll
    for (int h = 0; h < MAXH; ++h)
      if (h < H) s_w[t * H + h] = wv[h];
    s_r[t] = r;
    for (int d0 = 0; d0 < De; d0 += kFoldCols) {
      const int cw = De - d0 < kFoldCols ? De - d0 : kFoldCols;
      __syncthreads();  // (s_w / s_r written; the previous columns consumed)
      {
        const int64_t rr = s_r[t];
        float* xs = s_x + t * kFoldCols;
        if (rr < a.n_in)
          for (int c = 0; c < cw; ++c) xs[c] = to_float(a.x[rr * De + d0 + c]);
        else
          for (int c = 0; c < cw; ++c) xs[c] = 0.f;
      }
      __syncthreads();
      const int n_out = H * cw;  // <= 16 * 16 = kEdgeThreads
      const int groups = kEdgeThreads / n_out, g = t / n_out, o = t % n_out;
      const int h = o / cw, c = o - h * cw;
      float sum = 0.f;
      if (g < groups)
        for (int e = g; e < kEdgeThreads; e += groups)
          sum = fmaf(s_w[e * H + h], s_x[e * kFoldCols + c], sum);
      s_part[t] = sum;
      __syncthreads();
      if (t < n_out) {
        float total = 0.f;
        for (int k = 0; k < groups; ++k) total += s_part[k * n_out + t];
        s_acc[h * De + d0 + c] += total;
      }
    }
  }
  if (partial == nullptr) return;
  __syncthreads();
  for (int i = t; i < HD; i += kEdgeThreads)
    partial[(int64_t)blockIdx.x * HD + i] = s_acc[i];
}

}  // namespace edge_rows
}  // namespace pyg_dfgnn

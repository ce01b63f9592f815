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
//           M_h into the user's row, w' kept in the user's order), then
//           weighted_row_sums_kernel (d M = w'^T x per block of rows; the
//           block partials are summed by the host entry).
// Each user row is read by at most one CSR edge, so d x needs no atomics:
// deterministic like the row kernel.
#pragma once

#include "edge_attr_common.cuh"

namespace pyg_dfgnn {
namespace edge_rows {

constexpr int kEdgeThreads = 256;
constexpr int kSumRows = 2048;        // weighted_row_sums: rows per block
constexpr int kSumTileFloats = 4096;  // its tile of w_user and x rows (16 KB)

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
// handed loop weight), d x[r] = sum_h w'_h M_h (scatter), w_user[r] = w'.
template <typename T, int MAXH>
__global__ void __launch_bounds__(kEdgeThreads)
    shared_grad_kernel(Args<T> a, const float* __restrict__ loop_w,
                       float* __restrict__ w_user) {
  __shared__ float s_m[kEdgeRowsMaxHD];
  __shared__ float s_w[kEdgeThreads * MAXH];
  load_shared_mat(a, s_m);
  const int H = a.H, De = a.De;
  const int64_t p0 = (int64_t)blockIdx.x * kEdgeThreads;
  const int64_t left = a.n_edges - p0;
  const int n = (int)(left < kEdgeThreads ? left : kEdgeThreads) * H;
  for (int i = threadIdx.x; i < n; i += kEdgeThreads)
    s_w[i] = to_float(a.w[p0 * H + i]);
  __syncthreads();
  const int64_t p = p0 + threadIdx.x;
  if (p >= a.n_edges) return;
  const int64_t r = a.index != nullptr ? a.index[p] : p;
  if (r >= a.n_in) return;  // the loop: handed to the others / fill row
  float wv[MAXH];
#pragma unroll
  for (int h = 0; h < MAXH; ++h)
    wv[h] = h < H ? s_w[threadIdx.x * H + h] : 0.f;
  if (loop_w != nullptr && a.fill != 3) {
    const float* lw = loop_w + row_of_edge(a.rowptr, a.n_rows, p) * H;
#pragma unroll
    for (int h = 0; h < MAXH; ++h)
      if (h < H) wv[h] += lw[h];
  }
  if (a.scatter != nullptr) edge_scatter(a, r, s_m, wv);
  if (w_user != nullptr) {
#pragma unroll
    for (int h = 0; h < MAXH; ++h)
      if (h < H) w_user[r * H + h] = wv[h];
  }
}

// partial[b, h, d] = sum over the user rows r of block b of
// w_user[r, h] x[r, d]. Tiles of rows move into shared memory with
// coalesced loads (a first version read them straight from global memory,
// 64 bytes per warp load: 0.90 ms for 4.5M rows); thread groups over the
// H * De outputs, each group a strided share of a tile's rows, the groups
// summed in order at the end (deterministic).
template <typename T>
__global__ void __launch_bounds__(kEdgeThreads)
    weighted_row_sums_kernel(Args<T> a, const float* __restrict__ w_user,
                             float* __restrict__ partial) {
  __shared__ float s_tile[kSumTileFloats];
  __shared__ float s_part[kEdgeThreads];
  const int H = a.H, De = a.De, HD = H * De;
  const int tile_rows = kSumTileFloats / (H + De);  // >= 7: H + De <= 528
  float* s_w = s_tile;
  float* s_x = s_tile + tile_rows * H;
  const bool grouped = HD <= kEdgeThreads;
  const int groups = grouped ? kEdgeThreads / HD : 1;
  const int g = grouped ? threadIdx.x / HD : 0;
  const int o0 = grouped ? threadIdx.x % HD : threadIdx.x;
  // (HD <= 512: at most two outputs per thread)
  const int h0 = o0 / De, d0 = o0 - h0 * De;
  const int o1 = o0 + kEdgeThreads, h1 = o1 / De, d1 = o1 - h1 * De;
  const bool active = g < groups && o0 < HD, two = !grouped && o1 < HD;
  float acc0 = 0.f, acc1 = 0.f;
  const int64_t r0 = (int64_t)blockIdx.x * kSumRows;
  const int64_t r1 = r0 + kSumRows < a.n_in ? r0 + kSumRows : a.n_in;
  for (int64_t t0 = r0; t0 < r1; t0 += tile_rows) {
    const int n = (int)(r1 - t0 < tile_rows ? r1 - t0 : tile_rows);
    __syncthreads();  // (the previous tile is consumed)
    for (int i = threadIdx.x; i < n * H; i += kEdgeThreads)
      s_w[i] = w_user[t0 * H + i];
    for (int i = threadIdx.x; i < n * De; i += kEdgeThreads)
      s_x[i] = to_float(a.x[t0 * De + i]);
    __syncthreads();
    if (active)
      for (int e = g; e < n; e += groups) {
        acc0 = fmaf(s_w[e * H + h0], s_x[e * De + d0], acc0);
        if (two) acc1 = fmaf(s_w[e * H + h1], s_x[e * De + d1], acc1);
      }
  }
  if (grouped) {  // (block-uniform)
    s_part[threadIdx.x] = acc0;
    __syncthreads();
    if (threadIdx.x < HD) {
      float sum = 0.f;
      for (int k = 0; k < groups; ++k) sum += s_part[k * HD + threadIdx.x];
      partial[(int64_t)blockIdx.x * HD + threadIdx.x] = sum;
    }
  } else {
    if (o0 < HD) partial[(int64_t)blockIdx.x * HD + o0] = acc0;
    if (two) partial[(int64_t)blockIdx.x * HD + o1] = acc1;
  }
}

}  // namespace edge_rows
}  // namespace pyg_dfgnn

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

template <typename T>
__device__ __forceinline__ void load_shared_mat(const Args<T>& a, float* m) {
  for (int i = threadIdx.x; i < a.H * a.De; i += blockDim.x)
    m[i] = to_float(a.m[i]);
}

// Whether shared_dots_kernel writes the loop dot of the row [lo, hi) itself:
// fill 1 / 2 (the sum of the row's other dots), the whole row inside one
// tile, and heads that divide a warp (a lane sums one head). The other
// rows' loops are loop_dots_kernel's.
template <typename T>
__device__ __forceinline__ bool loop_in_tile(const Args<T>& a, int64_t lo,
                                             int64_t hi) {
  return (a.fill == 1 || a.fill == 2) && kWarpSize % a.H == 0 && hi > lo &&
         lo / kEdgeThreads == (hi - 1) / kEdgeThreads;
}

// dots[p, :] = <M_h, x_p> for the non-loop edges; a loop's dot is written
// here for the rows loop_in_tile takes (a warp per loop, from the tile's
// dots in shared memory), else 0 and filled by loop_dots_kernel.
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
  bool loop = false;
  if (p < a.n_edges) {
    const int64_t r = a.index != nullptr ? a.index[p] : p;
    loop = r >= a.n_in;
    if (!loop) edge_dots(a, r, s_m, acc);
  }
#pragma unroll
  for (int h = 0; h < MAXH; ++h)
    if (h < H) s_out[threadIdx.x * H + h] = acc[h];
  __syncthreads();
  if ((a.fill == 1 || a.fill == 2) && kWarpSize % H == 0) {
    // lanes over the row's (edge, head) entries: lane l always meets head
    // l % H; lanes of one head summed by shuffles
    const int lane = threadIdx.x % kWarpSize;
    const int w0 = threadIdx.x - lane;
    unsigned loops = __ballot_sync(kFullMask, loop);
    while (loops != 0) {  // (warp-uniform)
      const int src = __ffs(loops) - 1;
      loops &= loops - 1;
      const int64_t lp = p0 + w0 + src;
      const int64_t row = a.edge_row[lp];
      const int64_t lo = a.rowptr[row], hi = a.rowptr[row + 1];
      if (!loop_in_tile(a, lo, hi)) continue;
      const int n = (int)(hi - lo) * H;
      const float* rs = s_out + (lo - p0) * H;
      float sum = 0.f;
      for (int i = lane; i < n; i += kWarpSize) sum += rs[i];
      for (int o = H; o < kWarpSize; o <<= 1)
        sum += __shfl_xor_sync(kFullMask, sum, o);
      if (lane < H)
        s_out[(lp - p0) * H + lane] = sum * loop_share(a.fill, hi - lo - 1);
    }
    __syncthreads();
  }
  const int64_t left = a.n_edges - p0;
  const int n = (int)(left < kEdgeThreads ? left : kEdgeThreads) * H;
  for (int i = threadIdx.x; i < n; i += kEdgeThreads)
    a.dots[p0 * H + i] = from_float<T>(s_out[i]);
}

// The loops' dots shared_dots_kernel left (rows across tiles, fill 3):
// warp per row. The row's sum takes every entry (shared_dots_kernel left
// the loop's at 0), so the dots' loads do not wait for the loop's position.
template <typename T, int MAXH>
__global__ void __launch_bounds__(kThreads) loop_dots_kernel(Args<T> a) {
  const int warp = threadIdx.x / kWarpSize, lane = threadIdx.x % kWarpSize;
  const int64_t row = (int64_t)blockIdx.x * kWarps + warp;
  if (row >= a.n_rows) return;
  const int H = a.H, De = a.De;
  const int64_t lo = a.rowptr[row], hi = a.rowptr[row + 1];
  const int64_t loop_p = row_loop(a, row);
  if (loop_p < 0 || loop_in_tile(a, lo, hi)) return;  // (the latter: done)
  if (a.fill == 3) {
    for (int h = lane; h < H; h += kWarpSize) {
      float s = 0.f;
      for (int d = 0; d < De; ++d)
        s = fmaf(to_float(a.m[h * De + d]), to_float(a.fill_row[d]), s);
      a.dots[loop_p * H + h] = from_float<T>(s);
    }
    return;
  }
  const float share = loop_share(a.fill, hi - lo - 1);
  float acc[MAXH];
#pragma unroll
  for (int h = 0; h < MAXH; ++h) acc[h] = 0.f;
  for (int64_t p = lo + lane; p < hi; p += kWarpSize) {
    if (H % 4 == 0) {  // (dots: this op's allocation, rows 4-aligned)
#pragma unroll
      for (int h = 0; h < MAXH; h += 4)
        if (h < H) {
          float v[4];
          load_vec<T, 4>(a.dots + p * H + h, v);
#pragma unroll
          for (int i = 0; i < 4; ++i) acc[h + i] += v[i];
        }
    } else {
#pragma unroll
      for (int h = 0; h < MAXH; ++h)
        if (h < H) acc[h] += to_float(a.dots[p * H + h]);
    }
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
// without a loop. Thread per row; out [rows, H].
template <typename T>
__global__ void __launch_bounds__(kThreads)
    loop_weights_kernel(Args<T> a, float* __restrict__ out) {
  const int64_t row = (int64_t)blockIdx.x * kThreads + threadIdx.x;
  if (row >= a.n_rows) return;
  const int64_t loop_p = row_loop(a, row);
  const float share =
      loop_share(a.fill, a.rowptr[row + 1] - a.rowptr[row] - 1);
  for (int h = 0; h < a.H; ++h)
    out[row * a.H + h] =
        loop_p < 0 ? 0.f : to_float(a.w[loop_p * a.H + h]) * share;
}

// For each non-loop edge p reading user row r: w' = w[p] (+ its row's
// handed loop weight), d x[r] = sum_h w'_h M_h and, with `partial`,
// d M = sum_p w'_p x_p^T. Lanes over x's columns: a group of L lanes takes
// an edge, lane l the VW-vectors l + L c of one column block (L the power
// of two >= the block's vectors, at most 32); the lane keeps its d M cells
// (every head of its columns) in registers and reads the edge's w' itself
// (one address per group: a broadcast); M from shared memory (lanes of a
// warp read a few distinct vectors). No barrier in the edge loop, two edges
// per lane in flight. Persistent blocks; each leaves one d M partial row
// (summed on the host: deterministic). d x sums the heads in the order of
// row_scatter (the same bits). (Sessions 12-16 staged a tile's w' and x
// rows in shared memory under four barriers per tile: 0.39 ms on gat-edge,
// the L1 / shared pipe 85% busy; one column per lane: 1.24 ms, too few
// edges in flight.)
//
// Columns per lane: kGradCols<MAXH> (its d M cells: MAXH times that).
template <int MAXH>
inline constexpr int kGradCols = 32 / MAXH;
// Elements per vector access of an x row (VW > 1: De % kVW == 0).
template <int MAXH>
inline constexpr int kGradVW = kGradCols<MAXH> < kVW ? kGradCols<MAXH> : kVW;

// The group's lanes and column blocks.
struct GradShape {
  int lanes, blocks;
};
template <int MAXH>
inline GradShape grad_shape(int De, bool vec) {
  const int vw = vec ? kGradVW<MAXH> : 1;
  const int vectors = (De + vw - 1) / vw;
  const int per_lane = kGradCols<MAXH> / vw;  // vectors per lane
  int lanes = 1;
  while (lanes * per_lane < vectors && lanes < kWarpSize) lanes <<= 1;
  const int span = lanes * per_lane;
  return {lanes, (vectors + span - 1) / span};
}

// Resident blocks per SM (the host launches that many persistent blocks per
// SM): registers for two edges' w' and x and the lane's d M cells.
template <int MAXH>
inline constexpr int kGradBlocksPerSM = 2;

// w[p, :H] (+ the row's handed loop weight) as floats, 0 past H; `vec`:
// rows of 4-aligned H in 4-wide loads (w this op's input made contiguous,
// loop_w this op's allocation).
template <typename T, int MAXH>
__device__ __forceinline__ void edge_weights(const T* w, const float* lw,
                                             int H, bool vec,
                                             float (&wv)[MAXH]) {
  if (vec) {
#pragma unroll
    for (int h = 0; h < MAXH; h += 4)
      if (h < H) {
        float v[4];
        load_vec<T, 4>(w + h, v);
#pragma unroll
        for (int i = 0; i < 4; ++i) wv[h + i] = v[i];
        if (lw != nullptr) {
          load_vec<float, 4>(lw + h, v);
#pragma unroll
          for (int i = 0; i < 4; ++i) wv[h + i] += v[i];
        }
      }
  } else {
#pragma unroll
    for (int h = 0; h < MAXH; ++h)
      if (h < H) wv[h] = to_float(w[h]) + (lw != nullptr ? lw[h] : 0.f);
  }
}

template <typename T, int MAXH, int VW>
__device__ __forceinline__ void shared_grad_lanes(
    const Args<T>& a, const float* __restrict__ loop_w,
    float* __restrict__ partial, GradShape shape, bool wvec,
    const float* s_m, float (*s_sum)[kEdgeRowsMaxHD]) {
  constexpr int C = kGradCols<MAXH> / VW;  // vectors per lane
  constexpr int kBlockWarps = kEdgeThreads / kWarpSize;
  const int H = a.H, De = a.De, L = shape.lanes;
  const int lane = threadIdx.x % kWarpSize, warp = threadIdx.x / kWarpSize;
  const int sub = lane & (L - 1);
  // groups: (edge stream, column block) pairs; a lane's first columns
  const int64_t group = (int64_t)blockIdx.x * (kEdgeThreads / L) +
                        threadIdx.x / L;
  const int cb = (int)(group % shape.blocks);
  const int64_t stream0 = group / shape.blocks;
  const int64_t streams =
      (int64_t)gridDim.x * (kEdgeThreads / L) / shape.blocks;
  int col[C];
  float acc[MAXH][C][VW];
#pragma unroll
  for (int c = 0; c < C; ++c) {
    col[c] = (cb * L * C + c * L + sub) * VW;
#pragma unroll
    for (int h = 0; h < MAXH; ++h)
#pragma unroll
      for (int i = 0; i < VW; ++i) acc[h][c][i] = 0.f;
  }
  // (groups past the last whole stream idle)
  for (int64_t p0 = stream0 < streams ? stream0 : a.n_edges; p0 < a.n_edges;
       p0 += 2 * streams) {
    int64_t r[2];
    bool own[2];
    float wv[2][MAXH], xv[2][C][VW];
#pragma unroll
    for (int u = 0; u < 2; ++u) {
      const int64_t p = p0 + u * streams;
      r[u] = p < a.n_edges ? (a.index != nullptr ? a.index[p] : p) : a.n_in;
      own[u] = r[u] < a.n_in;
#pragma unroll
      for (int h = 0; h < MAXH; ++h) wv[u][h] = 0.f;
#pragma unroll
      for (int c = 0; c < C; ++c)
#pragma unroll
        for (int i = 0; i < VW; ++i) xv[u][c][i] = 0.f;
      if (own[u]) {
        const float* lw = loop_w != nullptr
                              ? loop_w + (int64_t)a.edge_row[p] * H
                              : nullptr;
        edge_weights<T, MAXH>(a.w + p * H, lw, H, wvec, wv[u]);
        if (partial != nullptr)
#pragma unroll
          for (int c = 0; c < C; ++c)
            if (col[c] < De) load_vec<T, VW>(a.x + r[u] * De + col[c], xv[u][c]);
      }
    }
#pragma unroll
    for (int u = 0; u < 2; ++u) {
      if (partial != nullptr)
#pragma unroll
        for (int h = 0; h < MAXH; ++h)
#pragma unroll
          for (int c = 0; c < C; ++c)
#pragma unroll
            for (int i = 0; i < VW; ++i)
              acc[h][c][i] = fmaf(wv[u][h], xv[u][c][i], acc[h][c][i]);
      if (!own[u] || a.scatter == nullptr) continue;
#pragma unroll
      for (int c = 0; c < C; ++c) {
        if (col[c] >= De) continue;
        float g[VW];
#pragma unroll
        for (int i = 0; i < VW; ++i) g[i] = 0.f;
#pragma unroll
        for (int h = 0; h < MAXH; ++h)
          if (h < H) {
            float mv[VW];
            load_smem<VW>(s_m + h * De + col[c], mv);
#pragma unroll
            for (int i = 0; i < VW; ++i) g[i] = fmaf(wv[u][h], mv[i], g[i]);
          }
        store_vec<T, VW>(a.scatter + r[u] * De + col[c], g);
      }
    }
  }
  if (partial == nullptr) return;
  // lanes of one column (the warp's groups) summed, then the warps' rows
  const int HD = H * De;
  for (int o = lane; o < HD; o += kWarpSize) s_sum[warp][o] = 0.f;
  __syncwarp();
#pragma unroll
  for (int h = 0; h < MAXH; ++h)
#pragma unroll
    for (int c = 0; c < C; ++c)
#pragma unroll
      for (int i = 0; i < VW; ++i) {
        float v = acc[h][c][i];
        for (int o = L; o < kWarpSize; o <<= 1)
          v += __shfl_xor_sync(kFullMask, v, o);
        // (L < 32: one column block, the warp's groups hold the same cells)
        if (lane < L && h < H && col[c] < De)
          s_sum[warp][h * De + col[c] + i] = v;
      }
  __syncthreads();
  for (int o = threadIdx.x; o < HD; o += kEdgeThreads) {
    float total = 0.f;
#pragma unroll
    for (int k = 0; k < kBlockWarps; ++k) total += s_sum[k][o];
    partial[(int64_t)blockIdx.x * HD + o] = total;
  }
}

template <typename T, int MAXH>
__global__ void __launch_bounds__(kEdgeThreads, kGradBlocksPerSM<MAXH>)
    shared_grad_kernel(Args<T> a, const float* __restrict__ loop_w,
                       float* __restrict__ partial, GradShape shape,
                       bool wvec) {
  __shared__ __align__(16) float s_m[kEdgeRowsMaxHD];
  __shared__ float s_sum[kEdgeThreads / kWarpSize][kEdgeRowsMaxHD];
  load_shared_mat(a, s_m);
  __syncthreads();
  if (a.vec)
    shared_grad_lanes<T, MAXH, kGradVW<MAXH>>(a, loop_w, partial, shape,
                                              wvec, s_m, s_sum);
  else
    shared_grad_lanes<T, MAXH, 1>(a, loop_w, partial, shape, wvec, s_m,
                                  s_sum);
}

}  // namespace edge_rows
}  // namespace pyg_dfgnn

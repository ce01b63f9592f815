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
// handed loop weight), d x[r] = sum_h w'_h M_h (scatter) and, with
// `partial`, d M = sum_p w'_p x_p^T. Tiles of te = min(256, 4096 / De)
// edges: the tile's w' and x rows are staged in shared memory (coalesced
// loads of whole rows), d x is formed from them with threads over (edge,
// VW columns), and each thread keeps its d M cells -- one head by VW
// columns, summed over every tile the block takes -- in registers; the
// blocks' partials leave once (summed on the host: deterministic). An
// edge's handed loop weight is found through the map's edge_row, loaded
// with the tile's index: no search. Shared rows move VW floats per access
// (session 15: 0.42 -> 0.41 ms on gat-edge; ncu's busy L1 / shared pipe is
// not these loads). Persistent blocks. (Session 12's first fold summed each tile's products
// through shared memory under seven barriers per tile: 0.74 ms on
// gat-edge, against ~0.25 for its traffic.)
constexpr int kGradTileFloats = 4096;  // s_w and s_x: floats each

// Edges per shared_grad tile: the tile's x rows fit s_x.
__host__ __device__ inline int grad_tile_edges(int De) {
  return De >= kGradTileFloats / kEdgeThreads ? kGradTileFloats / De
                                              : kEdgeThreads;
}

// The d M cell thread t sums in its slot k, -1 for none: t % cells with
// fewer cells than threads (groups of threads share a cell), else t and
// t + 256.
__device__ __forceinline__ int grad_cell(int t, int k, int cells) {
  const int cell =
      (t % (cells < kEdgeThreads ? cells : kEdgeThreads)) + k * kEdgeThreads;
  return cell >= cells || (k > 0 && cells < kEdgeThreads) ? -1 : cell;
}

template <typename T, int MAXH, int VW>
__device__ __forceinline__ void shared_grad_tiles(
    const Args<T>& a, const float* __restrict__ loop_w,
    float* __restrict__ partial,
    const float* s_m, float* s_w, float* s_x, int64_t* s_r) {
  const int H = a.H, De = a.De, HD = H * De, t = threadIdx.x;
  const int te = grad_tile_edges(De);
  const int qs = De / VW;       // VW-column groups per row
  const int cells = H * qs;     // d M cells (one head x VW columns)
  const int groups = cells >= kEdgeThreads ? 1 : kEdgeThreads / cells;
  const int g = t / cells;      // (cells >= 256: 0)
  constexpr int kSlots = kEdgeRowsMaxHD / kEdgeThreads;  // cells per thread
  float acc[kSlots][VW];
#pragma unroll
  for (int k = 0; k < kSlots; ++k)
#pragma unroll
    for (int c = 0; c < VW; ++c) acc[k][c] = 0.f;
  // f(slot k, cell) for each d M cell of this thread
  auto for_cells = [&](auto&& f) {
    if (g >= groups) return;
#pragma unroll
    for (int k = 0; k < kSlots; ++k) {
      const int cell = grad_cell(t, k, cells);
      if (cell < 0) break;
      f(k, cell);
    }
  };
  const int64_t tiles = (a.n_edges + te - 1) / te;
  for (int64_t tile = blockIdx.x; tile < tiles; tile += gridDim.x) {
    const int64_t p0 = tile * te;
    const int n = (int)(a.n_edges - p0 < te ? a.n_edges - p0 : te);
    __syncthreads();  // (the previous tile is consumed)
    // edge t's user row and its row's handed loop weight (registers, read
    // back after the barrier: no load waits behind one)
    float lw[MAXH];
#pragma unroll
    for (int h = 0; h < MAXH; ++h) lw[h] = 0.f;
    bool own = false;
    if (t < te) {
      const int64_t p = p0 + t;
      const int64_t r = t < n ? (a.index != nullptr ? a.index[p] : p) : a.n_in;
      s_r[t] = r;
      own = r < a.n_in;
      if (own && loop_w != nullptr) {
        const float* lr = loop_w + (int64_t)a.edge_row[p] * H;
#pragma unroll
        for (int h = 0; h < MAXH; ++h)
          if (h < H) lw[h] = lr[h];
      }
    }
    for (int i = t; i < n * H; i += kEdgeThreads)
      s_w[i] = to_float(a.w[p0 * H + i]);
    __syncthreads();
    if (t < te) {  // w' of edge t: 0 for loops and past the tile
#pragma unroll
      for (int h = 0; h < MAXH; ++h)
        if (h < H) s_w[t * H + h] = own ? s_w[t * H + h] + lw[h] : 0.f;
    }
    __syncthreads();
    for (int i = t; i < te * qs; i += kEdgeThreads) {
      const int e = i / qs, c0 = (i - e * qs) * VW;
      const int64_t r = s_r[e];
      const bool own = r < a.n_in;
      if (own && a.scatter != nullptr) {  // d x[r, c0:c0+VW]
        float gx[VW];
#pragma unroll
        for (int c = 0; c < VW; ++c) gx[c] = 0.f;
#pragma unroll
        for (int h = 0; h < MAXH; ++h)
          if (h < H) {
            const float wh = s_w[e * H + h];
            float mv[VW];
            load_smem<VW>(s_m + h * De + c0, mv);
#pragma unroll
            for (int c = 0; c < VW; ++c) gx[c] = fmaf(wh, mv[c], gx[c]);
          }
        store_vec<T, VW>(a.scatter + r * De + c0, gx);
      }
      if (partial != nullptr) {
        float xv[VW];
        if (own) {
          load_vec<T, VW>(a.x + r * De + c0, xv);
        } else {
#pragma unroll
          for (int c = 0; c < VW; ++c) xv[c] = 0.f;
        }
        store_smem<VW>(s_x + e * De + c0, xv);
      }
    }
    if (partial == nullptr) continue;  // (block-uniform)
    __syncthreads();
    for_cells([&](int k, int cell) {
      const int h = cell / qs, c0 = (cell - h * qs) * VW;
      for (int e = g; e < te; e += groups) {
        const float wh = s_w[e * H + h];
        float xv[VW];
        load_smem<VW>(s_x + e * De + c0, xv);
#pragma unroll
        for (int c = 0; c < VW; ++c) acc[k][c] = fmaf(wh, xv[c], acc[k][c]);
      }
    });
  }
  if (partial == nullptr) return;
  // the groups' sums: [groups, HD] through s_x, then one row per block
  __syncthreads();
  for_cells([&](int k, int cell) {
#pragma unroll
    for (int c = 0; c < VW; ++c) s_x[g * HD + cell * VW + c] = acc[k][c];
  });
  __syncthreads();
  for (int o = t; o < HD; o += kEdgeThreads) {
    float total = 0.f;
    for (int k = 0; k < groups; ++k) total += s_x[k * HD + o];
    partial[(int64_t)blockIdx.x * HD + o] = total;
  }
}

// Resident shared_grad blocks per SM; the host launches that many
// persistent blocks per SM. Up to 8 heads, 5 (48 registers, no spill; it
// was 4 at 64 registers); 16 heads keep 4 (5 spilled 164 bytes).
template <int MAXH>
inline constexpr int kGradBlocksPerSM = MAXH <= 8 ? 5 : 4;

template <typename T, int MAXH>
__global__ void __launch_bounds__(kEdgeThreads, kGradBlocksPerSM<MAXH>)
    shared_grad_kernel(Args<T> a, const float* __restrict__ loop_w,
                       float* __restrict__ partial) {
  __shared__ __align__(16) float s_m[kEdgeRowsMaxHD];
  __shared__ __align__(16) float s_w[kGradTileFloats];
  __shared__ __align__(16) float s_x[kGradTileFloats];
  __shared__ int64_t s_r[kEdgeThreads];
  load_shared_mat(a, s_m);
  // (the first tile's barrier orders s_m before its use)
  if (a.vec)
    shared_grad_tiles<T, MAXH, kVW>(a, loop_w, partial, s_m, s_w,
                                    s_x, s_r);
  else
    shared_grad_tiles<T, MAXH, 1>(a, loop_w, partial, s_m, s_w,
                                  s_x, s_r);
}

}  // namespace edge_rows
}  // namespace pyg_dfgnn

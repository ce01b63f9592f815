// GATv2's edge term lin_edge(e_ij) for the fused attention: the edge keys
// K_p = W x_p [E, H * F] in CSR order, projected from the user's edge_attr
// read through the CSR edge -> attribute row map (edge_attr_rows.cu's:
// index[p] >= n_in marks a row's self-loop, whose x is the mean (fill 1) or
// sum (fill 2) of the row's other x, or fill_row (fill 3)), and the
// backward: d x (user order) and d W. It replaces a reordered [E, De] copy
// (two row scatters), the loops' sparse product and three [E, H * F] GEMMs
// (lin_edge forward, d x, d W: each a full pass over the [E, H * F] tensor).
//
// One warp per row, lanes over the outputs (kCols columns each, a pass of
// kSlot columns at a time), the lane's slice of W in registers: an edge is
// De FMAs per column. A chunk of the row's edges has its x rows staged in
// shared memory first (lanes over edges: all of the chunk's loads in
// flight), then read back as broadcasts. Loops by linearity: the mean /
// sum of the row's other outputs, W fill_row for a constant; the backward
// hands a loop's gradient to the row's other edges (share), so no loop row
// is ever formed. The backward's lanes each hold a block of columns x 4
// k's (W and d W in registers); an edge's d x is their sum over the column
// blocks (a transposing reduction, 4 - 6 shuffles), its d W per-warp
// partials summed afterwards: no atomics, deterministic. fp32 backwards of
// tensor-core shapes take project_bwd_tc_kernel instead (below).
#include <ATen/ATen.h>
#include <ATen/cuda/CUDAContext.h>
#include <c10/cuda/CUDAGuard.h>

#include <cstdlib>
#include <initializer_list>

#include "dispatch.cuh"
#include "edge_attr_common.cuh"
#include "mma_tiles.cuh"
#include "numeric.cuh"
#include "ops.h"
#include "vector_io.cuh"

namespace pyg_dfgnn {
namespace edge_project {

constexpr int kWarps = 8;
constexpr int kThreads = kWarps * kWarpSize;
constexpr int kCols = 4;                   // output columns per lane
constexpr int kSlot = kWarpSize * kCols;   // columns per warp pass
constexpr int kChunk = kWarpSize;          // edges staged at a time

template <typename T>
struct Args {
  const int64_t* __restrict__ rowptr;
  const int64_t* __restrict__ index;     // nullptr: identity
  const T* __restrict__ x;               // [n_in, De]
  const T* __restrict__ fill_row;        // [De] (fill 3)
  const T* __restrict__ w;               // [HF, De]
  const T* __restrict__ grad;            // [E, HF] (backward)
  T* __restrict__ out;                   // [E, HF] (forward)
  T* __restrict__ grad_x;                // [n_in, De] (backward)
  float* __restrict__ grad_w;            // [warps, HF, De] (backward)
  const int64_t* __restrict__ loop_pos;  // [rows] (fill != 0)
  int64_t n_rows, n_in;
  int HF, De, fill;
  bool vec;  // x rows in 16-byte vectors (De % 4 == 0, aligned base)
};

template <int N>
constexpr int log2_of() {
  return N <= 1 ? 0 : 1 + log2_of<N / 2>();
}

// This lane's slice of W: columns c0 .. c0 + kCols - 1, De entries each
// (zeros past De or HF).
template <typename T, int DE>
__device__ __forceinline__ void load_w(const Args<T>& a, int c0,
                                       float (&wv)[DE][kCols]) {
#pragma unroll
  for (int i = 0; i < kCols; ++i)
#pragma unroll
    for (int k = 0; k < DE; ++k)
      wv[k][i] = c0 + i < a.HF && k < a.De
                     ? to_float(a.w[(int64_t)(c0 + i) * a.De + k])
                     : 0.f;
}

// The x rows of edges cb .. cb + n - 1 into the warp's s_x [kChunk][DE]
// (lane e stages edge e; loops and lanes past n stage nothing); returns
// this lane's edge's attribute row (>= n_in: a loop or none).
template <typename T, int DE>
__device__ __forceinline__ int64_t stage_chunk(const Args<T>& a, int64_t cb,
                                               int n, int lane,
                                               float (*s_x)[DE]) {
  const int64_t p = cb + lane;
  const int64_t r =
      lane < n ? (a.index != nullptr ? a.index[p] : p) : a.n_in;
  if (r < a.n_in) {
    const T* xr = a.x + r * a.De;
    if (a.vec) {
#pragma unroll
      for (int k = 0; k < DE; k += 4) {
        float t[4] = {0.f, 0.f, 0.f, 0.f};
        if (k < a.De) load_vec<T, 4>(xr + k, t);
        store_smem<4>(&s_x[lane][k], t);
      }
    } else {
#pragma unroll
      for (int k = 0; k < DE; ++k)
        s_x[lane][k] = k < a.De ? to_float(xr[k]) : 0.f;
    }
  }
  __syncwarp();
  return r;
}

template <typename T, int DE>
__device__ __forceinline__ void load_x(const float* row, float (&xv)[DE]) {
#pragma unroll
  for (int k = 0; k < DE; k += 4) {
    float t[4];
    load_smem<4>(row + k, t);
#pragma unroll
    for (int i = 0; i < 4; ++i) xv[k + i] = t[i];
  }
}

// fill 3's row into the block's s_fill (zeros past De or without it).
template <typename T, int DE>
__device__ __forceinline__ void stage_fill_row(const Args<T>& a,
                                               float* s_fill) {
  if (threadIdx.x < DE)
    s_fill[threadIdx.x] = a.fill == 3 && (int)threadIdx.x < a.De
                              ? to_float(a.fill_row[threadIdx.x])
                              : 0.f;
  __syncthreads();
}

template <typename T, int DE>
__global__ void __launch_bounds__(kThreads)
    project_fwd_kernel(Args<T> a) {
  static_assert(DE % 4 == 0, "DE: a multiple of 4");
  __shared__ __align__(16) float s_x[kWarps][kChunk][DE];
  __shared__ float s_fill[DE];
  stage_fill_row<T, DE>(a, s_fill);
  const int warp = threadIdx.x / kWarpSize, lane = threadIdx.x % kWarpSize;
  const int64_t warps = (int64_t)gridDim.x * kWarps;
  for (int c_base = 0; c_base < a.HF; c_base += kSlot) {
    const int c0 = c_base + lane * kCols;
    const bool on = c0 < a.HF;
    float wv[DE][kCols];
    load_w<T, DE>(a, c0, wv);
    for (int64_t row = (int64_t)blockIdx.x * kWarps + warp; row < a.n_rows;
         row += warps) {
      const int64_t lo = a.rowptr[row], hi = a.rowptr[row + 1];
      const int64_t loop_p = a.fill != 0 ? a.loop_pos[row] : -1;
      float acc[kCols] = {0.f, 0.f, 0.f, 0.f};
      for (int64_t cb = lo; cb < hi; cb += kChunk) {
        const int n = (int)(hi - cb < kChunk ? hi - cb : kChunk);
        __syncwarp();  // the previous chunk's reads are done
        const int64_t my_r = stage_chunk<T, DE>(a, cb, n, lane, s_x[warp]);
        for (int e = 0; e < n; ++e) {
          const int64_t r = __shfl_sync(kFullMask, (long long)my_r, e);
          if (r >= a.n_in) continue;  // the loop: after the others
          float xv[DE];
          load_x<T, DE>(s_x[warp][e], xv);
          float o[kCols] = {0.f, 0.f, 0.f, 0.f};
#pragma unroll
          for (int k = 0; k < DE; ++k)
#pragma unroll
            for (int i = 0; i < kCols; ++i) o[i] = fmaf(wv[k][i], xv[k], o[i]);
          if (on) store_vec<T, kCols>(a.out + (cb + e) * a.HF + c0, o);
#pragma unroll
          for (int i = 0; i < kCols; ++i) acc[i] += o[i];
        }
      }
      if (loop_p >= 0 && on) {
        float o[kCols];
        if (a.fill == 3) {
#pragma unroll
          for (int i = 0; i < kCols; ++i) {
            o[i] = 0.f;
#pragma unroll
            for (int k = 0; k < DE; ++k) o[i] = fmaf(wv[k][i], s_fill[k], o[i]);
          }
        } else {
          const float share = edge_rows::loop_share(a.fill, hi - lo - 1);
#pragma unroll
          for (int i = 0; i < kCols; ++i) o[i] = acc[i] * share;
        }
        store_vec<T, kCols>(a.out + loop_p * a.HF + c0, o);
      }
    }
  }
}

// p ? a : b on the bits (one LOP3): a conditional between two elements of
// a register array otherwise becomes an indexed local-memory access.
__device__ __forceinline__ float select(int mask, float a, float b) {
  return __int_as_float((__float_as_int(a) & mask) |
                        (__float_as_int(b) & ~mask));
}

// The backward's lanes: KG = DE / 4 groups of 4 k's, CG = 32 / KG column
// groups of CPL = kSlot / CG columns; lane = cg * KG + kg. A lane's d x
// part is 4 values (its k's) summed over its CPL columns, then over the CG
// lanes of its k group: 1 + log2(CG) shuffles per edge (4 at De 16)
// instead of one per k and lane.
template <int DE>
struct BwdLanes {
  static constexpr int KG = DE / 4, CG = kWarpSize / KG, CPL = kSlot / CG;
  static constexpr int kLogKG = log2_of<KG>();
};

// d[0..3] of this lane summed over its k group's CG lanes, transposed:
// the lane ends with k = 4 kg + 2 bit4 + bit3 (the lanes with bits
// kLogKG .. 2 clear write it).
template <int DE>
__device__ __forceinline__ float group_transpose_sum(float (&d)[4],
                                                     int lane) {
  using L = BwdLanes<DE>;
  const int up16 = -((lane >> 4) & 1), up8 = -((lane >> 3) & 1);
#pragma unroll
  for (int i = 0; i < 2; ++i) {  // m = 16: keep the half of bit 4
    const float send = select(up16, d[i], d[i + 2]);
    const float keep = select(up16, d[i + 2], d[i]);
    d[i] = keep + __shfl_xor_sync(kFullMask, send, 16);
  }
  const float send = select(up8, d[0], d[1]);
  const float keep = select(up8, d[1], d[0]);
  float s = keep + __shfl_xor_sync(kFullMask, send, 8);
#pragma unroll
  for (int m = 4; m >= L::KG; m >>= 1) s += __shfl_xor_sync(kFullMask, s, m);
  return s;
}

// The 128-byte line at p into L2 ahead of its use (no register holds it).
__device__ __forceinline__ void prefetch_l2(const void* p) {
  asm volatile("prefetch.global.L2 [%0];" ::"l"(p));
}

// (one block per SM: the W slice and the d W cells in registers; the
// gradient rows prefetched kAhead edges ahead into L2, as registers for
// more loads in flight are not left)
constexpr int kAhead = 8;
template <typename T, int DE>
__global__ void __launch_bounds__(kThreads, 1)
    project_bwd_kernel(Args<T> a) {
  static_assert(DE % 4 == 0, "DE: a multiple of 4");
  using L = BwdLanes<DE>;
  constexpr int CPL = L::CPL, NV = CPL / 4;  // columns, 4-vectors per lane
  __shared__ __align__(16) float s_x[kWarps][kChunk][DE];
  __shared__ float s_fill[DE];
  stage_fill_row<T, DE>(a, s_fill);
  const int warp = threadIdx.x / kWarpSize, lane = threadIdx.x % kWarpSize;
  const int64_t gwarp = (int64_t)blockIdx.x * kWarps + warp;
  const int64_t warps = (int64_t)gridDim.x * kWarps;
  const int kg = lane % L::KG, cg = lane / L::KG, k0 = kg * 4;
  // the k of this lane's transposed d x, and whether it writes it
  const int my_k = k0 + 2 * ((lane >> 4) & 1) + ((lane >> 3) & 1);
  const bool writer =
      ((lane >> L::kLogKG) & ((8 / L::KG) - 1)) == 0 && my_k < a.De;
  for (int c_base = 0; c_base < a.HF; c_base += kSlot) {
    const int c0 = c_base + cg * CPL;
    float wv[CPL][4], dw[CPL][4];
#pragma unroll
    for (int j = 0; j < CPL; ++j)
#pragma unroll
      for (int i = 0; i < 4; ++i) {
        wv[j][i] = c0 + j < a.HF && k0 + i < a.De
                       ? to_float(a.w[(int64_t)(c0 + j) * a.De + k0 + i])
                       : 0.f;
        dw[j][i] = 0.f;
      }
    // this lane's columns of an edge's gradient row (zeros past HF)
    auto load_g = [&](int64_t p, float (&g)[CPL]) {
#pragma unroll
      for (int v = 0; v < NV; ++v) {
        float t[4] = {0.f, 0.f, 0.f, 0.f};
        if (c0 + 4 * v < a.HF)
          load_vec<T, 4>(a.grad + p * a.HF + c0 + 4 * v, t);
#pragma unroll
        for (int i = 0; i < 4; ++i) g[4 * v + i] = t[i];
      }
    };
    for (int64_t row = gwarp; row < a.n_rows; row += warps) {
      const int64_t lo = a.rowptr[row], hi = a.rowptr[row + 1];
      const int64_t loop_p = a.fill != 0 ? a.loop_pos[row] : -1;
      // The loop's gradient h: fill 1 / 2 hand share * h to each other
      // edge: W^T h added to every d x_p (dh, formed once) and
      // h (x) sum_p x_p to d W (xs, at the row's end).
      const bool handed = loop_p >= 0 && (a.fill == 1 || a.fill == 2);
      const float share = edge_rows::loop_share(a.fill, hi - lo - 1);
      float dh = 0.f;
      if (handed) {
        float h[CPL];
        load_g(loop_p, h);
        float d[4];
#pragma unroll
        for (int i = 0; i < 4; ++i) {
          d[i] = 0.f;
#pragma unroll
          for (int j = 0; j < CPL; ++j) d[i] = fmaf(wv[j][i], h[j], d[i]);
        }
        dh = group_transpose_sum<DE>(d, lane) * share;
      }
      float xs[4] = {0.f, 0.f, 0.f, 0.f};
      // the pass's columns of a gradient row: kLines 128-byte lines
      // (only lines inside the row: a prefetch past the tensor is no
      // load the sanitizer would let pass)
      const int kLines = (kSlot * (int)sizeof(T) + 127) / 128;
      const int kLineElems = 128 / (int)sizeof(T);
      const T* g_pass = a.grad + c_base;
      if (lane < kAhead * kLines && lo + lane / kLines < hi &&
          c_base + (lane % kLines) * kLineElems < a.HF)
        prefetch_l2(g_pass + (lo + lane / kLines) * a.HF +
                    (lane % kLines) * kLineElems);
      for (int64_t cb = lo; cb < hi; cb += kChunk) {
        const int n = (int)(hi - cb < kChunk ? hi - cb : kChunk);
        __syncwarp();
        const int64_t my_r = stage_chunk<T, DE>(a, cb, n, lane, s_x[warp]);
        // the next edge's gradient loaded while this one is worked on
        float g_next[CPL];
        load_g(cb, g_next);
        for (int e = 0; e < n; ++e) {
          float g[CPL];
#pragma unroll
          for (int j = 0; j < CPL; ++j) g[j] = g_next[j];
          if (e + 1 < n) load_g(cb + e + 1, g_next);
          if (lane < kLines && cb + e + kAhead < hi &&
              c_base + lane * kLineElems < a.HF)
            prefetch_l2(g_pass + (cb + e + kAhead) * a.HF +
                        lane * kLineElems);
          const int64_t r = __shfl_sync(kFullMask, (long long)my_r, e);
          if (r >= a.n_in) continue;  // the loop (handed above)
          float x4[4];
          load_smem<4>(&s_x[warp][e][k0], x4);
          float d[4];
#pragma unroll
          for (int i = 0; i < 4; ++i) {
            d[i] = 0.f;
            xs[i] += x4[i];
#pragma unroll
            for (int j = 0; j < CPL; ++j) {
              dw[j][i] = fmaf(g[j], x4[i], dw[j][i]);
              d[i] = fmaf(wv[j][i], g[j], d[i]);
            }
          }
          const float dx = group_transpose_sum<DE>(d, lane) + dh;
          if (writer) {
            T* gx = a.grad_x + r * a.De + my_k;
            *gx = from_float<T>(c_base == 0 ? dx : to_float(*gx) + dx);
          }
        }
      }
      if (loop_p >= 0 && (handed || a.fill == 3)) {
        // d W of the loop: share * h (x) sum_p x_p, or h (x) fill_row
        float h[CPL];
        load_g(loop_p, h);
        float xl[4];
#pragma unroll
        for (int i = 0; i < 4; ++i)
          xl[i] = a.fill == 3 ? s_fill[k0 + i] : xs[i] * share;
#pragma unroll
        for (int j = 0; j < CPL; ++j)
#pragma unroll
          for (int i = 0; i < 4; ++i) dw[j][i] = fmaf(h[j], xl[i], dw[j][i]);
      }
    }
    // this warp's d W cells of the pass's columns
#pragma unroll
    for (int j = 0; j < CPL; ++j)
#pragma unroll
      for (int i = 0; i < 4; ++i)
        if (c0 + j < a.HF && k0 + i < a.De)
          a.grad_w[(gwarp * a.HF + c0 + j) * a.De + k0 + i] = dw[j][i];
  }
}

// ---------------------------------------------------------------- fp32 on
// tensor cores. The backward is two products per tile of 16 CSR edges,
//   d X = G W        ([16, HF] x [HF, De]: the tile's d x rows)
//   d W += G^T X     ([HF, 16] x [16, De]: this warp's d W cells)
// as 3xTF32 mma.m16n8k8 (about fp32 accuracy, mma_tiles.cuh). The CUDA-core
// kernel above spends ~280 instructions per edge on them (ncu, session 32:
// 0.51 issued per scheduler at 8 warps per SM, 232 registers); here a warp
// streams its tiles through a two-stage cp.async pipeline (G and the x rows
// in shared memory without registers), and the tile's rows are independent
// of CSR rows: a loop edge reads its row's x_loop (the mean / sum of the
// row's other x rows, or fill_row) and every other edge adds its row's
// handed d x (dh = share W^T g_loop), both from project_loops_kernel.
constexpr int kTcEdges = 16;        // edges per tile (the mma's M / K)
constexpr int kTcWarps = 4;         // warps per block
constexpr int kTcMaxHF = 128;       // G rows up to 128 columns
constexpr int kTcBlocksPerSM = 2;   // (shared memory: ~106 KB per block)

// Shared-memory row strides in floats. G: HF + 4 (A fragments of d X read
// rows g, g + 8 at column q: conflict-free; those of d W read rows q at
// columns g: two-way). x / W rows: 24 for De 16, 8 below (B fragments read
// row q at column g: conflict-free).
__host__ __device__ constexpr int tc_x_stride(int de) { return de > 8 ? 24 : 8; }
__host__ __device__ constexpr int tc_g_stride(int hf) { return hf + 4; }

template <int DE>
struct TcLayout {
  static constexpr int XS = tc_x_stride(DE), NT = DE > 8 ? 2 : 1;
  // per warp and stage: G [16][HF + 4], x [16][XS], user rows, CSR rows
  static constexpr int kStageFloats =
      kTcEdges * tc_g_stride(kTcMaxHF) + kTcEdges * XS + 3 * kTcEdges;
  // the block: W's tf32 halves [kTcMaxHF][XS] each, then the warps' stages
  static constexpr int kFloats = 2 * kTcMaxHF * XS + kTcWarps * 2 * kStageFloats;
};

__device__ __forceinline__ void cp_async_commit() {
  asm volatile("cp.async.commit_group;\n" ::);
}
__device__ __forceinline__ void cp_async_wait_one() {
  asm volatile("cp.async.wait_group 1;\n" ::);
}

// Per row (warp per row): edge_row of its edges and, for a row with a
// loop, x_loop (fill 1 / 2: share * the sum of its other x rows; fill 3:
// fill_row) and dh (fill 1 / 2: share * W^T g_loop; else 0). Lane l takes
// the 4 columns kc = l % KC of x / dh (KC = DE / 4) for the edges, resp.
// the columns c of g_loop, of its slot l / KC; the slots' partials meet by
// shuffles: 0.22 ms on gatv2-edge, H100 (a lane per column walked g_loop
// one dependent load at a time: 0.29 ms; DE + DE values per lane halved the
// resident warps of this latency-bound kernel: 0.43 ms -- NOTES session
// 32). edge_row is written only when the map did not hand its own
// (EdgeAttrMap.edge_row, built once per graph). fp32 x / W rows in 16-byte
// vectors: the tensor-core path's inputs.
template <typename T, int DE>
__global__ void __launch_bounds__(kThreads)
    project_loops_kernel(Args<T> a, int32_t* __restrict__ edge_row,
                         float* __restrict__ x_loop, float* __restrict__ dh) {
  constexpr int KC = DE / 4, kSlots = kWarpSize / KC;
  const int warp = threadIdx.x / kWarpSize, lane = threadIdx.x % kWarpSize;
  const int64_t row = (int64_t)blockIdx.x * kWarps + warp;
  if (row >= a.n_rows) return;
  const int64_t lo = a.rowptr[row], hi = a.rowptr[row + 1];
  if (edge_row != nullptr)
    for (int64_t p = lo + lane; p < hi; p += kWarpSize)
      edge_row[p] = (int32_t)row;
  const int64_t loop_p = a.loop_pos[row];
  const bool handed = loop_p >= 0 && (a.fill == 1 || a.fill == 2);
  const float share = edge_rows::loop_share(a.fill, hi - lo - 1);
  const int kc = lane % KC, slot = lane / KC, k0 = 4 * kc;
  const bool has_k = k0 < a.De;
  float xs[4] = {0.f, 0.f, 0.f, 0.f}, d[4] = {0.f, 0.f, 0.f, 0.f};
  if (handed) {  // (warp-uniform)
    for (int64_t p = lo + slot; p < hi; p += kSlots) {
      const int64_t r = a.index[p];
      if (r >= a.n_in || !has_k) continue;
      float t[4];
      load_vec<T, 4>(a.x + r * a.De + k0, t);
#pragma unroll
      for (int i = 0; i < 4; ++i) xs[i] += t[i];
    }
    const T* gl = a.grad + loop_p * a.HF;
    for (int c = slot; c < a.HF && has_k; c += kSlots) {
      const float gc = to_float(gl[c]);
      float wv[4];
      load_vec<T, 4>(a.w + (int64_t)c * a.De + k0, wv);
#pragma unroll
      for (int i = 0; i < 4; ++i) d[i] = fmaf(gc, wv[i], d[i]);
    }
#pragma unroll
    for (int o = KC; o < kWarpSize; o <<= 1)
#pragma unroll
      for (int i = 0; i < 4; ++i) {
        xs[i] += __shfl_xor_sync(kFullMask, xs[i], o);
        d[i] += __shfl_xor_sync(kFullMask, d[i], o);
      }
  }
  if (slot != 0 || !has_k) return;
  float xo[4], dv[4];
#pragma unroll
  for (int i = 0; i < 4; ++i) {
    xo[i] = a.fill == 3 ? to_float(a.fill_row[k0 + i]) : xs[i] * share;
    dv[i] = d[i] * share;
  }
  if (loop_p >= 0) store_vec<float, 4>(x_loop + row * a.De + k0, xo);
  store_vec<float, 4>(dh + row * a.De + k0, dv);
}

template <int DE>
__global__ void __launch_bounds__(kTcWarps * kWarpSize, kTcBlocksPerSM)
    project_bwd_tc_kernel(Args<float> a, const int32_t* __restrict__ edge_row,
                          const float* __restrict__ x_loop,
                          const float* __restrict__ dh, int64_t n_edges) {
  using L = TcLayout<DE>;
  constexpr int XS = L::XS, NT = L::NT, MT = kTcMaxHF / 16;
  extern __shared__ __align__(16) float smem[];
  const int HF = a.HF, De = a.De, GS = tc_g_stride(HF);
  uint32_t* s_whi = reinterpret_cast<uint32_t*>(smem);
  uint32_t* s_wlo = s_whi + kTcMaxHF * XS;
  // W [HF][De] as tf32 halves, zeros past De
  for (int i = threadIdx.x; i < HF * XS; i += blockDim.x) {
    const int c = i / XS, k = i - c * XS;
    uint32_t hi = 0u, lo = 0u;
    if (k < De) split_tf32(a.w[(int64_t)c * De + k], hi, lo);
    s_whi[i] = hi;
    s_wlo[i] = lo;
  }
  __syncthreads();
  const int warp = threadIdx.x / kWarpSize, lane = threadIdx.x % kWarpSize;
  const int g = lane >> 2, q = lane & 3;
  // this warp's two stages, one after the other
  float* const stage0 = smem + 2 * kTcMaxHF * XS + warp * 2 * L::kStageFloats;
  // a stage: G rows, x rows, then user rows (int64) and CSR rows (int32)
  auto s_g = [&](int b) { return stage0 + b * L::kStageFloats; };
  auto s_x = [&](int b) { return s_g(b) + kTcEdges * GS; };
  auto s_r = [&](int b) {
    return reinterpret_cast<int64_t*>(s_x(b) + kTcEdges * XS);
  };
  auto s_row = [&](int b) {
    return reinterpret_cast<int32_t*>(s_r(b) + kTcEdges);
  };
  const int64_t gwarp = (int64_t)blockIdx.x * kTcWarps + warp;
  const int64_t warps = (int64_t)gridDim.x * kTcWarps;
  const int64_t tiles = (n_edges + kTcEdges - 1) / kTcEdges;
  // lane e < 16's edge of a tile: its user row (n_in: none) and CSR row
  auto meta = [&](int64_t tile, int64_t& r, int32_t& row) {
    const int64_t p = tile * kTcEdges + (lane & (kTcEdges - 1));
    r = a.n_in;
    row = 0;
    if (tile < tiles && p < n_edges) {
      r = a.index != nullptr ? a.index[p] : p;
      if (edge_row != nullptr) row = edge_row[p];
    }
  };
  // the tile's copies into stage b (rows past the edges: zeros)
  auto issue = [&](int64_t tile, int b, int64_t r, int32_t row) {
    const int64_t p0 = tile * kTcEdges;
    if (lane < kTcEdges) {
      s_r(b)[lane] = r;
      s_row(b)[lane] = row;
    }
    const int gc = HF / 4;  // 16-byte chunks per G row
    for (int i = lane; i < kTcEdges * gc; i += kWarpSize) {
      const int e = i / gc, c = i - e * gc;
      const bool live = p0 + e < n_edges;
      cp_async_16(s_g(b) + e * GS + 4 * c,
                  a.grad + (live ? (p0 + e) * HF : 0) + 4 * c, live ? 16 : 0);
    }
    constexpr int xc = XS / 4;  // 16-byte chunks per x row (zeros past De)
    for (int i = lane; i < kTcEdges * xc; i += kWarpSize) {
      const int e = i / xc, c = i - e * xc;
      const int64_t re = __shfl_sync(kFullMask, (long long)r, e);
      const int32_t rowe = __shfl_sync(kFullMask, row, e);
      const bool live = p0 + e < n_edges && 4 * c < De;
      const float* src = a.x;
      if (live)
        src = re < a.n_in ? a.x + re * De + 4 * c : x_loop + (int64_t)rowe * De + 4 * c;
      cp_async_16(s_x(b) + e * XS + 4 * c, src, live ? 16 : 0);
    }
    cp_async_commit();
  };
  float dw[MT][NT][4];
#pragma unroll
  for (int m = 0; m < MT; ++m)
#pragma unroll
    for (int n = 0; n < NT; ++n)
#pragma unroll
      for (int i = 0; i < 4; ++i) dw[m][n][i] = 0.f;
  int64_t r_next;
  int32_t row_next;
  meta(gwarp, r_next, row_next);
  if (gwarp < tiles) issue(gwarp, 0, r_next, row_next);
  else cp_async_commit();
  meta(gwarp + warps, r_next, row_next);
  int b = 0;
  for (int64_t tile = gwarp; tile < tiles; tile += warps, b ^= 1) {
    // (the shuffles in issue: every lane of the warp takes this branch)
    if (tile + warps < tiles) issue(tile + warps, b ^ 1, r_next, row_next);
    else cp_async_commit();
    meta(tile + 2 * warps, r_next, row_next);
    cp_async_wait_one();
    __syncwarp();
    const float* G = s_g(b);
    const float* X = s_x(b);
    // d X = G W: rows (g, g + 8), columns 8 n + (2 q, 2 q + 1)
    float dx[NT][4];
#pragma unroll
    for (int n = 0; n < NT; ++n)
#pragma unroll
      for (int i = 0; i < 4; ++i) dx[n][i] = 0.f;
#pragma unroll 4
    for (int k0 = 0; k0 < HF; k0 += 8) {
      uint32_t ahi[4], alo[4];
      split_tf32(G[g * GS + k0 + q], ahi[0], alo[0]);
      split_tf32(G[(g + 8) * GS + k0 + q], ahi[1], alo[1]);
      split_tf32(G[g * GS + k0 + q + 4], ahi[2], alo[2]);
      split_tf32(G[(g + 8) * GS + k0 + q + 4], ahi[3], alo[3]);
#pragma unroll
      for (int n = 0; n < NT; ++n) {
        const int w0 = (k0 + q) * XS + 8 * n + g, w1 = w0 + 4 * XS;
        mma_1688_tf32(dx[n], alo, s_whi[w0], s_whi[w1]);
        mma_1688_tf32(dx[n], ahi, s_wlo[w0], s_wlo[w1]);
        mma_1688_tf32(dx[n], ahi, s_whi[w0], s_whi[w1]);
      }
    }
    // d W += G^T X: rows 16 m + (g, g + 8) of HF, columns 8 n + (2 q, + 1)
#pragma unroll
    for (int e0 = 0; e0 < kTcEdges; e0 += 8) {
      uint32_t bhi[NT][2], blo[NT][2];
#pragma unroll
      for (int n = 0; n < NT; ++n) {
        split_tf32(X[(e0 + q) * XS + 8 * n + g], bhi[n][0], blo[n][0]);
        split_tf32(X[(e0 + q + 4) * XS + 8 * n + g], bhi[n][1], blo[n][1]);
      }
#pragma unroll
      for (int m = 0; m < MT; ++m) {
        if (16 * m >= HF) break;  // (warp-uniform)
        uint32_t ahi[4], alo[4];
        split_tf32(G[(e0 + q) * GS + 16 * m + g], ahi[0], alo[0]);
        split_tf32(G[(e0 + q) * GS + 16 * m + g + 8], ahi[1], alo[1]);
        split_tf32(G[(e0 + q + 4) * GS + 16 * m + g], ahi[2], alo[2]);
        split_tf32(G[(e0 + q + 4) * GS + 16 * m + g + 8], ahi[3], alo[3]);
#pragma unroll
        for (int n = 0; n < NT; ++n) {
          mma_1688_tf32(dw[m][n], alo, bhi[n][0], bhi[n][1]);
          mma_1688_tf32(dw[m][n], ahi, blo[n][0], blo[n][1]);
          mma_1688_tf32(dw[m][n], ahi, bhi[n][0], bhi[n][1]);
        }
      }
    }
    // the tile's d x rows (loops and rows past the edges: none)
#pragma unroll
    for (int half = 0; half < 2; ++half) {
      const int e = g + 8 * half;
      const int64_t r = s_r(b)[e];
      if (r >= a.n_in) continue;
      const float* dhr = dh != nullptr ? dh + (int64_t)s_row(b)[e] * De : nullptr;
#pragma unroll
      for (int n = 0; n < NT; ++n) {
        const int k = 8 * n + 2 * q;
        if (k >= De) continue;
        float2 v = make_float2(dx[n][2 * half], dx[n][2 * half + 1]);
        if (dhr != nullptr) {
          v.x += dhr[k];
          v.y += dhr[k + 1];
        }
        *reinterpret_cast<float2*>(a.grad_x + r * De + k) = v;
      }
    }
    __syncwarp();  // (stage b is refilled next iteration)
  }
  cp_async_wait_all();
  // this warp's d W cells
#pragma unroll
  for (int m = 0; m < MT; ++m)
#pragma unroll
    for (int n = 0; n < NT; ++n)
#pragma unroll
      for (int i = 0; i < 4; ++i) {
        const int c = 16 * m + g + 8 * (i >> 1), k = 8 * n + 2 * q + (i & 1);
        if (c < HF && k < De)
          a.grad_w[(gwarp * HF + c) * De + k] = dw[m][n][i];
      }
}

}  // namespace edge_project
}  // namespace pyg_dfgnn

using namespace pyg_dfgnn;

namespace pyg_dfgnn {
namespace edge_project {

// The tensor-core backward takes fp32 with x rows in 16-byte vectors and
// HF a multiple of 16 up to kTcMaxHF; PYG_DFGNN_PROJECT_TC=0 keeps the
// CUDA-core kernel (A / B runs).
bool use_tc_backward(at::ScalarType dtype, int64_t HF, int64_t De,
                     std::initializer_list<const at::Tensor*> rows) {
  static const bool enabled = [] {
    const char* e = std::getenv("PYG_DFGNN_PROJECT_TC");
    return e == nullptr || std::atoi(e) != 0;
  }();
  bool aligned = true;  // (16-byte copies and vector loads of their rows)
  for (const at::Tensor* t : rows)
    aligned = aligned && reinterpret_cast<uintptr_t>(t->data_ptr()) % 16 == 0;
  return enabled && dtype == at::kFloat && HF % 16 == 0 && HF <= kTcMaxHF &&
         De % 4 == 0 && aligned;
}

std::tuple<at::Tensor, at::Tensor, at::Tensor> project_bwd_tc(
    const at::Tensor& rowptr, const at::Tensor& index, int64_t num_edges,
    const at::Tensor& x, int64_t fill, const at::Tensor& fill_row,
    const at::Tensor& w, const at::Tensor& grad, const at::Tensor& loop_pos,
    const at::Tensor& map_edge_row, at::Tensor grad_x, int sms) {
  const int64_t n_rows = rowptr.numel() - 1, n_in = x.size(0);
  const int64_t De = x.size(1), HF = w.size(0);
  const auto fopt = x.options().dtype(at::kFloat);
  Args<float> a{};
  a.rowptr = rowptr.data_ptr<int64_t>();
  a.index = index.defined() ? index.data_ptr<int64_t>() : nullptr;
  a.x = x.data_ptr<float>();
  a.fill_row = fill_row.defined() ? fill_row.data_ptr<float>() : nullptr;
  a.w = w.data_ptr<float>();
  a.grad = grad.data_ptr<float>();
  a.grad_x = grad_x.data_ptr<float>();
  a.loop_pos = fill != 0 ? loop_pos.data_ptr<int64_t>() : nullptr;
  a.n_rows = n_rows, a.n_in = n_in;
  a.HF = (int)HF, a.De = (int)De, a.fill = (int)fill;
  auto stream = at::cuda::getCurrentCUDAStream();
  // edge rows and the loops' x rows and handed d x (fills only)
  at::Tensor edge_row = map_edge_row, x_loop, dh;
  if (fill != 0) {
    const bool given = edge_row.defined();
    if (!given) edge_row = at::empty({num_edges}, x.options().dtype(at::kInt));
    x_loop = at::empty({n_rows, De}, fopt);
    dh = at::empty({n_rows, De}, fopt);
    const unsigned row_blocks = (unsigned)((n_rows + kWarps - 1) / kWarps);
    with_bound<kEdgeProjectMaxDim>(De, [&](auto max_dim) {
      constexpr int DE = decltype(max_dim)::value;
      project_loops_kernel<float, DE><<<row_blocks, kThreads, 0, stream>>>(
          a, given ? nullptr : edge_row.data_ptr<int32_t>(),
          x_loop.data_ptr<float>(), dh.data_ptr<float>());
    });
    C10_CUDA_KERNEL_LAUNCH_CHECK();
  }
  const int64_t tiles = (num_edges + kTcEdges - 1) / kTcEdges;
  const int64_t blocks = std::max<int64_t>(
      1, std::min<int64_t>((tiles + kTcWarps - 1) / kTcWarps,
                           (int64_t)kTcBlocksPerSM * sms));
  at::Tensor partial = at::empty({blocks * kTcWarps, HF, De}, fopt);
  a.grad_w = partial.data_ptr<float>();
  with_bound<kEdgeProjectMaxDim>(De, [&](auto max_dim) {
    constexpr int DE = decltype(max_dim)::value;
    const size_t bytes = sizeof(float) * TcLayout<DE>::kFloats;
    auto kernel = project_bwd_tc_kernel<DE>;
    C10_CUDA_CHECK(cudaFuncSetAttribute(
        kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, (int)bytes));
    kernel<<<(unsigned)blocks, kTcWarps * kWarpSize, bytes, stream>>>(
        a, fill != 0 ? edge_row.data_ptr<int32_t>() : nullptr,
        fill != 0 ? x_loop.data_ptr<float>() : nullptr,
        fill == 1 || fill == 2 ? dh.data_ptr<float>() : nullptr, num_edges);
  });
  C10_CUDA_KERNEL_LAUNCH_CHECK();
  return {at::empty({0, HF}, x.options()), grad_x, partial.sum(0)};
}

}  // namespace edge_project
}  // namespace pyg_dfgnn

std::tuple<at::Tensor, at::Tensor, at::Tensor> edge_attr_project_cuda(
    const at::Tensor& rowptr, const c10::optional<at::Tensor>& index_opt,
    int64_t num_edges, const at::Tensor& edge_attr, int64_t fill,
    const c10::optional<at::Tensor>& fill_row_opt, const at::Tensor& weight,
    const c10::optional<at::Tensor>& grad_opt,
    const c10::optional<at::Tensor>& loop_pos_opt,
    const c10::optional<at::Tensor>& edge_row_opt) {
  TORCH_CHECK(edge_attr.is_cuda() && edge_attr.dim() == 2,
              "edge_attr_project: 'edge_attr' must be a CUDA tensor "
              "[E_in, De]");
  const at::Device dev = edge_attr.device();
  c10::cuda::CUDAGuard guard(dev);
  const at::Tensor x = edge_attr.contiguous();
  const auto dtype = x.scalar_type();
  TORCH_CHECK(dtype == at::kFloat || dtype == at::kHalf ||
                  dtype == at::kBFloat16,
              "edge_attr_project: float32, float16 or bfloat16 only");
  const int64_t n_in = x.size(0), De = x.size(1);
  TORCH_CHECK(weight.is_cuda() && weight.device() == dev &&
                  weight.scalar_type() == dtype && weight.dim() == 2 &&
                  weight.size(1) == De,
              "edge_attr_project: 'weight' must be [H * F, De] in "
              "edge_attr's dtype on its device");
  const int64_t HF = weight.size(0);
  TORCH_CHECK(De >= 1 && De <= kEdgeProjectMaxDim && HF >= 1 &&
                  HF % edge_project::kCols == 0,
              "edge_attr_project: needs 1 <= De <= ", kEdgeProjectMaxDim,
              " and H * F a multiple of ", edge_project::kCols, " (got De = ",
              De, ", H * F = ", HF, ")");
  TORCH_CHECK(rowptr.is_cuda() && rowptr.device() == dev &&
                  rowptr.scalar_type() == at::kLong && rowptr.dim() == 1 &&
                  rowptr.numel() >= 1,
              "edge_attr_project: 'rowptr' must be an int64 CUDA tensor "
              "[N + 1]");
  TORCH_CHECK(fill >= 0 && fill <= 3, "edge_attr_project: 'fill' must be 0-3");
  auto input = [&](const c10::optional<at::Tensor>& t, const char* name) {
    return edge_rows::optional_input(t, "edge_attr_project", name, dev);
  };
  const at::Tensor ptr = rowptr.contiguous();
  const at::Tensor index = input(index_opt, "index");
  const at::Tensor fr = input(fill_row_opt, "fill_row");
  const at::Tensor grad = input(grad_opt, "grad");
  const at::Tensor loop_pos = input(loop_pos_opt, "loop_pos");
  const at::Tensor edge_row = input(edge_row_opt, "edge_row");
  const int64_t n_rows = ptr.numel() - 1;
  TORCH_CHECK(index.defined() ? index.scalar_type() == at::kLong &&
                                    index.numel() == num_edges
                              : fill == 0 && num_edges == n_in,
              "edge_attr_project: 'index' must be int64 [num_edges] (without "
              "it, no fill and one edge per edge_attr row)");
  TORCH_CHECK(fill != 3 || (fr.defined() && fr.numel() == De &&
                            fr.scalar_type() == dtype),
              "edge_attr_project: fill 3 needs 'fill_row' [De]");
  TORCH_CHECK(fill == 0 || (loop_pos.defined() &&
                            loop_pos.scalar_type() == at::kLong &&
                            loop_pos.numel() == n_rows),
              "edge_attr_project: a fill needs 'loop_pos' (int64 [N])");
  TORCH_CHECK(!edge_row.defined() || (edge_row.scalar_type() == at::kInt &&
                                      edge_row.numel() == num_edges),
              "edge_attr_project: 'edge_row' must be int32 [num_edges]");
  const bool backward = grad.defined();
  TORCH_CHECK(!backward || (grad.scalar_type() == dtype && grad.dim() == 2 &&
                            grad.size(0) == num_edges && grad.size(1) == HF),
              "edge_attr_project: 'grad' must be [num_edges, H * F] in "
              "edge_attr's dtype");

  const auto opts = x.options();
  at::Tensor out = at::empty({backward ? 0 : num_edges, HF}, opts);
  at::Tensor grad_x = at::empty({backward ? n_in : 0, De}, opts);
  if (n_rows == 0 || num_edges == 0) {
    return {out, grad_x.zero_(), at::zeros({backward ? HF : 0, De},
                                           opts.dtype(at::kFloat))};
  }
  const int sms = at::cuda::getCurrentDeviceProperties()->multiProcessorCount;
  if (backward) {
    const at::Tensor w = weight.contiguous(), g = grad.contiguous();
    if (edge_project::use_tc_backward(dtype, HF, De, {&x, &w, &g}))
      return edge_project::project_bwd_tc(ptr, index, num_edges, x, fill, fr,
                                          w, g, loop_pos, edge_row, grad_x,
                                          sms);
  }
  const int64_t row_blocks =
      (n_rows + edge_project::kWarps - 1) / edge_project::kWarps;
  // forward: a few blocks per SM walk the rows; backward: one (registers)
  const unsigned blocks = (unsigned)std::max<int64_t>(
      1, std::min<int64_t>(row_blocks, (backward ? 1 : 4) * (int64_t)sms));
  at::Tensor partial = at::empty(
      {backward ? (int64_t)blocks * edge_project::kWarps : 0, HF, De},
      opts.dtype(at::kFloat));
  auto stream = at::cuda::getCurrentCUDAStream();
  PYG_DFGNN_DISPATCH_FLOAT(dtype, "edge_attr_project", [&] {
    edge_project::Args<scalar_t> a;
    a.rowptr = ptr.data_ptr<int64_t>();
    a.index = index.defined() ? index.data_ptr<int64_t>() : nullptr;
    a.x = x.data_ptr<scalar_t>();
    a.fill_row = fr.defined() ? fr.data_ptr<scalar_t>() : nullptr;
    const at::Tensor w = weight.contiguous();
    a.w = w.data_ptr<scalar_t>();
    a.grad = backward ? grad.data_ptr<scalar_t>() : nullptr;
    a.out = backward ? nullptr : out.data_ptr<scalar_t>();
    a.grad_x = backward ? grad_x.data_ptr<scalar_t>() : nullptr;
    a.grad_w = backward ? partial.data_ptr<float>() : nullptr;
    a.loop_pos = fill != 0 ? loop_pos.data_ptr<int64_t>() : nullptr;
    a.n_rows = n_rows, a.n_in = n_in;
    a.HF = (int)HF, a.De = (int)De, a.fill = (int)fill;
    a.vec = De % 4 == 0 && reinterpret_cast<uintptr_t>(a.x) %
                                 (4 * sizeof(scalar_t)) == 0;
    with_bound<kEdgeProjectMaxDim>(De, [&](auto max_dim) {
      constexpr int DE = decltype(max_dim)::value;
      if (backward)
        edge_project::project_bwd_kernel<scalar_t, DE>
            <<<blocks, edge_project::kThreads, 0, stream>>>(a);
      else
        edge_project::project_fwd_kernel<scalar_t, DE>
            <<<blocks, edge_project::kThreads, 0, stream>>>(a);
    });
    C10_CUDA_KERNEL_LAUNCH_CHECK();
  });
  if (!backward)
    return {out, grad_x, at::empty({0, De}, opts.dtype(at::kFloat))};
  return {out, grad_x, partial.sum(0)};
}

// Forward kernels of the fused attention op: SDDMM -> edge softmax -> SpMM.
//
// One templated family: scalar_t (fp32/fp16/bf16, fp32 arithmetic) x index_t
// (int32/int64 col) x score KIND (dot/add/gatv2) x VEC (16-byte vectors or a
// scalar path for feature sizes that are not multiples of the vector width).
//
// SMMF (one kernel, node-parallel): a block owns `rows` consecutive rows.
//   0. stage the block's rowptr window, col, query rows (fp32) and att in smem;
//   1. warp-balanced SDDMM: the block's (edge, head) items are split evenly
//      over the warps; a group of lanes computes one item; scores -> smem;
//   2. redundancy-free softmax: a warp per row, lanes over edges; exp values
//      overwrite the scores in smem; lse = max + log(sum + 1e-16) -> global;
//   3. vectorized SpMM: a warp per row, lanes over 16-byte feature vectors
//      (lanes split over edges too when H*F is short), 4 neighbours unrolled.
// PMF (rows too long for SMMF's shared memory; any degree):
//   a. edge-parallel SDDMM -> scores [E, H] fp32 in global memory;
//   b. softmax + SpMM, a warp per segment of <= kSegEdges edges of one row;
//      rows of one segment finish in place, longer rows write partial
//      (max, sum, unnormalised acc) per segment;
//   c. a combine kernel merges the segments of long rows (flash-decoding
//      style), so one node connected to all others still spreads over the GPU.
#include <c10/cuda/CUDAException.h>
#include <c10/cuda/CUDAStream.h>

#include <cmath>

#include "common.cuh"
#include "ops.h"

namespace pyg_dfgnn {
namespace fwd {


constexpr int kWarps = 8;  // warps per block, both strategies
constexpr int kThreads = kWarps * kWarpSize;
constexpr int kUnroll = 4;       // independent items / neighbours in flight
constexpr int kSegEdges = 256;   // PMF: edges per segment (one warp)
constexpr int kTileEdges = 32;   // PMF: edges per exp tile in smem
constexpr int kSmmfRows = 16;    // SMMF: rows per window by default
constexpr int kSmmfPreferredSmem = 64 * 1024;

template <typename T, bool VEC>
struct Width {
  static constexpr int kVW = VEC ? Vec<T>::kWidth : 1;
  // Feature vectors a lane accumulates per pass (16 elements per lane).
  static constexpr int kSlots = VEC ? 16 / kVW : 4;
};

template <typename T, typename I>
struct FwdArgs {
  const int64_t* __restrict__ rowptr;
  const I* __restrict__ col;
  const T* __restrict__ q;
  const T* __restrict__ k;
  const T* __restrict__ v;
  const T* __restrict__ att;
  T* __restrict__ out;
  float* __restrict__ lse;
  int64_t n_dst;
  int H, D, F;        // D: score feature size (1 for 'add')
  int qk_group;       // lanes per (edge, head) dot product (power of two)
  int v_group;        // lanes per row in the SpMM (power of two <= 32)
  float scale, slope;
};

// fp32 values from shared memory, 16 bytes at a time when VW % 4 == 0.
template <int VW>
__device__ __forceinline__ void load_smem(const float* p, float (&x)[VW]) {
  if constexpr (VW % 4 == 0) {
#pragma unroll
    for (int i = 0; i < VW; i += 4) {
      const float4 t = *reinterpret_cast<const float4*>(p + i);
      x[i] = t.x, x[i + 1] = t.y, x[i + 2] = t.z, x[i + 3] = t.w;
    }
  } else {
#pragma unroll
    for (int i = 0; i < VW; ++i) x[i] = p[i];
  }
}

// Partial score of one (edge, head) item over this lane's share of D.
template <int KIND, typename T, int VW>
__device__ __forceinline__ float score_part(const float* q_row,
                                            const T* k_row, const float* att,
                                            int D, int d0, int dstep,
                                            float slope) {
  float acc = 0.f;
  for (int d = d0; d < D; d += dstep) {
    float kx[VW], qx[VW];
    load_vec<T, VW>(k_row + d, kx);
    load_smem<VW>(q_row + d, qx);
    if constexpr (KIND == kDot) {
#pragma unroll
      for (int i = 0; i < VW; ++i) acc = fmaf(qx[i], kx[i], acc);
    } else {
      float ax[VW];
      load_smem<VW>(att + d, ax);
#pragma unroll
      for (int i = 0; i < VW; ++i)
        acc = fmaf(ax[i], leaky_relu(qx[i] + kx[i], slope), acc);
    }
  }
  return acc;
}

// Same, query row read from global memory (PMF SDDMM).
template <int KIND, typename T, int VW>
__device__ __forceinline__ float score_part_global(const T* q_row,
                                                   const T* k_row,
                                                   const T* att, int D,
                                                   int d0, int dstep,
                                                   float slope) {
  float acc = 0.f;
  for (int d = d0; d < D; d += dstep) {
    float kx[VW], qx[VW];
    load_vec<T, VW>(k_row + d, kx);
    load_vec<T, VW>(q_row + d, qx);
    if constexpr (KIND == kDot) {
#pragma unroll
      for (int i = 0; i < VW; ++i) acc = fmaf(qx[i], kx[i], acc);
    } else {
      float ax[VW];
      load_vec<T, VW>(att + d, ax);
#pragma unroll
      for (int i = 0; i < VW; ++i)
        acc = fmaf(ax[i], leaky_relu(qx[i] + kx[i], slope), acc);
    }
  }
  return acc;
}

// SpMM of one row: acc += sum_{e in [lo, hi)} p(e, head) * v[j(e)] for this
// lane's feature vectors (slot c0 + ls + s * group). Lanes of one edge group
// (lane / group) take every `epar`-th edge; reduce_edge_groups sums them.
template <typename T, int VW, int SLOTS, typename GetJ, typename GetP>
__device__ __forceinline__ void spmm_accumulate(
    float (&acc)[SLOTS][VW], const T* __restrict__ v, int64_t HF, int slots,
    int c0, int group, int ls, int sub, int lo, int hi, const int (&hs)[SLOTS],
    GetJ get_j, GetP get_p) {
  const int epar = kWarpSize / group;
  int e = lo + sub;
  for (; e + (kUnroll - 1) * epar < hi; e += kUnroll * epar) {
    int64_t j[kUnroll];
#pragma unroll
    for (int u = 0; u < kUnroll; ++u) j[u] = get_j(e + u * epar);
#pragma unroll
    for (int s = 0; s < SLOTS; ++s) {
      const int sl = c0 + ls + s * group;
      if (sl < slots) {
        float x[kUnroll][VW];
#pragma unroll
        for (int u = 0; u < kUnroll; ++u)
          load_vec<T, VW>(v + j[u] * HF + (int64_t)sl * VW, x[u]);
#pragma unroll
        for (int u = 0; u < kUnroll; ++u) {
          const float p = get_p(e + u * epar, hs[s]);
#pragma unroll
          for (int i = 0; i < VW; ++i) acc[s][i] = fmaf(p, x[u][i], acc[s][i]);
        }
      }
    }
  }
  for (; e < hi; e += epar) {
    const int64_t j = get_j(e);
#pragma unroll
    for (int s = 0; s < SLOTS; ++s) {
      const int sl = c0 + ls + s * group;
      if (sl < slots) {
        float x[VW];
        load_vec<T, VW>(v + j * HF + (int64_t)sl * VW, x);
        const float p = get_p(e, hs[s]);
#pragma unroll
        for (int i = 0; i < VW; ++i) acc[s][i] = fmaf(p, x[i], acc[s][i]);
      }
    }
  }
}

template <int VW, int SLOTS>
__device__ __forceinline__ void reduce_edge_groups(float (&acc)[SLOTS][VW],
                                                   int group) {
  for (int o = 16; o >= group; o >>= 1) {
#pragma unroll
    for (int s = 0; s < SLOTS; ++s)
#pragma unroll
      for (int i = 0; i < VW; ++i)
        acc[s][i] += __shfl_xor_sync(kFullMask, acc[s][i], o);
  }
}

// Advance `r` (a row of the window) until it holds local edge e.
__device__ __forceinline__ int advance_row(const int64_t* s_rowptr, int r,
                                           int64_t e) {
  while (s_rowptr[r + 1] <= e) ++r;
  return r;
}

// Shared memory of an SMMF block (byte offsets, each 16-byte aligned):
// rowptr [rows + 1] int64 | q rows fp32 [rows][HD_q] | att fp32 [HD_att] |
// inv fp32 [rows][H] | scores fp32 [H][cap] | col [cap].
struct SmmfLayout {
  size_t q, att, inv, score, col, red, stage, total;
};
__host__ __device__ inline size_t align16(size_t b) {
  return (b + 15) & ~(size_t)15;
}
__host__ __device__ inline SmmfLayout smmf_layout(int rows, int64_t cap, int H,
                                                  int HD_q, int HD_att,
                                                  size_t index_bytes,
                                                  size_t stage_bytes = 0) {
  SmmfLayout L;
  L.q = align16((size_t)(rows + 1) * 8);
  L.att = align16(L.q + (size_t)rows * HD_q * 4);
  L.inv = align16(L.att + (size_t)HD_att * 4);
  L.score = align16(L.inv + (size_t)rows * H * 4);
  L.col = align16(L.score + (size_t)cap * H * 4);
  L.red = align16(L.col + (size_t)cap * index_bytes);
  L.stage = align16(L.red + 2 * kWarps * 8);
  L.total = align16(L.stage + stage_bytes);
  return L;
}

// Copy n elements global -> shared, 16 bytes per access when VW > 1 (both
// ends 16-byte aligned and n a multiple of VW then).
template <typename T, int VW>
__device__ __forceinline__ void copy_to_smem(T* dst, const T* __restrict__ src,
                                             int64_t n, int tid) {
  if constexpr (VW > 1) {
    const uint4* s4 = reinterpret_cast<const uint4*>(src);
    uint4* d4 = reinterpret_cast<uint4*>(dst);
    for (int64_t i = tid; i < n / VW; i += kThreads) d4[i] = s4[i];
  } else {
    for (int64_t i = tid; i < n; i += kThreads) dst[i] = src[i];
  }
}

// ============================================================= SMMF kernel
template <typename T, typename I, int KIND, bool VEC>
__global__ void __launch_bounds__(kThreads)
    smmf_fwd_kernel(FwdArgs<T, I> a, int rows, int cap, int windows_per_block,
                    int stage_bytes) {
  constexpr int VW = Width<T, VEC>::kVW;
  constexpr int SLOTS = Width<T, VEC>::kSlots;
  extern __shared__ __align__(16) unsigned char smem[];
  const int H = a.H, D = a.D, F = a.F;
  const int HD = H * D;
  const SmmfLayout L = smmf_layout(rows, cap, H, KIND == kAdd ? H : HD,
                                   KIND == kGatv2 ? HD : 0, sizeof(I),
                                   stage_bytes);
  int64_t* s_rowptr = reinterpret_cast<int64_t*>(smem);
  float* s_q = reinterpret_cast<float*>(smem + L.q);
  float* s_att = reinterpret_cast<float*>(smem + L.att);
  float* s_inv = reinterpret_cast<float*>(smem + L.inv);
  float* s_score = reinterpret_cast<float*>(smem + L.score);
  I* s_col = reinterpret_cast<I*>(smem + L.col);
  int64_t* s_red = reinterpret_cast<int64_t*>(smem + L.red);
  T* s_stage = reinterpret_cast<T*>(smem + L.stage);

  const int tid = threadIdx.x, warp = tid / kWarpSize, lane = tid % kWarpSize;
  // A block walks `windows_per_block` consecutive row windows (> 1: a
  // persistent grid whose SMs each sweep a contiguous slice of the graph, so
  // the K / V rows of a small graph stay in L1 while its rows are done).
  const int64_t n_windows = (a.n_dst + rows - 1) / rows;
  const int64_t win_begin = (int64_t)blockIdx.x * windows_per_block;
  const int64_t win_end = win_begin + windows_per_block < n_windows
                              ? win_begin + windows_per_block : n_windows;
  for (int64_t win = win_begin; win < win_end; ++win) {
  const int64_t row0 = win * rows;
  const int nrows = (int)(a.n_dst - row0 < rows ? a.n_dst - row0 : rows);

  // ---- 0. stage
  for (int i = tid; i <= nrows; i += kThreads) s_rowptr[i] = a.rowptr[row0 + i];
  for (int i = tid; i < nrows * HD; i += kThreads)
    s_q[i] = to_float(a.q[row0 * HD + i]);
  if constexpr (KIND == kGatv2)
    for (int i = tid; i < HD; i += kThreads) s_att[i] = to_float(a.att[i]);
  __syncthreads();
  const int64_t e0 = s_rowptr[0];
  const int n_e = (int)(s_rowptr[nrows] - e0);
  for (int i = tid; i < n_e; i += kThreads) s_col[i] = a.col[e0 + i];
  // rowptr relative to the block's first edge
  __syncthreads();
  if (tid <= nrows) s_rowptr[tid] -= e0;

  // ---- 0b. source window: when the window's sources [lo, hi] are close
  // (batches of small graphs), K rows (then V rows) of that range are staged
  // once in smem and every edge reads them there instead of from L2.
  int64_t src_lo = 0, span = 0;
  bool stage_k = false, stage_v = false;
  if (stage_bytes > 0 && n_e > 0) {
    int64_t mn = INT64_MAX, mx = -1;
    for (int i = tid; i < n_e; i += kThreads) {
      const int64_t j = (int64_t)s_col[i];
      mn = j < mn ? j : mn;
      mx = j > mx ? j : mx;
    }
#pragma unroll
    for (int o = 16; o > 0; o >>= 1) {
      const int64_t omn = __shfl_xor_sync(kFullMask, mn, o);
      const int64_t omx = __shfl_xor_sync(kFullMask, mx, o);
      mn = omn < mn ? omn : mn;
      mx = omx > mx ? omx : mx;
    }
    if (lane == 0) s_red[warp] = mn, s_red[kWarps + warp] = mx;
    __syncthreads();
    mn = s_red[0], mx = s_red[kWarps];
    for (int w = 1; w < kWarps; ++w) {
      mn = s_red[w] < mn ? s_red[w] : mn;
      mx = s_red[kWarps + w] > mx ? s_red[kWarps + w] : mx;
    }
    src_lo = mn;
    span = mx - mn + 1;
    stage_k = KIND != kAdd && span * HD * (int64_t)sizeof(T) <= stage_bytes;
    stage_v = span * H * F * (int64_t)sizeof(T) <= stage_bytes;
    if (stage_k)
      copy_to_smem<T, VW>(s_stage, a.k + src_lo * HD, span * HD, tid);
  }
  __syncthreads();

  // ---- 1. warp-balanced SDDMM
  const int n_items = n_e * H;
  if constexpr (KIND == kAdd) {
    int r = 0;
    for (int it = tid; it < n_items; it += kThreads) {
      const int e = it / H, h = it - e * H;
      r = advance_row(s_rowptr, r, e);
      const float x = s_q[r * H + h] + to_float(a.k[(int64_t)s_col[e] * H + h]);
      s_score[h * cap + e] = leaky_relu(x, a.slope);
    }
  } else {
    const int G = a.qk_group, ng = kWarpSize / G;
    const int g = lane / G, lg = lane % G;
    const int per_warp = (n_items + kWarps - 1) / kWarps;
    const int start = warp * per_warp;
    const int end = min(n_items, start + per_warp);
    int r = 0;
    for (int base = start; base < end; base += kUnroll * ng) {
      float acc[kUnroll];
      int ee[kUnroll], hh[kUnroll];
#pragma unroll
      for (int u = 0; u < kUnroll; ++u) {
        const int it = base + u * ng + g;
        acc[u] = 0.f;
        ee[u] = -1;
        if (it < end) {
          const int e = it / H, h = it - e * H;
          r = advance_row(s_rowptr, r, e);
          ee[u] = e, hh[u] = h;
          if (stage_k)
            acc[u] = score_part<KIND, T, VW>(
                s_q + r * HD + h * D,
                s_stage + (((int64_t)s_col[e] - src_lo) * H + h) * D,
                s_att + h * D, D, lg * VW, G * VW, a.slope);
          else
            acc[u] = score_part<KIND, T, VW>(
                s_q + r * HD + h * D, a.k + ((int64_t)s_col[e] * H + h) * D,
                s_att + h * D, D, lg * VW, G * VW, a.slope);
        }
      }
#pragma unroll
      for (int u = 0; u < kUnroll; ++u) {
        const float s = group_sum(acc[u], G);
        if (lg == 0 && ee[u] >= 0)
          s_score[hh[u] * cap + ee[u]] = KIND == kDot ? s * a.scale : s;
      }
    }
  }
  __syncthreads();
  if (stage_v)  // K is no longer read: the buffer takes V (synced below)
    copy_to_smem<T, VW>(s_stage, a.v + src_lo * H * F, span * H * F, tid);

  // ---- 2. softmax, a warp per row
  for (int r = warp; r < nrows; r += kWarps) {
    const int lo = (int)s_rowptr[r], hi = (int)s_rowptr[r + 1];
    for (int h = 0; h < H; ++h) {
      float* sc = s_score + h * cap;
      float m = -INFINITY;
      for (int e = lo + lane; e < hi; e += kWarpSize) m = fmaxf(m, sc[e]);
      m = warp_max(m);
      float sum = 0.f;
      for (int e = lo + lane; e < hi; e += kWarpSize) {
        const float x = expf(sc[e] - m);
        sc[e] = x;
        sum += x;
      }
      sum = warp_sum(sum);
      if (lane == 0) {
        a.lse[(row0 + r) * H + h] = hi > lo ? m + logf(sum + 1e-16f) : -INFINITY;
        s_inv[r * H + h] = 1.f / (sum + 1e-16f);
      }
    }
  }
  __syncthreads();

  // ---- 3. SpMM, a warp per row
  const int64_t HF = (int64_t)H * F;
  const int slots = (int)(HF / VW);
  const int group = a.v_group;
  const int ls = lane % group, sub = lane / group;
  auto get_j = [&](int e) -> int64_t { return (int64_t)s_col[e]; };
  auto get_p = [&](int e, int h) -> float { return s_score[h * cap + e]; };
  for (int r = warp; r < nrows; r += kWarps) {
    const int elo = (int)s_rowptr[r], ehi = (int)s_rowptr[r + 1];
    for (int c0 = 0; c0 < slots; c0 += group * SLOTS) {
      float acc[SLOTS][VW];
      int hs[SLOTS];
#pragma unroll
      for (int s = 0; s < SLOTS; ++s) {
        hs[s] = min(H - 1, (c0 + ls + s * group) * VW / F);
#pragma unroll
        for (int i = 0; i < VW; ++i) acc[s][i] = 0.f;
      }
      if (stage_v) {
        auto get_j_staged = [&](int e) -> int64_t {
          return (int64_t)s_col[e] - src_lo;
        };
        spmm_accumulate<T, VW, SLOTS>(acc, s_stage, HF, slots, c0, group, ls,
                                      sub, elo, ehi, hs, get_j_staged, get_p);
      } else {
        spmm_accumulate<T, VW, SLOTS>(acc, a.v, HF, slots, c0, group, ls, sub,
                                      elo, ehi, hs, get_j, get_p);
      }
      reduce_edge_groups<VW, SLOTS>(acc, group);
      if (sub == 0) {
#pragma unroll
        for (int s = 0; s < SLOTS; ++s) {
          const int sl = c0 + ls + s * group;
          if (sl < slots) {
            const float inv = s_inv[r * H + hs[s]];
#pragma unroll
            for (int i = 0; i < VW; ++i) acc[s][i] *= inv;
            store_vec<T, VW>(a.out + (row0 + r) * HF + (int64_t)sl * VW,
                             acc[s]);
          }
        }
      }
    }
  }
  __syncthreads();  // smem is reused by the next window
  }
}

// ============================================================= PMF kernels
__device__ __forceinline__ int64_t find_row(const int64_t* __restrict__ ptr,
                                            int64_t n, int64_t x) {
  // last r in [0, n) with ptr[r] <= x
  int64_t lo = 0, hi = n - 1;
  while (lo < hi) {
    const int64_t mid = (lo + hi + 1) >> 1;
    if (ptr[mid] <= x) lo = mid; else hi = mid - 1;
  }
  return lo;
}

// a. edge-parallel SDDMM: scores[e, h] for all edges.
template <typename T, typename I, int KIND, bool VEC>
__global__ void __launch_bounds__(kThreads)
    pmf_sddmm_kernel(FwdArgs<T, I> a, float* __restrict__ scores,
                     int64_t items_per_warp) {
  constexpr int VW = Width<T, VEC>::kVW;
  const int H = a.H, D = a.D;
  const int64_t HD = (int64_t)H * D;
  const int64_t n_items = a.rowptr[a.n_dst] * H;
  const int lane = threadIdx.x % kWarpSize;
  const int64_t gw = ((int64_t)blockIdx.x * blockDim.x + threadIdx.x) / kWarpSize;
  const int64_t start = gw * items_per_warp;
  const int64_t end = n_items < start + items_per_warp ? n_items : start + items_per_warp;
  if (start >= end) return;
  const int G = KIND == kAdd ? 1 : a.qk_group, ng = kWarpSize / G;
  const int g = lane / G, lg = lane % G;
  int64_t r = find_row(a.rowptr, a.n_dst, (start + g) / H);
  for (int64_t base = start; base < end; base += kUnroll * ng) {
    float acc[kUnroll];
    int64_t ii[kUnroll];
#pragma unroll
    for (int u = 0; u < kUnroll; ++u) {
      const int64_t it = base + u * ng + g;
      acc[u] = 0.f;
      ii[u] = -1;
      if (it < end) {
        const int64_t e = it / H;
        const int h = (int)(it - e * H);
        while (a.rowptr[r + 1] <= e) ++r;
        ii[u] = it;
        const int64_t j = (int64_t)a.col[e];
        if constexpr (KIND == kAdd) {
          acc[u] = leaky_relu(to_float(a.q[r * H + h]) + to_float(a.k[j * H + h]),
                              a.slope);
        } else {
          acc[u] = score_part_global<KIND, T, VW>(
              a.q + r * HD + (int64_t)h * D, a.k + j * HD + (int64_t)h * D,
              a.att + (int64_t)h * D, D, lg * VW, G * VW, a.slope);
        }
      }
    }
#pragma unroll
    for (int u = 0; u < kUnroll; ++u) {
      const float s = KIND == kAdd ? acc[u] : group_sum(acc[u], G);
      if (lg == 0 && ii[u] >= 0) scores[ii[u]] = KIND == kDot ? s * a.scale : s;
    }
  }
}

// b. softmax + SpMM, a warp per segment.
template <typename T, typename I, bool VEC>
__global__ void __launch_bounds__(kThreads)
    pmf_softmax_spmm_kernel(FwdArgs<T, I> a, const float* __restrict__ scores,
                            const int64_t* __restrict__ seg_ptr,
                            const int64_t* __restrict__ slot_ptr,
                            float* __restrict__ part_acc,
                            float* __restrict__ part_ml, int64_t n_seg_bound) {
  constexpr int VW = Width<T, VEC>::kVW;
  constexpr int SLOTS = Width<T, VEC>::kSlots;
  extern __shared__ __align__(16) unsigned char smem[];
  const int H = a.H, F = a.F;
  const int warp = threadIdx.x / kWarpSize, lane = threadIdx.x % kWarpSize;
  // per warp: m [H] | l [H] | p [H][kTileEdges] | j [kTileEdges] (int64)
  const int per_warp_floats = ((2 * H + H * kTileEdges) + 1) & ~1;
  float* s_m = reinterpret_cast<float*>(smem) +
               (size_t)warp * (per_warp_floats + 2 * kTileEdges);
  float* s_l = s_m + H;
  float* s_p = s_l + H;
  int64_t* s_j = reinterpret_cast<int64_t*>(s_m + per_warp_floats);

  const int64_t seg = (int64_t)blockIdx.x * kWarps + warp;
  if (seg >= n_seg_bound || seg >= seg_ptr[a.n_dst]) return;
  const int64_t r = find_row(seg_ptr, a.n_dst, seg);
  const int64_t kseg = seg - seg_ptr[r];
  const int64_t nseg = seg_ptr[r + 1] - seg_ptr[r];
  const int64_t es = a.rowptr[r] + kseg * kSegEdges;
  const int64_t ee = es + kSegEdges < a.rowptr[r + 1] ? es + kSegEdges : a.rowptr[r + 1];
  const int n = ee > es ? (int)(ee - es) : 0;

  // pass 1: max and sum per head
  for (int h = 0; h < H; ++h) {
    float m = -INFINITY;
    for (int e = lane; e < n; e += kWarpSize)
      m = fmaxf(m, scores[(es + e) * H + h]);
    m = warp_max(m);
    float sum = 0.f;
    for (int e = lane; e < n; e += kWarpSize)
      sum += expf(scores[(es + e) * H + h] - m);
    sum = warp_sum(sum);
    if (lane == 0) s_m[h] = m, s_l[h] = sum;
  }
  __syncwarp();

  // pass 2: exp tiles in smem, SpMM
  const int64_t HF = (int64_t)H * F;
  const int slots = (int)(HF / VW);
  const int group = a.v_group;
  const int ls = lane % group, sub = lane / group;
  auto get_j = [&](int e) -> int64_t { return s_j[e]; };
  auto get_p = [&](int e, int h) -> float { return s_p[h * kTileEdges + e]; };
  for (int c0 = 0; c0 < slots; c0 += group * SLOTS) {
    float acc[SLOTS][VW];
    int hs[SLOTS];
#pragma unroll
    for (int s = 0; s < SLOTS; ++s) {
      hs[s] = min(H - 1, (c0 + ls + s * group) * VW / F);
#pragma unroll
      for (int i = 0; i < VW; ++i) acc[s][i] = 0.f;
    }
    for (int t0 = 0; t0 < n; t0 += kTileEdges) {
      const int tn = min(kTileEdges, n - t0);
      __syncwarp();
      for (int x = lane; x < tn * H; x += kWarpSize) {
        const int e = x / H, h = x - e * H;
        s_p[h * kTileEdges + e] = expf(scores[(es + t0 + e) * H + h] - s_m[h]);
      }
      if (lane < tn) s_j[lane] = (int64_t)a.col[es + t0 + lane];
      __syncwarp();
      spmm_accumulate<T, VW, SLOTS>(acc, a.v, HF, slots, c0, group, ls, sub, 0,
                                    tn, hs, get_j, get_p);
    }
    reduce_edge_groups<VW, SLOTS>(acc, group);
    if (sub == 0) {
#pragma unroll
      for (int s = 0; s < SLOTS; ++s) {
        const int sl = c0 + ls + s * group;
        if (sl < slots) {
          if (nseg == 1) {
            const float inv = 1.f / (s_l[hs[s]] + 1e-16f);
#pragma unroll
            for (int i = 0; i < VW; ++i) acc[s][i] *= inv;
            store_vec<T, VW>(a.out + r * HF + (int64_t)sl * VW, acc[s]);
          } else {
            float* dst = part_acc + (slot_ptr[r] + kseg) * HF + (int64_t)sl * VW;
#pragma unroll
            for (int i = 0; i < VW; ++i) dst[i] = acc[s][i];
          }
        }
      }
    }
  }
  if (lane < H) {
    const int h = lane;
    if (nseg == 1) {
      a.lse[r * H + h] = n > 0 ? s_m[h] + logf(s_l[h] + 1e-16f) : -INFINITY;
    } else {
      float* ml = part_ml + (slot_ptr[r] + kseg) * 2 * H;
      ml[h] = s_m[h];
      ml[H + h] = s_l[h];
    }
  }
  for (int h = kWarpSize + lane; h < H; h += kWarpSize) {  // H > 32
    if (nseg == 1) {
      a.lse[r * H + h] = n > 0 ? s_m[h] + logf(s_l[h] + 1e-16f) : -INFINITY;
    } else {
      float* ml = part_ml + (slot_ptr[r] + kseg) * 2 * H;
      ml[h] = s_m[h];
      ml[H + h] = s_l[h];
    }
  }
}

// c. merge the segments of rows longer than one segment; a warp per row.
template <typename T>
__global__ void __launch_bounds__(kThreads)
    pmf_combine_kernel(const int64_t* __restrict__ seg_ptr,
                       const int64_t* __restrict__ slot_ptr,
                       const float* __restrict__ part_acc,
                       const float* __restrict__ part_ml, T* __restrict__ out,
                       float* __restrict__ lse, int64_t n_dst, int H, int F) {
  const int warp = threadIdx.x / kWarpSize, lane = threadIdx.x % kWarpSize;
  const int64_t r = (int64_t)blockIdx.x * kWarps + warp;
  if (r >= n_dst) return;
  const int64_t nseg = seg_ptr[r + 1] - seg_ptr[r];
  if (nseg <= 1) return;
  const int64_t slot0 = slot_ptr[r];
  const int64_t HF = (int64_t)H * F;
  for (int64_t f = lane; f < HF; f += kWarpSize) {
    const int h = (int)(f / F);
    float M = -INFINITY;
    for (int64_t k = 0; k < nseg; ++k)
      M = fmaxf(M, part_ml[(slot0 + k) * 2 * H + h]);
    float L = 0.f, acc = 0.f;
    for (int64_t k = 0; k < nseg; ++k) {
      const float w = expf(part_ml[(slot0 + k) * 2 * H + h] - M);
      L = fmaf(part_ml[(slot0 + k) * 2 * H + H + h], w, L);
      acc = fmaf(part_acc[(slot0 + k) * HF + f], w, acc);
    }
    out[r * HF + f] = from_float<T>(acc / (L + 1e-16f));
    if (f - (int64_t)h * F == 0) lse[r * H + h] = M + logf(L + 1e-16f);
  }
}

// ============================================================= launch
// Everything the host entry decided; run_smmf<T> / run_pmf<T> (one
// instantiation per dtype and strategy, each in its own translation unit so
// they compile in parallel) dispatch index type / VEC / KIND.
struct Launch {
  at::Tensor rowptr, col, query, key, value, att, out, lse;
  int64_t kind, n_dst, n_edges, max_in_degree;
  int64_t H, D, F;
  int qk_group, v_group, rows, device_optin;
  int64_t windows_per_block;  // SMMF: row windows per block (1 = one each)
  int64_t stage_bytes;        // SMMF: smem for a window's K / V rows (0: off)
  bool vec;
  double scale, negative_slope;
};

template <typename Kernel>
void allow_smem(Kernel kernel, size_t bytes) {
  if (bytes > 48 * 1024)
    C10_CUDA_CHECK(cudaFuncSetAttribute(
        kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, (int)bytes));
}

template <typename scalar_t, typename index_t, bool VEC>
FwdArgs<scalar_t, index_t> make_args(const Launch& L) {
  FwdArgs<scalar_t, index_t> a;
  a.rowptr = L.rowptr.data_ptr<int64_t>();
  a.col = L.col.data_ptr<index_t>();
  a.q = L.query.data_ptr<scalar_t>();
  a.k = L.key.data_ptr<scalar_t>();
  a.v = L.value.data_ptr<scalar_t>();
  a.att = L.att.defined() ? L.att.data_ptr<scalar_t>() : nullptr;
  a.out = L.out.data_ptr<scalar_t>();
  a.lse = L.lse.data_ptr<float>();
  a.n_dst = L.n_dst;
  a.H = (int)L.H, a.D = (int)L.D, a.F = (int)L.F;
  a.qk_group = L.qk_group, a.v_group = L.v_group;
  a.scale = (float)L.scale, a.slope = (float)L.negative_slope;
  return a;
}

// SMMF (int32 col only: the host routes int64-indexed graphs to PMF).
template <typename scalar_t>
void run_smmf(const Launch& L) {
  using index_t = int32_t;
  TORCH_CHECK(L.col.scalar_type() == at::kInt,
              "fused_attention_fwd: SMMF needs int32 'col'");
  const int HD_q = L.kind == kAdd ? (int)L.H : (int)(L.H * L.D);
  const int HD_att = L.kind == kGatv2 ? (int)(L.H * L.D) : 0;
  const int64_t cap = L.rows * L.max_in_degree;
  const size_t bytes = smmf_layout(L.rows, cap, (int)L.H, HD_q, HD_att,
                                   sizeof(index_t), L.stage_bytes).total;
  const int64_t n_windows = (L.n_dst + L.rows - 1) / L.rows;
  const int wpb = (int)std::max<int64_t>(1, L.windows_per_block);
  const int64_t blocks = (n_windows + wpb - 1) / wpb;
  cudaStream_t stream = c10::cuda::getCurrentCUDAStream();
  PYG_DFGNN_DISPATCH_BOOL(L.vec, VEC, [&] {
    const auto a = make_args<scalar_t, index_t, VEC>(L);
    PYG_DFGNN_DISPATCH_KIND(L.kind, [&] {
      auto kernel = smmf_fwd_kernel<scalar_t, index_t, KIND, VEC>;
      allow_smem(kernel, bytes);
      kernel<<<(unsigned)blocks, kThreads, bytes, stream>>>(
          a, L.rows, (int)cap, wpb, (int)L.stage_bytes);
      C10_CUDA_KERNEL_LAUNCH_CHECK();
    });
  });
}

template <typename scalar_t>
void run_pmf(const Launch& L) {
  const int64_t n_dst = L.n_dst, n_edges = L.n_edges, H = L.H, F = L.F;
  cudaStream_t stream = c10::cuda::getCurrentCUDAStream();
  const auto fopts = L.value.options().dtype(at::kFloat);
  auto scores = at::empty({n_edges, H}, fopts);
  // Segments: ceil(deg / kSegEdges) per row (>= 1, empty rows write zeros);
  // rows of several segments get partial slots, merged by the combine kernel.
  auto deg = L.rowptr.slice(0, 1) - L.rowptr.slice(0, 0, n_dst);
  auto nseg = deg.add(kSegEdges - 1).div(kSegEdges, "floor").clamp_min(1);
  auto zero = at::zeros({1}, L.rowptr.options());
  auto seg_ptr = at::cat({zero, nseg.cumsum(0)});
  auto slot_ptr = at::cat(
      {zero, at::where(nseg > 1, nseg, at::zeros_like(nseg)).cumsum(0)});
  const int64_t seg_bound = n_dst + n_edges / kSegEdges + 1;
  const int64_t slot_bound = L.max_in_degree > kSegEdges
                                 ? 2 * (n_edges / kSegEdges) + 2 : 0;
  auto part_acc = at::empty({slot_bound, H * F}, fopts);
  auto part_ml = at::empty({slot_bound, 2 * H}, fopts);
  const size_t per_warp_floats = ((2 * H + H * kTileEdges) + 1) & ~1;
  const size_t bytes =
      (size_t)kWarps * (per_warp_floats + 2 * kTileEdges) * 4;
  TORCH_CHECK(bytes <= (size_t)L.device_optin,
              "fused_attention_fwd: too many heads (", H, ")");
  PYG_DFGNN_DISPATCH_INDEX(L.col.scalar_type(), "fused_attention_fwd", [&] {
    PYG_DFGNN_DISPATCH_BOOL(L.vec, VEC, [&] {
      const auto a = make_args<scalar_t, index_t, VEC>(L);
      if (n_edges > 0) {
        const int group = L.kind == kAdd ? 1 : L.qk_group;
        const int64_t items = n_edges * H;
        const int64_t items_per_warp =
            (int64_t)(kWarpSize / group) * kUnroll * 4;
        const int64_t warps = (items + items_per_warp - 1) / items_per_warp;
        const int64_t blocks = (warps + kWarps - 1) / kWarps;
        PYG_DFGNN_DISPATCH_KIND(L.kind, [&] {
          pmf_sddmm_kernel<scalar_t, index_t, KIND, VEC>
              <<<(unsigned)blocks, kThreads, 0, stream>>>(
                  a, scores.data_ptr<float>(), items_per_warp);
          C10_CUDA_KERNEL_LAUNCH_CHECK();
        });
      }
      auto kernel = pmf_softmax_spmm_kernel<scalar_t, index_t, VEC>;
      allow_smem(kernel, bytes);
      kernel<<<(unsigned)((seg_bound + kWarps - 1) / kWarps), kThreads, bytes,
               stream>>>(a, scores.data_ptr<float>(),
                         seg_ptr.data_ptr<int64_t>(),
                         slot_ptr.data_ptr<int64_t>(),
                         part_acc.data_ptr<float>(), part_ml.data_ptr<float>(),
                         seg_bound);
      C10_CUDA_KERNEL_LAUNCH_CHECK();
    });
  });
  if (L.max_in_degree > kSegEdges) {
    pmf_combine_kernel<scalar_t>
        <<<(unsigned)((n_dst + kWarps - 1) / kWarps), kThreads, 0, stream>>>(
            seg_ptr.data_ptr<int64_t>(), slot_ptr.data_ptr<int64_t>(),
            part_acc.data_ptr<float>(), part_ml.data_ptr<float>(),
            L.out.data_ptr<scalar_t>(), L.lse.data_ptr<float>(), n_dst,
            (int)H, (int)F);
    C10_CUDA_KERNEL_LAUNCH_CHECK();
  }
}

}  // namespace fwd
}  // namespace pyg_dfgnn

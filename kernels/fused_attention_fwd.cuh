// Forward kernels of the fused attention op: SDDMM -> edge softmax -> SpMM.
//
// One templated family: scalar_t (fp32/fp16/bf16, fp32 arithmetic) x index_t
// (int32/int64 col) x score KIND (dot/add/gatv2) x VEC (16-byte vectors or a
// scalar path for feature sizes that are not multiples of the vector width).
//
// SMMF (one kernel, node-parallel): a block owns a window of rows.
//   0. graph-aligned windows (DFGraph.row_windows: one small graph of a
//      batch, or several) stage their source rows of K and V in smem once;
//   1. rows go to warps dynamically; a warp walks its row in chunks of 32
//      edges: balanced SDDMM over the chunk's (edge, head) items (a group of
//      lanes per item), scores -> smem;
//   2. online (redundancy-free) softmax: lanes over the chunk's edges, exp
//      values overwrite the scores in smem, running max / sum per head;
//      lse = max + log(sum + 1e-16) -> global at the end of the row;
//   3. vectorized SpMM: lanes over 16-byte feature vectors (split over edges
//      too when H*F is short), 4 neighbours unrolled, earlier chunks'
//      partial sums rescaled by the new max.
// PMF (rows too long for SMMF's shared memory; any degree):
//   a. edge-parallel SDDMM -> scores [E, H] fp32 in global memory ('dot',
//      'gatv2' and attention weights; 'add' otherwise forms its scalar
//      scores in b., so that no [E, H] buffer exists);
//   b. softmax + SpMM, a warp per segment of <= kSegEdges edges of one row;
//      rows of one segment finish in place, longer rows write partial
//      (max, sum, unnormalised acc) per segment;
//   c. a combine kernel merges the segments of long rows (flash-decoding
//      style), so one node connected to all others still spreads over the GPU.
// Training features, in both strategies (runtime switches, warp-uniform):
//   edge terms (EdgeTerms, CSR order): es / ek read in the SDDMM, ev summed
//   in the SpMM as a second neighbour row; attention dropout: the exp values
//   are multiplied by the Philox mask after the row sum took them (lse stays
//   the undropped one); attention weights: the raw scores go to an [E, H]
//   fp32 buffer (PMF has it anyway) and alpha_kernel writes alpha in the
//   user's edge order once lse is known. Off, each costs a branch.
#include <c10/cuda/CUDAException.h>
#include <c10/cuda/CUDAStream.h>

#include <cmath>
#include <type_traits>

#include "common.cuh"
#include "ops.h"

namespace pyg_dfgnn {
namespace fwd {


constexpr int kWarps = 8;  // warps per block, both strategies
constexpr int kThreads = kWarps * kWarpSize;
constexpr int kUnroll = 4;       // independent items / neighbours in flight
constexpr int kSegEdges = 256;   // PMF: edges per segment (one warp)
constexpr int kTileEdges = 32;   // PMF: edges per exp tile in smem
constexpr int kRowChunk = 32;    // SMMF: edges per online-softmax chunk
constexpr int kSmmfMaxThreads = 1024;  // -> <= 64 registers per thread
constexpr int kSmmfStagedWarps = 32;  // SMMF block with staging (a window)
constexpr int kSmmfPlainWarps = 8;    // SMMF block without staging
constexpr int kSmmfPlainRows = 16;    // rows of such a block
constexpr int kSmmfMaxHeads = 128;    // SMMF's item -> (edge, head) split

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
  EdgeTerms<T> et;
  DropoutMask drop;
  float* __restrict__ scores;  // SMMF: raw scores [E, H] (nullptr: not kept)
  int64_t n_dst;
  int H, D, F;        // D: score feature size (1 for 'add')
  int qk_group;       // lanes per (edge, head) dot product (power of two)
  int v_group;        // lanes per row in the SpMM (power of two <= 32)
  float scale, slope;
};

// Same, query row read from global memory (PMF SDDMM).
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

// SpMM of one row: acc += sum_{e in [lo, hi)} p(e, head) * v_row(e) for this
// lane's feature vectors (slot c0 + ls + s * group). `row_of(e)` gives the
// value row of edge e (global or staged in shared memory). Lanes of one edge
// group (lane / group) take every `epar`-th edge; reduce_edge_groups sums them.
template <typename T, int VW, int SLOTS, typename RowOf, typename GetP>
__device__ __forceinline__ void spmm_accumulate(
    float (&acc)[SLOTS][VW], int slots, int c0, int group, int ls, int sub,
    int lo, int hi, const int (&hs)[SLOTS], RowOf row_of, GetP get_p) {
  const int epar = kWarpSize / group;
  int e = lo + sub;
  for (; e + (kUnroll - 1) * epar < hi; e += kUnroll * epar) {
    const T* rows[kUnroll];
#pragma unroll
    for (int u = 0; u < kUnroll; ++u) rows[u] = row_of(e + u * epar);
#pragma unroll
    for (int s = 0; s < SLOTS; ++s) {
      const int sl = c0 + ls + s * group;
      if (sl < slots) {
        float x[kUnroll][VW];
#pragma unroll
        for (int u = 0; u < kUnroll; ++u)
          load_vec<T, VW>(rows[u] + (int64_t)sl * VW, x[u]);
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
    const T* row = row_of(e);
#pragma unroll
    for (int s = 0; s < SLOTS; ++s) {
      const int sl = c0 + ls + s * group;
      if (sl < slots) {
        float x[VW];
        load_vec<T, VW>(row + (int64_t)sl * VW, x);
        const float p = get_p(e, hs[s]);
#pragma unroll
        for (int i = 0; i < VW; ++i) acc[s][i] = fmaf(p, x[i], acc[s][i]);
      }
    }
  }
}

// Shared memory of an SMMF block (byte offsets, 16-byte aligned):
// staged K rows [span][HD_k] T | staged V rows [span][H*F] T |
// att fp32 [HD_att] | block scalars | per warp: query row fp32 [HD_k] |
// p fp32 [H][kRowChunk] | m, l, corr fp32 [H] each | sources int32 [kRowChunk].
struct SmmfLayout {
  size_t v, att, scalars, warps, warp_bytes, total;
};
__host__ __device__ inline SmmfLayout smmf_layout(int span, int H, int HD_k,
                                                  int HF, int HD_att,
                                                  int warps, size_t elem) {
  SmmfLayout L;
  L.v = align16((size_t)span * HD_k * elem);
  L.att = align16(L.v + (size_t)span * HF * elem);
  L.scalars = align16(L.att + (size_t)HD_att * 4);
  L.warps = L.scalars + 16;
  L.warp_bytes =
      align16((size_t)(HD_k + H * kRowChunk + 3 * H + kRowChunk) * 4);
  L.total = L.warps + (size_t)warps * L.warp_bytes;
  return L;
}

// ============================================================= SMMF kernel
// Per-warp state of the SMMF row loop (shared memory scratch + constants).
struct SmmfWarp {
  float* q;   // query row, fp32 [HD_k] (query and key rows match)
  float* p;   // scores / exp values of the chunk [H][kRowChunk]
  float* m;   // running max [H]
  float* l;   // running sum [H]
  float* c;   // rescale factor of the last chunk [H]
  int* j;     // chunk sources, relative to the K / V base [kRowChunk]
};

// One warp, rows taken from `next` until `r_end`: chunks of kRowChunk edges,
// SDDMM -> online softmax -> SpMM. K / V rows of source j are at
// kb + (j - lo) * HD_k and vb + (j - lo) * H*F: shared memory for a staged
// window (OFF = int), global memory otherwise (OFF = int64_t, lo = 0).
template <typename T, int KIND, int VW, int SLOTS, typename OFF, bool FEAT>
__device__ __forceinline__ void smmf_rows(const FwdArgs<T, int32_t>& a,
                                          const SmmfWarp& w, int* next,
                                          int64_t r_begin, int64_t r_end,
                                          const T* kb, const T* vb, int lo,
                                          const float* att) {
  constexpr int C = kRowChunk;
  const int lane = threadIdx.x % kWarpSize;
  const int H = a.H, D = a.D, F = a.F;
  const int HD_k = KIND == kAdd ? H : H * D;
  const int HF = H * F;
  const int slots = HF / VW;
  const int group = a.v_group, ls = lane % group, sub = lane / group;
  // <= 8 lanes per (edge, head) item: 4+ items in flight per step, each
  // group reading 128 contiguous bytes of a K row (no bank conflicts)
  const int G = KIND == kAdd ? 1 : min(a.qk_group, 8), ng = kWarpSize / G;
  const int g = lane / G, lg = lane % G;
  const unsigned h_magic = ((1u << 20) + H - 1) / H;  // it / H, H <= 128

  auto v_row = [&](int e) -> const T* { return vb + (OFF)w.j[e] * HF; };
  auto get_p = [&](int e, int h) -> float { return w.p[h * C + e]; };
  uint64_t seed, offset;
  drop_begin<FEAT>(a.drop, seed, offset);

  for (;;) {
    int r = 0;
    if (lane == 0) r = atomicAdd(next, 1);
    r = __shfl_sync(kFullMask, r, 0);
    const int64_t row = r_begin + r;
    if (row >= r_end) break;
    const int64_t elo = a.rowptr[row], ehi = a.rowptr[row + 1];
    for (int i = lane; i < HD_k; i += kWarpSize)
      w.q[i] = to_float(a.q[row * HD_k + i]);

    // Feature passes of group * SLOTS vectors (one unless H*F is large);
    // each pass recomputes the scores.
    for (int c0 = 0; c0 < slots; c0 += group * SLOTS) {
      float acc[SLOTS][VW];
      int hs[SLOTS];
      begin_pass<VW, SLOTS>(acc, hs, c0, ls, group, H, F);
      __syncwarp();  // the previous pass has read l
      for (int h = lane; h < H; h += kWarpSize) w.m[h] = -INFINITY, w.l[h] = 0.f;

      for (int64_t cb = elo; cb < ehi; cb += C) {
        const int n = (int)(ehi - cb < C ? ehi - cb : C);
        __syncwarp();
        if (lane < n) w.j[lane] = a.col[cb + lane] - lo;
        __syncwarp();
        // SDDMM over the chunk's (edge, head) items, two per group in flight
        const int n_items = n * H;
        // raw scores for the attention weights: first feature pass only
        float* sc_out = c0 == 0 && (FEAT && a.scores != nullptr) ? a.scores + cb * H
                                                       : nullptr;
        if constexpr (KIND == kAdd) {
          for (int it = lane; it < n_items; it += kWarpSize) {
            const int e = (int)(((unsigned)it * h_magic) >> 20), h = it - e * H;
            float x = w.q[h] + to_float(kb[(OFF)w.j[e] * H + h]);
            if ((FEAT && a.et.es != nullptr)) x += to_float(a.et.es[(cb + e) * H + h]);
            const float sc = leaky_relu(x, a.slope);
            w.p[h * C + e] = sc;
            if (sc_out != nullptr) sc_out[it] = sc;
          }
        } else {
          // warp-uniform trip count: group8_sum shuffles across groups
          for (int it0 = 0; it0 < n_items; it0 += 2 * ng) {
            float part[2];
            int eh[2][2];
#pragma unroll
            for (int u = 0; u < 2; ++u) {
              const int it = it0 + u * ng + g;
              part[u] = 0.f;
              eh[u][0] = -1;
              if (it < n_items) {
                const int e = (int)(((unsigned)it * h_magic) >> 20);
                const int h = it - e * H;
                eh[u][0] = e, eh[u][1] = h;
                part[u] = score_part<KIND, T, VW>(
                    w.q + h * D, kb + (OFF)w.j[e] * HD_k + h * D, att + h * D,
                    D, lg * VW, G * VW, a.slope,
                    (FEAT && a.et.ek != nullptr) ? a.et.ek + (cb + e) * HD_k + h * D
                                       : nullptr);
              }
            }
#pragma unroll
            for (int u = 0; u < 2; ++u) {
              float sc = group8_sum(part[u], G);
              if constexpr (KIND == kDot) sc *= a.scale;
              if (lg == 0 && eh[u][0] >= 0) {
                if (KIND == kDot && (FEAT && a.et.es != nullptr))
                  sc += to_float(a.et.es[(cb + eh[u][0]) * H + eh[u][1]]);
                w.p[eh[u][1] * C + eh[u][0]] = sc;
                if (sc_out != nullptr) sc_out[eh[u][0] * H + eh[u][1]] = sc;
              }
            }
          }
        }
        __syncwarp();
        // online softmax: lanes over the chunk's edges, one head at a time
        for (int h = 0; h < H; ++h) {
          const float sc = lane < n ? w.p[h * C + lane] : -INFINITY;
          const float m_old = w.m[h];
          const float m_new = fmaxf(m_old, warp_max(sc));
          const float p = lane < n ? expf(sc - m_new) : 0.f;
          // the row sum takes p; the SpMM the dropped p / (1 - drop)
          if (lane < n)
            w.p[h * C + lane] = p * drop_factor<FEAT>(a.drop, seed, offset, cb + lane, h);
          const float sum = warp_sum(p);
          __syncwarp();
          if (lane == 0) {
            const float corr = expf(m_old - m_new);  // 0 on the first chunk
            w.l[h] = w.l[h] * corr + sum;
            w.m[h] = m_new;
            w.c[h] = corr;
          }
        }
        __syncwarp();
        // SpMM: rescale the partial sums, add this chunk
        if (cb != elo) {
#pragma unroll
          for (int s = 0; s < SLOTS; ++s) {
            const float corr = w.c[hs[s]];
#pragma unroll
            for (int i = 0; i < VW; ++i) acc[s][i] *= corr;
          }
        }
        spmm_accumulate<T, VW, SLOTS>(acc, slots, c0, group, ls, sub, 0, n, hs,
                                      v_row, get_p);
        if ((FEAT && a.et.ev != nullptr))  // the edges' value terms: rows in CSR order
          spmm_accumulate<T, VW, SLOTS>(
              acc, slots, c0, group, ls, sub, 0, n, hs,
              [&](int e) -> const T* { return a.et.ev + (cb + e) * HF; },
              get_p);
      }
      reduce_edge_groups<VW, SLOTS>(acc, group);
      __syncwarp();
      if (sub == 0) {
#pragma unroll
        for (int s = 0; s < SLOTS; ++s) {
          const int sl = c0 + ls + s * group;
          if (sl < slots) {
            const float inv = 1.f / (w.l[hs[s]] + 1e-16f);
#pragma unroll
            for (int i = 0; i < VW; ++i) acc[s][i] *= inv;
            store_vec<T, VW>(a.out + row * HF + (int64_t)sl * VW, acc[s]);
          }
        }
      }
    }
    for (int h = lane; h < H; h += kWarpSize)
      a.lse[row * H + h] =
          ehi > elo ? w.m[h] + logf(w.l[h] + 1e-16f) : -INFINITY;
    __syncwarp();  // the next row overwrites this warp's scratch
  }
}

// A block owns a window of rows: `windows[b] .. windows[b + 1]` (graph-aligned
// windows from DFGraph.row_windows: the sources of a small graph of a batch),
// or `rows_per_block` consecutive rows. With `stage_span` > 0 a window whose
// sources [lo, hi] number <= stage_span has its K and V rows copied to shared
// memory once, so each edge reads them there instead of from L2 (a 119-node
// graph's rows are reused by ~41 edges each); wider windows read global
// memory. Rows go to warps dynamically (smmf_rows). Any degree fits: nothing
// is sized by the row length.
template <typename T, int KIND, bool VEC, bool FEAT>
__global__ void __launch_bounds__(kSmmfMaxThreads)
    smmf_fwd_kernel(FwdArgs<T, int32_t> a, const int64_t* __restrict__ windows,
                    int rows_per_block, int stage_span) {
  constexpr int VW = Width<T, VEC>::kVW;
  constexpr int SLOTS = VEC ? (8 / VW > 1 ? 8 / VW : 1) : 2;
  extern __shared__ __align__(16) unsigned char smem[];
  const int H = a.H, D = a.D;
  const int HD_k = KIND == kAdd ? H : H * D;
  const int HF = H * a.F;
  const int n_warps = blockDim.x / kWarpSize;
  const SmmfLayout L = smmf_layout(stage_span, H, HD_k, HF,
                                   KIND == kGatv2 ? H * D : 0, n_warps,
                                   sizeof(T));
  T* s_k = reinterpret_cast<T*>(smem);
  T* s_v = reinterpret_cast<T*>(smem + L.v);
  float* s_att = reinterpret_cast<float*>(smem + L.att);
  int* s_next = reinterpret_cast<int*>(smem + L.scalars);
  int* s_lo = s_next + 1;  // [lo, hi] of the window's sources (two ints)

  const int tid = threadIdx.x, warp = tid / kWarpSize;
  int64_t r_begin, r_end;
  if (windows != nullptr) {
    r_begin = windows[blockIdx.x];
    r_end = windows[blockIdx.x + 1];
  } else {
    r_begin = (int64_t)blockIdx.x * rows_per_block;
    r_end = r_begin + rows_per_block < a.n_dst ? r_begin + rows_per_block
                                                : a.n_dst;
  }
  if (tid == 0) {
    s_next[0] = 0;
    s_lo[0] = INT32_MAX;
    s_lo[1] = -1;
  }
  if constexpr (KIND == kGatv2)
    for (int i = tid; i < H * D; i += blockDim.x) s_att[i] = to_float(a.att[i]);

  // ---- stage the window's source rows of K and V
  bool staged = false;
  int src_lo = 0;
  if (stage_span > 0) {
    const int n_src = block_index_span(a.col, a.rowptr[r_begin],
                                       a.rowptr[r_end], s_lo, src_lo);
    if (n_src > 0 && n_src <= stage_span) {
      staged = true;
      copy_to_smem<T, (KIND == kAdd ? 1 : VW)>(
          s_k, a.k + (int64_t)src_lo * HD_k, n_src * HD_k);
      copy_to_smem<T, VW>(s_v, a.v + (int64_t)src_lo * HF, n_src * HF);
    }
  }
  __syncthreads();

  float* base = reinterpret_cast<float*>(smem + L.warps + warp * L.warp_bytes);
  SmmfWarp w;
  w.q = base;
  w.p = w.q + HD_k;
  w.m = w.p + H * kRowChunk;
  w.l = w.m + H;
  w.c = w.l + H;
  w.j = reinterpret_cast<int*>(w.c + H);
  if (staged)
    smmf_rows<T, KIND, VW, SLOTS, int, FEAT>(a, w, s_next, r_begin, r_end, s_k, s_v,
                                       src_lo, s_att);
  else
    smmf_rows<T, KIND, VW, SLOTS, int64_t, FEAT>(a, w, s_next, r_begin, r_end, a.k,
                                           a.v, 0, s_att);
}

// ============================================================= PMF kernels

// a. edge-parallel SDDMM: scores[e, h] for all edges.
template <typename T, typename I, int KIND, bool VEC, bool FEAT>
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
          float x = to_float(a.q[r * H + h]) + to_float(a.k[j * H + h]);
          if ((FEAT && a.et.es != nullptr)) x += to_float(a.et.es[it]);
          acc[u] = leaky_relu(x, a.slope);
        } else {
          acc[u] = score_part_global<KIND, T, VW>(
              a.q + r * HD + (int64_t)h * D, a.k + j * HD + (int64_t)h * D,
              a.att + (int64_t)h * D, D, lg * VW, G * VW, a.slope,
              (FEAT && a.et.ek != nullptr) ? a.et.ek + it * D : nullptr);
        }
      }
    }
#pragma unroll
    for (int u = 0; u < kUnroll; ++u) {
      const float s = KIND == kAdd ? acc[u] : group_sum(acc[u], G);
      if (lg == 0 && ii[u] >= 0) {
        float sc = KIND == kDot ? s * a.scale : s;
        if (KIND == kDot && (FEAT && a.et.es != nullptr))
          sc += to_float(a.et.es[ii[u]]);
        scores[ii[u]] = sc;
      }
    }
  }
}

// b. softmax + SpMM, a warp per segment. ADD_SCORES: 'add' scores computed
// here (a scalar op per edge and head, the same as the SDDMM's) instead of
// read from an [E, H] buffer that then never exists.
template <typename T, typename I, bool VEC, bool FEAT, bool ADD_SCORES>
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
  auto score = [&](int64_t e, int h) -> float {
    if constexpr (ADD_SCORES) {
      float x = to_float(a.q[r * H + h]) +
                to_float(a.k[(int64_t)a.col[e] * H + h]);
      if ((FEAT && a.et.es != nullptr)) x += to_float(a.et.es[e * H + h]);
      return leaky_relu(x, a.slope);
    } else {
      return scores[e * H + h];
    }
  };

  // pass 1: max and sum per head
  for (int h = 0; h < H; ++h) {
    float m = -INFINITY;
    for (int e = lane; e < n; e += kWarpSize)
      m = fmaxf(m, score(es + e, h));
    m = warp_max(m);
    float sum = 0.f;
    for (int e = lane; e < n; e += kWarpSize)
      sum += expf(score(es + e, h) - m);
    sum = warp_sum(sum);
    if (lane == 0) s_m[h] = m, s_l[h] = sum;
  }
  __syncwarp();

  // pass 2: exp tiles in smem, SpMM
  const int64_t HF = (int64_t)H * F;
  const int slots = (int)(HF / VW);
  const int group = a.v_group;
  const int ls = lane % group, sub = lane / group;
  auto v_row = [&](int e) -> const T* { return a.v + s_j[e] * HF; };
  auto get_p = [&](int e, int h) -> float { return s_p[h * kTileEdges + e]; };
  uint64_t seed, offset;
  drop_begin<FEAT>(a.drop, seed, offset);
  for (int c0 = 0; c0 < slots; c0 += group * SLOTS) {
    float acc[SLOTS][VW];
    int hs[SLOTS];
    begin_pass<VW, SLOTS>(acc, hs, c0, ls, group, H, F);
    for (int t0 = 0; t0 < n; t0 += kTileEdges) {
      const int tn = min(kTileEdges, n - t0);
      __syncwarp();
      for (int x = lane; x < tn * H; x += kWarpSize) {
        const int e = x / H, h = x - e * H;
        s_p[h * kTileEdges + e] =
            expf(score(es + t0 + e, h) - s_m[h]) *
            drop_factor<FEAT>(a.drop, seed, offset, es + t0 + e, h);
      }
      if (lane < tn) s_j[lane] = (int64_t)a.col[es + t0 + lane];
      __syncwarp();
      spmm_accumulate<T, VW, SLOTS>(acc, slots, c0, group, ls, sub, 0, tn, hs,
                                    v_row, get_p);
      if ((FEAT && a.et.ev != nullptr))
        spmm_accumulate<T, VW, SLOTS>(
            acc, slots, c0, group, ls, sub, 0, tn, hs,
            [&](int e) -> const T* { return a.et.ev + (es + t0 + e) * HF; },
            get_p);
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

// ============================================================= weights
// alpha(e, h) = exp(s_eh - lse_row) (times the dropout factor when the
// weights are returned after dropout, GAT's convention), written to row
// perm[e] (the user's edge order; identity without perm). A thread per edge.
template <typename T, typename I>
__global__ void __launch_bounds__(kThreads)
    alpha_kernel(const int64_t* __restrict__ rowptr, int64_t n_dst,
                 const float* __restrict__ scores,
                 const float* __restrict__ lse, const I* __restrict__ perm,
                 DropoutMask drop, T* __restrict__ alpha, int64_t n_edges,
                 int H) {
  const int64_t e = (int64_t)blockIdx.x * blockDim.x + threadIdx.x;
  if (e >= n_edges) return;
  uint64_t seed, offset;
  drop.begin(seed, offset);
  const int64_t r = find_row(rowptr, n_dst, e);
  const int64_t dst = perm != nullptr ? (int64_t)perm[e] : e;
  for (int h = 0; h < H; ++h)
    alpha[dst * H + h] = from_float<T>(
        expf(scores[e * H + h] - lse[r * H + h]) *
        drop.factor(seed, offset, e, h));
}

// ============================================================= launch
// Everything the host entry decided; run_smmf<T> / run_pmf<T> (one
// instantiation per dtype and strategy, each in its own translation unit so
// they compile in parallel) dispatch index type / VEC / KIND.
struct Launch {
  at::Tensor rowptr, col, query, key, value, att, out, lse;
  at::Tensor windows;  // SMMF: int64 [W + 1] row windows (undefined: plain)
  at::Tensor edge_score, edge_key, edge_value;  // CSR order (or undefined)
  at::Tensor alpha;       // [E, H] attention weights (undefined: not asked)
  at::Tensor alpha_perm;  // CSR edge -> row of alpha (undefined: identity)
  bool alpha_dropped;     // alpha after dropout (GAT) or before
  DropoutMask drop;
  // any of the above: the kernels instantiated with the features
  bool features() const {
    return edge_score.defined() || edge_key.defined() ||
           edge_value.defined() || alpha.defined() || drop.active;
  }
  int64_t kind, n_dst, n_edges, max_in_degree;
  int64_t H, D, F;
  int qk_group, v_group, device_optin;
  int64_t stage_span;  // SMMF: source rows staged per window (0: none)
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
  auto ptr = [](const at::Tensor& t) -> const scalar_t* {
    return t.defined() ? t.data_ptr<scalar_t>() : nullptr;
  };
  a.att = ptr(L.att);
  a.out = L.out.data_ptr<scalar_t>();
  a.lse = L.lse.data_ptr<float>();
  a.et = {ptr(L.edge_score), ptr(L.edge_key), ptr(L.edge_value)};
  a.drop = L.drop;
  a.scores = nullptr;
  a.n_dst = L.n_dst;
  a.H = (int)L.H, a.D = (int)L.D, a.F = (int)L.F;
  a.qk_group = L.qk_group, a.v_group = L.v_group;
  a.scale = (float)L.scale, a.slope = (float)L.negative_slope;
  return a;
}

// Shared memory of an SMMF launch (host side of smmf_layout).
inline SmmfLayout smmf_launch_layout(const Launch& L, int64_t span,
                                     int warps) {
  const int HD = (int)(L.H * L.D);
  const int HD_k = L.kind == kAdd ? (int)L.H : HD;
  return smmf_layout((int)span, (int)L.H, HD_k, (int)(L.H * L.F),
                     L.kind == kGatv2 ? HD : 0, warps,
                     L.value.element_size());
}

// The attention weights from the raw scores, once lse is final.
template <typename scalar_t>
void run_alpha(const Launch& L, const at::Tensor& scores) {
  if (!L.alpha.defined() || L.n_edges == 0) return;
  DropoutMask drop = L.drop;
  drop.active = drop.active && L.alpha_dropped;
  drop.saved = drop.save;  // written by the forward kernel
  const auto perm_type = L.alpha_perm.defined() ? L.alpha_perm.scalar_type()
                                                : at::kLong;
  PYG_DFGNN_DISPATCH_INDEX(perm_type, "fused_attention_fwd", [&] {
    alpha_kernel<scalar_t, index_t>
        <<<(unsigned)((L.n_edges + kThreads - 1) / kThreads), kThreads, 0,
           c10::cuda::getCurrentCUDAStream()>>>(
            L.rowptr.data_ptr<int64_t>(), L.n_dst, scores.data_ptr<float>(),
            L.lse.data_ptr<float>(),
            L.alpha_perm.defined() ? L.alpha_perm.data_ptr<index_t>()
                                   : nullptr,
            drop, L.alpha.data_ptr<scalar_t>(), L.n_edges, (int)L.H);
    C10_CUDA_KERNEL_LAUNCH_CHECK();
  });
}

// SMMF (int32 col only: the host routes int64-indexed graphs to PMF).
template <typename scalar_t>
void run_smmf(const Launch& L) {
  using index_t = int32_t;
  TORCH_CHECK(L.col.scalar_type() == at::kInt,
              "fused_attention_fwd: SMMF needs int32 'col'");
  const bool windowed = L.windows.defined();
  const int warps = windowed ? kSmmfStagedWarps : kSmmfPlainWarps;
  const int64_t span = windowed ? L.stage_span : 0;
  const size_t bytes = smmf_launch_layout(L, span, warps).total;
  const int64_t blocks = windowed
                             ? L.windows.numel() - 1
                             : (L.n_dst + kSmmfPlainRows - 1) / kSmmfPlainRows;
  if (blocks <= 0) return;
  cudaStream_t stream = c10::cuda::getCurrentCUDAStream();
  at::Tensor scores;  // raw scores, only for the attention weights
  if (L.alpha.defined())
    scores = at::empty({L.n_edges, L.H}, L.value.options().dtype(at::kFloat));
  PYG_DFGNN_DISPATCH_BOOL(L.vec, VEC, [&] {
    auto a = make_args<scalar_t, index_t, VEC>(L);
    if (scores.defined()) a.scores = scores.data_ptr<float>();
    PYG_DFGNN_DISPATCH_KIND(L.kind, [&] {
     PYG_DFGNN_DISPATCH_BOOL(L.features(), FEAT, [&] {
      auto kernel = smmf_fwd_kernel<scalar_t, KIND, VEC, FEAT>;
      allow_smem(kernel, bytes);
      kernel<<<(unsigned)blocks, warps * kWarpSize, bytes, stream>>>(
          a, windowed ? L.windows.data_ptr<int64_t>() : nullptr,
          kSmmfPlainRows, (int)span);
      C10_CUDA_KERNEL_LAUNCH_CHECK();
     });
    });
  });
  run_alpha<scalar_t>(L, scores);
}

template <typename scalar_t>
void run_pmf(const Launch& L) {
  const int64_t n_dst = L.n_dst, n_edges = L.n_edges, H = L.H, F = L.F;
  cudaStream_t stream = c10::cuda::getCurrentCUDAStream();
  const auto fopts = L.value.options().dtype(at::kFloat);
  // 'add' without attention weights: no scores buffer (E * H * 4 bytes,
  // 3.7 GB at full Reddit size with 8 heads); the softmax kernel forms them.
  const bool add_scores = L.kind == kAdd && !L.alpha.defined();
  auto scores = add_scores ? at::Tensor() : at::empty({n_edges, H}, fopts);
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
      if (n_edges > 0 && !add_scores) {
        const int group = L.kind == kAdd ? 1 : L.qk_group;
        const int64_t items = n_edges * H;
        const int64_t items_per_warp =
            (int64_t)(kWarpSize / group) * kUnroll * 4;
        const int64_t warps = (items + items_per_warp - 1) / items_per_warp;
        const int64_t blocks = (warps + kWarps - 1) / kWarps;
        PYG_DFGNN_DISPATCH_KIND(L.kind, [&] {
         PYG_DFGNN_DISPATCH_BOOL(L.features(), FEAT, [&] {
          pmf_sddmm_kernel<scalar_t, index_t, KIND, VEC, FEAT>
              <<<(unsigned)blocks, kThreads, 0, stream>>>(
                  a, scores.data_ptr<float>(), items_per_warp);
          C10_CUDA_KERNEL_LAUNCH_CHECK();
         });
        });
      }
     PYG_DFGNN_DISPATCH_BOOL(L.features(), FEAT, [&] {
      PYG_DFGNN_DISPATCH_BOOL(add_scores, ADD_SCORES, [&] {
      auto kernel =
          pmf_softmax_spmm_kernel<scalar_t, index_t, VEC, FEAT, ADD_SCORES>;
      allow_smem(kernel, bytes);
      kernel<<<(unsigned)((seg_bound + kWarps - 1) / kWarps), kThreads, bytes,
               stream>>>(a, add_scores ? nullptr : scores.data_ptr<float>(),
                         seg_ptr.data_ptr<int64_t>(),
                         slot_ptr.data_ptr<int64_t>(),
                         part_acc.data_ptr<float>(), part_ml.data_ptr<float>(),
                         seg_bound);
      C10_CUDA_KERNEL_LAUNCH_CHECK();
      });
     });
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
  run_alpha<scalar_t>(L, scores);
}

}  // namespace fwd
}  // namespace pyg_dfgnn

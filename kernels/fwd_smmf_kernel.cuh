// SMMF forward kernel (see fwd_common.cuh): a block per graph-aligned row
// window (or per kSmmfPlainRows rows), its source rows of K and V staged in
// shared memory once; a warp per row at a time, chunks of kRowChunk edges:
// balanced SDDMM -> online softmax -> vectorized SpMM.
#pragma once

#include "fwd_common.cuh"
#include "row_tiles.cuh"

namespace pyg_dfgnn {
namespace fwd {

// Shared memory of an SMMF block (byte offsets, 16-byte aligned):
// staged K rows [span][HD_k] T | staged V rows [span][H*F] T |
// att fp32 [HD_att] | block scalars | per warp: query row fp32 [HD_k] |
// p fp32 [H][kRowChunk] | sources int32 [kRowChunk] | m, l, corr fp32 [H]
// each (the query row padded to 4 floats: p and the sources 16-byte
// aligned for every kind, read 4 edges at a time).
// Floats of the per-warp query row: HD_k padded to 4 ('add' has HD_k = H).
__host__ __device__ constexpr int smmf_q_floats(int HD_k) {
  return (HD_k + 3) & ~3;
}

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
      align16((size_t)(smmf_q_floats(HD_k) + H * kRowChunk + 3 * H +
                       kRowChunk) * 4);
  L.total = L.warps + (size_t)warps * L.warp_bytes;
  return L;
}

// Per-warp state of the SMMF row loop (shared memory scratch + constants).
struct SmmfWarp {
  float* q;   // query row, fp32 [HD_k] (query and key rows match)
  float* p;   // scores / exp values of the chunk [H][kRowChunk]
  int* j;     // chunk sources, relative to the K / V base [kRowChunk]
  float* m;   // running max [H]
  float* l;   // running sum [H]
  float* c;   // rescale factor of the last chunk [H]
};

// The SpMM of a chunk where a row is exactly one vector per lane (H * F =
// 32 VW: one pass, one slot, every lane on each edge): the sources and
// weights of 4 edges at a time in one int4 / float4 read each, instead of
// one broadcast read per edge for each (at 1 x 128 the SpMM's reads of p
// and j were a third of its shared-memory instructions). p and j 16-byte
// aligned.
template <typename T, int VW, int SLOTS, typename OFF>
__device__ __forceinline__ void spmm_one_slot(float (&acc)[SLOTS][VW],
                                              const SmmfWarp& w, const T* vb,
                                              int lane, int h, int n) {
  const T* vl = vb + lane * VW;
  const float* ph = w.p + h * kRowChunk;
  int e = 0;
  for (; e + 3 < n; e += 4) {
    const int4 j4 = *reinterpret_cast<const int4*>(w.j + e);
    float x[4][VW];
    load_vec<T, VW>(vl + (OFF)j4.x * (kWarpSize * VW), x[0]);
    load_vec<T, VW>(vl + (OFF)j4.y * (kWarpSize * VW), x[1]);
    load_vec<T, VW>(vl + (OFF)j4.z * (kWarpSize * VW), x[2]);
    load_vec<T, VW>(vl + (OFF)j4.w * (kWarpSize * VW), x[3]);
    const float4 p4 = *reinterpret_cast<const float4*>(ph + e);
#pragma unroll
    for (int i = 0; i < VW; ++i) {
      acc[0][i] = fmaf(p4.x, x[0][i], acc[0][i]);
      acc[0][i] = fmaf(p4.y, x[1][i], acc[0][i]);
      acc[0][i] = fmaf(p4.z, x[2][i], acc[0][i]);
      acc[0][i] = fmaf(p4.w, x[3][i], acc[0][i]);
    }
  }
  for (; e < n; ++e) {
    float x[VW];
    load_vec<T, VW>(vl + (OFF)w.j[e] * (kWarpSize * VW), x);
    const float p = ph[e];
#pragma unroll
    for (int i = 0; i < VW; ++i) acc[0][i] = fmaf(p, x[i], acc[0][i]);
  }
}

// One warp, rows taken from `next` until `r_end`: chunks of kRowChunk edges,
// SDDMM -> online softmax -> SpMM. K / V rows of source j are at
// kb + (j - lo) * HD_k and vb + (j - lo) * H*F: shared memory for a staged
// window (OFF = int), global memory otherwise (OFF = int64_t, lo = 0).
template <typename T, int KIND, int VW, int SLOTS, typename OFF, int FEAT,
          bool LANES>
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
  // SDDMM with the four-feature lanes (feature_lanes.cuh) where the row
  // fits them, else lane groups per (edge, head) item. fp32 always; half
  // precision (8-byte reads) only in the LANES kernels, which the host
  // picks for dense graphs: the path's code costs the other kernels
  // registers (sparse graphs +3-13 %, NOTES "Session 26").
  constexpr int FV = kLaneFeatures;
  const int L = D / FV;
  const bool feature_lanes = (std::is_same_v<T, float> || LANES) && VW > 1 &&
                             KIND != kAdd && feature_lanes_fit(HD_k, D);

  // a value row of one vector per lane (p / j aligned for 4-edge reads)
  const bool one_slot = slots == kWarpSize;
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
        float* sc_out =
            c0 == 0 && kHasWeights<FEAT> && a.scores != nullptr
                ? a.scores + cb * H
                : nullptr;
        if constexpr (KIND == kAdd) {
          for (int it = lane; it < n_items; it += kWarpSize) {
            const int e = (int)(((unsigned)it * h_magic) >> 20), h = it - e * H;
            float x = w.q[h] + to_float(kb[(OFF)w.j[e] * H + h]);
            if (kHasScore<FEAT> && a.et.es != nullptr)
              x += to_float(a.et.es[(cb + e) * H + h]);
            const float sc = leaky_relu(x, a.slope);
            w.p[h * C + e] = sc;
            if (sc_out != nullptr) sc_out[it] = sc;
          }
        } else if (feature_lanes) {
          // Lanes over the key row (four features each: H * D = 128),
          // the query (and att) vector in registers, eight edges' partial
          // scores per lane summed over the head's L lanes by a transposing
          // butterfly: no query re-read per item (a third of this loop's
          // shared-memory reads), 6-9 shuffles per 8 edges.
          float qv[FV], av[FV];
          load_smem<FV>(w.q + lane * FV, qv);
          if constexpr (KIND == kGatv2) load_smem<FV>(att + lane * FV, av);
          const int h = lane / L;
          for (int e0 = 0; e0 < n; e0 += 8) {
            float v[8];
            int4 j4;  // 4 edges' sources per read (w.j 16-byte aligned)
#pragma unroll
            for (int b = 0; b < 8; ++b) {
              v[b] = 0.f;
              const int e = e0 + b;
              if (b % 4 == 0) j4 = *reinterpret_cast<const int4*>(w.j + e);
              const int jb = b % 4 == 0 ? j4.x : b % 4 == 1 ? j4.y
                           : b % 4 == 2 ? j4.z : j4.w;
              if (e < n) {
                float kx[FV];
                load_vec<T, FV>(kb + (OFF)jb * HD_k + lane * FV, kx);
                if (kHasEdgeKV<FEAT> && a.et.ek != nullptr)
                  add_vec<T, FV>(a.et.ek + (cb + e) * HD_k + lane * FV, kx);
                v[b] = score_vec<KIND, FV>(qv, kx, av, a.slope, v[b]);
              }
            }
            const int k = transpose_sum<8>(v, L);
            const int eb = e0 + transpose_item<8>(lane, L);
#pragma unroll
            for (int i = 0; i < 2; ++i) {
              const int e = eb + i;
              if (i < k && transpose_writer<8>(lane, L) && e < n) {
                float sc = v[i];
                if constexpr (KIND == kDot) {
                  sc *= a.scale;
                  if (kHasScore<FEAT> && a.et.es != nullptr)
                    sc += to_float(a.et.es[(cb + e) * H + h]);
                }
                w.p[h * C + e] = sc;
                if (sc_out != nullptr) sc_out[e * H + h] = sc;
              }
            }
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
                    (kHasEdgeKV<FEAT> && a.et.ek != nullptr)
                        ? a.et.ek + (cb + e) * HD_k + h * D
                        : nullptr);
              }
            }
#pragma unroll
            for (int u = 0; u < 2; ++u) {
              float sc = group8_sum(part[u], G);
              if constexpr (KIND == kDot) sc *= a.scale;
              if (lg == 0 && eh[u][0] >= 0) {
                if (KIND == kDot && (kHasScore<FEAT> && a.et.es != nullptr))
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
            w.p[h * C + lane] =
                p * drop_factor<FEAT>(a.drop, seed, offset, cb + lane, h);
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
        if (one_slot)
          spmm_one_slot<T, VW, SLOTS, OFF>(acc, w, vb, lane, hs[0], n);
        else
          spmm_accumulate<T, VW, SLOTS>(acc, slots, c0, group, ls, sub, 0, n,
                                        hs, v_row, get_p);
        // the edges' value terms: rows in CSR order
        if (kHasEdgeKV<FEAT> && a.et.ev != nullptr)
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
template <typename T, int KIND, bool VEC, int FEAT, bool LANES>
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
  w.p = w.q + smmf_q_floats(HD_k);
  w.j = reinterpret_cast<int*>(w.p + H * kRowChunk);
  w.m = reinterpret_cast<float*>(w.j + kRowChunk);
  w.l = w.m + H;
  w.c = w.l + H;
  if (staged)
    smmf_rows<T, KIND, VW, SLOTS, int, FEAT, LANES>(
        a, w, s_next, r_begin, r_end, s_k, s_v, src_lo, s_att);
  else
    smmf_rows<T, KIND, VW, SLOTS, int64_t, FEAT, LANES>(
        a, w, s_next, r_begin, r_end, a.k, a.v, 0, s_att);
}

}  // namespace fwd
}  // namespace pyg_dfgnn

// Raw edge attributes with a matrix M_i per row (TransformerConv's edge
// terms, M_i = scale Theta_e^T q_i) and x rows in vectors: a warp per row
// whose lanes form groups of G, one CSR edge per group, each lane kVW
// columns of the edge's x row (so a group reads the row as one contiguous
// range, 32 / G edges per warp step). The lanes-over-edges row kernel
// (edge_rows_kernel) read whole x rows per lane and its sums put lanes over
// the H * De outputs with scalar loads; it stays for H > 8 and rows that do
// not come in vectors.
//   dots     per-lane partial products, summed over the group by shuffles
//   sums     per-lane [H][kVW] accumulators, summed over the warp's groups
//            once at the end of the row
//   scatter  a lane's kVW columns of sum_h w'_h M_ih, one vector store
// Self-loops as in the row kernel: the loop's dot is the mean / sum of the
// others' (or <M_i, fill_row>), its weight is handed to the others.
#pragma once

#include "edge_attr_common.cuh"

namespace pyg_dfgnn {
namespace edge_rows {

// The group width for De columns: the fewest lanes that cover the row in
// vectors of kVW, a power of two (0: the rows are too wide for one warp).
__host__ __device__ __forceinline__ int edge_group_lanes(int De) {
  int g = 1;
  while (g * kVW < De) g <<= 1;
  return g <= kWarpSize ? g : 0;
}

// Sums of v[N] over the lanes that differ only in the lane bits o_lo ..
// o_hi (powers of two; none if o_hi < o_lo), transposed: each step halves
// the values a lane keeps (lanes with bit o set keep the upper half) and
// adds its partner's. Lane l ends with held(N, B) values from
// first(...) on (B = the number of bits): when 2^B <= N, N / 2^B of them,
// the lane's bits c (o_hi .. o_lo read as a number) giving v[c * N / 2^B
// ..]; else one, v[c / (2^B / N)], in v[0] after plain butterflies over
// the lanes that share it. ~N shuffles where a butterfly per value takes
// N * B.
template <int N>
__device__ __forceinline__ void transposed_sums(float (&v)[N], int o_hi,
                                                int o_lo, int lane) {
  int o = o_hi;
#pragma unroll
  for (int n = N; n > 1; n >>= 1) {
    if (o < o_lo) return;  // (warp-uniform)
    const bool upper = (lane & o) != 0;
#pragma unroll
    for (int i = 0; i < n / 2; ++i) {
      const float send = upper ? v[i] : v[i + n / 2];
      const float keep = upper ? v[i + n / 2] : v[i];
      v[i] = keep + __shfl_xor_sync(kFullMask, send, o);
    }
    o >>= 1;
  }
  for (; o >= o_lo; o >>= 1) v[0] += __shfl_xor_sync(kFullMask, v[0], o);
}

// What a lane holds after transposed_sums over `count` = 2^B lanes with
// c = its bits as a number: `held` values from v index `first` of the
// original N; `writer`: the one lane of those that share them.
struct Held {
  int held, first;
  bool writer;
};
__device__ __forceinline__ Held held_sums(int N, int count, int c) {
  const bool many = count <= N;
  const int held = many ? N / count : 1;
  const int share = many ? 1 : count / N;  // lanes per value
  return {held, many ? c * held : c / share, (c & (share - 1)) == 0};
}

// SUMS: sums (and maybe scatter), no dots; else dots and / or scatter --
// the [MAXH][kVW] accumulators and the dots' registers are never live
// together (the host takes dots with sums to the row kernel).
template <typename T, int MAXH, bool SUMS>
__global__ void __launch_bounds__(kThreads, SUMS && MAXH > 4 ? 3 : 4)
    edge_groups_kernel(Args<T> a, int G) {
  static_assert(kVW == 4, "the group kernel reads M in float4");
  const bool dots = !SUMS && a.dots != nullptr;
  __shared__ __align__(16) float s_m[kWarps][kEdgeRowsMaxHD];
  __shared__ float s_wl[kWarps][2 * kEdgeRowsMaxHeads];
  __shared__ float s_fill[kEdgeRowsMaxHD];
  const int H = a.H, De = a.De;
  if (a.fill == 3)
    for (int i = threadIdx.x; i < De; i += kThreads)
      s_fill[i] = to_float(a.fill_row[i]);
  __syncthreads();
  const int warp = threadIdx.x / kWarpSize, lane = threadIdx.x % kWarpSize;
  const int64_t row = (int64_t)blockIdx.x * kWarps + warp;
  if (row >= a.n_rows) return;
  float* m = s_m[warp];
  float* wl = s_wl[warp];
  const RowStart rs = begin_row(a, row, lane, m, wl);
  const int64_t lo = rs.lo, hi = rs.hi, loop_p = rs.loop_p;

  // (G is a power of two: masks and shifts, not integer division, in the
  // per-edge code)
  const int gmask = G - 1, slots = kWarpSize / G, slot = lane >> (__ffs(G) - 1);
  const int lg = lane & gmask;
  const int col = lg * kVW;  // this lane's first column
  const bool has_col = col < De;
  // the dots' M slice of this lane in registers for the row, up to 4
  // heads (per edge, the shared-memory reads of M were a quarter of the
  // kernel's instructions; 8 heads' slices would spill)
  constexpr int kRegH = !SUMS && MAXH <= 4 ? MAXH : 1;
  float mr[kRegH][kVW];
#pragma unroll
  for (int h = 0; h < kRegH; ++h)
#pragma unroll
    for (int i = 0; i < kVW; ++i)
      mr[h][i] = dots && h < H && has_col ? m[h * De + col + i] : 0.f;
  // the heads whose dots this lane holds after their group sums
  const Held hd = held_sums(MAXH, G, lg);
  float dsum[MAXH];  // the row's dots (for its loop), per held head
  // sums: acc[h * kVW + i] (head h, column col + i)
  constexpr int kAcc = SUMS ? MAXH * kVW : 1;
  float acc[kAcc];
#pragma unroll
  for (int h = 0; h < MAXH; ++h) dsum[h] = 0.f;
#pragma unroll
  for (int j = 0; j < kAcc; ++j) acc[j] = 0.f;

  for (int64_t b = lo; b < hi; b += slots) {  // (warp-uniform)
    const int64_t p = b + slot;
    int64_t r = a.n_in;  // past the row: like the loop, nothing to do
    if (p < hi) r = a.index != nullptr ? a.index[p] : p;
    const bool live = r < a.n_in;  // (group-uniform)
    float xv[kVW];
#pragma unroll
    for (int i = 0; i < kVW; ++i) xv[i] = 0.f;
    if (live && has_col) load_vec<T, kVW>(a.x + r * De + col, xv);
    if (dots) {
      float part[MAXH];
#pragma unroll
      for (int h = 0; h < MAXH; ++h) {
        float4 mv = make_float4(0.f, 0.f, 0.f, 0.f);
        if constexpr (kRegH == MAXH)
          mv = make_float4(mr[h][0], mr[h][1], mr[h][2], mr[h][3]);
        else if (h < H && has_col)
          mv = *reinterpret_cast<const float4*>(m + h * De + col);
        part[h] = fmaf(mv.x, xv[0], fmaf(mv.y, xv[1],
                  fmaf(mv.z, xv[2], mv.w * xv[3])));
      }
      // the group's sums, transposed: lane lg keeps heads hd.first + i
      transposed_sums<MAXH>(part, G >> 1, 1, lane);
      if (live && hd.writer)
#pragma unroll
        for (int i = 0; i < MAXH; ++i)
          if (i < hd.held && hd.first + i < H) {
            a.dots[p * H + hd.first + i] = from_float<T>(part[i]);
            dsum[i] += part[i];
          }
    }
    if (SUMS || a.scatter != nullptr) {
      float wv[MAXH];
#pragma unroll
      for (int h = 0; h < MAXH; ++h)
        wv[h] = live && h < H ? to_float(a.w[p * H + h]) + wl[h] : 0.f;
      if constexpr (SUMS) {
#pragma unroll
        for (int h = 0; h < MAXH; ++h)
#pragma unroll
          for (int i = 0; i < kVW; ++i)
            acc[h * kVW + i] = fmaf(wv[h], xv[i], acc[h * kVW + i]);
      }
      if (a.scatter != nullptr && live && has_col) {
        // g += w'_h M_h over the heads: M's slice in shared memory
        float g[kVW] = {0.f, 0.f, 0.f, 0.f};
        auto add_term = [&](int h, float wt, const float* mm) {
          const float4 mv = *reinterpret_cast<const float4*>(mm + h * De + col);
          g[0] = fmaf(wt, mv.x, g[0]);
          g[1] = fmaf(wt, mv.y, g[1]);
          g[2] = fmaf(wt, mv.z, g[2]);
          g[3] = fmaf(wt, mv.w, g[3]);
        };
#pragma unroll
        for (int h = 0; h < MAXH; ++h)
          if (h < H) add_term(h, wv[h], m);
        if (a.m2 != nullptr)  // (the second term: after M in shared m)
#pragma unroll
          for (int h = 0; h < MAXH; ++h)
            if (h < H)
              add_term(h,
                       to_float(a.w2[p * H + h]) + wl[kEdgeRowsMaxHeads + h],
                       m + H * De);
        store_vec<T, kVW>(a.scatter + r * De + col, g);
      }
    }
  }

  if (dots && loop_p >= 0) {
    if (a.fill == 3) {
      write_loop_dots(a, m, s_fill, rs, dsum, lane);
    } else {  // the row's dots summed over the slots, per held head
#pragma unroll
      for (int i = 0; i < MAXH; ++i)
        for (int o = G; o < kWarpSize; o <<= 1)
          dsum[i] += __shfl_xor_sync(kFullMask, dsum[i], o);
      if (slot == 0 && hd.writer)
#pragma unroll
        for (int i = 0; i < MAXH; ++i)
          if (i < hd.held && hd.first + i < H)
            a.dots[loop_p * H + hd.first + i] =
                from_float<T>(dsum[i] * rs.share);
    }
  }

  if constexpr (SUMS) {
    if (a.sums == nullptr) return;
    // over the slots, transposed: lane (lg, slot) keeps hs.held of its
    // column group's H x kVW sums
    transposed_sums<kAcc>(acc, kWarpSize >> 1, G, lane);
    const Held hs = held_sums(kAcc, slots, slot);
    if (!has_col || !hs.writer) return;
#pragma unroll
    for (int k = 0; k < kAcc; ++k) {
      if (k >= hs.held) break;
      const int j = hs.first + k, h = j / kVW, i = j % kVW;
      if (h >= H) break;
      float v = acc[k];
      if (a.fill == 3 && loop_p >= 0)
        v = fmaf(to_float(a.w[loop_p * H + h]), s_fill[col + i], v);
      a.sums[row * H * De + h * De + col + i] = v;
    }
  }
}

}  // namespace edge_rows
}  // namespace pyg_dfgnn

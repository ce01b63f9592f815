// GAT's edge term from raw edge attributes inside the short cols pass
// (bwd_short_kernel.cuh): es_ph = <M_h, x_p> with one M [H, De] (the
// attention vector folded into lin_edge), x_p the user's edge_attr row of
// CSR edge p (EdgeAttrGrad in bwd_common.cuh). The cols pass forms each
// edge's ds = d es anyway; here it also forms
//   d x_p = sum_h ds'_ph M_h      (lanes over the step's two edges and x's
//                                  columns; each head's ds by a shuffle)
//   d M_h += ds'_ph x_p           (the head's lanes over x's columns, in
//                                  registers; per-block partials at the end)
// with ds' = ds + the row's loop d es times its share (PyG's 'mean' / 'sum'
// fill of the self-loop's attributes; row_terms_kernel, after the rows
// pass).
// Before, the cols pass wrote d es [E, H] (scattered by the CSC order) and
// two edge-parallel kernels read it back with x (loop weights, shared_grad:
// gat-edge's backward +0.39 ms over plain GAT's in session 17).
// Deterministic: each row of x is read by one CSR edge, the d M partials are
// summed in a fixed order.
#pragma once

#include <limits>

#include "bwd_short_kernel.cuh"

namespace pyg_dfgnn {
namespace bwd {

constexpr int kEaXW = 4;         // x elements per d M vector (De % 4 == 0)
constexpr int kEaMaxChunks = 1;  // d M vectors per lane
constexpr int kEaMaxOuts = 4;    // d x columns per lane per step
constexpr int kEaMaxHeads = 16;  // (kEdgeRowsMaxHeads)

// Host: whether the fused cols pass takes edge attributes of De columns
// (`aligned`: x's rows start on kEaXW-element boundaries) with `lanes` lanes
// per owner and G lanes per head; otherwise the host forms d es and the
// edge_attr_rows kernels take it.
inline bool short_edge_attr_fits(int64_t H, int64_t De, int64_t n_in,
                                 int lanes, int G, bool aligned) {
  // (x's offsets in int32)
  if (De < 1 || De % kEaXW != 0 || !aligned || lanes < 2 ||
      H > kEaMaxHeads || H * De > kEdgeRowsMaxHD ||
      n_in * De > std::numeric_limits<int32_t>::max())
    return false;
  const int64_t chunks = (De / kEaXW + G - 1) / G;
  const int64_t outs = (De + lanes / 2 - 1) / (lanes / 2);
  return chunks <= kEaMaxChunks && outs <= kEaMaxOuts;
}

// Per CSC entry: the row of x its CSR edge reads, -1 for a row's loop
// (index[p] >= n_in), in int32 (the host checks n_in). Formed once per
// backward so that the cols pass reads it with its other per-entry indices:
// perm -> index -> x was one dependent load more per step of a
// latency-bound walk (session 18: 1.81 ms against 0.58 without the edge
// attributes).
template <typename I>
__global__ void __launch_bounds__(256)
    x_row_kernel(const int64_t* __restrict__ index,
                 const I* __restrict__ perm, int64_t n_edges,
                 int64_t n_in, int32_t* __restrict__ out) {
  const int64_t e = (int64_t)blockIdx.x * blockDim.x + threadIdx.x;
  if (e >= n_edges) return;
  const int64_t p = (int64_t)perm[e];
  const int64_t r = index != nullptr ? index[p] : p;
  out[e] = r < n_in ? (int32_t)r : -1;
}

// Per (row i, head): (D_i, the d es of the row's self-loop L times the
// share each of the row's other edges takes: 1 / count for 'mean', 1 for
// 'sum'; 0 without a loop or loop_pos) -- the loop's d es from the rows
// pass's ebuf and D_i as the cols pass forms it. One 8-byte load per edge
// in the cols pass for both. Thread per (row, head).
template <int KIND>
__global__ void __launch_bounds__(256)
    row_terms_kernel(const float2* __restrict__ ebuf,
                     const float* __restrict__ drow,
                     const int64_t* __restrict__ rowptr,
                     const int64_t* __restrict__ loop_pos, int64_t n_rows,
                     int H, int fill, float slope,
                     float2* __restrict__ out) {
  const int64_t t = (int64_t)blockIdx.x * blockDim.x + threadIdx.x;
  if (t >= n_rows * H) return;
  const int64_t row = t / H;
  const int h = (int)(t % H);
  const int64_t lp = loop_pos != nullptr ? loop_pos[row] : -1;
  float v = 0.f;
  if (lp >= 0) {
    const int64_t count = rowptr[row + 1] - rowptr[row] - 1;
    const float share =
        fill == 1 ? (count > 0 ? 1.f / (float)count : 0.f) : 1.f;
    const float2 pt = ebuf[lp * H + h];
    const ItemP ip = unpack_item_p<KIND>(pt.x);
    float ds = pt.y - ip.p * drow[t];
    if (ip.negative) ds *= slope;
    v = ds * share;
  }
  out[t] = make_float2(drow[t], v);
}

// The short cols pass of 'add' (shapes: short_rows.cuh; kernel contract:
// short_cols_bwd_kernel's) with the edge attributes' gradients instead of
// d es. Every lane walks the warp's longest owner (the shuffles need all).
// (MINB: blocks per SM it is held to; 75 registers at MAXH 8 left 3)
template <typename T, typename I, int VW, int FEAT, int MAXH, int MINB>
__global__ void __launch_bounds__(kShortThreads, MINB)
    short_cols_edge_attr_kernel(BwdArgs<T, I> a, int lanes) {
  static_assert(kHasScore<FEAT>, "edge attributes: an edge-score level");
  constexpr int kWarps = kShortThreads / kWarpSize;
  __shared__ float s_m[kEdgeRowsMaxHD];
  __shared__ float s_dm[kWarps][kEdgeRowsMaxHD];
  const EdgeAttrGrad<T> ea = a.ea;
  const int H = a.H, F = a.F, HF = H * F, De = ea.De, HD = H * De;
  for (int i = threadIdx.x; i < HD; i += blockDim.x)
    s_m[i] = to_float(ea.m[i]);
  __syncthreads();
  const OwnerLane o = owner_lane<VW>(lanes, a.n_owner, H, F);
  const int lane = threadIdx.x % kWarpSize, warp = threadIdx.x / kWarpSize;
  const int li = lane % lanes, base = lane - li;
  const int G = o.G, g = li % G;
  const bool holds = li * VW < HF;  // this lane has a head (owner or not)
  const int h = holds ? li / G : 0;
  // d x layout: edge u_dx of the step, columns d0 + k half (M's column d0
  // in registers)
  const int half = lanes / 2, u_dx = li / half, d0 = li % half;
  const int outs = (De + half - 1) / half;
  float m_col[MAXH];
#pragma unroll
  for (int hh = 0; hh < MAXH; ++hh)
    m_col[hh] = hh < H && d0 < De ? s_m[hh * De + d0] : 0.f;
  const int64_t col = o.owner;
  const int64_t elo = o.has ? a.ptr[col] : 0;
  const int64_t ehi = o.has ? a.ptr[col + 1] : 0;
  const unsigned steps =
      __reduce_max_sync(kFullMask, (unsigned)((ehi - elo + 1) / 2));
  float gv[VW], gk = 0.f, cell[kEaMaxChunks][kEaXW];
#pragma unroll
  for (int i = 0; i < VW; ++i) gv[i] = 0.f;
#pragma unroll
  for (int k = 0; k < kEaMaxChunks; ++k)
#pragma unroll
    for (int i = 0; i < kEaXW; ++i) cell[k][i] = 0.f;
  const float keep_scale = a.drop.active ? a.drop.keep_scale : 1.f;
  const T* o_lane = a.nbr_b + o.c0;
  // base pointers (issue-bound: 32x32-bit wide products per edge)
  const float2* ebuf_lane = a.ebuf + h;
  const float2* terms_lane = ea.row_terms + h;
  const T* x_lane = ea.x + g * kEaXW;
  T* dx_lane = ea.dx + d0;
  for (unsigned st = 0; st < steps; ++st) {
    const int64_t e = elo + 2 * (int64_t)st;
    const bool one = e < ehi, two = e + 1 < ehi;
    const I i0 = one ? a.idx[e] : 0, i1 = two ? a.idx[e + 1] : i0;
    const I c0 = one ? a.perm[e] : 0, c1 = two ? a.perm[e + 1] : c0;
    // the edges' rows of x (-1: no edge, or the row's loop)
    const int32_t r[2] = {one ? ea.x_row[e] : -1, two ? ea.x_row[e + 1] : -1};
    float ds[2] = {0.f, 0.f};
    if (o.on && one) {
      // every load of the step issued before any is used, no branch among
      // them (the walk is latency-bound; the compiler sank a second edge's
      // loads behind its `two` test): ebuf, D, the loop's handed d es, dO,
      // x's first vector of this lane's head (columns g kEaXW ..); a
      // missing second edge reads the first's and adds nothing
      const float2 pt[2] = {ebuf_lane[(int64_t)c0 * H],
                            ebuf_lane[(int64_t)c1 * H]};
      // (D_i, the loop's handed d es)
      const float2 dh[2] = {terms_lane[(int64_t)i0 * H],
                            terms_lane[(int64_t)i1 * H]};
      float ox[2][VW], xv[2][kEaXW];
      load_vec<T, VW>(o_lane + (int64_t)i0 * HF, ox[0]);
      load_vec<T, VW>(o_lane + (int64_t)i1 * HF, ox[1]);
      const int c = g * kEaXW;
#pragma unroll
      for (int u = 0; u < 2; ++u) {
#pragma unroll
        for (int i = 0; i < kEaXW; ++i) xv[u][i] = 0.f;
        if (r[u] >= 0 && c < De)
          load_vec<T, kEaXW>(x_lane + r[u] * De, xv[u]);
      }
#pragma unroll
      for (int u = 0; u < 2; ++u) {
        const bool here = u == 0 || two;
        const ItemP ip = unpack_item_p<kAdd>(pt[u].x);
        float dz = pt[u].y - ip.p * dh[u].x;
        float pv = !kHasDropout<FEAT> ? ip.p
                   : ip.dropped      ? 0.f
                                     : ip.p * keep_scale;
        pv = here ? pv : 0.f;
#pragma unroll
        for (int i = 0; i < VW; ++i) gv[i] = fmaf(pv, ox[u][i], gv[i]);
        dz = ip.negative ? dz * a.slope : dz;  // leaky'(z), as the rows
        dz = here ? dz : 0.f;                  // pass saw z
        gk += dz;
        ds[u] = r[u] >= 0 ? dz + dh[u].y : 0.f;
      }
      // d M cells: x's vectors g, g + G, ... of this lane's head
#pragma unroll
      for (int u = 0; u < 2; ++u)
#pragma unroll
        for (int i = 0; i < kEaXW; ++i)
          cell[0][i] = fmaf(ds[u], xv[u][i], cell[0][i]);
#pragma unroll
      for (int k = 1; k < kEaMaxChunks; ++k) {
        const int ck = (g + k * G) * kEaXW;
        if (ck >= De) break;
#pragma unroll
        for (int u = 0; u < 2; ++u) {
          if (r[u] < 0) continue;
          float xk[kEaXW];
          load_vec<T, kEaXW>(ea.x + r[u] * De + ck, xk);
#pragma unroll
          for (int i = 0; i < kEaXW; ++i)
            cell[k][i] = fmaf(ds[u], xk[i], cell[k][i]);
        }
      }
    }
    // d x of the step's two edges: lane (u_dx, d0) sums every head's ds of
    // edge u_dx (lane g of head hh holds ds[g], G >= 2; with one lane a
    // head, both) times M's column d0 (in registers), then d0 + half, ...
    const int32_t rx = u_dx == 0 ? r[0] : r[1];
    const bool put = ea.dx != nullptr && rx >= 0;
    // (k: the lane's k-th column; every lane of the warp calls it; heads
    // past H shuffle a lane of no head -- maybe another owner's -- and add
    // nothing, without a branch)
    auto column = [&](int k) -> float {
      const int dd = min(d0 + k * half, De - 1);  // (past De: not stored)
      // every head's ds of edge u_dx, in order (d(hh) for hh < MAXH)
      auto sum = [&](auto&& d) -> float {
        float acc = 0.f;
        if (H == MAXH) {  // (warp-uniform; no head to mask)
#pragma unroll
          for (int hh = 0; hh < MAXH; ++hh)
            acc = fmaf(d(hh), k == 0 ? m_col[hh] : s_m[hh * De + dd], acc);
        } else {
#pragma unroll
          for (int hh = 0; hh < MAXH; ++hh) {
            const float v = d(hh);
            acc = fmaf(hh < H ? v : 0.f,
                       k == 0 ? m_col[hh] : s_m[min(hh, H - 1) * De + dd],
                       acc);
          }
        }
        return acc;
      };
      if (G >= 2) {  // (warp-uniform)
        const float mine = (g & 1) != 0 ? ds[1] : ds[0];
        return sum([&](int hh) {
          return __shfl_sync(kFullMask, mine,
                             (base + hh * G + u_dx) & (kWarpSize - 1));
        });
      }
      return sum([&](int hh) {
        const int src = (base + hh) & (kWarpSize - 1);
        const float a0 = __shfl_sync(kFullMask, ds[0], src);
        const float a1 = __shfl_sync(kFullMask, ds[1], src);
        return u_dx == 0 ? a0 : a1;
      });
    };
    const float acc0 = column(0);
    if (put && d0 < De) dx_lane[rx * De] = from_float<T>(acc0);
    for (int k = 1; k < outs; ++k) {  // (De > lanes / 2; warp-uniform)
      const float acc = column(k);
      if (put && d0 + k * half < De)
        dx_lane[rx * De + k * half] = from_float<T>(acc);
    }
  }
  if (o.on) {
    store_vec<T, VW>(a.grad_b + col * HF + o.c0, gv);
    if (o.c0 % F == 0) a.grad_a[col * H + h] = from_float<T>(gk);
  }
  // d M: the warp's owners summed by shuffles, the block's warps through
  // shared memory in a fixed order
#pragma unroll
  for (int k = 0; k < kEaMaxChunks; ++k)
#pragma unroll
    for (int i = 0; i < kEaXW; ++i)
      for (int off = lanes; off < kWarpSize; off <<= 1)
        cell[k][i] += __shfl_xor_sync(kFullMask, cell[k][i], off);
  if (lane < lanes && holds) {
#pragma unroll
    for (int k = 0; k < kEaMaxChunks; ++k) {
      const int c = (g + k * G) * kEaXW;
      if (c >= De) break;
#pragma unroll
      for (int i = 0; i < kEaXW; ++i) s_dm[warp][h * De + c + i] = cell[k][i];
    }
  }
  __syncthreads();
  for (int t = threadIdx.x; t < HD; t += blockDim.x) {
    float s = 0.f;
#pragma unroll
    for (int w = 0; w < kWarps; ++w) s += s_dm[w][t];
    ea.dm_part[(int64_t)blockIdx.x * HD + t] = s;
  }
}

}  // namespace bwd
}  // namespace pyg_dfgnn

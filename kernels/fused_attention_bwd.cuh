// Fused backward of the attention op: device code and typed host launch,
// instantiated per dtype by fused_attention_bwd{,_f16,_bf16}.cu (so the
// three compile in parallel).
//
//   p_ij = exp(s_ij - lse_i)   dp_ij = <dO_i, v_j>   t_ij = p_ij dp_ij
//   D_i  = sum_j t_ij          ds_ij = p_ij (dp_ij - D_i) = t_ij - p_ij D_i
//
// Rows pass (CSR, owner = destination i, one kernel): per edge the SDDMM
// recompute of s_ij and dp_ij (two dot products), (p, t) -> ebuf [E, H]
// (float2), and in the same sweep
//   A_i = sum_j t_ij g_ij,  B_i = sum_j p_ij g_ij   ->   dQ_i = A_i - D_i B_i
// with g_ij = scale k_j (dot), att * leaky'(q_i + k_j) (gatv2) or
// leaky'(z_ij) (add: a scalar per head). D_i is summed in fp32 from the
// same p and dp (not <dO_i, O_i> from a rounded output), and goes to drow.
// Cols pass (CSC, owner = source j, one kernel): per edge (p, t) =
// ebuf[csc_perm], ds = t - p D_i, then
//   dK_j = sum_i ds_ij g_ij (g with q_i),  dV_j = sum_i p_ij dO_i,
//   d att += ds_ij leaky(z_ij) (gatv2: per-block partials, summed by host).
// No dot products there, no atomics anywhere: deterministic.
//
// Training features (runtime switches, as in the forward):
//   edge terms: es / ek join the score recompute in both passes, ev the
//   dp_ij = <dO_i, v_j + ev_ij> of the rows pass; their gradients are
//   per-edge products the cols pass forms anyway -- d es = ds leaky'(z)
//   ('add') or ds ('dot'),
//   d ek = scale ds q_i (dot) or ds att leaky'(z) (gatv2), d ev = p' dO_i --
//   written by it to the edge's CSR row (TransformerConv's ek = ev: one
//   gradient, both terms in the dV slots);
//   dropout: the rows pass regenerates the mask factor f (0 or 1 / (1 - p))
//   from the forward's Philox (seed, offset): dp' = f dp, p' = f p, and
//   stores (f == 0 ? -p : p, t) in ebuf, so the cols pass reads the mask
//   from the sign instead of recomputing it;
//   attention weights with a gradient (alpha returned by the forward):
//   dp' += g_alpha (times f when alpha was returned after dropout).
//
// Memory: only lse [N_dst, H] comes from the forward; ebuf is E * H * 8
// bytes, transient, never E * F. Lean mode (ebuf above a size limit, see
// run_passes): no ebuf; the cols pass recomputes p, t (and the dropout
// mask) per edge from Q, dO (staged with the window), its owner's K and V
// rows and lse -- the rows pass's two dot products once more -- and the
// rows pass recomputes its items in every feature pass.
//
// Both passes have the forward SMMF's structure: a block per graph-aligned
// window (DFGraph.row_windows / col_windows), whose neighbour rows (K, V for
// the rows pass; Q, dO and D for the cols pass) are staged in shared memory
// once, or per kPlainOwners consecutive owners reading global memory; owners
// go to warps dynamically; a warp walks its owner in chunks of kChunk edges:
// items (edge, head) over lane groups, then the feature accumulation with
// lanes over 16-byte vectors and edges split over lane groups. A super node
// is one warp's long walk (no per-row limit).
#pragma once

#include <ATen/cuda/CUDAContext.h>
#include <c10/cuda/CUDAStream.h>

#include <algorithm>
#include <cstdlib>

#include "common.cuh"

namespace pyg_dfgnn {
namespace bwd {

constexpr int kChunk = 32;         // edges per chunk (items in smem)
constexpr int kStagedWarps = 32;   // warps of a staged (windowed) block
constexpr int kPlainWarps = 8;     // warps of a plain block
constexpr int kPlainOwners = 16;   // owners of a plain block
constexpr int kMaxThreads = 1024;  // -> <= 64 registers per thread
constexpr int kMaxHeads = 128;     // item -> (edge, head) magic split
constexpr int kSegEdges = 256;     // plain blocks: edges per segment of a
                                   // long owner (partials + combine)
constexpr int kUnrollRows = 4;     // neighbour rows in flight per lane
constexpr int kUnrollCols = 2;     // (cols: two vectors per edge live)

template <typename T, typename I>
struct BwdArgs {
  const int64_t* __restrict__ ptr;  // rowptr (rows pass) | colptr (cols)
  const I* __restrict__ idx;        // col | csc_row
  const I* __restrict__ perm;       // cols: CSR edge id of each CSC entry
  const T* __restrict__ own_a;      // rows: query | cols: key
  const T* __restrict__ own_b;      // rows: grad_out | cols: unused
  const T* __restrict__ nbr_a;      // rows: key | cols: query
  const T* __restrict__ nbr_b;      // rows: value | cols: grad_out
  const T* __restrict__ att;        // gatv2 [H, D]
  const float* __restrict__ lse;    // [N_dst, H]
  EdgeTerms<T> et;                  // CSR order (nullptr: absent)
  DropoutMask drop;
  const T* __restrict__ galpha;     // rows: [E, H] in the order of aperm
  const I* __restrict__ aperm;      // CSR edge -> row of galpha (or null)
  bool galpha_dropped;              // alpha was returned after dropout
  T* __restrict__ g_es;             // cols: d edge_score [E, H]
  T* __restrict__ g_ek;             // cols: d edge_key [E, H, D]
  T* __restrict__ g_ev;             // cols: d edge_value [E, H, F]
  bool ekv_shared;                  // 'dot' with ek == ev: one gradient
  float* __restrict__ drow;         // [N_dst, H]: rows writes, cols reads
  float2* __restrict__ ebuf;        // [E, H] (p, t); nullptr: lean mode
  T* __restrict__ grad_a;           // rows: grad_query | cols: grad_key
  T* __restrict__ grad_b;           // cols: grad_value
  float* __restrict__ att_part;     // cols, gatv2: [blocks, H * D]
  // Plain blocks of a graph with long owners: the units of work are
  // segments of <= kSegEdges edges (seg_ptr [n_owner + 1]); an owner of
  // several writes partial sums to part[slot_ptr[owner] + k] (rows: A, B
  // [HD_k] each and D [H]; cols: dK [HD_k], dV [HF]), combined by
  // bwd_combine_kernel. seg_ptr == nullptr: one unit per owner.
  const int64_t* __restrict__ seg_ptr;
  const int64_t* __restrict__ slot_ptr;
  float* __restrict__ part;
  int64_t n_owner;
  int H, D, F;      // D: score vector length (1 for 'add')
  int item_group;   // lanes per item's dot products (power of two <= 8)
  int group;        // lanes per owner row in the accumulation (<= 32)
  float scale, slope;
};

// Shared memory of a block (byte offsets, 16-byte aligned):
// staged a rows [span][HD_k] T | staged b rows [span][HF] T |
// cols: staged D [span][H] fp32 | att fp32 [HD_att] | block scalars |
// per warp: rows: q [HD_k], dO [HF], lse / D / A / B [4][H], p / t / g
//           [3][H][kChunk] fp32; cols: key row [HD_k], d att partial
//           [HD_att], d a_src [H], p / ds [2][H][kChunk] fp32, lean:
//           value row [HF];
//           both: neighbour and edge ids int64 [2][kChunk].
// Rows of the per-warp scratch start 16-byte aligned (float4 reads).
__host__ __device__ inline size_t pad4(int floats) {
  return ((size_t)floats + 3) & ~(size_t)3;
}
struct BwdLayout {
  size_t b, r, att, scalars, warps, warp_bytes, total;
};
__host__ __device__ inline BwdLayout bwd_layout(bool cols, int kind,
                                                int span, int H, int HD_k,
                                                int HF, int HD_att, int warps,
                                                size_t elem,
                                                bool lean = false) {
  BwdLayout L;
  L.b = align16((size_t)span * HD_k * elem);
  L.r = align16(L.b + (size_t)span * HF * elem);
  L.att = align16(L.r + (cols ? (size_t)span * H * 4 : 0));
  L.scalars = align16(L.att + (size_t)HD_att * 4);
  L.warps = L.scalars + 16;
  // (the key row only for gatv2 / 'add'; A, B and t * leaky' only 'add')
  const bool add = kind == kAdd;
  const size_t floats =
      cols ? (kind == kDot && !lean ? 0 : pad4(HD_k)) + pad4(HD_att) +
                 (lean ? pad4(H + 2 * H * kChunk) + pad4(HF)
                       : H + 2 * (size_t)H * kChunk)
           : pad4(HD_k) + pad4(HF) + (add ? 4 : 2) * (size_t)H +
                 (add ? 3 : 2) * (size_t)H * kChunk;
  L.warp_bytes = align16(floats * 4) + 2 * kChunk * sizeof(int64_t);
  L.total = L.warps + (size_t)warps * L.warp_bytes;
  return L;
}

struct WarpScratch {
  float* own;     // rows: query row | cols: key row (gatv2, add, lean)
  float* own2;    // rows: grad_out row | cols: d att partial (gatv2)
  float* hv;      // per head: rows lse, D, A, B | cols d a_src
  float* p;       // [H][kChunk] p (rows 'add': p * leaky')
  float* t;       // [H][kChunk] rows: t | cols: ds (times leaky' for 'add')
  float* g;       // [H][kChunk] rows 'add': t * leaky'
  float* vown;    // cols, lean: value row
  int64_t* j;     // [kChunk] neighbour, relative to the staged base
  int64_t* e;     // [kChunk] cols: CSR edge id
};

// The edges [elo, ehi) of work unit u: owner u, or a segment of a long
// owner (see BwdArgs::seg_ptr); slot >= 0: write partial sums there.
struct Unit {
  int64_t owner, elo, ehi, slot;
};
template <typename T, typename I>
__device__ __forceinline__ Unit unit_of(const BwdArgs<T, I>& a, int64_t u) {
  Unit x;
  if (a.seg_ptr == nullptr) {
    x.owner = u, x.elo = a.ptr[u], x.ehi = a.ptr[u + 1], x.slot = -1;
    return x;
  }
  const int64_t o = find_row(a.seg_ptr, a.n_owner, u);
  const int64_t k = u - a.seg_ptr[o];
  x.owner = o;
  x.elo = a.ptr[o] + k * kSegEdges;
  x.ehi = min(x.elo + kSegEdges, a.ptr[o + 1]);
  x.slot = a.seg_ptr[o + 1] - a.seg_ptr[o] > 1 ? a.slot_ptr[o] + k : -1;
  return x;
}

// Lanes (sub, ls): ls over the owner's feature vectors (slot c0 + ls + s *
// group), sub over the chunk's edges (every epar-th). `body(e, s, sl, x)`
// gets the VW elements of slot sl of edge e's neighbour row (`ptr_of(e,
// sl)`); UNROLL rows are loaded before they are used.
template <typename T, int VW, int SLOTS, int UNROLL, typename PtrOf,
          typename Body>
__device__ __forceinline__ void for_chunk_vectors(int n, int slots, int c0,
                                                  int group, int ls, int sub,
                                                  PtrOf ptr_of, Body body) {
  const int epar = kWarpSize / group;
  int e = sub;
  for (; e + (UNROLL - 1) * epar < n; e += UNROLL * epar) {
#pragma unroll
    for (int s = 0; s < SLOTS; ++s) {
      const int sl = c0 + ls + s * group;
      if (sl < slots) {
        float x[UNROLL][VW];
#pragma unroll
        for (int u = 0; u < UNROLL; ++u)
          load_vec<T, VW>(ptr_of(e + u * epar, sl), x[u]);
#pragma unroll
        for (int u = 0; u < UNROLL; ++u) body(e + u * epar, s, sl, x[u]);
      }
    }
  }
  for (; e < n; e += epar) {
#pragma unroll
    for (int s = 0; s < SLOTS; ++s) {
      const int sl = c0 + ls + s * group;
      if (sl < slots) {
        float x[VW];
        load_vec<T, VW>(ptr_of(e, sl), x);
        body(e, s, sl, x);
      }
    }
  }
}

// ============================================================ rows pass
// Owners = destination rows [r_begin, r_end) taken from `next`; K / V rows
// of source j at kb + (j - lo) * HD_k, vb + (j - lo) * HF.
template <typename T, typename I, int KIND, int VW, int SLOTS, typename OFF,
          bool FEAT>
__device__ __forceinline__ void rows_pass(const BwdArgs<T, I>& a,
                                          const WarpScratch& w, int* next,
                                          int64_t r_begin, int64_t r_end,
                                          const T* kb, const T* vb, int64_t lo,
                                          const float* att) {
  constexpr int C = kChunk;
  const int lane = threadIdx.x % kWarpSize;
  const int H = a.H, D = a.D, F = a.F;
  const int HD_k = KIND == kAdd ? H : H * D;
  const int HF = H * F;
  const int slots = KIND == kAdd ? 0 : HD_k / VW;
  const int group = a.group, ls = lane % group, sub = lane / group;
  const int G = a.item_group, ng = kWarpSize / G;
  const int gi = lane / G, lg = lane % G;
  const unsigned h_magic = ((1u << 20) + H - 1) / H;  // it / H, H <= 128
  float* lse_h = w.hv;
  float* dsum = w.hv + H;
  float* add_a = w.hv + 2 * H;
  float* add_b = w.hv + 3 * H;
  const int n_pass = slots > 0 ? (slots + group * SLOTS - 1) / (group * SLOTS)
                               : 1;
  uint64_t seed, offset;
  drop_begin<FEAT>(a.drop, seed, offset);

  for (;;) {
    int r = 0;
    if (lane == 0) r = atomicAdd(next, 1);
    r = __shfl_sync(kFullMask, r, 0);
    if (r_begin + r >= r_end) break;
    const Unit un = unit_of(a, r_begin + r);
    const int64_t row = un.owner, elo = un.elo, ehi = un.ehi;
    float* part = un.slot >= 0 ? a.part + un.slot * (2 * HD_k + H) : nullptr;
    for (int i = lane; i < HD_k; i += kWarpSize)
      w.own[i] = to_float(a.own_a[row * HD_k + i]);
    for (int i = lane; i < HF; i += kWarpSize)
      w.own2[i] = to_float(a.own_b[row * HF + i]);
    for (int h = lane; h < H; h += kWarpSize) lse_h[h] = a.lse[row * H + h];

    // Feature passes of group * SLOTS vectors (one unless H*D is large);
    // each pass recomputes the items.
    for (int pass = 0; pass < n_pass; ++pass) {
      const int c0 = pass * group * SLOTS;
      float acc_a[SLOTS][VW], acc_b[SLOTS][VW];
      int hs[SLOTS];
      begin_pass<VW, SLOTS>(acc_a, hs, c0, ls, group, H, D);
      begin_pass<VW, SLOTS>(acc_b, hs, c0, ls, group, H, D);
      __syncwarp();  // the previous row has read dsum
      if (pass == 0)
        for (int h = lane; h < H; h += kWarpSize) {
          dsum[h] = 0.f;
          if constexpr (KIND == kAdd) add_a[h] = add_b[h] = 0.f;
        }

      for (int64_t cb = elo; cb < ehi; cb += C) {
        const int n = (int)(ehi - cb < C ? ehi - cb : C);
        __syncwarp();
        if (lane < n) w.j[lane] = (int64_t)a.idx[cb + lane] - lo;
        __syncwarp();
        // items: s_ij and dp_ij, two per lane group in flight; the trip
        // count is warp-uniform (group8_sum shuffles across groups). Later
        // feature passes (H * D above one pass) read (p, t) back from ebuf,
        // written by this warp in pass 0.
        const int n_items = n * H;
        const bool lean = a.ebuf == nullptr;
        if (pass > 0 && !lean) {
          for (int it = lane; it < n_items; it += kWarpSize) {
            const int e = (int)(((unsigned)it * h_magic) >> 20), h = it - e * H;
            const float2 pt = a.ebuf[(cb + e) * H + h];
            w.p[h * C + e] = fabsf(pt.x);  // (the sign marks a dropped edge)
            w.t[h * C + e] = pt.y;
          }
        }
        for (int it0 = 0; (pass == 0 || lean) && it0 < n_items;
             it0 += 2 * ng) {
          float ps[2], pd[2];
          int ie[2], ih[2];
#pragma unroll
          for (int u = 0; u < 2; ++u) {
            const int it = it0 + u * ng + gi;
            ps[u] = pd[u] = 0.f;
            ie[u] = -1, ih[u] = 0;
            if (it < n_items) {
              const int e = (int)(((unsigned)it * h_magic) >> 20);
              const int h = it - e * H;
              ie[u] = e, ih[u] = h;
              const OFF jr = (OFF)w.j[e];
              if constexpr (KIND != kAdd)
                ps[u] = score_part<KIND, T, VW>(
                    w.own + h * D, kb + jr * HD_k + h * D, att + h * D, D,
                    lg * VW, G * VW, a.slope,
                    (FEAT && a.et.ek != nullptr) ? a.et.ek + (cb + e) * HD_k + h * D
                                       : nullptr);
              pd[u] = score_part<kDot, T, VW>(
                  w.own2 + h * F, vb + jr * HF + h * F, nullptr, F, lg * VW,
                  G * VW, 0.f,
                  (FEAT && a.et.ev != nullptr) ? a.et.ev + (cb + e) * HF + h * F
                                     : nullptr);
            }
          }
#pragma unroll
          for (int u = 0; u < 2; ++u) {
            const float sp = KIND == kAdd ? 0.f : group8_sum(ps[u], G);
            const float dp = group8_sum(pd[u], G);
            if (lg == 0 && ie[u] >= 0) {
              const int e = ie[u], h = ih[u];
              float sc = sp, gz = 1.f;
              if constexpr (KIND == kDot) {
                sc = sp * a.scale;
                if ((FEAT && a.et.es != nullptr))
                  sc += to_float(a.et.es[(cb + e) * H + h]);
              }
              if constexpr (KIND == kAdd) {
                float z = w.own[h] + to_float(kb[(OFF)w.j[e] * H + h]);
                if ((FEAT && a.et.es != nullptr))
                  z += to_float(a.et.es[(cb + e) * H + h]);
                sc = leaky_relu(z, a.slope);
                gz = leaky_relu_grad(z, a.slope);
              }
              const float p = expf(sc - lse_h[h]);
              // out_i = sum_j f p_ij (v_j + ev_ij): dL/dp_ij = f dp_ij
              // (+ the returned weights' own gradient)
              const float f = drop_factor<FEAT>(a.drop, seed, offset, cb + e, h);
              float dpe = f * dp;
              if ((FEAT && a.galpha != nullptr)) {
                const int64_t ea = a.aperm != nullptr
                                       ? (int64_t)a.aperm[cb + e] : cb + e;
                dpe = fmaf(to_float(a.galpha[ea * H + h]),
                           a.galpha_dropped ? f : 1.f, dpe);
              }
              const float t = p * dpe;
              if (pass == 0 && !lean)
                a.ebuf[(cb + e) * H + h] = make_float2(f == 0.f ? -p : p, t);
              w.t[h * C + e] = t;
              w.p[h * C + e] = p * gz;
              if constexpr (KIND == kAdd) w.g[h * C + e] = t * gz;
            }
          }
        }
        __syncwarp();
        // per-head sums over the chunk: D (and A, B for 'add')
        for (int h = 0; pass == 0 && h < H; ++h) {
          const float ts = warp_sum(lane < n ? w.t[h * C + lane] : 0.f);
          float as = 0.f, bs = 0.f;
          if constexpr (KIND == kAdd) {
            as = warp_sum(lane < n ? w.g[h * C + lane] : 0.f);
            bs = warp_sum(lane < n ? w.p[h * C + lane] : 0.f);
          }
          if (lane == 0) {
            dsum[h] += ts;
            if constexpr (KIND == kAdd) add_a[h] += as, add_b[h] += bs;
          }
        }
        // A += t g, B += p g over the chunk's K rows
        if constexpr (KIND != kAdd) {
          for_chunk_vectors<T, VW, SLOTS, kUnrollRows>(
              n, slots, c0, group, ls, sub,
              [&](int e, int sl) { return kb + (OFF)w.j[e] * HD_k + sl * VW; },
              [&](int e, int s, int sl, const float (&xk)[VW]) {
                const float p = w.p[hs[s] * C + e], t = w.t[hs[s] * C + e];
                float x[VW];  // k_j + ek_ij
#pragma unroll
                for (int i = 0; i < VW; ++i) x[i] = xk[i];
                if ((FEAT && a.et.ek != nullptr))
                  add_vec<T, VW>(a.et.ek + (cb + e) * HD_k + sl * VW, x);
                if constexpr (KIND == kDot) {
#pragma unroll
                  for (int i = 0; i < VW; ++i) {
                    acc_a[s][i] = fmaf(t, x[i], acc_a[s][i]);
                    acc_b[s][i] = fmaf(p, x[i], acc_b[s][i]);
                  }
                } else {
                  float qx[VW], ax[VW];
                  load_smem<VW>(w.own + sl * VW, qx);
                  load_smem<VW>(att + sl * VW, ax);
#pragma unroll
                  for (int i = 0; i < VW; ++i) {
                    const float g =
                        ax[i] * leaky_relu_grad(qx[i] + x[i], a.slope);
                    acc_a[s][i] = fmaf(t, g, acc_a[s][i]);
                    acc_b[s][i] = fmaf(p, g, acc_b[s][i]);
                  }
                }
              });
        }
      }
      __syncwarp();  // dsum complete
      if constexpr (KIND != kAdd) {
        reduce_edge_groups<VW, SLOTS>(acc_a, group);
        reduce_edge_groups<VW, SLOTS>(acc_b, group);
        if (sub == 0) {
          const float gscale = KIND == kDot ? a.scale : 1.f;
#pragma unroll
          for (int s = 0; s < SLOTS; ++s) {
            const int sl = c0 + ls + s * group;
            if (sl < slots && part != nullptr) {
#pragma unroll
              for (int i = 0; i < VW; ++i) {
                part[sl * VW + i] = acc_a[s][i];
                part[HD_k + sl * VW + i] = acc_b[s][i];
              }
            } else if (sl < slots) {
              const float d = dsum[hs[s]];
              float x[VW];
              // D * B rounded like A's products (no FMA contraction): a row
              // whose softmax is one edge (p = 1) then gives exactly 0
#pragma unroll
              for (int i = 0; i < VW; ++i)
                x[i] = (acc_a[s][i] - __fmul_rn(d, acc_b[s][i])) * gscale;
              store_vec<T, VW>(a.grad_a + row * HD_k + (int64_t)sl * VW, x);
            }
          }
        }
      } else {
        for (int h = lane; h < H; h += kWarpSize) {
          if (part != nullptr)
            part[h] = add_a[h], part[HD_k + h] = add_b[h];
          else
            a.grad_a[row * H + h] =
                from_float<T>(add_a[h] - __fmul_rn(dsum[h], add_b[h]));
        }
      }
    }
    for (int h = lane; h < H; h += kWarpSize) {
      if (part != nullptr)
        part[2 * HD_k + h] = dsum[h];
      else
        a.drow[row * H + h] = dsum[h];
    }
    __syncwarp();  // the next row overwrites this warp's scratch
  }
}

// ============================================================ cols pass
// Lean mode: a chunk's items recomputed from the rows pass's quantities --
// s_ij (score of q_i and the owner's k_j), p = exp(s - lse_i), dp_ij =
// <dO_i, v_j + ev_ij>, the dropout factor f -- then w.p = f p (dV) and
// w.t = ds = t - p D_i (times leaky'(z) for 'add'; d es written), exactly
// as the rows pass formed them (same operations, same order per item).
template <typename T, typename I, int KIND, int VW, typename OFF, bool FEAT>
__device__ __forceinline__ void cols_items_recompute(
    const BwdArgs<T, I>& a, const WarpScratch& w, int n, int G, int ng,
    int gi, int lg, const T* qb, const T* ob, const float* db, int64_t lo,
    const float* att, uint64_t seed, uint64_t offset) {
  constexpr int C = kChunk;
  const int H = a.H, D = a.D, F = a.F;
  const int HD_k = KIND == kAdd ? H : H * D;
  const int HF = H * F;
  const int n_items = n * H;
  const unsigned h_magic = ((1u << 20) + H - 1) / H;
  for (int it0 = 0; it0 < n_items; it0 += 2 * ng) {
    float ps[2], pd[2];
    int ie[2], ih[2];
#pragma unroll
    for (int u = 0; u < 2; ++u) {
      const int it = it0 + u * ng + gi;
      ps[u] = pd[u] = 0.f;
      ie[u] = -1, ih[u] = 0;
      if (it < n_items) {
        const int e = (int)(((unsigned)it * h_magic) >> 20);
        const int h = it - e * H;
        ie[u] = e, ih[u] = h;
        const OFF ir = (OFF)w.j[e];
        const int64_t ecsr = w.e[e];
        const T* ek = (FEAT && a.et.ek != nullptr)
                          ? a.et.ek + ecsr * HD_k + h * D : nullptr;
        if constexpr (KIND == kDot)
          ps[u] = dot_part<T, VW>(w.own + h * D, qb + ir * HD_k + h * D, ek,
                                  D, lg * VW, G * VW);
        else if constexpr (KIND == kGatv2)
          ps[u] = score_part<KIND, T, VW>(w.own + h * D, qb + ir * HD_k + h * D,
                                          att + h * D, D, lg * VW, G * VW,
                                          a.slope, ek);
        pd[u] = dot_part<T, VW>(
            w.vown + h * F, ob + ir * HF + h * F,
            (FEAT && a.et.ev != nullptr) ? a.et.ev + ecsr * HF + h * F
                                         : nullptr,
            F, lg * VW, G * VW);
      }
    }
#pragma unroll
    for (int u = 0; u < 2; ++u) {
      const float sp = KIND == kAdd ? 0.f : group8_sum(ps[u], G);
      const float dp = group8_sum(pd[u], G);
      if (lg == 0 && ie[u] >= 0) {
        const int e = ie[u], h = ih[u];
        const OFF ir = (OFF)w.j[e];
        const int64_t ecsr = w.e[e];
        float sc = sp, gz = 1.f;
        if constexpr (KIND == kDot) {
          sc = sp * a.scale;
          if ((FEAT && a.et.es != nullptr)) sc += to_float(a.et.es[ecsr * H + h]);
        }
        if constexpr (KIND == kAdd) {
          float z = to_float(qb[ir * H + h]) + w.own[h];
          if ((FEAT && a.et.es != nullptr)) z += to_float(a.et.es[ecsr * H + h]);
          sc = leaky_relu(z, a.slope);
          gz = leaky_relu_grad(z, a.slope);
        }
        const float p = expf(sc - a.lse[(lo + (int64_t)ir) * H + h]);
        const float f = drop_factor<FEAT>(a.drop, seed, offset, ecsr, h);
        float dpe = f * dp;
        if ((FEAT && a.galpha != nullptr)) {
          const int64_t ea = a.aperm != nullptr ? (int64_t)a.aperm[ecsr] : ecsr;
          dpe = fmaf(to_float(a.galpha[ea * H + h]),
                     a.galpha_dropped ? f : 1.f, dpe);
        }
        const float t = p * dpe;
        w.p[h * C + e] = FEAT ? p * f : p;
        float ds = t - p * db[ir * H + h];
        if constexpr (KIND == kAdd) ds *= gz;
        if constexpr (KIND != kGatv2)  // d es = ds (leaky' for 'add')
          if ((FEAT && a.g_es != nullptr)) a.g_es[ecsr * H + h] = from_float<T>(ds);
        w.t[h * C + e] = ds;
      }
    }
  }
}


// Owners = source nodes [c_begin, c_end); Q / dO rows and D of destination
// i at qb + (i - lo) * HD_k, ob + (i - lo) * HF, db + (i - lo) * H.
template <typename T, typename I, int KIND, int VW, int SLOTS, typename OFF,
          bool FEAT, bool LEAN>
__device__ __forceinline__ void cols_pass(const BwdArgs<T, I>& a,
                                          const WarpScratch& w, int* next,
                                          int64_t c_begin, int64_t c_end,
                                          const T* qb, const T* ob,
                                          const float* db, int64_t lo,
                                          const float* att) {
  constexpr int C = kChunk;
  const int lane = threadIdx.x % kWarpSize;
  const int H = a.H, D = a.D, F = a.F;
  const int HD_k = KIND == kAdd ? H : H * D;
  const int HF = H * F;
  const int slots_k = KIND == kAdd ? 0 : HD_k / VW;
  const int slots = slots_k + HF / VW;
  const int group = a.group, ls = lane % group, sub = lane / group;
  const unsigned h_magic = ((1u << 20) + H - 1) / H;
  const int n_pass = (slots + group * SLOTS - 1) / (group * SLOTS);
  float* add_k = w.hv;
  const float keep_scale = a.drop.active ? a.drop.keep_scale : 1.f;
  const int G = a.item_group, ng = kWarpSize / G;
  const int gi = lane / G, lg = lane % G;
  uint64_t seed, offset;
  drop_begin<FEAT>(a.drop, seed, offset);

  // gatv2: owners go to warps round-robin, so that each warp's d att
  // partial (summed over its owners) is the same in every run
  const int warp = threadIdx.x / kWarpSize;
  const int n_warps = blockDim.x / kWarpSize;
  for (int k = 0;; ++k) {
    int r = warp + k * n_warps;
    if constexpr (KIND != kGatv2) {
      if (lane == 0) r = atomicAdd(next, 1);
      r = __shfl_sync(kFullMask, r, 0);
    }
    if (c_begin + r >= c_end) break;
    const Unit un = unit_of(a, c_begin + r);
    const int64_t col = un.owner, elo = un.elo, ehi = un.ehi;
    float* part = un.slot >= 0 ? a.part + un.slot * (HD_k + HF) : nullptr;
    if constexpr (KIND != kDot || LEAN)
      for (int i = lane; i < HD_k; i += kWarpSize)
        w.own[i] = to_float(a.own_a[col * HD_k + i]);
    if constexpr (LEAN)
      for (int i = lane; i < HF; i += kWarpSize)
        w.vown[i] = to_float(a.own_b[col * HF + i]);
    for (int h = lane; h < H; h += kWarpSize) add_k[h] = 0.f;

    for (int pass = 0; pass < n_pass; ++pass) {
      const int c0 = pass * group * SLOTS;
      float acc[SLOTS][VW], lacc[SLOTS][VW];  // lacc: gatv2 d att
      int hs[SLOTS];
#pragma unroll
      for (int s = 0; s < SLOTS; ++s) {
        const int sl = c0 + ls + s * group;
        hs[s] = sl < slots_k ? min(H - 1, sl * VW / D)
                             : min(H - 1, (sl - slots_k) * VW / F);
#pragma unroll
        for (int i = 0; i < VW; ++i) acc[s][i] = lacc[s][i] = 0.f;
      }
      for (int64_t cb = elo; cb < ehi; cb += C) {
        const int n = (int)(ehi - cb < C ? ehi - cb : C);
        __syncwarp();
        if (lane < n) {
          w.j[lane] = (int64_t)a.idx[cb + lane] - lo;
          w.e[lane] = (int64_t)a.perm[cb + lane];
        }
        __syncwarp();
        // ds only when this pass has dK slots (or 'add's d a_src)
        // (gatv2 always: the branch costs it registers)
        // (and in every pass for the shared edge gradient's dV slots)
        const bool need_ds = KIND == kAdd   ? pass == 0
                             : KIND == kDot ? c0 < slots_k || (FEAT && a.ekv_shared)
                                            : true;
        if constexpr (LEAN)
          cols_items_recompute<T, I, KIND, VW, OFF, FEAT>(
              a, w, n, G, ng, gi, lg, qb, ob, db, lo, att, seed, offset);
        for (int it = lane; !LEAN && it < n * H; it += kWarpSize) {
          const int e = (int)(((unsigned)it * h_magic) >> 20), h = it - e * H;
          const float2 pt = a.ebuf[w.e[e] * H + h];
          const float p = fabsf(pt.x);
          // dV takes the dropped p' = f p (sign bit: dropped, see rows)
          w.p[h * C + e] = !FEAT ? p : signbit(pt.x) ? 0.f : p * keep_scale;
          if (!need_ds) continue;
          const OFF ir = (OFF)w.j[e];
          float ds = pt.y - p * db[ir * H + h];
          if constexpr (KIND == kAdd) {
            float z = w.own[h] + to_float(qb[ir * H + h]);
            if ((FEAT && a.et.es != nullptr)) z += to_float(a.et.es[w.e[e] * H + h]);
            ds *= leaky_relu_grad(z, a.slope);
          }
          if constexpr (KIND != kGatv2)  // d es = ds (leaky' for 'add')
            if ((FEAT && a.g_es != nullptr) && pass == 0)
              a.g_es[w.e[e] * H + h] = from_float<T>(ds);
          w.t[h * C + e] = ds;
        }
        __syncwarp();
        if constexpr (KIND == kAdd) {
          if (pass == 0)
            for (int h = 0; h < H; ++h) {
              const float s = warp_sum(lane < n ? w.t[h * C + lane] : 0.f);
              if (lane == 0) add_k[h] += s;
            }
        }
        // dK += ds g (slots < slots_k), dV += p dO (the rest)
        for_chunk_vectors<T, VW, SLOTS, kUnrollCols>(
            n, slots, c0, group, ls, sub,
            [&](int e, int sl) {
              return sl < slots_k
                         ? qb + (OFF)w.j[e] * HD_k + sl * VW
                         : ob + (OFF)w.j[e] * HF + (sl - slots_k) * VW;
            },
            [&](int e, int s, int sl, const float (&x)[VW]) {
              const int64_t ecsr = w.e[e];
              if (sl < slots_k) {
                const float ds = w.t[hs[s] * C + e];
                float ge[VW];  // this edge's d ek slot
                if constexpr (KIND == kDot) {
#pragma unroll
                  for (int i = 0; i < VW; ++i) {
                    acc[s][i] = fmaf(ds, x[i], acc[s][i]);
                    ge[i] = ds * x[i] * a.scale;
                  }
                } else if constexpr (KIND == kGatv2) {
                  float kx[VW], ax[VW];
                  load_smem<VW>(w.own + sl * VW, kx);
                  load_smem<VW>(att + sl * VW, ax);
                  if ((FEAT && a.et.ek != nullptr))
                    add_vec<T, VW>(a.et.ek + ecsr * HD_k + sl * VW, kx);
#pragma unroll
                  for (int i = 0; i < VW; ++i) {
                    const float z = kx[i] + x[i];
                    ge[i] = ds * ax[i] * leaky_relu_grad(z, a.slope);
                    acc[s][i] += ge[i];
                    lacc[s][i] = fmaf(ds, leaky_relu(z, a.slope), lacc[s][i]);
                  }
                }
                if constexpr (KIND != kAdd)
                  if ((FEAT && a.g_ek != nullptr) && !a.ekv_shared)
                    store_vec<T, VW>(a.g_ek + ecsr * HD_k + sl * VW, ge);
              } else {
                const float p = w.p[hs[s] * C + e];
                const int sv = sl - slots_k;
#pragma unroll
                for (int i = 0; i < VW; ++i) acc[s][i] = fmaf(p, x[i], acc[s][i]);
                if ((FEAT && a.g_ev != nullptr)) {
                  float gv[VW];  // p' dO_i (+ scale ds q_i when ek = ev)
#pragma unroll
                  for (int i = 0; i < VW; ++i) gv[i] = p * x[i];
                  if (a.ekv_shared) {
                    const float dss = w.t[hs[s] * C + e] * a.scale;
                    float qx[VW];
                    load_vec<T, VW>(qb + (OFF)w.j[e] * HD_k + sv * VW, qx);
#pragma unroll
                    for (int i = 0; i < VW; ++i) gv[i] = fmaf(dss, qx[i], gv[i]);
                  }
                  store_vec<T, VW>(a.g_ev + ecsr * HF + sv * VW, gv);
                }
              }
            });
      }
      reduce_edge_groups<VW, SLOTS>(acc, group);
      if constexpr (KIND == kGatv2) reduce_edge_groups<VW, SLOTS>(lacc, group);
      if (sub == 0) {
        const float gscale = KIND == kDot ? a.scale : 1.f;
#pragma unroll
        for (int s = 0; s < SLOTS; ++s) {
          const int sl = c0 + ls + s * group;
          if (sl < slots && part != nullptr) {
            const int off =
                sl < slots_k ? sl * VW : HD_k + (sl - slots_k) * VW;
#pragma unroll
            for (int i = 0; i < VW; ++i) part[off + i] = acc[s][i];
          }
          if (sl < slots_k) {
#pragma unroll
            for (int i = 0; i < VW; ++i) acc[s][i] *= gscale;
            if (part == nullptr)
              store_vec<T, VW>(a.grad_a + col * HD_k + (int64_t)sl * VW,
                               acc[s]);
            if constexpr (KIND == kGatv2)
#pragma unroll
              for (int i = 0; i < VW; ++i) w.own2[sl * VW + i] += lacc[s][i];
          } else if (sl < slots && part == nullptr) {
            store_vec<T, VW>(
                a.grad_b + col * HF + (int64_t)(sl - slots_k) * VW, acc[s]);
          }
        }
      }
    }
    __syncwarp();  // add_k complete
    if constexpr (KIND == kAdd)
      for (int h = lane; h < H; h += kWarpSize) {
        if (part != nullptr)
          part[h] = add_k[h];
        else
          a.grad_a[col * H + h] = from_float<T>(add_k[h]);
      }
    __syncwarp();  // the next owner overwrites this warp's scratch
  }
}

// ============================================================ the kernel
// A block owns owners `windows[b] .. windows[b + 1]` (graph-aligned windows)
// or kPlainOwners consecutive owners. With stage_span > 0 a window whose
// neighbours [lo, hi] number <= stage_span has their rows staged in shared
// memory once (reused by every edge of the window).
template <typename T, typename I, int KIND, bool VEC, bool COLS, bool FEAT,
          bool LEAN>
__global__ void __launch_bounds__(kMaxThreads)
    bwd_kernel(BwdArgs<T, I> a, const int64_t* __restrict__ windows,
               int stage_span) {
  constexpr int VW = VEC ? Vec<T>::kWidth : 1;
  // Accumulated floats per lane: rows 2 x SLOTS x VW (A, B); cols SLOTS x
  // VW, twice for gatv2 (d att). About 8 of them keep the kernels within 64
  // registers (a few bytes of spills in some instantiations, see NOTES).
  constexpr int kFloats = (!COLS || KIND == kGatv2 || !VEC) ? 4 : 8;
  constexpr int SLOTS =
      VEC ? (kFloats / VW > 1 ? kFloats / VW : 1) : kFloats / 2;
  extern __shared__ __align__(16) unsigned char smem[];
  const int H = a.H, D = a.D;
  const int HD_k = KIND == kAdd ? H : H * D;
  const int HF = H * a.F;
  const int HD_att = KIND == kGatv2 ? H * D : 0;
  const int n_warps = blockDim.x / kWarpSize;
  const BwdLayout L =
      bwd_layout(COLS, KIND, stage_span, H, HD_k, HF, HD_att, n_warps,
                 sizeof(T), LEAN);
  T* s_a = reinterpret_cast<T*>(smem);
  T* s_b = reinterpret_cast<T*>(smem + L.b);
  float* s_r = reinterpret_cast<float*>(smem + L.r);
  float* s_att = reinterpret_cast<float*>(smem + L.att);
  int* s_next = reinterpret_cast<int*>(smem + L.scalars);
  int* s_lo = s_next + 1;  // [lo, hi] of the window's neighbours

  const int tid = threadIdx.x, warp = tid / kWarpSize, lane = tid % kWarpSize;
  int64_t o_begin, o_end;
  if (windows != nullptr) {
    o_begin = windows[blockIdx.x];
    o_end = windows[blockIdx.x + 1];
  } else {
    const int64_t n_units =
        a.seg_ptr != nullptr ? a.seg_ptr[a.n_owner] : a.n_owner;
    o_begin = (int64_t)blockIdx.x * kPlainOwners;
    o_end = o_begin + kPlainOwners < n_units ? o_begin + kPlainOwners
                                             : n_units;
  }
  if (tid == 0) {
    s_next[0] = 0;
    s_lo[0] = INT32_MAX;
    s_lo[1] = -1;
  }
  if constexpr (KIND == kGatv2)
    for (int i = tid; i < HD_att; i += blockDim.x) s_att[i] = to_float(a.att[i]);

  bool staged = false;
  int src_lo = 0;
  if (stage_span > 0) {  // int32 indices only (host)
    const int n_nbr = block_index_span(a.idx, a.ptr[o_begin], a.ptr[o_end],
                                       s_lo, src_lo);
    if (n_nbr > 0 && n_nbr <= stage_span) {
      staged = true;
      copy_to_smem<T, (KIND == kAdd ? 1 : VW)>(
          s_a, a.nbr_a + (int64_t)src_lo * HD_k, n_nbr * HD_k);
      copy_to_smem<T, VW>(s_b, a.nbr_b + (int64_t)src_lo * HF, n_nbr * HF);
      if constexpr (COLS)
        copy_to_smem<float, 1>(s_r, a.drow + (int64_t)src_lo * H, n_nbr * H);
    }
  }

  unsigned char* base = smem + L.warps + warp * L.warp_bytes;
  float* f = reinterpret_cast<float*>(base);
  WarpScratch w;
  w.own = f;
  if constexpr (COLS) {
    w.own2 = w.own + (KIND == kDot && !LEAN ? 0 : pad4(HD_k));
    w.hv = w.own2 + pad4(HD_att);
    w.p = w.hv + H;
    w.t = w.p + H * kChunk;
    w.g = nullptr;
    w.vown = w.hv + pad4(H + 2 * H * kChunk);  // (16-byte aligned)
    for (int i = lane; i < HD_att; i += kWarpSize) w.own2[i] = 0.f;
  } else {
    w.own2 = w.own + pad4(HD_k);
    w.hv = w.own2 + pad4(HF);
    w.p = w.hv + (KIND == kAdd ? 4 : 2) * H;
    w.t = w.p + H * kChunk;
    w.g = KIND == kAdd ? w.t + H * kChunk : nullptr;
    w.vown = nullptr;
  }
  w.j = reinterpret_cast<int64_t*>(base + L.warp_bytes -
                                   2 * kChunk * sizeof(int64_t));
  w.e = w.j + kChunk;
  __syncthreads();

  if constexpr (COLS) {
    if (staged)
      cols_pass<T, I, KIND, VW, SLOTS, int, FEAT, LEAN>(
          a, w, s_next, o_begin, o_end, s_a, s_b, s_r, src_lo, s_att);
    else
      cols_pass<T, I, KIND, VW, SLOTS, int64_t, FEAT, LEAN>(
          a, w, s_next, o_begin, o_end, a.nbr_a, a.nbr_b, a.drow, 0, s_att);
    if constexpr (KIND == kGatv2) {
      // d att partial of this block: warps summed in a fixed order
      __syncthreads();
      for (int i = tid; i < HD_att; i += blockDim.x) {
        float sum = 0.f;
        for (int k = 0; k < n_warps; ++k)
          sum += reinterpret_cast<const float*>(
              smem + L.warps + k * L.warp_bytes)[pad4(HD_k) + i];
        a.att_part[(int64_t)blockIdx.x * HD_att + i] = sum;
      }
    }
  } else {
    if (staged)
      rows_pass<T, I, KIND, VW, SLOTS, int, FEAT>(a, w, s_next, o_begin, o_end, s_a,
                                            s_b, src_lo, s_att);
    else
      rows_pass<T, I, KIND, VW, SLOTS, int64_t, FEAT>(a, w, s_next, o_begin, o_end,
                                                a.nbr_a, a.nbr_b, 0, s_att);
  }
}

// Owners of several segments: sum their partials in segment order (a warp
// per owner; deterministic). Rows: dQ = (A - D B) * g, drow = D; cols: dK
// (times g), dV.
template <typename T, int KIND, bool COLS>
__global__ void __launch_bounds__(256)
    bwd_combine_kernel(const int64_t* __restrict__ seg_ptr,
                       const int64_t* __restrict__ slot_ptr,
                       const float* __restrict__ part, int64_t n_owner, int H,
                       int D, int F, float gscale, T* __restrict__ grad_a,
                       T* __restrict__ grad_b, float* __restrict__ drow) {
  const int warp = threadIdx.x / kWarpSize, lane = threadIdx.x % kWarpSize;
  const int64_t o = (int64_t)blockIdx.x * (blockDim.x / kWarpSize) + warp;
  if (o >= n_owner) return;
  const int64_t nseg = seg_ptr[o + 1] - seg_ptr[o];
  if (nseg <= 1) return;
  const int HD_k = KIND == kAdd ? H : H * D, HF = H * F;
  const float* p0 = part + slot_ptr[o] * (COLS ? HD_k + HF : 2 * HD_k + H);
  const int64_t W = COLS ? HD_k + HF : 2 * HD_k + H;
  if constexpr (COLS) {
    for (int f = lane; f < HD_k + HF; f += kWarpSize) {
      float sum = 0.f;
      for (int64_t k = 0; k < nseg; ++k) sum += p0[k * W + f];
      if (f < HD_k)
        grad_a[o * HD_k + f] = from_float<T>(sum * gscale);
      else
        grad_b[o * HF + f - HD_k] = from_float<T>(sum);
    }
  } else {
    for (int f = lane; f < HD_k; f += kWarpSize) {
      const int h = KIND == kAdd ? f : f / D;
      float A = 0.f, B = 0.f, Ds = 0.f;
      for (int64_t k = 0; k < nseg; ++k) {
        A += p0[k * W + f];
        B += p0[k * W + HD_k + f];
        Ds += p0[k * W + 2 * HD_k + h];
      }
      grad_a[o * HD_k + f] = from_float<T>((A - __fmul_rn(Ds, B)) * gscale);
    }
    for (int h = lane; h < H; h += kWarpSize) {
      float Ds = 0.f;
      for (int64_t k = 0; k < nseg; ++k) Ds += p0[k * W + 2 * HD_k + h];
      drow[o * H + h] = Ds;
    }
  }
}

// ============================================================ host side
// Everything the typed host code needs (tensors already checked).
struct Args {
  at::Tensor grad_out, rowptr, col, colptr, csc_row, csc_perm, query, key,
      value, att, lse, windows, col_windows;
  at::Tensor edge_score, edge_key, edge_value;  // CSR order (or undefined)
  at::Tensor grad_alpha, attention_perm;  // (undefined: none / identity)
  bool alpha_dropped, ekv_shared;
  DropoutMask drop;
  int64_t kind, stage_nodes, col_stage_nodes;
  int64_t max_in_degree, max_out_degree;  // longest CSR row / CSC column
  double scale, slope;
  // outputs, allocated by the caller (the edge ones where wanted)
  at::Tensor grad_query, grad_key, grad_value, grad_att;
  at::Tensor grad_edge_score, grad_edge_key, grad_edge_value;
};

template <typename T> void run_bwd(Args& a);

namespace detail {

// One pass's launch: staged windows when given (and the layout fits), else
// plain blocks; warps halved while the per-warp scratch does not fit.
template <typename T, typename I, int KIND, bool VEC, bool COLS, bool FEAT,
          bool LEAN>
void launch(const BwdArgs<T, I>& args, const at::Tensor& ptr,
            int64_t n_edges, int64_t max_degree, const at::Tensor& windows,
            int64_t stage_nodes, int optin, at::Tensor* att_part,
            const at::TensorOptions& fopt) {
  auto kernel = bwd_kernel<T, I, KIND, VEC, COLS, FEAT, LEAN>;
  const int H = args.H, D = args.D;
  const int HD_k = KIND == kAdd ? H : H * D, HF = H * args.F;
  const int HD_att = KIND == kGatv2 ? H * D : 0;
  auto total = [&](int64_t span, int warps) {
    return bwd_layout(COLS, KIND, (int)span, H, HD_k, HF, HD_att, warps,
                      sizeof(T), LEAN)
        .total;
  };
  int warps = kStagedWarps;
  int64_t span = 0;
  const bool windowed = std::is_same<I, int32_t>::value && windows.defined() &&
                        stage_nodes > 0 && windows.numel() >= 2;
  // The most neighbours a block of `w` warps can stage (<= stage_nodes).
  auto capacity = [&](int w) -> int64_t {
    if (total(1, w) > (size_t)optin) return 0;
    const size_t base = total(0, w), per = total(1, w) - base;
    int64_t c = std::min<int64_t>(
        stage_nodes, ((size_t)optin - base) / std::max<size_t>(per, 1));
    while (c > 0 && total(c, w) > (size_t)optin) --c;
    return c;
  };
  if (windowed) {
    // The windows were cut for the forward's smaller scratch: when 32 warps
    // cannot stage the widest one, 16 warps (half the scratch) may.
    span = capacity(warps);
    if (span < stage_nodes && capacity(kStagedWarps / 2) > span) {
      warps = kStagedWarps / 2;
      span = capacity(warps);
    }
  }
  const bool staged = span > 0;
  if (!staged) {
    warps = kPlainWarps;
    while (warps > 1 && total(0, warps) > (size_t)optin) warps /= 2;
    TORCH_CHECK(total(0, warps) <= (size_t)optin,
                "fused_attention_bwd: H * F = ", HF, " (H * D = ", HD_k,
                ") needs more shared memory per warp than the device has");
  }
  BwdArgs<T, I> a = args;
  // Plain blocks with long owners (super nodes) or an unknown longest
  // owner: segments of kSegEdges edges spread one owner over many warps
  // (bounds known without a sync).
  at::Tensor seg_ptr, slot_ptr, part;
  int64_t units = args.n_owner;
  if (!staged && (max_degree < 0 || max_degree > kSegEdges)) {
    const int64_t n = args.n_owner;
    auto deg = ptr.slice(0, 1) - ptr.slice(0, 0, n);
    auto nseg = deg.add(kSegEdges - 1).div(kSegEdges, "floor").clamp_min(1);
    auto zero = at::zeros({1}, ptr.options());
    seg_ptr = at::cat({zero, nseg.cumsum(0)});
    slot_ptr = at::cat(
        {zero, at::where(nseg > 1, nseg, at::zeros_like(nseg)).cumsum(0)});
    units = n + n_edges / kSegEdges + 1;
    const int64_t W = COLS ? HD_k + HF : 2 * HD_k + H;
    part = at::empty({2 * (n_edges / kSegEdges) + 2, W}, fopt);
    a.seg_ptr = seg_ptr.data_ptr<int64_t>();
    a.slot_ptr = slot_ptr.data_ptr<int64_t>();
    a.part = part.data_ptr<float>();
  }
  const int64_t blocks = staged ? windows.numel() - 1
                                : (units + kPlainOwners - 1) / kPlainOwners;
  if (att_part != nullptr) {
    *att_part = at::empty({std::max<int64_t>(blocks, 0), HD_att}, fopt);
    a.att_part = att_part->data_ptr<float>();
  }
  if (blocks <= 0) return;
  const size_t bytes = total(span, warps);
  if (bytes > 48 * 1024)
    C10_CUDA_CHECK(cudaFuncSetAttribute(
        kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, (int)bytes));
  kernel<<<(unsigned)blocks, warps * kWarpSize, bytes,
           c10::cuda::getCurrentCUDAStream()>>>(
      a, staged ? windows.data_ptr<int64_t>() : nullptr, (int)span);
  C10_CUDA_KERNEL_LAUNCH_CHECK();
  if (seg_ptr.defined()) {
    bwd_combine_kernel<T, KIND, COLS>
        <<<(unsigned)((a.n_owner + 7) / 8), 256, 0,
           c10::cuda::getCurrentCUDAStream()>>>(
            a.seg_ptr, a.slot_ptr, a.part, a.n_owner, H, D, args.F,
            KIND == kDot ? args.scale : 1.f, a.grad_a, a.grad_b, a.drow);
    C10_CUDA_KERNEL_LAUNCH_CHECK();
  }
}

// PYG_DFGNN_BWD_STORE_MB (read per call, so that tests can switch it).
inline double store_limit_bytes() {
  const char* env = std::getenv("PYG_DFGNN_BWD_STORE_MB");
  const double mb = env != nullptr && *env != '\0' ? std::atof(env) : 512.0;
  return mb * 1024.0 * 1024.0;
}

template <typename T, typename I, int KIND, bool VEC, bool FEAT>
void run_passes(Args& A, int optin) {
  const int64_t n_dst = A.rowptr.size(0) - 1, n_src = A.colptr.size(0) - 1;
  const int64_t E = A.col.numel();
  const int H = (int)A.value.size(1), F = (int)A.value.size(2);
  const int D = KIND == kAdd ? 1 : (int)A.query.size(2);
  constexpr int VW = VEC ? Vec<T>::kWidth : 1;
  const int slots_k = KIND == kAdd ? 0 : H * D / VW, slots_v = H * F / VW;
  const auto fopt = A.value.options().dtype(at::kFloat);
  // (p, t) per edge and head: 8 * E * H bytes. Above the limit (the
  // largest buffer worth its memory; PYG_DFGNN_BWD_STORE_MB, default 512)
  // the backward is lean: the cols pass recomputes them.
  const bool lean = (double)E * H * 8 > store_limit_bytes();
  auto ebuf = lean ? at::Tensor() : at::empty({E, H, 2}, fopt);
  auto drow = at::empty({n_dst, H}, fopt);
  auto ptr = [](const at::Tensor& t) -> const T* {
    return t.defined() ? t.data_ptr<T>() : nullptr;
  };

  auto out_ptr = [](const at::Tensor& t) -> T* {
    return t.defined() && t.numel() > 0 ? t.data_ptr<T>() : nullptr;
  };
  BwdArgs<T, I> a{};
  a.att = ptr(A.att);
  a.lse = A.lse.data_ptr<float>();
  a.et = {ptr(A.edge_score), ptr(A.edge_key), ptr(A.edge_value)};
  a.drop = A.drop;
  a.ekv_shared = A.ekv_shared;
  a.drow = drow.data_ptr<float>();
  a.ebuf = lean ? nullptr : reinterpret_cast<float2*>(ebuf.data_ptr<float>());
  a.H = H, a.D = D, a.F = F;
  a.galpha = ptr(A.grad_alpha);
  a.aperm = A.grad_alpha.defined() && A.attention_perm.defined()
                ? A.attention_perm.data_ptr<I>() : nullptr;
  a.galpha_dropped = A.alpha_dropped;
  a.item_group = std::min(8, next_pow2((std::max(D, F) + VW - 1) / VW));
  a.scale = (float)A.scale, a.slope = (float)A.slope;

  // rows pass: grad_query, D -> drow, (p, t) -> ebuf
  BwdArgs<T, I> r = a;
  r.ptr = A.rowptr.data_ptr<int64_t>();
  r.idx = A.col.data_ptr<I>();
  r.own_a = ptr(A.query);
  r.own_b = ptr(A.grad_out);
  r.nbr_a = ptr(A.key);
  r.nbr_b = ptr(A.value);
  r.grad_a = A.grad_query.data_ptr<T>();
  r.n_owner = n_dst;
  r.group = std::min(32, next_pow2(std::max(1, slots_k)));
  launch<T, I, KIND, VEC, false, FEAT, false>(r, A.rowptr, E, A.max_in_degree,
                                              A.windows, A.stage_nodes, optin,
                                              nullptr, fopt);
  // cols pass: grad_key, grad_value, d att partials
  BwdArgs<T, I> c = a;
  c.ptr = A.colptr.data_ptr<int64_t>();
  c.idx = A.csc_row.data_ptr<I>();
  c.perm = A.csc_perm.data_ptr<I>();
  c.own_a = ptr(A.key);
  c.own_b = ptr(A.value);  // (lean: the owner's value row)
  c.nbr_a = ptr(A.query);
  c.nbr_b = ptr(A.grad_out);
  c.grad_a = A.grad_key.data_ptr<T>();
  c.grad_b = A.grad_value.data_ptr<T>();
  c.g_es = out_ptr(A.grad_edge_score);
  c.g_ek = out_ptr(A.grad_edge_key);
  // ek = ev ('dot'): one gradient, written with the dV slots
  c.g_ev = A.ekv_shared ? c.g_ek : out_ptr(A.grad_edge_value);
  c.n_owner = n_src;
  c.group = std::min(32, next_pow2(slots_k + slots_v));
  at::Tensor att_part;
  PYG_DFGNN_DISPATCH_BOOL(lean, LEAN, [&] {
    launch<T, I, KIND, VEC, true, FEAT, LEAN>(
        c, A.colptr, E, A.max_out_degree, A.col_windows, A.col_stage_nodes,
        optin, KIND == kGatv2 ? &att_part : nullptr, fopt);
  });
  if (KIND == kGatv2) A.grad_att.copy_(att_part.sum(0).view({H, D}));
}

}  // namespace detail

template <typename T> void run_bwd(Args& A) {
  const int H = (int)A.value.size(1), F = (int)A.value.size(2);
  const int D = A.kind == kAdd ? 1 : (int)A.query.size(2);
  TORCH_CHECK(H <= kMaxHeads, "fused_attention_bwd: at most ", kMaxHeads,
              " heads (got ", H, ")");
  const int V = Vec<T>::kWidth;
  bool vec = F % V == 0 && (A.kind == kAdd || D % V == 0);
  for (const at::Tensor* t : {&A.grad_out, &A.query, &A.key, &A.value,
                              &A.att, &A.grad_query, &A.grad_key,
                              &A.grad_value, &A.edge_key, &A.edge_value,
                              &A.grad_edge_key, &A.grad_edge_value})
    if (t->defined() && t->numel() > 0 &&
        reinterpret_cast<uintptr_t>(t->data_ptr()) % 16 != 0)
      vec = false;
  int optin = 0;
  C10_CUDA_CHECK(cudaDeviceGetAttribute(
      &optin, cudaDevAttrMaxSharedMemoryPerBlockOptin,
      A.value.get_device()));
  PYG_DFGNN_DISPATCH_INDEX(A.col.scalar_type(), "fused_attention_bwd", [&] {
    PYG_DFGNN_DISPATCH_KIND(A.kind, [&] {
      PYG_DFGNN_DISPATCH_BOOL(vec, VEC, [&] {
        const bool feat = A.edge_score.defined() || A.edge_key.defined() ||
                          A.edge_value.defined() ||
                          A.grad_alpha.defined() || A.drop.active;
        PYG_DFGNN_DISPATCH_BOOL(feat, FEAT, [&] {
          detail::run_passes<T, index_t, KIND, VEC, FEAT>(A, optin);
        });
      });
    });
  });
}

}  // namespace bwd
}  // namespace pyg_dfgnn

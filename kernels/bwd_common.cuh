// Fused backward of the attention op: device code and typed host launch,
// instantiated per dtype and score kind by
// fused_attention_bwd_{dot,add,gatv2}_{f32,f16,bf16}.cu (so the nine
// compile in parallel).
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
// ebuf[csc_perm], ds = (t - p D_i) (times leaky'(z_ij) for 'add', from a
// flag bit of the stored p, see pack_item_p), then
//   dK_j = sum_i ds_ij g_ij (g with q_i),  dV_j = sum_i p_ij dO_i,
//   d att += ds_ij leaky(z_ij) (gatv2: per-block partials, summed by host).
// No dot products there, no atomics anywhere: deterministic.
//
// Training features (runtime switches, as in the forward; the kernels are
// instantiated per feature level, training_features.cuh: none, the edge
// score alone ('add'), the edge score and weights ('dot'), all):
//   edge terms: es / ek join the score recompute in both passes, ev the
//   dp_ij = <dO_i, v_j + ev_ij> of the rows pass; their gradients are
//   per-edge products the cols pass forms anyway -- d es = ds leaky'(z)
//   ('add') or ds ('dot'),
//   d ek = scale ds q_i (dot) or ds att leaky'(z) (gatv2), d ev = p' dO_i --
//   written by it to the edge's CSR row (TransformerConv's ek = ev: one
//   gradient, both terms in the dV slots);
//   dropout: the rows pass regenerates the mask factor f (0 or 1 / (1 - p))
//   from the forward's Philox (seed, offset): dp' = f dp, p' = f p, and
//   marks a dropped edge in the sign of ebuf's p (pack_item_p), so the
//   cols pass reads the mask instead of recomputing it;
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
//
// Files of the backward family (kernel traits, passes, kernels, launch
// template):
//   bwd_common.cuh            constants, BwdArgs, shared-memory layout, warp
//                             scratch, work units, the chunk vector loop
//   bwd_rows_pass.cuh         rows pass (dQ, D, (p, t) -> ebuf)
//   bwd_cols_pass.cuh         cols pass (dK, dV, d att, edge gradients)
//   bwd_kernel.cuh            the pass kernel and the segment combine kernel
//   bwd_short_kernel.cuh      both passes for short owners: a warp per owner
//   bwd_launch_template.cuh   host: Args, run_bwd_kind<T, KIND>, run_bwd<T>
//   fused_attention_bwd_{dot,add,gatv2}_{f32,f16,bf16}.cu  instantiations
//   fused_attention_bwd.cu    host entry: checks, outputs
// shared with the forward: numeric, vector_io, score_kinds,
// training_features, row_tiles, dispatch, short_rows (.cuh).
#pragma once

#include <cstdint>

#include "feature_lanes.cuh"
#include "numeric.cuh"
#include "ops.h"
#include "row_tiles.cuh"
#include "score_kinds.cuh"
#include "training_features.cuh"
#include "vector_io.cuh"

namespace pyg_dfgnn {
namespace bwd {

// ebuf's p word: p of an item, the sign bit set for an edge that dropout
// dropped; for 'add' also bit 30 -- never set in a float below 2 -- for a
// negative LeakyReLU input (leaky' = slope), so that the cols pass needs
// neither the score's node terms nor es to form ds ('add' clamps p to <= 1,
// which rounding can exceed; a NaN p from NaN inputs is stored as it is).
struct ItemP {
  float p;  // >= 0 (or NaN)
  bool dropped, negative;
};
template <int KIND>
__device__ __forceinline__ float pack_item_p(float p, bool dropped,
                                             bool negative) {
  if constexpr (KIND != kAdd) {
    return dropped ? -p : p;
  } else {
    if (p != p) return dropped ? -p : p;
    unsigned u = __float_as_uint(fminf(p, 1.f));
    if (negative) u |= 1u << 30;
    if (dropped) u |= 1u << 31;
    return __uint_as_float(u);
  }
}
template <int KIND>
__device__ __forceinline__ ItemP unpack_item_p(float word) {
  if constexpr (KIND != kAdd) {
    return {fabsf(word), signbit(word) != 0, false};
  } else {
    const unsigned u = __float_as_uint(word), mag = u & 0x7fffffffu;
    if (mag > 0x7f800000u)  // NaN
      return {__uint_as_float(mag), (u >> 31) != 0, false};
    return {__uint_as_float(mag & 0x3fffffffu), (u >> 31) != 0,
            ((mag >> 30) & 1u) != 0};
  }
}

constexpr int kChunk = 32;         // edges per chunk (items in smem)
constexpr int kStagedWarps = 32;   // warps of a staged (windowed) block
constexpr int kPlainWarps = 8;     // warps of a plain block
constexpr int kPlainOwners = 16;   // owners of a plain block
constexpr int kMaxThreads = 1024;  // -> <= 64 registers per thread
constexpr int kWideThreads = 512;  // -> <= 128 registers per thread
constexpr int kMaxHeads = 128;     // item -> (edge, head) magic split
constexpr int kSegEdges = 256;     // plain blocks: edges per segment of a
                                   // long owner (partials + combine)
constexpr int kUnrollRows = 4;     // neighbour rows in flight per lane
constexpr int kUnrollCols = 2;     // (cols: two vectors per edge live)
constexpr int kWarpEdges = 4;      // edges per step, for_chunk_warp_edges
// Passes whose blocks hold at most kWideThreads threads (<= 128 registers)
// instead of kMaxThreads (<= 64): the half-precision gatv2 cols pass spilled
// 370-630 bytes per thread at 64 and runs 7-40 % faster without (NOTES
// "Session 27"); every other pass measured slower with half the warps
// (fp32 'dot' cols +10-18 %, rows passes +6-20 %, fp32 gatv2 cols +-5 %).
template <typename T, int KIND, bool COLS>
inline constexpr bool kWideBlock =
    COLS && KIND == kGatv2 && !std::is_same_v<T, float>;

// The feature accumulation with every lane on each edge (group ==
// kWarpSize) takes for_chunk_warp_edges -- not at the all-features level:
// its per-edge edge-key / value reads and writes leave it no registers to
// spare (gatv2-edge-dropout 11.7 -> 12.2 ms per step with it).
template <int FEAT>
__device__ __forceinline__ bool warp_edges(int group) {
  return group == kWarpSize && !kHasEdgeKV<FEAT>;
}

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
                 pad4(H) + 2 * (size_t)H * kChunk + (lean ? pad4(HF) : 0)
           : pad4(HD_k) + pad4(HF) + pad4((add ? 4 : 2) * H) +
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

// for_chunk_vectors where every lane is on each edge (group == kWarpSize,
// sub == 0), Q (2 or 4) edges at a time: their neighbour ids come in Q / 2
// 16-byte reads (int64) instead of one broadcast read per edge, and so do
// their per-head coefficients: `coefs(s, sl, e)` reads those of edges e ..
// e + Q - 1 for slot sl at once (float2 / float4 reads: 8- / 16-byte
// aligned, e a multiple of Q; any type), `coef1(s, sl, e)` one tail edge's
// into the same type (component 0). `body(e, s, sl, x, c, k)` then takes
// edge e's row slot x with its coefficients c, component k (a constant
// once unrolled). Edges reach each slot's accumulator in the same order as
// in for_chunk_vectors. `row_of(j, sl)`: slot sl of neighbour j's row.
// (The forward's spmm_one_slot is this loop for one slot and int32 ids,
// kept apart: written through this helper the forward ran 3 % slower.)
template <typename T, int VW, int SLOTS, int Q, typename OFF, typename RowOf,
          typename Coefs, typename Coef1, typename Body>
__device__ __forceinline__ void for_chunk_warp_edges(
    int n, int slots, int c0, int lane, const int64_t* j, RowOf row_of,
    Coefs coefs, Coef1 coef1, Body body) {
  static_assert(Q == 2 || Q == 4, "2 or 4 edges at a time");
  int e = 0;
  for (; e + Q - 1 < n; e += Q) {
    OFF jr[Q];
#pragma unroll
    for (int u = 0; u < Q; u += 2) {
      const longlong2 jj = *reinterpret_cast<const longlong2*>(j + e + u);
      jr[u] = (OFF)jj.x, jr[u + 1] = (OFF)jj.y;
    }
#pragma unroll
    for (int s = 0; s < SLOTS; ++s) {
      const int sl = c0 + lane + s * kWarpSize;
      if (sl < slots) {
        const auto c = coefs(s, sl, e);
        float x[Q][VW];
#pragma unroll
        for (int u = 0; u < Q; ++u) load_vec<T, VW>(row_of(jr[u], sl), x[u]);
#pragma unroll
        for (int u = 0; u < Q; ++u) body(e + u, s, sl, x[u], c, u);
      }
    }
  }
  for (; e < n; ++e) {
    const OFF jr = (OFF)j[e];
#pragma unroll
    for (int s = 0; s < SLOTS; ++s) {
      const int sl = c0 + lane + s * kWarpSize;
      if (sl < slots) {
        float x[VW];
        load_vec<T, VW>(row_of(jr, sl), x);
        body(e, s, sl, x, coef1(s, sl, e), 0);
      }
    }
  }
}

// Q consecutive fp32 of a shared-memory row (8- / 16-byte aligned), as a
// float2 / float4; component k of one (k a constant once unrolled); a pair
// (the rows pass's p and t of Q edges).
template <int Q> struct FloatQ;
template <> struct FloatQ<2> { using type = float2; };
template <> struct FloatQ<4> { using type = float4; };
template <int Q>
__device__ __forceinline__ typename FloatQ<Q>::type loadq(const float* p) {
  return *reinterpret_cast<const typename FloatQ<Q>::type*>(p);
}
template <int Q>
__device__ __forceinline__ typename FloatQ<Q>::type firstq(float v) {
  typename FloatQ<Q>::type r{};
  r.x = v;
  return r;
}
__device__ __forceinline__ float comp(const float2& v, int k) {
  return k == 0 ? v.x : v.y;
}
__device__ __forceinline__ float comp(const float4& v, int k) {
  return k == 0 ? v.x : k == 1 ? v.y : k == 2 ? v.z : v.w;
}
template <typename V> struct Pair {
  V a, b;
};

}  // namespace bwd
}  // namespace pyg_dfgnn

// The backward's two passes for short owners (molecule-sized batches,
// graphs of low degree; short_rows.cuh): a warp per owner (or 32 / lanes
// owners where fewer lanes hold one), each lane NV VW-vectors of the
// owner's features, S edges a step, every sum in registers; no shared
// memory, no chunks, no block phases. The block passes (bwd_rows_pass.cuh,
// bwd_cols_pass.cuh) spent zinc-like's backward in that machinery: 0.34 ms
// of its 0.42 ms forward + backward after the short-row forward.
// Same contract as the block passes (bwd_common.cuh's formulas):
//   rows (CSR, owner i): p, dp, t per edge -> ebuf (p packed as there),
//     D_i -> drow, dQ_i = A_i - D_i B_i;
//   cols (CSC, owner j): (p, t) from ebuf, ds = t - p D_i (leaky' for
//     'add' from the packed flag), dK_j = sum ds g, dV_j = sum p dO_i.
// ebuf stored (not lean); 'dot' (D = F) and 'add'; the training features of
// level FEAT except edge keys / values, as the block passes take them: the
// edge score in the score and its gradient (d es = ds, the cols pass),
// dropout (the forward's Philox mask, regenerated), the returned weights'
// gradient in dp. Scores are formed as the short-row forward forms them
// at the same NV (lane_dot, head_sums: same sums; short_slices); a one-
// edge row's p is exactly 1 (its dQ exactly 0) whichever forward formed lse.
#pragma once

#include "bwd_common.cuh"
#include "short_rows.cuh"

namespace pyg_dfgnn {
namespace bwd {

constexpr int kShortThreads = 256;

// Resident blocks per SM the passes are held to (0: no bound): dropout
// alone ('add') took 56 registers (4 blocks) against the plain pass's 46
// (5); 48 without spill ('dot' spilled 88 bytes: unbounded). GAT's edge
// score alone in fp32 took 48 (rows) and 42 (cols) registers, 5 blocks
// against the plain passes' 6: held to 6 (40; the rows pass spills 8
// bytes), gat-edge's rows / cols passes 0.590 / 0.581 -> 0.546 / 0.532 ms
// (H100, session 37).
// The plain fp32 'dot' cols pass: 56 registers (4 blocks), held to 5 (48,
// 8 bytes spilled): mnist- / zinc-like 1x128 cols 0.095 / 0.085 -> 0.085 /
// 0.080 ms; the same for its rows pass (64 -> 48, 36 bytes spilled) and
// forward (47 -> 40 at 6, 32 bytes) was slower, and half precision's cols
// at 6 / rows at 3 spill 80 / 60 bytes (not taken; session 37). int64
// indices stay unbounded (16 / 28 bytes spilled at 6).
template <typename I, int KIND, int FEAT, int VW>
inline constexpr int kShortRowsMinBlocks =
    KIND != kAdd || VW > 4                  ? 0
    : FEAT == kFeatDropout                  ? 5
    : FEAT == kFeatScore && sizeof(I) == 4  ? 6
                                            : 0;
template <typename I, int KIND, int FEAT, int VW>
inline constexpr int kShortColsMinBlocks =
    sizeof(I) != 4                          ? 0
    : VW > 4                                ? 0
    : KIND == kDot && FEAT == kFeatNone     ? 5
    : KIND == kAdd && FEAT == kFeatScore    ? 6
                                            : 0;

// A walk with NV > 1 (no training features): the blocks the passes of one
// group a block keep (the walk's state: 4-16 registers more).
template <typename I, int KIND, int FEAT, int VW, int NV, bool WALK>
inline constexpr int kShortRowsBlocks =
    NV == 1                ? kShortRowsMinBlocks<I, KIND, FEAT, VW>
    : !WALK || FEAT != kFeatNone ? 0
    : KIND == kDot         ? (VW == 4 && NV == 4 ? 2 : 0)
    : VW * NV == 16        ? 3
    : VW * NV == 32        ? 2
                           : 0;
template <typename I, int KIND, int FEAT, int VW, int NV, bool WALK>
inline constexpr int kShortColsBlocks =
    NV == 1                ? kShortColsMinBlocks<I, KIND, FEAT, VW>
    : !WALK || FEAT != kFeatNone ? 0
    : VW == 4              ? (NV == 4 ? 3 : 4)
                           : 0;

// NV: vectors a lane (short_rows.cuh's slices, the forward's). WALK: a
// persistent launch (launch_short_walk) as the short-row forward's, else
// one group a block.
template <typename T, typename I, int KIND, int VW, int NV, int FEAT,
          bool WALK>
__global__ void __launch_bounds__(
    kShortThreads, kShortRowsBlocks<I, KIND, FEAT, VW, NV, WALK>)
    short_rows_bwd_kernel(BwdArgs<T, I> a, int lanes) {
  static_assert(KIND == kDot || KIND == kAdd, "short: 'dot' or 'add'");
  constexpr int EW = VW * NV;  // a lane's elements
  constexpr int S = kShortRowsStep<KIND, VW, EW>;  // edges a step
  const int H = a.H, F = a.F, HF = H * F;
  const T* galpha = kHasWeights<FEAT> ? a.galpha : nullptr;
  uint64_t seed, offset;
  drop_begin<FEAT>(a.drop, seed, offset);
  // the first group's range
  OwnerWalk w = owner_walk<VW, NV>(lanes, a.n_owner, H, F);
  const OwnerLane& lo_ = w.lane;
  int64_t elo, ehi;
  owner_range(a.ptr, w, 0, elo, ehi);
#pragma unroll 1
  for (; __any_sync(kFullMask, w.has()); w.owner += w.step) {
    const int64_t row = w.owner;
    OwnerLane o = lo_;
    o.on = o.on && w.has();
    // the next group's range (its ptr entries in L2 since a group ago)
    int64_t nlo = 0, nhi = 0;
    if constexpr (WALK) {
      owner_range(a.ptr, w, 1, nlo, nhi);
      prefetch_range(a.ptr, w, 2);
    }
    const int h = o.h, G = o.G, sv = G * VW;
    const bool first = o.on && o.c0 % F == 0;  // writes the head's scalars
    float q[EW], dout[EW], qh = 0.f, lse = 0.f;
#pragma unroll
    for (int i = 0; i < EW; ++i) q[i] = dout[i] = 0.f;
    if (o.on) {
      if constexpr (KIND == kDot)
        load_slices<T, VW, NV>(a.own_a + row * HF + o.c0, sv, q);
      else
        qh = to_float(a.own_a[row * H + h]);
      load_slices<T, VW, NV>(a.own_b + row * HF + o.c0, sv, dout);
      lse = __ldg(a.lse + row * H + h);
    }
    const bool one_edge = ehi - elo == 1;
    // steps of S edges: the longest of the warp's rows (warp-uniform, the
    // shuffles need every lane)
    const unsigned steps =
        __reduce_max_sync(kFullMask, (unsigned)((ehi - elo + S - 1) / S));
    // 'dot': A = sum t k, B = sum p k (vectors); 'add': sum t leaky',
    // sum p leaky' (the head's scalars, in acc_a[0] / acc_b[0])
    float acc_a[EW], acc_b[EW], dsum = 0.f;
#pragma unroll
    for (int i = 0; i < EW; ++i) acc_a[i] = acc_b[i] = 0.f;
    // Base pointers, as the short-row forward (issue-bound): this lane's
    // columns of the neighbour rows (int32 indices: a 32x32-bit wide
    // multiply per edge) and its head's column of the edge scores / ebuf,
    // stepped S edges a step (the edge-score pointer whether or not there
    // are any: no null test in the loop).
    const T* k_lane = KIND == kDot ? a.nbr_a + o.c0 : a.nbr_a + h;
    const int k_stride = KIND == kDot ? HF : H;
    const T* v_lane = a.nbr_b + o.c0;
    const bool has_es = kHasScore<FEAT> && a.et.es != nullptr && o.on;
    const T* es_lane = (has_es ? a.et.es : a.own_a) + elo * H + h;
    float2* ebuf_lane = a.ebuf + elo * H + h;
    const int64_t lane_step = S * (int64_t)H;
    DropoutBatch<FEAT> drop(H, lanes);
    for (unsigned st = 0; st < steps;
         ++st, es_lane += lane_step, ebuf_lane += lane_step) {
      const int64_t e = elo + S * (int64_t)st;
      const bool one = e < ehi, two = S == 2 && e + 1 < ehi;
      I j0, j1;
      edge_ids<S>(a.idx, e, ehi, j0, j1);
      I j[S];
      j[0] = j0;
      if constexpr (S == 2) j[1] = two ? j1 : j0;
      float k[S][EW], v[S][EW], kh[S];
#pragma unroll
      for (int u = 0; u < S; ++u) {
        kh[u] = 0.f;
#pragma unroll
        for (int i = 0; i < EW; ++i) k[u][i] = v[u][i] = 0.f;
      }
      if (o.on && one) {
        if constexpr (KIND == kDot) {
#pragma unroll
          for (int u = 0; u < S; ++u)
            load_slices<T, VW, NV>(k_lane + (int64_t)j[u] * k_stride, sv,
                                   k[u]);
        } else {
#pragma unroll
          for (int u = 0; u < S; ++u)
            kh[u] = to_float(k_lane[(int64_t)j[u] * k_stride]);
        }
#pragma unroll
        for (int u = 0; u < S; ++u)
          load_slices<T, VW, NV>(v_lane + (int64_t)j[u] * HF, sv, v[u]);
      }
      // ahead: at the first step, the next group's ids into L2
      if (WALK && st == 0 && nlo < nhi) prefetch_l2(a.idx + nlo);
      float s[S], gz[S], dp[S], term[S];
#pragma unroll
      for (int u = 0; u < S; ++u) gz[u] = 1.f, term[u] = 0.f;
      if (has_es && one) {
        term[0] = to_float(es_lane[0]);
        if constexpr (S == 2)
          if (two) term[1] = to_float(es_lane[H]);
      }
      // the step's head sums at once (head_sums: group_sum's sums in fewer
      // shuffles): scores first, then dp
      if constexpr (KIND == kDot) {
        float x[2 * S];
#pragma unroll
        for (int u = 0; u < S; ++u) {
          x[u] = lane_dot<EW>(q, k[u]);
          x[S + u] = lane_dot<EW>(dout, v[u]);
        }
        head_sums<2 * S>(x, G);
#pragma unroll
        for (int u = 0; u < S; ++u) {
          s[u] = fmaf(x[u], a.scale, term[u]);
          dp[u] = x[S + u];
        }
      } else {
        float x[S];
#pragma unroll
        for (int u = 0; u < S; ++u) x[u] = lane_dot<EW>(dout, v[u]);
        if constexpr (S == 2)
          head_sums<2>(x, G);
        else
          x[0] = group_sum(x[0], G);
#pragma unroll
        for (int u = 0; u < S; ++u) {
          const float z = qh + kh[u] + term[u];
          s[u] = leaky_relu(z, a.slope);
          gz[u] = leaky_relu_grad(z, a.slope);
          dp[u] = x[u];
        }
      }
      float fu[S];
      drop.step(a.drop, seed, offset, elo, e, st, h, fu);
      if (!one) continue;  // (this row is done; the shuffles above ran)
#pragma unroll
      for (int u = 0; u < S; ++u) {
        if (u == 1 && !two) break;
        // out_i = sum_j f p_ij v_j: dL/dp_ij = f dp_ij (+ the returned
        // weights' own gradient)
        // (a one-edge row: exactly 1, whichever forward formed lse)
        const float p = one_edge ? 1.f : expf(s[u] - lse);
        const float f = fu[u];
        float dpe = f * dp[u];
        if (galpha != nullptr) {
          const int64_t ea = a.aperm != nullptr ? (int64_t)a.aperm[e + u]
                                                : e + u;
          dpe = fmaf(to_float(galpha[ea * H + h]),
                     a.galpha_dropped ? f : 1.f, dpe);
        }
        const float t = p * dpe;
        dsum += t;
        if constexpr (KIND == kDot) {
#pragma unroll
          for (int i = 0; i < EW; ++i) {
            acc_a[i] = fmaf(t, k[u][i], acc_a[i]);
            acc_b[i] = fmaf(p, k[u][i], acc_b[i]);
          }
        } else {
          acc_a[0] += t * gz[u];
          acc_b[0] += p * gz[u];
        }
        if (first)
          ebuf_lane[u * H] = make_float2(
              pack_item_p<KIND>(p, f == 0.f, KIND == kAdd && gz[u] != 1.f),
              t);
      }
    }
    if (o.on) {
      if (first) a.drow[row * H + h] = dsum;
      // D * B rounded like A's products (no FMA contraction): a row whose
      // softmax is one edge (p = 1) gives exactly 0, as in the block pass
      if constexpr (KIND == kDot) {
        float x[EW];
#pragma unroll
        for (int i = 0; i < EW; ++i)
          x[i] = (acc_a[i] - __fmul_rn(dsum, acc_b[i])) * a.scale;
        store_slices<T, VW, NV>(a.grad_a + row * HF + o.c0, sv, x);
      } else if (first) {
        a.grad_a[row * H + h] =
            from_float<T>(acc_a[0] - __fmul_rn(dsum, acc_b[0]));
      }
    }
    if constexpr (!WALK) break;
    elo = nlo, ehi = nhi;
  }
}

// No shuffles here: each lane walks its own column. dV takes the dropped
// p' = f p (the packed flag: f = 0, else 1 / (1 - drop)). WALK as the
// rows pass's (the next group's range ahead; its ids not asked into L2:
// that measured slower here).
template <typename T, typename I, int KIND, int VW, int NV, int FEAT,
          bool WALK>
__global__ void __launch_bounds__(
    kShortThreads, kShortColsBlocks<I, KIND, FEAT, VW, NV, WALK>)
    short_cols_bwd_kernel(BwdArgs<T, I> a, int lanes) {
  static_assert(KIND == kDot || KIND == kAdd, "short: 'dot' or 'add'");
  constexpr int EW = VW * NV;  // a lane's elements
  const int H = a.H, F = a.F, HF = H * F;
  const float keep_scale = a.drop.active ? a.drop.keep_scale : 1.f;
  T* g_es = kHasScore<FEAT> && KIND != kGatv2 ? a.g_es : nullptr;
  // the first group's range
  OwnerWalk w = owner_walk<VW, NV>(lanes, a.n_owner, H, F);
  const OwnerLane& o = w.lane;
  int64_t elo, ehi;
  owner_range(a.ptr, w, 0, elo, ehi);
#pragma unroll 1
  for (; __any_sync(kFullMask, w.has()); w.owner += w.step) {
    // the next group's range (its ptr entries in L2 since a group ago)
    int64_t nlo = 0, nhi = 0;
    if constexpr (WALK) {
      owner_range(a.ptr, w, 1, nlo, nhi);
      prefetch_range(a.ptr, w, 2);
    }
    if (o.on && w.has()) {
      const int64_t col = w.owner;
      const int h = o.h, sv = o.G * VW;
      // 'dot': dK = sum ds q_i (vector); 'add': sum ds (the head's scalar)
      float gk[EW], gv[EW], gk_add = 0.f;
#pragma unroll
      for (int i = 0; i < EW; ++i) gk[i] = gv[i] = 0.f;
      const bool first = o.c0 % F == 0;  // writes the head's d es
      // base pointers (the rows pass's note): this lane's columns of the
      // neighbour rows, its head's column of ebuf / drow / d es (int32
      // indices: a 32x32-bit wide multiply per edge)
      const T* q_lane = a.nbr_a + o.c0;
      const T* o_lane = a.nbr_b + o.c0;
      const float2* ebuf_lane = a.ebuf + h;
      const float* drow_lane = a.drow + h;
      for (int64_t e = elo; e < ehi; e += 2) {
        const bool two = e + 1 < ehi;
        const I i0 = ldg_index(a.idx + e),
                i1 = two ? ldg_index(a.idx + e + 1) : i0;
        const I c0 = ldg_index(a.perm + e),
                c1 = two ? ldg_index(a.perm + e + 1) : c0;
        const float2 pt[2] = {__ldg(ebuf_lane + (int64_t)c0 * H),
                              __ldg(ebuf_lane + (int64_t)c1 * H)};
        const float d[2] = {__ldg(drow_lane + (int64_t)i0 * H),
                            __ldg(drow_lane + (int64_t)i1 * H)};
        float qx[2][EW], ox[2][EW];
        if constexpr (KIND == kDot) {
          load_slices<T, VW, NV, true>(q_lane + (int64_t)i0 * HF, sv, qx[0]);
          load_slices<T, VW, NV, true>(q_lane + (int64_t)i1 * HF, sv, qx[1]);
        }
        load_slices<T, VW, NV, true>(o_lane + (int64_t)i0 * HF, sv, ox[0]);
        load_slices<T, VW, NV, true>(o_lane + (int64_t)i1 * HF, sv, ox[1]);
#pragma unroll
        for (int u = 0; u < 2; ++u) {
          if (u == 1 && !two) break;
          const ItemP ip = unpack_item_p<KIND>(pt[u].x);
          float ds = pt[u].y - ip.p * d[u];
          const float pv = !kHasDropout<FEAT> ? ip.p
                           : ip.dropped      ? 0.f
                                             : ip.p * keep_scale;
#pragma unroll
          for (int i = 0; i < EW; ++i) gv[i] = fmaf(pv, ox[u][i], gv[i]);
          if constexpr (KIND == kDot) {
#pragma unroll
            for (int i = 0; i < EW; ++i) gk[i] = fmaf(ds, qx[u][i], gk[i]);
          } else {
            if (ip.negative) ds *= a.slope;  // leaky'(z), as the rows pass saw z
            gk_add += ds;
          }
          if (g_es != nullptr && first)  // d es = ds (leaky' for 'add')
            g_es[(int64_t)(u == 0 ? c0 : c1) * H + h] = from_float<T>(ds);
        }
      }
      store_slices<T, VW, NV>(a.grad_b + col * HF + o.c0, sv, gv);
      if constexpr (KIND == kDot) {
#pragma unroll
        for (int i = 0; i < EW; ++i) gk[i] *= a.scale;
        store_slices<T, VW, NV>(a.grad_a + col * HF + o.c0, sv, gk);
      } else if (o.c0 % F == 0) {
        a.grad_a[col * H + h] = from_float<T>(gk_add);
      }
    }
    if constexpr (!WALK) break;
    elo = nlo, ehi = nhi;
  }
}

}  // namespace bwd
}  // namespace pyg_dfgnn

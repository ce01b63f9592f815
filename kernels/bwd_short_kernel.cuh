// The backward's two passes for short owners (molecule-sized batches,
// graphs of low degree; short_rows.cuh): a warp per owner (or 32 / lanes
// owners where fewer lanes hold one), each lane one VW-vector of the
// owner's features, two edges in flight, every sum in registers; no shared
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
// (head_dot: same products, same shuffles), so a one-edge row's p is
// exactly 1 and its dQ exactly 0 when the forward took that kernel too.
#pragma once

#include "bwd_common.cuh"
#include "short_rows.cuh"

namespace pyg_dfgnn {
namespace bwd {

constexpr int kShortThreads = 256;

template <typename T, typename I, int KIND, int VW, int FEAT>
__global__ void __launch_bounds__(kShortThreads)
    short_rows_bwd_kernel(BwdArgs<T, I> a, int lanes) {
  static_assert(KIND == kDot || KIND == kAdd, "short: 'dot' or 'add'");
  const int H = a.H, F = a.F, HF = H * F;
  const OwnerLane o = owner_lane<VW>(lanes, a.n_owner, H, F);
  const int64_t row = o.owner;
  const int h = o.h, G = o.G;
  const bool first = o.on && o.c0 % F == 0;  // writes the head's scalars
  float q[VW], dout[VW], qh = 0.f, lse = 0.f;
#pragma unroll
  for (int i = 0; i < VW; ++i) q[i] = dout[i] = 0.f;
  if (o.on) {
    if constexpr (KIND == kDot)
      load_vec<T, VW>(a.own_a + row * HF + o.c0, q);
    else
      qh = to_float(a.own_a[row * H + h]);
    load_vec<T, VW>(a.own_b + row * HF + o.c0, dout);
    lse = a.lse[row * H + h];
  }
  const int64_t elo = o.has ? a.ptr[row] : 0;
  const int64_t ehi = o.has ? a.ptr[row + 1] : 0;
  // steps of two edges: the longest of the warp's rows (warp-uniform, the
  // shuffles need every lane)
  const unsigned steps =
      __reduce_max_sync(kFullMask, (unsigned)((ehi - elo + 1) / 2));
  // 'dot': A = sum t k, B = sum p k (vectors); 'add': sum t leaky',
  // sum p leaky' (the head's scalars, in acc_a[0] / acc_b[0])
  float acc_a[VW], acc_b[VW], dsum = 0.f;
#pragma unroll
  for (int i = 0; i < VW; ++i) acc_a[i] = acc_b[i] = 0.f;
  const T* es = kHasScore<FEAT> ? a.et.es : nullptr;
  const T* galpha = kHasWeights<FEAT> ? a.galpha : nullptr;
  uint64_t seed, offset;
  drop_begin<FEAT>(a.drop, seed, offset);
  DropoutBatch<FEAT> drop(H, lanes);
  for (unsigned st = 0; st < steps; ++st) {
    const int64_t e = elo + 2 * (int64_t)st;
    const bool one = e < ehi, two = e + 1 < ehi;
    const int64_t j0 = one ? (int64_t)a.idx[e] : 0;
    const int64_t j1 = two ? (int64_t)a.idx[e + 1] : j0;
    float k[2][VW], v[2][VW], kh[2] = {0.f, 0.f};
#pragma unroll
    for (int i = 0; i < VW; ++i) k[0][i] = k[1][i] = v[0][i] = v[1][i] = 0.f;
    if (o.on && one) {
      if constexpr (KIND == kDot) {
        load_vec<T, VW>(a.nbr_a + j0 * HF + o.c0, k[0]);
        load_vec<T, VW>(a.nbr_a + j1 * HF + o.c0, k[1]);
      } else {
        kh[0] = to_float(a.nbr_a[j0 * H + h]);
        kh[1] = to_float(a.nbr_a[j1 * H + h]);
      }
      load_vec<T, VW>(a.nbr_b + j0 * HF + o.c0, v[0]);
      load_vec<T, VW>(a.nbr_b + j1 * HF + o.c0, v[1]);
    }
    float s[2], gz[2] = {1.f, 1.f}, dp[2], term[2] = {0.f, 0.f};
    if (es != nullptr && o.on && one) {
      term[0] = to_float(es[e * H + h]);
      if (two) term[1] = to_float(es[(e + 1) * H + h]);
    }
#pragma unroll
    for (int u = 0; u < 2; ++u) {
      if constexpr (KIND == kDot) {
        s[u] = fmaf(head_dot<VW>(q, k[u], G), a.scale, term[u]);
      } else {
        const float z = qh + kh[u] + term[u];
        s[u] = leaky_relu(z, a.slope);
        gz[u] = leaky_relu_grad(z, a.slope);
      }
      dp[u] = head_dot<VW>(dout, v[u], G);
    }
    float fu[2];
    drop.step(a.drop, seed, offset, elo, e, st, h, fu);
    if (!one) continue;  // (this row is done; the shuffles above ran)
#pragma unroll
    for (int u = 0; u < 2; ++u) {
      if (u == 1 && !two) break;
      // out_i = sum_j f p_ij v_j: dL/dp_ij = f dp_ij (+ the returned
      // weights' own gradient)
      const float p = expf(s[u] - lse);
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
        for (int i = 0; i < VW; ++i) {
          acc_a[i] = fmaf(t, k[u][i], acc_a[i]);
          acc_b[i] = fmaf(p, k[u][i], acc_b[i]);
        }
      } else {
        acc_a[0] += t * gz[u];
        acc_b[0] += p * gz[u];
      }
      if (first)
        a.ebuf[(e + u) * H + h] = make_float2(
            pack_item_p<KIND>(p, f == 0.f, KIND == kAdd && gz[u] != 1.f),
            t);
    }
  }
  if (!o.on) return;
  if (first) a.drow[row * H + h] = dsum;
  // D * B rounded like A's products (no FMA contraction): a row whose
  // softmax is one edge (p = 1) gives exactly 0, as in the block pass
  if constexpr (KIND == kDot) {
    float x[VW];
#pragma unroll
    for (int i = 0; i < VW; ++i)
      x[i] = (acc_a[i] - __fmul_rn(dsum, acc_b[i])) * a.scale;
    store_vec<T, VW>(a.grad_a + row * HF + o.c0, x);
  } else if (first) {
    a.grad_a[row * H + h] =
        from_float<T>(acc_a[0] - __fmul_rn(dsum, acc_b[0]));
  }
}

// No shuffles here: each lane walks its own column. dV takes the dropped
// p' = f p (the packed flag: f = 0, else 1 / (1 - drop)).
template <typename T, typename I, int KIND, int VW, int FEAT>
__global__ void __launch_bounds__(kShortThreads)
    short_cols_bwd_kernel(BwdArgs<T, I> a, int lanes) {
  static_assert(KIND == kDot || KIND == kAdd, "short: 'dot' or 'add'");
  const int H = a.H, F = a.F, HF = H * F;
  const OwnerLane o = owner_lane<VW>(lanes, a.n_owner, H, F);
  if (!o.on) return;
  const int64_t col = o.owner;
  const int h = o.h;
  // 'dot': dK = sum ds q_i (vector); 'add': sum ds (the head's scalar)
  float gk[VW], gv[VW], gk_add = 0.f;
#pragma unroll
  for (int i = 0; i < VW; ++i) gk[i] = gv[i] = 0.f;
  const int64_t elo = a.ptr[col], ehi = a.ptr[col + 1];
  const float keep_scale = a.drop.active ? a.drop.keep_scale : 1.f;
  T* g_es = kHasScore<FEAT> && KIND != kGatv2 ? a.g_es : nullptr;
  const bool first = o.c0 % F == 0;  // writes the head's d es
  for (int64_t e = elo; e < ehi; e += 2) {
    const bool two = e + 1 < ehi;
    const int64_t i0 = a.idx[e], i1 = two ? (int64_t)a.idx[e + 1] : i0;
    const int64_t c0 = a.perm[e], c1 = two ? (int64_t)a.perm[e + 1] : c0;
    const float2 pt[2] = {a.ebuf[c0 * H + h], a.ebuf[c1 * H + h]};
    const float d[2] = {a.drow[i0 * H + h], a.drow[i1 * H + h]};
    float qx[2][VW], ox[2][VW];
    if constexpr (KIND == kDot) {
      load_vec<T, VW>(a.nbr_a + i0 * HF + o.c0, qx[0]);
      load_vec<T, VW>(a.nbr_a + i1 * HF + o.c0, qx[1]);
    }
    load_vec<T, VW>(a.nbr_b + i0 * HF + o.c0, ox[0]);
    load_vec<T, VW>(a.nbr_b + i1 * HF + o.c0, ox[1]);
#pragma unroll
    for (int u = 0; u < 2; ++u) {
      if (u == 1 && !two) break;
      const ItemP ip = unpack_item_p<KIND>(pt[u].x);
      float ds = pt[u].y - ip.p * d[u];
      const float pv = !kHasDropout<FEAT> ? ip.p
                       : ip.dropped      ? 0.f
                                         : ip.p * keep_scale;
#pragma unroll
      for (int i = 0; i < VW; ++i) gv[i] = fmaf(pv, ox[u][i], gv[i]);
      if constexpr (KIND == kDot) {
#pragma unroll
        for (int i = 0; i < VW; ++i) gk[i] = fmaf(ds, qx[u][i], gk[i]);
      } else {
        if (ip.negative) ds *= a.slope;  // leaky'(z), as the rows pass saw z
        gk_add += ds;
      }
      if (g_es != nullptr && first)  // d es = ds (leaky' for 'add')
        g_es[(u == 0 ? c0 : c1) * H + h] = from_float<T>(ds);
    }
  }
  store_vec<T, VW>(a.grad_b + col * HF + o.c0, gv);
  if constexpr (KIND == kDot) {
#pragma unroll
    for (int i = 0; i < VW; ++i) gk[i] *= a.scale;
    store_vec<T, VW>(a.grad_a + col * HF + o.c0, gk);
  } else if (o.c0 % F == 0) {
    a.grad_a[col * H + h] = from_float<T>(gk_add);
  }
}

}  // namespace bwd
}  // namespace pyg_dfgnn

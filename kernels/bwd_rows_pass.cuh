// Backward rows pass (CSR, owner = destination i), see bwd_common.cuh.
#pragma once

#include "bwd_common.cuh"

namespace pyg_dfgnn {
namespace bwd {

// Owners = destination rows [r_begin, r_end) taken from `next`; K / V rows
// of source j at kb + (j - lo) * HD_k, vb + (j - lo) * HF.
template <typename T, typename I, int KIND, int VW, int SLOTS, typename OFF,
          int FEAT, bool LANES>
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
  // s and dp with the four-feature lanes over the key / value rows
  // (feature_lanes.cuh; 'add' forms dp only): fp32 'dot' / 'gatv2' always,
  // 'add' and half precision only in the LANES kernels (the host picks
  // them for dense graphs: the path's registers cost sparse graphs, NOTES
  // "Session 26"); not at the all-features level (its registers: 248 ->
  // 556 bytes of spills)
  constexpr int FV = kLaneFeatures;
  const int L = (KIND == kAdd ? F : D) / FV;
  const bool feature_lanes =
      ((std::is_same_v<T, float> && KIND != kAdd) || LANES) && VW > 1 &&
      FEAT != kFeatAll && rows_lanes_fit(KIND, H, D, F);
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
    // A one-edge row's softmax is exactly 1: its backward score may differ
    // from the forward's by an ulp (PMF / gatv2 sum in other orders), and
    // p = 1 - 1e-7 left dQ and dK rounding noise where they are 0.
    const bool one_edge = un.slot < 0 && ehi - elo == 1;
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
        // lane e draws the dropout bits of the chunk's edge e (items fetch
        // theirs by a shuffle below)
        const uint32_t dbits =
            lane < n && (pass == 0 || lean)
                ? drop_bits<FEAT>(a.drop, seed, offset, cb + lane, H)
                : 0u;
        if (pass > 0 && !lean) {
          for (int it = lane; it < n_items; it += kWarpSize) {
            const int e = (int)(((unsigned)it * h_magic) >> 20), h = it - e * H;
            const float2 pt = a.ebuf[(cb + e) * H + h];
            w.p[h * C + e] = unpack_item_p<KIND>(pt.x).p;
            w.t[h * C + e] = pt.y;
          }
        }
        if (feature_lanes && (pass == 0 || lean)) {
          // Lanes over the key / value rows (one vector each, as the
          // forward's SDDMM): the query, grad_out (and att) vectors in
          // registers, eight edges' partial s and dp per lane summed over
          // the head's L lanes by transposing butterflies.
          float qv[FV], ov[FV], av[FV];
          if constexpr (KIND != kAdd) load_smem<FV>(w.own + lane * FV, qv);
          load_smem<FV>(w.own2 + lane * FV, ov);
          if constexpr (KIND == kGatv2) load_smem<FV>(att + lane * FV, av);
          const int h = lane / L;
          for (int e0 = 0; e0 < n; e0 += 8) {
            float vs[8], vd[8];
            longlong2 j2;  // 2 edges' neighbours per read
#pragma unroll
            for (int b = 0; b < 8; ++b) {
              vs[b] = vd[b] = 0.f;
              const int e = e0 + b;
              if (b % 2 == 0)
                j2 = *reinterpret_cast<const longlong2*>(w.j + e);
              if (e < n) {
                const OFF jr = (OFF)(b % 2 == 0 ? j2.x : j2.y);
                float kx[FV], vx[FV];
                if constexpr (KIND != kAdd)
                  load_vec<T, FV>(kb + jr * HD_k + lane * FV, kx);
                load_vec<T, FV>(vb + jr * HF + lane * FV, vx);
                if (KIND != kAdd && kHasEdgeKV<FEAT> && a.et.ek != nullptr)
                  add_vec<T, FV>(a.et.ek + (cb + e) * HD_k + lane * FV, kx);
                if (kHasEdgeKV<FEAT> && a.et.ev != nullptr)
                  add_vec<T, FV>(a.et.ev + (cb + e) * HF + lane * FV, vx);
#pragma unroll
                for (int i = 0; i < FV; ++i) {
                  if constexpr (KIND != kAdd)
                    vs[b] = score_elem<KIND>(qv[i], kx[i], av[i], a.slope,
                                             vs[b]);
                  vd[b] = fmaf(ov[i], vx[i], vd[b]);
                }
              }
            }
            int k;
            if constexpr (KIND != kAdd) {
              k = transpose_sum<8>(vs, L);
              transpose_sum<8>(vd, L);
            } else {
              k = transpose_sum<8>(vd, L);  // ('add': its score comes later)
            }
            const int eb = e0 + transpose_item<8>(lane, L);
#pragma unroll
            for (int i = 0; i < 2; ++i) {
              const int e = eb + i;
              if (i < k && transpose_writer<8>(lane, L) && e < n) {
                w.p[h * C + e] = vs[i];
                w.t[h * C + e] = vd[i];
              }
            }
          }
        }
        for (int it0 = 0; !feature_lanes && (pass == 0 || lean) &&
                          it0 < n_items;
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
                    (kHasEdgeKV<FEAT> && a.et.ek != nullptr)
                        ? a.et.ek + (cb + e) * HD_k + h * D
                        : nullptr);
              pd[u] = score_part<kDot, T, VW>(
                  w.own2 + h * F, vb + jr * HF + h * F, nullptr, F, lg * VW,
                  G * VW, 0.f,
                  (kHasEdgeKV<FEAT> && a.et.ev != nullptr)
                      ? a.et.ev + (cb + e) * HF + h * F
                      : nullptr);
            }
          }
#pragma unroll
          for (int u = 0; u < 2; ++u) {
            const float sp = KIND == kAdd ? 0.f : group8_sum(ps[u], G);
            const float dp = group8_sum(pd[u], G);
            if (lg == 0 && ie[u] >= 0) {
              w.p[ih[u] * C + ie[u]] = sp;
              w.t[ih[u] * C + ie[u]] = dp;
            }
          }
        }
        __syncwarp();
        // The items' scalar work with lanes over items (on one lane of each
        // item's group above it left G - 1 lanes idle): p, the dropout
        // factor, t, ebuf; (sp, dp) -> (p g, t) in place. Trip count
        // warp-uniform (the dropout bits' shuffle).
        for (int it0 = 0; (pass == 0 || lean) && it0 < n_items;
             it0 += kWarpSize) {
          const int it = it0 + lane;
          const bool has = it < n_items;
          const int e = has ? (int)(((unsigned)it * h_magic) >> 20) : 0;
          const int h = has ? it - e * H : 0;
          uint32_t ebits = 0u;  // (a warp-uniform condition: all lanes)
          if (kHasDropout<FEAT> && a.drop.active)
            ebits = __shfl_sync(kFullMask, dbits, e);
          if (has) {
            const float sp = w.p[h * C + e], dp = w.t[h * C + e];
            float sc = sp, gz = 1.f;
            if constexpr (KIND == kDot) {
              sc = sp * a.scale;
              if (kHasScore<FEAT> && a.et.es != nullptr)
                sc += to_float(a.et.es[(cb + e) * H + h]);
            }
            if constexpr (KIND == kAdd) {
              float z = w.own[h] + to_float(kb[(OFF)w.j[e] * H + h]);
              if (kHasScore<FEAT> && a.et.es != nullptr)
                z += to_float(a.et.es[(cb + e) * H + h]);
              sc = leaky_relu(z, a.slope);
              gz = leaky_relu_grad(z, a.slope);
            }
            const float p = one_edge ? 1.f : expf(sc - lse_h[h]);
            // out_i = sum_j f p_ij (v_j + ev_ij): dL/dp_ij = f dp_ij
            // (+ the returned weights' own gradient)
            const float f = drop_factor_of<FEAT>(a.drop, ebits, seed, offset,
                                                 cb + e, h, H);
            float dpe = f * dp;
            if (kHasWeights<FEAT> && a.galpha != nullptr) {
              const int64_t ea = a.aperm != nullptr
                                     ? (int64_t)a.aperm[cb + e] : cb + e;
              dpe = fmaf(to_float(a.galpha[ea * H + h]),
                         a.galpha_dropped ? f : 1.f, dpe);
            }
            const float t = p * dpe;
            if (pass == 0 && !lean)
              a.ebuf[(cb + e) * H + h] = make_float2(
                  pack_item_p<KIND>(p, f == 0.f, KIND == kAdd && gz != 1.f),
                  t);
            w.t[h * C + e] = t;
            w.p[h * C + e] = p * gz;
            if constexpr (KIND == kAdd) w.g[h * C + e] = t * gz;
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
          auto row_of = [&](OFF jr, int sl) { return kb + jr * HD_k + sl * VW; };
          auto accumulate = [&](int e, int s, int sl, const float (&xk)[VW],
                                float p, float t) {
            float x[VW];  // k_j + ek_ij
#pragma unroll
            for (int i = 0; i < VW; ++i) x[i] = xk[i];
            if (kHasEdgeKV<FEAT> && a.et.ek != nullptr)
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
                const float g = ax[i] * leaky_relu_grad(qx[i] + x[i], a.slope);
                acc_a[s][i] = fmaf(t, g, acc_a[s][i]);
                acc_b[s][i] = fmaf(p, g, acc_b[s][i]);
              }
            }
          };
          auto one_edge_body = [&](int e, int s, int sl,
                                   const float (&xk)[VW]) {
            accumulate(e, s, sl, xk, w.p[hs[s] * C + e], w.t[hs[s] * C + e]);
          };
          if (warp_edges<FEAT>(group)) {
            // every lane on each edge: Q edges' p and t in one read each
            constexpr int Q = kWarpEdges;
            using V = typename FloatQ<Q>::type;
            for_chunk_warp_edges<T, VW, SLOTS, Q, OFF>(
                n, slots, c0, lane, w.j, row_of,
                [&](int s, int, int e) {
                  return Pair<V>{loadq<Q>(w.p + hs[s] * C + e),
                                 loadq<Q>(w.t + hs[s] * C + e)};
                },
                [&](int s, int, int e) {
                  return Pair<V>{firstq<Q>(w.p[hs[s] * C + e]),
                                 firstq<Q>(w.t[hs[s] * C + e])};
                },
                [&](int e, int s, int sl, const float (&x)[VW],
                    const Pair<V>& c, int k) {
                  accumulate(e, s, sl, x, comp(c.a, k), comp(c.b, k));
                });
          } else {
            for_chunk_vectors<T, VW, SLOTS, kUnrollRows>(
                n, slots, c0, group, ls, sub,
                [&](int e, int sl) { return row_of((OFF)w.j[e], sl); },
                one_edge_body);
          }
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

}  // namespace bwd
}  // namespace pyg_dfgnn

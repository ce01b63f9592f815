// Backward cols pass (CSC, owner = source j), see bwd_common.cuh.
#pragma once

#include "bwd_common.cuh"

namespace pyg_dfgnn {
namespace bwd {

// Lean mode: a chunk's items recomputed from the rows pass's quantities --
// s_ij (score of q_i and the owner's k_j), p = exp(s - lse_i), dp_ij =
// <dO_i, v_j + ev_ij>, the dropout factor f -- then w.p = f p (dV) and
// w.t = ds = t - p D_i (times leaky'(z) for 'add'; d es written), exactly
// as the rows pass formed them (same operations, same order per item).
template <typename T, typename I, int KIND, int VW, typename OFF, int FEAT>
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
  // lane e draws the dropout bits of the chunk's edge e (see the rows pass)
  const int lane = threadIdx.x % kWarpSize;
  const uint32_t dbits =
      lane < n ? drop_bits<FEAT>(a.drop, seed, offset, w.e[lane], H) : 0u;
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
        const T* ek = (kHasEdgeKV<FEAT> && a.et.ek != nullptr)
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
            (kHasEdgeKV<FEAT> && a.et.ev != nullptr)
                ? a.et.ev + ecsr * HF + h * F
                : nullptr,
            F, lg * VW, G * VW);
      }
    }
#pragma unroll
    for (int u = 0; u < 2; ++u) {
      const float sp = KIND == kAdd ? 0.f : group8_sum(ps[u], G);
      const float dp = group8_sum(pd[u], G);
      uint32_t ebits = 0u;  // (a warp-uniform condition: all lanes)
      if (kHasDropout<FEAT> && a.drop.active)
        ebits = __shfl_sync(kFullMask, dbits, ie[u] >= 0 ? ie[u] : 0);
      if (lg == 0 && ie[u] >= 0) {
        const int e = ie[u], h = ih[u];
        const OFF ir = (OFF)w.j[e];
        const int64_t ecsr = w.e[e];
        float sc = sp, gz = 1.f;
        if constexpr (KIND == kDot) {
          sc = sp * a.scale;
          if (kHasScore<FEAT> && a.et.es != nullptr)
            sc += to_float(a.et.es[ecsr * H + h]);
        }
        if constexpr (KIND == kAdd) {
          float z = to_float(qb[ir * H + h]) + w.own[h];
          if (kHasScore<FEAT> && a.et.es != nullptr)
            z += to_float(a.et.es[ecsr * H + h]);
          sc = leaky_relu(z, a.slope);
          gz = leaky_relu_grad(z, a.slope);
        }
        const float p = expf(sc - a.lse[(lo + (int64_t)ir) * H + h]);
        const float f = drop_factor_of<FEAT>(a.drop, ebits, seed, offset,
                                             ecsr, h, H);
        float dpe = f * dp;
        if (kHasWeights<FEAT> && a.galpha != nullptr) {
          const int64_t ea = a.aperm != nullptr ? (int64_t)a.aperm[ecsr] : ecsr;
          dpe = fmaf(to_float(a.galpha[ea * H + h]),
                     a.galpha_dropped ? f : 1.f, dpe);
        }
        const float t = p * dpe;
        w.p[h * C + e] = kHasDropout<FEAT> ? p * f : p;
        float ds = t - p * db[ir * H + h];
        if constexpr (KIND == kAdd) ds *= gz;
        if constexpr (KIND != kGatv2)  // d es = ds (leaky' for 'add')
          if (kHasScore<FEAT> && a.g_es != nullptr)
            a.g_es[ecsr * H + h] = from_float<T>(ds);
        w.t[h * C + e] = ds;
      }
    }
  }
}


// Owners = source nodes [c_begin, c_end); Q / dO rows and D of destination
// i at qb + (i - lo) * HD_k, ob + (i - lo) * HF, db + (i - lo) * H.
template <typename T, typename I, int KIND, int VW, int SLOTS, typename OFF,
          int FEAT, bool LEAN>
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
        const bool need_ds =
            KIND == kAdd   ? pass == 0
            : KIND == kDot ? c0 < slots_k || (kHasEdgeKV<FEAT> && a.ekv_shared)
                           : true;
        if constexpr (LEAN)
          cols_items_recompute<T, I, KIND, VW, OFF, FEAT>(
              a, w, n, G, ng, gi, lg, qb, ob, db, lo, att, seed, offset);
        for (int it = lane; !LEAN && it < n * H; it += kWarpSize) {
          const int e = (int)(((unsigned)it * h_magic) >> 20), h = it - e * H;
          const float2 pt = a.ebuf[w.e[e] * H + h];
          const ItemP ip = unpack_item_p<KIND>(pt.x);
          const float p = ip.p;
          // dV takes the dropped p' = f p
          w.p[h * C + e] = !kHasDropout<FEAT> ? p
                           : ip.dropped      ? 0.f
                                             : p * keep_scale;
          if (!need_ds) continue;
          const OFF ir = (OFF)w.j[e];
          float ds = pt.y - p * db[ir * H + h];
          if constexpr (KIND == kAdd)  // leaky'(z), as the rows pass saw z
            if (ip.negative) ds *= a.slope;
          if constexpr (KIND != kGatv2)  // d es = ds (leaky' for 'add')
            if ((kHasScore<FEAT> && a.g_es != nullptr) && pass == 0)
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
        // dK += ds g (slots < slots_k), dV += p dO (the rest); c: the
        // slot's coefficient of edge e (ds for dK, p for dV)
        auto row_of = [&](OFF ir, int sl) {
          return sl < slots_k ? qb + ir * HD_k + sl * VW
                              : ob + ir * HF + (sl - slots_k) * VW;
        };
        auto coef_row = [&](int s, int sl) {
          return (sl < slots_k ? w.t : w.p) + hs[s] * C;
        };
        auto accumulate = [&](int e, int s, int sl, const float (&x)[VW],
                              float c) {
          const int64_t ecsr = w.e[e];
          if (sl < slots_k) {
            const float ds = c;
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
              if (kHasEdgeKV<FEAT> && a.et.ek != nullptr)
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
              if ((kHasEdgeKV<FEAT> && a.g_ek != nullptr) && !a.ekv_shared)
                store_vec<T, VW>(a.g_ek + ecsr * HD_k + sl * VW, ge);
          } else {
            const float p = c;
            const int sv = sl - slots_k;
#pragma unroll
            for (int i = 0; i < VW; ++i) acc[s][i] = fmaf(p, x[i], acc[s][i]);
            if (kHasEdgeKV<FEAT> && a.g_ev != nullptr) {
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
        };
        auto one_edge_body = [&](int e, int s, int sl, const float (&x)[VW]) {
          accumulate(e, s, sl, x, coef_row(s, sl)[e]);
        };
        if (warp_edges<FEAT>(group)) {
          // every lane on each edge: Q edges' coefficients in one read
          constexpr int Q = kWarpEdges;
          for_chunk_warp_edges<T, VW, SLOTS, Q, OFF>(
              n, slots, c0, lane, w.j, row_of,
              [&](int s, int sl, int e) {
                return loadq<Q>(coef_row(s, sl) + e);
              },
              [&](int s, int sl, int e) {
                return firstq<Q>(coef_row(s, sl)[e]);
              },
              [&](int e, int s, int sl, const float (&x)[VW],
                  const typename FloatQ<Q>::type& c, int k) {
                accumulate(e, s, sl, x, comp(c, k));
              });
        } else {
          for_chunk_vectors<T, VW, SLOTS, kUnrollCols>(
              n, slots, c0, group, ls, sub,
              [&](int e, int sl) { return row_of((OFF)w.j[e], sl); },
              one_edge_body);
        }
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

}  // namespace bwd
}  // namespace pyg_dfgnn

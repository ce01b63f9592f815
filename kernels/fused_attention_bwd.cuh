// Fused backward of the attention op: device code shared by the per-dtype
// translation units (fused_attention_bwd*.cu), so the three dtypes compile in
// parallel.
//
// Two passes, each ONE kernel doing SDDMM-recompute -> softmax-grad -> SpMM
// (the paper's fused backward, appendix B), nothing of size E*F stored:
//
//   p_ij = exp(s_ij - lse_i)   dp_ij = <dO_i, v_j>   ds_ij = p_ij (dp_ij - D_i)
//
//   CSR pass (owner = destination i, neighbours j = col):
//     D_i = <dO_i, O_i> (written to `drow` for the CSC pass),
//     dot:   dQ_i = scale sum_j ds_ij k_j
//     add:   d a_dst_i = sum_j ds_ij leaky'(z_ij)
//     gatv2: d x_r_i = sum_j ds_ij att * leaky'(z_ij); d att += ds_ij leaky(z_ij)
//   CSC pass (owner = source j, neighbours i = csc_row):
//     dot:   dK_j = scale sum_i ds_ij q_i          dV_j = sum_i p_ij dO_i
//     add:   d a_src_j = sum_i ds_ij leaky'(z_ij)  (same dV)
//     gatv2: d x_l_j = sum_i ds_ij att * leaky'(z_ij)
//
// Both passes are the same code: the score and dp are symmetric in (owner,
// neighbour), so `own_a/own_b` and `nbr_a/nbr_b` just swap roles. Each owner's
// sums are accumulated by one warp (or one block for heavy owners) in fixed
// order: no atomics, results are deterministic.
//
// Lane layout of a warp: lane = (slot * HP + hp) * G + g. G lanes share one
// (edge, head) and hold NV vectors of VEC elements each (16-byte loads when
// VEC > 1); HP heads of the same owner side by side; S = 32 / (G * HP) slots
// take S consecutive edges at once.
//
// Work split (one launch per pass, grid = (heavy + window blocks, head groups)):
//   * window blocks: a window of `window` consecutive owners. If the
//     neighbours of its edges span few nodes (batched small graphs), their
//     rows are first staged in shared memory, so each edge reads them from
//     shared memory instead of L2 (halves of the window are tried if the full
//     span does not fit). One warp per owner.
//   * heavy blocks: owners of degree > heavy_deg (super nodes) are done by a
//     whole block each, warps splitting the edges, partial sums reduced in
//     shared memory.
#pragma once

#include <cuda_pipeline.h>

#include "common.cuh"

namespace pyg_dfgnn {
namespace bwd {

constexpr int kWarps = 16;
constexpr int kThreads = kWarps * 32;
enum : int { kKindDot = 0, kKindAdd = 1, kKindGatv2 = 2 };

template <typename T>
struct Params {
  const int64_t* ptr;  // rowptr (CSR pass) / colptr (CSC pass)
  const void* idx;     // col / csc_row, int32 or int64
  bool idx64;
  int64_t n_owner;
  int H, D, F;         // D: score-vector length (1 for 'add')
  int G, HP, S;        // lane layout (see top)
  int window;          // owners per window block
  int heavy_deg;       // owners above this degree go to heavy blocks
  int n_heavy_blocks;  // blockIdx.x < this: heavy role
  int64_t stage_cap;   // max staged neighbour span (nodes)
  const T* own_a;      // CSR: query  | CSC: key
  const T* own_b;      // CSR: dout   | CSC: value
  const T* nbr_a;      // CSR: key    | CSC: query
  const T* nbr_b;      // CSR: value  | CSC: dout
  const T* out;        // CSR: forward output (for D_i)
  const T* att;        // gatv2 [H, D]
  const float* lse;    // [N_dst, H]
  float* drow;         // [N_dst, H]: written by CSR, read by CSC
  T* grad_a;           // CSR: grad_query | CSC: grad_key
  T* grad_b;           // CSC: grad_value
  float* att_part;     // gatv2 CSR: [gridDim.x, H, D] block partials
  float scale, slope;
};

template <typename T, int KIND, bool CSC, int VEC, int NV>
__global__ void __launch_bounds__(kThreads, 1)
    attention_bwd_kernel(const Params<T> P) {
  constexpr bool kAdd = KIND == kKindAdd;
  constexpr bool kGat = KIND == kKindGatv2;
  constexpr int NVV = NV * VEC;
  extern __shared__ __align__(16) unsigned char smem[];
  __shared__ int64_t s_red[2 * kWarps];
  __shared__ int64_t s_heavy[kThreads];
  __shared__ int s_count;

  const int tid = threadIdx.x, lane = tid & 31, warp = tid >> 5;
  const int G = P.G, HP = P.HP, S = P.S, H = P.H, D = P.D, F = P.F;
  const int g = lane % G, hp = (lane / G) % HP, slot = lane / (G * HP);
  const int h0 = blockIdx.y * HP;
  const int HPe = min(HP, H - h0);  // heads of this block's group
  const int h = h0 + hp;
  const bool hok = hp < HPe;
  const int DA = kAdd ? 1 : D;  // stored length of the a-side vectors
  const int64_t n_owner = P.n_owner;
  const float dscale = KIND == kKindDot ? P.scale : 1.f;

  int off[NV];
  bool okD[NV], okF[NV];
#pragma unroll
  for (int v = 0; v < NV; ++v) {
    off[v] = (g + v * G) * VEC;
    okD[v] = hok && off[v] < D;
    okF[v] = hok && off[v] < F;
  }
  float att[NV][VEC], attacc[NV][VEC];
#pragma unroll
  for (int v = 0; v < NV; ++v)
#pragma unroll
    for (int c = 0; c < VEC; ++c) att[v][c] = attacc[v][c] = 0.f;
  if constexpr (kGat) {
#pragma unroll
    for (int v = 0; v < NV; ++v)
      if (okD[v]) load_vec<T, VEC>(P.att + (int64_t)h * D + off[v], att[v]);
  }

  auto load_idx = [&](int64_t e) -> int64_t {
    return P.idx64 ? static_cast<const int64_t*>(P.idx)[e]
                   : static_cast<int64_t>(static_cast<const int32_t*>(P.idx)[e]);
  };
  auto group_sum2 = [&](float& a, float& b) {
    for (int o = 1; o < G; o <<= 1) {
      a += __shfl_xor_sync(kFullMask, a, o);
      b += __shfl_xor_sync(kFullMask, b, o);
    }
  };
  auto slot_sum = [&](float (&x)[NV][VEC]) {
    for (int o = G * HP; o < 32; o <<= 1)
#pragma unroll
      for (int v = 0; v < NV; ++v)
#pragma unroll
        for (int c = 0; c < VEC; ++c)
          x[v][c] += __shfl_xor_sync(kFullMask, x[v][c], o);
  };

  // ---- owner state
  float oA[NV][VEC], oB[NV][VEC], o_lse = 0.f, o_dr = 0.f;
  auto load_owner = [&](int64_t n) {
#pragma unroll
    for (int v = 0; v < NV; ++v)
#pragma unroll
      for (int c = 0; c < VEC; ++c) oA[v][c] = oB[v][c] = 0.f;
    o_lse = o_dr = 0.f;
    float dr = 0.f, unused = 0.f;
    if (hok) {
      const int64_t r = n * H + h;
      if constexpr (kAdd) {
        oA[0][0] = to_float(P.own_a[r]);
      } else {
#pragma unroll
        for (int v = 0; v < NV; ++v)
          if (okD[v]) load_vec<T, VEC>(P.own_a + r * D + off[v], oA[v]);
      }
#pragma unroll
      for (int v = 0; v < NV; ++v)
        if (okF[v]) load_vec<T, VEC>(P.own_b + r * F + off[v], oB[v]);
      if constexpr (!CSC) {
        o_lse = P.lse[r];
#pragma unroll
        for (int v = 0; v < NV; ++v)
          if (okF[v]) {
            float o[VEC];
            load_vec<T, VEC>(P.out + r * F + off[v], o);
#pragma unroll
            for (int c = 0; c < VEC; ++c) dr += oB[v][c] * o[c];
          }
      }
    }
    if constexpr (!CSC) {
      group_sum2(dr, unused);
      o_dr = dr;
    }
  };
  // Neighbour rows of one edge (zeros when !valid).
  struct Nbr {
    float a[NV][VEC], b[NV][VEC], lse, dr;
  };
  auto fetch = [&](Nbr& n, bool valid, int64_t nb, bool staged, int64_t lo,
                   const T* sA, const T* sB, const float* sL,
                   const float* sR) {
#pragma unroll
    for (int v = 0; v < NV; ++v)
#pragma unroll
      for (int c = 0; c < VEC; ++c) n.a[v][c] = n.b[v][c] = 0.f;
    n.lse = n.dr = 0.f;
    if (!valid) return;
    const T* pa;
    const T* pb;
    if (staged) {
      const int64_t r = (nb - lo) * HPe + hp;
      pa = sA + r * DA;
      pb = sB + r * F;
      if constexpr (CSC) {
        n.lse = sL[r];
        n.dr = sR[r];
      }
    } else {
      const int64_t r = nb * H + h;
      pa = P.nbr_a + r * DA;
      pb = P.nbr_b + r * F;
      if constexpr (CSC) {
        n.lse = P.lse[r];
        n.dr = P.drow[r];
      }
    }
    if constexpr (kAdd) {
      n.a[0][0] = to_float(pa[0]);
    } else {
#pragma unroll
      for (int v = 0; v < NV; ++v)
        if (okD[v]) load_vec<T, VEC>(pa + off[v], n.a[v]);
    }
#pragma unroll
    for (int v = 0; v < NV; ++v)
      if (okF[v]) load_vec<T, VEC>(pb + off[v], n.b[v]);
  };

  // ---- edges [beg, end): this warp takes steps base = beg + wfirst,
  // += stride; slot `slot` takes edge base + slot. Two steps at a time (their
  // loads in flight together, their reductions interleaved); the indices of
  // the next two are loaded meanwhile. Neighbour rows come from shared
  // memory (staged, node - lo) or global memory.
  float accA[NV][VEC], accB[NV][VEC];
  auto zero_acc = [&]() {
#pragma unroll
    for (int v = 0; v < NV; ++v)
#pragma unroll
      for (int c = 0; c < VEC; ++c) accA[v][c] = accB[v][c] = 0.f;
  };
  auto run_edges = [&](int64_t beg, int64_t end, int wfirst, int stride,
                       bool staged, int64_t lo, const T* sA, const T* sB,
                       const float* sL, const float* sR) {
    const int64_t st2 = 2 * (int64_t)stride;
    int64_t e0 = beg + wfirst + slot;
    // indices of the current pair of steps, loaded one pair ahead
    int64_t nb0 = e0 < end && hok ? load_idx(e0) : 0;
    int64_t nb1 = e0 + stride < end && hok ? load_idx(e0 + stride) : 0;
    for (int64_t base = beg + wfirst; base < end; base += st2, e0 += st2) {
      const int64_t e1 = e0 + stride, f0 = e0 + st2, f1 = e1 + st2;
      const bool vld[2] = {e0 < end && hok, e1 < end && hok};
      const int64_t nnb0 = f0 < end && hok ? load_idx(f0) : 0;
      const int64_t nnb1 = f1 < end && hok ? load_idx(f1) : 0;
      Nbr n[2];
      fetch(n[0], vld[0], nb0, staged, lo, sA, sB, sL, sR);
      fetch(n[1], vld[1], nb1, staged, lo, sA, sB, sL, sR);
      nb0 = nnb0;
      nb1 = nnb1;
      // the two steps are independent: their reductions interleave
      float sp[2] = {0.f, 0.f}, dp[2] = {0.f, 0.f};
      float lz[2][NV][VEC];  // gatv2: leaky(z)
#pragma unroll
      for (int u = 0; u < 2; ++u)
#pragma unroll
        for (int v = 0; v < NV; ++v)
#pragma unroll
          for (int c = 0; c < VEC; ++c) {
            dp[u] += oB[v][c] * n[u].b[v][c];
            if constexpr (KIND == kKindDot) sp[u] += oA[v][c] * n[u].a[v][c];
            if constexpr (kGat) {
              lz[u][v][c] = leaky_relu(oA[v][c] + n[u].a[v][c], P.slope);
              sp[u] += att[v][c] * lz[u][v][c];
            }
          }
      for (int o = 1; o < G; o <<= 1) {
#pragma unroll
        for (int u = 0; u < 2; ++u) {
          if constexpr (!kAdd) sp[u] += __shfl_xor_sync(kFullMask, sp[u], o);
          dp[u] += __shfl_xor_sync(kFullMask, dp[u], o);
        }
      }
#pragma unroll
      for (int u = 0; u < 2; ++u) {
        float sc, gz = 1.f;
        if constexpr (KIND == kKindDot) sc = sp[u] * P.scale;
        if constexpr (kGat) sc = sp[u];
        if constexpr (kAdd) {
          const float z = oA[0][0] + n[u].a[0][0];
          sc = leaky_relu(z, P.slope);
          gz = leaky_relu_grad(z, P.slope);
        }
        const float lse_i = CSC ? n[u].lse : o_lse;
        const float dr_i = CSC ? n[u].dr : o_dr;
        const float p = vld[u] ? expf(sc - lse_i) : 0.f;
        const float ds = p * (dp[u] - dr_i);
        if constexpr (kAdd) {
          accA[0][0] += ds * gz;
        } else {
#pragma unroll
          for (int v = 0; v < NV; ++v)
#pragma unroll
            for (int c = 0; c < VEC; ++c) {
              if constexpr (KIND == kKindDot)
                accA[v][c] += ds * n[u].a[v][c];
              if constexpr (kGat) {
                const float z = oA[v][c] + n[u].a[v][c];
                accA[v][c] += ds * att[v][c] * leaky_relu_grad(z, P.slope);
                if constexpr (!CSC) attacc[v][c] += ds * lz[u][v][c];
              }
            }
        }
        if constexpr (CSC) {
#pragma unroll
          for (int v = 0; v < NV; ++v)
#pragma unroll
            for (int c = 0; c < VEC; ++c) accB[v][c] += p * n[u].b[v][c];
        }
      }
    }
  };

  // ---- write an owner's reduced sums (lanes of slot 0)
  auto write_owner = [&](int64_t n, const float (&a)[NV][VEC],
                         const float (&b)[NV][VEC]) {
    if (slot != 0 || !hok) return;
    const int64_t r = n * H + h;
    if constexpr (kAdd) {
      if (g == 0) P.grad_a[r] = from_float<T>(a[0][0]);
    } else {
#pragma unroll
      for (int v = 0; v < NV; ++v)
        if (okD[v]) {
          float x[VEC];
#pragma unroll
          for (int c = 0; c < VEC; ++c) x[c] = a[v][c] * dscale;
          store_vec<T, VEC>(P.grad_a + r * D + off[v], x);
        }
    }
    if constexpr (CSC) {
#pragma unroll
      for (int v = 0; v < NV; ++v)
        if (okF[v]) store_vec<T, VEC>(P.grad_b + r * F + off[v], b[v]);
    } else {
      if (g == 0) P.drow[r] = o_dr;
    }
  };

  // Block-wide sum over warps of x (slot-reduced already); result in warp 0.
  float* red = reinterpret_cast<float*>(smem);
  const int L = G * HP;
  auto block_sum = [&](float (&x)[NV][VEC]) {
    if (slot == 0) {
#pragma unroll
      for (int v = 0; v < NV; ++v)
#pragma unroll
        for (int c = 0; c < VEC; ++c)
          red[(warp * L + lane) * NVV + v * VEC + c] = x[v][c];
    }
    __syncthreads();
    if (warp == 0 && slot == 0) {
#pragma unroll
      for (int v = 0; v < NV; ++v)
#pragma unroll
        for (int c = 0; c < VEC; ++c) {
          float t = 0.f;
          for (int w = 0; w < kWarps; ++w)
            t += red[(w * L + lane) * NVV + v * VEC + c];
          x[v][c] = t;
        }
    }
    __syncthreads();
  };

  const int nhb = P.n_heavy_blocks;
  if ((int)blockIdx.x < nhb) {
    // ================= heavy role: owners of degree > heavy_deg
    for (int64_t base = 0; base < n_owner; base += (int64_t)kThreads * nhb) {
      if (tid == 0) s_count = 0;
      __syncthreads();
      const int64_t n = base + (int64_t)tid * nhb + blockIdx.x;
      if (n < n_owner && P.ptr[n + 1] - P.ptr[n] > P.heavy_deg)
        s_heavy[atomicAdd(&s_count, 1)] = n;
      __syncthreads();
      const int cnt = s_count;
      for (int t = 0; t < cnt; ++t) {
        const int64_t o = s_heavy[t];
        load_owner(o);
        zero_acc();
        run_edges(P.ptr[o], P.ptr[o + 1], warp * S, kWarps * S, false, 0,
                  nullptr, nullptr, nullptr, nullptr);
        slot_sum(accA);
        block_sum(accA);
        if constexpr (CSC) {
          slot_sum(accB);
          block_sum(accB);
        }
        if (warp == 0) write_owner(o, accA, accB);
      }
      __syncthreads();  // s_heavy / s_count reuse
    }
  } else {
    // ================= window role
    const int64_t R = P.window;
    const int64_t nwb = gridDim.x - nhb;
    // Neighbour span [lo, hi] of owners [a, b); lo = -1 unless it is worth
    // staging (fits shared memory and is smaller than the edge count).
    // Neighbour span [lo, hi] of owners [a, b) (lo > hi when unknown:
    // no edges, or a heavy owner in the range, whose edges are not scanned).
    // Returns whether staging it pays: it fits shared memory and is
    // smaller than the edge count.
    auto span = [&](int64_t a, int64_t b, int64_t& lo, int64_t& hi) {
      lo = INT64_MAX;
      hi = -1;
      const int64_t e0 = P.ptr[a], nE = P.ptr[b] - e0;
      const int64_t scan_end = nE > (b - a) * P.heavy_deg ? e0 : e0 + nE;
      for (int64_t e = e0 + tid; e < scan_end; e += 4 * kThreads) {
        int64_t x[4];
#pragma unroll
        for (int u = 0; u < 4; ++u)
          x[u] = e + u * kThreads < scan_end ? load_idx(e + u * kThreads)
                                             : int64_t(-1);
#pragma unroll
        for (int u = 0; u < 4; ++u)
          if (x[u] >= 0) {
            lo = min(lo, x[u]);
            hi = max(hi, x[u]);
          }
      }
      for (int o = 16; o; o >>= 1) {
        lo = min(lo, (int64_t)__shfl_xor_sync(kFullMask, lo, o));
        hi = max(hi, (int64_t)__shfl_xor_sync(kFullMask, hi, o));
      }
      __syncthreads();  // s_red readers of the previous range are done
      if (lane == 0) {
        s_red[warp] = lo;
        s_red[kWarps + warp] = hi;
      }
      __syncthreads();
      lo = s_red[0];
      hi = s_red[kWarps];
      for (int w = 1; w < kWarps; ++w) {
        lo = min(lo, s_red[w]);
        hi = max(hi, s_red[kWarps + w]);
      }
      return hi >= lo && hi - lo + 1 <= P.stage_cap && hi - lo + 1 <= nE;
    };
    // Shared-memory layout of a staged span of `cnt` nodes.
    auto carve = [&](int64_t cnt, T*& sA, T*& sB, float*& sL, float*& sR) {
      auto up16 = [](int64_t b) { return (b + 15) & ~int64_t(15); };
      unsigned char* p = smem;
      sA = reinterpret_cast<T*>(p);
      p += up16(cnt * HPe * DA * (int64_t)sizeof(T));
      sB = reinterpret_cast<T*>(p);
      p += up16(cnt * HPe * F * (int64_t)sizeof(T));
      sL = reinterpret_cast<float*>(p);
      p += up16(cnt * HPe * 4);
      sR = reinterpret_cast<float*>(p);
    };
    // Copy the head group's slice (HPe * per_head elements) of nodes
    // [lo, lo + cnt) of a [N, H, per_head] tensor, asynchronously (cp.async:
    // the copies are all in flight at once); stage_wait() completes them.
    auto stage = [&](const T* src, T* dst, int64_t lo, int64_t cnt,
                     int per_head) {
      const int64_t slice = (int64_t)HPe * per_head;
      const int64_t row = (int64_t)H * per_head;
      const T* base = src + lo * row + (int64_t)h0 * per_head;
      if (VEC > 1 && per_head % VEC == 0) {
        const int64_t svec = slice / VEC, nvec = cnt * svec;
        if (slice == row) {  // one head group: contiguous
          for (int64_t t = tid; t < nvec; t += kThreads)
            __pipeline_memcpy_async(dst + t * VEC, base + t * VEC, 16);
        } else {
          for (int64_t t = tid; t < nvec; t += kThreads) {
            const int64_t nd = t / svec, k = t - nd * svec;
            __pipeline_memcpy_async(dst + t * VEC, base + nd * row + k * VEC,
                                    16);
          }
        }
      } else if constexpr (sizeof(T) == 4) {
        for (int64_t t = tid; t < cnt * slice; t += kThreads) {
          const int64_t nd = t / slice, k = t - nd * slice;
          __pipeline_memcpy_async(dst + t, base + nd * row + k, 4);
        }
      } else {  // 2-byte elements: batches of independent loads
        const int64_t total = cnt * slice;
        for (int64_t t0 = tid; t0 < total; t0 += 8 * kThreads) {
          T r[8];
#pragma unroll
          for (int u = 0; u < 8; ++u) {
            const int64_t t = t0 + u * kThreads;
            if (t < total) {
              const int64_t nd = t / slice, k = t - nd * slice;
              r[u] = base[nd * row + k];
            }
          }
#pragma unroll
          for (int u = 0; u < 8; ++u)
            if (t0 + u * kThreads < total) dst[t0 + u * kThreads] = r[u];
        }
      }
    };
    auto stage_f = [&](const float* src, float* dst, int64_t lo, int64_t cnt) {
      for (int64_t t = tid; t < cnt * HPe; t += kThreads) {
        const int64_t nd = t / HPe, k = t - nd * HPe;
        __pipeline_memcpy_async(dst + t, src + (lo + nd) * H + h0 + k, 4);
      }
    };
    // Owners [a, b): stage their neighbours if `lo` >= 0, then one warp
    // per owner.
    auto run_range = [&](int64_t a, int64_t b, int64_t lo, int64_t hi) {
      T *sA = nullptr, *sB = nullptr;
      float *sL = nullptr, *sR = nullptr;
      const bool staged = lo >= 0;
      if (staged) {
        const int64_t cnt = hi - lo + 1;
        carve(cnt, sA, sB, sL, sR);
        stage(P.nbr_a, sA, lo, cnt, DA);
        stage(P.nbr_b, sB, lo, cnt, F);
        if constexpr (CSC) {
          stage_f(P.lse, sL, lo, cnt);
          stage_f(P.drow, sR, lo, cnt);
        }
        __pipeline_commit();
        __pipeline_wait_prior(0);
        __syncthreads();
      }
      for (int64_t o = a + warp; o < b; o += kWarps) {
        const int64_t beg = P.ptr[o], end = P.ptr[o + 1];
        if (end - beg > P.heavy_deg) continue;  // heavy role's
        load_owner(o);
        zero_acc();
        run_edges(beg, end, 0, S, staged, lo, sA, sB, sL, sR);
        slot_sum(accA);
        if constexpr (CSC) slot_sum(accB);
        write_owner(o, accA, accB);
      }
      __syncthreads();  // shared memory free for the next range
    };
    for (int64_t w = (int64_t)blockIdx.x - nhb; w * R < n_owner; w += nwb) {
      const int64_t a = w * R, b = min(a + R, n_owner);
      int64_t lo, hi;
      const bool fit = span(a, b, lo, hi);
      // halves can only fit if the whole is at most twice the capacity
      if (fit || b - a <= kWarps || hi < lo ||
          hi - lo + 1 > 2 * P.stage_cap) {
        run_range(a, b, fit ? lo : -1, hi);
      } else {  // try each half on its own (window straddles two graphs)
        const int64_t m = a + (b - a) / 2;
        bool st = span(a, m, lo, hi);
        run_range(a, m, st ? lo : -1, hi);
        st = span(m, b, lo, hi);
        run_range(m, b, st ? lo : -1, hi);
      }
    }
  }

  if constexpr (kGat && !CSC) {
    // d att partial of this block: sum over its warps and slots.
    slot_sum(attacc);
    __syncthreads();
    block_sum(attacc);
    if (warp == 0 && slot == 0 && hok) {
#pragma unroll
      for (int v = 0; v < NV; ++v)
#pragma unroll
        for (int c = 0; c < VEC; ++c)
          if (off[v] + c < D)
            P.att_part[((int64_t)blockIdx.x * H + h) * D + off[v] + c] =
                attacc[v][c];
    }
  }
}

}  // namespace bwd
}  // namespace pyg_dfgnn

// ============================================================== host side
#include <ATen/cuda/CUDAContext.h>

namespace pyg_dfgnn {
namespace bwd {

// Everything the typed host code needs (tensors already checked).
struct Args {
  at::Tensor grad_out, rowptr, col, colptr, csc_row, query, key, value, att,
      out, lse;
  int64_t kind;
  double scale, slope;
  // outputs, allocated by the caller
  at::Tensor grad_query, grad_key, grad_value, drow, grad_att;
};

template <typename T> void run_bwd(Args& a);

namespace detail {

struct Layout {
  int VEC, NV, G, HP, S, HG;
};

// Lanes per (edge, head) G, vectors per lane NV: about 8 elements per lane
// and vector (16-byte loads, few registers), more lanes for wide rows.
inline Layout choose_layout(int elem_bytes, bool vec_ok, int H, int DA,
                            int F) {
  Layout l;
  l.VEC = vec_ok ? 16 / elem_bytes : 1;
  const int C = (std::max(DA, F) + l.VEC - 1) / l.VEC;  // vectors per row
  const int nv_small = std::max(1, 8 / l.VEC);
  l.NV = (C + nv_small - 1) / nv_small <= 32 ? nv_small : 8;
  const int need = (C + l.NV - 1) / l.NV;
  TORCH_CHECK(need <= 32, "fused_attention_bwd: feature size ",
              std::max(DA, F), " is larger than the CUDA kernels support (",
              32 * 8 * l.VEC, " for this dtype/alignment)");
  l.G = next_pow2(need);
  l.HP = std::min(next_pow2(H), 32 / l.G);
  l.S = 32 / (l.G * l.HP);
  l.HG = (H + l.HP - 1) / l.HP;
  return l;
}

template <typename T, int KIND, bool CSC, int VEC, int NV>
void launch_pass(Params<T> P, const Layout& l, int dev, at::Tensor* att_part,
                 const at::TensorOptions& fopt) {
  auto kernel = attention_bwd_kernel<T, KIND, CSC, VEC, NV>;
  cudaDeviceProp* prop = at::cuda::getDeviceProperties(dev);
  const int64_t es = sizeof(T);
  const int64_t HPe = std::min(l.HP, P.H);
  const int DA = KIND == kKindAdd ? 1 : P.D;
  const int64_t per_node = HPe * (DA + P.F) * es + (CSC ? 8 * HPe : 0);
  const int64_t red_bytes = (int64_t)kWarps * l.G * l.HP * NV * VEC * 4;
  const int64_t static_bytes = 8 * (2 * kWarps + kThreads) + 16;
  const int64_t max_dyn = (int64_t)prop->sharedMemPerBlockOptin -
                          static_bytes - 1024;
  // The register budget (__launch_bounds__(512, 1)) already allows one block
  // per SM: take all the shared memory for staging.
  const int64_t smem = max_dyn;
  TORCH_CHECK(smem >= red_bytes, "fused_attention_bwd: not enough shared "
              "memory for this feature size");
  P.stage_cap = std::max<int64_t>(0, (smem - 64) / per_node);
  // Per device, once: raise the shared-memory limit, read the occupancy.
  static int occ_cache[64] = {0};
  int occ = dev < 64 ? occ_cache[dev] : 0;
  if (occ == 0) {
    if (smem > 48 * 1024)
      C10_CUDA_CHECK(cudaFuncSetAttribute(
          kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, (int)smem));
    C10_CUDA_CHECK(cudaOccupancyMaxActiveBlocksPerMultiprocessor(
        &occ, kernel, kThreads, (size_t)smem));
    occ = std::max(occ, 1);
    if (dev < 64) occ_cache[dev] = occ;
  }
  const int64_t resident = (int64_t)prop->multiProcessorCount * occ;
  const int64_t per_y = std::max<int64_t>(1, resident / l.HG);
  const int64_t n_win = (P.n_owner + P.window - 1) / P.window;
  const int64_t nwb = std::max<int64_t>(1, std::min(n_win, 2 * per_y));
  const int64_t nhb = std::max<int64_t>(
      1, std::min((P.n_owner + kThreads - 1) / kThreads, per_y));
  P.n_heavy_blocks = (int)nhb;
  const dim3 grid((unsigned)(nhb + nwb), (unsigned)l.HG);
  if (att_part != nullptr) {
    *att_part = at::empty({(int64_t)grid.x, P.H, P.D}, fopt);
    P.att_part = att_part->data_ptr<float>();
  }
  kernel<<<grid, kThreads, (size_t)smem,
           at::cuda::getCurrentCUDAStream(dev)>>>(P);
  C10_CUDA_KERNEL_LAUNCH_CHECK();
}

template <typename T, int KIND, bool CSC>
void dispatch_layout(const Params<T>& P, const Layout& l, int dev,
                     at::Tensor* att_part, const at::TensorOptions& fopt) {
  constexpr int V = 16 / sizeof(T);
  constexpr int NVS = 8 / V > 1 ? 8 / V : 1;  // NV of the small layout
  if (l.VEC == 1) {
    TORCH_CHECK(l.NV == 8, "fused_attention_bwd: internal layout error");
    launch_pass<T, KIND, CSC, 1, 8>(P, l, dev, att_part, fopt);
  } else if (l.NV == NVS) {
    launch_pass<T, KIND, CSC, V, NVS>(P, l, dev, att_part, fopt);
  } else {
    TORCH_CHECK(l.NV == 8, "fused_attention_bwd: internal layout error");
    launch_pass<T, KIND, CSC, V, 8>(P, l, dev, att_part, fopt);
  }
}

template <typename T, int KIND>
void run_kind(Args& a, const Layout& l) {
  const int dev = a.value.get_device();
  const auto fopt = a.value.options().dtype(at::kFloat);
  using DT = T;
  auto ptr = [](const at::Tensor& t) {
    return t.defined() ? t.data_ptr<T>() : nullptr;
  };
  auto mptr = [](at::Tensor& t) { return t.data_ptr<T>(); };
  Params<DT> P{};
  P.H = (int)a.value.size(1);
  P.F = (int)a.value.size(2);
  P.D = KIND == kKindAdd ? 1 : (int)a.query.size(2);
  P.G = l.G;
  P.HP = l.HP;
  P.S = l.S;
  P.window = 2 * kWarps;
  P.heavy_deg = 256;
  P.att = ptr(a.att);
  P.lse = a.lse.data_ptr<float>();
  P.drow = a.drow.data_ptr<float>();
  P.scale = (float)a.scale;
  P.slope = (float)a.slope;
  P.idx64 = a.col.scalar_type() == at::kLong;

  const int64_t n_dst = a.rowptr.size(0) - 1, n_src = a.colptr.size(0) - 1;
  // CSR pass: grad_query, D_i (and the d att partials).
  if (n_dst > 0) {
    Params<DT> C = P;
    C.ptr = a.rowptr.data_ptr<int64_t>();
    C.idx = a.col.data_ptr();
    C.n_owner = n_dst;
    C.own_a = ptr(a.query);
    C.own_b = ptr(a.grad_out);
    C.nbr_a = ptr(a.key);
    C.nbr_b = ptr(a.value);
    C.out = ptr(a.out);
    C.grad_a = mptr(a.grad_query);
    at::Tensor att_part;
    dispatch_layout<DT, KIND, false>(C, l, dev,
                                     KIND == kKindGatv2 ? &att_part : nullptr,
                                     fopt);
    if (KIND == kKindGatv2) a.grad_att.copy_(att_part.sum(0));
  } else if (KIND == kKindGatv2) {
    a.grad_att.zero_();
  }
  // CSC pass: grad_key, grad_value.
  if (n_src > 0) {
    Params<DT> C = P;
    C.ptr = a.colptr.data_ptr<int64_t>();
    C.idx = a.csc_row.data_ptr();
    C.n_owner = n_src;
    C.own_a = ptr(a.key);
    C.own_b = ptr(a.value);
    C.nbr_a = ptr(a.query);
    C.nbr_b = ptr(a.grad_out);
    C.grad_a = mptr(a.grad_key);
    C.grad_b = mptr(a.grad_value);
    dispatch_layout<DT, KIND, true>(C, l, dev, nullptr, fopt);
  }
}

}  // namespace detail

template <typename T> void run_bwd(Args& a) {
  using DT = T;
  const int H = (int)a.value.size(1), F = (int)a.value.size(2);
  const int DA = a.kind == kKindAdd ? 1 : (int)a.query.size(2);
  const int V = 16 / (int)sizeof(DT);
  bool vec_ok = F % V == 0 && (a.kind == kKindAdd || DA % V == 0);
  for (const at::Tensor* t : {&a.grad_out, &a.query, &a.key, &a.value, &a.out,
                              &a.att, &a.grad_query, &a.grad_key,
                              &a.grad_value})
    if (t->defined() && reinterpret_cast<uintptr_t>(t->data_ptr()) % 16 != 0)
      vec_ok = false;
  const detail::Layout l =
      detail::choose_layout((int)sizeof(DT), vec_ok, H, DA, F);
  switch (a.kind) {
    case kKindDot: detail::run_kind<T, kKindDot>(a, l); break;
    case kKindAdd: detail::run_kind<T, kKindAdd>(a, l); break;
    default: detail::run_kind<T, kKindGatv2>(a, l); break;
  }
}

}  // namespace bwd
}  // namespace pyg_dfgnn

// The backward's kernels: one pass kernel (rows or cols, staged windows or
// plain blocks) and the combine of long owners' segment partials.
#pragma once

#include "bwd_cols_pass.cuh"
#include "bwd_common.cuh"
#include "bwd_rows_pass.cuh"

namespace pyg_dfgnn {
namespace bwd {

// A block owns owners `windows[b] .. windows[b + 1]` (graph-aligned windows)
// or kPlainOwners consecutive owners. With stage_span > 0 a window whose
// neighbours [lo, hi] number <= stage_span has their rows staged in shared
// memory once (reused by every edge of the window).
// LANES: the rows pass's four-feature lanes for 'add' (every dtype) and
// half precision (every kind); the host picks them for dense graphs.
template <typename T, typename I, int KIND, bool VEC, bool COLS, int FEAT,
          bool LEAN, bool LANES>
__global__ void __launch_bounds__(kWideBlock<T, KIND, COLS> ? kWideThreads
                                                            : kMaxThreads)
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
    w.p = w.hv + pad4(H);  // (16-byte aligned, as vown)
    w.t = w.p + H * kChunk;
    w.g = nullptr;
    w.vown = w.t + H * kChunk;
    for (int i = lane; i < HD_att; i += kWarpSize) w.own2[i] = 0.f;
  } else {
    w.own2 = w.own + pad4(HD_k);
    w.hv = w.own2 + pad4(HF);
    w.p = w.hv + pad4((KIND == kAdd ? 4 : 2) * H);  // (16-byte aligned)
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
      rows_pass<T, I, KIND, VW, SLOTS, int, FEAT, LANES>(
          a, w, s_next, o_begin, o_end, s_a, s_b, src_lo, s_att);
    else
      rows_pass<T, I, KIND, VW, SLOTS, int64_t, FEAT, LANES>(
          a, w, s_next, o_begin, o_end, a.nbr_a, a.nbr_b, 0, s_att);
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

}  // namespace bwd
}  // namespace pyg_dfgnn

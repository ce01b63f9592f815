// Tensor-core windows, backward ('dot' kind, no training features): a block
// per row window whose rows and sources each number at most 128 and whose
// source range no other window shares (the host checks both), so that the
// block owns its rows' dQ and its sources' dK, dV: no atomics, deterministic.
// Per head, from the forward's lse (p = cnt exp(s - lse), cnt the edge
// multiplicity as in the forward; the window's edges as bits, row-major for
// A and source-major for B, tc_mask.cuh; p in base 2: ex2(s scale log2 e -
// lse log2 e)):
//   A. 16-row strips (a warp each): S = Q K^T, dP = dO V^T, D = rowsum(P dP),
//      dS = P (dP - D), dQ = scale dS K;
//   B. 16-source strips: S^T = K Q^T, dP^T = V dO^T (the same numbers, the
//      other way round), dV = P^T dO, dK = scale dS^T Q.
// Both products of a phase come from operand rows staged in shared memory
// (K, V for A; Q, dO for B); the strip's own rows are read from global
// memory as A fragments. The rows are staged once by cp.async (fp32:
// permuted within 8-tiles), the transposed products' B fragments read from
// the same rows (fp16 / bf16 by ldmatrix.trans, fp32 by scalar reads). fp16
// / bf16: 4 warps a block and two blocks an SM (a strip's S and dP take 128
// registers, so 8 warps of 2 blocks would not fit), so that one block's
// staging runs under the other's products. fp32 runs 3xTF32 (mma_tiles.cuh),
// or one TF32 product (kOneTf32: strategy 6, opt-in as the forward's 5): 8
// warps, one block an SM.
#pragma once

#include <type_traits>

#include "bwd_common.cuh"
#include "mma_tiles.cuh"
#include "tc_mask.cuh"

namespace pyg_dfgnn {
namespace bwd {

constexpr int kTcMax = 128;   // rows and sources of one window
// count row stride (bytes): a fragment's 8 rows in distinct banks
constexpr int kTcCntStride = kTcMax + 8;
constexpr int kTcTiles = kTcMax / 8;

template <typename T>
constexpr bool tc_bwd_tf32() {
  return std::is_same<T, float>::value;
}
template <typename T>
constexpr int tc_bwd_warps() {
  return tc_bwd_tf32<T>() ? 8 : 4;
}
template <typename T>
constexpr int tc_bwd_threads() {
  return tc_bwd_warps<T>() * kWarpSize;
}

template <typename T>
struct TcBwdArgs {
  const int64_t* __restrict__ rowptr;
  const int32_t* __restrict__ col;
  const T* __restrict__ q;
  const T* __restrict__ k;
  const T* __restrict__ v;
  const T* __restrict__ dout;
  const float* __restrict__ lse;
  T* __restrict__ dq;
  T* __restrict__ dk;  // zeros first (sources outside every window)
  T* __restrict__ dv;
  int H;
  float scale;
};

// Shared memory (bytes, 16-byte aligned): 2 operand slots of [128][DH +
// pad] rows | counts [128][kTcCntStride] uint8 (repeated edges only) | lse
// (times log2 e), D fp32 [128] each | masks [128][kTcMaskWords] uint32,
// row- and source-major | block scalars.
struct TcBwdLayout {
  size_t slot, cnt, lse, d, mask, mask_t, scalars, total;
};
__host__ __device__ inline TcBwdLayout tc_bwd_layout(int DH, size_t elem) {
  const int pad = (int)(16 / elem);
  TcBwdLayout L;
  L.slot = align16((size_t)kTcMax * (DH + pad) * elem);
  L.cnt = 2 * L.slot;
  L.lse = L.cnt + (size_t)kTcMax * kTcCntStride;
  L.d = L.lse + kTcMax * 4;
  L.mask = L.d + kTcMax * 4;
  L.mask_t = L.mask + kTcMax * kTcMaskWords * 4;
  L.scalars = L.mask_t + kTcMax * kTcMaskWords * 4;
  L.total = L.scalars + 16;
  return L;
}

template <typename T, int DH, bool kOneTf32 = false>
__global__ void __launch_bounds__(tc_bwd_threads<T>(), tc_bwd_tf32<T>() ? 1 : 2)
    tc_bwd_kernel(TcBwdArgs<T> a, const int64_t* __restrict__ windows) {
  using M = MmaTile<T>;
  constexpr bool kTf32 = M::kTf32;
  static_assert(kTf32 || !kOneTf32, "1xTF32: fp32 only");
  constexpr int kWarps = tc_bwd_warps<T>(), kThreads = tc_bwd_threads<T>();
  constexpr int kK = M::kK, kPad = (int)(16 / sizeof(T));
  constexpr int NS = DH + kPad;      // stride of the rows [128][DH]
  constexpr int kOut = DH / 8;       // n-tiles of a [16 x DH] result
  // rows staged with zeros up to a multiple of 16 (fp32: 32, its products
  // go four tiles at a time)
  constexpr int kPadTo = kTf32 ? 32 : 16;
  extern __shared__ __align__(16) unsigned char smem[];
  const TcBwdLayout L = tc_bwd_layout(DH, sizeof(T));
  T* slot[2] = {reinterpret_cast<T*>(smem),
                reinterpret_cast<T*>(smem + L.slot)};
  unsigned char* s_cnt = smem + L.cnt;
  float* s_lse = reinterpret_cast<float*>(smem + L.lse);
  float* s_d = reinterpret_cast<float*>(smem + L.d);
  uint32_t* s_mask = reinterpret_cast<uint32_t*>(smem + L.mask);
  uint32_t* s_mask_t = reinterpret_cast<uint32_t*>(smem + L.mask_t);
  int* s_lo = reinterpret_cast<int*>(smem + L.scalars);

  const int H = a.H, HD = H * DH;
  const int tid = threadIdx.x, warp = tid / kWarpSize, lane = tid % kWarpSize;
  const int g = lane / 4, q4 = lane % 4;
  const int64_t r_begin = windows[blockIdx.x], r_end = windows[blockIdx.x + 1];
  const int n_rows = (int)(r_end - r_begin);

  if (tid == 0) s_lo[0] = INT32_MAX, s_lo[1] = -1, s_lo[2] = 0;
  int src_lo = 0;
  const int n_src = block_index_span(a.col, a.rowptr[r_begin],
                                     a.rowptr[r_end], s_lo, src_lo);
  if (n_src > kTcMax || n_rows > kTcMax) __trap();  // the host rules it out
  const int src_tiles = (n_src + 7) / 8, row_tiles = (n_rows + 7) / 8;
  const int src_pad = (n_src + kPadTo - 1) / kPadTo * kPadTo;
  const int row_pad = (n_rows + kPadTo - 1) / kPadTo * kPadTo;

  // Stage rows [0, n_pad) of X (row i at X + (base + i) * HD + h * DH; zeros
  // past n) as NK rows (fp32: permuted within 8-tiles) by cp.async, in
  // flight until cp_async_wait_all. The host hands aligned inputs.
  auto stage = [&](const T* x, int64_t base, int n, int n_pad, int h,
                   T* nk) {
    tc_stage_rows_async<T, DH, kThreads>(x + h * DH, base, HD, n, n_pad, nk,
                                         NS, tid);
  };

  // ---- the edges as bits (the first head's K, V in flight; a repeated
  // edge: s_lo[2] = 1)
  stage(a.k, src_lo, n_src, src_pad, 0, slot[0]);
  stage(a.v, src_lo, n_src, src_pad, 0, slot[1]);
  for (int i = tid; i < 2 * kTcMax * kTcMaskWords; i += kThreads)
    s_mask[i] = 0u;  // (and s_mask_t, right after it)
  __syncthreads();
  tc_window_edges<kWarps>(a.rowptr, a.col, r_begin, n_rows, warp, lane,
                          [&](int r, int c) {
                            c -= src_lo;
                            const uint32_t bit = tc_mask_bit<T>(c);
                            if (atomicOr(&s_mask[r * kTcMaskWords +
                                                 tc_mask_word<T>(c)],
                                         bit) &
                                bit)
                              s_lo[2] = 1;
                            atomicOr(&s_mask_t[c * kTcMaskWords +
                                               tc_mask_word<T>(r)],
                                     tc_mask_bit<T>(r));
                          });
  const float scale2 = a.scale * kLog2e;

  // s = X N0^T and dp = Y N1^T over the used 8-tiles of n (NK rows in
  // slots 0 and 1): X, Y as row pairs (rows g, g + 8; nullptr: zeros) in
  // global memory -- S and dP of a row strip (X = Q, Y = dO), S^T and dP^T
  // of a source strip (X = K, Y = V).
  auto two_products = [&](const T* xa, const T* xb, const T* ya,
                          const T* yb, int n_tiles, float (&s)[kTcTiles][4],
                          float (&dp)[kTcTiles][4]) {
#pragma unroll
    for (int t = 0; t < kTcTiles; ++t)
#pragma unroll
      for (int i = 0; i < 4; ++i) s[t][i] = dp[t][i] = 0.f;
    if constexpr (kTf32) {
#pragma unroll 2  // (code size, as in the forward)
      for (int k0 = 0; k0 < DH; k0 += kK) {
        const typename M::A fx = M::load_a(xa, xb, k0, q4);
        const typename M::A fy = M::load_a(ya, yb, k0, q4);
        mma_nk_tf32<!kOneTf32>(s, fx, n_tiles, slot[0], NS, k0, lane);
        mma_nk_tf32<!kOneTf32>(dp, fy, n_tiles, slot[1], NS, k0, lane);
      }
    } else {
#pragma unroll
      for (int k0 = 0; k0 < DH; k0 += kK) {
        const typename M::A fx = M::load_a(xa, xb, k0, q4);
        const typename M::A fy = M::load_a(ya, yb, k0, q4);
        mma_nk_pairs<T>(s, fx.hi, n_tiles, slot[0], NS, k0, lane);
        mma_nk_pairs<T>(dp, fy.hi, n_tiles, slot[1], NS, k0, lane);
      }
    }
  };
  // Window index (source in A, row in B) of accumulator element i of
  // 8-tile t.
  auto index_of = [&](int t, int i) { return t * 8 + M::column(q4, i); };
  // acc = x B over the used 8-tiles of k (x: accumulator tiles reused as A
  // fragments; B from the operand rows `rows` as staged), stored times `sc`
  // to rows a / b of `out`.
  auto product = [&](const float (&x)[kTcTiles][4], int k_tiles,
                     const T* rows, T* out, int64_t at_a, int64_t at_b,
                     bool ok_a, bool ok_b, float sc) {
    auto store = [&](int nt, const float (&acc)[4]) {
      const int f = nt * 8 + 2 * q4;
      float xa[2] = {acc[0] * sc, acc[1] * sc};
      float xb[2] = {acc[2] * sc, acc[3] * sc};
      if (ok_a) store_vec<T, 2>(out + at_a + f, xa);
      if (ok_b) store_vec<T, 2>(out + at_b + f, xb);
    };
    product_rows_store<T, kTcTiles, kOut, kOneTf32, kTf32>(x, k_tiles, rows,
                                                          NS, lane, store);
  };

  for (int h = 0; h < H; ++h) {
    // ================================================= A: row strips
    if (h > 0) {
      __syncthreads();  // the previous head's phase B is done with the slots
      stage(a.k, src_lo, n_src, src_pad, h, slot[0]);
      stage(a.v, src_lo, n_src, src_pad, h, slot[1]);
    }
    for (int r = tid; r < n_rows; r += kThreads)
      s_lse[r] = a.lse[(r_begin + r) * H + h] * kLog2e;
    cp_async_wait_all();
    __syncthreads();  // staged rows, bits and lse visible to every warp
    const bool multi = s_lo[2] != 0;  // (block-uniform)
    if (multi && h == 0) {  // a repeated edge: the window's counts
      for (int i = tid; i < kTcMax * kTcCntStride / 16; i += kThreads)
        reinterpret_cast<uint4*>(s_cnt)[i] = make_uint4(0u, 0u, 0u, 0u);
      __syncthreads();
      uint32_t* cnt_words = reinterpret_cast<uint32_t*>(s_cnt);
      tc_window_edges<kWarps>(a.rowptr, a.col, r_begin, n_rows, warp, lane,
                              [&](int r, int c) {
                                c -= src_lo;
                                atomicAdd(&cnt_words[(r * kTcCntStride + c) / 4],
                                          1u << (8 * (c % 4)));
                              });
      __syncthreads();
    }
    for (int r0 = warp * 16; r0 < n_rows; r0 += kWarps * 16) {
      const bool ok_a = r0 + g < n_rows, ok_b = r0 + g + 8 < n_rows;
      const int64_t row_a = r_begin + r0 + g, row_b = row_a + 8;
      const T* qa = ok_a ? a.q + row_a * HD + h * DH : nullptr;
      const T* qb = ok_b ? a.q + row_b * HD + h * DH : nullptr;
      const T* oa = ok_a ? a.dout + row_a * HD + h * DH : nullptr;
      const T* ob = ok_b ? a.dout + row_b * HD + h * DH : nullptr;
      float s[kTcTiles][4], dp[kTcTiles][4];
      two_products(qa, qb, oa, ob, src_tiles, s, dp);
      const float lse_a = ok_a ? s_lse[r0 + g] : 0.f;
      const float lse_b = ok_b ? s_lse[r0 + g + 8] : 0.f;
      const uint32_t wa = ok_a ? s_mask[(r0 + g) * kTcMaskWords + q4] : 0u;
      const uint32_t wb = ok_b ? s_mask[(r0 + g + 8) * kTcMaskWords + q4] : 0u;
#pragma unroll
      for (int t = 0; t < kTcTiles; ++t)
#pragma unroll
        for (int i = 0; i < 4; ++i)
          s[t][i] = tc_mask_has(i < 2 ? wa : wb, t, i)
                        ? tc_exp2(fmaf(s[t][i], scale2,
                                       -(i < 2 ? lse_a : lse_b)))
                        : 0.f;
      if (multi) {  // times the multiplicity
        const unsigned char* ca = s_cnt + (r0 + g) * kTcCntStride;
        const unsigned char* cb = ca + 8 * kTcCntStride;
#pragma unroll
        for (int t = 0; t < kTcTiles; ++t)
#pragma unroll
          for (int i = 0; i < 4; ++i)
            if (tc_mask_has(i < 2 ? wa : wb, t, i))
              s[t][i] *= (float)(i < 2 ? ca : cb)[index_of(t, i)];
      }
      float d_a = 0.f, d_b = 0.f;
#pragma unroll
      for (int t = 0; t < kTcTiles; ++t)
#pragma unroll
        for (int i = 0; i < 4; ++i) {
          if (i < 2) d_a = fmaf(s[t][i], dp[t][i], d_a);
          else d_b = fmaf(s[t][i], dp[t][i], d_b);
        }
#pragma unroll
      for (int o = 1; o <= 2; o <<= 1) {
        d_a += __shfl_xor_sync(kFullMask, d_a, o);
        d_b += __shfl_xor_sync(kFullMask, d_b, o);
      }
      if (q4 == 0) {
        if (ok_a) s_d[r0 + g] = d_a;
        if (ok_b) s_d[r0 + g + 8] = d_b;
      }
#pragma unroll
      for (int t = 0; t < kTcTiles; ++t)
#pragma unroll
        for (int i = 0; i < 4; ++i)
          s[t][i] *= dp[t][i] - (i < 2 ? d_a : d_b);  // ds
      // dQ = scale dS K (k over sources: K's rows)
      product(s, src_tiles, slot[0], a.dq, row_a * HD + h * DH,
              row_b * HD + h * DH, ok_a, ok_b, a.scale);
    }

    // ================================================= B: source strips
    __syncthreads();  // phase A done with the slots; D complete
    stage(a.q, r_begin, n_rows, row_pad, h, slot[0]);
    stage(a.dout, r_begin, n_rows, row_pad, h, slot[1]);
    cp_async_wait_all();
    __syncthreads();
    for (int c0 = warp * 16; c0 < n_src; c0 += kWarps * 16) {
      const bool ok_a = c0 + g < n_src, ok_b = c0 + g + 8 < n_src;
      const int64_t src_a = src_lo + c0 + g, src_b = src_a + 8;
      const T* ka = ok_a ? a.k + src_a * HD + h * DH : nullptr;
      const T* kb = ok_b ? a.k + src_b * HD + h * DH : nullptr;
      const T* va = ok_a ? a.v + src_a * HD + h * DH : nullptr;
      const T* vb = ok_b ? a.v + src_b * HD + h * DH : nullptr;
      float s[kTcTiles][4], dp[kTcTiles][4];  // S^T, dP^T: rows = sources
      two_products(ka, kb, va, vb, row_tiles, s, dp);
      const uint32_t wa =
          ok_a ? s_mask_t[(c0 + g) * kTcMaskWords + q4] : 0u;
      const uint32_t wb =
          ok_b ? s_mask_t[(c0 + g + 8) * kTcMaskWords + q4] : 0u;
#pragma unroll
      for (int t = 0; t < kTcTiles; ++t)
#pragma unroll
        for (int i = 0; i < 4; ++i) {
          const int r = index_of(t, i);  // window row of this column
          const bool has = tc_mask_has(i < 2 ? wa : wb, t, i);
          float p = has ? tc_exp2(fmaf(s[t][i], scale2, -s_lse[r])) : 0.f;
          if (multi && has)
            p *= (float)s_cnt[r * kTcCntStride + c0 + g + (i < 2 ? 0 : 8)];
          s[t][i] = p;
          dp[t][i] = has ? p * (dp[t][i] - s_d[r]) : 0.f;  // ds
        }
      // dV = P^T dO (dO's rows), dK = scale dS^T Q (Q's rows)
      product(s, row_tiles, slot[1], a.dv, src_a * HD + h * DH,
              src_b * HD + h * DH, ok_a, ok_b, 1.f);
      product(dp, row_tiles, slot[0], a.dk, src_a * HD + h * DH,
              src_b * HD + h * DH, ok_a, ok_b, a.scale);
    }
  }
}

}  // namespace bwd
}  // namespace pyg_dfgnn

// Tensor-core windows (forward; 'dot' kind, no training features): a block
// per graph-aligned row window whose sources span at most
// kTcMaxSrc nodes (DFGraph.row_windows(kTcMaxSrc)). The window's adjacency
// becomes bits in the accumulator layout (tc_mask.cuh; a count matrix of
// edge multiplicities only where an edge repeats, so multigraphs stay
// exact); per head, the sources' K and V rows are staged once (cp.async,
// in flight while the bits are formed),
// and each warp takes 16 rows:
//   S = scale * Q K^T          fp16 / bf16: mma.m16n8k16; fp32: 3xTF32
//                              (three mma.m16n8k8 per product on the hi / lo
//                              tf32 halves: about fp32 accuracy); K's B
//                              fragments by ldmatrix (fp32: K's rows
//                              permuted within 8-tiles, tc_staged_row), fp32
//                              accumulators; Q fragments read from global
//                              memory once per head
//   p = cnt * exp(S - max)     in registers, masked by the bits; in base 2
//                              (S times scale log2 e, ex2)
//   O = P V / sum(p)           P's A fragments are S's accumulators (fp16 /
//                              bf16: P packed to the input type, V's B
//                              fragments by ldmatrix.trans; fp32: split to
//                              tf32 halves, V's by two scalar reads), V
//                              from its rows in true order, O in parts of
//                              64 features
// lse = max + log(sum + 1e-16) (-inf for an empty row) and O follow SMMF's
// conventions, so either backward (the rows / cols passes, or the TC
// windows of bwd_tc_kernel.cuh) takes it.
// A whole row of scores lives in registers (16 accumulator tiles of 8
// sources): no online softmax, one pass over K and V. Two blocks per SM
// (<= 128 registers: P packed or split at use, O in parts), so that one
// block's staging runs under the other's products; fp32 at D = 128 stages
// a head's K and V in turn into one buffer so that two blocks fit.
#pragma once

#include <type_traits>

#include "fwd_common.cuh"
#include "mma_tiles.cuh"
#include "row_tiles.cuh"
#include "tc_mask.cuh"

namespace pyg_dfgnn {
namespace fwd {

constexpr int kTcMaxSrc = 128;     // sources of one window (S in registers)
constexpr int kTcWarps = 8;        // 16 rows each
constexpr int kTcMaxRows = kTcWarps * 16;  // rows per count-matrix chunk
// Count row stride (bytes): the 8 rows of a fragment fall in distinct banks
// (a stride of 128 put them all in one).
constexpr int kTcCntStride = kTcMaxSrc + 8;
constexpr int kTcThreads = kTcWarps * kWarpSize;
constexpr int kTcSrcTiles = kTcMaxSrc / 8;  // n-tiles of S
constexpr int kTcMaxDegree = 255;  // multiplicities fit a byte

constexpr int kTcMinBlocks = 2;  // per SM

// Row strides (elements) of the staged K and V rows: K 16 bytes past DH
// (ldmatrix's 8 rows in distinct banks); V the same for fp16 / bf16
// (ldmatrix.trans), 8 words past DH for fp32 (its scalar B reads of rows q,
// q + 4 in distinct banks).
__host__ __device__ constexpr int tc_k_stride(int DH, int elem) {
  return DH + 16 / elem;
}
__host__ __device__ constexpr int tc_v_stride(int DH, int elem) {
  return elem == 4 ? DH + 8 : DH + 16 / elem;
}
// fp32 at D = 128: K and V of a head take turns in one buffer (both would
// not leave room for two blocks per SM).
__host__ __device__ constexpr bool tc_share_kv(int DH, int elem) {
  return elem == 4 && DH == 128;
}

// Shared memory of a TC block (byte offsets, 16-byte aligned): K rows of
// the head [kTcMaxSrc][tc_k_stride] T | V rows of the head
// [kTcMaxSrc][tc_v_stride] T (tc_share_kv: at K's offset) | counts
// [kTcMaxRows][kTcCntStride] uint8 (repeated edges only) | mask
// [kTcMaxRows][kTcMaskWords] uint32 | block scalars.
struct TcLayout {
  size_t v, cnt, mask, scalars, total;
};
__host__ __device__ inline TcLayout tc_layout(int DH, size_t elem) {
  const size_t k_bytes =
      (size_t)kTcMaxSrc * tc_k_stride(DH, (int)elem) * elem;
  const size_t v_bytes =
      (size_t)kTcMaxSrc * tc_v_stride(DH, (int)elem) * elem;
  TcLayout L;
  L.v = tc_share_kv(DH, (int)elem) ? 0 : align16(k_bytes);
  L.cnt = align16(L.v + v_bytes > k_bytes ? L.v + v_bytes : k_bytes);
  L.mask = L.cnt + (size_t)kTcMaxRows * kTcCntStride;
  L.scalars = L.mask + (size_t)kTcMaxRows * kTcMaskWords * 4;
  L.total = L.scalars + 16;
  return L;
}

// One window per block: rows windows[b] .. windows[b + 1]; DH = D = F.
// kOneTf32 (fp32 only, opt-in): one TF32 product per tile instead of three
// (operands rounded to tf32: ~1e-3 relative error, PyTorch's allow_tf32).
template <typename T, int DH, bool kOneTf32 = false>
__global__ void __launch_bounds__(kTcThreads, kTcMinBlocks)
    tc_fwd_kernel(FwdArgs<T, int32_t> a, const int64_t* __restrict__ windows) {
  static_assert(DH % 16 == 0 && DH <= 128, "DH: 16, 32, 64 or 128");
  static_assert(!kOneTf32 || std::is_same<T, float>::value,
                "1xTF32: fp32 inputs");
  using M = MmaTile<T>;
  constexpr bool kTf32 = M::kTf32;
  constexpr int kK = M::kK;
  constexpr int KS = tc_k_stride(DH, (int)sizeof(T));
  constexpr int VS = tc_v_stride(DH, (int)sizeof(T));
  constexpr bool kShareKV = tc_share_kv(DH, (int)sizeof(T));
  constexpr int kOutTiles = DH / 8;        // n-tiles of O
  // k-steps of S unrolled: all for fp16 / bf16; two for fp32, whose three
  // mma per product made the whole kernel ~300 KB of code
  constexpr int kUnrollK = kTf32 ? 2 : DH / kK;
  extern __shared__ __align__(16) unsigned char smem[];
  const TcLayout L = tc_layout(DH, sizeof(T));
  T* s_k = reinterpret_cast<T*>(smem);
  T* s_v = reinterpret_cast<T*>(smem + L.v);
  unsigned char* s_cnt = smem + L.cnt;
  uint32_t* s_mask = reinterpret_cast<uint32_t*>(smem + L.mask);
  int* s_lo = reinterpret_cast<int*>(smem + L.scalars);

  const int H = a.H, HD = H * DH;
  const int tid = threadIdx.x, warp = tid / kWarpSize, lane = tid % kWarpSize;
  const int g = lane / 4, q4 = lane % 4;  // fragment row group / quad lane
  const int64_t w_begin = windows[blockIdx.x], w_end = windows[blockIdx.x + 1];

  if (tid == 0) s_lo[0] = INT32_MAX, s_lo[1] = -1, s_lo[2] = 0;
  int src_lo = 0;
  const int n_src = block_index_span(a.col, a.rowptr[w_begin],
                                     a.rowptr[w_end], s_lo, src_lo);
  if (n_src > kTcMaxSrc) __trap();  // the host dispatch rules this out
  // Source 8-tiles in use; staged with zeros up to 16 sources (fp32: 32,
  // its S products go four tiles at a time).
  constexpr int kPadTo = kTf32 ? 32 : 16;
  const int n_tiles8 = (n_src + 7) / 8;
  const int n_pad = (n_src + kPadTo - 1) / kPadTo * kPadTo;
  // K (fp32: permuted within 8-tiles) and V rows (true order) of head h
  // into shared memory (the copies still in flight on return:
  // cp_async_wait_all and a barrier before use). The host hands 16-byte
  // aligned inputs, so every row is (DH * size of T is a multiple).
  auto stage_k = [&](int h) {
    tc_stage_rows_async<T, DH, kTcThreads>(a.k + h * DH, src_lo, HD, n_src,
                                           n_pad, s_k, KS, tid);
  };
  auto stage_v = [&](int h) {
    tc_stage_rows_async<T, DH, kTcThreads, false>(a.v + h * DH, src_lo, HD,
                                                  n_src, n_pad, s_v, VS, tid);
  };

  for (int64_t c_begin = w_begin; c_begin < w_end; c_begin += kTcMaxRows) {
    const int n_rows =
        (int)(w_end - c_begin < kTcMaxRows ? w_end - c_begin : kTcMaxRows);
    __syncthreads();  // the previous chunk is done with the shared memory
    stage_k(0);       // in flight under the bits
    if constexpr (!kShareKV) stage_v(0);
    // ---- the chunk's edges as bits (a repeated edge: s_lo[2] = 1)
    for (int i = tid; i < kTcMaxRows * kTcMaskWords; i += kTcThreads)
      s_mask[i] = 0u;
    __syncthreads();
    tc_window_edges<kTcWarps>(
        a.rowptr, a.col, c_begin, n_rows, warp, lane, [&](int r, int c) {
          c -= src_lo;
          const uint32_t bit = tc_mask_bit<T>(c);
          if (atomicOr(&s_mask[r * kTcMaskWords + tc_mask_word<T>(c)], bit) &
              bit)
            s_lo[2] = 1;
        });

    for (int h = 0; h < H; ++h) {
      if (h > 0) {
        __syncthreads();  // every warp is done with head h - 1's rows
        stage_k(h);
        if constexpr (!kShareKV) stage_v(h);
      }
      cp_async_wait_all();
      __syncthreads();  // staged rows and bits visible to every warp
      const bool multi = s_lo[2] != 0;  // (block-uniform)
      if (multi && h == 0) {  // a repeated edge: the chunk's counts
        for (int i = tid; i < kTcMaxRows * kTcCntStride / 16; i += kTcThreads)
          reinterpret_cast<uint4*>(s_cnt)[i] = make_uint4(0u, 0u, 0u, 0u);
        __syncthreads();
        uint32_t* cnt_words = reinterpret_cast<uint32_t*>(s_cnt);
        tc_window_edges<kTcWarps>(
            a.rowptr, a.col, c_begin, n_rows, warp, lane, [&](int r, int c) {
              c -= src_lo;
              atomicAdd(&cnt_words[(r * kTcCntStride + c) / 4],
                        1u << (8 * (c % 4)));
            });
        __syncthreads();
      }

      const int r0 = warp * 16;  // this warp's 16 rows (warp-uniform)
      const bool active = r0 < n_rows;  // (kShareKV: barriers below)
      const int64_t row_a = c_begin + r0 + g, row_b = row_a + 8;
      const bool ok_a = r0 + g < n_rows, ok_b = r0 + g + 8 < n_rows;
      float s[kTcSrcTiles][4];
      float m_a = -INFINITY, m_b = -INFINITY, l_a = 0.f, l_b = 0.f;
      if (active) {
        const T* qa = ok_a ? a.q + row_a * HD + h * DH : nullptr;
        const T* qb = ok_b ? a.q + row_b * HD + h * DH : nullptr;
        // ---- S = Q K^T over the used source tiles
#pragma unroll
        for (int t = 0; t < kTcSrcTiles; ++t)
          s[t][0] = s[t][1] = s[t][2] = s[t][3] = 0.f;
        if constexpr (kTf32) {
          // Q's values one k-step ahead of their products (read from
          // global memory: their latency was the kernel's largest stall)
          float xq[4];
          M::load_x(qa, qb, 0, q4, xq);
#pragma unroll kUnrollK
          for (int k0 = 0; k0 < DH; k0 += kK) {
            const typename M::A fq = M::split_x(xq);
            if (k0 + kK < DH) M::load_x(qa, qb, k0 + kK, q4, xq);
            mma_nk_tf32<!kOneTf32>(s, fq, n_tiles8, s_k, KS, k0, lane);
          }
        } else {
#pragma unroll
          for (int k0 = 0; k0 < DH; k0 += kK) {
            const typename M::A fq = M::load_a(qa, qb, k0, q4);
            mma_nk_pairs<T>(s, fq.hi, n_tiles8, s_k, KS, k0, lane);
          }
        }
        // ---- mask, row max (rows g and g + 8: a quad holds a row), in
        // base 2: s scale log2(e)
        const float scale2 = a.scale * kLog2e;
        const uint32_t wa =
            ok_a ? s_mask[(r0 + g) * kTcMaskWords + q4] : 0u;
        const uint32_t wb =
            ok_b ? s_mask[(r0 + g + 8) * kTcMaskWords + q4] : 0u;
        // a repeated edge (multi): cnt 2^(s - m) = 2^(s + log2 cnt - m)
        // (the max and lse move with it; softmax and lse stay those of
        // the counts)
        const unsigned char* ca = s_cnt + (r0 + g) * kTcCntStride;
        const unsigned char* cb = ca + 8 * kTcCntStride;
#pragma unroll
        for (int t = 0; t < kTcSrcTiles; ++t) {
#pragma unroll
          for (int i = 0; i < 4; ++i) {
            const bool has = tc_mask_has(i < 2 ? wa : wb, t, i);
            s[t][i] = has ? s[t][i] * scale2 : -INFINITY;
            if (multi && has) {
              const unsigned c = (i < 2 ? ca : cb)[t * 8 + M::column(q4, i)];
              if (c > 1u) s[t][i] += log2f((float)c);
            }
          }
        }
#pragma unroll
        for (int t = 0; t < kTcSrcTiles; ++t) {
          m_a = fmaxf(m_a, fmaxf(s[t][0], s[t][1]));
          m_b = fmaxf(m_b, fmaxf(s[t][2], s[t][3]));
        }
#pragma unroll
        for (int o = 1; o <= 2; o <<= 1) {
          m_a = fmaxf(m_a, __shfl_xor_sync(kFullMask, m_a, o));
          m_b = fmaxf(m_b, __shfl_xor_sync(kFullMask, m_b, o));
        }
        // ---- p = 2^(s - m) (ex2(-inf) = 0 where masked; an empty row's m
        // is taken as 0 so that its p stay 0)
        const float mz_a = m_a != -INFINITY ? m_a : 0.f;
        const float mz_b = m_b != -INFINITY ? m_b : 0.f;
#pragma unroll
        for (int t = 0; t < kTcSrcTiles; ++t) {
#pragma unroll
          for (int i = 0; i < 4; ++i)
            s[t][i] = tc_exp2(s[t][i] - (i < 2 ? mz_a : mz_b));
          l_a += s[t][0] + s[t][1];
          l_b += s[t][2] + s[t][3];
        }
#pragma unroll
        for (int o = 1; o <= 2; o <<= 1) {
          l_a += __shfl_xor_sync(kFullMask, l_a, o);
          l_b += __shfl_xor_sync(kFullMask, l_b, o);
        }
      }
      if constexpr (kShareKV) {  // V into K's buffer once every warp has S
        __syncthreads();
        stage_v(h);
        cp_async_wait_all();
        __syncthreads();
      }
      if (!active) continue;
      const float inv_a = 1.f / (l_a + 1e-16f), inv_b = 1.f / (l_b + 1e-16f);
      // ---- out = P V / l (features nt * 8 + 2 q4, + 1)
      auto store = [&](int nt, const float (&o)[4]) {
        const int f = h * DH + nt * 8 + q4 * 2;
        float va[2] = {o[0] * inv_a, o[1] * inv_a};
        float vb[2] = {o[2] * inv_b, o[3] * inv_b};
        if (ok_a) store_vec<T, 2>(a.out + row_a * HD + f, va);
        if (ok_b) store_vec<T, 2>(a.out + row_b * HD + f, vb);
      };
      product_rows_store<T, kTcSrcTiles, kOutTiles, kOneTf32>(
          s, n_tiles8, s_v, VS, lane, store);
      if (q4 == 0) {
        // (natural log, as SMMF's: m ln 2 + log l)
        if (ok_a)
          a.lse[row_a * H + h] =
              m_a != -INFINITY ? m_a * kLn2 + logf(l_a + 1e-16f) : -INFINITY;
        if (ok_b)
          a.lse[row_b * H + h] =
              m_b != -INFINITY ? m_b * kLn2 + logf(l_b + 1e-16f) : -INFINITY;
      }
    }
  }
}

}  // namespace fwd
}  // namespace pyg_dfgnn

// Tensor-core windows (forward; 'dot' kind, no training features): a block
// per graph-aligned row window whose sources span at most
// kTcMaxSrc nodes (DFGraph.row_windows(kTcMaxSrc)). The window's adjacency
// becomes a dense [rows][kTcMaxSrc] count matrix in shared memory (edge
// multiplicities, so multigraphs stay exact); per head, the sources' K and V
// rows are staged once (cp.async, in flight while the counts are formed),
// and each warp takes 16 rows:
//   S = scale * Q K^T          fp16 / bf16: mma.m16n8k16, K's B fragments
//                              by ldmatrix; fp32: 3xTF32 (three
//                              mma.m16n8k8 per product on the hi / lo tf32
//                              halves: about fp32 accuracy); fp32
//                              accumulators; Q fragments read from global
//                              memory once per head
//   p = cnt * exp(S - max)     in registers, masked where cnt == 0
//   O = P V / sum(p)           P's A fragments are S's accumulators (fp16 /
//                              bf16: P packed to the input type, V's B
//                              fragments by ldmatrix.trans from its rows, O
//                              in parts of 64 features; fp32: V staged
//                              transposed, its sources of each 8-tile in the
//                              order that makes S's accumulators P's A)
// lse = max + log(sum + 1e-16) (-inf for an empty row) and O follow SMMF's
// conventions, so either backward (the rows / cols passes, or the TC
// windows of bwd_tc_kernel.cuh) takes it.
// A whole row of scores lives in registers (16 accumulator tiles of 8
// sources): no online softmax, one pass over K and V. fp16 / bf16 run two
// blocks per SM (<= 128 registers: P packed, O in parts), so that one
// block's staging runs under the other's products; fp32 one.
#pragma once

#include <type_traits>

#include "fwd_common.cuh"
#include "mma_tiles.cuh"
#include "row_tiles.cuh"

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

template <typename T>
constexpr int tc_fwd_min_blocks() {
  return std::is_same<T, float>::value ? 1 : 2;
}

// Shared memory of a TC block (byte offsets, 16-byte aligned): K rows of
// the head [kTcMaxSrc][DH + pad] T | V of the head: fp16 / bf16 rows
// [kTcMaxSrc][DH + pad], fp32 columns [DH][kTcMaxSrc + pad] | counts
// [kTcMaxRows][kTcCntStride] uint8 | block scalars. The pads (16 bytes)
// spread a fragment's rows over the banks.
struct TcLayout {
  size_t v, cnt, scalars, total;
};
__host__ __device__ inline TcLayout tc_layout(int DH, size_t elem) {
  const int pad = (int)(16 / elem);
  const size_t v_elems = elem == 4 ? (size_t)DH * (kTcMaxSrc + pad)
                                   : (size_t)kTcMaxSrc * (DH + pad);
  TcLayout L;
  L.v = align16((size_t)kTcMaxSrc * (DH + pad) * elem);
  L.cnt = align16(L.v + v_elems * elem);
  L.scalars = L.cnt + (size_t)kTcMaxRows * kTcCntStride;
  L.total = L.scalars + 16;
  return L;
}

// One window per block: rows windows[b] .. windows[b + 1]; DH = D = F.
template <typename T, int DH>
__global__ void __launch_bounds__(kTcThreads, tc_fwd_min_blocks<T>())
    tc_fwd_kernel(FwdArgs<T, int32_t> a, const int64_t* __restrict__ windows) {
  static_assert(DH % 16 == 0 && DH <= 128, "DH: 16, 32, 64 or 128");
  using M = MmaTile<T>;
  constexpr bool kTf32 = M::kTf32;
  constexpr int kK = M::kK;
  constexpr int kPad = (int)(16 / sizeof(T));
  constexpr int KS = DH + kPad;            // K (fp16 / bf16: V too) rows
  constexpr int VS = kTcMaxSrc + kPad;     // fp32's V columns
  constexpr int kOutTiles = DH / 8;        // n-tiles of O
  extern __shared__ __align__(16) unsigned char smem[];
  const TcLayout L = tc_layout(DH, sizeof(T));
  T* s_k = reinterpret_cast<T*>(smem);
  T* s_v = reinterpret_cast<T*>(smem + L.v);
  unsigned char* s_cnt = smem + L.cnt;
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
  // Source 8-tiles in use; staged with zeros up to 16 sources.
  const int n_tiles8 = (n_src + 7) / 8, n_pad = (n_src + 15) / 16 * 16;
  // K and V rows of head h into shared memory (the copies still in flight
  // on return: cp_async_wait_all and a barrier before use). The host hands
  // 16-byte aligned inputs, so every row is (DH * size of T is a multiple).
  auto stage = [&](int h) {
    tc_stage_rows_async<T, DH, kTcThreads>(a.k + h * DH, src_lo, HD, n_src,
                                           n_pad, s_k, KS, tid);
    if constexpr (kTf32)
      tc_stage_rows<T, DH, kTcThreads>(a.v + h * DH, src_lo, HD, n_src,
                                       n_pad, nullptr, 0, s_v, VS, tid);
    else
      tc_stage_rows_async<T, DH, kTcThreads>(a.v + h * DH, src_lo, HD, n_src,
                                             n_pad, s_v, KS, tid);
  };

  for (int64_t c_begin = w_begin; c_begin < w_end; c_begin += kTcMaxRows) {
    const int n_rows =
        (int)(w_end - c_begin < kTcMaxRows ? w_end - c_begin : kTcMaxRows);
    __syncthreads();  // the previous chunk is done with s_k, s_v, s_cnt
    stage(0);         // in flight under the counts
    // ---- counts of the chunk's edges: cnt[row][source - lo]
    uint32_t* cnt_words = reinterpret_cast<uint32_t*>(s_cnt);
    for (int i = tid; i < kTcMaxRows * kTcCntStride / 16; i += kTcThreads)
      reinterpret_cast<uint4*>(s_cnt)[i] = make_uint4(0u, 0u, 0u, 0u);
    __syncthreads();
    for (int r = warp; r < n_rows; r += kTcWarps) {
      const int64_t row = c_begin + r;
      for (int64_t e = a.rowptr[row] + lane; e < a.rowptr[row + 1];
           e += kWarpSize) {
        const int c = a.col[e] - src_lo;
        const unsigned old = atomicAdd(&cnt_words[(r * kTcCntStride + c) / 4],
                                       1u << (8 * (c % 4)));
        if ((old >> (8 * (c % 4))) & 255u) s_lo[2] = 1;  // a repeated edge
      }
    }

    for (int h = 0; h < H; ++h) {
      if (h > 0) {
        __syncthreads();  // every warp is done with head h - 1's rows
        stage(h);
      }
      cp_async_wait_all();
      __syncthreads();  // staged rows and counts visible to every warp
      const bool multi = s_lo[2] != 0;  // (block-uniform)

      const int r0 = warp * 16;  // this warp's 16 rows (warp-uniform)
      if (r0 >= n_rows) continue;
      const int64_t row_a = c_begin + r0 + g, row_b = row_a + 8;
      const bool ok_a = r0 + g < n_rows, ok_b = r0 + g + 8 < n_rows;
      const T* qa = ok_a ? a.q + row_a * HD + h * DH : nullptr;
      const T* qb = ok_b ? a.q + row_b * HD + h * DH : nullptr;
      // ---- S = Q K^T over the used source tiles
      float s[kTcSrcTiles][4];
#pragma unroll
      for (int t = 0; t < kTcSrcTiles; ++t)
        s[t][0] = s[t][1] = s[t][2] = s[t][3] = 0.f;
#pragma unroll
      for (int k0 = 0; k0 < DH; k0 += kK) {
        const typename M::A fq = M::load_a(qa, qb, k0, q4);
        if constexpr (kTf32) {
#pragma unroll
          for (int t = 0; t < kTcSrcTiles; ++t)
            if (t < n_tiles8)
              M::mma(s[t], fq, s_k + (t * 8 + g) * KS, k0, q4);
        } else {
          mma_nk_pairs<T>(s, fq.hi, n_tiles8, s_k, KS, k0, lane);
        }
      }
      // ---- mask, row max (rows g and g + 8: a quad holds a row)
      const unsigned char* ca = s_cnt + (r0 + g) * kTcCntStride;
      const unsigned char* cb = ca + 8 * kTcCntStride;
      float m_a = -INFINITY, m_b = -INFINITY;
#pragma unroll
      for (int t = 0; t < kTcSrcTiles; ++t) {
        unsigned cnt[4] = {0u, 0u, 0u, 0u};
        if (t < n_tiles8) {
          if constexpr (kTf32) {
#pragma unroll
            for (int i = 0; i < 4; ++i)
              cnt[i] = (i < 2 ? ca : cb)[t * 8 + M::column(q4, i)];
          } else {  // columns 2 q4, + 1: one 2-byte read per row
            const unsigned wa = *reinterpret_cast<const uint16_t*>(
                ca + t * 8 + 2 * q4);
            const unsigned wb = *reinterpret_cast<const uint16_t*>(
                cb + t * 8 + 2 * q4);
            cnt[0] = wa & 255u, cnt[1] = wa >> 8;
            cnt[2] = wb & 255u, cnt[3] = wb >> 8;
          }
        }
#pragma unroll
        for (int i = 0; i < 4; ++i) {
          if (!(i < 2 ? ok_a : ok_b)) cnt[i] = 0u;
          s[t][i] = cnt[i] > 0 ? s[t][i] * a.scale : -INFINITY;
          // a repeated edge: cnt exp(s - m) = exp(s + log cnt - m) (the max
          // and lse move with it; softmax and lse stay those of the counts)
          if (multi && cnt[i] > 1u) s[t][i] += logf((float)cnt[i]);
        }
        m_a = fmaxf(m_a, fmaxf(s[t][0], s[t][1]));
        m_b = fmaxf(m_b, fmaxf(s[t][2], s[t][3]));
      }
#pragma unroll
      for (int o = 1; o <= 2; o <<= 1) {
        m_a = fmaxf(m_a, __shfl_xor_sync(kFullMask, m_a, o));
        m_b = fmaxf(m_b, __shfl_xor_sync(kFullMask, m_b, o));
      }
      // ---- p = exp(s - m) (0 where masked; empty rows: all 0)
      float l_a = 0.f, l_b = 0.f;
#pragma unroll
      for (int t = 0; t < kTcSrcTiles; ++t) {
#pragma unroll
        for (int i = 0; i < 4; ++i)
          s[t][i] = s[t][i] != -INFINITY
                        ? expf(s[t][i] - (i < 2 ? m_a : m_b))
                        : 0.f;
        l_a += s[t][0] + s[t][1];
        l_b += s[t][2] + s[t][3];
      }
#pragma unroll
      for (int o = 1; o <= 2; o <<= 1) {
        l_a += __shfl_xor_sync(kFullMask, l_a, o);
        l_b += __shfl_xor_sync(kFullMask, l_b, o);
      }
      const float inv_a = 1.f / (l_a + 1e-16f), inv_b = 1.f / (l_b + 1e-16f);
      // ---- out = P V / l (features nt * 8 + 2 q4, + 1)
      auto store = [&](int nt, const float (&o)[4]) {
        const int f = h * DH + nt * 8 + q4 * 2;
        float va[2] = {o[0] * inv_a, o[1] * inv_a};
        float vb[2] = {o[2] * inv_b, o[3] * inv_b};
        if (ok_a) store_vec<T, 2>(a.out + row_a * HD + f, va);
        if (ok_b) store_vec<T, 2>(a.out + row_b * HD + f, vb);
      };
      // (fp32: P's A fragments are S's accumulators, V staged transposed;
      // fp16 / bf16: P packed, S's registers free, V from its rows)
      product_store<T, kTcSrcTiles, kOutTiles>(s, n_tiles8, s_v, KS, s_v, VS,
                                               lane, store);
      if (q4 == 0) {
        if (ok_a)
          a.lse[row_a * H + h] =
              m_a != -INFINITY ? m_a + logf(l_a + 1e-16f) : -INFINITY;
        if (ok_b)
          a.lse[row_b * H + h] =
              m_b != -INFINITY ? m_b + logf(l_b + 1e-16f) : -INFINITY;
      }
    }
  }
}

}  // namespace fwd
}  // namespace pyg_dfgnn

// Tensor-core windows (forward; 'dot' kind, no training features): a block
// per graph-aligned row window whose sources span at most
// kTcMaxSrc nodes (DFGraph.row_windows(kTcMaxSrc)). The window's adjacency
// becomes a dense [rows][kTcMaxSrc] count matrix in shared memory (edge
// multiplicities, so multigraphs stay exact); per head, the sources' K rows
// and V columns are staged once, and each warp takes 16 rows at a time:
//   S = scale * Q K^T          fp16 / bf16: mma.m16n8k16; fp32: 3xTF32
//                              (three mma.m16n8k8 per product on the hi /
//                              lo tf32 halves: about fp32 accuracy); fp32
//                              accumulators; Q fragments read from global
//                              memory once per head
//   p = cnt * exp(S - max)     in registers, masked where cnt == 0
//   O = P V / sum(p)           P's A fragments are S's accumulators (fp32:
//                              the sources of each 8-tile staged in the
//                              order that makes them so; fp16 / bf16: P
//                              rounded to the input type)
// lse = max + log(sum + 1e-16) (-inf for an empty row) and O follow SMMF's
// conventions, so the backward (rows / cols passes) is unchanged.
// A whole row of scores lives in registers (16 accumulator tiles of 8
// sources): no online softmax, one pass over K and V.
#pragma once

#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include "fwd_common.cuh"
#include "row_tiles.cuh"

namespace pyg_dfgnn {
namespace fwd {

constexpr int kTcMaxSrc = 128;     // sources of one window (S in registers)
constexpr int kTcMaxRows = 256;    // rows per count-matrix chunk
constexpr int kTcWarps = 8;        // 16 rows each per step
constexpr int kTcThreads = kTcWarps * kWarpSize;
constexpr int kTcSrcTiles = kTcMaxSrc / 8;  // n-tiles of S
constexpr int kTcMaxDegree = 255;  // multiplicities fit a byte

// Two fp32 values as one register of two fp16 / bf16 (the lower index in
// the low half, as mma fragments hold them).
template <typename T>
__device__ __forceinline__ uint32_t pack2(float lo, float hi);
template <>
__device__ __forceinline__ uint32_t pack2<at::Half>(float lo, float hi) {
  __half2 v = __floats2half2_rn(lo, hi);
  return *reinterpret_cast<uint32_t*>(&v);
}
template <>
__device__ __forceinline__ uint32_t pack2<at::BFloat16>(float lo, float hi) {
  __nv_bfloat162 v = __floats2bfloat162_rn(lo, hi);
  return *reinterpret_cast<uint32_t*>(&v);
}

// d += a * b, one m16n8k16 tile (A row-major 16x16, B "col" 16x8).
template <typename T>
__device__ __forceinline__ void mma_16816(float (&d)[4], const uint32_t (&a)[4],
                                          uint32_t b0, uint32_t b1);
template <>
__device__ __forceinline__ void mma_16816<at::Half>(float (&d)[4],
                                                    const uint32_t (&a)[4],
                                                    uint32_t b0, uint32_t b1) {
  asm volatile(
      "mma.sync.aligned.m16n8k16.row.col.f32.f16.f16.f32 "
      "{%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, {%0,%1,%2,%3};\n"
      : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
      : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
}
template <>
__device__ __forceinline__ void mma_16816<at::BFloat16>(
    float (&d)[4], const uint32_t (&a)[4], uint32_t b0, uint32_t b1) {
  asm volatile(
      "mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 "
      "{%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, {%0,%1,%2,%3};\n"
      : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
      : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
}

// fp32 as tf32 (round to nearest; the low 13 mantissa bits cleared).
__device__ __forceinline__ uint32_t to_tf32(float x) {
  uint32_t r;
  asm("cvt.rna.tf32.f32 %0, %1;" : "=r"(r) : "f"(x));
  return r;
}
// x = hi + lo, both tf32.
__device__ __forceinline__ void split_tf32(float x, uint32_t& hi,
                                           uint32_t& lo) {
  hi = to_tf32(x);
  lo = to_tf32(x - __uint_as_float(hi));
}
__device__ __forceinline__ void mma_1688_tf32(float (&d)[4],
                                              const uint32_t (&a)[4],
                                              uint32_t b0, uint32_t b1) {
  asm volatile(
      "mma.sync.aligned.m16n8k8.row.col.f32.tf32.tf32.f32 "
      "{%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, {%0,%1,%2,%3};\n"
      : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
      : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
}
// d += a * b to about fp32 accuracy (3xTF32: lo * hi, hi * lo, hi * hi;
// the lo * lo term is below fp32's rounding). a: split A fragment.
__device__ __forceinline__ void mma_3xtf32(float (&d)[4],
                                           const uint32_t (&a_hi)[4],
                                           const uint32_t (&a_lo)[4],
                                           float b0, float b1) {
  uint32_t b0h, b0l, b1h, b1l;
  split_tf32(b0, b0h, b0l);
  split_tf32(b1, b1h, b1l);
  mma_1688_tf32(d, a_lo, b0h, b1h);
  mma_1688_tf32(d, a_hi, b0l, b1l);
  mma_1688_tf32(d, a_hi, b0h, b1h);
}

// fp32 path: staged row p of an 8-source tile holds source sigma(p), so
// that S's accumulator columns (2 q, 2 q + 1) of a quad lane q are the
// sources (q, q + 4) -- exactly the k-slots of its A fragment of P in
// mma.m16n8k8.
__host__ __device__ inline int tc_tf32_staged_row(int j) {
  return (j & ~7) | ((j & 3) << 1) | ((j >> 2) & 1);
}

// Shared memory of a TC block (byte offsets, 16-byte aligned): K rows of
// the head [kTcMaxSrc][DH + pad] T | V columns of the head [DH][kTcMaxSrc +
// pad] T | counts [kTcMaxRows][kTcMaxSrc] uint8 | block scalars. The pads
// (16 bytes) spread a fragment's rows over the banks.
struct TcLayout {
  size_t vt, cnt, scalars, total;
};
__host__ __device__ inline TcLayout tc_layout(int DH, size_t elem) {
  const int pad = (int)(16 / elem);
  TcLayout L;
  L.vt = align16((size_t)kTcMaxSrc * (DH + pad) * elem);
  L.cnt = align16(L.vt + (size_t)DH * (kTcMaxSrc + pad) * elem);
  L.scalars = L.cnt + (size_t)kTcMaxRows * kTcMaxSrc;
  L.total = L.scalars + 16;
  return L;
}

// One window per block: rows windows[b] .. windows[b + 1]; DH = D = F.
template <typename T, int DH>
__global__ void __launch_bounds__(kTcThreads, 1)
    tc_fwd_kernel(FwdArgs<T, int32_t> a, const int64_t* __restrict__ windows) {
  static_assert(DH % 16 == 0 && DH <= 128, "DH: 16, 32, 64 or 128");
  constexpr bool kTf32 = std::is_same<T, float>::value;
  constexpr int kK = kTf32 ? 8 : 16;       // k of one mma
  constexpr int kPad = (int)(16 / sizeof(T));
  constexpr int KS = DH + kPad, VS = kTcMaxSrc + kPad;  // (tc_layout's)
  constexpr int kSteps = DH / kK;          // k-steps of Q K^T
  constexpr int kOutTiles = DH / 8;        // n-tiles of O
  extern __shared__ __align__(16) unsigned char smem[];
  const TcLayout L = tc_layout(DH, sizeof(T));
  T* s_k = reinterpret_cast<T*>(smem);
  T* s_vt = reinterpret_cast<T*>(smem + L.vt);
  unsigned char* s_cnt = smem + L.cnt;
  int* s_lo = reinterpret_cast<int*>(smem + L.scalars);

  const int H = a.H, HD = H * DH;
  const int tid = threadIdx.x, warp = tid / kWarpSize, lane = tid % kWarpSize;
  const int g = lane / 4, q4 = lane % 4;  // fragment row group / quad lane
  const int64_t w_begin = windows[blockIdx.x], w_end = windows[blockIdx.x + 1];

  if (tid == 0) s_lo[0] = INT32_MAX, s_lo[1] = -1;
  int src_lo = 0;
  const int n_src = block_index_span(a.col, a.rowptr[w_begin],
                                     a.rowptr[w_end], s_lo, src_lo);
  if (n_src > kTcMaxSrc) __trap();  // the host dispatch rules this out
  // Source tiles in use: S's n-tiles of 8 (P V's k-tiles: pairs of them
  // for fp16 / bf16, single for fp32); staged with zeros up to 16.
  const int n_tiles8 = (n_src + 7) / 8, n_pad = (n_src + 15) / 16 * 16;
  // Source of S's accumulator element i (0..3) in an 8-tile.
  auto source_of = [&](int t, int i) -> int {
    return t * 8 + (kTf32 ? q4 + 4 * (i & 1) : q4 * 2 + (i & 1));
  };

  for (int64_t c_begin = w_begin; c_begin < w_end; c_begin += kTcMaxRows) {
    const int n_rows =
        (int)(w_end - c_begin < kTcMaxRows ? w_end - c_begin : kTcMaxRows);
    // ---- counts of the chunk's edges: cnt[row][source - lo]
    __syncthreads();  // the previous chunk is done with s_cnt
    uint32_t* cnt_words = reinterpret_cast<uint32_t*>(s_cnt);
    for (int i = tid; i < kTcMaxRows * kTcMaxSrc / 4; i += kTcThreads)
      cnt_words[i] = 0u;
    __syncthreads();
    for (int r = warp; r < n_rows; r += kTcWarps) {
      const int64_t row = c_begin + r;
      for (int64_t e = a.rowptr[row] + lane; e < a.rowptr[row + 1];
           e += kWarpSize) {
        const int c = a.col[e] - src_lo;
        atomicAdd(&cnt_words[(r * kTcMaxSrc + c) / 4], 1u << (8 * (c % 4)));
      }
    }

    for (int h = 0; h < H; ++h) {
      // ---- stage K rows and V columns of head h (zeros past n_src, so
      // that masked products stay 0, not NaN)
      __syncthreads();  // counts written; the previous head is done
      for (int i = tid; i < n_pad * DH; i += kTcThreads) {
        const int j = i / DH, d = i - (i / DH) * DH;
        T kv = from_float<T>(0.f), vv = from_float<T>(0.f);
        if (j < n_src) {
          const int64_t at = (int64_t)(src_lo + j) * HD + h * DH + d;
          kv = a.k[at];
          vv = a.v[at];
        }
        s_k[(kTf32 ? tc_tf32_staged_row(j) : j) * KS + d] = kv;
        s_vt[d * VS + j] = vv;
      }
      __syncthreads();

      for (int r0 = warp * 16; r0 < n_rows; r0 += kTcWarps * 16) {
        const int64_t row_a = c_begin + r0 + g, row_b = row_a + 8;
        const bool ok_a = r0 + g < n_rows, ok_b = r0 + g + 8 < n_rows;
        const T* qa = a.q + row_a * HD + h * DH;
        const T* qb = a.q + row_b * HD + h * DH;
        // ---- S = Q K^T over the used source tiles
        float s[kTcSrcTiles][4];
#pragma unroll
        for (int t = 0; t < kTcSrcTiles; ++t)
          s[t][0] = s[t][1] = s[t][2] = s[t][3] = 0.f;
#pragma unroll
        for (int ks = 0; ks < kSteps; ++ks) {
          if constexpr (kTf32) {  // A: rows (g, g + 8) x k (q4, q4 + 4)
            const int d = ks * 8 + q4;
            uint32_t hi[4], lo[4];
            split_tf32(ok_a ? to_float(qa[d]) : 0.f, hi[0], lo[0]);
            split_tf32(ok_b ? to_float(qb[d]) : 0.f, hi[1], lo[1]);
            split_tf32(ok_a ? to_float(qa[d + 4]) : 0.f, hi[2], lo[2]);
            split_tf32(ok_b ? to_float(qb[d + 4]) : 0.f, hi[3], lo[3]);
#pragma unroll
            for (int t = 0; t < kTcSrcTiles; ++t)
              if (t < n_tiles8) {
                const T* kr = s_k + (t * 8 + g) * KS + d;
                mma_3xtf32(s[t], hi, lo, to_float(kr[0]), to_float(kr[4]));
              }
          } else {  // A: rows (g, g + 8) x k pairs (2 q4, + 8)
            const int d = ks * 16 + q4 * 2;
            uint32_t qf[4];
            qf[0] = ok_a ? *reinterpret_cast<const uint32_t*>(qa + d) : 0u;
            qf[1] = ok_b ? *reinterpret_cast<const uint32_t*>(qb + d) : 0u;
            qf[2] = ok_a ? *reinterpret_cast<const uint32_t*>(qa + d + 8) : 0u;
            qf[3] = ok_b ? *reinterpret_cast<const uint32_t*>(qb + d + 8) : 0u;
#pragma unroll
            for (int t = 0; t < kTcSrcTiles; ++t)
              if (t < n_tiles8) {
                const T* kr = s_k + (t * 8 + g) * KS + d;
                mma_16816<T>(s[t], qf, *reinterpret_cast<const uint32_t*>(kr),
                             *reinterpret_cast<const uint32_t*>(kr + 8));
              }
          }
        }
        // ---- mask, row max (rows g and g + 8: a quad holds a row)
        const unsigned char* ca = s_cnt + (r0 + g) * kTcMaxSrc;
        const unsigned char* cb = ca + 8 * kTcMaxSrc;
        float m_a = -INFINITY, m_b = -INFINITY;
#pragma unroll
        for (int t = 0; t < kTcSrcTiles; ++t) {
#pragma unroll
          for (int i = 0; i < 4; ++i) {
            const bool ok = t < n_tiles8 && (i < 2 ? ok_a : ok_b);
            const unsigned cnt = ok ? (i < 2 ? ca : cb)[source_of(t, i)] : 0u;
            s[t][i] = cnt > 0 ? s[t][i] * a.scale : -INFINITY;
          }
          m_a = fmaxf(m_a, fmaxf(s[t][0], s[t][1]));
          m_b = fmaxf(m_b, fmaxf(s[t][2], s[t][3]));
        }
#pragma unroll
        for (int o = 1; o <= 2; o <<= 1) {
          m_a = fmaxf(m_a, __shfl_xor_sync(kFullMask, m_a, o));
          m_b = fmaxf(m_b, __shfl_xor_sync(kFullMask, m_b, o));
        }
        // ---- p = cnt * exp(s - m) (0 where masked; empty rows: all 0)
        float l_a = 0.f, l_b = 0.f;
#pragma unroll
        for (int t = 0; t < kTcSrcTiles; ++t) {
#pragma unroll
          for (int i = 0; i < 4; ++i) {
            float p = 0.f;
            if (s[t][i] != -INFINITY)
              p = (float)(i < 2 ? ca : cb)[source_of(t, i)] *
                  expf(s[t][i] - (i < 2 ? m_a : m_b));
            s[t][i] = p;
          }
          l_a += s[t][0] + s[t][1];
          l_b += s[t][2] + s[t][3];
        }
#pragma unroll
        for (int o = 1; o <= 2; o <<= 1) {
          l_a += __shfl_xor_sync(kFullMask, l_a, o);
          l_b += __shfl_xor_sync(kFullMask, l_b, o);
        }
        // ---- O = P V: P's A fragments are S's accumulators
        float o[kOutTiles][4];
#pragma unroll
        for (int nt = 0; nt < kOutTiles; ++nt)
          o[nt][0] = o[nt][1] = o[nt][2] = o[nt][3] = 0.f;
        if constexpr (kTf32) {  // k-tiles of 8 sources: k = (q4, q4 + 4)
#pragma unroll
          for (int t = 0; t < kTcSrcTiles; ++t) {
            if (t < n_tiles8) {
              uint32_t hi[4], lo[4];
              split_tf32(s[t][0], hi[0], lo[0]);  // (g, q4)
              split_tf32(s[t][2], hi[1], lo[1]);  // (g + 8, q4)
              split_tf32(s[t][1], hi[2], lo[2]);  // (g, q4 + 4)
              split_tf32(s[t][3], hi[3], lo[3]);  // (g + 8, q4 + 4)
#pragma unroll
              for (int nt = 0; nt < kOutTiles; ++nt) {
                const T* vr = s_vt + (nt * 8 + g) * VS + t * 8 + q4;
                mma_3xtf32(o[nt], hi, lo, to_float(vr[0]), to_float(vr[4]));
              }
            }
          }
        } else {  // k-tiles of 16 sources: S tiles 2 kt, 2 kt + 1
#pragma unroll
          for (int kt = 0; kt < kTcSrcTiles / 2; ++kt) {
            if (2 * kt < n_tiles8) {
              uint32_t pf[4];
              pf[0] = pack2<T>(s[2 * kt][0], s[2 * kt][1]);
              pf[1] = pack2<T>(s[2 * kt][2], s[2 * kt][3]);
              pf[2] = pack2<T>(s[2 * kt + 1][0], s[2 * kt + 1][1]);
              pf[3] = pack2<T>(s[2 * kt + 1][2], s[2 * kt + 1][3]);
#pragma unroll
              for (int nt = 0; nt < kOutTiles; ++nt) {
                const T* vr = s_vt + (nt * 8 + g) * VS + kt * 16 + q4 * 2;
                mma_16816<T>(o[nt], pf, *reinterpret_cast<const uint32_t*>(vr),
                             *reinterpret_cast<const uint32_t*>(vr + 8));
              }
            }
          }
        }
        // ---- out = O / l (features nt * 8 + 2 q4, + 1), lse
        const float inv_a = 1.f / (l_a + 1e-16f), inv_b = 1.f / (l_b + 1e-16f);
#pragma unroll
        for (int nt = 0; nt < kOutTiles; ++nt) {
          const int f = h * DH + nt * 8 + q4 * 2;
          float va[2] = {o[nt][0] * inv_a, o[nt][1] * inv_a};
          float vb[2] = {o[nt][2] * inv_b, o[nt][3] * inv_b};
          if (ok_a) store_vec<T, 2>(a.out + row_a * HD + f, va);
          if (ok_b) store_vec<T, 2>(a.out + row_b * HD + f, vb);
        }
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
}

}  // namespace fwd
}  // namespace pyg_dfgnn

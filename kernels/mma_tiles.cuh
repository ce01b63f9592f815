// Warp-level tensor-core tiles of the TC window kernels (mma.sync, sm_80+):
// C[16 x 8] += A[16 x k] B[k x 8] with fp32 accumulators.
//   fp16 / bf16: mma.m16n8k16, k = 16, operands packed in pairs;
//   fp32: 3xTF32, mma.m16n8k8, k = 8: each operand split into tf32 hi + lo
//         halves (split_tf32), a b = lo_a hi_b + hi_a lo_b + hi_a hi_b:
//         about fp32 accuracy at three mma per product (1xTF32, opt-in:
//         one product of rounded operands).
// Fragments (g = lane / 4, q = lane % 4): C holds rows (g, g + 8) x columns
// (2 q, 2 q + 1). A holds rows (g, g + 8) x k (2 q, 2 q + 1, + 8) for k = 16
// and (q, q + 4) for k = 8; B holds k (same as A's) x column g.
// B comes from "NK" rows, element (n, k) at base[n * stride + k] (K rows for
// Q K^T), or from the same operand rows read as [k][n] (V for P V, K for
// dS K, ...: fp16 / bf16 by ldmatrix.trans, fp32 by scalar reads); A from
// row-major [m][k] rows.
//
// An accumulator tile reused as an A fragment (P from S, dS ...) needs its
// columns to be A's k-slots: for k = 16 they are (2 q, 2 q + 1) of two
// adjacent tiles, as they come; for fp32 (k = 8: slots q, q + 4) the NK rows
// that produced the columns are staged permuted within each 8-tile
// (tc_staged_row), so that column (2 q + i) is index q + 4 i.
#pragma once

#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include <cstdint>
#include <type_traits>

#include "numeric.cuh"

namespace pyg_dfgnn {

// ------------------------------------------------------------ instructions
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

// fp32 as one tf32 operand rounded to nearest (half away from zero): the
// tensor cores read a tf32 operand's top 19 bits (sign, exponent, 10
// mantissa bits; the rest ignored, i.e. truncated -- as nvcc's own lowering
// of cvt.rna.tf32 relies on), so a half ulp added first rounds (one
// instruction).
__device__ __forceinline__ uint32_t round_tf32(uint32_t x) {
  return x + 0x1000u;
}
// x = hi + lo as tf32 operands: hi = x rounded (round_tf32), lo = x -
// round(x), exact in fp32 (|lo| <= 2^-11 |x|), which the mma truncates in
// turn. a b = lo_a hi_b + hi_a lo_b + hi_a hi_b then misses lo's truncation
// (< 2^-21 |x|) and lo_a lo_b (< 2^-22 |a b|), as cvt.rna's split did.
// Three instructions per operand (cvt.rna twice took eight: it is emulated
// with an infinity test; hi unrounded, two, doubled the error: a one-node
// row's near-zero d Q missed the tests' bound). kPinned: the mask as a
// volatile instruction, so that the compiler keeps the split where it is
// written (it hoisted P's split out of the loop over P V's parts: 64 more
// registers, spilled).
template <bool kPinned = false>
__device__ __forceinline__ void split_tf32(float x, uint32_t& hi,
                                           uint32_t& lo) {
  hi = round_tf32(__float_as_uint(x));
  uint32_t rounded = hi & 0xffffe000u;
  if constexpr (kPinned)
    asm volatile("and.b32 %0, %1, 0xffffe000;" : "=r"(rounded) : "r"(hi));
  lo = __float_as_uint(x - __uint_as_float(rounded));
}
// (not volatile: no side effects, so that the scheduler interleaves the
// products of independent accumulators)
__device__ __forceinline__ void mma_1688_tf32(float (&d)[4],
                                              const uint32_t (&a)[4],
                                              uint32_t b0, uint32_t b1) {
  asm(
      "mma.sync.aligned.m16n8k8.row.col.f32.tf32.tf32.f32 "
      "{%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, {%0,%1,%2,%3};\n"
      : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
      : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
}

// fp32 path: staged row p of an 8-tile of NK rows holds index sigma(p), so
// that accumulator columns (2 q, 2 q + 1) are the indices (q, q + 4).
__host__ __device__ inline int tc_staged_row(int j) {
  return (j & ~7) | ((j & 3) << 1) | ((j >> 2) & 1);
}

// ------------------------------------------------------------ async copies
// 16 bytes global -> shared without registers (sm_80+); `bytes` 0 writes
// zeros (rows past a window's sources).
__device__ __forceinline__ void cp_async_16(void* smem_dst, const void* src,
                                            int bytes) {
  const uint32_t dst = (uint32_t)__cvta_generic_to_shared(smem_dst);
  asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;\n" ::"r"(dst),
               "l"(src), "r"(bytes));
}
__device__ __forceinline__ void cp_async_wait_all() {
  asm volatile("cp.async.wait_all;\n" ::);
}

// Four 8 x 8 b16 matrices from shared memory: lane l gives the row address
// of row l % 8 of matrix l / 8; r[m] is matrix m's fragment (lane t: row
// t / 4, elements 2 (t % 4), + 1), or with .trans its transpose's (lane t:
// rows 2 (t % 4), + 1 of column t / 4) -- B fragments of K rows resp. of
// row-major V without a transposed copy.
__device__ __forceinline__ void ldmatrix_x4(uint32_t (&r)[4], const void* p) {
  const uint32_t a = (uint32_t)__cvta_generic_to_shared(p);
  asm volatile("ldmatrix.sync.aligned.m8n8.x4.shared.b16 {%0,%1,%2,%3}, [%4];\n"
               : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
               : "r"(a));
}
__device__ __forceinline__ void ldmatrix_x4_trans(uint32_t (&r)[4],
                                                  const void* p) {
  const uint32_t a = (uint32_t)__cvta_generic_to_shared(p);
  asm volatile(
      "ldmatrix.sync.aligned.m8n8.x4.trans.shared.b16 {%0,%1,%2,%3}, [%4];\n"
      : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
      : "r"(a));
}

// ------------------------------------------------------------ staging
// Rows [0, n_pad) of X (row i at x + (base + i) * ld) as rows `nk`
// (stride ns; kPermute: permuted within 8-tiles, fp32's NK rows,
// tc_staged_row; else in true order), zeros past n, by cp.async: every copy
// of the block in flight at once (the caller waits with cp_async_wait_all
// and a barrier). x 16-byte aligned (the host hands the TC kernels aligned
// inputs; rows then are: DH * size of T is a multiple of 16).
template <typename T, int DH, int kThreads,
          bool kPermute = std::is_same<T, float>::value>
__device__ __forceinline__ void tc_stage_rows_async(
    const T* __restrict__ x, int64_t base, int64_t ld, int n, int n_pad, T* nk,
    int ns, int tid) {
  constexpr int kVec = (int)(16 / sizeof(T)), kChunks = DH / kVec;
  for (int i = tid; i < n_pad * kChunks; i += kThreads) {
    const int j = i / kChunks, d0 = (i % kChunks) * kVec;
    const bool ok = j < n;
    cp_async_16(nk + (kPermute ? tc_staged_row(j) : j) * ns + d0,
                x + (base + (ok ? j : 0)) * ld + d0, ok ? 16 : 0);
  }
}

// ------------------------------------------------------------ fp16 / bf16
// products on operand rows as staged (row-major, no transposed copies).
// Tiles are staged with zeros up to a multiple of 16 rows, so that tiles go
// in pairs; ldmatrix lane l addresses row l % 8 of matrix l / 8.

// d[t], d[t + 1] += a B for the used tile pairs (t < n_tiles) of NK rows
// (row n of B^T at nk + n * ns; k-step k0): matrices (tile t + m / 2, k half
// m % 2) are b0, b1 of both tiles, one ldmatrix per pair.
template <typename T, int kTiles>
__device__ __forceinline__ void mma_nk_pairs(float (&d)[kTiles][4],
                                             const uint32_t (&a)[4],
                                             int n_tiles, const T* nk, int ns,
                                             int k0, int lane) {
  const int m4 = lane / 8, r8 = lane % 8;
#pragma unroll
  for (int t = 0; t < kTiles; t += 2)
    if (t < n_tiles) {
      uint32_t b[4];
      ldmatrix_x4(b, nk + ((t + m4 / 2) * 8 + r8) * ns + k0 + 8 * (m4 % 2));
      mma_16816<T>(d[t], a, b[0], b[1]);
      mma_16816<T>(d[t + 1], a, b[2], b[3]);
    }
}

// Accumulator 8-tiles (over k) as the A fragments of 16-wide k-steps.
template <typename T, int kTiles>
__device__ __forceinline__ void pack_a_steps(uint32_t (&pa)[kTiles / 2][4],
                                             const float (&x)[kTiles][4]) {
#pragma unroll
  for (int j = 0; j < kTiles / 2; ++j) {
    pa[j][0] = pack2<T>(x[2 * j][0], x[2 * j][1]);
    pa[j][1] = pack2<T>(x[2 * j][2], x[2 * j][3]);
    pa[j][2] = pack2<T>(x[2 * j + 1][0], x[2 * j + 1][1]);
    pa[j][3] = pack2<T>(x[2 * j + 1][2], x[2 * j + 1][3]);
  }
}

// acc = A B over the used k-steps (16 j < k_used) for n-tiles n0 .. n0 +
// kOut, B[k][n] at rows[k * ns + n] (K, V, Q or dO rows as staged):
// matrices (k half m % 2, n-tile m / 2) by ldmatrix.trans are b0, b1 of two
// n-tiles.
template <typename T, int kSteps, int kOut>
__device__ __forceinline__ void product_rows(float (&acc)[kOut][4],
                                             const uint32_t (&pa)[kSteps][4],
                                             int k_used, const T* rows,
                                             int ns, int n0, int lane) {
  static_assert(kOut % 2 == 0, "n-tiles in pairs");
  const int m4 = lane / 8, r8 = lane % 8;
#pragma unroll
  for (int nt = 0; nt < kOut; ++nt)
    acc[nt][0] = acc[nt][1] = acc[nt][2] = acc[nt][3] = 0.f;
#pragma unroll
  for (int j = 0; j < kSteps; ++j)
    if (16 * j < k_used) {
#pragma unroll
      for (int nt = 0; nt < kOut; nt += 2) {
        uint32_t b[4];
        ldmatrix_x4_trans(b, rows + (16 * j + 8 * (m4 % 2) + r8) * ns +
                                 (n0 + nt + m4 / 2) * 8);
        mma_16816<T>(acc[nt], pa[j], b[0], b[1]);
        mma_16816<T>(acc[nt + 1], pa[j], b[2], b[3]);
      }
    }
}

// ------------------------------------------------------------ tiles
// MmaTile<T>: the fragments and the product of one dtype.
template <typename T>
struct MmaTile {
  static constexpr bool kTf32 = std::is_same<T, float>::value;
  static constexpr int kK = kTf32 ? 8 : 16;  // k of one product
  // A fragment: fp32 keeps the split halves, fp16 / bf16 the pairs.
  struct A {
    uint32_t hi[4];
    uint32_t lo[4];  // (fp32 only)
  };

  // Index (within its 8-tile's origin) of accumulator element i (0..3):
  // column 2 q + (i & 1), fp32 staged as tc_staged_row sorts it.
  __device__ static __forceinline__ int column(int q, int i) {
    return kTf32 ? q + 4 * (i & 1) : 2 * q + (i & 1);
  }

  // A from two row-major rows (rows g and g + 8; nullptr: zeros), k-step k0.
  // fp32: the four values of such an A fragment, and their split (apart,
  // so that a caller can load one k-step ahead).
  __device__ static __forceinline__ void load_x(const float* ra,
                                                const float* rb, int k0,
                                                int q, float (&x)[4]) {
    x[0] = ra ? ra[k0 + q] : 0.f;
    x[1] = rb ? rb[k0 + q] : 0.f;
    x[2] = ra ? ra[k0 + q + 4] : 0.f;
    x[3] = rb ? rb[k0 + q + 4] : 0.f;
  }
  __device__ static __forceinline__ A split_x(const float (&x)[4]) {
    A a;
#pragma unroll
    for (int i = 0; i < 4; ++i) split_tf32(x[i], a.hi[i], a.lo[i]);
    return a;
  }

  __device__ static __forceinline__ A load_a(const T* ra, const T* rb,
                                             int k0, int q) {
    A a;
    if constexpr (kTf32) {
      float x[4];
      load_x(ra, rb, k0, q, x);
      a = split_x(x);
    } else {
      const int k = k0 + 2 * q;
      a.hi[0] = ra ? *reinterpret_cast<const uint32_t*>(ra + k) : 0u;
      a.hi[1] = rb ? *reinterpret_cast<const uint32_t*>(rb + k) : 0u;
      a.hi[2] = ra ? *reinterpret_cast<const uint32_t*>(ra + k + 8) : 0u;
      a.hi[3] = rb ? *reinterpret_cast<const uint32_t*>(rb + k + 8) : 0u;
    }
    return a;
  }
};

// ------------------------------------------------------------ fp32 rows
// 3xTF32 products on operand rows as staged (the forward's fp32 path).

// d[t0 + i] += a b[i] for kN m16n8k8 tiles. k3 (3xTF32): B's halves split
// here, a's given (ah, al), the three products of a tile apart so that
// consecutive mma write different accumulators; else (1xTF32, opt-in) one
// product of ah (rounded to tf32 by the caller: split_tf32's hi, or
// round_tf32) and b rounded here.
template <int kN, bool k3, int kTiles>
__device__ __forceinline__ void mma_tf32_tiles(float (&d)[kTiles][4], int t0,
                                               const uint32_t (&ah)[4],
                                               const uint32_t (&al)[4],
                                               const float (&b)[kN][2]) {
  if constexpr (!k3) {
#pragma unroll
    for (int i = 0; i < kN; ++i)
      mma_1688_tf32(d[t0 + i], ah, round_tf32(__float_as_uint(b[i][0])),
                    round_tf32(__float_as_uint(b[i][1])));
    return;
  }
  uint32_t bh[kN][2], bl[kN][2];
#pragma unroll
  for (int i = 0; i < kN; ++i) {
    split_tf32(b[i][0], bh[i][0], bl[i][0]);
    split_tf32(b[i][1], bh[i][1], bl[i][1]);
  }
#pragma unroll
  for (int i = 0; i < kN; ++i) mma_1688_tf32(d[t0 + i], al, bh[i][0], bh[i][1]);
#pragma unroll
  for (int i = 0; i < kN; ++i) mma_1688_tf32(d[t0 + i], ah, bl[i][0], bl[i][1]);
#pragma unroll
  for (int i = 0; i < kN; ++i) mma_1688_tf32(d[t0 + i], ah, bh[i][0], bh[i][1]);
}

// d[t .. t + 3] += a B for the used groups of four tiles of fp32 NK rows
// (permuted within 8-tiles, tc_staged_row; staged with zeros up to a
// multiple of 32 rows; k-step k0): ldmatrix's 8 x 8 b16 matrix is 8 rows x
// 4 words, lane l getting row l / 4, word l % 4 -- B's (column g, k q) of
// m16n8k8 -- so that matrices (tile t + m / 2, k half m % 2) are b0, b1 of
// two tiles, one ldmatrix per pair (a row stride of 4 mod 32 words puts a
// matrix's 8 rows in distinct banks); four tiles' products interleaved
// (two left the three dependent products of a tile waiting on each other).
// k3: 3xTF32 (a split as MmaTile::load_a gives it), else 1xTF32.
template <bool k3, int kTiles>
__device__ __forceinline__ void mma_nk_tf32(
    float (&d)[kTiles][4], const typename MmaTile<float>::A& a, int n_tiles,
    const float* nk, int ns, int k0, int lane) {
  static_assert(kTiles % 4 == 0, "tiles in fours");
  const int m4 = lane / 8, r8 = lane % 8;
  // (a.hi is rounded already, split_tf32: both products take it as it is)
  // (one address, the tiles at constant offsets from it: per-pair addresses
  // kept in registers spilled at D = 64)
  const float* base = nk + ((m4 / 2) * 8 + r8) * ns + k0 + 4 * (m4 % 2);
#pragma unroll
  for (int t = 0; t < kTiles; t += 4)
    if (t < n_tiles) {
      uint32_t r[2][4];
      ldmatrix_x4(r[0], base + t * 8 * ns);
      ldmatrix_x4(r[1], base + (t + 2) * 8 * ns);
      float b[4][2];
#pragma unroll
      for (int i = 0; i < 4; ++i)
        b[i][0] = __uint_as_float(r[i / 2][2 * (i % 2)]),
        b[i][1] = __uint_as_float(r[i / 2][2 * (i % 2) + 1]);
      mma_tf32_tiles<4, k3>(d, t, a.hi, a.lo, b);
    }
}

// acc = x B over the used 8-tiles of k (k_tiles; x: accumulator tiles
// reused as A fragments -- their columns (2 q, 2 q + 1) are the k-slots (q,
// q + 4), as the permuted NK rows that made them sort them) for n-tiles n0
// .. n0 + kOut, B[k][n] at rows[k' * ns + n] as staged: k' = k in true
// order (kPermuted false: V's rows in the forward; stride 8 mod 32 words),
// or where tc_staged_row put k (the backward's NK rows, also its products'
// B: k' = 2 q, 2 q + 1 for k = q, q + 4; stride 4 mod 32 words): two scalar
// reads, in distinct banks either way. k3: 3xTF32, else 1xTF32.
template <bool k3, bool kPermuted, int kTiles, int kOut>
__device__ __forceinline__ void product_rows_tf32(float (&acc)[kOut][4],
                                                  const float (&x)[kTiles][4],
                                                  int k_tiles,
                                                  const float* rows, int ns,
                                                  int n0, int lane) {
  const int g = lane / 4, q = lane % 4;
  const int k_lo = kPermuted ? 2 * q : q, k_hi = kPermuted ? 2 * q + 1 : q + 4;
#pragma unroll
  for (int nt = 0; nt < kOut; ++nt)
    acc[nt][0] = acc[nt][1] = acc[nt][2] = acc[nt][3] = 0.f;
#pragma unroll
  for (int t = 0; t < kTiles; ++t)
    if (t < k_tiles) {
      // (g, q), (g + 8, q), (g, q + 4), (g + 8, q + 4); split for every
      // part (pinned: see split_tf32)
      const float xa[4] = {x[t][0], x[t][2], x[t][1], x[t][3]};
      typename MmaTile<float>::A fa;
#pragma unroll
      for (int i = 0; i < 4; ++i) {
        if constexpr (k3)
          split_tf32<true>(xa[i], fa.hi[i], fa.lo[i]);
        else
          fa.hi[i] = round_tf32(__float_as_uint(xa[i]));
      }
      const float* r = rows + t * 8 * ns + n0 * 8 + g;
      float b[kOut][2];
#pragma unroll
      for (int nt = 0; nt < kOut; ++nt)
        b[nt][0] = r[k_lo * ns + nt * 8], b[nt][1] = r[k_hi * ns + nt * 8];
      mma_tf32_tiles<kOut, k3>(acc, 0, fa.hi, fa.lo, b);
    }
}

// out = x B over the used 8-tiles of k (x: accumulator tiles reused as A
// fragments: P for P V, dS / P in the backward's products), B[k][n] from
// the operand rows `rows` (stride ns) as staged, handed to store(nt, acc)
// per n-tile of the [16 x 8 kOut] result, in parts of at most 8 n-tiles
// (32 result registers at a time). fp16 / bf16: x packed per 16-wide
// k-step, ldmatrix.trans (product_rows); fp32: 3xTF32, or 1xTF32 if
// kOneTf32, rows in true order or permuted as NK rows (kPermutedRows;
// product_rows_tf32).
template <typename T, int kTiles, int kOut, bool kOneTf32 = false,
          bool kPermutedRows = false, typename Store>
__device__ __forceinline__ void product_rows_store(
    const float (&x)[kTiles][4], int k_tiles, const T* rows, int ns, int lane,
    Store store) {
  constexpr int kPartMax = MmaTile<T>::kTf32 ? 4 : 8;
  constexpr int kPart = kOut < kPartMax ? kOut : kPartMax;
  if constexpr (MmaTile<T>::kTf32) {
#pragma unroll 1  // (code size: a part is ~1,000 instructions)
    for (int part = 0; part < kOut; part += kPart) {
      float acc[kPart][4];
      product_rows_tf32<!kOneTf32, kPermutedRows, kTiles, kPart>(
          acc, x, k_tiles, rows, ns, part, lane);
#pragma unroll
      for (int nt = 0; nt < kPart; ++nt) store(part + nt, acc[nt]);
    }
  } else {
    uint32_t pa[kTiles / 2][4];
    pack_a_steps<T>(pa, x);
#pragma unroll
    for (int part = 0; part < kOut; part += kPart) {
      float acc[kPart][4];
      product_rows<T>(acc, pa, k_tiles * 8, rows, ns, part, lane);
#pragma unroll
      for (int nt = 0; nt < kPart; ++nt) store(part + nt, acc[nt]);
    }
  }
}

}  // namespace pyg_dfgnn

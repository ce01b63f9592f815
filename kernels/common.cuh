// Shared device helpers of the fused attention kernels (forward and backward).
//
// Stable names (the backward includes this file):
//   Vec<T>::kWidth              elements of T in one 16-byte access
//   to_float(T) / from_float<T> conversions; arithmetic is always fp32
//   load_vec<T, N>(ptr, float[N])   N consecutive elements -> fp32 registers
//                                   (one 16-byte load when N * sizeof(T) == 16;
//                                   ptr must then be 16-byte aligned)
//   store_vec<T, N>(ptr, float[N])  the reverse
//   leaky_relu(x, slope), leaky_relu_grad(x, slope)
//   warp_sum / warp_max            full-warp butterfly reductions
//   group_sum(v, group)            sum over aligned lane groups of `group`
//                                   (a power of two <= 32) lanes; every lane
//                                   of the warp must call it
//   next_pow2(x)                   host + device
//   row tiles (forward and backward row kernels): load_smem, score_part,
//   find_row, block_index_span, begin_pass, reduce_edge_groups, align16,
//   copy_to_smem, group8_sum
//   kFullMask, kWarpSize
//   PYG_DFGNN_DISPATCH_FLOAT(dtype, NAME, ...)  -> scalar_t (float/half/bf16)
//   PYG_DFGNN_DISPATCH_INDEX(dtype, NAME, ...)  -> index_t (int32_t/int64_t)
//   PYG_DFGNN_DISPATCH_KIND(kind, ...)          -> constexpr int KIND
//   PYG_DFGNN_DISPATCH_BOOL(flag, NAME, ...)    -> constexpr bool NAME
//   EdgeTerms, DropoutMask         per-edge inputs and attention dropout
#pragma once

#include <ATen/ATen.h>
#include <ATen/Dispatch.h>
#include <c10/cuda/CUDAException.h>
#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_runtime.h>

#include <ATen/cuda/PhiloxUtils.cuh>

#include <algorithm>
#include <cstdint>
#include <type_traits>

#include "ops.h"

namespace pyg_dfgnn {

constexpr unsigned kFullMask = 0xffffffffu;
constexpr int kWarpSize = 32;

__host__ __device__ inline int next_pow2(int x) {
  int p = 1;
  while (p < x) p <<= 1;
  return p;
}

// ------------------------------------------------------------ conversions
template <typename T>
__device__ __forceinline__ float to_float(T x) {
  return static_cast<float>(x);
}
template <>
__device__ __forceinline__ float to_float<at::Half>(at::Half x) {
  return __half2float(static_cast<__half>(x));
}
template <>
__device__ __forceinline__ float to_float<at::BFloat16>(at::BFloat16 x) {
  return __bfloat162float(static_cast<__nv_bfloat16>(x));
}

template <typename T>
__device__ __forceinline__ T from_float(float x) {
  return static_cast<T>(x);
}
template <>
__device__ __forceinline__ at::Half from_float<at::Half>(float x) {
  return at::Half(__float2half_rn(x));
}
template <>
__device__ __forceinline__ at::BFloat16 from_float<at::BFloat16>(float x) {
  return at::BFloat16(__float2bfloat16_rn(x));
}

// ------------------------------------------------------------ vectors
template <typename T>
struct Vec {
  static constexpr int kWidth = 16 / sizeof(T);  // 4 fp32, 8 fp16/bf16
};

// Raw storage of N elements of T, loaded/stored with one access of
// N * sizeof(T) bytes (4, 8 or 16).
template <int Bytes>
struct RawWords;
template <>
struct RawWords<2> {
  using type = uint16_t;
};
template <>
struct RawWords<4> {
  using type = uint32_t;
};
template <>
struct RawWords<8> {
  using type = uint2;
};
template <>
struct RawWords<16> {
  using type = uint4;
};

template <typename T, int N>
__device__ __forceinline__ void load_vec(const T* __restrict__ ptr,
                                         float (&out)[N]) {
  constexpr int kBytes = N * sizeof(T);
  if constexpr (kBytes == 2 || kBytes == 4 || kBytes == 8 || kBytes == 16) {
    using W = typename RawWords<kBytes>::type;
    union {
      W w;
      T t[N];
    } u;
    u.w = *reinterpret_cast<const W*>(ptr);
#pragma unroll
    for (int i = 0; i < N; ++i) out[i] = to_float(u.t[i]);
  } else {
#pragma unroll
    for (int i = 0; i < N; ++i) out[i] = to_float(ptr[i]);
  }
}

template <typename T, int N>
__device__ __forceinline__ void store_vec(T* __restrict__ ptr,
                                          const float (&in)[N]) {
  constexpr int kBytes = N * sizeof(T);
  if constexpr (kBytes == 2 || kBytes == 4 || kBytes == 8 || kBytes == 16) {
    using W = typename RawWords<kBytes>::type;
    union {
      W w;
      T t[N];
    } u;
#pragma unroll
    for (int i = 0; i < N; ++i) u.t[i] = from_float<T>(in[i]);
    *reinterpret_cast<W*>(ptr) = u.w;
  } else {
#pragma unroll
    for (int i = 0; i < N; ++i) ptr[i] = from_float<T>(in[i]);
  }
}

// x += ptr[0, N) (an edge term added to a neighbour row).
template <typename T, int N>
__device__ __forceinline__ void add_vec(const T* __restrict__ ptr,
                                        float (&x)[N]) {
  float y[N];
  load_vec<T, N>(ptr, y);
#pragma unroll
  for (int i = 0; i < N; ++i) x[i] += y[i];
}

// ------------------------------------------------------------ math
__device__ __forceinline__ float leaky_relu(float x, float slope) {
  return x > 0.f ? x : x * slope;
}
// d leaky_relu / dx (PyG / torch: slope for x <= 0).
__device__ __forceinline__ float leaky_relu_grad(float x, float slope) {
  return x > 0.f ? 1.f : slope;
}

__device__ __forceinline__ float warp_sum(float v) {
#pragma unroll
  for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(kFullMask, v, o);
  return v;
}
__device__ __forceinline__ float warp_max(float v) {
#pragma unroll
  for (int o = 16; o > 0; o >>= 1)
    v = fmaxf(v, __shfl_xor_sync(kFullMask, v, o));
  return v;
}
// Sum over aligned groups of `group` lanes (power of two, 1..32).
__device__ __forceinline__ float group_sum(float v, int group) {
  for (int o = group >> 1; o > 0; o >>= 1)
    v += __shfl_xor_sync(kFullMask, v, o);
  return v;
}

// ------------------------------------------------------------ edge inputs
// Per-edge inputs of the score and the message, all in CSR edge order
// (nullptr: absent). 'add': a score term es [E, H]; 'dot' / 'gatv2': a key
// term ek [E, H, D] added to k_j; any kind: a value term ev [E, H, F] added to
// v_j in the message.
template <typename T>
struct EdgeTerms {
  const T* __restrict__ es;
  const T* __restrict__ ek;
  const T* __restrict__ ev;
};

// Attention dropout, counter-based: the mask of (CSR edge e, head h) is a
// pure function of (seed, offset, e, h) -- the same in every strategy, and
// regenerated by the backward instead of stored. Philox4x32-10 (Salmon et
// al., Random123), one 32-bit word per (e, h): counter (e, h / 4, offset),
// key seed, word h % 4. The forward takes (seed, offset) from PyTorch's CUDA
// generator (at::PhiloxCudaState: graph-safe under CUDA graph capture) and
// writes them to `saved` for the backward, which reads them there.
__device__ __forceinline__ uint32_t philox_word(uint64_t seed,
                                                uint64_t offset, uint64_t e,
                                                int h) {
  uint32_t c0 = (uint32_t)e, c1 = ((uint32_t)(e >> 32) << 5) | (h >> 2);
  uint32_t c2 = (uint32_t)offset, c3 = (uint32_t)(offset >> 32);
  uint32_t k0 = (uint32_t)seed, k1 = (uint32_t)(seed >> 32);
#pragma unroll
  for (int r = 0; r < 10; ++r) {
    const uint32_t lo0 = c0 * 0xD2511F53u, hi0 = __umulhi(c0, 0xD2511F53u);
    const uint32_t lo1 = c2 * 0xCD9E8D57u, hi1 = __umulhi(c2, 0xCD9E8D57u);
    c0 = hi1 ^ c1 ^ k0;
    c1 = lo1;
    c2 = hi0 ^ c3 ^ k1;
    c3 = lo0;
    k0 += 0x9E3779B9u;
    k1 += 0xBB67AE85u;
  }
  const int w = h & 3;
  return w == 0 ? c0 : w == 1 ? c1 : w == 2 ? c2 : c3;
}

struct DropoutMask {
  at::PhiloxCudaState philox;  // forward: PyTorch's generator state
  int64_t* save;               // forward: [seed, offset] -> here (block 0)
  const int64_t* saved;        // backward / alpha: read from here
  uint32_t threshold;          // dropped iff word < threshold (p * 2^32)
  float keep_scale;            // 1 / (1 - p)
  bool active;                 // p > 0 in training

  // (seed, offset) of this launch; the forward's block 0 records them.
  __device__ __forceinline__ void begin(uint64_t& seed,
                                        uint64_t& offset) const {
    if (!active) {
      seed = offset = 0;
      return;
    }
    if (saved != nullptr) {
      seed = (uint64_t)saved[0];
      offset = (uint64_t)saved[1];
      return;
    }
    const auto so = at::cuda::philox::unpack(philox);
    seed = std::get<0>(so);
    offset = std::get<1>(so);
    if (save != nullptr && blockIdx.x == 0 && threadIdx.x == 0)
      save[0] = (int64_t)seed, save[1] = (int64_t)offset;
  }
  // The factor of alpha(e, h): 0 (dropped), 1 / (1 - p) (kept), 1 (off).
  __device__ __forceinline__ float factor(uint64_t seed, uint64_t offset,
                                          int64_t e, int h) const {
    if (!active) return 1.f;
    return philox_word(seed, offset, (uint64_t)e, h) < threshold ? 0.f
                                                                 : keep_scale;
  }
};

// The mask in kernels instantiated with or without the training features
// (FEAT = false compiles the plain path without them: no cost at all).
template <bool FEAT>
__device__ __forceinline__ void drop_begin(const DropoutMask& d,
                                           uint64_t& seed, uint64_t& offset) {
  seed = offset = 0;
  if constexpr (FEAT) d.begin(seed, offset);
}
template <bool FEAT>
__device__ __forceinline__ float drop_factor(const DropoutMask& d,
                                             uint64_t seed, uint64_t offset,
                                             int64_t e, int h) {
  if constexpr (FEAT) return d.factor(seed, offset, e, h);
  return 1.f;
}

// Host: the mask of drop probability p (inactive for p = 0); the backward
// passes the forward's saved [seed, offset].
inline DropoutMask dropout_mask(double p, const int64_t* saved = nullptr) {
  DropoutMask m{};
  m.active = p > 0.0;
  if (!m.active) return m;
  TORCH_CHECK(p < 1.0, "fused_attention: 'dropout' must be in [0, 1) (got ",
              p, ")");
  m.threshold = (uint32_t)std::min(p * 4294967296.0, 4294967295.0);
  m.keep_scale = (float)(1.0 / (1.0 - p));
  m.saved = saved;
  return m;
}

// ------------------------------------------------------------ row tiles
// (shared by the forward and backward row kernels)
// fp32 values from shared memory, 16 bytes at a time when VW % 4 == 0.
template <int VW>
__device__ __forceinline__ void load_smem(const float* p, float (&x)[VW]) {
  if constexpr (VW % 4 == 0) {
#pragma unroll
    for (int i = 0; i < VW; i += 4) {
      const float4 t = *reinterpret_cast<const float4*>(p + i);
      x[i] = t.x, x[i + 1] = t.y, x[i + 2] = t.z, x[i + 3] = t.w;
    }
  } else {
#pragma unroll
    for (int i = 0; i < VW; ++i) x[i] = p[i];
  }
}

// Partial score of one (edge, head) item over this lane's share of D.
// e_row (nullptr: none) is the edge's key term, added to the key row.
template <int KIND, typename T, int VW>
__device__ __forceinline__ float score_part(const float* q_row,
                                            const T* k_row, const float* att,
                                            int D, int d0, int dstep,
                                            float slope,
                                            const T* e_row = nullptr) {
  float acc = 0.f;
  for (int d = d0; d < D; d += dstep) {
    float kx[VW], qx[VW];
    load_vec<T, VW>(k_row + d, kx);
    if (e_row != nullptr) add_vec<T, VW>(e_row + d, kx);
    load_smem<VW>(q_row + d, qx);
    if constexpr (KIND == kDot) {
#pragma unroll
      for (int i = 0; i < VW; ++i) acc = fmaf(qx[i], kx[i], acc);
    } else {
      float ax[VW];
      load_smem<VW>(att + d, ax);
#pragma unroll
      for (int i = 0; i < VW; ++i)
        acc = fmaf(ax[i], leaky_relu(qx[i] + kx[i], slope), acc);
    }
  }
  return acc;
}

// Partial <nb, own + e> of one (edge, head) item over this lane's share of
// D: the owner's row `own` in shared memory (fp32), the neighbour's `nb`
// and the edge's term `e` (nullptr: none) added to the owner's side. (The
// backward's cols pass: <q_i, k_j + ek_ij> and <dO_i, v_j + ev_ij> with j
// the owner.)
template <typename T, int VW>
__device__ __forceinline__ float dot_part(const float* own, const T* nb,
                                          const T* e_row, int D, int d0,
                                          int dstep) {
  float acc = 0.f;
  for (int d = d0; d < D; d += dstep) {
    float ox[VW], nx[VW];
    load_smem<VW>(own + d, ox);
    if (e_row != nullptr) add_vec<T, VW>(e_row + d, ox);
    load_vec<T, VW>(nb + d, nx);
#pragma unroll
    for (int i = 0; i < VW; ++i) acc = fmaf(nx[i], ox[i], acc);
  }
  return acc;
}

// Last r in [0, n) with ptr[r] <= x (the owner of segment / edge x).
__device__ __forceinline__ int64_t find_row(const int64_t* __restrict__ ptr,
                                            int64_t n, int64_t x) {
  // last r in [0, n) with ptr[r] <= x
  int64_t lo = 0, hi = n - 1;
  while (lo < hi) {
    const int64_t mid = (lo + hi + 1) >> 1;
    if (ptr[mid] <= x) lo = mid; else hi = mid - 1;
  }
  return lo;
}

// Span of the neighbour ids idx[e0, e1) of a block's window, for staging:
// returns hi - lo + 1 (0 when there are no edges) and sets lo. s_lo: two
// ints of shared memory set to {INT32_MAX, -1} by one thread beforehand.
// Every thread of the block calls it (two barriers inside).
template <typename I>
__device__ __forceinline__ int block_index_span(const I* __restrict__ idx,
                                                int64_t e0, int64_t e1,
                                                int* s_lo, int& lo) {
  __syncthreads();  // s_lo initialised
  int mn = INT32_MAX, mx = -1;
  for (int64_t e = e0 + threadIdx.x; e < e1; e += blockDim.x) {
    const int j = (int)idx[e];
    mn = j < mn ? j : mn;
    mx = j > mx ? j : mx;
  }
#pragma unroll
  for (int o = 16; o > 0; o >>= 1) {
    mn = min(mn, __shfl_xor_sync(kFullMask, mn, o));
    mx = max(mx, __shfl_xor_sync(kFullMask, mx, o));
  }
  if (threadIdx.x % kWarpSize == 0) {
    atomicMin(&s_lo[0], mn);
    atomicMax(&s_lo[1], mx);
  }
  __syncthreads();
  lo = s_lo[0];
  return s_lo[1] >= 0 ? s_lo[1] - s_lo[0] + 1 : 0;
}

// Start of a feature pass: zero this lane's accumulators and find the head
// of each of its slots (slot c0 + ls + s * group holds VW features).
template <int VW, int SLOTS>
__device__ __forceinline__ void begin_pass(float (&acc)[SLOTS][VW],
                                           int (&hs)[SLOTS], int c0, int ls,
                                           int group, int H, int F) {
#pragma unroll
  for (int s = 0; s < SLOTS; ++s) {
    hs[s] = min(H - 1, (c0 + ls + s * group) * VW / F);
#pragma unroll
    for (int i = 0; i < VW; ++i) acc[s][i] = 0.f;
  }
}

template <int VW, int SLOTS>
__device__ __forceinline__ void reduce_edge_groups(float (&acc)[SLOTS][VW],
                                                   int group) {
  for (int o = 16; o >= group; o >>= 1) {
#pragma unroll
    for (int s = 0; s < SLOTS; ++s)
#pragma unroll
      for (int i = 0; i < VW; ++i)
        acc[s][i] += __shfl_xor_sync(kFullMask, acc[s][i], o);
  }
}

__host__ __device__ inline size_t align16(size_t b) {
  return (b + 15) & ~(size_t)15;
}

// Copy n elements global -> shared (16 bytes per access when VW > 1: both
// ends 16-byte aligned and n a multiple of VW then), 4 loads in flight per
// thread.
template <typename T, int VW>
__device__ __forceinline__ void copy_to_smem(T* dst, const T* __restrict__ src,
                                             int n) {
  using W = typename std::conditional<(VW > 1), uint4, T>::type;
  const W* s = reinterpret_cast<const W*>(src);
  W* d = reinterpret_cast<W*>(dst);
  const int nw = VW > 1 ? n / VW : n, step = blockDim.x;
  for (int i = threadIdx.x; i < nw; i += 4 * step) {
    W t[4];
#pragma unroll
    for (int u = 0; u < 4; ++u)
      if (i + u * step < nw) t[u] = s[i + u * step];
#pragma unroll
    for (int u = 0; u < 4; ++u)
      if (i + u * step < nw) d[i + u * step] = t[u];
  }
}

// Sum over aligned groups of G lanes, G in {1, 2, 4, 8}.
__device__ __forceinline__ float group8_sum(float v, int G) {
  if (G >= 8) v += __shfl_xor_sync(kFullMask, v, 4);
  if (G >= 4) v += __shfl_xor_sync(kFullMask, v, 2);
  if (G >= 2) v += __shfl_xor_sync(kFullMask, v, 1);
  return v;
}

}  // namespace pyg_dfgnn

// ------------------------------------------------------------ dispatch
#define PYG_DFGNN_DISPATCH_FLOAT(dtype, NAME, ...)                        \
  [&] {                                                                   \
    switch (dtype) {                                                      \
      case at::kFloat: {                                                  \
        using scalar_t = float;                                           \
        return __VA_ARGS__();                                             \
      }                                                                   \
      case at::kHalf: {                                                   \
        using scalar_t = at::Half;                                        \
        return __VA_ARGS__();                                             \
      }                                                                   \
      case at::kBFloat16: {                                               \
        using scalar_t = at::BFloat16;                                    \
        return __VA_ARGS__();                                             \
      }                                                                   \
      default:                                                            \
        TORCH_CHECK(false, NAME, ": unsupported dtype ", dtype,           \
                    " (expected float32, float16 or bfloat16)");          \
    }                                                                     \
  }()

#define PYG_DFGNN_DISPATCH_INDEX(dtype, NAME, ...)                        \
  [&] {                                                                   \
    switch (dtype) {                                                      \
      case at::kInt: {                                                    \
        using index_t = int32_t;                                          \
        return __VA_ARGS__();                                             \
      }                                                                   \
      case at::kLong: {                                                   \
        using index_t = int64_t;                                          \
        return __VA_ARGS__();                                             \
      }                                                                   \
      default:                                                            \
        TORCH_CHECK(false, NAME, ": index dtype must be int32 or int64 "  \
                    "(got ", dtype, ")");                                 \
    }                                                                     \
  }()

#define PYG_DFGNN_DISPATCH_KIND(kind, ...)                                \
  [&] {                                                                   \
    switch (kind) {                                                       \
      case 0: {                                                           \
        constexpr int KIND = 0;                                           \
        return __VA_ARGS__();                                             \
      }                                                                   \
      case 1: {                                                           \
        constexpr int KIND = 1;                                           \
        return __VA_ARGS__();                                             \
      }                                                                   \
      case 2: {                                                           \
        constexpr int KIND = 2;                                           \
        return __VA_ARGS__();                                             \
      }                                                                   \
      default:                                                            \
        TORCH_CHECK(false, "unknown score kind ", kind,                   \
                    " (0 = dot, 1 = add, 2 = gatv2)");                    \
    }                                                                     \
  }()

#define PYG_DFGNN_DISPATCH_BOOL(flag, NAME, ...) \
  [&] {                                          \
    if (flag) {                                  \
      constexpr bool NAME = true;                \
      return __VA_ARGS__();                      \
    } else {                                     \
      constexpr bool NAME = false;               \
      return __VA_ARGS__();                      \
    }                                            \
  }()

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
//   kFullMask, kWarpSize
//   PYG_DFGNN_DISPATCH_FLOAT(dtype, NAME, ...)  -> scalar_t (float/half/bf16)
//   PYG_DFGNN_DISPATCH_INDEX(dtype, NAME, ...)  -> index_t (int32_t/int64_t)
//   PYG_DFGNN_DISPATCH_KIND(kind, ...)          -> constexpr int KIND
//   PYG_DFGNN_DISPATCH_BOOL(flag, NAME, ...)    -> constexpr bool NAME
#pragma once

#include <ATen/ATen.h>
#include <ATen/Dispatch.h>
#include <c10/cuda/CUDAException.h>
#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_runtime.h>

#include <cstdint>

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

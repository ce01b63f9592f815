// Numbers and warps, shared by every kernel of the package: fp32 conversions
// of the storage types (arithmetic is always fp32), warp / lane-group
// reductions, small host + device integer helpers.
#pragma once

#include <ATen/ATen.h>
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

// Sum over aligned groups of G lanes, G in {1, 2, 4, 8}.
__device__ __forceinline__ float group8_sum(float v, int G) {
  if (G >= 8) v += __shfl_xor_sync(kFullMask, v, 4);
  if (G >= 4) v += __shfl_xor_sync(kFullMask, v, 2);
  if (G >= 2) v += __shfl_xor_sync(kFullMask, v, 1);
  return v;
}

__host__ __device__ inline size_t align16(size_t b) {
  return (b + 15) & ~(size_t)15;
}

}  // namespace pyg_dfgnn

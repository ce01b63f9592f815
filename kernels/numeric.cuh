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

// The sums a lane keeps after transpose_sum<N> over L lanes.
template <int N>
__host__ __device__ __forceinline__ int transpose_count(int L) {
  return L < N ? N / L : 1;
}

// N values per lane (partial sums of N items, N a power of two), summed
// over aligned groups of L lanes (L a power of two) by a transposing
// butterfly: each step keeps half of the values and adds the partner's
// other half (N / 2 + N / 4 + ... shuffles while L allows), then plain xor
// levels below L / N. Returns transpose_count<N>(L): v[0 .. k) hold the
// sums of items transpose_item<N>(lane, L) + i; for L > N the L / N lanes
// of a group that share an item hold the same sum.
template <int N>
__device__ __forceinline__ int transpose_sum(float (&v)[N], int L) {
  const int lane = threadIdx.x % kWarpSize;
#pragma unroll
  for (int step = 0; (N >> step) > 1; ++step) {
    const int half = (N / 2) >> step, o = L >> (step + 1);
    if (o >= 1) {
      const bool hi = (lane & o) != 0;
#pragma unroll
      for (int i = 0; i < half; ++i) {
        const float send = hi ? v[i] : v[i + half];
        const float keep = hi ? v[i + half] : v[i];
        v[i] = keep + __shfl_xor_sync(kFullMask, send, o);
      }
    }
  }
  for (int o = L / (2 * N); o >= 1; o /= 2)
    v[0] += __shfl_xor_sync(kFullMask, v[0], o);
  return transpose_count<N>(L);
}
template <int N>
__device__ __forceinline__ int transpose_item(int lane, int L) {
  static_assert(N == 2 || N == 4 || N == 8, "transpose_item: N 2, 4 or 8");
  return ((lane & (L / 2)) ? N / 2 : 0) +
         ((N >= 4 && (lane & (L / 4))) ? N / 4 : 0) +
         ((N >= 8 && (lane & (L / 8))) ? N / 8 : 0);
}
// Whether this lane writes its sums (one lane per item).
template <int N>
__device__ __forceinline__ bool transpose_writer(int lane, int L) {
  return L < N || (lane & (L / N - 1)) == 0;
}

__host__ __device__ inline size_t align16(size_t b) {
  return (b + 15) & ~(size_t)15;
}

}  // namespace pyg_dfgnn

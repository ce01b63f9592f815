// Vector tiles: N consecutive elements of a row moved as one 4-, 8- or
// 16-byte access into fp32 registers (load_vec / store_vec / add_vec),
// fp32 rows read from shared memory 16 bytes at a time (load_smem), and a
// block's copy of rows into shared memory (copy_to_smem). Vec<T>::kWidth is
// the number of T in 16 bytes: the vector width of the VEC instantiations.
#pragma once

#include <type_traits>

#include "numeric.cuh"

namespace pyg_dfgnn {

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

// N elements of T as one raw access (kernels that keep loads in flight
// before they convert: load_raw now, unpack_vec later).
// NC: through the read-only (non-coherent) path, for data no thread of the
// kernel writes. The compiler takes that path itself where __restrict__
// proves it, but not in a loop that also stores (the persistent short
// kernels: plain LDG there, +20-80 % on their cols pass).
template <typename T, int N>
using RawVec = typename RawWords<N * sizeof(T)>::type;
template <typename T, int N, bool NC = false>
__device__ __forceinline__ RawVec<T, N> load_raw(const T* __restrict__ ptr) {
  const RawVec<T, N>* p = reinterpret_cast<const RawVec<T, N>*>(ptr);
  if constexpr (NC) return __ldg(p);
  return *p;
}
template <typename T, int N>
__device__ __forceinline__ void unpack_vec(const RawVec<T, N>& w,
                                           float (&out)[N]) {
  union {
    RawVec<T, N> w;
    T t[N];
  } u;
  u.w = w;
#pragma unroll
  for (int i = 0; i < N; ++i) out[i] = to_float(u.t[i]);
}

template <typename T, int N, bool NC = false>
__device__ __forceinline__ void load_vec(const T* __restrict__ ptr,
                                         float (&out)[N]) {
  constexpr int kBytes = N * sizeof(T);
  if constexpr (kBytes == 2 || kBytes == 4 || kBytes == 8 || kBytes == 16) {
    unpack_vec<T, N>(load_raw<T, N, NC>(ptr), out);
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

// NV vectors of VW elements, the i-th at ptr + i * stride (a short-owner
// lane's slices, short_rows.cuh); NV = 1 is load_vec / store_vec.
template <typename T, int VW, int NV, bool NC = false>
__device__ __forceinline__ void load_slices(const T* __restrict__ ptr,
                                            int stride,
                                            float (&out)[VW * NV]) {
#pragma unroll
  for (int i = 0; i < NV; ++i) {
    float x[VW];
    load_vec<T, VW, NC>(ptr + i * stride, x);
#pragma unroll
    for (int k = 0; k < VW; ++k) out[i * VW + k] = x[k];
  }
}
template <typename T, int VW, int NV>
__device__ __forceinline__ void store_slices(T* __restrict__ ptr, int stride,
                                             const float (&in)[VW * NV]) {
#pragma unroll
  for (int i = 0; i < NV; ++i) {
    float x[VW];
#pragma unroll
    for (int k = 0; k < VW; ++k) x[k] = in[i * VW + k];
    store_vec<T, VW>(ptr + i * stride, x);
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

// fp32 values to shared memory, 16 bytes at a time when VW % 4 == 0.
template <int VW>
__device__ __forceinline__ void store_smem(float* p, const float (&x)[VW]) {
  if constexpr (VW % 4 == 0) {
#pragma unroll
    for (int i = 0; i < VW; i += 4)
      *reinterpret_cast<float4*>(p + i) =
          make_float4(x[i], x[i + 1], x[i + 2], x[i + 3]);
  } else {
#pragma unroll
    for (int i = 0; i < VW; ++i) p[i] = x[i];
  }
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

}  // namespace pyg_dfgnn

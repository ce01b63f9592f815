// Walking rows in the row kernels (forward SMMF, backward passes): the
// owner of an edge or segment (find_row), the span of a window's neighbour
// ids for staging (block_index_span), and a feature pass's accumulators
// over lanes (begin_pass, reduce_edge_groups).
#pragma once

#include <cstdint>

#include "numeric.cuh"

namespace pyg_dfgnn {

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

}  // namespace pyg_dfgnn

// Attention weights of the forward (either strategy), from the raw scores
// once lse is final.
#pragma once

#include "fwd_common.cuh"
#include "row_tiles.cuh"

namespace pyg_dfgnn {
namespace fwd {

// alpha(e, h) = exp(s_eh - lse_row) (times the dropout factor when the
// weights are returned after dropout, GAT's convention), written to row
// perm[e] (the user's edge order; identity without perm). A thread per edge,
// its heads VH at a time (VH = 4 where H % 4 == 0: the scores, lse and alpha
// rows are this op's allocations, so 4-aligned rows are vector-aligned):
// one store per vector instead of a warp of 4-byte stores per head.
template <typename T, typename I, int VH>
__global__ void __launch_bounds__(kThreads)
    alpha_kernel(const int64_t* __restrict__ rowptr, int64_t n_dst,
                 const float* __restrict__ scores,
                 const float* __restrict__ lse, const I* __restrict__ perm,
                 DropoutMask drop, T* __restrict__ alpha, int64_t n_edges,
                 int H) {
  const int64_t e = (int64_t)blockIdx.x * blockDim.x + threadIdx.x;
  if (e >= n_edges) return;
  uint64_t seed, offset;
  drop.begin(seed, offset);
  const int64_t r = find_row(rowptr, n_dst, e);
  const int64_t dst = perm != nullptr ? (int64_t)perm[e] : e;
  for (int h = 0; h < H; h += VH) {
    float s[VH], l[VH], a[VH];
    load_vec<float, VH>(scores + e * H + h, s);
    load_vec<float, VH>(lse + r * H + h, l);
#pragma unroll
    for (int i = 0; i < VH; ++i)
      a[i] = expf(s[i] - l[i]) * drop.factor(seed, offset, e, h + i);
    store_vec<T, VH>(alpha + dst * H + h, a);
  }
}

}  // namespace fwd
}  // namespace pyg_dfgnn

// Attention weights of the forward (either strategy), from the raw scores
// once lse is final.
#pragma once

#include "fwd_common.cuh"
#include "row_tiles.cuh"

namespace pyg_dfgnn {
namespace fwd {

// alpha(e, h) = exp(s_eh - lse_row) (times the dropout factor when the
// weights are returned after dropout, GAT's convention), written to row
// perm[e] (the user's edge order; identity without perm). A thread per edge.
template <typename T, typename I>
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
  for (int h = 0; h < H; ++h)
    alpha[dst * H + h] = from_float<T>(
        expf(scores[e * H + h] - lse[r * H + h]) *
        drop.factor(seed, offset, e, h));
}

}  // namespace fwd
}  // namespace pyg_dfgnn

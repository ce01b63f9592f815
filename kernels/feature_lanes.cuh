// The SDDMM's four-feature lanes, one layout shared by the SMMF forward
// (fwd_smmf_kernel.cuh) and the backward's rows pass (bwd_rows_pass.cuh):
// lanes over the key / value row, kLaneFeatures features each, where the
// row is exactly a warp's (H * D = 128: 1 x 128, 2 x 64, 4 x 32, 8 x 16)
// and a head has L >= 4 lanes (a power of two). The query, grad_out and att
// stay in registers instead of a shared-memory re-read per (edge, head).
#pragma once

#include <cstdint>

#include "numeric.cuh"
#include "ops.h"

namespace pyg_dfgnn {

constexpr int kLaneFeatures = 4;

// Whether a row of `row_width` elements with heads of `head_width` fits
// the lanes.
__host__ __device__ constexpr bool feature_lanes_fit(int row_width,
                                                     int head_width) {
  return row_width == kWarpSize * kLaneFeatures &&
         head_width / kLaneFeatures >= 4 &&
         ((head_width / kLaneFeatures) & (head_width / kLaneFeatures - 1)) ==
             0;
}

// The backward's rows pass: the key / value rows of one width ('dot': the
// score's D equals F; 'add' has no key row, its heads are F wide). One test
// for the host's pick (bwd_launch_template.cuh) and the pass itself.
__host__ __device__ constexpr bool rows_lanes_fit(int kind, int H, int D,
                                                  int F) {
  return feature_lanes_fit(H * F, kind == kAdd ? F : D) &&
         (kind == kAdd || D == F);
}

// Mean in-degree from which the LANES kernels pay where the lanes are not
// in every kernel (half precision; the backward's 'add'): their registers
// cost sparse graphs. Measured: the SMMF forward of dense batches -20 to
// -26 % and graphs of mean degree 4-7 slower (session 26); the rows pass
// gatv2 bf16 -14 %, 'add' fp32 -8 % on pattern- / cluster-like 1 x 128
// (session 27).
constexpr int kLanesMinDegree = 16;

// Host: whether a graph is dense enough for the LANES kernels.
inline bool lanes_dense_graph(int64_t n_edges, int64_t n_dst) {
  return n_edges >= kLanesMinDegree * n_dst;
}

}  // namespace pyg_dfgnn

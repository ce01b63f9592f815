// Forward kernels of the fused attention op: SDDMM -> edge softmax -> SpMM.
//
// One templated family: scalar_t (fp32/fp16/bf16, fp32 arithmetic) x index_t
// (int32/int64 col) x score KIND (dot/add/gatv2) x VEC (16-byte vectors or a
// scalar path for feature sizes that are not multiples of the vector width).
//
// SMMF (one kernel, node-parallel): a block owns a window of rows.
//   0. graph-aligned windows (DFGraph.row_windows: one small graph of a
//      batch, or several) stage their source rows of K and V in smem once;
//   1. rows go to warps dynamically; a warp walks its row in chunks of 32
//      edges: balanced SDDMM over the chunk's (edge, head) items (a group of
//      lanes per item), scores -> smem;
//   2. online (redundancy-free) softmax: lanes over the chunk's edges, exp
//      values overwrite the scores in smem, running max / sum per head;
//      lse = max + log(sum + 1e-16) -> global at the end of the row;
//   3. vectorized SpMM: lanes over 16-byte feature vectors (split over edges
//      too when H*F is short), 4 neighbours unrolled, earlier chunks'
//      partial sums rescaled by the new max.
// PMF (rows too long for SMMF's shared memory; any degree):
//   a. edge-parallel SDDMM -> scores [E, H] fp32 in global memory ('dot',
//      'gatv2' and attention weights; 'add' otherwise forms its scalar
//      scores in b., so that no [E, H] buffer exists); where a key row is
//      <= 32 16-byte vectors, a warp walks a run of edges with the row's
//      vectors over its lanes (pmf_sddmm_lanes_kernel), else a lane group
//      per (edge, head) item;
//   b. softmax + SpMM over segments of <= kSegEdges edges of one row, a
//      segment per warp at a time (persistent warps, round-robin); rows of
//      one segment finish in place, longer rows write partial (max, sum,
//      unnormalised acc) per segment;
//   c. a combine kernel merges the segments of long rows (flash-decoding
//      style), so one node connected to all others still spreads over the GPU.
// Short rows (many rows of a few edges, plain path; run_smmf hands them
// over): a warp per row, no shared memory (fwd_rows_kernel.cuh).
// Training features, in both strategies (runtime switches, warp-uniform):
//   edge terms (EdgeTerms, CSR order): es / ek read in the SDDMM, ev summed
//   in the SpMM as a second neighbour row; attention dropout: the exp values
//   are multiplied by the Philox mask after the row sum took them (lse stays
//   the undropped one); attention weights: the raw scores go to an [E, H]
//   fp32 buffer (PMF has it anyway) and alpha_kernel writes alpha in the
//   user's edge order once lse is known. Off, each costs a branch.
//
// Files of the forward family (kernel traits, kernels, launch templates):
//   fwd_common.cuh            launch constants, Width (vector traits),
//                             FwdArgs, the vectorized SpMM accumulation
//   fwd_smmf_kernel.cuh       SMMF: layout, per-warp row loop, kernel
//   fwd_pmf_kernel.cuh        PMF: SDDMM, softmax + SpMM, combine kernels
//   fwd_rows_kernel.cuh       short rows: a warp per row
//   fwd_alpha_kernel.cuh      attention weights from the raw scores
//   fwd_launch_template.cuh   host: Launch, run_smmf<T> (run_rows<T>) /
//                             run_pmf<T>
//   fused_attention_fwd_{smmf,pmf}_{f32,f16,bf16}.cu  instantiations
//   fused_attention_fwd.cu    host entry: checks, strategy choice
// shared with the backward: numeric, vector_io, score_kinds,
// training_features, row_tiles, dispatch, short_rows (.cuh).
// A new strategy is a kernel file of this family, a run_<strategy><T> in the
// launch template, its instantiation units and one entry in the host
// entry's choice.
#pragma once

#include <cmath>
#include <cstdint>

#include "feature_lanes.cuh"
#include "numeric.cuh"
#include "ops.h"
#include "score_kinds.cuh"
#include "training_features.cuh"
#include "vector_io.cuh"

namespace pyg_dfgnn {
namespace fwd {

constexpr int kWarps = 8;  // warps per block, both strategies
constexpr int kThreads = kWarps * kWarpSize;
constexpr int kUnroll = 4;       // independent items / neighbours in flight
constexpr int kSegEdges = 256;   // PMF: edges per segment (one warp)
constexpr int kTileEdges = 32;   // PMF: edges per exp tile in smem
constexpr int kRowChunk = 32;    // SMMF: edges per online-softmax chunk
constexpr int kSmmfMaxThreads = 1024;  // -> <= 64 registers per thread
constexpr int kSmmfStagedWarps = 32;  // SMMF block with staging (a window)
constexpr int kSmmfPlainWarps = 8;    // SMMF block without staging
constexpr int kSmmfPlainRows = 16;    // rows of such a block
constexpr int kSmmfMaxHeads = 128;    // SMMF's item -> (edge, head) split

template <typename T, bool VEC>
struct Width {
  static constexpr int kVW = VEC ? Vec<T>::kWidth : 1;
  // Feature vectors a lane accumulates per pass (16 elements per lane).
  static constexpr int kSlots = VEC ? 16 / kVW : 4;
};

template <typename T, typename I>
struct FwdArgs {
  const int64_t* __restrict__ rowptr;
  const I* __restrict__ col;
  const T* __restrict__ q;
  const T* __restrict__ k;
  const T* __restrict__ v;
  const T* __restrict__ att;
  T* __restrict__ out;
  float* __restrict__ lse;
  EdgeTerms<T> et;
  DropoutMask drop;
  float* __restrict__ scores;  // SMMF: raw scores [E, H] (nullptr: not kept)
  int64_t n_dst;
  int H, D, F;        // D: score feature size (1 for 'add')
  int qk_group;       // lanes per (edge, head) dot product (power of two)
  int v_group;        // lanes per row in the SpMM (power of two <= 32)
  float scale, slope;
};

// SpMM of one row: acc += sum_{e in [lo, hi)} p(e, head) * v_row(e) for this
// lane's feature vectors (slot c0 + ls + s * group). `row_of(e)` gives the
// value row of edge e (global or staged in shared memory). Lanes of one edge
// group (lane / group) take every `epar`-th edge; reduce_edge_groups sums them.
// UNROLL neighbour rows are in flight per lane.
template <typename T, int VW, int SLOTS, int UNROLL = kUnroll,
          typename RowOf, typename GetP>
__device__ __forceinline__ void spmm_accumulate(
    float (&acc)[SLOTS][VW], int slots, int c0, int group, int ls, int sub,
    int lo, int hi, const int (&hs)[SLOTS], RowOf row_of, GetP get_p) {
  const int epar = kWarpSize / group;
  int e = lo + sub;
  for (; e + (UNROLL - 1) * epar < hi; e += UNROLL * epar) {
    const T* rows[UNROLL];
#pragma unroll
    for (int u = 0; u < UNROLL; ++u) rows[u] = row_of(e + u * epar);
#pragma unroll
    for (int s = 0; s < SLOTS; ++s) {
      const int sl = c0 + ls + s * group;
      if (sl < slots) {
        float x[UNROLL][VW];
#pragma unroll
        for (int u = 0; u < UNROLL; ++u)
          load_vec<T, VW>(rows[u] + (int64_t)sl * VW, x[u]);
#pragma unroll
        for (int u = 0; u < UNROLL; ++u) {
          const float p = get_p(e + u * epar, hs[s]);
#pragma unroll
          for (int i = 0; i < VW; ++i) acc[s][i] = fmaf(p, x[u][i], acc[s][i]);
        }
      }
    }
  }
  for (; e < hi; e += epar) {
    const T* row = row_of(e);
#pragma unroll
    for (int s = 0; s < SLOTS; ++s) {
      const int sl = c0 + ls + s * group;
      if (sl < slots) {
        float x[VW];
        load_vec<T, VW>(row + (int64_t)sl * VW, x);
        const float p = get_p(e, hs[s]);
#pragma unroll
        for (int i = 0; i < VW; ++i) acc[s][i] = fmaf(p, x[i], acc[s][i]);
      }
    }
  }
}

}  // namespace fwd
}  // namespace pyg_dfgnn

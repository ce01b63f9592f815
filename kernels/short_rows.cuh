// Short owners (molecule-sized batches, graphs of low degree): what the
// warp-per-owner kernels share -- the forward's short-row kernel
// (fwd_rows_kernel.cuh) and the backward's short passes
// (bwd_short_kernel.cuh). A warp takes one owner (a CSR row or a CSC
// column), or 32 / lanes owners where fewer lanes hold one; each lane holds
// one VW-vector of the owner's H * F features; a head's lanes are a power
// of two, so a head's dot products are one group_sum. The block kernels
// spend their time in chunk machinery (row counters, staged rows, barriers)
// around owners of a few edges; these have none of it.
#pragma once

#include <cstdint>
#include <algorithm>
#include <cstdlib>
#include <type_traits>

#include <ATen/cuda/CUDAContext.h>

#include "feature_lanes.cuh"
#include "numeric.cuh"
#include "occupancy.cuh"
#include "ops.h"

namespace pyg_dfgnn {

// Where the host takes them: owners whose longest a warp walks, at any
// size and mean degree. Session 28 (H100, scripts/kernel_times.py with
// PYG_DFGNN_SHORT_ROWS=1 / 0) had held them to a mean degree below 16
// (kLanesMinDegree): every pass faster on cora-, pubmed-, zinc-, mnist- and
// arxiv-like graphs and uniform / batch graphs of mean 8-13, but 'add''s
// fp32 rows pass slower from 16. Since session 38's slices (a lane holds
// NV vectors) they win above it too (session 39, scripts/env_ab.py, GPU
// time of forward + backward, auto -> short): batches of 117-node graphs
// of mean degree 18.5-31 and cluster- / pattern-like (31.8 / 41.6) 1 x 128
// fp32 'dot' -14 to -26 % (pattern-like 1.30 -> 1.12 ms behind the TC
// forward), 4 x 32 -7 to -23 %, 'add' fp32 / bf16 -23 to -40 %; uniform
// graphs of mean 20 / 28 -20 to -27 %; where the block kernels stayed
// (half-precision 4 x 32 columns, the TC windows) nothing changes.
constexpr int kShortMaxDegree = 64;        // longest owner (a warp walks it)
// Narrow heads (session 15, scripts/short_vs_block.py): with at most 4
// lanes a head (F <= 16 in fp32, 32 in half) the block kernels spend their
// issue slots on per-(edge, head) item work (ncu: ~170 warp instructions
// per edge at 4 x 16), and the short kernels win at any degree and size
// measured -- fwd+bwd pattern-like (5M edges, degree 41) 4x16 / 8x16
// 1.5-1.8x, 32 PATTERN graphs 1.05-2.05x, mnist- / zinc-like 1.6-2.0x --
// up to a longest owner of kShortNarrowMaxDegree.
constexpr int kShortNarrowHeadLanes = 4;
constexpr int kShortNarrowMaxDegree = 256;

// PYG_DFGNN_SHORT_ROWS (read per call): '0' keeps the block kernels, '1'
// takes the short ones wherever the shapes allow (benchmarks compare the
// two, tests reach them on small graphs); unset: the measured rule.
inline char short_rows_mode() {
  const char* env = std::getenv("PYG_DFGNN_SHORT_ROWS");
  return env != nullptr && *env != '\0' ? env[0] : 'a';
}

// The shapes they take: no edge key / value (`edge_kv`), 'dot' with D = F
// or 'add', vector rows, a head's lanes F / vw a power of two, one vector
// per lane covering H * F.
inline bool short_shapes(int64_t kind, bool vec, int64_t H, int64_t D,
                         int64_t F, int vw, bool edge_kv) {
  if (edge_kv || !vec || (kind != kDot && kind != kAdd) || F % vw != 0 ||
      H * F > (int64_t)kWarpSize * vw || (kind == kDot && D != F))
    return false;
  const int64_t lanes = F / vw;
  return (lanes & (lanes - 1)) == 0;
}

// Lanes of one owner: the fewest (a power of two) that hold its H * F
// features in vectors of VW.
__host__ __device__ inline int short_lanes(int64_t hf, int vw) {
  int l = 1;
  while ((int64_t)l * vw < hf) l <<= 1;
  return l;
}

// The rule on the owners' side (CSR rows for the forward and the rows
// pass, CSC columns for the cols pass; `head_lanes` of one head): a
// longest owner of at most kShortMaxDegree edges, kShortNarrowMaxDegree for
// narrow heads; unknown (-1): no.
inline bool short_owners(char mode, int64_t max_degree, int head_lanes) {
  if (mode == '0') return false;
  if (mode == '1') return true;
  if (max_degree < 0) return false;
  return max_degree <= (head_lanes <= kShortNarrowHeadLanes
                            ? kShortNarrowMaxDegree
                            : kShortMaxDegree);
}

// A lane's slices: NV vectors of VW elements each. With NV > 1 a lane
// holds vectors g, g + G, ..., g + (NV - 1) G of its head (G lanes a
// head), so that each access of the warp still reads a head's contiguous
// bytes; fewer lanes an owner and more owners a warp share the per-edge
// scalar work that every lane of an owner repeats (the edge's index, the
// head's butterfly, the online softmax / the softmax gradient): the
// kernels are issue-bound. The sums of a score depend on NV (a lane's
// products first, then the butterfly), so the rows pass forms the forward's
// scores bit for bit only at the forward's NV; elsewhere they differ in
// the last bits, as after a block or tensor-core forward.
enum class ShortPass { kFwd, kRows, kCols };

// Measured per pass (H100, session 38, scripts/env_ab.py: mnist-, zinc-,
// arxiv-, pubmed-like, GPU us, NV = 1 / 2 / 4):
// * 'add' (scalar scores): 4 in every pass -- mnist-like 1 x 128 fp32
//   forward + backward 213 -> 137 us.
// * 'dot' forward: 16 elements a lane (fp32 4, half 2) while a head keeps
//   >= 4 lanes -- mnist-like 1 x 128 fp32 96 -> 77, bf16 72 -> 66; NV = 4
//   at 4 x 32 fp32 (2 lanes a head) and in bf16 (218 registers) lost.
// * 'dot' rows pass: fp32 4 with >= 4 lanes a head, one edge a step
//   (kShortRowsStep; mnist- / zinc-like 1 x 128 115 -> 101 / 91 -> 86 us,
//   arxiv-like 459 -> 468), else 1 (NV = 2 a tie); half 4 with >= 4 lanes
//   a head (255 registers and spills, but mnist-like 1 x 128 bf16 113 ->
//   91 us).
// * 'dot' cols pass: fp32 4 with >= 4 lanes a head (mnist-like 85 -> 78;
//   pattern-like 8 x 16, one lane a head: 627 -> 742), half 1.
// * Small graphs keep kShortSlicesMinWarps warps an owner pass: cora-like
//   bf16 'add' at 339 warps (8 rows a warp) lost 16 -> 19 us.
// PYG_DFGNN_SHORT_SLICES (read per call): '1', '2' or '4' vectors a lane
// in every pass where the head has that many, at any size (benchmarks and
// tests).
constexpr int64_t kShortSlicesMinWarps = 4096;
inline int short_slices(int64_t kind, int64_t n_owner, int64_t H, int64_t F,
                        int vw, ShortPass pass) {
  auto fits = [&](int nv, int min_lanes) {
    return F % ((int64_t)vw * nv) == 0 && F / ((int64_t)vw * nv) >= min_lanes;
  };
  auto widest = [&](int nv, int min_lanes, bool any_size) {
    while (nv > 1 &&
           (!fits(nv, min_lanes) ||
            (!any_size && n_owner * short_lanes(H * F, vw * nv) <
                              kShortSlicesMinWarps * kWarpSize)))
      nv /= 2;
    return nv;
  };
  const char* env = std::getenv("PYG_DFGNN_SHORT_SLICES");
  if (env != nullptr && *env != '\0') {
    const int nv = std::atoi(env);
    return nv == 2 || nv == 4 ? widest(nv, 1, true) : 1;
  }
  const bool half = vw > 4;
  if (kind == kAdd) return widest(4, 1, false);
  switch (pass) {
    case ShortPass::kFwd:
      return widest(16 / vw, 4, false);
    case ShortPass::kRows:
      return widest(4, 4, false) == 4 ? 4 : 1;
    default:
      return half ? 1 : widest(4, 4, false);
  }
}

// Edges a step of the rows pass: two in flight, but one for fp32 'dot' at
// 16 elements a lane, where a step's second K / V rows took it to 161
// registers (124 at one edge): mnist-like 1 x 128 rows pass at NV = 4 123 -> 101 us
// (115 at NV = 1). The forward keeps two: one edge a step made it slower
// (fp32 NV = 4 77 -> 85 us, bf16 NV = 2 66 -> 76; H100, session 38).
template <int KIND, int VW, int EW>
inline constexpr int kShortRowsStep =
    KIND == kDot && VW == 4 && EW >= 16 ? 1 : 2;

// The kernels' instantiations for a short_slices value (1, 2 or 4).
template <typename Fn>
inline void dispatch_slices(int nv, Fn&& fn) {
  if (nv == 4)
    fn(std::integral_constant<int, 4>{});
  else if (nv == 2)
    fn(std::integral_constant<int, 2>{});
  else
    fn(std::integral_constant<int, 1>{});
}

// This lane's owner and features: NV vectors of VW at c0 + i G VW (head h,
// G lanes a head).
struct OwnerLane {
  int64_t owner;
  int c0, h, G;
  bool has;  // the owner exists (its lanes take part in the walk)
  bool on;   // and this lane holds features
};
// `block`: the virtual block (short_groups) whose owner this is.
template <int VW, int NV = 1>
__device__ __forceinline__ OwnerLane owner_lane(int lanes, int64_t n_owner,
                                                int H, int F, int64_t block) {
  const int lane = threadIdx.x % kWarpSize;
  const int warps = blockDim.x / kWarpSize;
  OwnerLane o;
  o.owner = (block * warps + threadIdx.x / kWarpSize) * (kWarpSize / lanes) +
            lane / lanes;
  o.has = o.owner < n_owner;
  // (NV = 1 the same values without the division by G: the general form
  // took the bounded fp32 'dot' cols pass from 8 to 44 spilled bytes)
  if constexpr (NV == 1) {
    o.c0 = (lane % lanes) * VW;
    o.on = o.has && o.c0 < H * F;
    o.h = o.on ? o.c0 / F : 0;
    o.G = F / VW;
  } else {
    const int li = lane % lanes;
    o.G = F / (VW * NV);
    const int hl = li / o.G;
    o.on = o.has && hl < H;
    o.h = o.on ? hl : 0;
    o.c0 = hl * F + (li % o.G) * VW;
  }
  return o;
}

// <x, y> over this lane's VW elements.
template <int VW>
__device__ __forceinline__ float lane_dot(const float (&x)[VW],
                                          const float (&y)[VW]) {
  float s = 0.f;
#pragma unroll
  for (int i = 0; i < VW; ++i) s = fmaf(x[i], y[i], s);
  return s;
}

// Head sums of N partial sums per lane (N = 2 or 4: two edges' scores, and
// in the backward their dp) over aligned groups of G lanes, adding the
// same pairs at each level as N group_sum calls -- bit for bit their
// results -- in log2(G) + 1 (N = 2) or + 4 (N = 4) shuffles and adds
// instead of N log2(G) each: the first log2(N) levels trade values (each
// lane keeps half and sends the other half, as transpose_sum), the rest
// sum one value, and the last shuffles give every lane all N sums. (The
// short kernels are issue-bound: ncu, mnist-like 1 x 128 fp32, 0.79 / 0.71
// warp instructions issued per scheduler cycle in the forward / rows
// pass.) Every lane of the warp calls it.
template <int N>
__device__ __forceinline__ void head_sums(float (&x)[N], int G) {
  static_assert(N == 2 || N == 4, "head_sums: 2 or 4 values");
  constexpr int kLevels = N == 2 ? 1 : 2;
  if (G < N) {  // too few lanes to trade: plain sums
#pragma unroll
    for (int i = 0; i < N; ++i) x[i] = group_sum(x[i], G);
    return;
  }
  const int lane = threadIdx.x % kWarpSize;
  float v[N];
#pragma unroll
  for (int i = 0; i < N; ++i) v[i] = x[i];
  // trade: after level t a lane holds N >> (t + 1) values, those whose
  // index bits are its lane bits G / 2 (, G / 4)
#pragma unroll
  for (int t = 0; t < kLevels; ++t) {
    const int o = G >> (t + 1);
    constexpr int kHalf0 = N / 2;
    const int half = kHalf0 >> t;
    const bool hi = (lane & o) != 0;
#pragma unroll
    for (int i = 0; i < kHalf0; ++i) {
      if (i < half) {
        const float send = hi ? v[i] : v[i + half];
        const float keep = hi ? v[i + half] : v[i];
        v[i] = keep + __shfl_xor_sync(kFullMask, send, o);
      }
    }
  }
  for (int o = G >> (kLevels + 1); o >= 1; o >>= 1)
    v[0] += __shfl_xor_sync(kFullMask, v[0], o);
  // v[0] is sum number `mine` (bits: lane & G / 2, lane & G / 4); gather
  // the others from the lanes that hold them (selects, no indexing by a
  // lane value: the arrays stay in registers)
  const bool hi1 = (lane & (G >> 1)) != 0;
  if constexpr (N == 2) {
    const float other = __shfl_xor_sync(kFullMask, v[0], G >> 1);
    x[0] = hi1 ? other : v[0];
    x[1] = hi1 ? v[0] : other;
  } else {
    const bool hi2 = (lane & (G >> 2)) != 0;
    // got[d]: sum number mine ^ d
    const float got[4] = {
        v[0], __shfl_xor_sync(kFullMask, v[0], G >> 2),
        __shfl_xor_sync(kFullMask, v[0], G >> 1),
        __shfl_xor_sync(kFullMask, v[0], (G >> 1) | (G >> 2))};
#pragma unroll
    for (int i = 0; i < 4; ++i) {
      const bool d1 = ((i >> 1) != 0) != hi1, d0 = ((i & 1) != 0) != hi2;
      x[i] = d1 ? (d0 ? got[3] : got[2]) : (d0 ? got[1] : got[0]);
    }
  }
}

// Owners of one block of `threads` (kWarpSize / lanes per warp).
__host__ __device__ inline int64_t short_blocks(int64_t n_owner, int lanes,
                                                int threads) {
  const int64_t per_block = (int64_t)(threads / kWarpSize) * (kWarpSize / lanes);
  return (n_owner + per_block - 1) / per_block;
}

// Persistent launches (sessions 44-45). A warp's owner group is a chain
// of dependent loads -- the edge range (ptr), then the neighbour ids, then
// the neighbour rows -- and the short kernels were latency-bound on it
// (ncu, mnist-like fp32 forward: long-scoreboard stalls half of all cycles,
// 0.63 eligible warps a scheduler at 16 resident warps an SM). So a walking
// launch (the kernels' WALK) has at most as many blocks as stay resident;
// block b walks the virtual blocks b, b + gridDim.x, ... (a virtual block:
// the owners a block of one group a block takes), and each warp loads the
// next group's range while the current group's rows are in flight, and the
// group after next's range into L2 (the forward and the rows pass also the
// next group's ids): a group costs one round trip, not three. The split is
// static (a block is done when its slowest walk is), so uneven owners lose.
// The code for the walk is a cost of its own where it does not walk: the
// walking pass with one group a block ran +2 to +12 % over the plain one
// (cluster-like 4 x 32 fp32 rows pass, the next ids loaded ahead), hence two
// instantiations, WALK or not.
// Where a walk pays (H100, session 45, scripts/short_pass_ab.py: each pass
// alone, the walk against one group a block, GPU time):
// * half precision everywhere measured -- zinc-like 4 x 32 bf16 forward /
//   rows / cols -16 / -26 / -17 %, arxiv-like 1 x 128 bf16 -8 / -5 / -3 %;
// * fp32 forward with several rows a warp (`lanes` < 32), even degrees
//   (longest <= 1.5 x mean + 2) and >= 4 edges a row on average: mnist-like
//   -6 to -13 %, cluster-like -2 to -8 %; zinc-like 1 x 128 (2 edges a row,
//   at 88 % of DRAM's floor) +1 %, arxiv-like (uneven) +3 %;
// * fp32 rows pass with even degrees and several rows a warp or short rows
//   (mean <= 16): mnist-like -6 / -9 %, cluster-like 1 x 128 -5 %, zinc-like
//   -4 %; a row a warp of 37 edges (cluster-like 4 x 32) +13 %;
// * fp32 columns of scalar keys ('add', session 44: -4 to -9 %) or of at
//   most 8 elements a lane (NV <= 2) with even degrees: cluster- / mnist-
//   like 4 x 32 -12 / -18 %; at 16 (NV = 4) cluster-like 1 x 128 +9 %,
//   zinc- / arxiv-like +5 / +4 %.
inline bool short_walk_pays(bool half, ShortPass pass, int64_t kind,
                            int lanes, int nv, int64_t n_owner,
                            int64_t n_edges, int64_t max_degree) {
  if (half) return true;
  if (pass == ShortPass::kCols && kind == kAdd) return true;
  if (max_degree < 0 || n_owner <= 0) return false;
  const double mean = (double)n_edges / (double)n_owner;
  if ((double)max_degree > 1.5 * mean + 2.0) return false;
  switch (pass) {
    case ShortPass::kFwd:
      return lanes < kWarpSize && mean >= 4.0;
    case ShortPass::kRows:
      return lanes < kWarpSize || mean <= 16.0;
    default:
      return nv <= 2;
  }
}

// PYG_DFGNN_SHORT_PERSIST (read per call): unset, the rule above; '0' no
// walk; 'on' a walk wherever there are more groups than resident blocks;
// k > 0 a walk of at most k blocks (tests: many groups a block on small
// graphs).
inline int64_t short_persist_env() {
  const char* env = std::getenv("PYG_DFGNN_SHORT_PERSIST");
  if (env == nullptr || *env == '\0') return -1;  // unset
  if (env[0] == 'o') return INT64_MAX;             // 'on'
  const int64_t k = std::atoll(env);
  return k > 0 ? k : 0;
}

// Launches `launch(std::bool_constant<WALK>{}, grid)` for `virtual_blocks`
// of one group a block: WALK where the rule (or the knob) says so and the
// walking kernel (`walk_kernel`, its resident blocks) holds fewer blocks
// than there are groups, else one group a block.
template <typename Kernel, typename Launch>
inline void launch_short_walk(Kernel walk_kernel, int64_t virtual_blocks,
                              int threads, bool walk_pays, Launch&& launch) {
  const int64_t env = short_persist_env();
  if (env > 0 && env != INT64_MAX) {
    launch(std::true_type{}, std::min(env, virtual_blocks));
    return;
  }
  if (env == 0 || (env < 0 && !walk_pays)) {
    launch(std::false_type{}, virtual_blocks);
    return;
  }
  const int sms = at::cuda::getCurrentDeviceProperties()->multiProcessorCount;
  const int64_t cap =
      (int64_t)std::max(resident_blocks_per_sm(walk_kernel, threads, 0), 1) *
      sms;
  if (virtual_blocks <= cap)
    launch(std::false_type{}, virtual_blocks);
  else
    launch(std::true_type{}, cap);
}

__device__ __forceinline__ void prefetch_l2(const void* p) {
  asm volatile("prefetch.global.L2 [%0];" ::"l"(p));
}

// An index read through the read-only path (vector_io.cuh's NC note).
template <typename I>
__device__ __forceinline__ I ldg_index(const I* p) {
  if constexpr (sizeof(I) == 8)
    return (I)__ldg(reinterpret_cast<const long long*>(p));
  else
    return (I)__ldg(reinterpret_cast<const int*>(p));
}

// A persistent walk: this lane's owner (its lane constants as owner_lane's,
// for an owner that exists), advanced a group at a time by `step` owners.
struct OwnerWalk {
  OwnerLane lane;  // c0, h, G; `on`: the lane holds features
  int64_t owner, step, n_owner;
  __device__ __forceinline__ bool has(int64_t ahead = 0) const {
    return owner + ahead * step < n_owner;
  }
};
template <int VW, int NV = 1>
__device__ __forceinline__ OwnerWalk owner_walk(int lanes, int64_t n_owner,
                                                int H, int F) {
  OwnerWalk w;
  w.lane = owner_lane<VW, NV>(lanes, INT64_MAX, H, F, blockIdx.x);
  w.owner = w.lane.owner;
  w.step = (int64_t)gridDim.x * (blockDim.x / kWarpSize) * (kWarpSize / lanes);
  w.n_owner = n_owner;
  return w;
}

// The edges [lo, hi) of the walk's owner `ahead` groups on (empty where it
// does not exist).
__device__ __forceinline__ void owner_range(const int64_t* __restrict__ ptr,
                                            const OwnerWalk& w, int ahead,
                                            int64_t& lo, int64_t& hi) {
  const bool has = w.has(ahead);
  const int64_t o = w.owner + ahead * w.step;
  lo = has ? ldg_index(ptr + o) : 0;
  hi = has ? ldg_index(ptr + o + 1) : 0;
}

// Ids of edges e (and e + 1 for N = 2) where they are below hi (0 past it:
// the kernels take j1 = j0 for a missing second edge at use).
template <int N, typename I>
__device__ __forceinline__ void edge_ids(const I* __restrict__ idx, int64_t e,
                                         int64_t hi, I& j0, I& j1) {
  j0 = e < hi ? ldg_index(idx + e) : (I)0;
  j1 = N == 2 && e + 1 < hi ? ldg_index(idx + e + 1) : (I)0;
}

// The ptr entries of the walk's owner `ahead` groups on into L2.
__device__ __forceinline__ void prefetch_range(const int64_t* ptr,
                                               const OwnerWalk& w, int ahead) {
  if (w.has(ahead)) prefetch_l2(ptr + w.owner + ahead * w.step);
}

}  // namespace pyg_dfgnn

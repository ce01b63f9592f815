// GATv2's edge term lin_edge(e_ij) for the fused attention: the edge keys
// K_p = W x_p [E, H * F] in CSR order, projected from the user's edge_attr
// read through the CSR edge -> attribute row map (edge_attr_rows.cu's:
// index[p] >= n_in marks a row's self-loop, whose x is the mean (fill 1) or
// sum (fill 2) of the row's other x, or fill_row (fill 3)), and the
// backward: d x (user order) and d W. It replaces a reordered [E, De] copy
// (two row scatters), the loops' sparse product and three [E, H * F] GEMMs
// (lin_edge forward, d x, d W: each a full pass over the [E, H * F] tensor).
//
// One warp per row, lanes over the outputs (kCols columns each, a pass of
// kSlot columns at a time), the lane's slice of W in registers: an edge is
// De FMAs per column. A chunk of the row's edges has its x rows staged in
// shared memory first (lanes over edges: all of the chunk's loads in
// flight), then read back as broadcasts. Loops by linearity: the mean /
// sum of the row's other outputs, W fill_row for a constant; the backward
// hands a loop's gradient to the row's other edges (share), so no loop row
// is ever formed. The backward's lanes each hold a block of columns x 4
// k's (W and d W in registers); an edge's d x is their sum over the column
// blocks (a transposing reduction, 4 - 6 shuffles), its d W per-warp
// partials summed afterwards: no atomics, deterministic.
#include <ATen/ATen.h>
#include <ATen/cuda/CUDAContext.h>
#include <c10/cuda/CUDAGuard.h>

#include "dispatch.cuh"
#include "edge_attr_common.cuh"
#include "numeric.cuh"
#include "ops.h"
#include "vector_io.cuh"

namespace pyg_dfgnn {
namespace edge_project {

constexpr int kWarps = 8;
constexpr int kThreads = kWarps * kWarpSize;
constexpr int kCols = 4;                   // output columns per lane
constexpr int kSlot = kWarpSize * kCols;   // columns per warp pass
constexpr int kChunk = kWarpSize;          // edges staged at a time

template <typename T>
struct Args {
  const int64_t* __restrict__ rowptr;
  const int64_t* __restrict__ index;     // nullptr: identity
  const T* __restrict__ x;               // [n_in, De]
  const T* __restrict__ fill_row;        // [De] (fill 3)
  const T* __restrict__ w;               // [HF, De]
  const T* __restrict__ grad;            // [E, HF] (backward)
  T* __restrict__ out;                   // [E, HF] (forward)
  T* __restrict__ grad_x;                // [n_in, De] (backward)
  float* __restrict__ grad_w;            // [warps, HF, De] (backward)
  const int64_t* __restrict__ loop_pos;  // [rows] (fill != 0)
  int64_t n_rows, n_in;
  int HF, De, fill;
  bool vec;  // x rows in 16-byte vectors (De % 4 == 0, aligned base)
};

template <int N>
constexpr int log2_of() {
  return N <= 1 ? 0 : 1 + log2_of<N / 2>();
}

// This lane's slice of W: columns c0 .. c0 + kCols - 1, De entries each
// (zeros past De or HF).
template <typename T, int DE>
__device__ __forceinline__ void load_w(const Args<T>& a, int c0,
                                       float (&wv)[DE][kCols]) {
#pragma unroll
  for (int i = 0; i < kCols; ++i)
#pragma unroll
    for (int k = 0; k < DE; ++k)
      wv[k][i] = c0 + i < a.HF && k < a.De
                     ? to_float(a.w[(int64_t)(c0 + i) * a.De + k])
                     : 0.f;
}

// The x rows of edges cb .. cb + n - 1 into the warp's s_x [kChunk][DE]
// (lane e stages edge e; loops and lanes past n stage nothing); returns
// this lane's edge's attribute row (>= n_in: a loop or none).
template <typename T, int DE>
__device__ __forceinline__ int64_t stage_chunk(const Args<T>& a, int64_t cb,
                                               int n, int lane,
                                               float (*s_x)[DE]) {
  const int64_t p = cb + lane;
  const int64_t r =
      lane < n ? (a.index != nullptr ? a.index[p] : p) : a.n_in;
  if (r < a.n_in) {
    const T* xr = a.x + r * a.De;
    if (a.vec) {
#pragma unroll
      for (int k = 0; k < DE; k += 4) {
        float t[4] = {0.f, 0.f, 0.f, 0.f};
        if (k < a.De) load_vec<T, 4>(xr + k, t);
        store_smem<4>(&s_x[lane][k], t);
      }
    } else {
#pragma unroll
      for (int k = 0; k < DE; ++k)
        s_x[lane][k] = k < a.De ? to_float(xr[k]) : 0.f;
    }
  }
  __syncwarp();
  return r;
}

template <typename T, int DE>
__device__ __forceinline__ void load_x(const float* row, float (&xv)[DE]) {
#pragma unroll
  for (int k = 0; k < DE; k += 4) {
    float t[4];
    load_smem<4>(row + k, t);
#pragma unroll
    for (int i = 0; i < 4; ++i) xv[k + i] = t[i];
  }
}

// fill 3's row into the block's s_fill (zeros past De or without it).
template <typename T, int DE>
__device__ __forceinline__ void stage_fill_row(const Args<T>& a,
                                               float* s_fill) {
  if (threadIdx.x < DE)
    s_fill[threadIdx.x] = a.fill == 3 && (int)threadIdx.x < a.De
                              ? to_float(a.fill_row[threadIdx.x])
                              : 0.f;
  __syncthreads();
}

template <typename T, int DE>
__global__ void __launch_bounds__(kThreads)
    project_fwd_kernel(Args<T> a) {
  static_assert(DE % 4 == 0, "DE: a multiple of 4");
  __shared__ __align__(16) float s_x[kWarps][kChunk][DE];
  __shared__ float s_fill[DE];
  stage_fill_row<T, DE>(a, s_fill);
  const int warp = threadIdx.x / kWarpSize, lane = threadIdx.x % kWarpSize;
  const int64_t warps = (int64_t)gridDim.x * kWarps;
  for (int c_base = 0; c_base < a.HF; c_base += kSlot) {
    const int c0 = c_base + lane * kCols;
    const bool on = c0 < a.HF;
    float wv[DE][kCols];
    load_w<T, DE>(a, c0, wv);
    for (int64_t row = (int64_t)blockIdx.x * kWarps + warp; row < a.n_rows;
         row += warps) {
      const int64_t lo = a.rowptr[row], hi = a.rowptr[row + 1];
      const int64_t loop_p = a.fill != 0 ? a.loop_pos[row] : -1;
      float acc[kCols] = {0.f, 0.f, 0.f, 0.f};
      for (int64_t cb = lo; cb < hi; cb += kChunk) {
        const int n = (int)(hi - cb < kChunk ? hi - cb : kChunk);
        __syncwarp();  // the previous chunk's reads are done
        const int64_t my_r = stage_chunk<T, DE>(a, cb, n, lane, s_x[warp]);
        for (int e = 0; e < n; ++e) {
          const int64_t r = __shfl_sync(kFullMask, (long long)my_r, e);
          if (r >= a.n_in) continue;  // the loop: after the others
          float xv[DE];
          load_x<T, DE>(s_x[warp][e], xv);
          float o[kCols] = {0.f, 0.f, 0.f, 0.f};
#pragma unroll
          for (int k = 0; k < DE; ++k)
#pragma unroll
            for (int i = 0; i < kCols; ++i) o[i] = fmaf(wv[k][i], xv[k], o[i]);
          if (on) store_vec<T, kCols>(a.out + (cb + e) * a.HF + c0, o);
#pragma unroll
          for (int i = 0; i < kCols; ++i) acc[i] += o[i];
        }
      }
      if (loop_p >= 0 && on) {
        float o[kCols];
        if (a.fill == 3) {
#pragma unroll
          for (int i = 0; i < kCols; ++i) {
            o[i] = 0.f;
#pragma unroll
            for (int k = 0; k < DE; ++k) o[i] = fmaf(wv[k][i], s_fill[k], o[i]);
          }
        } else {
          const float share = edge_rows::loop_share(a.fill, hi - lo - 1);
#pragma unroll
          for (int i = 0; i < kCols; ++i) o[i] = acc[i] * share;
        }
        store_vec<T, kCols>(a.out + loop_p * a.HF + c0, o);
      }
    }
  }
}

// p ? a : b on the bits (one LOP3): a conditional between two elements of
// a register array otherwise becomes an indexed local-memory access.
__device__ __forceinline__ float select(int mask, float a, float b) {
  return __int_as_float((__float_as_int(a) & mask) |
                        (__float_as_int(b) & ~mask));
}

// The backward's lanes: KG = DE / 4 groups of 4 k's, CG = 32 / KG column
// groups of CPL = kSlot / CG columns; lane = cg * KG + kg. A lane's d x
// part is 4 values (its k's) summed over its CPL columns, then over the CG
// lanes of its k group: 1 + log2(CG) shuffles per edge (4 at De 16)
// instead of one per k and lane.
template <int DE>
struct BwdLanes {
  static constexpr int KG = DE / 4, CG = kWarpSize / KG, CPL = kSlot / CG;
  static constexpr int kLogKG = log2_of<KG>();
};

// d[0..3] of this lane summed over its k group's CG lanes, transposed:
// the lane ends with k = 4 kg + 2 bit4 + bit3 (the lanes with bits
// kLogKG .. 2 clear write it).
template <int DE>
__device__ __forceinline__ float group_transpose_sum(float (&d)[4],
                                                     int lane) {
  using L = BwdLanes<DE>;
  const int up16 = -((lane >> 4) & 1), up8 = -((lane >> 3) & 1);
#pragma unroll
  for (int i = 0; i < 2; ++i) {  // m = 16: keep the half of bit 4
    const float send = select(up16, d[i], d[i + 2]);
    const float keep = select(up16, d[i + 2], d[i]);
    d[i] = keep + __shfl_xor_sync(kFullMask, send, 16);
  }
  const float send = select(up8, d[0], d[1]);
  const float keep = select(up8, d[1], d[0]);
  float s = keep + __shfl_xor_sync(kFullMask, send, 8);
#pragma unroll
  for (int m = 4; m >= L::KG; m >>= 1) s += __shfl_xor_sync(kFullMask, s, m);
  return s;
}

// The 128-byte line at p into L2 ahead of its use (no register holds it).
__device__ __forceinline__ void prefetch_l2(const void* p) {
  asm volatile("prefetch.global.L2 [%0];" ::"l"(p));
}

// (one block per SM: the W slice and the d W cells in registers; the
// gradient rows prefetched kAhead edges ahead into L2, as registers for
// more loads in flight are not left)
constexpr int kAhead = 8;
template <typename T, int DE>
__global__ void __launch_bounds__(kThreads, 1)
    project_bwd_kernel(Args<T> a) {
  static_assert(DE % 4 == 0, "DE: a multiple of 4");
  using L = BwdLanes<DE>;
  constexpr int CPL = L::CPL, NV = CPL / 4;  // columns, 4-vectors per lane
  __shared__ __align__(16) float s_x[kWarps][kChunk][DE];
  __shared__ float s_fill[DE];
  stage_fill_row<T, DE>(a, s_fill);
  const int warp = threadIdx.x / kWarpSize, lane = threadIdx.x % kWarpSize;
  const int64_t gwarp = (int64_t)blockIdx.x * kWarps + warp;
  const int64_t warps = (int64_t)gridDim.x * kWarps;
  const int kg = lane % L::KG, cg = lane / L::KG, k0 = kg * 4;
  // the k of this lane's transposed d x, and whether it writes it
  const int my_k = k0 + 2 * ((lane >> 4) & 1) + ((lane >> 3) & 1);
  const bool writer =
      ((lane >> L::kLogKG) & ((8 / L::KG) - 1)) == 0 && my_k < a.De;
  for (int c_base = 0; c_base < a.HF; c_base += kSlot) {
    const int c0 = c_base + cg * CPL;
    float wv[CPL][4], dw[CPL][4];
#pragma unroll
    for (int j = 0; j < CPL; ++j)
#pragma unroll
      for (int i = 0; i < 4; ++i) {
        wv[j][i] = c0 + j < a.HF && k0 + i < a.De
                       ? to_float(a.w[(int64_t)(c0 + j) * a.De + k0 + i])
                       : 0.f;
        dw[j][i] = 0.f;
      }
    // this lane's columns of an edge's gradient row (zeros past HF)
    auto load_g = [&](int64_t p, float (&g)[CPL]) {
#pragma unroll
      for (int v = 0; v < NV; ++v) {
        float t[4] = {0.f, 0.f, 0.f, 0.f};
        if (c0 + 4 * v < a.HF)
          load_vec<T, 4>(a.grad + p * a.HF + c0 + 4 * v, t);
#pragma unroll
        for (int i = 0; i < 4; ++i) g[4 * v + i] = t[i];
      }
    };
    for (int64_t row = gwarp; row < a.n_rows; row += warps) {
      const int64_t lo = a.rowptr[row], hi = a.rowptr[row + 1];
      const int64_t loop_p = a.fill != 0 ? a.loop_pos[row] : -1;
      // The loop's gradient h: fill 1 / 2 hand share * h to each other
      // edge: W^T h added to every d x_p (dh, formed once) and
      // h (x) sum_p x_p to d W (xs, at the row's end).
      const bool handed = loop_p >= 0 && (a.fill == 1 || a.fill == 2);
      const float share = edge_rows::loop_share(a.fill, hi - lo - 1);
      float dh = 0.f;
      if (handed) {
        float h[CPL];
        load_g(loop_p, h);
        float d[4];
#pragma unroll
        for (int i = 0; i < 4; ++i) {
          d[i] = 0.f;
#pragma unroll
          for (int j = 0; j < CPL; ++j) d[i] = fmaf(wv[j][i], h[j], d[i]);
        }
        dh = group_transpose_sum<DE>(d, lane) * share;
      }
      float xs[4] = {0.f, 0.f, 0.f, 0.f};
      // the pass's columns of a gradient row: kLines 128-byte lines
      // (only lines inside the row: a prefetch past the tensor is no
      // load the sanitizer would let pass)
      const int kLines = (kSlot * (int)sizeof(T) + 127) / 128;
      const int kLineElems = 128 / (int)sizeof(T);
      const T* g_pass = a.grad + c_base;
      if (lane < kAhead * kLines && lo + lane / kLines < hi &&
          c_base + (lane % kLines) * kLineElems < a.HF)
        prefetch_l2(g_pass + (lo + lane / kLines) * a.HF +
                    (lane % kLines) * kLineElems);
      for (int64_t cb = lo; cb < hi; cb += kChunk) {
        const int n = (int)(hi - cb < kChunk ? hi - cb : kChunk);
        __syncwarp();
        const int64_t my_r = stage_chunk<T, DE>(a, cb, n, lane, s_x[warp]);
        // the next edge's gradient loaded while this one is worked on
        float g_next[CPL];
        load_g(cb, g_next);
        for (int e = 0; e < n; ++e) {
          float g[CPL];
#pragma unroll
          for (int j = 0; j < CPL; ++j) g[j] = g_next[j];
          if (e + 1 < n) load_g(cb + e + 1, g_next);
          if (lane < kLines && cb + e + kAhead < hi &&
              c_base + lane * kLineElems < a.HF)
            prefetch_l2(g_pass + (cb + e + kAhead) * a.HF +
                        lane * kLineElems);
          const int64_t r = __shfl_sync(kFullMask, (long long)my_r, e);
          if (r >= a.n_in) continue;  // the loop (handed above)
          float x4[4];
          load_smem<4>(&s_x[warp][e][k0], x4);
          float d[4];
#pragma unroll
          for (int i = 0; i < 4; ++i) {
            d[i] = 0.f;
            xs[i] += x4[i];
#pragma unroll
            for (int j = 0; j < CPL; ++j) {
              dw[j][i] = fmaf(g[j], x4[i], dw[j][i]);
              d[i] = fmaf(wv[j][i], g[j], d[i]);
            }
          }
          const float dx = group_transpose_sum<DE>(d, lane) + dh;
          if (writer) {
            T* gx = a.grad_x + r * a.De + my_k;
            *gx = from_float<T>(c_base == 0 ? dx : to_float(*gx) + dx);
          }
        }
      }
      if (loop_p >= 0 && (handed || a.fill == 3)) {
        // d W of the loop: share * h (x) sum_p x_p, or h (x) fill_row
        float h[CPL];
        load_g(loop_p, h);
        float xl[4];
#pragma unroll
        for (int i = 0; i < 4; ++i)
          xl[i] = a.fill == 3 ? s_fill[k0 + i] : xs[i] * share;
#pragma unroll
        for (int j = 0; j < CPL; ++j)
#pragma unroll
          for (int i = 0; i < 4; ++i) dw[j][i] = fmaf(h[j], xl[i], dw[j][i]);
      }
    }
    // this warp's d W cells of the pass's columns
#pragma unroll
    for (int j = 0; j < CPL; ++j)
#pragma unroll
      for (int i = 0; i < 4; ++i)
        if (c0 + j < a.HF && k0 + i < a.De)
          a.grad_w[(gwarp * a.HF + c0 + j) * a.De + k0 + i] = dw[j][i];
  }
}

}  // namespace edge_project
}  // namespace pyg_dfgnn

using namespace pyg_dfgnn;

std::tuple<at::Tensor, at::Tensor, at::Tensor> edge_attr_project_cuda(
    const at::Tensor& rowptr, const c10::optional<at::Tensor>& index_opt,
    int64_t num_edges, const at::Tensor& edge_attr, int64_t fill,
    const c10::optional<at::Tensor>& fill_row_opt, const at::Tensor& weight,
    const c10::optional<at::Tensor>& grad_opt,
    const c10::optional<at::Tensor>& loop_pos_opt) {
  TORCH_CHECK(edge_attr.is_cuda() && edge_attr.dim() == 2,
              "edge_attr_project: 'edge_attr' must be a CUDA tensor "
              "[E_in, De]");
  const at::Device dev = edge_attr.device();
  c10::cuda::CUDAGuard guard(dev);
  const at::Tensor x = edge_attr.contiguous();
  const auto dtype = x.scalar_type();
  TORCH_CHECK(dtype == at::kFloat || dtype == at::kHalf ||
                  dtype == at::kBFloat16,
              "edge_attr_project: float32, float16 or bfloat16 only");
  const int64_t n_in = x.size(0), De = x.size(1);
  TORCH_CHECK(weight.is_cuda() && weight.device() == dev &&
                  weight.scalar_type() == dtype && weight.dim() == 2 &&
                  weight.size(1) == De,
              "edge_attr_project: 'weight' must be [H * F, De] in "
              "edge_attr's dtype on its device");
  const int64_t HF = weight.size(0);
  TORCH_CHECK(De >= 1 && De <= kEdgeProjectMaxDim && HF >= 1 &&
                  HF % edge_project::kCols == 0,
              "edge_attr_project: needs 1 <= De <= ", kEdgeProjectMaxDim,
              " and H * F a multiple of ", edge_project::kCols, " (got De = ",
              De, ", H * F = ", HF, ")");
  TORCH_CHECK(rowptr.is_cuda() && rowptr.device() == dev &&
                  rowptr.scalar_type() == at::kLong && rowptr.dim() == 1 &&
                  rowptr.numel() >= 1,
              "edge_attr_project: 'rowptr' must be an int64 CUDA tensor "
              "[N + 1]");
  TORCH_CHECK(fill >= 0 && fill <= 3, "edge_attr_project: 'fill' must be 0-3");
  auto input = [&](const c10::optional<at::Tensor>& t, const char* name) {
    return edge_rows::optional_input(t, "edge_attr_project", name, dev);
  };
  const at::Tensor ptr = rowptr.contiguous();
  const at::Tensor index = input(index_opt, "index");
  const at::Tensor fr = input(fill_row_opt, "fill_row");
  const at::Tensor grad = input(grad_opt, "grad");
  const at::Tensor loop_pos = input(loop_pos_opt, "loop_pos");
  const int64_t n_rows = ptr.numel() - 1;
  TORCH_CHECK(index.defined() ? index.scalar_type() == at::kLong &&
                                    index.numel() == num_edges
                              : fill == 0 && num_edges == n_in,
              "edge_attr_project: 'index' must be int64 [num_edges] (without "
              "it, no fill and one edge per edge_attr row)");
  TORCH_CHECK(fill != 3 || (fr.defined() && fr.numel() == De &&
                            fr.scalar_type() == dtype),
              "edge_attr_project: fill 3 needs 'fill_row' [De]");
  TORCH_CHECK(fill == 0 || (loop_pos.defined() &&
                            loop_pos.scalar_type() == at::kLong &&
                            loop_pos.numel() == n_rows),
              "edge_attr_project: a fill needs 'loop_pos' (int64 [N])");
  const bool backward = grad.defined();
  TORCH_CHECK(!backward || (grad.scalar_type() == dtype && grad.dim() == 2 &&
                            grad.size(0) == num_edges && grad.size(1) == HF),
              "edge_attr_project: 'grad' must be [num_edges, H * F] in "
              "edge_attr's dtype");

  const auto opts = x.options();
  at::Tensor out = at::empty({backward ? 0 : num_edges, HF}, opts);
  at::Tensor grad_x = at::empty({backward ? n_in : 0, De}, opts);
  const int sms = at::cuda::getCurrentDeviceProperties()->multiProcessorCount;
  const int64_t row_blocks =
      (n_rows + edge_project::kWarps - 1) / edge_project::kWarps;
  // forward: a few blocks per SM walk the rows; backward: one (registers)
  const unsigned blocks = (unsigned)std::max<int64_t>(
      1, std::min<int64_t>(row_blocks, (backward ? 1 : 4) * (int64_t)sms));
  at::Tensor partial = at::empty(
      {backward ? (int64_t)blocks * edge_project::kWarps : 0, HF, De},
      opts.dtype(at::kFloat));
  if (n_rows == 0 || num_edges == 0) {
    return {out, grad_x.zero_(), at::zeros({backward ? HF : 0, De},
                                           opts.dtype(at::kFloat))};
  }
  auto stream = at::cuda::getCurrentCUDAStream();
  PYG_DFGNN_DISPATCH_FLOAT(dtype, "edge_attr_project", [&] {
    edge_project::Args<scalar_t> a;
    a.rowptr = ptr.data_ptr<int64_t>();
    a.index = index.defined() ? index.data_ptr<int64_t>() : nullptr;
    a.x = x.data_ptr<scalar_t>();
    a.fill_row = fr.defined() ? fr.data_ptr<scalar_t>() : nullptr;
    const at::Tensor w = weight.contiguous();
    a.w = w.data_ptr<scalar_t>();
    a.grad = backward ? grad.data_ptr<scalar_t>() : nullptr;
    a.out = backward ? nullptr : out.data_ptr<scalar_t>();
    a.grad_x = backward ? grad_x.data_ptr<scalar_t>() : nullptr;
    a.grad_w = backward ? partial.data_ptr<float>() : nullptr;
    a.loop_pos = fill != 0 ? loop_pos.data_ptr<int64_t>() : nullptr;
    a.n_rows = n_rows, a.n_in = n_in;
    a.HF = (int)HF, a.De = (int)De, a.fill = (int)fill;
    a.vec = De % 4 == 0 && reinterpret_cast<uintptr_t>(a.x) %
                                 (4 * sizeof(scalar_t)) == 0;
    with_bound<kEdgeProjectMaxDim>(De, [&](auto max_dim) {
      constexpr int DE = decltype(max_dim)::value;
      if (backward)
        edge_project::project_bwd_kernel<scalar_t, DE>
            <<<blocks, edge_project::kThreads, 0, stream>>>(a);
      else
        edge_project::project_fwd_kernel<scalar_t, DE>
            <<<blocks, edge_project::kThreads, 0, stream>>>(a);
    });
    C10_CUDA_KERNEL_LAUNCH_CHECK();
  });
  if (!backward)
    return {out, grad_x, at::empty({0, De}, opts.dtype(at::kFloat))};
  return {out, grad_x, partial.sum(0)};
}

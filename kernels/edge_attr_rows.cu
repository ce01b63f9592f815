// Raw edge attributes in the fused attention, without an [E, H, F] (or a
// reordered [E, D_e]) copy: row-parallel products of the user's edge_attr
// with per-node or per-edge weights, read through a CSR edge -> attribute
// row map. For destination row i and its CSR edges p (x_p = edge_attr row
// index[p]):
//   dots     T[p, h]    = <M_i[h], x_p>           M: node_mat [N or 1, H, De]
//   sums     S_i[h, :]  = sum_p W[p, h] x_p       W: edge_weight [E, H]
//   scatter  G[a_p, :]  = sum_h W[p, h] M_i[h, :] (d x for either of the two)
// TransformerConv's edge term is <q_i, W_e x_p> = <W_e^T q_i, x_p> in the
// score (dots with M = scale W_e^T q) and sum_p alpha_p W_e x_p =
// W_e sum_p alpha_p x_p in the message (sums with W = alpha): [N, H, De]
// per node instead of [E, H, F] per edge. GAT's is dots with one shared M
// (the attention vector folded into lin_edge). The backward of each is the
// other two (see pyg_dfgnn/ops/edge_attr.py).
//
// Self-loops (PyG's fill_value): a row's entry with index >= n_in is its
// loop; its x is the mean (fill 1) or sum (fill 2) of the row's other x, or
// fill_row (fill 3). By linearity the loop's dot is the mean / sum of the
// others' dots, and sums / scatter hand the loop's weight to the others
// (W_p + W_loop / count), so no loop row is ever formed.
//
// One warp per row: rows in vectors with H <= 8 take the lane-group kernel
// (edge_attr_groups.cuh: a group of lanes per edge); the others this file's
// row kernel, dots and scatter with lanes over edges (M in shared memory),
// sums with lanes over the H * De outputs and several edges in flight. No
// atomics: deterministic. A node_mat of one
// row (M shared by all rows, GAT) takes the edge-parallel kernels of
// edge_attr_shared.cuh instead, and its sums come back summed over the
// rows ([1, H, De]).
#include <limits>

#include <ATen/ATen.h>
#include <ATen/cuda/CUDAContext.h>
#include <c10/cuda/CUDAGuard.h>
#include <c10/cuda/CUDAStream.h>

#include "dispatch.cuh"
#include "edge_attr_common.cuh"
#include "edge_attr_groups.cuh"
#include "edge_attr_shared.cuh"

namespace pyg_dfgnn {
namespace edge_rows {

// MAXH >= H: the per-lane head arrays live in registers.
// (4 blocks per SM: <= 64 registers; 96 left 25% occupancy to a
// latency-bound kernel)
template <typename T, int MAXH>
__global__ void __launch_bounds__(kThreads, 4) edge_rows_kernel(Args<T> a) {
  __shared__ float s_m[kWarps][kEdgeRowsMaxHD];
  __shared__ float s_wl[kWarps][2 * kEdgeRowsMaxHeads];
  __shared__ float s_fill[kEdgeRowsMaxHD];
  const int H = a.H, De = a.De, HD = H * De;
  if (a.fill == 3)
    for (int i = threadIdx.x; i < De; i += kThreads)
      s_fill[i] = to_float(a.fill_row[i]);
  __syncthreads();
  const int warp = threadIdx.x / kWarpSize, lane = threadIdx.x % kWarpSize;
  const int64_t row = (int64_t)blockIdx.x * kWarps + warp;
  if (row >= a.n_rows) return;
  float* m = s_m[warp];
  float* wl = s_wl[warp];
  const RowStart rs = begin_row(a, row, lane, m, wl);
  const int64_t lo = rs.lo, hi = rs.hi, loop_p = rs.loop_p;
  auto attr_row = [&](int64_t p) -> int64_t {
    return a.index != nullptr ? a.index[p] : p;
  };

  // dots / scatter: lanes over edges
  if (a.dots != nullptr || a.scatter != nullptr) {
    float dsum[MAXH];
#pragma unroll
    for (int h = 0; h < MAXH; ++h) dsum[h] = 0.f;
    for (int64_t p = lo + lane; p < hi; p += kWarpSize) {
      const int64_t r = attr_row(p);
      if (r >= a.n_in) continue;  // the loop: after the others
      if (a.dots != nullptr) {
        float acc[MAXH];
#pragma unroll
        for (int h = 0; h < MAXH; ++h) acc[h] = 0.f;
        edge_dots(a, r, m, acc);
#pragma unroll
        for (int h = 0; h < MAXH; ++h)
          if (h < H) {
            a.dots[p * H + h] = from_float<T>(acc[h]);
            dsum[h] += acc[h];
          }
      }
      if (a.scatter != nullptr) {
        float wv[MAXH], wv2[MAXH];
#pragma unroll
        for (int h = 0; h < MAXH; ++h) {
          wv[h] = h < H ? to_float(a.w[p * H + h]) + wl[h] : 0.f;
          wv2[h] = h < H && a.w2 != nullptr
                       ? to_float(a.w2[p * H + h]) + wl[kEdgeRowsMaxHeads + h]
                       : 0.f;
        }
        edge_scatter(a, r, m, wv, wv2);
      }
    }
    if (a.dots != nullptr && loop_p >= 0)
      write_loop_dots(a, m, s_fill, rs, dsum, lane);
  }

  // sums: L lanes cover the H * De outputs (kOut each), the warp's
  // 32 / L slots take different edges (kUnroll each in flight), summed by
  // shuffles at the end; edges in chunks of 32 (one coalesced index load,
  // broadcast by shuffles)
  if (a.sums != nullptr) {
    int L = 1;
    while (L * kOut < HD && L < kWarpSize) L <<= 1;
    const int slots = kWarpSize / L, slot = lane / L, l = lane % L;
    for (int o0 = 0; o0 < HD; o0 += L * kOut) {
      float acc[kOut];
      int oh[kOut], od[kOut];
#pragma unroll
      for (int j = 0; j < kOut; ++j) {
        const int o = o0 + l + j * L;
        acc[j] = 0.f;
        oh[j] = o < HD ? o / De : -1;
        od[j] = o < HD ? o - oh[j] * De : 0;
      }
      for (int64_t cb = lo; cb < hi; cb += kWarpSize) {
        const int n = (int)(hi - cb < kWarpSize ? hi - cb : kWarpSize);
        const int64_t my_r = lane < n ? attr_row(cb + lane) : a.n_in;
        for (int e0 = 0; e0 < n; e0 += slots * kUnroll) {
          int64_t r[kUnroll];
#pragma unroll
          for (int u = 0; u < kUnroll; ++u)
            r[u] = __shfl_sync(kFullMask, (long long)my_r,
                               (e0 + slot + u * slots) & 31);
#pragma unroll
          for (int u = 0; u < kUnroll; ++u) {
            const int e = e0 + slot + u * slots;
            if (e >= n || r[u] >= a.n_in) continue;
            const T* xr = a.x + r[u] * De;
            const T* wr = a.w + (cb + e) * H;
#pragma unroll
            for (int j = 0; j < kOut; ++j)
              if (oh[j] >= 0)
                acc[j] = fmaf(to_float(wr[oh[j]]) + wl[oh[j]],
                              to_float(xr[od[j]]), acc[j]);
          }
        }
      }
#pragma unroll
      for (int j = 0; j < kOut; ++j) {
        for (int off = L; off < kWarpSize; off <<= 1)
          acc[j] += __shfl_xor_sync(kFullMask, acc[j], off);
        if (slot != 0 || oh[j] < 0) continue;
        if (a.fill == 3 && loop_p >= 0)
          acc[j] = fmaf(to_float(a.w[loop_p * H + oh[j]]), s_fill[od[j]],
                        acc[j]);
        a.sums[row * HD + o0 + l + j * L] = acc[j];
      }
    }
  }
}

}  // namespace edge_rows
}  // namespace pyg_dfgnn

namespace {
using namespace pyg_dfgnn;

at::Tensor optional_input(const c10::optional<at::Tensor>& t,
                          const char* name, at::Device dev) {
  return edge_rows::optional_input(t, "edge_attr_rows", name, dev);
}

}  // namespace

// A node_mat of one row (edge_attr_shared.cuh): dots, then d x / d M; the
// sums (d M) summed over the rows into out_sums [1, H, De].
template <typename T>
void run_shared_mat(edge_rows::Args<T> a,
                    const at::Tensor& fill_row, at::Tensor& out_sums,
                    cudaStream_t stream) {
  using namespace edge_rows;
  const int64_t H = a.H, De = a.De;
  const unsigned edge_blocks =
      (unsigned)((a.n_edges + kEdgeThreads - 1) / kEdgeThreads);
  const unsigned row_blocks = (unsigned)((a.n_rows + kWarps - 1) / kWarps);
  const bool sums = a.sums != nullptr;
  a.sums = nullptr;  // (the grad kernel writes per-block partials instead)
  const auto fopts = out_sums.options();
  with_bound<kEdgeRowsMaxHeads>(H, [&](auto max_h) {
    constexpr int MAXH = decltype(max_h)::value;
    if (a.dots != nullptr) {
      if (edge_blocks > 0)
        shared_dots_kernel<T, MAXH><<<edge_blocks, kEdgeThreads, 0, stream>>>(a);
      if (a.fill != 0)
        loop_dots_kernel<T, MAXH><<<row_blocks, kThreads, 0, stream>>>(a);
      C10_CUDA_KERNEL_LAUNCH_CHECK();
    }
    if (!sums && a.scatter == nullptr) return;
    at::Tensor loop_w;
    const bool handed = a.fill == 1 || a.fill == 2;
    if (handed || (a.fill == 3 && sums)) {
      loop_w = at::empty({a.n_rows, H}, fopts);
      loop_weights_kernel<T>
          <<<(unsigned)((a.n_rows + kThreads - 1) / kThreads), kThreads, 0,
             stream>>>(a, loop_w.data_ptr<float>());
      C10_CUDA_KERNEL_LAUNCH_CHECK();
    }
    // persistent blocks (a few per SM): one d M partial each
    const int sms = at::cuda::getCurrentDeviceProperties()->multiProcessorCount;
    const int64_t tile = grad_tile_edges((int)De);
    const unsigned grad_blocks = (unsigned)std::min<int64_t>(
        (a.n_edges + tile - 1) / tile, kGradBlocksPerSM<MAXH> * (int64_t)sms);
    at::Tensor dm;
    at::Tensor partial = at::empty({sums ? (int64_t)grad_blocks : 0, H * De},
                                   fopts);
    if (grad_blocks > 0) {
      shared_grad_kernel<T, MAXH><<<grad_blocks, kEdgeThreads, 0, stream>>>(
          a, handed ? loop_w.data_ptr<float>() : nullptr,
          sums ? partial.data_ptr<float>() : nullptr);
      C10_CUDA_KERNEL_LAUNCH_CHECK();
    }
    if (!sums) return;
    dm = grad_blocks > 0 ? partial.sum(0) : at::zeros({H * De}, fopts);
    if (a.fill == 3)  // the loops' x is the fill row
      dm = dm + at::outer(loop_w.sum(0), fill_row.to(at::kFloat)).view(-1);
    out_sums.copy_(dm.view({1, H, De}));
  });
}

std::tuple<at::Tensor, at::Tensor, at::Tensor> edge_attr_rows_cuda(
    const at::Tensor& rowptr, const c10::optional<at::Tensor>& index_opt,
    int64_t num_edges, const at::Tensor& edge_attr, int64_t fill,
    const c10::optional<at::Tensor>& fill_row_opt,
    const c10::optional<at::Tensor>& node_mat_opt,
    const c10::optional<at::Tensor>& edge_weight_opt, bool dots, bool sums,
    bool scatter, const c10::optional<at::Tensor>& loop_pos_opt,
    const c10::optional<at::Tensor>& edge_row_opt,
    const c10::optional<at::Tensor>& node_mat2_opt,
    const c10::optional<at::Tensor>& edge_weight2_opt) {
  TORCH_CHECK(edge_attr.is_cuda(), "edge_attr_rows: 'edge_attr' must be a "
              "CUDA tensor");
  const at::Device dev = edge_attr.device();
  c10::cuda::CUDAGuard guard(dev);
  TORCH_CHECK(edge_attr.dim() == 2, "edge_attr_rows: 'edge_attr' must have "
              "shape [E_in, De]");
  const at::Tensor x = edge_attr.contiguous();
  const auto dtype = x.scalar_type();
  TORCH_CHECK(dtype == at::kFloat || dtype == at::kHalf ||
                  dtype == at::kBFloat16,
              "edge_attr_rows: float32, float16 or bfloat16 only");
  TORCH_CHECK(rowptr.is_cuda() && rowptr.device() == dev &&
                  rowptr.scalar_type() == at::kLong && rowptr.dim() == 1 &&
                  rowptr.numel() >= 1,
              "edge_attr_rows: 'rowptr' must be an int64 CUDA tensor "
              "[N + 1]");
  const at::Tensor ptr = rowptr.contiguous();
  const at::Tensor index = optional_input(index_opt, "index", dev);
  TORCH_CHECK(!index.defined() || (index.scalar_type() == at::kLong &&
                                   index.numel() == num_edges),
              "edge_attr_rows: 'index' must be int64 [num_edges]");
  TORCH_CHECK(index.defined() || fill == 0,
              "edge_attr_rows: a fill needs 'index' (loop rows >= E_in)");
  TORCH_CHECK(fill >= 0 && fill <= 3, "edge_attr_rows: 'fill' must be 0-3");
  const at::Tensor m = optional_input(node_mat_opt, "node_mat", dev);
  const at::Tensor w = optional_input(edge_weight_opt, "edge_weight", dev);
  const at::Tensor fr = optional_input(fill_row_opt, "fill_row", dev);
  const int64_t n_rows = ptr.numel() - 1, n_in = x.size(0), De = x.size(1);
  TORCH_CHECK(m.defined() || w.defined(),
              "edge_attr_rows: needs 'node_mat' or 'edge_weight'");
  const int64_t H = m.defined() ? m.size(1) : w.size(1);
  TORCH_CHECK(H >= 1 && H <= kEdgeRowsMaxHeads && De >= 1 &&
                  H * De <= kEdgeRowsMaxHD,
              "edge_attr_rows: needs 1 <= H <= ", kEdgeRowsMaxHeads,
              " and H * De <= ", kEdgeRowsMaxHD, " (got H = ", H,
              ", De = ", De, ")");
  if (m.defined())
    TORCH_CHECK(m.scalar_type() == dtype && m.dim() == 3 && m.size(1) == H &&
                    m.size(2) == De &&
                    (m.size(0) == n_rows || m.size(0) == 1),
                "edge_attr_rows: 'node_mat' must be [N or 1, H, De] in "
                "edge_attr's dtype");
  if (w.defined())
    TORCH_CHECK(w.scalar_type() == dtype && w.dim() == 2 &&
                    w.size(0) == num_edges && w.size(1) == H,
                "edge_attr_rows: 'edge_weight' must be [E, H] in "
                "edge_attr's dtype");
  TORCH_CHECK(fill != 3 || (fr.defined() && fr.numel() == De &&
                            fr.scalar_type() == dtype),
              "edge_attr_rows: fill 3 needs 'fill_row' [De]");
  const at::Tensor loop_pos = optional_input(loop_pos_opt, "loop_pos", dev);
  const at::Tensor edge_row = optional_input(edge_row_opt, "edge_row", dev);
  TORCH_CHECK(fill == 0 || (loop_pos.defined() &&
                            loop_pos.scalar_type() == at::kLong &&
                            loop_pos.numel() == n_rows),
              "edge_attr_rows: a fill needs 'loop_pos' (int64 [N])");
  TORCH_CHECK(fill == 0 || (edge_row.defined() &&
                            edge_row.scalar_type() == at::kInt &&
                            edge_row.numel() == num_edges),
              "edge_attr_rows: a fill needs 'edge_row' (int32 [num_edges])");
  TORCH_CHECK(!dots || m.defined(), "edge_attr_rows: dots need 'node_mat'");
  TORCH_CHECK(!sums || w.defined(), "edge_attr_rows: sums need 'edge_weight'");
  TORCH_CHECK(!scatter || (m.defined() && w.defined()),
              "edge_attr_rows: scatter needs 'node_mat' and 'edge_weight'");
  const at::Tensor m2 = optional_input(node_mat2_opt, "node_mat2", dev);
  const at::Tensor w2 = optional_input(edge_weight2_opt, "edge_weight2", dev);
  TORCH_CHECK(m2.defined() == w2.defined(),
              "edge_attr_rows: 'node_mat2' and 'edge_weight2' come together");
  if (m2.defined()) {
    TORCH_CHECK(scatter && m.size(0) == n_rows,
                "edge_attr_rows: the second term is for the scatter of a "
                "per-row 'node_mat'");
    TORCH_CHECK(2 * H * De <= kEdgeRowsMaxHD,
                "edge_attr_rows: the second term needs 2 H De <= ",
                kEdgeRowsMaxHD);
    TORCH_CHECK(m2.scalar_type() == dtype && m2.dim() == 3 &&
                    m2.size(0) == n_rows && m2.size(1) == H &&
                    m2.size(2) == De,
                "edge_attr_rows: 'node_mat2' must be [N, H, De] in "
                "edge_attr's dtype");
    TORCH_CHECK(w2.scalar_type() == dtype && w2.dim() == 2 &&
                    w2.size(0) == num_edges && w2.size(1) == H,
                "edge_attr_rows: 'edge_weight2' must be [E, H] in "
                "edge_attr's dtype");
  }

  const auto opts = x.options();
  at::Tensor out_dots = at::empty({dots ? num_edges : 0, H}, opts);
  // One row of M shared by the rows -- unless the graph has one row, whose
  // M is then per-row (TransformerConv's) as well: the per-row kernels take
  // it, second term included (the shared-M kernels have none, and dropped
  // it: a one-node graph's d x without its sum_h w2 M2 part).
  const bool shared = m.defined() && m.size(0) == 1 && n_rows != 1;
  at::Tensor out_sums = at::empty({sums ? (shared ? 1 : n_rows) : 0, H, De},
                                  opts.dtype(at::kFloat));
  at::Tensor out_scatter = at::empty({scatter ? n_in : 0, De}, opts);
  if (n_rows == 0 || (!dots && !sums && !scatter)) {
    if (sums) out_sums.zero_();
    return {out_dots, out_sums, out_scatter};
  }
  auto stream = at::cuda::getCurrentCUDAStream();
  const unsigned blocks =
      (unsigned)((n_rows + edge_rows::kWarps - 1) / edge_rows::kWarps);
  AT_DISPATCH_FLOATING_TYPES_AND2(
      at::kHalf, at::kBFloat16, dtype, "edge_attr_rows", [&] {
        edge_rows::Args<scalar_t> a;
        a.rowptr = ptr.data_ptr<int64_t>();
        a.index = index.defined() ? index.data_ptr<int64_t>() : nullptr;
        a.x = x.data_ptr<scalar_t>();
        a.fill_row = fr.defined() ? fr.data_ptr<scalar_t>() : nullptr;
        a.m = m.defined() ? m.data_ptr<scalar_t>() : nullptr;
        a.w = w.defined() ? w.data_ptr<scalar_t>() : nullptr;
        a.dots = dots ? out_dots.data_ptr<scalar_t>() : nullptr;
        a.sums = sums ? out_sums.data_ptr<float>() : nullptr;
        a.scatter = scatter ? out_scatter.data_ptr<scalar_t>() : nullptr;
        a.m2 = m2.defined() ? m2.data_ptr<scalar_t>() : nullptr;
        a.w2 = w2.defined() ? w2.data_ptr<scalar_t>() : nullptr;
        a.loop_pos = fill != 0 ? loop_pos.data_ptr<int64_t>() : nullptr;
        a.edge_row = fill != 0 ? edge_row.data_ptr<int32_t>() : nullptr;
        a.n_rows = n_rows, a.n_in = n_in, a.n_edges = num_edges;
        a.m_stride = m.defined() && m.size(0) == n_rows ? H * De : 0;
        a.H = (int)H, a.De = (int)De, a.fill = (int)fill;
        // (a row starts on a vector boundary when the base pointer does)
        a.vec = De % edge_rows::kVW == 0 &&
                reinterpret_cast<uintptr_t>(a.x) %
                        (edge_rows::kVW * sizeof(scalar_t)) == 0;
        if (shared) {
          run_shared_mat<scalar_t>(a, fr, out_sums, stream);
          return;
        }
        // per-row M: lane groups per edge where the rows come in vectors,
        // H <= 8 and dots and sums are not asked together
        const int group = edge_rows::edge_group_lanes((int)De);
        if (a.vec && group > 0 && H <= 8 && !(dots && sums)) {
          auto launch = [&](auto max_h) {
            constexpr int MAXH = decltype(max_h)::value;
            if (sums)
              edge_rows::edge_groups_kernel<scalar_t, MAXH, true>
                  <<<blocks, edge_rows::kThreads, 0, stream>>>(a, group);
            else
              edge_rows::edge_groups_kernel<scalar_t, MAXH, false>
                  <<<blocks, edge_rows::kThreads, 0, stream>>>(a, group);
          };
          if (H <= 4)
            launch(std::integral_constant<int, 4>{});
          else
            launch(std::integral_constant<int, 8>{});
        } else {
          with_bound<kEdgeRowsMaxHeads>(H, [&](auto max_h) {
            edge_rows::edge_rows_kernel<scalar_t, decltype(max_h)::value>
                <<<blocks, edge_rows::kThreads, 0, stream>>>(a);
          });
        }
        C10_CUDA_KERNEL_LAUNCH_CHECK();
      });
  return {out_dots, out_sums, out_scatter};
}

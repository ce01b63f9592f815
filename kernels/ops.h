// Host entry points of the fused attention kernels (one templated family:
// dtype x score kind x strategy). Registered as torch.library ops in ops.cpp.
//
// Conventions (see pyg_dfgnn/ops/__init__.py for the math):
//   rowptr  int64 [N_dst + 1]   CSR by destination
//   col     int32|int64 [E]     source of each CSR edge
//   colptr  int64 [N_src + 1]   CSC by source
//   csc_row same dtype as col [E]  destination of each CSC entry
//   kind    0 = dot, 1 = add, 2 = gatv2
//   dot  : query [N_dst,H,D], key [N_src,H,D], value [N_src,H,F], att undefined
//   add  : query [N_dst,H],   key [N_src,H],   value [N_src,H,F], att undefined
//   gatv2: query [N_dst,H,F], key [N_src,H,F], value [N_src,H,F], att [H,F]
//   strategy 0 = SMMF, 1 = PMF (forward; the host may still route a row set
//            that does not fit shared memory to the PMF path), 2 / 3 =
//            tensor-core windows (fwd_tc_kernel.cuh; asked for explicitly,
//            conditions checked, no fallback; the autograd op passes the
//            strategy on to the backward, which takes 2 as its own TC path
//            and 3 as the rows / cols passes), 4 = SMMF forward and the
//            backward's TC path (the windows serve both: the TC windows,
//            whose sources SMMF stages as far as they fit), 5 = 3 with
//            fp32's products as one TF32 mma each (opt-in: the host asks
//            for it under torch.backends.cuda.matmul.allow_tf32), 6 = 2
//            with fp32's products as one TF32 mma each in both passes
//   lse     float32 [N_dst, H]: row max + log(row sum + 1e-16); the only thing
//           the forward saves for the backward (p_ij = exp(s_ij - lse_i)).
//           Rows without edges: lse = -inf (and out = 0).
//   max_in_degree  the longest CSR row, known on the host from DFGraph
//           (-1 = unknown: computed, one sync). Unused by SMMF now.
//   windows int64 [W + 1] (optional) SMMF row windows whose sources are
//           contiguous (DFGraph.row_windows); stage_nodes: the most sources
//           one window reads. SMMF stages them in shared memory (as many as
//           fit); without windows it takes fixed windows of 16 rows.
//   training features (all optional, per-edge tensors in CSR edge order):
//     edge_score [E, H] ('add': added inside the LeakyReLU; 'dot': added
//     to the scaled dot product, scale <q_i, k_j + ek_ij> + es_ij), edge_key
//     [E, H, D] ('dot': <q_i, k_j + ek_ij>; 'gatv2': inside the LeakyReLU),
//     edge_value [E, H, F] (message v_j + ev_ij); dropout p on the
//     attention weights (Philox from PyTorch's CUDA generator; the forward
//     returns rng_state int64 [2] = (seed, offset), which the backward takes
//     to regenerate the mask); attention 0 / 1 / 2: return no weights / the
//     weights before / after dropout, as alpha [E, H] in value's dtype, row
//     attention_perm[e] for CSR edge e (the user's edge order; identity
//     without it). Absent outputs are empty tensors.
#pragma once
#include <ATen/ATen.h>
#include <cstdint>
#include <tuple>

enum ScoreKind : int64_t { kDot = 0, kAdd = 1, kGatv2 = 2 };

// A tensor whose data starts on a 16-byte boundary (or has none): the
// vector paths' and the tensor-core windows' 16-byte accesses need it.
inline bool aligned16(const at::Tensor& t) {
  return !t.defined() || t.numel() == 0 ||
         reinterpret_cast<uintptr_t>(t.data_ptr()) % 16 == 0;
}
// t, or an aligned copy where it is not (a view at an odd offset): the
// tensor-core windows, which have no unaligned path.
inline at::Tensor aligned16_or_copy(const at::Tensor& t) {
  return aligned16(t) ? t : t.clone();
}

// -> (out [N_dst,H,F] in value's dtype, lse [N_dst,H] float32,
//     alpha [E,H] (or [0,H]), rng_state int64 [2] (or [0]))
std::tuple<at::Tensor, at::Tensor, at::Tensor, at::Tensor>
fused_attention_fwd_cuda(
    const at::Tensor& rowptr, const at::Tensor& col, int64_t kind,
    const at::Tensor& query, const at::Tensor& key, const at::Tensor& value,
    const c10::optional<at::Tensor>& att, double scale, double negative_slope,
    int64_t strategy, int64_t max_in_degree,
    const c10::optional<at::Tensor>& windows, int64_t stage_nodes,
    const c10::optional<at::Tensor>& edge_score,
    const c10::optional<at::Tensor>& edge_key,
    const c10::optional<at::Tensor>& edge_value, double dropout,
    int64_t attention, const c10::optional<at::Tensor>& attention_perm);

// -> (grad_query, grad_key, grad_value, grad_att (empty [0] unless gatv2),
//     grad_edge_score, grad_edge_key, grad_edge_value (empty [0] for absent
//     inputs; 'dot' with edge_key and edge_value the same tensor: their one
//     gradient in grad_edge_key, grad_edge_value empty)).
// grad_alpha: gradient of the forward's returned weights (attention 1 / 2,
// same attention_perm), or None.
// csc_perm: CSR edge id of each CSC entry. windows / stage_nodes: the
// forward's row windows (rows pass); col_windows / col_stage_nodes: windows
// over source nodes whose destinations are contiguous (DFGraph.col_windows),
// for the cols pass. max_in_degree / max_out_degree: longest CSR row / CSC
// column (-1 = unknown: no sync, taken as long); owners longer than a
// segment are split over warps when no windows are given. Only lse comes
// from the forward (no output). strategy 2 / 4: tensor-core windows
// (bwd_tc_kernel.cuh; the host asks only where every window has <= 128 rows
// and sources and no two windows share a source), else the rows / cols
// passes; 6: the same windows with fp32's products as one TF32 mma each.
std::tuple<at::Tensor, at::Tensor, at::Tensor, at::Tensor, at::Tensor,
           at::Tensor, at::Tensor>
fused_attention_bwd_cuda(
    const at::Tensor& grad_out, const at::Tensor& rowptr, const at::Tensor& col,
    const at::Tensor& colptr, const at::Tensor& csc_row,
    const at::Tensor& csc_perm, int64_t kind, const at::Tensor& query,
    const at::Tensor& key, const at::Tensor& value,
    const c10::optional<at::Tensor>& att, const at::Tensor& lse, double scale,
    double negative_slope, const c10::optional<at::Tensor>& windows,
    int64_t stage_nodes, const c10::optional<at::Tensor>& col_windows,
    int64_t col_stage_nodes, int64_t max_in_degree, int64_t max_out_degree,
    const c10::optional<at::Tensor>& edge_score,
    const c10::optional<at::Tensor>& edge_key,
    const c10::optional<at::Tensor>& edge_value, double dropout,
    const c10::optional<at::Tensor>& rng_state,
    const c10::optional<at::Tensor>& grad_alpha, int64_t attention,
    const c10::optional<at::Tensor>& attention_perm, int64_t strategy);

// Raw edge attributes read through a CSR edge -> row map (edge_attr_rows.cu;
// math in pyg_dfgnn/ops/edge_attr.py): for each CSR row i and edge p,
// x_p = edge_attr[index[p]] (index undefined: p; index >= E_in: the row's
// self-loop, x = mean (fill 1) / sum (fill 2) of the row's other x or
// fill_row (fill 3)),
//   dots    [E, H]        T[p, h] = <node_mat[i or 0, h], x_p>
//   sums    [N, H, De]    S[i, h] = sum_p edge_weight[p, h] x_p   (float32;
//                         [1, H, De], summed over the rows, when node_mat
//                         has one row: the gradient of a shared M)
//   scatter [E_in, De]    d x of either: sum_h edge_weight[p, h]
//                         node_mat[i, h], plus edge_weight2[p, h]
//                         node_mat2[i, h] when those are given (the two
//                         terms of TransformerConv's d x in one pass; per-row
//                         node_mat, 2 H De <= kEdgeRowsMaxHD)
// With a fill (1 mean, 2 sum, 3 const), loop_pos [N] (int64: the row's
// self-loop entry, -1 for none) and edge_row [E] (int32: each edge's row),
// cached with the graph's map: no kernel scans a row for its loop.
// Unrequested outputs are empty. Needs H <= kEdgeRowsMaxHeads and
// H * De <= kEdgeRowsMaxHD.
inline constexpr int kEdgeRowsMaxHeads = 16;
inline constexpr int kEdgeRowsMaxHD = 512;
std::tuple<at::Tensor, at::Tensor, at::Tensor> edge_attr_rows_cuda(
    const at::Tensor& rowptr, const c10::optional<at::Tensor>& index,
    int64_t num_edges, const at::Tensor& edge_attr, int64_t fill,
    const c10::optional<at::Tensor>& fill_row,
    const c10::optional<at::Tensor>& node_mat,
    const c10::optional<at::Tensor>& edge_weight, bool dots, bool sums,
    bool scatter, const c10::optional<at::Tensor>& loop_pos,
    const c10::optional<at::Tensor>& edge_row,
    const c10::optional<at::Tensor>& node_mat2,
    const c10::optional<at::Tensor>& edge_weight2);

inline constexpr const char* kEdgeAttrRowsSchema =
    "edge_attr_rows(Tensor rowptr, Tensor? index, int num_edges, "
    "Tensor edge_attr, int fill, Tensor? fill_row, Tensor? node_mat, "
    "Tensor? edge_weight, bool dots, bool sums, bool scatter, "
    "Tensor? loop_pos, Tensor? edge_row, Tensor? node_mat2=None, "
    "Tensor? edge_weight2=None) -> (Tensor, Tensor, Tensor)";

// GATv2's edge keys projected from the raw edge attributes
// (edge_attr_project.cu), the map as edge_attr_rows': forward (grad
// undefined) K [E, HF] = x_p W^T in CSR order; backward (grad [E, HF])
// d edge_attr [E_in, De] (rows no edge reads are left unwritten) and
// d W [HF, De] (float32). Unreturned outputs are empty. Needs
// De <= kEdgeProjectMaxDim and HF a multiple of 4.
inline constexpr int kEdgeProjectMaxDim = 16;
std::tuple<at::Tensor, at::Tensor, at::Tensor> edge_attr_project_cuda(
    const at::Tensor& rowptr, const c10::optional<at::Tensor>& index,
    int64_t num_edges, const at::Tensor& edge_attr, int64_t fill,
    const c10::optional<at::Tensor>& fill_row, const at::Tensor& weight,
    const c10::optional<at::Tensor>& grad,
    const c10::optional<at::Tensor>& loop_pos,
    const c10::optional<at::Tensor>& edge_row);

inline constexpr const char* kEdgeAttrProjectSchema =
    "edge_attr_project(Tensor rowptr, Tensor? index, int num_edges, "
    "Tensor edge_attr, int fill, Tensor? fill_row, Tensor weight, "
    "Tensor? grad, Tensor? loop_pos, Tensor? edge_row=None) -> "
    "(Tensor, Tensor, Tensor)";

// The two ops' schemas (one definition: ops.cpp registers them in
// pyg_dfgnn, the backward's stand-alone test build in its own namespace).
inline constexpr const char* kFusedAttentionFwdSchema =
    "fused_attention_fwd(Tensor rowptr, Tensor col, int kind, Tensor query, "
    "Tensor key, Tensor value, Tensor? att, float scale, "
    "float negative_slope, int strategy, int max_in_degree=-1, "
    "Tensor? windows=None, int stage_nodes=0, Tensor? edge_score=None, "
    "Tensor? edge_key=None, Tensor? edge_value=None, float dropout=0., "
    "int attention=0, Tensor? attention_perm=None) "
    "-> (Tensor, Tensor, Tensor, Tensor)";
inline constexpr const char* kFusedAttentionBwdSchema =
    "fused_attention_bwd(Tensor grad_out, Tensor rowptr, Tensor col, "
    "Tensor colptr, Tensor csc_row, Tensor csc_perm, int kind, "
    "Tensor query, Tensor key, Tensor value, Tensor? att, Tensor lse, "
    "float scale, float negative_slope, Tensor? windows=None, "
    "int stage_nodes=0, Tensor? col_windows=None, int col_stage_nodes=0, "
    "int max_in_degree=-1, int max_out_degree=-1, Tensor? edge_score=None, "
    "Tensor? edge_key=None, Tensor? edge_value=None, float dropout=0., "
    "Tensor? rng_state=None, Tensor? grad_alpha=None, int attention=0, "
    "Tensor? attention_perm=None, int strategy=0) "
    "-> (Tensor, Tensor, Tensor, Tensor, Tensor, Tensor, Tensor)";

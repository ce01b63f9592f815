// The differentiable fused attention op, pyg_dfgnn::fused_attention, with its
// autograd in C++ (torchvision's pattern: a CUDA kernel plus an Autograd
// kernel here, fake impls in Python, pyg_dfgnn/ops/cuda.py). A Python
// custom_op + register_autograd costs tens of microseconds of host time per
// call, more than the kernels of a small graph take.
//
// Forward: fused_attention_fwd below autograd -> (out, lse, alpha).
// Backward: fused_attention_bwd, reading the inputs, lse and the dropout
// rng_state only (lse is non-differentiable), so the output is returned as
// it is and may be edited in place. alpha (the attention weights, when
// asked) is differentiable: its gradient joins the backward's dp. The graph tensors (rowptr, col, colptr, csc_row, csc_perm,
// windows) never require grad and are kept in saved_data (no version
// tracking: the graph is immutable). colptr / csc_row / csc_perm may be None
// when no backward is expected; a backward then raises.
#include <ATen/core/dispatch/Dispatcher.h>
#include <torch/autograd.h>
#include <torch/library.h>

#include "ops.h"

namespace {

using at::Tensor;
using torch::autograd::AutogradContext;
using torch::autograd::variable_list;

// Typed handles of the kernel ops, so that fake / meta tensors (torch.compile
// tracing) reach their fake impls through the dispatcher.
using OptTensor = c10::optional<Tensor>;
using FwdSig = std::tuple<Tensor, Tensor, Tensor, Tensor>(
    const Tensor&, const Tensor&, int64_t, const Tensor&, const Tensor&,
    const Tensor&, const OptTensor&, double, double, int64_t, int64_t,
    const OptTensor&, int64_t, const OptTensor&, const OptTensor&,
    const OptTensor&, double, int64_t, const OptTensor&);

const c10::TypedOperatorHandle<FwdSig>& fwd_op() {
  static const auto op =
      c10::Dispatcher::singleton()
          .findSchemaOrThrow("pyg_dfgnn::fused_attention_fwd", "")
          .typed<FwdSig>();
  return op;
}

using BwdSig = std::tuple<Tensor, Tensor, Tensor, Tensor, Tensor, Tensor,
                          Tensor>(
    const Tensor&, const Tensor&, const Tensor&, const Tensor&, const Tensor&,
    const Tensor&, int64_t, const Tensor&, const Tensor&, const Tensor&,
    const OptTensor&, const Tensor&, double, double, const OptTensor&,
    int64_t, const OptTensor&, int64_t, int64_t, int64_t, const OptTensor&,
    const OptTensor&, const OptTensor&, double, const OptTensor&,
    const OptTensor&, int64_t, const OptTensor&, int64_t);

const c10::TypedOperatorHandle<BwdSig>& bwd_op() {
  static const auto op =
      c10::Dispatcher::singleton()
          .findSchemaOrThrow("pyg_dfgnn::fused_attention_bwd", "")
          .typed<BwdSig>();
  return op;
}

// The non-differentiable arguments, passed to the Function as one value.
struct GraphArgs {
  const Tensor& rowptr;
  const Tensor& col;
  const c10::optional<Tensor>& colptr;
  const c10::optional<Tensor>& csc_row;
  const c10::optional<Tensor>& csc_perm;
  int64_t kind;
  double scale;
  double negative_slope;
  int64_t strategy;
  int64_t max_in_degree;
  const c10::optional<Tensor>& windows;
  int64_t stage_nodes;
  const c10::optional<Tensor>& col_windows;
  int64_t col_stage_nodes;
  int64_t max_out_degree;
  double dropout;
  int64_t attention;
  const c10::optional<Tensor>& attention_perm;
};

OptTensor opt(const Tensor& t) { return t.defined() ? OptTensor(t) : c10::nullopt; }

class FusedAttention : public torch::autograd::Function<FusedAttention> {
 public:
  // Inputs that can carry a gradient: query, key, value, att, edge_score,
  // edge_key, edge_value (an absent one is no edge, see needs_input_grad
  // below).
  static variable_list forward(AutogradContext* ctx, const Tensor& query,
                               const Tensor& key, const Tensor& value,
                               const OptTensor& att, const OptTensor& es,
                               const OptTensor& ek, const OptTensor& ev,
                               const GraphArgs& g) {
    at::AutoDispatchBelowADInplaceOrView guard;
    // Unused outputs reach backward undefined, not as zeros: weights
    // returned for inspection only (no gradient) keep the plain backward's
    // kernels rather than the feature level that reads grad_alpha.
    ctx->set_materialize_grads(false);
    auto [out, lse, alpha, rng_state] = fwd_op().call(
        g.rowptr, g.col, g.kind, query, key, value, att, g.scale,
        g.negative_slope, g.strategy, g.max_in_degree, g.windows,
        g.stage_nodes, es, ek, ev, g.dropout, g.attention, g.attention_perm);
    auto val = [](const OptTensor& t) { return t.has_value() ? *t : Tensor(); };
    ctx->save_for_backward({query, key, value, val(att), lse, val(es),
                            val(ek), val(ev)});
    auto& data = ctx->saved_data;
    data["rng_state"] = rng_state;
    data["dropout"] = g.dropout;
    data["attention"] = g.attention;
    data["attention_perm"] = g.attention_perm;
    // ek and ev the same tensor ('dot', TransformerConv): one gradient
    data["ekv_shared"] = ek.has_value() && ev.has_value() && ek->is_same(*ev);
    data["rowptr"] = g.rowptr;
    data["col"] = g.col;
    data["colptr"] = g.colptr;
    data["csc_row"] = g.csc_row;
    data["csc_perm"] = g.csc_perm;
    data["kind"] = g.kind;
    data["scale"] = g.scale;
    data["negative_slope"] = g.negative_slope;
    data["windows"] = g.windows;
    data["stage_nodes"] = g.stage_nodes;
    data["col_windows"] = g.col_windows;
    data["col_stage_nodes"] = g.col_stage_nodes;
    data["max_in_degree"] = g.max_in_degree;
    data["max_out_degree"] = g.max_out_degree;
    data["strategy"] = g.strategy;
    ctx->mark_non_differentiable({lse});
    return {out, lse, alpha};
  }

  static variable_list backward(AutogradContext* ctx, variable_list grads) {
    auto& data = ctx->saved_data;
    auto colptr = data["colptr"].toOptional<Tensor>();
    auto csc_row = data["csc_row"].toOptional<Tensor>();
    auto csc_perm = data["csc_perm"].toOptional<Tensor>();
    TORCH_CHECK(colptr.has_value() && csc_row.has_value() &&
                    csc_perm.has_value(),
                "pyg_dfgnn: the fused op was called without gradients "
                "enabled, so no CSC was built for its backward");
    const auto saved = ctx->get_saved_variables();
    const Tensor& att = saved[3];
    const bool has_att = att.defined();
    // Only the weights may carry a gradient (the output unused): dO = 0.
    const Tensor grad_out =
        grads[0].defined()
            ? grads[0].contiguous()
            : at::zeros({data["rowptr"].toTensor().size(0) - 1,
                         saved[2].size(1), saved[2].size(2)},
                        saved[2].options());
    const int64_t attention = data["attention"].toInt();
    const OptTensor grad_alpha =
        attention > 0 && grads[2].defined() ? OptTensor(grads[2])
                                            : c10::nullopt;
    // Double backward (create_graph) is not supported: the backward ops
    // have no autograd, so let the dispatcher say so; otherwise skip it.
    c10::optional<at::AutoDispatchBelowADInplaceOrView> below;
    if (!at::GradMode::is_enabled()) below.emplace();
    auto [gq, gk, gv, ga, ges, gek, gev] = bwd_op().call(
        grad_out, data["rowptr"].toTensor(),
        data["col"].toTensor(), *colptr, *csc_row, *csc_perm,
        data["kind"].toInt(), saved[0], saved[1], saved[2],
        has_att ? c10::optional<Tensor>(att) : c10::nullopt, saved[4],
        data["scale"].toDouble(), data["negative_slope"].toDouble(),
        data["windows"].toOptional<Tensor>(), data["stage_nodes"].toInt(),
        data["col_windows"].toOptional<Tensor>(),
        data["col_stage_nodes"].toInt(), data["max_in_degree"].toInt(),
        data["max_out_degree"].toInt(), opt(saved[5]), opt(saved[6]),
        opt(saved[7]), data["dropout"].toDouble(),
        opt(data["rng_state"].toTensor()), grad_alpha, attention,
        data["attention_perm"].toOptional<Tensor>(),
        data["strategy"].toInt());
    // One entry per forward argument (GraphArgs last); undefined = no grad.
    // needs_input_grad counts only the arguments that were tensors (absent
    // optional ones have no edge). A shared ek = ev gets its whole gradient
    // through the ek slot.
    const bool shared = data["ekv_shared"].toBool();
    const Tensor* inputs[7] = {&saved[0], &saved[1], &saved[2], &saved[3],
                               &saved[5], &saved[6], &saved[7]};
    const Tensor got[7] = {gq, gk, gv, ga, ges, gek,
                           shared ? Tensor() : gev};
    variable_list result(8);
    for (int i = 0, edge = 0; i < 7; ++i) {
      if (!inputs[i]->defined()) continue;
      if (ctx->needs_input_grad(edge++)) result[i] = got[i];
    }
    return result;
  }
};

// The kernels read dense rows; unlike fused_attention_fwd this op takes any
// strides (a copy is made only for non-contiguous inputs, differentiably
// when it happens above autograd).
c10::optional<Tensor> contiguous(const c10::optional<Tensor>& t) {
  return t.has_value() ? c10::optional<Tensor>(t->contiguous()) : t;
}

std::tuple<Tensor, Tensor, Tensor> fused_attention_cuda(
    const Tensor& rowptr, const Tensor& col,
    const c10::optional<Tensor>& /*colptr*/,
    const c10::optional<Tensor>& /*csc_row*/,
    const c10::optional<Tensor>& /*csc_perm*/, int64_t kind,
    const Tensor& query, const Tensor& key, const Tensor& value,
    const c10::optional<Tensor>& att, double scale, double negative_slope,
    int64_t strategy, int64_t max_in_degree,
    const c10::optional<Tensor>& windows, int64_t stage_nodes,
    const c10::optional<Tensor>& /*col_windows*/,
    int64_t /*col_stage_nodes*/, int64_t /*max_out_degree*/,
    const OptTensor& edge_score, const OptTensor& edge_key,
    const OptTensor& edge_value, double dropout, int64_t attention,
    const OptTensor& attention_perm) {
  auto [out, lse, alpha, rng_state] = fused_attention_fwd_cuda(
      rowptr, col, kind, query.contiguous(), key.contiguous(),
      value.contiguous(), contiguous(att), scale, negative_slope, strategy,
      max_in_degree, windows, stage_nodes, contiguous(edge_score),
      contiguous(edge_key), contiguous(edge_value), dropout, attention,
      attention_perm);
  return {out, lse, alpha};
}

std::tuple<Tensor, Tensor, Tensor> fused_attention_autograd(
    const Tensor& rowptr, const Tensor& col,
    const c10::optional<Tensor>& colptr, const c10::optional<Tensor>& csc_row,
    const c10::optional<Tensor>& csc_perm, int64_t kind, const Tensor& query_in, const Tensor& key_in,
    const Tensor& value_in, const c10::optional<Tensor>& att_in, double scale,
    double negative_slope, int64_t strategy, int64_t max_in_degree,
    const c10::optional<Tensor>& windows, int64_t stage_nodes,
    const c10::optional<Tensor>& col_windows, int64_t col_stage_nodes,
    int64_t max_out_degree, const OptTensor& edge_score_in,
    const OptTensor& edge_key_in, const OptTensor& edge_value_in,
    double dropout, int64_t attention, const OptTensor& attention_perm) {
  const Tensor query = query_in.contiguous(), key = key_in.contiguous(),
               value = value_in.contiguous();
  const c10::optional<Tensor> att = contiguous(att_in);
  const OptTensor es = contiguous(edge_score_in);
  // (one contiguous copy when ek and ev are the same strided tensor, so
  // that they stay one tensor)
  const OptTensor ek = contiguous(edge_key_in);
  const OptTensor ev =
      edge_value_in.has_value() && edge_key_in.has_value() &&
              edge_value_in->is_same(*edge_key_in)
          ? ek
          : contiguous(edge_value_in);
  auto grad = [](const OptTensor& t) {
    return t.has_value() && t->requires_grad();
  };
  const bool track = at::GradMode::is_enabled() &&
                     (query.requires_grad() || key.requires_grad() ||
                      value.requires_grad() || grad(att) || grad(es) ||
                      grad(ek) || grad(ev));
  if (!track) {  // no node: no saved tensors, no copy of the output
    at::AutoDispatchBelowADInplaceOrView guard;
    auto [out, lse, alpha, rng_state] = fwd_op().call(
        rowptr, col, kind, query, key, value, att, scale, negative_slope,
        strategy, max_in_degree, windows, stage_nodes, es, ek, ev, dropout,
        attention, attention_perm);
    return {out, lse, alpha};
  }
  auto outs = FusedAttention::apply(
      query, key, value, att, es, ek, ev,
      GraphArgs{rowptr, col, colptr, csc_row, csc_perm, kind, scale,
                negative_slope, strategy, max_in_degree, windows, stage_nodes,
                col_windows, col_stage_nodes, max_out_degree, dropout,
                attention, attention_perm});
  return {outs[0], outs[1], outs[2]};
}

}  // namespace

TORCH_LIBRARY_FRAGMENT(pyg_dfgnn, m) {
  m.def(
      "fused_attention(Tensor rowptr, Tensor col, Tensor? colptr, "
      "Tensor? csc_row, Tensor? csc_perm, int kind, Tensor query, "
      "Tensor key, Tensor value, Tensor? att, float scale, "
      "float negative_slope, int strategy, int max_in_degree, "
      "Tensor? windows, int stage_nodes, Tensor? col_windows, "
      "int col_stage_nodes, int max_out_degree=-1, Tensor? edge_score=None, "
      "Tensor? edge_key=None, Tensor? edge_value=None, float dropout=0., "
      "int attention=0, Tensor? attention_perm=None) "
      "-> (Tensor, Tensor, Tensor)");
}

TORCH_LIBRARY_IMPL(pyg_dfgnn, CUDA, m) {
  m.impl("fused_attention", &fused_attention_cuda);
}

TORCH_LIBRARY_IMPL(pyg_dfgnn, Autograd, m) {
  m.impl("fused_attention", &fused_attention_autograd);
}

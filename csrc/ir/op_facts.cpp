#include "ir/op_facts.h"

#include <algorithm>

#include <string>
#include <unordered_map>

namespace tcap::ir {
namespace {

constexpr uint32_t P = static_cast<uint32_t>(OpFact::Pointwise);
constexpr uint32_t V = static_cast<uint32_t>(OpFact::View);
constexpr uint32_t R = static_cast<uint32_t>(OpFact::Recomputable);
constexpr uint32_t N = static_cast<uint32_t>(OpFact::FreshResult);
constexpr uint32_t F = static_cast<uint32_t>(OpFact::FloatOnly);
constexpr uint32_t D = static_cast<uint32_t>(OpFact::Reduction);
constexpr uint32_t C = static_cast<uint32_t>(OpFact::Collective);

struct Row {
  const char* op;
  uint32_t flags;
  const char* twin;
};

// One row per operator. Pointwise math is recomputable and returns a fresh tensor; views
// are recomputable (they cost nothing). Matmuls return fresh tensors but are never
// recomputed (they are the expensive ops the min-cut partitioner saves).
constexpr Row kRows[] = {
    // unary pointwise
    {"aten::neg", P | R | N, "aten::neg_"},
    {"aten::abs", P | R | N, "aten::abs_"},
    {"aten::sign", P | R | N, "aten::sign_"},
    {"aten::exp", P | R | N | F, "aten::exp_"},
    {"aten::exp2", P | R | N | F, "aten::exp2_"},
    {"aten::expm1", P | R | N | F, "aten::expm1_"},
    {"aten::log", P | R | N | F, "aten::log_"},
    {"aten::log1p", P | R | N | F, "aten::log1p_"},
    {"aten::log2", P | R | N | F, "aten::log2_"},
    {"aten::sin", P | R | N | F, "aten::sin_"},
    {"aten::cos", P | R | N | F, "aten::cos_"},
    {"aten::tan", P | R | N | F, "aten::tan_"},
    {"aten::tanh", P | R | N | F, "aten::tanh_"},
    {"aten::atan", P | R | N | F, ""},
    {"aten::asin", P | R | N | F, ""},
    {"aten::acos", P | R | N | F, ""},
    {"aten::sinh", P | R | N | F, ""},
    {"aten::cosh", P | R | N | F, ""},
    {"aten::asinh", P | R | N | F, ""},
    {"aten::acosh", P | R | N | F, ""},
    {"aten::atanh", P | R | N | F, ""},
    {"aten::erf", P | R | N | F, "aten::erf_"},
    {"aten::erfc", P | R | N | F, ""},
    {"aten::sqrt", P | R | N | F, "aten::sqrt_"},
    {"aten::rsqrt", P | R | N | F, "aten::rsqrt_"},
    {"aten::reciprocal", P | R | N | F, "aten::reciprocal_"},
    {"aten::square", P | R | N, "aten::square_"},
    {"aten::floor", P | R | N | F, ""},
    {"aten::ceil", P | R | N | F, ""},
    {"aten::round", P | R | N | F, ""},
    {"aten::trunc", P | R | N | F, ""},
    {"aten::frac", P | R | N, ""},
    {"aten::sigmoid", P | R | N | F, "aten::sigmoid_"},
    {"aten::relu", P | R | N, "aten::relu_"},
    {"aten::silu", P | R | N | F, ""},
    {"aten::gelu", P | R | N | F, ""},
    {"aten::mish", P | N | F, ""},
    {"aten::hardtanh", P | R | N, ""},
    {"aten::hardsigmoid", P | N | F, ""},
    {"aten::hardswish", P | N | F, ""},
    {"aten::leaky_relu", P | R | N, ""},
    {"aten::elu", P | R | N | F, ""},
    {"aten::softplus", P | R | N | F, ""},
    {"aten::threshold", P | R | N, ""},
    {"aten::clamp", P | R | N, ""},
    {"aten::clamp_min", P | R | N, ""},
    {"aten::clamp_max", P | R | N, ""},
    {"aten::logical_not", P | R | N, ""},
    {"aten::logical_and", P | N, ""},
    {"aten::logical_or", P | N, ""},
    {"aten::isnan", P | N, ""},
    // binary / ternary pointwise
    {"aten::add", P | R | N, "aten::add_"},
    {"aten::sub", P | R | N, "aten::sub_"},
    {"aten::rsub", P | R | N, ""},
    {"aten::mul", P | R | N, "aten::mul_"},
    {"aten::div", P | R | N | F, "aten::div_"},
    {"aten::pow", P | R | N | F, ""},
    {"aten::maximum", P | R | N, ""},
    {"aten::minimum", P | R | N, ""},
    {"aten::eq", P | R | N, ""},
    {"aten::ne", P | R | N, ""},
    {"aten::lt", P | R | N, ""},
    {"aten::le", P | R | N, ""},
    {"aten::gt", P | R | N, ""},
    {"aten::ge", P | R | N, ""},
    {"aten::where", P | R | N, ""},
    {"aten::masked_fill", P | R | N, ""},
    {"aten::addcmul", P | R | N, ""},
    {"aten::addcdiv", P | R | N | F, ""},
    {"aten::lerp", P | R | N | F, ""},
    // pointwise backward formulas
    {"aten::threshold_backward", P | N, ""},
    {"aten::sigmoid_backward", P | N, ""},
    {"aten::tanh_backward", P | N, ""},
    {"aten::gelu_backward", P | N, ""},
    {"aten::silu_backward", P | N, ""},
    {"aten::hardtanh_backward", P | N, ""},
    {"aten::leaky_relu_backward", P | N, ""},
    {"aten::elu_backward", P | N, ""},
    {"aten::hardsigmoid_backward", P | N, ""},
    {"aten::hardswish_backward", P | N, ""},
    {"aten::softplus_backward", P | N, ""},
    {"aten::mse_loss_backward", P | N, ""},
    // copies, casts and fills
    {"aten::_to_copy", P | R | N, ""},
    {"aten::to", R, ""},
    {"aten::clone", P | R | N, ""},
    {"aten::zeros_like", R | N, ""},
    {"aten::ones_like", R | N, ""},
    {"aten::full_like", R | N, ""},
    {"aten::fill", R | N, ""},
    {"aten::lift_fresh", R, ""},
    // views
    {"aten::view", V | R, ""},
    {"aten::_unsafe_view", V | R, ""},
    {"aten::reshape", V | R, ""},
    {"aten::expand", V | R, ""},
    {"aten::permute", V | R, ""},
    {"aten::t", V | R, ""},
    {"aten::transpose", V | R, ""},
    {"aten::unsqueeze", V | R, ""},
    {"aten::squeeze", V | R, ""},
    {"aten::slice", V | R, ""},
    {"aten::select", V | R, ""},
    {"aten::alias", V | R, ""},
    {"aten::detach", V | R, ""},
    {"aten::as_strided", V, ""},
    {"aten::unbind", V, ""},
    {"aten::split", V, ""},
    {"aten::split_with_sizes", V, ""},
    {"aten::chunk", V, ""},
    {"aten::narrow", V, ""},
    // reductions and row ops
    {"aten::sum", D | N, ""},
    {"aten::mean", D | N | F, ""},
    {"aten::amax", D | N, ""},
    {"aten::amin", D | N, ""},
    {"aten::mse_loss", D | N, ""},
    {"aten::_softmax", D | N | F, ""},
    {"aten::_log_softmax", D | N | F, ""},
    {"aten::_softmax_backward_data", D | N, ""},
    {"aten::_log_softmax_backward_data", D | N, ""},
    {"aten::native_layer_norm", D | N | F, ""},
    {"aten::native_layer_norm_backward", D | N | F, ""},
    // matmuls: fresh results, never recomputed
    {"aten::mm", N, ""},
    {"aten::addmm", N, ""},
    {"aten::bmm", N, ""},
    {"aten::baddbmm", N, ""},
    // collectives of tcap::DistributedDataParallel (csrc/distributed/collectives.cpp)
    {"tcap_dist::ddp_all_reduce", C, ""},
    {"tcap_dist::ddp_broadcast", C, ""},
};

const std::unordered_map<std::string_view, OpFacts>& table() {
  static const auto* t = [] {
    auto* m = new std::unordered_map<std::string_view, OpFacts>();
    for (const Row& r : kRows) m->emplace(r.op, OpFacts{r.flags, r.twin});
    return m;
  }();
  return *t;
}

}  // namespace

const OpFacts& op_facts(std::string_view op) {
  static const OpFacts none;
  const auto& t = table();
  auto it = t.find(op);
  return it == t.end() ? none : it->second;
}

std::vector<std::string> ops_with_facts() {
  std::vector<std::string> out;
  for (const Row& r : kRows) out.emplace_back(r.op);
  return out;
}

std::vector<size_t> hidden_writes(const Node& n) {
  if (n.kind != NodeKind::Call) return {};
  if (n.op != "aten::native_batch_norm" && n.op != "aten::cudnn_batch_norm" && n.op != "aten::miopen_batch_norm") {
    return {};
  }
  // (input, weight, bias, running_mean, running_var, training, momentum, eps)
  if (n.args.size() < 6 || n.args[5].kind != ArgKind::Bool || n.args[5].i == 0) return {};
  std::vector<size_t> out;
  for (size_t i : {3, 4}) {
    if (!n.args[i].values.empty()) out.push_back(i);
  }
  return out;
}

std::vector<size_t> hidden_written_inputs(const Graph& g) {
  std::vector<size_t> out;
  const auto inputs = g.input_nodes();
  for (const auto& n : g.nodes()) {
    for (size_t i : hidden_writes(n)) {
      const Node& p = g.node(g.value(g.alias_root(n.args[i].values.at(0))).producer);
      if (p.kind != NodeKind::Input) continue;
      const auto pos = static_cast<size_t>(std::find(inputs.begin(), inputs.end(), p.id) - inputs.begin());
      if (std::find(out.begin(), out.end(), pos) == out.end()) out.push_back(pos);
    }
  }
  return out;
}

}  // namespace tcap::ir

#include "ir/op_facts.h"

#include <ATen/core/dispatch/Dispatcher.h>

#include <algorithm>
#include <mutex>

#include <string>
#include <unordered_map>
#include <unordered_set>

namespace tcap::ir {
namespace {

constexpr uint32_t P = static_cast<uint32_t>(OpFact::Pointwise);
constexpr uint32_t V = static_cast<uint32_t>(OpFact::View);
constexpr uint32_t R = static_cast<uint32_t>(OpFact::Recomputable);
constexpr uint32_t N = static_cast<uint32_t>(OpFact::FreshResult);
constexpr uint32_t F = static_cast<uint32_t>(OpFact::FloatOnly);
constexpr uint32_t D = static_cast<uint32_t>(OpFact::Reduction);
constexpr uint32_t C = static_cast<uint32_t>(OpFact::Collective);
constexpr uint32_t K = static_cast<uint32_t>(OpFact::KeepsOffset);
constexpr uint32_t S = static_cast<uint32_t>(OpFact::UpdateStep);
constexpr uint32_t M = static_cast<uint32_t>(OpFact::Norm);
constexpr uint32_t T = static_cast<uint32_t>(OpFact::TrustsArguments);
constexpr uint32_t A = static_cast<uint32_t>(OpFact::Arithmetic);
constexpr uint32_t X = static_cast<uint32_t>(OpFact::Commutative);
constexpr uint32_t G = static_cast<uint32_t>(OpFact::RunsTableKernel);
// Pointwise although LibTorch does not tag it so (Note [Pointwise from the schema tags]).
constexpr uint32_t U = static_cast<uint32_t>(OpFact::Pointwise);

struct Row {
  const char* op;
  uint32_t flags;
  const char* twin;
};

// One row per operator. Pointwise math is recomputable and returns a fresh tensor; views
// are recomputable (they cost nothing). Matmuls return fresh tensors but are never
// recomputed (they are the expensive ops the min-cut partitioner saves). Pointwise comes
// from LibTorch's tags (Note [Pointwise from the schema tags]); U marks the rows LibTorch
// does not tag.
constexpr Row kRows[] = {
    // unary pointwise
    {"aten::neg", R | N, "aten::neg_"},
    {"aten::abs", R | N, "aten::abs_"},
    {"aten::sign", R | N, "aten::sign_"},
    {"aten::exp", R | N | F, "aten::exp_"},
    {"aten::exp2", R | N | F, "aten::exp2_"},
    {"aten::expm1", R | N | F, "aten::expm1_"},
    {"aten::log", R | N | F, "aten::log_"},
    {"aten::log1p", R | N | F, "aten::log1p_"},
    {"aten::log2", R | N | F, "aten::log2_"},
    {"aten::sin", R | N | F, "aten::sin_"},
    {"aten::cos", R | N | F, "aten::cos_"},
    {"aten::tan", R | N | F, "aten::tan_"},
    {"aten::tanh", R | N | F, "aten::tanh_"},
    {"aten::atan", R | N | F, ""},
    {"aten::asin", R | N | F, ""},
    {"aten::acos", R | N | F, ""},
    {"aten::sinh", R | N | F, ""},
    {"aten::cosh", R | N | F, ""},
    {"aten::asinh", R | N | F, ""},
    {"aten::acosh", R | N | F, ""},
    {"aten::atanh", R | N | F, ""},
    {"aten::erf", R | N | F, "aten::erf_"},
    {"aten::erfc", R | N | F, ""},
    {"aten::sqrt", R | N | F, "aten::sqrt_"},
    {"aten::rsqrt", R | N | F, "aten::rsqrt_"},
    {"aten::reciprocal", R | N | F, "aten::reciprocal_"},
    {"aten::square", R | N, "aten::square_"},
    {"aten::floor", R | N | F, ""},
    {"aten::ceil", R | N | F, ""},
    {"aten::round", R | N | F, ""},
    {"aten::trunc", R | N | F, ""},
    {"aten::frac", R | N, ""},
    {"aten::sigmoid", R | N | F, "aten::sigmoid_"},
    {"aten::relu", R | N, "aten::relu_"},
    {"aten::silu", R | N | F, ""},
    {"aten::gelu", R | N | F, ""},
    {"aten::mish", N | F, ""},
    {"aten::hardtanh", R | N, ""},
    {"aten::hardsigmoid", N | F, ""},
    {"aten::hardswish", U | N | F, ""},
    {"aten::leaky_relu", U | R | N, ""},
    {"aten::elu", R | N | F, ""},
    {"aten::softplus", R | N | F, ""},
    {"aten::threshold", R | N, ""},
    {"aten::clamp", R | N, ""},
    {"aten::clamp_min", R | N, ""},
    {"aten::clamp_max", R | N, ""},
    {"aten::logical_not", R | N, ""},
    {"aten::logical_and", N, ""},
    {"aten::logical_or", N, ""},
    {"aten::isnan", N, ""},
    // binary / ternary pointwise
    {"aten::add", R | N | A | X, "aten::add_"},
    {"aten::sub", R | N | A, "aten::sub_"},
    {"aten::rsub", R | N, ""},
    {"aten::mul", R | N | A | X, "aten::mul_"},
    {"aten::div", R | N | F | A, "aten::div_"},
    {"aten::pow", R | N | F, ""},
    {"aten::maximum", R | N, ""},
    {"aten::minimum", R | N, ""},
    {"aten::eq", R | N, ""},
    {"aten::ne", R | N, ""},
    {"aten::lt", R | N, ""},
    {"aten::le", R | N, ""},
    {"aten::gt", R | N, ""},
    {"aten::ge", R | N, ""},
    {"aten::where", R | N, ""},
    {"aten::masked_fill", R | N, ""},
    {"aten::addcmul", R | N, ""},
    {"aten::addcdiv", R | N | F, ""},
    {"aten::lerp", R | N | F, ""},
    // pointwise backward formulas
    {"aten::threshold_backward", N, ""},
    {"aten::sigmoid_backward", N, ""},
    {"aten::tanh_backward", N, ""},
    {"aten::gelu_backward", N, ""},
    {"aten::silu_backward", N, ""},
    {"aten::hardtanh_backward", U | N, ""},
    {"aten::leaky_relu_backward", U | N, ""},
    {"aten::elu_backward", U | N, ""},
    {"aten::hardsigmoid_backward", U | N, ""},
    {"aten::hardswish_backward", U | N, ""},
    {"aten::softplus_backward", U | N, ""},
    {"aten::mse_loss_backward", U | N, ""},
    // copies, casts and fills
    {"aten::_to_copy", U | R | N, ""},
    {"aten::to", R, ""},
    {"aten::clone", R | N, ""},
    {"aten::zeros_like", R | N, ""},
    {"aten::ones_like", R | N, ""},
    {"aten::full_like", R | N, ""},
    {"aten::fill", R | N, ""},
    {"aten::lift_fresh", R, ""},
    // views
    {"aten::view", V | R | K, ""},
    {"aten::_unsafe_view", V | R, ""},
    {"aten::reshape", V | R, ""},
    {"aten::expand", V | R | K, ""},
    {"aten::permute", V | R | K, ""},
    {"aten::t", V | R | K, ""},
    {"aten::transpose", V | R | K, ""},
    {"aten::unsqueeze", V | R | K, ""},
    {"aten::squeeze", V | R | K, ""},
    {"aten::slice", V | R, ""},
    {"aten::select", V | R, ""},
    {"aten::alias", V | R | K, ""},
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
    {"aten::logsumexp", D | N | F, ""},
    {"aten::mse_loss", D | N, ""},
    {"aten::_softmax", D | N | F, ""},
    {"aten::_log_softmax", D | N | F, ""},
    {"aten::_softmax_backward_data", D | N, ""},
    {"aten::_log_softmax_backward_data", D | N, ""},
    {"aten::native_layer_norm", D | N | F, ""},
    {"aten::native_layer_norm_backward", D | N | F | T, ""},
    {"aten::linalg_vector_norm", M, ""},
    {"aten::norm", M, ""},
    {"aten::max", M, ""},
    // the in-place ops an optimizer's update is made of (compile_step's capture comparison, step/step_captures.h)
    {"aten::add_", S, ""},
    {"aten::sub_", S, ""},
    {"aten::mul_", S, ""},
    {"aten::addcdiv_", S, ""},
    {"aten::addcmul_", S, ""},
    // fused optimizer steps (multi-tensor kernels that index their lists by the first)
    {"aten::_fused_adam_", T, ""},
    {"aten::_fused_adamw_", T, ""},
    {"aten::_fused_sgd_", T, ""},
    // matmuls: fresh results, never recomputed
    {"aten::mm", N, ""},
    {"aten::addmm", N, ""},
    {"aten::bmm", N, ""},
    {"aten::baddbmm", N, ""},
    // collectives of tcap::DistributedDataParallel (csrc/distributed/collectives.cpp)
    {"tcap_dist::ddp_all_reduce", C, ""},
    {"tcap_dist::ddp_broadcast", C, ""},
    // generated kernels of a compiled graph (runtime/fused_kernel.h)
    {"tcap::fused", G, ""},
    {"tcap::fused_horizontal", G, ""},
};

// Operator names ("aten::mul") with an overload LibTorch tags pointwise.
std::unordered_set<std::string> tagged_pointwise() {
  std::unordered_set<std::string> out;
  for (const c10::OperatorName& name : c10::Dispatcher::singleton().getAllOpNames()) {
    auto schema = c10::Dispatcher::singleton().findSchema(name);
    if (schema && schema->hasTag(at::Tag::pointwise)) out.insert(name.name);
  }
  return out;
}

const std::unordered_map<std::string_view, OpFacts>& table() {
  static const auto* t = [] {
    const auto pointwise = tagged_pointwise();
    auto* m = new std::unordered_map<std::string_view, OpFacts>();
    for (const Row& r : kRows) {
      const uint32_t tag = pointwise.count(r.op) ? static_cast<uint32_t>(OpFact::Pointwise) : 0u;
      m->emplace(r.op, OpFacts{r.flags | tag, r.twin});
    }
    return m;
  }();
  return *t;
}

}  // namespace

bool has_dynamic_output_shape_tag(const std::string& op, const std::string& overload) {
  static std::mutex mu;
  static std::unordered_map<std::string, bool> known;
  const std::string key = overload.empty() ? op : op + "." + overload;
  std::lock_guard<std::mutex> lock(mu);
  auto it = known.find(key);
  if (it != known.end()) return it->second;
  auto& d = c10::Dispatcher::singleton();
  bool tagged = false;
  if (auto h = d.findOp({op, overload})) tagged = h->hasTag(at::Tag::dynamic_output_shape);
  if (!tagged && !overload.empty()) {
    if (auto functional = d.findOp({op, ""})) tagged = functional->hasTag(at::Tag::dynamic_output_shape);
  }
  known.emplace(key, tagged);
  return tagged;
}

std::string join_input_names(const std::vector<std::string>& names) {
  std::string out;
  for (const auto& n : names) out += (out.empty() ? "" : ", ") + n;
  return out;
}

bool lists_input(const std::string& joined, const std::string& name) {
  if (name.empty()) return true;  // an input without a name cannot be told apart
  for (size_t at = joined.find(name); at != std::string::npos; at = joined.find(name, at + 1)) {
    const bool starts = at == 0 || joined.compare(at - 2, 2, ", ") == 0;
    const size_t end = at + name.size();
    const bool ends = end == joined.size() || joined.compare(end, 2, ", ") == 0;
    if (starts && ends) return true;
  }
  return false;
}

bool sizes_from_values(const Graph& g, const Node& n) {
  if (n.kind != NodeKind::Call || !has_dynamic_output_shape_tag(n.op, n.overload)) return false;
  if (n.op != "aten::index") return true;
  // A boolean (or uint8) index selects by value; integer indices give their own shape.
  bool mask = false;
  if (n.args.size() > 1) {
    for (ValueId v : n.args[1].values) {
      if (v == kNoValue) continue;
      const auto t = g.value(v).meta.dtype;
      mask = mask || t == c10::ScalarType::Bool || t == c10::ScalarType::Byte;
    }
  }
  return mask;
}

bool reads_on_host(const Graph& g, const Node& n) {
  if (n.kind != NodeKind::Call) return false;
  return std::any_of(n.outputs.begin(), n.outputs.end(), is_host_value) || sizes_from_values(g, n);
}

namespace {
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

std::vector<std::string> pointwise_without_tag() {
  std::vector<std::string> out;
  for (const Row& r : kRows) {
    if (r.flags & static_cast<uint32_t>(OpFact::Pointwise)) out.emplace_back(r.op);
  }
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

const Node* input_aliased_by(const Graph& g, ValueId v) {
  const Node& p = g.node(g.value(g.alias_root(v)).producer);
  return p.kind == NodeKind::Input ? &p : nullptr;
}

std::vector<size_t> hidden_written_inputs(const Graph& g) {
  std::vector<size_t> out;
  const auto inputs = g.input_nodes();
  for (const auto& n : g.nodes()) {
    for (size_t i : hidden_writes(n)) {
      const Node* p = input_aliased_by(g, n.args[i].values.at(0));
      if (!p) continue;
      const auto pos = static_cast<size_t>(std::find(inputs.begin(), inputs.end(), p->id) - inputs.begin());
      if (std::find(out.begin(), out.end(), pos) == out.end()) out.push_back(pos);
    }
  }
  return out;
}

}  // namespace tcap::ir

#include <tcap/interpreter.h>

#include "interp/direct_calls.h"
#include "interp/hook_runner.h"
#include "interp/trusted_arguments.h"
#include "interp/unboxed_calls.h"
#include "ir/op_facts.h"
#include "ir/printable.h"
#include "ir/verify_args.h"
#include "support/logging.h"

#include <ATen/ScalarOps.h>
#include <ATen/core/LegacyTypeDispatch.h>
#include <ATen/core/List.h>
#include <ATen/core/stack.h>
#include <ATen/record_function.h>
#include <c10/core/GradMode.h>
#include <c10/core/impl/LocalDispatchKeySet.h>
#include <torch/version.h>

#include <atomic>
#include <cmath>
#include <sstream>

namespace tcap {
namespace {

// Messages quote names from the graph (which may come from a file) and kernels' own
// messages: control characters are escaped, and the length is bounded.
constexpr size_t kMaxErrorBytes = 16384;

// "node %3 (aten::mul.Tensor)", "node %0 (input 'x')", "node %5 (call_hook #1)".
std::string node_label(const ir::Node& n) {
  std::string what;
  switch (n.kind) {
    case ir::NodeKind::Call: what = n.qualified_op(); break;
    case ir::NodeKind::Input: what = "input '" + n.name + "'"; break;
    case ir::NodeKind::CallHook: what = "call_hook #" + std::to_string(n.hook); break;
    case ir::NodeKind::Output: what = "output"; break;
  }
  return "node %" + std::to_string(n.id) + " (" + ir::printable(what, 200) + ")";
}

std::string error_prefix(const ir::Node& n) { return "tcap interpreter: " + node_label(n) + ": "; }

[[noreturn]] void fail(const ir::Node& n, const std::string& what) {
  throw c10::Error(ir::printable(error_prefix(n) + what, kMaxErrorBytes, /*keep_lines=*/true));
}

// Rethrows an error raised while node `n` ran, naming the node (once). An allocation
// failure keeps its type, so callers can still tell it apart.
[[noreturn]] void rethrow_naming(const ir::Node& n, const std::exception& e, bool out_of_memory) {
  const auto* c10_error = dynamic_cast<const c10::Error*>(&e);
  std::string msg = c10_error ? c10_error->what_without_backtrace() : e.what();
  const std::string prefix = error_prefix(n);
  if (msg.compare(0, prefix.size(), prefix) != 0) msg = prefix + msg;
  msg = ir::printable(msg, kMaxErrorBytes, /*keep_lines=*/true);
  if (out_of_memory) throw c10::OutOfMemoryError(msg);
  throw c10::Error(msg);
}

thread_local const interp::HookRunner* tls_hook_runner = nullptr;

// Whether a value read on the host is the one recorded (two NaNs are the same reading).
bool same_reading(const ir::Arg& recorded, const c10::IValue& v) {
  if (recorded.kind == ir::ArgKind::Bool && v.isBool()) return (recorded.i != 0) == v.toBool();
  if (recorded.kind == ir::ArgKind::Int && v.isInt()) return recorded.i == v.toInt();
  if (recorded.kind == ir::ArgKind::Double && v.isDouble()) {
    const double d = v.toDouble();
    return recorded.d == d || (std::isnan(recorded.d) && std::isnan(d));
  }
  return false;
}

void check_host_value(const ir::Node& n, const ir::Arg& recorded, const c10::IValue& v) {
  if (same_reading(recorded, v)) return;
  std::ostringstream was, now;
  if (recorded.kind == ir::ArgKind::Bool) was << (recorded.i ? "true" : "false");
  else if (recorded.kind == ir::ArgKind::Int) was << recorded.i;
  else was << recorded.d;
  if (v.isBool()) now << (v.toBool() ? "true" : "false");
  else if (v.isInt()) now << v.toInt();
  else if (v.isDouble()) now << v.toDouble();
  else now << v.tagKind();
  throw HostValueChanged({__func__, __FILE__, static_cast<uint32_t>(__LINE__)},
                         "the value read on the host by " + n.qualified_op() + " (node %" + std::to_string(n.id) +
                             ") changed: " + was.str() + " -> " + now.str());
}

// Note [Sizes that come from values] (ir/op_facts.h): the sizes of n's results, which its
// inputs' values decide, against the recorded ones.
void check_result_sizes(const ir::Graph& g, const ir::Node& n, const std::vector<at::Tensor>& env) {
  for (size_t r = 0; r < n.outputs.size(); ++r) {
    for (ir::ValueId v : n.outputs[r].values) {
      if (v == ir::kNoValue) continue;
      const at::Tensor& t = env[static_cast<size_t>(v)];
      const auto& want = g.value(v).meta.sizes;
      if (!t.defined() || t.sizes() == c10::IntArrayRef(want)) continue;
      std::ostringstream os;
      os << "the sizes of result " << r << " of " << n.qualified_op() << " (node %" << n.id
         << "), which come from its inputs' values, changed: " << c10::IntArrayRef(want) << " -> " << t.sizes();
      throw HostValueChanged({__func__, __FILE__, static_cast<uint32_t>(__LINE__)}, os.str());
    }
  }
}

}  // namespace

namespace interp {
thread_local std::vector<c10::IValue>* tls_host_values = nullptr;

HostValuesScope::HostValuesScope(std::vector<c10::IValue>* sink) : prev_(tls_host_values) { tls_host_values = sink; }
HostValuesScope::~HostValuesScope() { tls_host_values = prev_; }
std::vector<c10::IValue>* host_values_sink() { return tls_host_values; }

HookRunnerScope::HookRunnerScope(const HookRunner* runner) : prev_(tls_hook_runner) { tls_hook_runner = runner; }
HookRunnerScope::~HookRunnerScope() { tls_hook_runner = prev_; }
const HookRunner* current_hook_runner() { return tls_hook_runner; }
}  // namespace interp

Interpreter::Interpreter(const ir::Graph& graph, bool differentiable, std::shared_ptr<const interp::DirectCalls> kernels)
    : graph_(graph), differentiable_(differentiable) {
  ops_.resize(graph.nodes().size());
  schemas_.resize(graph.nodes().size(), nullptr);
  for (const auto& n : graph.nodes()) {
    if (n.kind != ir::NodeKind::Call) continue;
    auto op = c10::Dispatcher::singleton().findSchema({n.op, n.overload});
    if (!op) fail(n, "operator not found in this LibTorch (" + std::string(TORCH_VERSION) + ")");
    if (op->schema().arguments().size() != n.args.size()) {
      fail(n, "recorded with " + std::to_string(n.args.size()) + " arguments but this LibTorch's schema has " +
                  std::to_string(op->schema().arguments().size()));
    }
    for (const auto& a : n.args) {
      if (a.kind == ir::ArgKind::Opaque) {
        fail(n, "argument '" + a.name + "' is an opaque " + a.s + " and cannot be replayed");
      }
    }
    ops_[static_cast<size_t>(n.id)] = *op;
    schemas_[static_cast<size_t>(n.id)] = &ops_[static_cast<size_t>(n.id)]->schema();
    // Note [Direct fused calls]
    // A tcap::fused node names a kernel by its place in the table of the compiled graph it
    // belongs to (runtime::KernelTable: the graph owns its kernels; no registry outside
    // it). The kernel is found once, here, and a run calls it directly: no Tensor[] boxed
    // into an IValue list, no dispatcher. Under a mode key (a capture recording this
    // replay) a run calls the ATen ops the kernel stands for instead (run()), so what is
    // recorded is ATen ops and never a node only this table can run. Below autograd only:
    // the graph already holds its backward.
    if (ir::op_has(n.op, ir::OpFact::RunsTableKernel)) {
      if (differentiable) fail(n, "runs a generated kernel, which runs only below autograd");
      if (!kernels) {
        fail(n, "runs a generated kernel, which runs only with the kernel table of the compiled graph it belongs to "
                "(replay the graph dumped before fusion instead)");
      }
      std::shared_ptr<interp::DirectCall> direct;
      try {
        direct = kernels->find(n);
      } catch (const c10::Error& e) {
        fail(n, e.what_without_backtrace());
      }
      direct_.resize(graph.nodes().size());
      direct_[static_cast<size_t>(n.id)] = std::move(direct);
    }
    if (interp::trusts_its_arguments(n)) {
      trusting_.resize(graph.nodes().size(), 0);
      trusting_[static_cast<size_t>(n.id)] = 1;
    }
    if (ir::sizes_from_values(graph, n)) {
      sizes_from_values_.resize(graph.nodes().size(), 0);
      sizes_from_values_[static_cast<size_t>(n.id)] = 1;
    }
  }
  // A graph that passes verify() is one the interpreter can run without crashing: every
  // id in range, CallHook nodes shaped as run_hook reads them, and every argument of a
  // known operator of the type its schema declares (Note [Arguments against the schema]).
  // Operators resolve through the dispatcher (above), so the schema strings the graph
  // carries play no part in replay; graphs rewritten by passes may lack some, and the
  // copy drops them before it is verified.
  graph_.schemas().clear();
  try {
    ir::verify(graph_);
  } catch (const c10::Error& e) {
    throw c10::Error(ir::printable(std::string("tcap interpreter: the graph fails verify(): ") +
                                       e.what_without_backtrace(),
                                   kMaxErrorBytes, /*keep_lines=*/true));
  }
  // Note [Prepared argument stacks]
  // A run used to build every argument of every node as an IValue per call: an int list
  // (a view's sizes) allocated a c10::List, a Device parsed its string, a wrapped scalar
  // allocated a tensor. Constants are built once here instead; a run copies the node's
  // stack (reference counts) and fills in its tensors. The constants are shared by all
  // runs: kernels do not write into int lists or wrapped-number arguments. An argument
  // that reads a host scalar input (Note [Host scalars as graph inputs]) is a number in
  // the prepared stack too, written by each run from its input.
  prepared_.assign(graph_.nodes().size(), {});
  for (const auto& n : graph_.nodes()) {
    if (n.kind != ir::NodeKind::Call) continue;
    const auto& sa = schemas_[static_cast<size_t>(n.id)]->arguments();
    auto& stack = prepared_[static_cast<size_t>(n.id)];
    for (size_t i = 0; i < n.args.size(); ++i) {
      if (n.args[i].kind == ir::ArgKind::Value) {
        const ir::ValueId v = n.args[i].values.at(0);
        if (ir::is_host_scalar(graph_, v)) {
          ScalarUse u{n.id, i, v, scalar_use_kind(sa[i])};
          if (u.kind == ScalarUse::Kind::None) fail(n, "argument '" + sa[i].name() + "' cannot take a host scalar");
          scalar_uses_.push_back(u);
          scalar_node_.resize(graph_.nodes().size(), 0);
          scalar_node_[static_cast<size_t>(n.id)] |= kReadsHostScalar;
          if (u.kind == ScalarUse::Kind::Tensor) scalar_node_[static_cast<size_t>(n.id)] |= kReadsWrappedHostScalar;
          stack.push_back(scalar_ivalue(u.kind, 0.0));
          continue;
        }
      }
      stack.push_back(n.args[i].refers_to_values() ? c10::IValue() : to_ivalue(n, i, sa[i]));
    }
  }
  // Note [Unboxed extern calls]: below autograd only, as for fused kernels.
  if (!differentiable) {
    for (const auto& n : graph_.nodes()) {
      const auto id = static_cast<size_t>(n.id);
      if (n.kind != ir::NodeKind::Call || (id < direct_.size() && direct_[id])) continue;
      if (reads_wrapped_host_scalar(n.id)) continue;  // its adapter would read the input's tensor
      if (auto u = interp::make_unboxed_call(n, *ops_[id], prepared_[id])) {
        unboxed_.resize(graph_.nodes().size());
        unboxed_[id] = std::move(u);
      }
    }
  }
  input_nodes_ = graph_.input_nodes();
  output_values_ = graph_.output_values();
  // Values are freed after their last reader; an alias (a view, a newer version) holds
  // its own reference to the tensor, so only this value's slot goes. Outputs stay. A value
  // nobody reads (an input only a fallback would need, an op's unused result such as
  // layer norm's mean) goes right after the node that made it, not at the end of the run.
  last_uses_.assign(graph.nodes().size(), {});
  const std::vector<ir::NodeId> last = graph.last_readers();
  for (size_t v = 0; v < last.size(); ++v) {
    ir::NodeId at = last[v];
    if (at >= 0 && graph.node(at).kind == ir::NodeKind::Output) continue;
    if (at < 0) at = graph.value(static_cast<ir::ValueId>(v)).producer;
    if (at >= 0) last_uses_[static_cast<size_t>(at)].push_back(static_cast<ir::ValueId>(v));
  }
}

const at::Tensor& Interpreter::get(const ir::Node& n, ir::ValueId v) const {
  const at::Tensor& t = env_.at(static_cast<size_t>(v));
  if (!t.defined()) fail(n, "reads %" + std::to_string(v) + ", which has no tensor");
  return t;
}

namespace {

// The element type of a list argument's declared type (through Optional), or nullptr.
const c10::Type* list_element(const c10::Argument& sa) {
  const c10::Type* t = sa.real_type().get();
  if (const auto* opt = t->castRaw<c10::OptionalType>()) t = opt->getElementType().get();
  const auto* list = t->castRaw<c10::ListType>();
  return list ? list->getElementType().get() : nullptr;
}

bool is_tensor_or_optional_tensor(const c10::Type* t, bool optional) {
  if (const auto* opt = t->castRaw<c10::OptionalType>()) return optional && opt->getElementType()->kind() == c10::TypeKind::TensorType;
  return !optional && t->kind() == c10::TypeKind::TensorType;
}

}  // namespace

// Arguments are built as the IValues the kernel's schema declares (verify() has checked
// that they fit): an empty list is typed by the schema (capture records an empty SymInt[]
// as an empty value list), and one int passed for an int[N] list becomes a one-entry
// list, as the JIT does.
c10::IValue Interpreter::to_ivalue(const ir::Node& n, size_t i, const c10::Argument& sa) const {
  const ir::Arg& a = n.args[i];
  const c10::Type* elem = list_element(sa);
  switch (a.kind) {
    case ir::ArgKind::None: return c10::IValue();
    case ir::ArgKind::UndefinedTensor: return c10::IValue(at::Tensor());
    case ir::ArgKind::Value: return c10::IValue(get(n, a.values.at(0)));
    case ir::ArgKind::ValueList:
    case ir::ArgKind::OptValueList: {
      if (elem != nullptr && a.values.empty()) {
        switch (elem->kind()) {
          case c10::TypeKind::IntType:
          case c10::TypeKind::SymIntType: return c10::IValue(c10::List<int64_t>());
          case c10::TypeKind::FloatType: return c10::IValue(c10::List<double>());
          case c10::TypeKind::BoolType: return c10::IValue(c10::List<bool>());
          default: break;
        }
      }
      const bool optional = elem != nullptr ? is_tensor_or_optional_tensor(elem, /*optional=*/true)
                                            : a.kind == ir::ArgKind::OptValueList;
      if (!optional) {
        c10::List<at::Tensor> l;
        for (auto v : a.values) l.push_back(get(n, v));
        return c10::IValue(l);
      }
      c10::List<std::optional<at::Tensor>> l;
      for (auto v : a.values) {
        l.push_back(v == ir::kNoValue ? std::optional<at::Tensor>() : std::optional<at::Tensor>(get(n, v)));
      }
      return c10::IValue(l);
    }
    case ir::ArgKind::Bool: return c10::IValue(a.i != 0);
    case ir::ArgKind::Int:
      if (elem != nullptr) return c10::IValue(c10::List<int64_t>({a.i}));
      return c10::IValue(a.i);
    case ir::ArgKind::ScalarType:
    case ir::ArgKind::Layout:
    case ir::ArgKind::MemoryFormat: return c10::IValue(a.i);
    case ir::ArgKind::Double: return c10::IValue(a.d);
    case ir::ArgKind::Complex: return c10::IValue(c10::complex<double>(a.d, a.d_imag));
    case ir::ArgKind::String: return c10::IValue(a.s);
    // SymInt[] arguments take a plain int list: concrete SymInt lists decay to one.
    case ir::ArgKind::IntList: return c10::IValue(c10::List<int64_t>(a.ints));
    case ir::ArgKind::DoubleList: return c10::IValue(c10::List<double>(a.doubles));
    case ir::ArgKind::BoolList: {
      c10::List<bool> l;
      for (auto x : a.ints) l.push_back(x != 0);
      return c10::IValue(l);
    }
    case ir::ArgKind::Device: return c10::IValue(c10::Device(a.s));
    case ir::ArgKind::WrappedScalar: {
      const auto dtype = static_cast<c10::ScalarType>(a.i2);
      c10::Scalar s = c10::isIntegralType(dtype, /*includeBool=*/true)
                          ? (dtype == c10::kBool ? c10::Scalar(a.i != 0) : c10::Scalar(a.i))
                          : c10::isComplexType(dtype) ? c10::Scalar(c10::complex<double>(a.d, a.d_imag))
                                                      : c10::Scalar(a.d);
      at::Tensor t = c10::scalar_to_tensor(s);
      t.unsafeGetTensorImpl()->set_wrapped_number(true);
      return c10::IValue(t);
    }
    case ir::ArgKind::Opaque: break;
  }
  fail(n, "argument " + std::to_string(i) + " cannot be replayed");
}

// Note [Prepared argument stacks]: node n's prepared stack with this run's tensors.
torch::jit::Stack Interpreter::filled_stack(const ir::Node& n) const {
  const auto id = static_cast<size_t>(n.id);
  const auto& schema_args = schemas_[id]->arguments();
  torch::jit::Stack stack = prepared_[id];
  const bool scalars = id < scalar_node_.size() && scalar_node_[id];
  for (size_t i = 0; i < n.args.size(); ++i) {
    if (n.args[i].refers_to_values() && !(scalars && is_scalar_use(n.id, i))) stack[i] = to_ivalue(n, i, schema_args[i]);
  }
  return stack;
}

void Interpreter::run_call(const ir::Node& n, const c10::OperatorHandle& op, const c10::FunctionSchema& schema) {
  torch::jit::Stack stack = filled_stack(n);
  if (static_cast<size_t>(n.id) < trusting_.size() && trusting_[static_cast<size_t>(n.id)]) {
    interp::check_trusted_arguments(n, stack);  // Note [Kernels that trust their arguments]
  }
  op.callBoxed(stack);
  const size_t n_ret = schema.returns().size();
  TORCH_INTERNAL_ASSERT(stack.size() == n_ret);
  for (size_t r = 0; r < n.outputs.size(); ++r) {
    const ir::Arg& out = n.outputs[r];
    if (r >= n_ret) {
      bind_unreturned(out);
      continue;
    }
    const c10::IValue& iv = stack[r];
    if (!out.refers_to_values() && out.kind != ir::ArgKind::UndefinedTensor && out.kind != ir::ArgKind::None) {
      host_values_.push_back(iv);
      if (check_host_values_ && ir::is_host_value(out)) check_host_value(n, out, iv);
    } else if (out.kind == ir::ArgKind::None && (iv.isDouble() || iv.isInt() || iv.isBool())) {
      host_values_.push_back(iv);  // a host read whose recorded value was forgotten: an observation
    }
    if (out.kind == ir::ArgKind::Value) {
      if (!iv.isTensor()) fail(n, "result " + std::to_string(r) + " is a " + iv.tagKind() + ", not the tensor recorded");
      env_[static_cast<size_t>(out.values[0])] = iv.toTensor();
    } else if (out.kind == ir::ArgKind::ValueList || out.kind == ir::ArgKind::OptValueList) {
      if (!iv.isTensorList()) {
        fail(n, "result " + std::to_string(r) + " is a " + iv.tagKind() + ", not the tensor list recorded");
      }
      auto list = iv.toTensorList();
      if (list.size() != out.values.size()) fail(n, "returned a list of a different length than recorded");
      for (size_t k = 0; k < out.values.size(); ++k) {
        if (out.values[k] != ir::kNoValue) env_[static_cast<size_t>(out.values[k])] = list.get(k);
      }
    }
  }
}

// A mutated argument not returned by the op: same buffer as the version it replaces.
void Interpreter::bind_unreturned(const ir::Arg& out) {
  const auto& val = graph_.value(out.values.at(0));
  if (val.version_of != ir::kNoValue) env_[static_cast<size_t>(out.values[0])] = env_[static_cast<size_t>(val.version_of)];
}

// Note [Unboxed extern calls]; false (nothing run) when this run's tensors need the
// dispatcher.
bool Interpreter::run_unboxed(const ir::Node& n, const interp::UnboxedCall& call) {
  if (!call.accepts(env_)) return false;
  const auto id = static_cast<size_t>(n.id);
  if (id < trusting_.size() && trusting_[id]) {
    interp::check_trusted_arguments(n, filled_stack(n));  // Note [Kernels that trust their arguments]
  }
  std::vector<at::Tensor> results = call.run(env_, prepared_[id]);
  TORCH_INTERNAL_ASSERT(results.size() == schemas_[id]->returns().size());
  for (size_t r = 0; r < n.outputs.size(); ++r) {
    const ir::Arg& out = n.outputs[r];
    if (r >= results.size()) {
      bind_unreturned(out);
    } else if (out.kind == ir::ArgKind::Value) {
      env_[static_cast<size_t>(out.values[0])] = std::move(results[r]);
    }
  }
  return true;
}

void Interpreter::run_direct(const ir::Node& n, interp::DirectCall& call, bool as_ops) {
  const auto& in = n.args[0].values;
  std::vector<at::Tensor> inputs;
  inputs.reserve(in.size());
  for (ir::ValueId v : in) inputs.push_back(get(n, v));
  std::vector<at::Tensor> outs = as_ops ? call.call_ops(inputs) : call.call(inputs);
  const auto& out = n.outputs.at(0).values;
  if (outs.size() != out.size()) fail(n, "returned a list of a different length than recorded");
  for (size_t i = 0; i < out.size(); ++i) {
    if (out[i] != ir::kNoValue) env_[static_cast<size_t>(out[i])] = std::move(outs[i]);
  }
}

void Interpreter::run_hook(const ir::Node& n) {
  const auto& outs = n.outputs.at(0).values;
  const ir::Hook& hook = graph_.hooks().at(static_cast<size_t>(n.hook));
  if (hook.slot >= 0) {
    // Note [Opaque hooks]: call the hook object of the current backward.
    const interp::HookRunner* runner = interp::current_hook_runner();
    if (!runner) fail(n, "calls hook slot " + std::to_string(hook.slot) + " but no hook runner is installed");
    auto tensors = [&](size_t arg) {
      std::vector<at::Tensor> ts;
      if (arg >= n.args.size()) return ts;
      for (ir::ValueId v : n.args[arg].values) ts.push_back(v == ir::kNoValue ? at::Tensor() : get(n, v));
      return ts;
    };
    std::vector<at::Tensor> results = (*runner)(hook.slot, tensors(0), tensors(1));
    if (results.size() != outs.size()) {
      fail(n, "the hook returned " + std::to_string(results.size()) + " gradients, " + std::to_string(outs.size()) +
                  " when captured");
    }
    for (size_t i = 0; i < outs.size(); ++i) {
      if (outs[i] != ir::kNoValue) env_[static_cast<size_t>(outs[i])] = std::move(results[i]);
    }
    return;
  }
  // The hook's body ran as ordinary nodes before this one; its results flow on.
  const auto& results = n.args.at(1).values;
  for (size_t i = 0; i < outs.size(); ++i) {
    if (outs[i] == ir::kNoValue) continue;
    env_[static_cast<size_t>(outs[i])] = get(n, results.at(i));
  }
}

std::vector<at::Tensor> Interpreter::run(std::vector<at::Tensor> inputs) {
  const auto& input_nodes = input_nodes_;
  TORCH_CHECK(inputs.size() == input_nodes.size(), "tcap interpreter: the graph has ",
              input_nodes.size(), " inputs but ", inputs.size(), " tensors were given");
  env_.assign(graph_.values().size(), at::Tensor());
  host_values_.clear();
  for (size_t k = 0; k < inputs.size(); ++k) {
    const ir::Node& n = graph_.node(input_nodes[k]);
    const ir::ValueId v = n.outputs.at(0).values.at(0);
    const auto& meta = graph_.value(v).meta;
    if (!inputs[k].defined()) fail(n, "input " + std::to_string(k) + " is undefined");
    if (inputs[k].scalar_type() != meta.dtype || inputs[k].sizes() != c10::IntArrayRef(meta.sizes)) {
      std::ostringstream os;
      os << "input " << k << " should be " << ir::dtype_short_name(meta.dtype) << c10::IntArrayRef(meta.sizes)
         << " but is " << ir::dtype_short_name(inputs[k].scalar_type()) << inputs[k].sizes();
      fail(n, os.str());
    }
    env_[static_cast<size_t>(v)] = std::move(inputs[k]);
  }
  inputs.clear();
  // Note [Host scalars as graph inputs]: this run's numbers into the prepared stacks.
  for (const ScalarUse& u : scalar_uses_) {
    const at::Tensor& t = env_[static_cast<size_t>(u.value)];
    const double d = t.scalar_type() == at::kDouble && t.is_cpu() ? *t.const_data_ptr<double>() : t.item<double>();
    prepared_[static_cast<size_t>(u.node)][u.arg] = scalar_ivalue(u.kind, d);
  }
  // Below autograd: the graph already holds the backward. Each op still sees the grad
  // mode it was recorded with, since some kernels branch on it (mkldnn_rnn_layer keeps
  // its workspace only when grad mode is on).
  std::optional<at::AutoDispatchBelowADInplaceOrView> below_autograd;
  if (!differentiable_) below_autograd.emplace();
  // Note [Direct fused calls]: the kernel itself only where the dispatcher would go
  // straight to a kernel. A mode key in the thread's included set beyond LibTorch's
  // defaults (a capture recording this replay, compiled autograd's among them, or any
  // other mode) must see ATen calls: the kernel's own ops run then (call_ops).
  const auto tls = c10::impl::tls_local_dispatch_key_set();
  const bool no_mode = (tls.included_ - c10::default_included_set).empty();
  // Note [Unboxed extern calls]: nor with autocast on (it takes its key out of the
  // excluded set), nor while a RecordFunction observer (a profiler) is installed: the
  // dispatcher is what reports each ATen op to it.
  const bool unboxed_ok = !unboxed_.empty() && no_mode &&
                          (c10::default_excluded_set.raw_repr() & ~tls.excluded_.raw_repr()) == 0 &&
                          !at::hasCallbacks();
  for (const auto& n : graph_.nodes()) {
    // Every error names the node that raised it: the kernel's (or hook's) own message says
    // what. HostValueChanged passes through unchanged: it names its node already, and
    // compiled entries catch it by type to try the next entry.
    try {
      if (n.kind == ir::NodeKind::Call) {
        c10::AutoGradMode grad_mode(n.grad_mode);
        interp::DirectCall* direct =
            static_cast<size_t>(n.id) < direct_.size() ? direct_[static_cast<size_t>(n.id)].get() : nullptr;
        const interp::UnboxedCall* unboxed = unboxed_ok ? unboxed_[static_cast<size_t>(n.id)].get() : nullptr;
        if (direct) {
          run_direct(n, *direct, /*as_ops=*/!no_mode);
        } else if (!unboxed || !run_unboxed(n, *unboxed)) {
          run_call(n, *ops_[static_cast<size_t>(n.id)], *schemas_[static_cast<size_t>(n.id)]);
        }
        if (check_host_values_ && static_cast<size_t>(n.id) < sizes_from_values_.size() &&
            sizes_from_values_[static_cast<size_t>(n.id)]) {
          check_result_sizes(graph_, n, env_);
        }
      } else if (n.kind == ir::NodeKind::CallHook) {
        run_hook(n);
      }
    } catch (const HostValueChanged&) {
      throw;
    } catch (const c10::OutOfMemoryError& e) {
      rethrow_naming(n, e, /*out_of_memory=*/true);
    } catch (const std::bad_alloc& e) {
      rethrow_naming(n, e, /*out_of_memory=*/true);
    } catch (const std::exception& e) {
      rethrow_naming(n, e, /*out_of_memory=*/false);
    } catch (...) {
      fail(n, "raised an exception that is not a std::exception");
    }
    if (!keep_values_) {
      for (ir::ValueId v : last_uses_[static_cast<size_t>(n.id)]) env_[static_cast<size_t>(v)].reset();
    }
  }
  std::vector<at::Tensor> outs;
  outs.reserve(output_values_.size());
  for (ir::ValueId v : output_values_) outs.push_back(env_.at(static_cast<size_t>(v)));
  if (!keep_values_) env_.clear();
  return outs;
}

bool Interpreter::is_scalar_use(ir::NodeId node, size_t arg) const {
  // A value argument's prepared entry is None, a scalar use's its last number: no search
  // (a step's graph has hundreds of scalar uses).
  const auto id = static_cast<size_t>(node);
  return id < scalar_node_.size() && scalar_node_[id] && graph_.node(node).args[arg].refers_to_values() &&
         !prepared_[id][arg].isNone();
}

bool Interpreter::reads_wrapped_host_scalar(ir::NodeId node) const {
  const auto id = static_cast<size_t>(node);
  return id < scalar_node_.size() && (scalar_node_[id] & kReadsWrappedHostScalar) != 0;
}

Interpreter::ScalarUse::Kind Interpreter::scalar_use_kind(const c10::Argument& sa) {
  const c10::Type* t = sa.real_type().get();
  if (const auto* opt = t->castRaw<c10::OptionalType>()) t = opt->getElementType().get();
  switch (t->kind()) {
    case c10::TypeKind::TensorType: return ScalarUse::Kind::Tensor;
    case c10::TypeKind::FloatType:
    case c10::TypeKind::SymFloatType:
    case c10::TypeKind::NumberType: return ScalarUse::Kind::Double;
    case c10::TypeKind::IntType:
    case c10::TypeKind::SymIntType: return ScalarUse::Kind::Int;
    default: return ScalarUse::Kind::None;
  }
}

c10::IValue Interpreter::scalar_ivalue(ScalarUse::Kind kind, double d) {
  switch (kind) {
    case ScalarUse::Kind::Tensor: {
      at::Tensor t = c10::scalar_to_tensor(c10::Scalar(d));  // a wrapped number, as eager passes one
      t.unsafeGetTensorImpl()->set_wrapped_number(true);
      return c10::IValue(t);
    }
    case ScalarUse::Kind::Int: return c10::IValue(static_cast<int64_t>(d));
    default: return c10::IValue(d);
  }
}

std::vector<at::Tensor> interpret(const ir::Graph& g, const std::vector<at::Tensor>& inputs) {
  return Interpreter(g).run(inputs);
}

}  // namespace tcap

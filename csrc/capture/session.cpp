#include "capture/session.h"

#include "capture/recorder.h"
#include "ir/op_facts.h"
#include "support/logging.h"

#include <ATen/core/dispatch/Dispatcher.h>
#include <ATen/core/function_schema.h>
#include <c10/core/DispatchKey.h>
#include <c10/core/impl/LocalDispatchKeySet.h>
#include <torch/csrc/autograd/function.h>
#include <torch/csrc/autograd/grad_mode.h>

#include <c10/util/flat_hash_map.h>

#include <algorithm>
#include <memory>
#include <mutex>
#include <sstream>
#include <typeindex>

namespace tcap::capture {
namespace {

void fill_meta(ir::TensorMeta& m, const at::Tensor& t) {
  m.dtype = t.scalar_type();
  m.sizes.assign(t.sizes().begin(), t.sizes().end());
  if (t.layout() == c10::kStrided) {
    m.strides.assign(t.strides().begin(), t.strides().end());
    m.storage_offset = t.storage_offset();
  }
  m.device = t.device();
  m.requires_grad = t.requires_grad();
}

ir::TensorMeta meta_of(const at::Tensor& t) {
  ir::TensorMeta m;
  fill_meta(m, t);
  return m;
}

bool is_floating_or_complex(c10::ScalarType t) {
  return c10::isFloatingType(t) || c10::isComplexType(t);
}

}  // namespace

// A node's name is a function of its type. The names are immortal: a deferred call node
// (Note [Deferred call nodes]) keeps a pointer to one until the graph is read, possibly on
// another thread after this one has exited.
const std::string& node_name(const torch::autograd::Node& node) {
  thread_local ska::flat_hash_map<const std::type_info*, const std::string*> cache;
  const std::type_info* type = &typeid(node);
  auto it = cache.find(type);
  if (it != cache.end()) return *it->second;
  static std::mutex mutex;
  static auto* names = new std::unordered_map<std::type_index, std::unique_ptr<std::string>>();
  const std::string* name = nullptr;
  {
    std::lock_guard<std::mutex> lock(mutex);
    auto& slot = (*names)[std::type_index(*type)];
    if (!slot) slot = std::make_unique<std::string>(node.name());
    name = slot.get();
  }
  cache.emplace(type, name);
  return *name;
}

// Room for a training step of a small model without reallocating as the graph grows (a
// capture per step is common: growing from empty cost about a tenth of the recording).
constexpr size_t kReservedNodes = 64;
constexpr size_t kReservedValues = 128;

Session::Session(CaptureOptions options) : options_(options) {
  graph_.meta()["producer"] = "tcap capture";
  graph_.reserve(kReservedNodes, kReservedValues);
  table_.reserve(kReservedValues, kReservedValues);
  deferred_.reserve(kReservedNodes);
  raw_args_.reserve(4 * kReservedNodes);
  raw_values_.reserve(kReservedNodes);
  raw_ints_.reserve(kReservedNodes);
}

ir::ValueId Session::new_input(const at::Tensor& t, ir::InputKind kind, std::string name) {
  // Built in place, as Graph::add_input would: the value first, then its Input node.
  const auto producer = static_cast<ir::NodeId>(graph_.nodes().size());
  ir::Value& val = graph_.emplace_value(producer, 0, -1);
  fill_meta(val.meta, t);
  const ir::ValueId v = val.id;
  ir::Node& n = graph_.emplace_node(ir::NodeKind::Input);
  n.input_kind = kind;
  n.name = std::move(name);
  n.outputs.push_back(ir::Arg::value(v));
  // Note [Inputs that share storage] (ir/op_facts.h).
  if (t.has_storage()) {
    auto [it, fresh] = input_storages_.emplace(t.storage().unsafeGetStorageImpl(), n.name);
    if (!fresh) {
      for (const std::string* name : {&it->second, &n.name}) {
        if (std::find(inputs_sharing_.begin(), inputs_sharing_.end(), *name) == inputs_sharing_.end()) {
          inputs_sharing_.push_back(*name);
        }
      }
      graph_.meta()[ir::kInputsShareStorage] = ir::join_input_names(inputs_sharing_);
    }
  }
  input_tensors_.push_back(t);
  // Every leaf that requires grad may receive a .grad inside the capture (see snapshot).
  if (t.requires_grad() && t.is_leaf()) grad_leaves_.emplace_back(t, n.name);
  table_.define(t, v);
  return v;
}

ir::ValueId Session::value_for(const at::Tensor& t) {
  if (auto v = table_.lookup(t)) {
    // Outputs are recorded below autograd, before their history is set: take the truth now.
    graph_.value(*v).meta.requires_grad = t.requires_grad();
    return *v;
  }
  auto it = names_.find(t.unsafeGetTensorImpl());
  if (it != names_.end()) return new_input(t, it->second.kind, it->second.name);
  const bool leaf_param = t.requires_grad() && t.is_leaf();
  const auto kind = leaf_param ? ir::InputKind::Parameter : ir::InputKind::Constant;
  std::string name = (leaf_param ? "param" : "const") + std::to_string(auto_names_++);
  TCAP_LOG(Capture, "tensor from outside the capture becomes input '" << name << "' ("
                                                                         << ir::to_string(kind) << ")");
  return new_input(t, kind, std::move(name));
}

template <class F>
void Session::for_each_raw_value(const RawArg& a, F&& f) const {
  if (a.form == RawArg::Form::Inline) {
    if (a.kind == ir::ArgKind::Value) f(static_cast<ir::ValueId>(a.i));
  } else if (a.form == RawArg::Form::Values) {
    for (int32_t k = 0; k < a.n; ++k) f(raw_values_[static_cast<size_t>(a.i + k)]);
  } else if (a.form == RawArg::Form::Full) {
    const ir::Arg& full = raw_full_[static_cast<size_t>(a.i)];
    if (full.refers_to_values()) {
      for (ir::ValueId v : full.values) f(v);
    }
  }
}

void Session::note_backward_roots(const torch::autograd::edge_list& roots, bool keep_graph) {
  std::vector<const torch::autograd::Node*> todo;
  for (const auto& e : roots) {
    if (!e.function) continue;
    backward_roots_.push_back(e.function);
    todo.push_back(e.function.get());
  }
  while (!todo.empty()) {
    const torch::autograd::Node* n = todo.back();
    todo.pop_back();
    const bool fresh = reached_any_.insert(n).second;
    const bool used_up = !keep_graph && reached_.insert(n).second;
    if (!fresh && !used_up) continue;
    for (const auto& e : n->next_edges()) {
      if (e.function) todo.push_back(e.function.get());
    }
  }
}

// Note [Deferred call nodes]
// The recorder runs per ATen call, so what it does there is the capture's cost. A Call
// node's identity, metadata and aliasing must be read while the op runs (tensor
// identities, the values of its results, the version counters), but its operator name,
// its typed arguments (ir::Arg: about 180 bytes, strings and vectors) and its autograd
// node label need not: after_op appends the node with its id, phase, grad mode and hook,
// and keeps the rest as 24-byte RawArgs in session-wide arenas plus a pointer to the
// immortal OpInfo and label. The graph is filled in when it is read (graph(),
// snapshot()). Recording the seed MLP training step takes about 30% fewer instructions
// this way (bench/RESULTS.md, record_mlp_step).
void Session::before_op(const OpInfo& info, c10::ArrayRef<c10::IValue> args, Pending& p) {
  p.active = true;
  p.grad_mode = at::GradMode::is_enabled();
  p.phase = in_backward_ > 0 ? ir::Phase::Backward : ir::Phase::Forward;
  if (!hook_stack_.empty()) p.hook = hook_stack_.back();
  if (in_backward_ > 0) {
    if (auto node = torch::autograd::get_current_node()) {
      if (node_labeler_) {
        p.autograd_node = &owned_labels_.emplace_back(node_labeler_(*node));
      } else {
        p.autograd_node = &node_name(*node);
      }
    } else if (p.hook >= 0) {
      // hooks_ may grow before the graph is read: keep a copy.
      p.autograd_node = &owned_labels_.emplace_back(graph_.hooks()[static_cast<size_t>(p.hook)].autograd_node);
    }
  }
  p.args_begin = static_cast<uint32_t>(raw_args_.size());
  p.arg_first_value.assign(args.size(), ir::kNoValue);
  for (size_t i = 0; i < args.size(); ++i) convert_raw(args[i], info.int_hint[i], &p.arg_first_value[i]);
  // Writes are counted before the op runs, so that aliases defined earlier stay valid.
  for (size_t i = 0; i < args.size(); ++i) {
    if (!info.arg_is_write[i]) continue;
    if (args[i].isTensor() && args[i].toTensor().defined()) {
      table_.note_write(args[i].toTensor());
      p.writes.emplace_back(i, args[i].toTensor());
    } else if (args[i].isTensorList()) {
      for (const at::Tensor& t : args[i].toTensorList()) {
        table_.note_write(t);
        p.writes.emplace_back(i, t);
      }
    }
  }
}

ir::ValueId Session::define_output(const at::Tensor& t, ir::NodeId producer, int index,
                                   int list_index, bool requires_grad_guess) {
  // Filled in place: the recorder makes one of these per op output.
  ir::Value& val = graph_.emplace_value(producer, index, list_index);
  ir::TensorMeta& m = val.meta;
  fill_meta(m, t);
  m.requires_grad = m.requires_grad || (requires_grad_guess && is_floating_or_complex(m.dtype));
  const ir::ValueId v = val.id;
  table_.define(t, v);
  return v;
}

void Session::record_schema(const OpInfo& info) {
  const auto k = static_cast<size_t>(info.id);
  if (k >= schema_recorded_.size()) schema_recorded_.resize(k + 1, 0);
  schema_recorded_[k] = 1;
  unflushed_schemas_.push_back(&info);
}

void Session::flush_schemas() {
  for (const OpInfo* info : unflushed_schemas_) graph_.schemas().emplace(info->qualified, info->schema);
  unflushed_schemas_.clear();
}

void Session::after_op(const OpInfo& info, c10::ArrayRef<c10::IValue> rets, Pending& p) {
  const auto schema_k = static_cast<size_t>(info.id);
  if (schema_k >= schema_recorded_.size() || !schema_recorded_[schema_k]) record_schema(info);
  // The node is appended after its results are defined (as add_node would), at this id.
  const ir::NodeId id = static_cast<ir::NodeId>(graph_.nodes().size());
  const size_t num_args = info.num_arguments;
  // A differentiable op's outputs require grad if grad mode is on and an input does; the
  // truth is read again when the output is next used (see value_for).
  bool guess = false;
  if (p.grad_mode && p.phase == ir::Phase::Forward) {
    for (size_t i = 0; i < num_args && !guess; ++i) {
      for_each_raw_value(raw_args_[p.args_begin + i], [&](ir::ValueId v) {
        guess = guess || (v != ir::kNoValue && graph_.value(v).meta.requires_grad);
      });
    }
  }
  c10::SmallVector<uint8_t, 8> write_returned(p.writes.empty() ? 0 : num_args, 0);
  const auto outputs_begin = static_cast<uint32_t>(raw_args_.size());
  for (size_t r = 0; r < rets.size(); ++r) {
    const c10::IValue& iv = rets[r];
    const int alias = info.return_alias_arg[r];
    const ir::ValueId base = alias >= 0 ? p.arg_first_value[static_cast<size_t>(alias)] : ir::kNoValue;
    if (iv.isTensor()) {
      const at::Tensor& t = iv.toTensor();
      RawArg out;
      if (t.defined()) {
        out.kind = ir::ArgKind::Value;
        const ir::ValueId v = define_output(t, id, static_cast<int>(r), -1, guess);
        out.i = v;
        auto& val = graph_.value(v);
        if (info.return_is_write[r]) {
          val.version_of = base;
          if (alias >= 0 && !write_returned.empty()) write_returned[static_cast<size_t>(alias)] = 1;
        } else {
          val.view_of = base;
        }
      } else {
        out.kind = ir::ArgKind::UndefinedTensor;
      }
      raw_args_.push_back(out);
    } else if (iv.isTensorList()) {
      RawArg out;
      out.kind = ir::ArgKind::ValueList;
      out.form = RawArg::Form::Values;
      out.i = static_cast<int64_t>(raw_values_.size());
      int k = 0;
      for (const at::Tensor& t : iv.toTensorList()) {
        const ir::ValueId v = define_output(t, id, static_cast<int>(r), k++, guess);
        graph_.value(v).view_of = info.return_is_write[r] ? ir::kNoValue : base;
        raw_values_.push_back(v);
      }
      out.n = k;
      raw_args_.push_back(out);
      if (info.return_is_write[r] && alias >= 0 && !write_returned.empty()) write_returned[static_cast<size_t>(alias)] = 1;
    } else {
      convert_raw(iv, OpInfo::IntHint::Int, nullptr);
    }
  }
  // Mutated arguments that the op does not return (e.g. batch norm's running stats) get
  // a new version as an extra result after the schema's returns.
  size_t list_pos = 0;
  for (size_t w = 0; w < p.writes.size(); ++w) {
    const auto& [i, t] = p.writes[w];
    list_pos = (w > 0 && p.writes[w - 1].first == i) ? list_pos + 1 : 0;
    if (write_returned[i]) continue;
    ir::ValueId old = ir::kNoValue;
    size_t k = 0;
    for_each_raw_value(raw_args_[p.args_begin + i], [&](ir::ValueId v) {
      if (k++ == list_pos) old = v;
    });
    const int index = static_cast<int>(raw_args_.size() - outputs_begin);
    const ir::ValueId v = define_output(t, id, index, -1, false);
    graph_.value(v).meta.requires_grad = t.requires_grad();
    graph_.value(v).version_of = old;
    RawArg out;
    out.kind = ir::ArgKind::Value;
    out.i = v;
    raw_args_.push_back(out);
  }
  TORCH_INTERNAL_ASSERT_DEBUG_ONLY(static_cast<size_t>(id) == graph_.nodes().size());
  ir::Node& n = graph_.emplace_node(ir::NodeKind::Call);
  n.phase = p.phase;
  n.grad_mode = p.grad_mode;
  n.hook = p.hook;
  deferred_.push_back(DeferredCall{id, &info, p.autograd_node, p.args_begin, outputs_begin,
                                   static_cast<uint32_t>(raw_args_.size() - outputs_begin)});
}

void Session::materialize_calls(ir::Graph& g) const {
  for (const DeferredCall& d : deferred_) {
    g.edit_node(d.node, [&](ir::Node& n) {
      const OpInfo& info = *d.info;
      n.op = info.op;
      n.overload = info.overload;
      if (d.autograd_node) n.autograd_node = *d.autograd_node;
      n.args.resize(info.num_arguments);
      for (size_t i = 0; i < info.num_arguments; ++i) {
        ir::Arg& a = n.args[i];
        materialize(raw_args_[d.args_begin + i], a);
        // Tensor arguments print positionally; constants keep their schema name.
        if (!a.refers_to_values()) a.name = info.arg_name[i];
      }
      n.outputs.resize(d.num_outputs);
      for (uint32_t r = 0; r < d.num_outputs; ++r) materialize(raw_args_[d.outputs_begin + r], n.outputs[r]);
    });
  }
}

void Session::flush_calls() {
  if (deferred_.empty()) return;
  materialize_calls(graph_);
  deferred_.clear();
  raw_args_.clear();
  raw_values_.clear();
  raw_ints_.clear();
  raw_full_.clear();
  owned_labels_.clear();
}

void Session::begin_backward(const std::vector<at::Tensor>& root_grads) {
  ++in_backward_;
  for (const at::Tensor& g : root_grads) {
    if (!g.defined()) continue;
    if (auto v = table_.lookup(g)) {
      // The implicit ones_like(loss) made by backward() is the seed of the backward.
      const ir::NodeId producer = graph_.value(*v).producer;
      if (graph_.node(producer).kind == ir::NodeKind::Call) {
        graph_.edit_node(producer, [](ir::Node& node) { node.phase = ir::Phase::Backward; });
      }
    } else {
      new_input(g, ir::InputKind::Tangent, "tangent" + std::to_string(tangents_++));
    }
  }
}

void Session::end_backward() { --in_backward_; }

int Session::begin_hook(ir::HookKind kind, const std::string& autograd_node, int slot) {
  const int id = graph_.add_hook(kind, autograd_node, slot);
  hook_stack_.push_back(id);
  return id;
}

void Session::abort_hook(int hook) {
  if (!hook_stack_.empty() && hook_stack_.back() == hook) hook_stack_.pop_back();
}

void Session::end_hook(int hook, const std::vector<at::Tensor>& in,
                       const std::vector<at::Tensor>& out) {
  abort_hook(hook);
  add_call_hook(hook, {ir::Arg::value_list(values_of(in), true, "inputs"),
                       ir::Arg::value_list(values_of(out), true, "results")},
                out);
}

void Session::end_opaque_hook(int hook, const std::vector<at::Tensor>& in, const std::vector<at::Tensor>& node_in,
                              const std::vector<at::Tensor>& out) {
  abort_hook(hook);
  std::vector<ir::Arg> args{ir::Arg::value_list(values_of(in), true, "inputs")};
  if (!node_in.empty()) args.push_back(ir::Arg::value_list(values_of(node_in), true, "node_inputs"));
  add_call_hook(hook, std::move(args), out);
}

std::vector<ir::ValueId> Session::values_of(const std::vector<at::Tensor>& ts) {
  std::vector<ir::ValueId> vs;
  for (const at::Tensor& t : ts) vs.push_back(t.defined() ? value_for(t) : ir::kNoValue);
  return vs;
}

void Session::add_call_hook(int hook, std::vector<ir::Arg> args, const std::vector<at::Tensor>& out) {
  ir::Node n;
  n.kind = ir::NodeKind::CallHook;
  n.hook = hook;
  n.phase = ir::Phase::Backward;
  n.grad_mode = at::GradMode::is_enabled();
  n.autograd_node = graph_.hooks()[static_cast<size_t>(hook)].autograd_node;
  n.args = std::move(args);
  // Every result is a new value, even one the hook passed through: later ops read the
  // gradient through the call, so replay keeps the hook where eager ran it.
  const ir::NodeId id = static_cast<ir::NodeId>(graph_.nodes().size());
  std::vector<ir::ValueId> outs;
  for (size_t i = 0; i < out.size(); ++i) {
    if (!out[i].defined()) {
      outs.push_back(ir::kNoValue);
      continue;
    }
    const ir::ValueId v = graph_.new_value(id, 0, static_cast<int>(i), meta_of(out[i]));
    table_.define(out[i], v);
    outs.push_back(v);
  }
  n.outputs.push_back(ir::Arg::value_list(outs, true));
  graph_.add_node(std::move(n));
}

void Session::name_tensor(const at::Tensor& t, ir::InputKind kind, const std::string& name) {
  names_[t.unsafeGetTensorImpl()] = Named{t, kind, name};
}

ir::ValueId Session::declare_input(const at::Tensor& t, const std::string& name, ir::InputKind kind) {
  TORCH_CHECK(t.defined(), "tcap: CaptureGuard::input('", name, "'): the tensor is undefined");
  return new_input(t, kind, name);
}

ir::ValueId Session::tangent_for(const at::Tensor& t, const std::string& name) {
  if (auto v = table_.lookup(t)) {
    // Another output's gradient, or a tensor aliasing it (two gradients expanded from one
    // tensor): each output still gets its own tangent input, since at replay the two may
    // differ. Where they aliased, the caller guards that they still do (Note [Tangents
    // that alias]).
    const ir::Node& p = graph_.node(graph_.value(*v).producer);
    if (!(p.kind == ir::NodeKind::Input && p.input_kind == ir::InputKind::Tangent)) return *v;
  }
  return new_input(t, ir::InputKind::Tangent, name);
}

void Session::mark_output(const at::Tensor& t, const std::string& name) {
  TORCH_CHECK(t.defined(), "tcap: CaptureGuard::output('", name, "'): the tensor is undefined");
  auto v = table_.lookup(t);
  TORCH_CHECK(v.has_value(), "tcap: CaptureGuard::output('", name,
              "'): this tensor was not produced or read inside the capture");
  graph_.value(*v).meta.requires_grad = t.requires_grad();
  outputs_.emplace_back(*v, name.empty() ? "out" + std::to_string(outputs_.size()) : name);
}

ir::Graph Session::snapshot() const {
  std::vector<ir::ValueId> values;
  std::vector<std::string> names;
  std::vector<ir::OutputKind> kinds;
  for (const auto& [v, name] : outputs_) {
    values.push_back(v);
    names.push_back(name);
    kinds.push_back(ir::OutputKind::User);
  }
  for (const auto& [p, name] : grad_leaves_) {
    const at::Tensor& g = p.grad();
    if (!g.defined()) continue;
    auto v = table_.lookup(g);
    if (!v || graph_.node(graph_.value(*v).producer).kind == ir::NodeKind::Input) continue;
    values.push_back(*v);
    names.push_back(name);  // with OutputKind::Grad; printed as grad(name)
    kinds.push_back(ir::OutputKind::Grad);
  }
  // Copied before the deferred nodes are written: each Arg is built once, in the copy.
  // Assigned into room for the Output node: growing a full node vector moves every node.
  ir::Graph g;
  g.reserve(graph_.nodes().size() + 1, graph_.values().size());
  g = graph_;
  materialize_calls(g);
  for (const OpInfo* info : unflushed_schemas_) g.schemas().emplace(info->qualified, info->schema);
  g.set_outputs(std::move(values), std::move(names), std::move(kinds));
  return g;
}

}  // namespace tcap::capture

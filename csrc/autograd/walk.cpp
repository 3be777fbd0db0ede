#include "autograd/walk.h"

#include "capture/armed.h"
#include "compile/replay_node.h"

#include <torch/csrc/autograd/functions/accumulate_grad.h>
#include <torch/csrc/autograd/functions/basic_ops.h>
#include <torch/csrc/dynamo/compiled_autograd.h>

#include <algorithm>
#include <cstring>
#include <typeinfo>
#include <unordered_map>

// Note [The backward key]
// A compiled backward may replace the engine only for a graph that computes the same
// thing: the same node types in the same topology, the same constants inside the nodes
// (an AddBackward0's alpha, a SumBackward1's dims), the same dtypes and devices, the same
// hooks in the same places, and the same sizes. The walk visits the nodes below the root
// depth-first in next_edges order (NodeCall ids follow that order, as in PyTorch's
// compiled autograd) and writes, per node: its type, its input metadata, its edges, its
// hook counts, and the bytes its own Node::compiled_args specialises on. compiled_args is
// also what lifts a node's saved tensors (unpacking each SavedVariable once): they become
// inputs of the compiled backward, so every call feeds the tensors of its own forward.
// Sizes and strides are kept apart from the key bytes so that a miss can say which one
// changed and mark it dynamic. AccumulateGrad nodes are described by their leaf's
// metadata only: whether .grad is defined is not part of the key (the replay accumulates
// with the engine's own rules), so optimizer.zero_grad() causes no recompile.

namespace tcap::ca {
namespace {

using torch::autograd::Node;
using torch::dynamo::autograd::AutogradCompilerCall;
using torch::dynamo::autograd::CompiledNodeArgs;
using torch::dynamo::autograd::SizeInput;

// Appends to the key without a library call per field (the walk writes a few dozen
// fields per node; see the lookup_us benchmark). Walker::finish trims the buffer.
struct KeyWriter {
  std::string& buf;
  size_t len = 0;
  void write(const void* p, size_t n) {
    if (len + n > buf.size()) buf.resize(std::max(buf.size() * 2, len + n + 1024));
    std::memcpy(&buf[len], p, n);
    len += n;
  }
};
template <class T>
void put(KeyWriter& key, const T& v) {
  key.write(&v, sizeof(T));
}

bool is_observer(const torch::autograd::FunctionPreHook* h) {
  return dynamic_cast<const capture::ObserverPreHook*>(h) != nullptr;
}
bool is_observer(const torch::autograd::FunctionPostHook* h) {
  return dynamic_cast<const capture::ObserverPostHook*>(h) != nullptr;
}

// Node::name() demangles on every call; a node's name is a function of its type. The
// returned string is stable for the thread's life; its address stands for the type in keys.
const std::string* name_of(const Node& n) {
  thread_local std::unordered_map<const std::type_info*, std::string> names;
  auto it = names.find(&typeid(n));
  if (it == names.end()) it = names.emplace(&typeid(n), n.name()).first;
  return &it->second;
}

struct Walker {
  BackwardWalk& w;
  KeyWriter key{w.key};
  AutogradCompilerCall compiler{SizeInput::STATIC};
  std::unordered_map<const Node*, uint32_t> ids;

  void size(uint32_t node, int64_t v) { w.sizes.push_back({node, v}); }

  void tensor_meta(uint32_t node, const at::Tensor& t) {
    put(key, t.scalar_type());
    put(key, static_cast<int8_t>(t.device().type()));
    put(key, t.device().index());
    put(key, t.layout());
    put(key, static_cast<int64_t>(t.dim()));
    if (t.layout() != c10::kStrided) return;
    for (int64_t s : t.sizes()) size(node, s);
    for (int64_t s : t.strides()) size(node, s);
    size(node, t.storage_offset());
  }

  bool fail(uint32_t node, const std::string& why) {
    if (w.why_not.empty()) w.why_not = w.label(node) + ": " + why;
    return false;
  }

  void discover(const std::shared_ptr<Node>& root) {
    ids.reserve(64);
    std::vector<Node*> todo{root.get()};
    while (!todo.empty()) {
      Node* n = todo.back();
      todo.pop_back();
      if (!n || ids.count(n)) continue;
      ids.emplace(n, static_cast<uint32_t>(w.nodes.size()));
      w.nodes.push_back(n->getptr());
      w.names.push_back(name_of(*n));
      const auto& es = n->next_edges();
      for (auto it = es.rbegin(); it != es.rend(); ++it) {
        if (it->is_valid()) todo.push_back(it->function.get());
      }
    }
  }

  template <class List, class Site>
  void hooks(uint32_t id, const List& list, Site site) {
    uint32_t count = 0;
    for (const auto& h : list) {
      if (is_observer(h.get())) continue;
      w.hooks.push_back({id, site, h.get()});
      ++count;
    }
    put(key, count);
  }

  bool describe(uint32_t id) {
    Node& n = *w.nodes[id];
    put(key, w.names[id]);
    put(key, static_cast<uint32_t>(n.num_inputs()));
    for (uint32_t i = 0; i < n.num_inputs(); ++i) {
      const auto& m = n.input_metadata(i);
      if (m.is_nested_tensor()) return fail(id, "nested tensors are not supported");
      if (m.is_tensor_subclass()) return fail(id, "tensor subclasses are not supported");
      put(key, m.dtype());
      put(key, static_cast<int8_t>(m.device().type()));
      put(key, m.device().index());
      const auto shape = m.shape_as_dim_vector();
      put(key, static_cast<uint32_t>(shape.size()));
      for (const auto& s : shape) {
        auto v = s.maybe_as_int();
        if (!v) return fail(id, "symbolic sizes are not supported");
        size(id, *v);
      }
    }
    put(key, static_cast<uint32_t>(n.next_edges().size()));
    for (const auto& e : n.next_edges()) {
      put(key, e.is_valid() ? static_cast<int64_t>(ids.at(e.function.get())) : int64_t{-1});
      put(key, e.input_nr);
    }
    hooks(id, n.tensor_pre_hooks(), HookSite::TensorPre);
    {
      uint32_t count = 0;
      for (const auto& [k, h] : n.retains_grad_hooks()) {
        w.hooks.push_back({id, HookSite::RetainsGrad, h.get()});
        put(key, static_cast<int64_t>(k));
        ++count;
      }
      put(key, count);
    }
    hooks(id, n.pre_hooks(), HookSite::Pre);
    hooks(id, n.post_hooks(), HookSite::Post);

    if (id == 0) {  // the GraphRoot: its outputs are the root gradients
      const auto* root = dynamic_cast<const torch::autograd::GraphRoot*>(&n);
      if (!root) return fail(id, "the backward does not start at a GraphRoot");
      put(key, static_cast<uint32_t>(root->outputs.size()));
      for (const auto& g : root->outputs) {
        put(key, g.defined());
        if (!g.defined()) continue;
        tensor_meta(id, g);
        w.tensors.push_back(g);
        w.tensor_node.push_back(id);
      }
      return true;
    }
    if (typeid(n) == typeid(torch::autograd::AccumulateGrad)) {
      auto* acc = static_cast<torch::autograd::AccumulateGrad*>(&n);
      if (!acc->post_hooks().empty()) return fail(id, "post hooks on AccumulateGrad are not supported");
      const at::Tensor& leaf = acc->variable;
      put(key, leaf.defined());
      if (leaf.defined()) {
        put(key, leaf.requires_grad());
        tensor_meta(id, leaf);
      }
      w.accumulate.push_back(id);
      return true;
    }
    std::vector<at::Tensor> region_tensors;
    std::string region_key;
    if (aot::describe_replay_node(n, region_key, region_tensors, w.keep_alive)) {
      key.write(region_key.data(), region_key.size());
      for (auto& t : region_tensors) {
        put(key, t.defined());
        if (!t.defined()) continue;
        tensor_meta(id, t);
        w.tensors.push_back(std::move(t));
        w.tensor_node.push_back(id);
      }
      return true;
    }
    // Everything else describes itself (generated nodes, CppNode<T> of custom functions).
    torch::dynamo::autograd::NodeCall call(id, w.nodes[id]);
    compiler.set_active_node_call_idx(id);
    const size_t tensors_before = compiler.tensor_args.inputs.size();
    const size_t sizes_before = compiler.all_size_inputs.size();
    const size_t lifted_before = compiler.lifted_ivalue_args.args.size();
    try {
      CompiledNodeArgs args(compiler, call);
      n.compiled_args(args);
      const auto k = args.key();
      put(key, k.key_size);
      key.write(k.key, k.key_size);
    } catch (const std::exception& e) {
      std::string msg = e.what();
      if (auto nl = msg.find('\n'); nl != std::string::npos) msg.resize(nl);
      return fail(id, "cannot be described (" + msg + ")");
    }
    if (!compiler.sv_to_hooks.empty() || !compiler.packed_inputs.empty()) {
      return fail(id, "saved tensors with pack/unpack hooks are not supported");
    }
    // Saved sizes: compared per call like every other size.
    for (size_t i = sizes_before; i < compiler.all_size_inputs.size(); ++i) size(id, compiler.all_size_inputs[i].value);
    // Scalars a custom function saved: specialised on.
    for (size_t i = lifted_before; i < compiler.lifted_ivalue_args.args.size(); ++i) {
      const c10::IValue& iv = *compiler.lifted_ivalue_args.args[i].actual_ptr;
      if (iv.isInt()) put(key, iv.toInt());
      else if (iv.isDouble()) put(key, iv.toDouble());
      else return fail(id, "saves a symbolic scalar");
    }
    for (size_t i = tensors_before; i < compiler.tensor_args.inputs.size(); ++i) {
      const at::Tensor& t = compiler.tensor_args.inputs[i];
      tensor_meta(id, t);
      w.tensors.push_back(t);
      w.tensor_node.push_back(id);
    }
    return true;
  }
};

}  // namespace

BackwardWalk walk_backward(const std::shared_ptr<torch::autograd::Node>& root,
                           const torch::autograd::edge_list& outputs, bool accumulate_grad) {
  BackwardWalk w;
  Walker walker{w};
  walker.discover(root);
  w.key.resize(w.nodes.size() * 96 + 64);
  w.sizes.reserve(w.nodes.size() * 8);
  KeyWriter& key = walker.key;
  put(key, accumulate_grad);
  put(key, static_cast<uint32_t>(outputs.size()));
  for (const auto& e : outputs) {
    auto it = e.is_valid() ? walker.ids.find(e.function.get()) : walker.ids.end();
    put(key, it == walker.ids.end() ? int64_t{-1} : static_cast<int64_t>(it->second));
    put(key, e.input_nr);
    if (e.is_valid() && it == walker.ids.end()) {
      // grad() of a tensor the roots do not reach: the engine answers that alone.
      w.why_not = "grad() asks for a tensor outside the graph";
      break;
    }
  }
  w.node_key_end.reserve(w.nodes.size());
  for (uint32_t id = 0; id < w.nodes.size() && w.why_not.empty(); ++id) {
    if (!walker.describe(id)) break;
    w.node_key_end.push_back(key.len);
  }
  w.key.resize(key.len);
  return w;
}

void accumulate(torch::autograd::Node& node, at::Tensor&& grad) {
  torch::autograd::variable_list in;
  in.push_back(std::move(grad));
  node(std::move(in));
}

torch::autograd::variable_list call_hook(const HookRef& h, const torch::autograd::variable_list& in,
                                         const torch::autograd::variable_list& node_in) {
  if (h.site == HookSite::Post) {
    auto* hook = static_cast<torch::autograd::FunctionPostHook*>(const_cast<void*>(h.object));
    return (*hook)(in, node_in);
  }
  auto* hook = static_cast<torch::autograd::FunctionPreHook*>(const_cast<void*>(h.object));
  return (*hook)(in);
}

}  // namespace tcap::ca

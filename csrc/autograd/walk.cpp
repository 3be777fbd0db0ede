#include "autograd/walk.h"

#include "autograd/autograd_shim.h"
#include "autograd/key_writer.h"
#include "autograd/node_fields.h"
#include "autograd/ptr_map.h"
#include "capture/armed.h"
#include "aot/replay_node.h"

#include <c10/util/ScopeExit.h>

#include <algorithm>
#include <atomic>
#include <deque>
#include <typeinfo>

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

bool is_observer(const torch::autograd::FunctionPreHook* h) {
  return dynamic_cast<const capture::ObserverPreHook*>(h) != nullptr;
}
bool is_observer(const torch::autograd::FunctionPostHook* h) {
  return dynamic_cast<const capture::ObserverPostHook*>(h) != nullptr;
}

std::atomic<bool> describe_generated_fields{true};

// What the walk needs to know about a node type, computed once per type on this thread:
// Node::name() demangles on every call, and comparing type_infos costs a strcmp. The
// name's address stands for the type in keys; it is stable for the thread's life.
struct NodeType {
  enum class Kind : uint8_t { Root, AccumulateGrad, Replay, Other };
  std::string name;
  Kind kind;
  VisitFields visit;  // a generated node's members (non-null: see FieldVisitor)
};

// This thread's NodeTypes, by type_info.
class NodeTypes {
 public:
  static NodeTypes& of_this_thread() {
    thread_local NodeTypes types;
    return types;
  }
  const NodeType& of(const Node& n) {
    const std::type_info& t = typeid(n);
    uint32_t i = index_.find(&t);
    if (C10_UNLIKELY(i == PtrMap::kAbsent)) {
      NodeType::Kind kind = NodeType::Kind::Other;
      if (t == typeid(torch::autograd::GraphRoot)) kind = NodeType::Kind::Root;
      else if (t == typeid(torch::autograd::AccumulateGrad)) kind = NodeType::Kind::AccumulateGrad;
      else if (aot::is_replay_node_type(t)) kind = NodeType::Kind::Replay;
      types_.push_back({n.name(), kind, kind == NodeType::Kind::Other ? generated_visitor(t) : nullptr});
      i = static_cast<uint32_t>(types_.size() - 1);
      index_.insert(&t, i);
    }
    return types_[i];
  }

 private:
  PtrMap index_;
  std::deque<NodeType> types_;  // stable addresses
};

// A walk's working memory, kept per thread so that a walk allocates little; `busy`
// guards against a walk started from inside another (an unpack hook calling backward).
struct Scratch {
  PtrMap ids;
  std::vector<const std::shared_ptr<Node>*> todo;
  std::vector<const NodeType*> types;  // by NodeCall id
  PtrMap saved;                        // TensorImpl -> index in w.tensors, for FieldVisitor
  std::vector<uint32_t> fresh;         // tensors a FieldVisitor lifted for the current node
  std::vector<at::Tensor> region_tensors;
  std::string region_key;
  std::vector<uint32_t> lifted;
  PtrMap storages;                     // StorageImpl -> first index in w.tensors
  bool busy = false;
};

struct Walker {
  BackwardWalk& w;
  Scratch& scratch;
  KeyWriter key{w.key_buffer};
  NodeTypes& types = NodeTypes::of_this_thread();
  AutogradCompilerCall compiler{SizeInput::STATIC};
  torch::dynamo::autograd::NodeCall call{0, nullptr};  // reused for every node
  // Note [One CompiledNodeArgs per walk]
  // A CompiledNodeArgs mallocs a 1 KiB key buffer when made and frees it when destroyed.
  // It holds nothing else per node (it reaches the node through `call`, updated before
  // each compiled_args), so one serves every node and each node's key is the part its
  // compiled_args appended. With the saved tensors moved out (take_saved) this cut the
  // walk of ca_chain's 103 nodes from 144.5k to 135.2k instructions (callgrind).
  CompiledNodeArgs node_args{compiler, call};
  // Where compiler.tensor_args.inputs[i] goes in w.tensors.
  std::vector<uint32_t>& lifted = scratch.lifted;

  // Moves the saved tensors compiled_args lifted into their places in w.tensors (no
  // reference-count traffic for a copy and the compiler's release of its own).
  void take_saved() {
    auto& inputs = compiler.tensor_args.inputs;
    for (size_t i = 0; i < lifted.size(); ++i) w.tensors[lifted[i]] = std::move(inputs[i]);
  }
  PtrMap& ids = scratch.ids;
  std::vector<const NodeType*>& types_of = scratch.types;
  const bool fields = describe_generated_fields.load(std::memory_order_relaxed);

  void size(uint32_t node, int64_t v) { w.add_size(node, v); }

  void tensor_meta(uint32_t node, const at::Tensor& t) {
    put(key, t.scalar_type());
    put(key, static_cast<int8_t>(t.device().type()));
    put(key, t.device().index());
    put(key, t.layout());
    put(key, static_cast<int64_t>(t.dim()));
    if (t.layout() != c10::kStrided) return;
    for (int64_t s : t.sizes()) size(node, s);
    for (int64_t s : t.strides()) size(node, s);
    // Not the storage offset: see Note [Tensors that alias in a walk].
  }

  bool fail(uint32_t node, const std::string& why) {
    if (w.why_not.empty()) w.why_not = w.label(node) + ": " + why;
    return false;
  }

  void discover(const std::shared_ptr<Node>& root) {
    auto& todo = scratch.todo;
    todo.assign(1, &root);
    while (!todo.empty()) {
      const std::shared_ptr<Node>& n = *todo.back();
      todo.pop_back();
      if (!n || !ids.insert(n.get(), static_cast<uint32_t>(w.nodes.size()))) continue;
      w.nodes.push_back(n.get());
      const NodeType& type = types.of(*n);
      w.names.push_back(&type.name);
      types_of.push_back(&type);
      const auto& es = n->next_edges();
      for (auto it = es.rbegin(); it != es.rend(); ++it) {
        if (it->is_valid()) todo.push_back(&it->function);
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
      put(key, e.is_valid() ? static_cast<int64_t>(ids.find(e.function.get())) : int64_t{-1});
      put(key, e.input_nr);
    }
    const auto& tensor_pre = n.tensor_pre_hooks();
    const auto& retains = n.retains_grad_hooks();
    const bool any_hook = !tensor_pre.empty() || !retains.empty() || !n.pre_hooks().empty() || !n.post_hooks().empty();
    put(key, any_hook);  // most nodes have none: one byte
    if (any_hook) {
      hooks(id, tensor_pre, HookSite::TensorPre);
      uint32_t count = 0;
      for (const auto& [k, h] : retains) {
        w.hooks.push_back({id, HookSite::RetainsGrad, h.get()});
        put(key, static_cast<int64_t>(k));
        ++count;
      }
      put(key, count);
      hooks(id, n.pre_hooks(), HookSite::Pre);
      hooks(id, n.post_hooks(), HookSite::Post);
    }

    if (id == 0) {  // the GraphRoot: its outputs are the root gradients
      if (types_of[0]->kind != NodeType::Kind::Root) return fail(id, "the backward does not start at a GraphRoot");
      const auto* root = static_cast<const torch::autograd::GraphRoot*>(&n);
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
    if (types_of[id]->kind == NodeType::Kind::AccumulateGrad) {
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
    if (types_of[id]->kind == NodeType::Kind::Replay) {
      auto& region_tensors = scratch.region_tensors;
      auto& region_key = scratch.region_key;
      region_tensors.clear();
      region_key.clear();
      if (!aot::describe_replay_node(n, region_key, region_tensors, w.keep_alive)) {
        return fail(id, "a tcap::compile region's backward node could not be described");
      }
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
    if (const VisitFields visit = types_of[id]->visit; visit && fields) {
      FieldVisitor check{w, key, scratch.saved, scratch.fresh, id, /*write=*/false};
      visit(n, check);
      if (check.ok) return describe_fields(id, n, visit);
    }
    put(key, uint8_t{0});  // described by compiled_args (1: by its members)
    // Everything else describes itself (generated nodes, CppNode<T> of custom functions).
    // (No set_active_node_call_idx: it only records each input's origin for PyTorch's
    // verbose logging.)
    call.id = id;
    call.node = n.getptr();
    call.tensor_pre_hooks.clear();  // only Python hooks add to these; empty here
    call.cpp_tensor_pre_hooks.clear();
    call.pre_hooks.clear();
    call.post_hooks.clear();
    call.post_acc_grad_hooks.clear();
    call.graph_output.clear();
    const size_t tensors_before = compiler.tensor_args.inputs.size();
    const size_t sizes_before = compiler.all_size_inputs.size();
    const size_t lifted_before = compiler.lifted_ivalue_args.args.size();
    try {
      // One CompiledNodeArgs serves the whole walk (see Note [One CompiledNodeArgs per
      // walk]); this node's bytes are what its compiled_args appended.
      const size_t node_key_begin = node_args.key().key_size;
      n.compiled_args(node_args);
      const auto k = node_args.key();
      const size_t node_key_size = k.key_size - node_key_begin;
      put(key, node_key_size);
      key.write(k.key + node_key_begin, node_key_size);
    } catch (const std::exception& e) {
      return fail(id, "cannot be described (" + first_line(e.what()) + ")");
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
      tensor_meta(id, compiler.tensor_args.inputs[i]);
      // Filled by take_saved(): a later node may save the same tensor, and compiled_args
      // then reads this entry again.
      lifted.push_back(static_cast<uint32_t>(w.tensors.size()));
      w.tensors.emplace_back();
      w.tensor_node.push_back(id);
    }
    return true;
  }

  // A generated node, by its members (Note [Generated nodes described from their fields]).
  bool describe_fields(uint32_t id, const Node& n, VisitFields visit) {
    put(key, uint8_t{1});
    auto& fresh = scratch.fresh;
    fresh.clear();
    try {
      FieldVisitor v{w, key, scratch.saved, scratch.fresh, id, /*write=*/true};
      visit(n, v);
    } catch (const std::exception& e) {
      return fail(id, "cannot be described (" + first_line(e.what()) + ")");
    }
    for (uint32_t k : fresh) {
      const at::Tensor& t = w.tensors[k];
      tensor_meta(id, t);
      put(key, t.requires_grad());
    }
    return true;
  }
};

}  // namespace

bool set_describe_generated_fields(bool on) { return describe_generated_fields.exchange(on); }

void walk_backward(const std::shared_ptr<torch::autograd::Node>& root, const torch::autograd::edge_list& outputs,
                   bool accumulate_grad, BackwardWalk& w) {
  w.clear();
  thread_local Scratch thread_scratch;
  Scratch nested_scratch;
  Scratch& scratch = thread_scratch.busy ? nested_scratch : thread_scratch;
  scratch.busy = true;
  scratch.ids.clear();
  scratch.types.clear();
  scratch.saved.clear();
  scratch.lifted.clear();
  const auto release = c10::make_scope_exit([&scratch] {
    scratch.region_tensors.clear();
    scratch.busy = false;
  });

  Walker walker{w, scratch};
  w.graph = root;
  walker.discover(root);
  walker.compiler.tensor_args.inputs.reserve(w.nodes.size());
  walker.compiler.all_size_inputs.reserve(w.nodes.size());
  KeyWriter& key = walker.key;
  put(key, accumulate_grad);
  put(key, static_cast<uint32_t>(outputs.size()));
  for (const auto& e : outputs) {
    const uint32_t id = e.is_valid() ? walker.ids.find(e.function.get()) : PtrMap::kAbsent;
    put(key, id == PtrMap::kAbsent ? int64_t{-1} : static_cast<int64_t>(id));
    put(key, e.input_nr);
    if (e.is_valid() && id == PtrMap::kAbsent) {
      // grad() of a tensor the roots do not reach: the engine answers that alone.
      w.why_not = "grad() asks for a tensor outside the graph";
      break;
    }
  }
  for (uint32_t id = 0; id < w.nodes.size() && w.why_not.empty(); ++id) {
    if (!walker.describe(id)) break;
    w.node_key_end.push_back(key.len);
  }
  if (w.why_not.empty()) {
    walker.take_saved();
    // Note [Tensors that alias in a walk]
    // The capture of a compiled backward tells tensors apart by identity: two of the
    // walk's tensors that alias (root gradients passed as one tensor, a saved tensor and a
    // view of it) are recorded as one, which is right only for calls in which they alias
    // the same way. So the key says, per tensor, which earlier tensor shares its storage,
    // whether it is that very tensor, and where its data starts relative to it, in bytes
    // (sizes and strides are in the key already): a call whose tensors alias differently
    // misses and is captured again (it once reused the capture and got another root's
    // gradient). A tensor's own storage offset is not in the key: no op of a backward
    // graph reads it (an as_strided node's offsets are node fields, keyed with the node),
    // and a language model that walks a long token tensor with narrow() saves views at a
    // new offset every step (truncated backpropagation through time), which recaptured
    // every step when the offset was a size.
    PtrMap& first = scratch.storages;
    first.clear();
    for (size_t k = 0; k < w.tensors.size(); ++k) {
      const at::Tensor& t = w.tensors[k];
      const bool strided = t.defined() && t.has_storage() && t.layout() == c10::kStrided;
      const c10::StorageImpl* st = strided ? t.storage().unsafeGetStorageImpl() : nullptr;
      if (st == nullptr) {
        put(key, int64_t{-2});
        continue;
      }
      const uint32_t j = first.find(st);
      if (j == PtrMap::kAbsent) first.insert(st, static_cast<uint32_t>(k));
      put(key, j == PtrMap::kAbsent ? int64_t{-1} : static_cast<int64_t>(j));
      if (j != PtrMap::kAbsent) {
        const at::Tensor& f = w.tensors[j];
        put(key, t.unsafeGetTensorImpl() == f.unsafeGetTensorImpl());
        put(key, t.storage_offset() * static_cast<int64_t>(t.itemsize()) -
                     f.storage_offset() * static_cast<int64_t>(f.itemsize()));
      }
    }
  }
  w.key_size = key.len;
}

std::vector<char> nodes_run_for(const BackwardWalk& w, const torch::autograd::edge_list& outputs,
                                bool accumulate_grad) {
  const size_t n = w.nodes.size();
  PtrMap id;
  for (size_t i = 0; i < n; ++i) id.insert(w.nodes[i], static_cast<uint32_t>(i));
  std::vector<char> output(n, 0), run(n, 0), done(n, 0);
  for (const auto& e : outputs) {
    const uint32_t i = e.is_valid() ? id.find(e.function.get()) : PtrMap::kAbsent;
    if (i != PtrMap::kAbsent) output[i] = 1;
  }
  // Post-order over the DAG (iterative: graphs can be deep): a node runs if a child is an
  // output or runs.
  std::vector<std::pair<uint32_t, size_t>> stack;  // node, next edge to look at
  for (uint32_t start = 0; start < n; ++start) {
    if (done[start]) continue;
    stack.emplace_back(start, 0);
    done[start] = 1;  // on the stack or finished (a DAG has no back edges)
    while (!stack.empty()) {
      auto& [v, next] = stack.back();
      const auto& edges = w.nodes[v]->next_edges();
      if (next < edges.size()) {
        const auto& e = edges[next++];
        const uint32_t c = e.is_valid() ? id.find(e.function.get()) : PtrMap::kAbsent;
        if (c != PtrMap::kAbsent && !done[c]) {
          done[c] = 1;
          stack.emplace_back(c, 0);
        }
        continue;
      }
      bool runs = accumulate_grad && output[v];
      for (const auto& e : edges) {
        const uint32_t c = e.is_valid() ? id.find(e.function.get()) : PtrMap::kAbsent;
        if (c != PtrMap::kAbsent && (output[c] || run[c])) runs = true;
      }
      run[v] = runs;
      stack.pop_back();
    }
  }
  return run;
}

std::string first_line(const std::string& s) { return s.substr(0, s.find('\n')); }

void BackwardWalk::clear() {
  why_not.clear();
  key_size = 0;
  node_key_end.clear();
  sizes.clear();
  nodes.clear();
  graph.reset();
  names.clear();
  tensors.clear();
  tensor_node.clear();
  hooks.clear();
  accumulate.clear();
  keep_alive.clear();
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

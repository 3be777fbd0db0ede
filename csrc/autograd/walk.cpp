#include "autograd/walk.h"

#include "capture/armed.h"
#include "aot/replay_node.h"

#include <c10/util/ScopeExit.h>
#include <torch/csrc/autograd/functions/accumulate_grad.h>
#include <torch/csrc/autograd/functions/basic_ops.h>
#include <torch/csrc/autograd/generated/Functions.h>
#include <torch/csrc/dynamo/compiled_autograd.h>

#include <algorithm>
#include <atomic>
#include <cstring>
#include <deque>
#include <string_view>
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

// Note [Generated nodes described from their fields]
// Node::compiled_args is the general way to describe a node, but for the nodes LibTorch
// generates (Functions.h: SinBackward0, MulBackward0, MmBackward0, ...) it is expensive:
// every saved tensor goes through TensorArgs, two std::unordered_map inserts (a malloc
// each) plus the compiler's teardown; on ca_chain that was a third of the walk. A
// generated node's compiled_args only collects the node's members, one after another,
// so for the generated nodes whose members all have types FieldVisitor knows (all 701 of
// LibTorch 2.11's; generated_nodes.inc, written by tools/gen_node_describers.py from the
// installed Functions.h) the walk describes the members itself, with the same meaning:
//  - a SavedVariable is unpacked (with the node, for a saved output) and lifted into the
//    backward's tensors, deduplicated by TensorImpl like TensorArgs does; the key gets its
//    index, and for a new tensor its metadata and requires_grad (after the node's members,
//    so the sizes come in compiled_args' order: SymInts first, then tensor metadata);
//  - a SymInt is a size compared per call (it can become dynamic), like an all_size_input;
//    so are the sizes in a TypeAndSize and the sizes, strides and offset of a
//    TensorGeometry;
//  - scalars, dtypes, layouts, TensorOptions, ints, doubles, strings and lists of them
//    are key bytes.
// The key describes at least what compiled_args does: every member, not only the ones
// compiled_args collects. Each entry mirrors the node's members in a struct with the same
// base and static_asserts equal sizes, so a release that adds a member breaks the build
// rather than the cache key. A node whose members cannot be described this way (a saved
// tensor with pack/unpack hooks, a symbolic scalar or size) goes to compiled_args, which
// says why it cannot be compiled. On ca_chain (103 nodes, a third of them generated
// SinBackward0s with a saved tensor each) this cut a walk from 129k to 94k instructions.

namespace tcap::ca {
namespace {

using torch::autograd::Node;
using torch::dynamo::autograd::AutogradCompilerCall;
using torch::dynamo::autograd::CompiledNodeArgs;
using torch::dynamo::autograd::SizeInput;

// Appends to the key without a library call per field (the walk writes a few dozen
// fields per node; see the lookup_us benchmark). The buffer only grows, so a walk that
// reuses a BackwardWalk neither allocates nor clears it.
class KeyWriter {
 public:
  explicit KeyWriter(std::string& buf) : buf_(buf), data_(buf.data()), cap_(buf.size()) {}
  // Inlined into each put (GCC stops inlining it once the file is large): a call per field
  // costs more than the write.
  C10_ALWAYS_INLINE void write(const void* p, size_t n) {
    if (C10_UNLIKELY(len + n > cap_)) grow(len + n);
    std::memcpy(data_ + len, p, n);
    len += n;
  }
  const char* data() const { return data_; }
  size_t len = 0;

 private:
  C10_NOINLINE void grow(size_t need) {
    buf_.resize(std::max(buf_.size() * 2, need + 4096));
    data_ = buf_.data();
    cap_ = buf_.size();
  }
  std::string& buf_;
  char* data_;
  size_t cap_;
};
template <class T>
C10_ALWAYS_INLINE void put(KeyWriter& key, const T& v) {
  key.write(&v, sizeof(T));
}

bool is_observer(const torch::autograd::FunctionPreHook* h) {
  return dynamic_cast<const capture::ObserverPreHook*>(h) != nullptr;
}
bool is_observer(const torch::autograd::FunctionPostHook* h) {
  return dynamic_cast<const capture::ObserverPostHook*>(h) != nullptr;
}

// SavedVariable::is_output_ is private; unpack() needs the node for a saved output (and
// must not get it for a saved input, see Note [Generated nodes described from their
// fields]). An explicit instantiation may name a private member ([temp.spec.general]),
// which is how this reads it.
struct SavedVariableIsOutput {
  using type = bool torch::autograd::SavedVariable::*;
  friend type member(SavedVariableIsOutput);
};
template <class Tag, typename Tag::type M>
struct Expose {
  friend typename Tag::type member(Tag) { return M; }
};
template struct Expose<SavedVariableIsOutput, &torch::autograd::SavedVariable::is_output_>;

bool is_saved_output(const torch::autograd::SavedVariable& sv) { return sv.*member(SavedVariableIsOutput{}); }

struct Walker;

// Visits the members of a generated node (Note [Generated nodes described from their
// fields]), twice: `write` false checks that every member can be described this way (ok),
// `write` true writes them into the walk.
struct FieldVisitor {
  Walker& walker;
  KeyWriter& key;  // walker's
  uint32_t id;
  bool write;
  bool ok = true;

  void operator()(const torch::autograd::SavedVariable& sv);
  void operator()(const at::Scalar& s);
  void operator()(const c10::SymInt& s);
  void operator()(const std::string& s);
  void operator()(at::ScalarType v) { bytes(v); }
  void operator()(at::Layout v) { bytes(v); }
  void operator()(bool v) { bytes(v); }
  void operator()(int64_t v) { bytes(v); }
  void operator()(double v) { bytes(v); }
  void operator()(size_t v) { bytes(v); }
  void operator()(const c10::TensorOptions& o) {  // what CompiledNodeArgs::collect takes
    bytes(static_cast<int8_t>(o.device().type()));
    bytes(o.device().index());
    bytes(o.dtype().id());
    bytes(o.layout());
    bytes(o.requires_grad());
    bytes(o.pinned_memory());
    (*this)(o.memory_format_opt());
  }
  void operator()(const torch::autograd::TypeAndSize& t) {
    (*this)(t.sym_sizes);
    (*this)(t.options);
  }
  void operator()(c10::MemoryFormat v) { bytes(v); }
  void operator()(const at::TensorGeometry& g) {  // sizes, strides, offset: all sizes
    (*this)(g.sym_sizes());
    (*this)(g.sym_strides());
    (*this)(g.sym_storage_offset());
  }
  void operator()(c10::SymIntArrayRef list) {
    bytes(static_cast<uint32_t>(list.size()));
    for (const c10::SymInt& x : list) (*this)(x);
  }
  template <class T>
  void operator()(const std::vector<T>& list) {
    bytes(static_cast<uint32_t>(list.size()));
    for (const T& x : list) (*this)(x);
  }
  template <class T>
  void operator()(const std::optional<T>& o) {
    bytes(o.has_value());
    if (o) (*this)(*o);
  }
  template <class T>
  void operator()(const c10::OptionalArray<T>& a) {
    (*this)(a.list);
  }

 private:
  template <class T>
  C10_ALWAYS_INLINE void bytes(const T& v) {
    if (write) put(key, v);
  }
};

using VisitFields = void (*)(const torch::autograd::Node&, FieldVisitor&);
struct GeneratedNode {
  const std::type_info* type;
  VisitFields visit;
};

namespace G = torch::autograd::generated;
#include "autograd/generated_nodes.inc"

std::atomic<bool> describe_generated_fields{true};

// The member visitor of a generated node type; null for the others.
VisitFields generated_visitor(const std::type_info& t) {
  static const auto* table = [] {
    auto* m = new std::unordered_map<std::string_view, VisitFields>();
    for (const GeneratedNode& g : kGeneratedNodes) m->emplace(g.type->name(), g.visit);
    return m;
  }();
  auto it = table->find(t.name());
  return it == table->end() ? nullptr : it->second;
}

// What the walk needs to know about a node type, computed once per type on this thread:
// Node::name() demangles on every call, and comparing type_infos costs a strcmp. The
// name's address stands for the type in keys; it is stable for the thread's life.
struct NodeType {
  enum class Kind : uint8_t { Root, AccumulateGrad, Replay, Other };
  std::string name;
  Kind kind;
  VisitFields visit;  // a generated node's members (non-null: see FieldVisitor)
};

// Pointer -> uint32_t, open addressing with linear probing; the walk's maps from nodes to
// NodeCall ids and from type_infos to NodeTypes. Never shrinks, so a walk that reuses
// it allocates nothing.
class PtrMap {
 public:
  static constexpr uint32_t kAbsent = UINT32_MAX;
  void clear() {
    if (size_ == 0) return;
    std::fill(slots_.begin(), slots_.end(), Slot{});
    size_ = 0;
  }
  C10_ALWAYS_INLINE uint32_t find(const void* p) const {
    if (slots_.empty()) return kAbsent;
    for (size_t i = home(p);; i = (i + 1) & mask_) {
      if (slots_[i].key == p) return slots_[i].value;
      if (slots_[i].key == nullptr) return kAbsent;
    }
  }
  // Inserts p -> value unless p is present; returns false if it was.
  C10_ALWAYS_INLINE bool insert(const void* p, uint32_t value) {
    if (2 * (size_ + 1) > slots_.size()) grow();
    for (size_t i = home(p);; i = (i + 1) & mask_) {
      if (slots_[i].key == p) return false;
      if (slots_[i].key == nullptr) {
        slots_[i] = {p, value};
        ++size_;
        return true;
      }
    }
  }

 private:
  struct Slot {
    const void* key = nullptr;
    uint32_t value = 0;
  };
  size_t home(const void* p) const {  // Fibonacci hashing of the address
    return static_cast<size_t>((reinterpret_cast<uintptr_t>(p) * 0x9E3779B97F4A7C15ull) >> shift_);
  }
  C10_NOINLINE void grow() {
    std::vector<Slot> old = std::move(slots_);
    const size_t n = old.empty() ? 256 : 2 * old.size();
    slots_.assign(n, Slot{});
    mask_ = n - 1;
    shift_ = 64 - static_cast<unsigned>(__builtin_ctzll(n));
    size_ = 0;
    for (const Slot& s : old) {
      if (s.key) insert(s.key, s.value);
    }
  }
  std::vector<Slot> slots_;
  size_t mask_ = 0;
  unsigned shift_ = 64;
  size_t size_ = 0;
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
      else if (t == aot::replay_node_type()) kind = NodeType::Kind::Replay;
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

  void size(uint32_t node, int64_t v) {
    // Field by field: a braced temporary makes GCC store two fields and load them back
    // as one, which stalls store forwarding on every size.
    SizeRef& s = w.sizes.emplace_back();
    s.node = node;
    s.value = v;
  }

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
      FieldVisitor check{*this, key, id, /*write=*/false};
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
      FieldVisitor v{*this, key, id, /*write=*/true};
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

void FieldVisitor::operator()(const torch::autograd::SavedVariable& sv) {
  if (!write) {
    ok = ok && !sv.has_hooks();
    return;
  }
  at::Tensor t = is_saved_output(sv) ? sv.unpack(walker.w.nodes[id]->getptr()) : sv.unpack();
  if (!t.defined()) {
    put(key, uint32_t{0});
    return;
  }
  const c10::TensorImpl* impl = t.unsafeGetTensorImpl();
  uint32_t k = walker.scratch.saved.find(impl);
  if (k == PtrMap::kAbsent) {
    k = static_cast<uint32_t>(walker.w.tensors.size());
    walker.scratch.saved.insert(impl, k);
    walker.w.tensors.push_back(std::move(t));
    walker.w.tensor_node.push_back(id);
    walker.scratch.fresh.push_back(k);
  }
  put(key, k + 1);
}

void FieldVisitor::operator()(const at::Scalar& s) {
  using c10::ScalarType;
  if (!write) {
    if (!ok || s.isSymbolic()) {
      ok = false;
      return;
    }
    const ScalarType type = s.type();  // the four compiled_args accepts
    ok = type == ScalarType::Double || type == ScalarType::Long || type == ScalarType::Bool ||
         type == ScalarType::ComplexDouble;
    return;
  }
  const ScalarType type = s.type();
  bytes(type);
  switch (type) {
    case ScalarType::Double: bytes(s.toDouble()); break;
    case ScalarType::Long: bytes(s.toLong()); break;
    case ScalarType::Bool: bytes(s.toBool()); break;
    default: {  // ComplexDouble (the check admits no other)
      const auto c = s.toComplexDouble();
      bytes(c.real());
      bytes(c.imag());
    }
  }
}

void FieldVisitor::operator()(const c10::SymInt& s) {
  const auto v = s.maybe_as_int();
  if (!write) {
    ok = ok && v.has_value();
    return;
  }
  walker.size(id, *v);
}

void FieldVisitor::operator()(const std::string& s) {
  bytes(static_cast<uint32_t>(s.size()));
  if (write) key.write(s.data(), s.size());
}

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
  if (w.why_not.empty()) walker.take_saved();
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

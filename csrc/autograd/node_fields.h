// Describing LibTorch's generated autograd nodes by their members, for compiled
// autograd's backward key (Note [Generated nodes described from their fields]): the
// FieldVisitor that the generated per-node visitors (autograd/generated/, written by
// tools/gen_node_describers.py) call once per member, and the lookup from a node's type to
// its visitor. Why apart from the walk: the generated list depends only on this
// interface and on autograd_shim.h, so LibTorch's node classes stay out of walk.cpp.
// Preconditions of a visit: the node is of the type its visitor was generated for. A
// FieldVisitor with `write` false only checks (ok); with `write` true it writes the
// members into the walk (key bytes, sizes, lifted saved tensors).
//
// Note [Generated nodes described from their fields]
// Node::compiled_args is the general way to describe a node, but for the nodes LibTorch
// generates (Functions.h: SinBackward0, MulBackward0, MmBackward0, ...) it is expensive:
// every saved tensor goes through TensorArgs, two std::unordered_map inserts (a malloc
// each) plus the compiler's teardown; on ca_chain that was a third of the walk. A
// generated node's compiled_args only collects the node's members, one after another,
// so for the generated nodes whose members all have types FieldVisitor knows (all 701 of
// LibTorch 2.11's; generated/node_describers.cpp, written by
// tools/gen_node_describers.py from the installed Functions.h) the walk describes the
// members itself, with the same meaning:
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
#pragma once

#include "autograd/autograd_shim.h"
#include "autograd/key_writer.h"
#include "autograd/ptr_map.h"
#include "autograd/walk.h"

#include <c10/util/ArrayRef.h>

#include <cstdint>
#include <optional>
#include <string>
#include <typeinfo>
#include <vector>

namespace tcap::ca {

// Visits the members of a generated node (Note [Generated nodes described from their
// fields]), twice: `write` false checks that every member can be described this way (ok),
// `write` true writes them into the walk.
struct FieldVisitor {
  BackwardWalk& w;
  KeyWriter& key;                // the walk's
  PtrMap& saved;                 // TensorImpl -> index in w.tensors
  std::vector<uint32_t>& fresh;  // tensors lifted for the current node (appended)
  uint32_t id;                   // the node's NodeCall id
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

// The generated list (autograd/generated/node_describers.cpp): one entry per node type.
c10::ArrayRef<GeneratedNode> generated_nodes();

// The member visitor of a generated node type; null for the others.
VisitFields generated_visitor(const std::type_info& t);

}  // namespace tcap::ca

#include "autograd/node_fields.h"

#include <string_view>
#include <unordered_map>

namespace tcap::ca {

void FieldVisitor::operator()(const torch::autograd::SavedVariable& sv) {
  if (!write) {
    ok = ok && !sv.has_hooks();
    return;
  }
  at::Tensor t = is_saved_output(sv) ? sv.unpack(w.nodes[id]->getptr()) : sv.unpack();
  if (!t.defined()) {
    put(key, uint32_t{0});
    return;
  }
  const c10::TensorImpl* impl = t.unsafeGetTensorImpl();
  uint32_t k = saved.find(impl);
  if (k == PtrMap::kAbsent) {
    k = static_cast<uint32_t>(w.tensors.size());
    saved.insert(impl, k);
    w.tensors.push_back(std::move(t));
    w.tensor_node.push_back(id);
    fresh.push_back(k);
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
  w.add_size(id, *v);
}

void FieldVisitor::operator()(const std::string& s) {
  bytes(static_cast<uint32_t>(s.size()));
  if (write) key.write(s.data(), s.size());
}

VisitFields generated_visitor(const std::type_info& t) {
  static const auto* table = [] {
    auto* m = new std::unordered_map<std::string_view, VisitFields>();
    for (const GeneratedNode& g : generated_nodes()) m->emplace(g.type->name(), g.visit);
    return m;
  }();
  auto it = table->find(t.name());
  return it == table->end() ? nullptr : it->second;
}

}  // namespace tcap::ca

// Note [Held tensors] (cache/guards.h): tensors an entry holds weakly, and the references
// tcap itself keeps to them.
#include "cache/guards.h"

namespace tcap::cache {

void HeldTensors::hold(const std::vector<at::Tensor>& tensors, const std::vector<std::string>& names) {
  held_.clear();
  for (size_t k = 0; k < tensors.size(); ++k) {
    Held h;
    h.weak = c10::weak_intrusive_ptr<c10::TensorImpl>(tensors[k].getIntrusivePtr());
    h.impl = tensors[k].unsafeGetTensorImpl();
    h.meta = TensorGuard::of(tensors[k], k < names.size() ? names[k] : "held" + std::to_string(k));
    held_.push_back(std::move(h));
  }
}

std::string HeldTensors::lock(std::vector<at::Tensor>& out) const {
  const size_t first = out.size();
  auto fail = [&](const std::string& why) {
    out.resize(first);
    return why;
  };
  for (const Held& h : held_) {
    // The strong references before this call takes one: the program's and tcap's own.
    const int64_t refs = static_cast<int64_t>(h.weak.use_count()) - h.own->load(std::memory_order_relaxed);
    if (h.weak.expired()) return fail("the tensor '" + h.meta.name + "' it read from outside its inputs was freed");
    if (refs <= 0) {
      return fail("the tensor '" + h.meta.name + "' it read from outside its inputs is no longer referred to by " +
                  "the program (it was replaced)");
    }
    at::Tensor t(h.weak.lock());
    if (!t.defined()) return fail("the tensor '" + h.meta.name + "' it read from outside its inputs was freed");
    std::string m;
    if (h.meta.check_except_shape(t, Why(&m)) &&
        (t.sizes() != c10::IntArrayRef(h.meta.sizes) || t.strides() != c10::IntArrayRef(h.meta.strides))) {
      m = "changed shape: " + shape_str(h.meta.sizes) + " stride " + shape_str(h.meta.strides) + " -> " +
          shape_str(t.sizes()) + " stride " + shape_str(t.strides());
    }
    if (!m.empty()) return fail("the tensor '" + h.meta.name + "' it read from outside its inputs " + m);
    out.push_back(std::move(t));
  }
  return "";
}

std::vector<std::string> HeldTensors::describe() const {
  std::vector<std::string> out;
  for (const Held& h : held_) out.push_back("held " + h.meta.name + ": " + h.meta.str() + ", alive and referred to by the program");
  return out;
}

OwnRefsLease::OwnRefsLease(const HeldTensors& held, c10::ArrayRef<at::Tensor> tensors) {
  for (size_t k = 0; k < held.size(); ++k) {
    int n = 0;
    for (const auto& t : tensors) n += t.defined() && t.unsafeGetTensorImpl() == held.impl(k);
    if (n == 0) continue;
    held.own_refs(k)->fetch_add(n, std::memory_order_relaxed);
    counts_.emplace_back(held.own_refs(k), n);
  }
}

OwnRefsLease& OwnRefsLease::operator=(OwnRefsLease&& o) noexcept {
  if (this != &o) {
    release();
    counts_ = std::move(o.counts_);
  }
  return *this;
}

void OwnRefsLease::release() {
  for (auto& [counter, n] : counts_) counter->fetch_sub(n, std::memory_order_relaxed);
  counts_.clear();
}

}  // namespace tcap::cache

#include "capture/value_table.h"

#include <c10/core/InferenceMode.h>

namespace tcap::capture {

bool ValueTable::Geometry::matches(const at::Tensor& t) const {
  return offset == t.storage_offset() && dtype == t.scalar_type() && device == t.device() &&
         c10::IntArrayRef(sizes) == t.sizes() && c10::IntArrayRef(strides) == t.strides();
}

// Inference tensors have no version counter, and views made under InferenceMode see
// version bumps that no op accounts for: both are trusted by identity alone.
static bool trust_identity(const at::Tensor& t) {
  return t.is_inference() || c10::InferenceMode::is_enabled();
}

static bool has_strided_storage(const at::Tensor& t) {
  return t.has_storage() && t.layout() == c10::kStrided && t.storage().unsafeGetStorageImpl();
}

ValueTable::StorageRecord* ValueTable::record_of(const at::Tensor& t) const {
  if (!has_strided_storage(t)) return nullptr;
  auto it = storages_.find(t.storage().unsafeGetStorageImpl());
  return it == storages_.end() ? nullptr : &it->second;
}

bool ValueTable::still_valid(Slot& s, const at::Tensor& t, int64_t writes) const {
  if (s.version == kTrusted || t.is_inference()) return true;
  if (s.version == kPending) {
    // First use since define(): adopt the counter as it is now (see the Note).
    s.version = static_cast<int64_t>(t._version());
    s.storage_writes = writes;
    return true;
  }
  const int64_t moved = static_cast<int64_t>(t._version()) - s.version;
  return moved >= 0 && moved <= writes - s.storage_writes;
}

bool ValueTable::alias_valid(const Slot& s, const at::Tensor& t, int64_t writes) const {
  if (s.version == kTrusted || s.version == kPending || t.is_inference()) return true;
  const int64_t v = static_cast<int64_t>(t._version());
  // The same counter as the defining tensor, moved only by recorded writes ...
  if (v >= s.version && v - s.version <= writes - s.storage_writes) return true;
  // ... or a fresh counter of its own that saw only recorded writes.
  return v <= writes - s.define_writes;
}

std::optional<ir::ValueId> ValueTable::lookup(const at::Tensor& t) const {
  StorageRecord* rec = record_of(t);
  const int64_t writes = rec ? rec->writes : 0;
  const Slot* best = nullptr;
  auto it = by_impl_.find(t.unsafeGetTensorImpl());
  if (it != by_impl_.end() && still_valid(it->second, t, writes)) {
    best = &it->second;
    // Only a later binding of another tensor with this geometry can shadow it.
    if (!rec || rec->shadow_seq < best->seq) return best->value;
  }
  if (rec) {
    for (auto& [geometry, slot] : rec->views) {
      if (!geometry.matches(t)) continue;
      // The same tensor's own binding is by_impl_'s (already checked above).
      const bool same_impl = slot.pin._unsafe_get_target() == t.unsafeGetTensorImpl();
      if (!same_impl && (!best || slot.seq > best->seq) && alias_valid(slot, t, writes)) best = &slot;
      break;
    }
  }
  if (!best) return std::nullopt;
  return best->value;
}

ValueTable::StorageRecord* ValueTable::make_record(const at::Tensor& t) {
  if (!has_strided_storage(t)) return nullptr;
  auto* storage = t.storage().unsafeGetStorageImpl();
  auto it = storages_.find(storage);
  if (it == storages_.end()) {
    StorageRecord rec{c10::weak_intrusive_ptr<c10::StorageImpl>(
                          c10::intrusive_ptr<c10::StorageImpl>::reclaim_copy(storage)),
                      /*writes=*/0, /*shadow_seq=*/-1, /*views=*/{}};
    it = storages_.emplace(storage, std::move(rec)).first;
  }
  return &it->second;
}

void ValueTable::note_write(const at::Tensor& t) {
  if (StorageRecord* rec = make_record(t)) ++rec->writes;
}

void ValueTable::define(const at::Tensor& t, ir::ValueId v) {
  StorageRecord* rec = make_record(t);
  const int64_t writes = rec ? rec->writes : 0;
  Slot s{c10::weak_intrusive_ptr<c10::TensorImpl, c10::UndefinedTensorImpl>(
             c10::intrusive_ptr<c10::TensorImpl, c10::UndefinedTensorImpl>::reclaim_copy(
                 t.unsafeGetTensorImpl())),
         v, trust_identity(t) ? kTrusted : kPending, writes, writes, next_seq_++};
  if (rec) {
    bool replaced = false;
    for (auto& [geometry, slot] : rec->views) {
      if (!geometry.matches(t)) continue;
      if (slot.pin._unsafe_get_target() != t.unsafeGetTensorImpl()) rec->shadow_seq = s.seq;
      slot = s;
      replaced = true;
      break;
    }
    if (!replaced) {
      Geometry g{t.storage_offset(), ir::Dims(t.sizes().begin(), t.sizes().end()),
                 ir::Dims(t.strides().begin(), t.strides().end()), t.scalar_type(), t.device()};
      rec->views.emplace_back(std::move(g), s);
    }
  }
  auto [it, inserted] = by_impl_.emplace(t.unsafeGetTensorImpl(), s);
  if (!inserted) it->second = std::move(s);
}

}  // namespace tcap::capture

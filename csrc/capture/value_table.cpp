#include "capture/value_table.h"

#include <c10/core/InferenceMode.h>

namespace tcap::capture {

// Inference tensors have no version counter, and views made under InferenceMode see
// version bumps that no op accounts for: both are trusted by identity alone.
static bool trust_identity(const at::Tensor& t) {
  return t.is_inference() || c10::InferenceMode::is_enabled();
}

// t's storage if t is strided and has one: only those get a storage record.
static const c10::Storage* strided_storage(const at::Tensor& t) {
  if (!t.has_storage() || t.layout() != c10::kStrided) return nullptr;
  const c10::Storage& s = t.storage();
  return s.unsafeGetStorageImpl() ? &s : nullptr;
}

bool ValueTable::same_geometry(ir::ValueId v, const at::Tensor& t) const {
  // See Note [Geometry from the graph].
  const ir::TensorMeta& m = graph_.values()[static_cast<size_t>(v)].meta;
  return m.storage_offset == t.storage_offset() && m.dtype == t.scalar_type() && m.device == t.device() &&
         c10::IntArrayRef(m.sizes) == t.sizes() && c10::IntArrayRef(m.strides) == t.strides();
}

int32_t ValueTable::record_of(const c10::StorageImpl* storage) const {
  if (!storage) return kNoRecord;
  auto it = record_index_.find(storage);
  return it == record_index_.end() ? kNoRecord : it->second;
}

int32_t ValueTable::make_record(const c10::Storage& storage) {
  auto [it, inserted] = record_index_.emplace(storage.unsafeGetStorageImpl(), static_cast<int32_t>(records_.size()));
  if (inserted) records_.push_back(StorageRecord{storage.getWeakStorageImpl(), /*writes=*/0, /*shadow_seq=*/-1, /*views=*/{}});
  return it->second;
}

bool ValueTable::still_valid(Binding& b, const at::Tensor& t, int64_t writes) const {
  if (b.version == kTrusted || t.is_inference()) return true;
  if (b.version == kPending) {
    // First use since define(): adopt the counter as it is now (see the Note).
    b.version = static_cast<int64_t>(t._version());
    b.storage_writes = writes;
    return true;
  }
  const int64_t moved = static_cast<int64_t>(t._version()) - b.version;
  return moved >= 0 && moved <= writes - b.storage_writes;
}

bool ValueTable::alias_valid(const Binding& b, const at::Tensor& t, int64_t writes) const {
  if (b.version == kTrusted || b.version == kPending || t.is_inference()) return true;
  const int64_t v = static_cast<int64_t>(t._version());
  // The same counter as the defining tensor, moved only by recorded writes ...
  if (v >= b.version && v - b.version <= writes - b.storage_writes) return true;
  // ... or a fresh counter of its own that saw only recorded writes.
  return v <= writes - b.define_writes;
}

std::optional<ir::ValueId> ValueTable::lookup(const at::Tensor& t) const {
  const c10::Storage* storage = strided_storage(t);
  const c10::StorageImpl* storage_impl = storage ? storage->unsafeGetStorageImpl() : nullptr;
  auto it = by_impl_.find(t.unsafeGetTensorImpl());
  // The record found at define() serves while the tensor keeps its storage (set_() can
  // re-point it): no second hash lookup for the common hit.
  const int32_t rec_id = it != by_impl_.end() && it->second.storage == storage_impl ? it->second.binding.record
                                                                                   : record_of(storage_impl);
  const StorageRecord* rec = rec_id == kNoRecord ? nullptr : &records_[static_cast<size_t>(rec_id)];
  const int64_t writes = rec ? rec->writes : 0;
  const Binding* best = nullptr;
  if (it != by_impl_.end() && still_valid(it->second.binding, t, writes)) {
    best = &it->second.binding;
    // Only a later binding of another tensor with this geometry can shadow it.
    if (!rec || rec->shadow_seq < best->seq) return best->value;
  }
  if (rec) {
    for (const ViewSlot& view : rec->views) {
      if (!same_geometry(view.binding.value, t)) continue;
      // The same tensor's own binding is by_impl_'s (already checked above).
      const bool same_impl = view.impl == t.unsafeGetTensorImpl();
      // Another tensor's later binding shadows t's own only if the storage was written
      // between the two: then it holds data t's binding does not. With no write between
      // (x and x.detach(), x and a view_as of it), both hold the same data and t keeps its
      // own value, so that a recorded op reads x itself, not a detached alias of it (a
      // recompute through autograd differentiates the graph's edges).
      const bool newer_data = best && view.binding.seq > best->seq && view.binding.define_writes != best->define_writes;
      if (!same_impl && (!best || newer_data) && alias_valid(view.binding, t, writes)) {
        best = &view.binding;
      }
      break;
    }
  }
  if (!best) return std::nullopt;
  return best->value;
}

void ValueTable::reserve(size_t tensors, size_t storages) {
  by_impl_.reserve(tensors);
  record_index_.reserve(storages);
  records_.reserve(storages);
}

void ValueTable::note_write(const at::Tensor& t) {
  if (const c10::Storage* storage = strided_storage(t)) ++records_[static_cast<size_t>(make_record(*storage))].writes;
}

void ValueTable::define(const at::Tensor& t, ir::ValueId v) {
  c10::TensorImpl* impl = t.unsafeGetTensorImpl();
  const c10::Storage* storage = strided_storage(t);
  const int32_t rec_id = storage ? make_record(*storage) : kNoRecord;
  const int64_t writes = rec_id == kNoRecord ? 0 : records_[static_cast<size_t>(rec_id)].writes;
  const Binding b{v, rec_id, trust_identity(t) ? kTrusted : kPending, writes, writes, next_seq_++};
  if (rec_id != kNoRecord) {
    StorageRecord& rec = records_[static_cast<size_t>(rec_id)];
    bool replaced = false;
    for (ViewSlot& view : rec.views) {
      if (!same_geometry(view.binding.value, t)) continue;
      if (view.impl != impl) rec.shadow_seq = b.seq;
      view = ViewSlot{impl, b};
      replaced = true;
      break;
    }
    if (!replaced) rec.views.push_back(ViewSlot{impl, b});
  }
  // One hash probe: the pin is made only when the impl is new (ska's emplace converts
  // the argument only when it inserts).
  struct NewSlot {
    const at::Tensor& t;
    operator ImplSlot() const {  // NOLINT(google-explicit-constructor)
      return ImplSlot{c10::weak_intrusive_ptr<c10::TensorImpl, c10::UndefinedTensorImpl>(t.getIntrusivePtr()),
                      nullptr, Binding{}};
    }
  };
  ImplSlot& slot = by_impl_.emplace(impl, NewSlot{t}).first->second;
  slot.storage = storage ? storage->unsafeGetStorageImpl() : nullptr;
  slot.binding = b;
}

}  // namespace tcap::capture

#include "capture/value_table.h"

#include <c10/core/InferenceMode.h>
#include <c10/util/hash.h>

namespace tcap::capture {

bool ValueTable::ViewKey::operator==(const ViewKey& o) const {
  return storage == o.storage && offset == o.offset && sizes == o.sizes &&
         strides == o.strides && dtype == o.dtype && device == o.device;
}

size_t ValueTable::ViewKeyHash::operator()(const ViewKey& k) const {
  size_t h = c10::get_hash(k.storage, k.offset, static_cast<int>(k.dtype));
  for (int64_t s : k.sizes) h = c10::hash_combine(h, static_cast<size_t>(s));
  for (int64_t s : k.strides) h = c10::hash_combine(h, static_cast<size_t>(s));
  return h;
}

std::optional<ValueTable::ViewKey> ValueTable::view_key(const at::Tensor& t) {
  if (!t.has_storage() || !t.storage().unsafeGetStorageImpl()) return std::nullopt;
  return ViewKey{t.storage().unsafeGetStorageImpl(),
                 t.storage_offset(),
                 c10::SmallVector<int64_t, 6>(t.sizes().begin(), t.sizes().end()),
                 c10::SmallVector<int64_t, 6>(t.strides().begin(), t.strides().end()),
                 t.scalar_type(),
                 t.device()};
}

int64_t ValueTable::writes_of(const at::Tensor& t) const {
  if (!t.has_storage()) return 0;
  auto it = writes_.find(t.storage().unsafeGetStorageImpl());
  return it == writes_.end() ? 0 : it->second;
}

// Inference tensors have no version counter, and views made under InferenceMode see
// version bumps that no op accounts for: both are trusted by identity alone.
static bool trust_identity(const at::Tensor& t) {
  return t.is_inference() || c10::InferenceMode::is_enabled();
}

ValueTable::Slot ValueTable::make_slot(const at::Tensor& t, ir::ValueId v) {
  return Slot{c10::weak_intrusive_ptr<c10::TensorImpl, c10::UndefinedTensorImpl>(
                  c10::intrusive_ptr<c10::TensorImpl, c10::UndefinedTensorImpl>::reclaim_copy(
                      t.unsafeGetTensorImpl())),
              v, trust_identity(t) ? kTrusted : kPending, writes_of(t), writes_of(t), next_seq_++};
}

bool ValueTable::still_valid(Slot& s, const at::Tensor& t) const {
  if (s.version == kTrusted || t.is_inference()) return true;
  if (s.version == kPending) {
    // First use since define(): adopt the counter as it is now (see the Note).
    s.version = static_cast<int64_t>(t._version());
    s.storage_writes = writes_of(t);
    return true;
  }
  const int64_t moved = static_cast<int64_t>(t._version()) - s.version;
  return moved >= 0 && moved <= writes_of(t) - s.storage_writes;
}

bool ValueTable::alias_valid(const Slot& s, const at::Tensor& t) const {
  if (s.version == kTrusted || s.version == kPending || t.is_inference()) return true;
  const int64_t v = static_cast<int64_t>(t._version());
  const int64_t writes = writes_of(t);
  // The same counter as the defining tensor, moved only by recorded writes ...
  if (v >= s.version && v - s.version <= writes - s.storage_writes) return true;
  // ... or a fresh counter of its own that saw only recorded writes.
  return v <= writes - s.define_writes;
}

std::optional<ir::ValueId> ValueTable::lookup(const at::Tensor& t) const {
  const Slot* best = nullptr;
  auto it = by_impl_.find(t.unsafeGetTensorImpl());
  if (it != by_impl_.end() && still_valid(it->second, t)) {
    best = &it->second;
    auto nt = t.has_storage() ? newest_on_storage_.find(t.storage().unsafeGetStorageImpl())
                              : newest_on_storage_.end();
    if (nt == newest_on_storage_.end() || nt->second == best->seq) return best->value;
  }
  if (auto key = view_key(t)) {
    auto jt = by_view_.find(*key);
    if (jt != by_view_.end() && (!best || jt->second.seq > best->seq)) {
      Slot& s = jt->second;
      const bool same_impl = s.pin._unsafe_get_target() == t.unsafeGetTensorImpl();
      if (same_impl ? still_valid(s, t) : alias_valid(s, t)) best = &s;
    }
  }
  if (!best) return std::nullopt;
  return best->value;
}

void ValueTable::note_write(const at::Tensor& t) {
  if (t.has_storage()) ++writes_[t.storage().unsafeGetStorageImpl()];
}

void ValueTable::define(const at::Tensor& t, ir::ValueId v) {
  Slot s = make_slot(t, v);
  if (auto key = view_key(t)) {
    newest_on_storage_[key->storage] = s.seq;
    if (!pinned_storages_.count(key->storage)) {
      pinned_storages_.emplace(key->storage,
                               c10::weak_intrusive_ptr<c10::StorageImpl>(
                                   c10::intrusive_ptr<c10::StorageImpl>::reclaim_copy(
                                       t.storage().unsafeGetStorageImpl())));
    }
    by_view_.erase(*key);
    by_view_.emplace(std::move(*key), s);
  }
  by_impl_.erase(t.unsafeGetTensorImpl());
  by_impl_.emplace(t.unsafeGetTensorImpl(), std::move(s));
}

}  // namespace tcap::capture

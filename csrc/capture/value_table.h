// Identity of tensors seen during a real execution.
//
// Note [Tensor identity during capture]
// A recorded tensor is found again by its TensorImpl*, pinned with a weak_intrusive_ptr
// so that a freed TensorImpl's address cannot be reused by a different tensor while the
// capture lives (the JIT tracer's WeakIValue idea). Tensors re-wrapped by autograd
// (unpacked saved outputs, .data(), variable_data()) have a new TensorImpl over the same
// memory: they are found through a second key, (storage, offset, sizes, strides, dtype).
// A hit is only trusted if the tensor's version counter moved no more than the number of
// recorded writes to its storage since the value was first used; anything else means the
// tensor was written behind the dispatcher's back and it becomes a fresh graph input.
// The counter is read at first use, not at define(): we record below ADInplaceOrView,
// which bumps the version of an in-place op's output and swaps a view's counter for its
// base's only after our fallback returns. Inference tensors have no version counter and
// are trusted by identity alone.
//
// Note [Geometry from the graph]
// A storage record lists the newest binding per geometry (offset, sizes, strides, dtype,
// device). The geometry is not copied into the table: define(t, v) is only called with a
// value v whose graph metadata was just filled from t, and capture never changes a
// value's recorded geometry afterwards, so the table compares against graph_.value(v).meta.
// One copy of the sizes and strides per output, in the graph, instead of two.
#pragma once

#include <tcap/graph.h>

#include <ATen/core/Tensor.h>
#include <c10/util/SmallVector.h>
#include <c10/util/flat_hash_map.h>
#include <c10/util/intrusive_ptr.h>

#include <optional>
#include <vector>

namespace tcap::capture {

class ValueTable {
 public:
  // Geometries are read from `graph`'s value metadata (see Note [Geometry from the graph]).
  explicit ValueTable(const ir::Graph& graph) : graph_(graph) {}

  // The value currently bound to t, if any (see the Note above).
  std::optional<ir::ValueId> lookup(const at::Tensor& t) const;
  // Binds t (and its storage and geometry) to v, whose metadata must describe t.
  void define(const at::Tensor& t, ir::ValueId v);
  // Counts a recorded write to t's storage (call before define() of the new version).
  void note_write(const at::Tensor& t);
  // Room for this many tensors and storages before the tables grow.
  void reserve(size_t tensors, size_t storages);

 private:
  static constexpr int32_t kNoRecord = -1;
  struct Binding {
    ir::ValueId value;
    int32_t record;          // t's storage record at define(), or kNoRecord
    int64_t version;         // t._version() at first use, or kPending / kTrusted
    int64_t storage_writes;  // recorded writes to the storage when `version` was read
    int64_t define_writes;   // recorded writes to the storage at define()
    int64_t seq;             // definition order: the newest binding wins
  };
  // by_impl_'s entry: the pin keeps the TensorImpl's address from being reused while the
  // capture lives, so other structures may hold the bare pointer.
  struct ImplSlot {
    c10::weak_intrusive_ptr<c10::TensorImpl, c10::UndefinedTensorImpl> pin;
    const c10::StorageImpl* storage;  // t's storage at define(), nullptr if none
    Binding binding;
  };
  // A binding seen through its storage: re-wrapped aliases are found this way.
  struct ViewSlot {
    const c10::TensorImpl* impl;  // pinned by by_impl_
    Binding binding;
  };
  // Per storage: the pin (a storage address cannot be reused while the capture lives),
  // the count of recorded writes, and the newest binding per geometry.
  struct StorageRecord {
    c10::weak_intrusive_ptr<c10::StorageImpl> pin;
    int64_t writes = 0;
    int64_t shadow_seq = -1;  // last define that replaced another tensor's binding here
    c10::SmallVector<ViewSlot, 1> views;  // usually one: no heap
  };
  static constexpr int64_t kTrusted = -1;  // no version check (inference tensors)
  static constexpr int64_t kPending = -2;  // version not read yet
  // Does the value's recorded geometry (offset, sizes, strides, dtype, device) match t's?
  bool same_geometry(ir::ValueId v, const at::Tensor& t) const;
  int32_t record_of(const c10::StorageImpl* storage) const;  // kNoRecord if none yet
  int32_t make_record(const c10::Storage& storage);
  bool still_valid(Binding& b, const at::Tensor& t, int64_t writes) const;
  bool alias_valid(const Binding& b, const at::Tensor& t, int64_t writes) const;

  const ir::Graph& graph_;
  // mutable: a lookup may adopt a pending binding's version (still_valid).
  mutable ska::flat_hash_map<const c10::TensorImpl*, ImplSlot> by_impl_;
  // The map holds indices into records_: a rehash moves small entries, not records, and
  // a binding can name its record without a second hash lookup.
  ska::flat_hash_map<const c10::StorageImpl*, int32_t> record_index_;
  std::vector<StorageRecord> records_;
  int64_t next_seq_ = 0;
};

}  // namespace tcap::capture

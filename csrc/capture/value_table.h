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
  // The value currently bound to t, if any (see the Note above).
  std::optional<ir::ValueId> lookup(const at::Tensor& t) const;
  // Binds t (and its storage view key) to v.
  void define(const at::Tensor& t, ir::ValueId v);
  // Counts a recorded write to t's storage (call before define() of the new version).
  void note_write(const at::Tensor& t);

 private:
  struct Slot {
    c10::weak_intrusive_ptr<c10::TensorImpl, c10::UndefinedTensorImpl> pin;
    ir::ValueId value;
    int64_t version;         // t._version() at first use, or kPending / kTrusted
    int64_t storage_writes;  // recorded writes to the storage when `version` was read
    int64_t define_writes;   // recorded writes to the storage at define()
    int64_t seq;             // definition order: the newest binding wins
  };
  // Where a tensor looks into its storage; compared against a tensor without copying.
  struct Geometry {
    int64_t offset;
    ir::Dims sizes, strides;
    c10::ScalarType dtype;
    c10::Device device;
    bool matches(const at::Tensor& t) const;
  };
  // Per storage: the pin (a storage address cannot be reused while the capture lives),
  // the count of recorded writes, and the newest binding per geometry, through which
  // re-wrapped aliases are found.
  struct StorageRecord {
    c10::weak_intrusive_ptr<c10::StorageImpl> pin;
    int64_t writes = 0;
    int64_t shadow_seq = -1;  // last define that replaced another tensor's binding here
    c10::SmallVector<std::pair<Geometry, Slot>, 1> views;  // usually one: no heap
  };
  static constexpr int64_t kTrusted = -1;  // no version check (inference tensors)
  static constexpr int64_t kPending = -2;  // version not read yet
  StorageRecord* record_of(const at::Tensor& t) const;  // nullptr if none yet
  StorageRecord* make_record(const at::Tensor& t);       // nullptr if t has no storage
  bool still_valid(Slot& s, const at::Tensor& t, int64_t writes) const;
  bool alias_valid(const Slot& s, const at::Tensor& t, int64_t writes) const;

  // mutable: a lookup may adopt a pending slot's version (still_valid).
  mutable ska::flat_hash_map<const c10::TensorImpl*, Slot> by_impl_;
  mutable ska::flat_hash_map<const void*, StorageRecord> storages_;
  int64_t next_seq_ = 0;
};

}  // namespace tcap::capture

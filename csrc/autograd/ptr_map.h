// PtrMap: pointer -> uint32_t, the walk's hash map (walk.cpp, node_fields.cpp). Its own
// header because two files of the walk share it; internal to autograd/.
#pragma once

#include <c10/macros/Macros.h>

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <vector>

namespace tcap::ca {

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

}  // namespace tcap::ca

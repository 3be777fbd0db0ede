// Dynamic sizes of compiled entries: mark, generalize, specialize (DESIGN.md D6), for
// tcap::compile, compile_step and compiled autograd alike.
//
// Note [Dynamic sizes]
// An entry is captured at concrete sizes: the dims of its input tensors (compile,
// compile_step) or the sizes the autograd walk read (compiled autograd), flattened into
// one list. When a call misses an entry only because some of those sizes changed, they
// are *marked* dynamic: the call is captured at its own sizes and the two graphs are
// compared (*generalize*). Sizes that changed together from the same value to the same
// value form one class (a batch dim shared by an input and a target). If the two graphs
// are the same except for integers (op arguments, tensor sizes, strides, offsets) that
// are each m * size + c of exactly one class, the new entry becomes dynamic: it accepts
// any size >= 2 for each class (the members of a class must stay equal), and a call at
// new sizes is served by patching those integers into a copy of the graph and compiling
// it again, without running the user's code (*specialize*; one specialization per
// distinct class values, cached). Anything else keeps the entry static, with the reason
// logged: a float computed from a size, a different op sequence, an integer two classes
// could both explain, a size that changed to or from 0 or 1.
#pragma once

#include "passes/int_patches.h"

#include <tcap/graph.h>

#include <cstdint>
#include <map>
#include <memory>
#include <mutex>
#include <string>
#include <vector>

namespace tcap::cache {

struct DynamicSizes {
  std::vector<int> size_class;               // per size: -1 static, else its class
  std::vector<passes::IntPatch> patches;     // IntPatch::size is a class
  size_t num_classes = 0;
  std::vector<int64_t> own_key;              // the class values the entry was captured at

  bool dynamic() const { return num_classes > 0; }
  bool is_dynamic(size_t i) const { return i < size_class.size() && size_class[i] >= 0; }
};

// The positions where `now` differs from `captured` (same length).
std::vector<size_t> changed_sizes(const std::vector<int64_t>& captured, const std::vector<int64_t>& now);

// Checks sizes against an entry captured at `captured`: static sizes must be equal, each
// class's members equal to each other and >= 2. Appends the positions that do not fit to
// `misfits` (when given). Returns whether all fit.
class SizeCheck {
 public:
  SizeCheck(const DynamicSizes& d, const std::vector<int64_t>& captured) : d_(d), captured_(captured) {}
  // Whether size i (the call's value `now`) fits.
  bool fits(size_t i, int64_t now);
  // The class values seen so far (the specialization key), in class order.
  std::vector<int64_t> key() const;

 private:
  const DynamicSizes& d_;
  const std::vector<int64_t>& captured_;
  std::vector<std::pair<int, int64_t>> seen_;  // (class, value)
};

// Generalizes b (captured at sizes_b) against a (captured at sizes_a): on success fills
// `out` and returns "", else why b stays static. `changed` are the positions that differ.
std::string generalize(const ir::Graph& a, const std::vector<int64_t>& sizes_a, const ir::Graph& b,
                       const std::vector<int64_t>& sizes_b, const std::vector<size_t>& changed, DynamicSizes* out);

// A copy of g with its integers patched for the class values `key`.
ir::Graph specialize(const ir::Graph& g, const DynamicSizes& d, const std::vector<int64_t>& key);

// Specializations of one dynamic entry, by class values (thread-safe).
template <class T>
class Specializations {
 public:
  std::shared_ptr<T> find(const std::vector<int64_t>& key) const {
    std::lock_guard<std::mutex> lock(mutex_);
    auto it = map_.find(key);
    return it == map_.end() ? nullptr : it->second;
  }
  // Keeps the first one stored for a key (two threads may specialize at once).
  std::shared_ptr<T> insert(const std::vector<int64_t>& key, std::shared_ptr<T> t) {
    std::lock_guard<std::mutex> lock(mutex_);
    auto& slot = map_[key];
    if (!slot) slot = std::move(t);
    return slot;
  }
  size_t size() const {
    std::lock_guard<std::mutex> lock(mutex_);
    return map_.size();
  }

 private:
  mutable std::mutex mutex_;
  std::map<std::vector<int64_t>, std::shared_ptr<T>> map_;
};

}  // namespace tcap::cache

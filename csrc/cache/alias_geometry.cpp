// Note [Alias geometry guards] (cache/guards.h): which tensors of a call share memory, and
// exactly how.
#include "cache/guards.h"

#include <algorithm>
#include <string>
#include <unordered_map>

namespace tcap::cache {

namespace {

const void* alias_key(const at::Tensor& t) {
  return t.defined() && t.has_storage() ? static_cast<const void*>(t.storage().unsafeGetStorageImpl())
                                        : static_cast<const void*>(t.unsafeGetTensorImpl());
}

// Whether ts's alias classes are `classes` (as alias_classes would compute them), without
// building them: every tensor shares its class representative's memory, and the
// representatives' memories are distinct (sorted, not compared pairwise: a step has
// hundreds of tensors).
bool same_alias_classes(c10::ArrayRef<at::Tensor> ts, const std::vector<int>& classes) {
  if (ts.size() != classes.size()) return false;
  c10::SmallVector<const void*, 32> reps;
  for (size_t k = 0; k < ts.size(); ++k) {
    const auto f = static_cast<size_t>(classes[k]);
    if (f == k) {
      reps.push_back(alias_key(ts[k]));
    } else if (f > k || alias_key(ts[k]) != alias_key(ts[f])) {
      return false;
    }
  }
  std::sort(reps.begin(), reps.end());
  return std::adjacent_find(reps.begin(), reps.end()) == reps.end();
}

// Where t's data starts relative to `first`'s, in bytes (both in one storage), or
// kSameTensor.
int64_t relative_start(const at::Tensor& t, const at::Tensor& first) {
  if (t.unsafeGetTensorImpl() == first.unsafeGetTensorImpl()) return AliasGeometry::kSameTensor;
  if (!t.has_storage() || !first.has_storage()) return 0;
  return t.storage_offset() * static_cast<int64_t>(t.itemsize()) -
         first.storage_offset() * static_cast<int64_t>(first.itemsize());
}

std::string relation(int64_t r) {
  return r == AliasGeometry::kSameTensor ? "the same tensor" : "a view " + std::to_string(r) + " bytes from its start";
}

}  // namespace

std::vector<int> alias_classes(c10::ArrayRef<at::Tensor> ts) {
  std::vector<const void*> keys(ts.size());
  for (size_t k = 0; k < ts.size(); ++k) keys[k] = alias_key(ts[k]);
  std::vector<int> out(ts.size());
  if (ts.size() <= 32) {  // the usual case: no hashing
    for (size_t k = 0; k < ts.size(); ++k) {
      size_t f = 0;
      while (keys[f] != keys[k]) ++f;
      out[k] = static_cast<int>(f);
    }
    return out;
  }
  std::unordered_map<const void*, int> first;
  for (size_t k = 0; k < ts.size(); ++k) out[k] = first.emplace(keys[k], static_cast<int>(k)).first->second;
  return out;
}

AliasGeometry AliasGeometry::of(c10::ArrayRef<at::Tensor> ts) {
  AliasGeometry a;
  a.classes = alias_classes(ts);
  a.relative.assign(ts.size(), 0);
  for (size_t k = 0; k < ts.size(); ++k) {
    const auto f = static_cast<size_t>(a.classes[k]);
    if (f != k) a.relative[k] = relative_start(ts[k], ts[f]);
  }
  return a;
}

// Note [One check, with or without words] (guards.h).
bool AliasGeometry::check(c10::ArrayRef<at::Tensor> ts, const std::function<std::string(size_t)>& name,
                          const Why& why) const {
  if (!same_alias_classes(ts, classes)) {
    return why([&] {
      const std::vector<int> now = alias_classes(ts);
      for (size_t k = 0; k < ts.size() && k < classes.size(); ++k) {
        if (now[k] == classes[k]) continue;
        const auto was = static_cast<size_t>(classes[k]), is = static_cast<size_t>(now[k]);
        if (was != k) return "inputs that shared memory changed: " + name(k) + " no longer shares memory with " + name(was);
        return "inputs that shared memory changed: " + name(k) + " shares memory with " + name(is) + " now";
      }
      return std::string("inputs that shared memory changed");
    });
  }
  for (size_t k = 0; k < ts.size(); ++k) {
    const auto f = static_cast<size_t>(classes[k]);
    if (f == k) continue;
    const int64_t r = relative_start(ts[k], ts[f]);
    if (r != relative[k]) {
      return why([&] {
        return "inputs that share memory share it another way: " + name(k) + " was " + relation(relative[k]) +
               " of " + name(f) + ", now " + relation(r);
      });
    }
  }
  return true;
}

}  // namespace tcap::cache

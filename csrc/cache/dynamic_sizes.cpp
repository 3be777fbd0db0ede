#include "cache/dynamic_sizes.h"

#include <algorithm>

namespace tcap::cache {

std::vector<size_t> changed_sizes(const std::vector<int64_t>& captured, const std::vector<int64_t>& now) {
  std::vector<size_t> out;
  for (size_t i = 0; i < captured.size() && i < now.size(); ++i) {
    if (captured[i] != now[i]) out.push_back(i);
  }
  return out;
}

bool SizeCheck::fits(size_t i, int64_t now) {
  const int c = i < d_.size_class.size() ? d_.size_class[i] : -1;
  if (c < 0) return now == captured_[i];
  if (now < 2) return false;
  for (const auto& [cls, value] : seen_) {
    if (cls == c) return value == now;
  }
  seen_.emplace_back(c, now);
  return true;
}

std::vector<int64_t> SizeCheck::key() const {
  std::vector<int64_t> k(d_.num_classes, 0);
  for (const auto& [cls, value] : seen_) k[static_cast<size_t>(cls)] = value;
  return k;
}

std::string generalize(const ir::Graph& a, const std::vector<int64_t>& sizes_a, const ir::Graph& b,
                       const std::vector<int64_t>& sizes_b, const std::vector<size_t>& changed, DynamicSizes* out) {
  if (changed.empty()) return "no size changed";
  if (sizes_a.size() != sizes_b.size()) return "the two captures read different numbers of sizes";
  // Classes: sizes that changed together from the same value to the same value.
  std::vector<std::pair<int64_t, int64_t>> classes;
  DynamicSizes d;
  d.size_class.assign(sizes_b.size(), -1);
  for (size_t i : changed) {
    const std::pair<int64_t, int64_t> p{sizes_a[i], sizes_b[i]};
    if (p.first < 2 || p.second < 2) return "a size changed to or from 0 or 1";
    auto it = std::find(classes.begin(), classes.end(), p);
    d.size_class[i] = static_cast<int>(it - classes.begin());
    if (it == classes.end()) classes.push_back(p);
  }
  std::string why = passes::find_int_patches(a, b, classes, d.patches);
  if (!why.empty()) return why;
  d.num_classes = classes.size();
  for (const auto& c : classes) d.own_key.push_back(c.second);
  *out = std::move(d);
  return "";
}

ir::Graph specialize(const ir::Graph& g, const DynamicSizes& d, const std::vector<int64_t>& key) {
  ir::Graph s = g;
  passes::apply_int_patches(s, d.patches, key);
  return s;
}

}  // namespace tcap::cache

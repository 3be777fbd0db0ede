#include "cache/dynamic_sizes.h"

#include "support/logging.h"

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
                       const std::vector<int64_t>& sizes_b, const std::vector<size_t>& changed, DynamicSizes* out,
                       bool first_fit) {
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
  std::string why = passes::find_int_patches(a, b, classes, d.patches, first_fit);
  if (!why.empty()) return why;
  d.num_classes = classes.size();
  for (const auto& c : classes) d.own_key.push_back(c.second);
  *out = std::move(d);
  return "";
}

std::vector<std::pair<int64_t, int64_t>> DynamicSizes::class_pairs(const std::vector<int64_t>& sizes_a,
                                                                   const std::vector<int64_t>& sizes_b) const {
  std::vector<std::pair<int64_t, int64_t>> out(num_classes, {0, 0});
  for (size_t i = 0; i < size_class.size() && i < sizes_a.size() && i < sizes_b.size(); ++i) {
    if (size_class[i] >= 0) out[static_cast<size_t>(size_class[i])] = {sizes_a[i], sizes_b[i]};
  }
  return out;
}

SizeLedger::SizeLedger(ir::Graph record, std::vector<passes::IntPatch> patches,
                       std::vector<std::pair<ir::NodeId, size_t>> per_call)
    : record_(std::move(record)), patches_(std::move(patches)), per_call_(std::move(per_call)) {}

std::optional<std::string> SizeLedger::verdict(const std::vector<int64_t>& key) const {
  std::lock_guard<std::mutex> lock(mutex_);
  auto it = verdicts_.find(key);
  if (it == verdicts_.end()) return std::nullopt;
  return it->second;
}

std::string SizeLedger::check(const std::vector<int64_t>& key, const ir::Graph& got, const std::string& why_not) {
  if (!why_not.empty()) {
    store(key, why_not);
    return why_not;
  }
  ir::Graph want = record_;
  passes::apply_int_patches(want, patches_, key);
  for (const auto& [node, arg] : per_call_) {
    if (node < 0 || static_cast<size_t>(node) >= got.nodes().size()) continue;
    const ir::Node& g = got.node(node);
    const ir::Node& w = want.node(node);
    if (g.op != w.op || arg >= g.args.size() || arg >= w.args.size() || g.args[arg].kind != w.args[arg].kind) continue;
    want.edit_constant(node, arg, [&](ir::Arg& a) { a = g.args[arg]; });
  }
  std::string why = passes::first_difference(want, got);
  if (!why.empty()) why = "the code records another graph at these sizes: " + why;
  store(key, why);
  return why;
}

void SizeLedger::store(const std::vector<int64_t>& key, std::string verdict) {
  std::lock_guard<std::mutex> lock(mutex_);
  verdicts_.emplace(key, std::move(verdict));
}

std::string make_ledger(const ir::Graph& record_a, const std::vector<int64_t>& sizes_a, const ir::Graph& record_b,
                        const std::vector<int64_t>& sizes_b, DynamicSizes& d,
                        std::vector<std::pair<ir::NodeId, size_t>> per_call, bool first_fit) {
  std::vector<passes::IntPatch> patches;
  std::string why = passes::find_int_patches(record_a, record_b, d.class_pairs(sizes_a, sizes_b), patches, first_fit);
  if (!why.empty()) return "its recorded code does not follow the sizes: " + why;
  d.ledger = std::make_shared<SizeLedger>(record_b, std::move(patches), std::move(per_call));
  d.ledger->admit(d.own_key);
  return "";
}

bool make_dynamic(std::string why_not, const FitOf& a, const FitOf& b, DynamicSizes& b_dyn,
                  const std::vector<size_t>& changed, std::vector<std::pair<ir::NodeId, size_t>> per_call,
                  bool first_fit, const std::string& who, int b_id, const std::function<std::string()>& describe) {
  std::string why = std::move(why_not);
  if (why.empty()) why = generalize(a.graph, a.sizes, b.graph, b.sizes, changed, &b_dyn, first_fit);
  if (why.empty()) why = make_ledger(a.record, a.sizes, b.record, b.sizes, b_dyn, std::move(per_call), first_fit);
  if (!why.empty()) {
    b_dyn = DynamicSizes{};
    TCAP_LOG(Recompiles, who << " entry " << b_id << " stays static: " << why);
    return false;
  }
  TCAP_LOG(Recompiles, who << " entry " << b_id << " is dynamic in " << changed.size() << " dims ("
                           << b_dyn.patches.size() << " integers follow the sizes): " << describe());
  return true;
}

void log_specialized(const std::string& who, int id, const std::vector<int64_t>& key) {
  TCAP_LOG(Recompiles, who << " entry " << id << " specialized to sizes " << c10::IntArrayRef(key)
                           << " of its dynamic dims (no recapture)");
}

ir::Graph specialize(const ir::Graph& g, const DynamicSizes& d, const std::vector<int64_t>& key) {
  ir::Graph s = g;
  passes::apply_int_patches(s, d.patches, key);
  return s;
}

}  // namespace tcap::cache

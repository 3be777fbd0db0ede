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

namespace {

// Note [Sizes the ops derive]: the integers of record b (values' sizes, then ops' integer
// arguments) that the classes do not explain, one per distinct pair, at their first
// position; none when every one of them is at least affine in a class.
std::vector<DerivedSize> derived_sizes(const ir::Graph& ra, const ir::Graph& rb,
                                       const std::vector<std::pair<int64_t, int64_t>>& classes) {
  std::vector<DerivedSize> out;
  if (ra.values().size() != rb.values().size() || ra.nodes().size() != rb.nodes().size()) return out;
  using passes::IntPatch;
  // Each changed integer of the record, with its position.
  auto for_each_changed = [&](const auto& f) {
    for (size_t v = 0; v < rb.values().size(); ++v) {
      const auto& ma = ra.values()[v].meta;
      const auto& mb = rb.values()[v].meta;
      if (ma.sizes.size() != mb.sizes.size()) continue;
      for (size_t d = 0; d < mb.sizes.size(); ++d) {
        if (ma.sizes[d] != mb.sizes[d]) f(IntPatch{IntPatch::Size, static_cast<int64_t>(v), d, 0, 0, 0, 0}, ma.sizes[d], mb.sizes[d]);
      }
    }
    for (size_t i = 0; i < rb.nodes().size(); ++i) {
      const auto& na = ra.nodes()[i];
      const auto& nb = rb.nodes()[i];
      if (na.op != nb.op || na.args.size() != nb.args.size()) continue;
      for (size_t k = 0; k < nb.args.size(); ++k) {
        const ir::Arg& x = na.args[k];
        const ir::Arg& y = nb.args[k];
        if (x.kind != y.kind) continue;
        if (x.kind == ir::ArgKind::Int && x.i != y.i) {
          f(IntPatch{IntPatch::Arg, static_cast<int64_t>(i), k, 0, 0, 0, 0}, x.i, y.i);
        } else if (x.kind == ir::ArgKind::IntList && x.ints.size() == y.ints.size()) {
          for (size_t e = 0; e < x.ints.size(); ++e) {
            if (x.ints[e] != y.ints[e]) f(IntPatch{IntPatch::ArgList, static_cast<int64_t>(i), k, e, 0, 0, 0}, x.ints[e], y.ints[e]);
          }
        }
      }
    }
  };
  bool any = false;
  for_each_changed([&](const IntPatch&, int64_t x, int64_t y) {
    any = any || !passes::follows_sizes(x, y, classes, /*affine=*/true);
  });
  if (!any) return out;
  // Some integer is not even affine in a class: every one that is not a multiple or
  // product of classes is derived (an affine one too: a formula two captures fit is a guess).
  for_each_changed([&](const IntPatch& where, int64_t x, int64_t y) {
    if (passes::follows_sizes(x, y, classes, /*affine=*/false)) return;
    const bool seen = std::any_of(out.begin(), out.end(), [&](const DerivedSize& s) { return s.at_a == x && s.at_b == y; });
    if (!seen) out.push_back({where, x, y});
  });
  return out;
}

// The pairs patches read: the classes', then the derived sizes'.
std::vector<std::pair<int64_t, int64_t>> with_derived(std::vector<std::pair<int64_t, int64_t>> classes,
                                                      const std::vector<DerivedSize>& derived) {
  for (const auto& x : derived) classes.emplace_back(x.at_a, x.at_b);
  return classes;
}

}  // namespace

std::string generalize(const ir::Graph& a, const std::vector<int64_t>& sizes_a, const ir::Graph& b,
                       const std::vector<int64_t>& sizes_b, const std::vector<size_t>& changed, DynamicSizes* out,
                       bool first_fit, const ir::Graph* record_a, const ir::Graph* record_b) {
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
  d.derived = derived_sizes(record_a ? *record_a : a, record_b ? *record_b : b, classes);
  std::string why = passes::find_int_patches(a, b, with_derived(classes, d.derived), d.patches, first_fit, classes.size());
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

std::vector<int64_t> DynamicSizes::derived_values(bool at_a) const {
  std::vector<int64_t> out;
  for (const auto& x : derived) out.push_back(at_a ? x.at_a : x.at_b);
  return out;
}

std::vector<int64_t> DynamicSizes::patch_sizes(const std::vector<int64_t>& key) const {
  if (derived.empty()) return key;
  std::vector<int64_t> out = key;
  std::optional<std::vector<int64_t>> values;
  if (key == own_key) values = derived_values(/*at_a=*/false);
  else if (ledger) values = ledger->derived_at(key);
  TORCH_CHECK(values && values->size() == derived.size(), "tcap: no check capture read the sizes its ops derive at ",
              c10::IntArrayRef(key), " (Note [Sizes the ops derive])");
  out.insert(out.end(), values->begin(), values->end());
  return out;
}

std::string DynamicSizes::describe_derived() const {
  std::string s;
  for (size_t k = 0; k < derived.size(); ++k) {
    const passes::IntPatch& w = derived[k].where;
    const std::string at = w.kind == passes::IntPatch::Size
                               ? "%" + std::to_string(w.where) + ".size(" + std::to_string(w.index) + ")"
                               : "argument " + std::to_string(w.index) +
                                     (w.kind == passes::IntPatch::ArgList ? "[" + std::to_string(w.element) + "]" : "") +
                                     " of node %" + std::to_string(w.where);
    s += (k ? ", d" : "; sizes its ops derive, read from each check capture's recording: d") + std::to_string(k) + " = " +
         at + " (captured at " + std::to_string(derived[k].at_b) + ")";
  }
  return s;
}

SizeLedger::SizeLedger(ir::Graph record, std::vector<passes::IntPatch> patches,
                       std::vector<std::pair<ir::NodeId, size_t>> per_call, std::vector<DerivedSize> derived)
    : record_(std::move(record)),
      patches_(std::move(patches)),
      per_call_(std::move(per_call)),
      derived_(std::move(derived)) {}

std::optional<std::vector<int64_t>> SizeLedger::derived_at(const std::vector<int64_t>& key) const {
  std::lock_guard<std::mutex> lock(mutex_);
  auto it = derived_values_.find(key);
  if (it == derived_values_.end()) return std::nullopt;
  return it->second;
}

std::optional<std::string> SizeLedger::verdict(const std::vector<int64_t>& key) const {
  std::lock_guard<std::mutex> lock(mutex_);
  auto it = verdicts_.find(key);
  if (it == verdicts_.end()) return std::nullopt;
  return it->second;
}

namespace {

// The integer of `g` that patch p addresses; nullptr where p does not address one of g
// (another structure).
const int64_t* integer_at(const ir::Graph& g, const passes::IntPatch& p) {
  if (p.where < 0) return nullptr;
  const auto where = static_cast<size_t>(p.where);
  switch (p.kind) {
    case passes::IntPatch::Arg:
    case passes::IntPatch::ArgList: {
      if (where >= g.nodes().size() || p.index >= g.node(p.where).args.size()) return nullptr;
      const ir::Arg& a = g.node(p.where).args[p.index];
      if (p.kind == passes::IntPatch::Arg) return &a.i;
      return p.element < a.ints.size() ? &a.ints[p.element] : nullptr;
    }
    case passes::IntPatch::Size:
    case passes::IntPatch::Stride: {
      if (where >= g.values().size()) return nullptr;
      const auto& dims = p.kind == passes::IntPatch::Size ? g.value(p.where).meta.sizes : g.value(p.where).meta.strides;
      return p.index < dims.size() ? &dims[p.index] : nullptr;
    }
    case passes::IntPatch::Offset: return where < g.values().size() ? &g.value(p.where).meta.storage_offset : nullptr;
  }
  return nullptr;
}

// Sets the integer of `g` that patch p addresses (integer_at is not null) to v.
void set_integer(ir::Graph& g, const passes::IntPatch& p, int64_t v) {
  switch (p.kind) {
    case passes::IntPatch::Arg: g.edit_constant(p.where, p.index, [v](ir::Arg& a) { a.i = v; }); break;
    case passes::IntPatch::ArgList: g.edit_constant(p.where, p.index, [v, &p](ir::Arg& a) { a.ints[p.element] = v; }); break;
    case passes::IntPatch::Size: g.value(p.where).meta.sizes[p.index] = v; break;
    case passes::IntPatch::Stride: g.value(p.where).meta.strides[p.index] = v; break;
    case passes::IntPatch::Offset: g.value(p.where).meta.storage_offset = v; break;
  }
}

}  // namespace

// Note [Checking a new size without copying the record]
// The record specialized to `key` is the record with each patched integer set to its
// patch's value at `key`, and each per-call argument taken from the check's own
// recording. Instead of copying the record to patch it (a copy of a whole graph at every
// check capture), the check's graph is patched back: where it holds exactly the patched
// values, they are replaced by the record's own, per-call arguments too, and the record is
// compared as it is. Equal after that if and only if equal before. A graph that does not
// hold a patched value, or that differs anywhere, is compared the long way (its patched
// integers restored first), so that the verdict names the difference as it always has.
std::string SizeLedger::check(const std::vector<int64_t>& key, ir::Graph got, const std::string& why_not) {
  if (!why_not.empty()) {
    store(key, why_not);
    return why_not;
  }
  // Note [Sizes the ops derive]: their values at key are the recording's (the record's own
  // where it does not hold them: it differs then, and the comparison says where).
  std::vector<int64_t> sizes = key, derived;
  for (const auto& x : derived_) {
    const int64_t* at = integer_at(got, x.where);
    derived.push_back(at ? *at : x.at_b);
  }
  sizes.insert(sizes.end(), derived.begin(), derived.end());
  const bool fits = std::all_of(patches_.begin(), patches_.end(), [&](const passes::IntPatch& p) {
    const int64_t* at = integer_at(got, p);
    return at && integer_at(record_, p) && *at == passes::patch_value(got, p, sizes);
  });
  if (fits) {
    for (const auto& p : patches_) set_integer(got, p, *integer_at(record_, p));
    std::vector<std::pair<size_t, ir::Arg>> taken;  // per-call arguments of `got`, to restore
    for (size_t k = 0; k < per_call_.size(); ++k) {
      const auto& [node, arg] = per_call_[k];
      if (node < 0 || static_cast<size_t>(node) >= got.nodes().size()) continue;
      const ir::Node& g = got.node(node);
      const ir::Node& r = record_.node(node);
      if (g.op != r.op || arg >= g.args.size() || arg >= r.args.size() || g.args[arg].kind != r.args[arg].kind) continue;
      taken.emplace_back(k, g.args[arg]);
      got.edit_constant(node, arg, [&](ir::Arg& a) { a = r.args[arg]; });
    }
    if (passes::first_difference(record_, got).empty()) {
      store(key, "", std::move(derived));
      return "";
    }
    passes::apply_int_patches(got, patches_, sizes);
    for (auto& [k, a] : taken) got.edit_constant(per_call_[k].first, per_call_[k].second, [&](ir::Arg& x) { x = a; });
  }
  ir::Graph want = record_;
  passes::apply_int_patches(want, patches_, sizes);
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

void SizeLedger::store(const std::vector<int64_t>& key, std::string verdict, std::vector<int64_t> derived) {
  std::lock_guard<std::mutex> lock(mutex_);
  if (verdict.empty() && !derived_.empty()) derived_values_.emplace(key, std::move(derived));
  verdicts_.emplace(key, std::move(verdict));
}

std::string make_ledger(const ir::Graph& record_a, const std::vector<int64_t>& sizes_a, const ir::Graph& record_b,
                        const std::vector<int64_t>& sizes_b, DynamicSizes& d,
                        std::vector<std::pair<ir::NodeId, size_t>> per_call, bool first_fit) {
  std::vector<passes::IntPatch> patches;
  std::string why = passes::find_int_patches(record_a, record_b, with_derived(d.class_pairs(sizes_a, sizes_b), d.derived),
                                             patches, first_fit, d.num_classes);
  if (!why.empty()) return "its recorded code does not follow the sizes: " + why;
  d.ledger = std::make_shared<SizeLedger>(record_b, std::move(patches), std::move(per_call), d.derived);
  d.ledger->admit(d.own_key, d.derived_values(/*at_a=*/false));
  return "";
}

bool make_dynamic(std::string why_not, const FitOf& a, const FitOf& b, DynamicSizes& b_dyn,
                  const std::vector<size_t>& changed, std::vector<std::pair<ir::NodeId, size_t>> per_call,
                  bool first_fit, const std::string& who, int b_id, const std::function<std::string()>& describe) {
  std::string why = std::move(why_not);
  if (why.empty()) why = generalize(a.graph, a.sizes, b.graph, b.sizes, changed, &b_dyn, first_fit, &a.record, &b.record);
  if (why.empty()) why = make_ledger(a.record, a.sizes, b.record, b.sizes, b_dyn, std::move(per_call), first_fit);
  if (!why.empty()) {
    b_dyn = DynamicSizes{};
    TCAP_LOG(Recompiles, who << " entry " << b_id << " stays static: " << why);
    return false;
  }
  TCAP_LOG(Recompiles, who << " entry " << b_id << " is dynamic in " << changed.size() << " dims ("
                           << b_dyn.patches.size() << " integers follow the sizes): " << describe()
                           << b_dyn.describe_derived());
  return true;
}

void log_specialized(const std::string& who, int id, const std::vector<int64_t>& key) {
  TCAP_LOG(Recompiles, who << " entry " << id << " specialized to sizes " << c10::IntArrayRef(key)
                           << " of its dynamic dims (no recapture)");
}

ir::Graph specialize(const ir::Graph& g, const DynamicSizes& d, const std::vector<int64_t>& key) {
  ir::Graph s = g;
  passes::apply_int_patches(s, d.patches, d.patch_sizes(key));
  return s;
}

}  // namespace tcap::cache

#include "cache/entry_cache.h"

#include "support/logging.h"

#include <tcap/graph_json.h>

#include <torch/csrc/autograd/anomaly_mode.h>

#include <algorithm>
#include <filesystem>
#include <optional>

namespace tcap::cache {

std::string dump_dir_of(const CompileOptions& o) { return o.dump_dir.empty() ? Config::get().dump_dir : o.dump_dir; }

void dump_graphs(const CompileOptions& o, const std::string& base,
                 const std::vector<std::pair<std::string, const ir::Graph*>>& graphs) {
  const std::string dir = dump_dir_of(o);
  if (dir.empty()) return;
  for (const auto& [suffix, g] : graphs) {
    const std::string path = dir + "/" + base + suffix + ".json";
    try {
      std::filesystem::create_directories(dir);
      ir::save_json(*g, path);
    } catch (const std::exception& e) {
      TCAP_LOG(Graphs, "could not dump " << path << ": " << e.what());
    }
  }
}

EntryCache::EntryCache(std::string who, int limit, bool dynamic, bool check_new_sizes,
                       std::vector<std::pair<int, int>> static_dims, std::vector<CompileOptions::DynamicDim> promises)
    : who_(std::move(who)),
      limit_(limit),
      dynamic_(dynamic),
      check_new_sizes_(check_new_sizes),
      static_dims_(std::move(static_dims)),
      promises_(std::move(promises)) {
  for (const auto& p : promises_) {
    TORCH_CHECK(p.input >= 0 && p.dim >= 0, "tcap: ", who_, ": CompileOptions::dynamic_dims names input ", p.input,
                " dim ", p.dim);
    TORCH_CHECK(p.min >= 2 && p.max >= p.min, "tcap: ", who_, ": CompileOptions::dynamic_dims for dim ", p.dim,
                " of input ", p.input, " promises sizes [", p.min, ", ", p.max,
                "]; the bounds must satisfy 2 <= min <= max (sizes 0 and 1 are never dynamic)");
    TORCH_CHECK(std::find(static_dims_.begin(), static_dims_.end(), std::make_pair(p.input, p.dim)) == static_dims_.end(),
                "tcap: ", who_, ": dim ", p.dim, " of input ", p.input,
                " is in both CompileOptions::static_dims and CompileOptions::dynamic_dims");
  }
}

namespace {

// The tensor and dim of flattened size position i (Guards::sizes: the dims of `tensors` in
// order, then plain sizes), or nullopt for a plain size.
std::optional<std::pair<size_t, size_t>> tensor_dim(const std::vector<TensorGuard>& tensors, size_t i) {
  size_t pos = 0, k = 0;
  while (k < tensors.size() && pos + tensors[k].sizes.size() <= i) pos += tensors[k++].sizes.size();
  if (k >= tensors.size()) return std::nullopt;
  return std::make_pair(k, i - pos);
}

}  // namespace

std::string EntryCache::static_changes(const std::vector<TensorGuard>& tensors, const std::vector<size_t>& changed) const {
  std::string out;
  if (static_dims_.empty()) return out;
  for (size_t i : changed) {
    const auto td = tensor_dim(tensors, i);
    if (!td) continue;
    const std::pair<int, int> dim{static_cast<int>(td->first), static_cast<int>(td->second)};
    if (std::find(static_dims_.begin(), static_dims_.end(), dim) == static_dims_.end()) continue;
    out += (out.empty() ? "" : ", ") + std::string("dim ") + std::to_string(td->second) + " of '" +
           tensors[td->first].name + "'";
  }
  return out;
}

bool EntryCache::promised(const Entry& e, const std::vector<int64_t>& key) const {
  const DynamicSizes& d = e.guards.dyn;
  if (promises_.empty() || key.size() != d.num_classes || d.own_key.size() != d.num_classes) return false;
  std::string which;
  for (size_t c = 0; c < d.num_classes; ++c) {
    if (key[c] == d.own_key[c]) continue;  // as captured: nothing to check
    std::string covered;
    for (size_t i = 0; i < d.size_class.size() && covered.empty(); ++i) {
      if (d.size_class[i] != static_cast<int>(c)) continue;
      const auto td = tensor_dim(e.guards.tensors, i);
      if (!td) continue;
      for (const auto& p : promises_) {
        if (p.input == static_cast<int>(td->first) && p.dim == static_cast<int>(td->second) && key[c] >= p.min &&
            key[c] <= p.max) {
          covered = "dim " + std::to_string(p.dim) + " of '" + e.guards.tensors[td->first].name + "' in [" +
                    std::to_string(p.min) + ", " + std::to_string(p.max) + "]";
          break;
        }
      }
    }
    if (covered.empty()) return false;
    which += (which.empty() ? "" : ", ") + covered;
  }
  if (d.ledger) d.ledger->admit(key);
  TCAP_LOG(Recompiles, who_ << " entry " << e.id << ": sizes " << c10::IntArrayRef(key)
                            << " of its dynamic dims served without a check capture: CompileOptions::dynamic_dims "
                               "promises no host code branches on "
                            << which);
  return true;
}

void EntryCache::log_size_check(const Lookup& found, const std::string& verdict, bool same_recording) const {
  const std::string key = c10::str(c10::IntArrayRef(found.key));
  const char* how = same_recording ? "the call's recording, compared with this entry too," : "the call ran and";
  if (verdict.empty()) {
    TCAP_LOG(Recompiles, who_ << " entry " << found.hit->id << ": sizes " << key << " of its dynamic dims checked ("
                              << how << " recorded the entry's graph at them); they replay from now on");
  } else {
    TCAP_LOG(Recompiles, who_ << " entry " << found.hit->id << " does not serve sizes " << key << " of its dynamic dims: "
                              << verdict << " (host code that branches on a size?); the call ran eagerly, and these "
                              << "sizes get an entry of their own");
  }
}

std::vector<Lookup> EntryCache::also_unchecked(const CallView& call, const std::vector<at::Tensor>& primals,
                                               const Lookup& found) const {
  std::vector<Lookup> out;
  const auto snapshot = entries();
  size_t pos = 0;
  while (pos < snapshot->size() && (*snapshot)[pos] != found.hit) ++pos;
  for (size_t start = pos + 1; start < snapshot->size();) {
    size_t at = 0;
    Lookup l = lookup(call, primals, start, &at);
    if (!l.hit || !l.check_sizes) break;
    out.push_back(std::move(l));
    start = at + 1;
  }
  return out;
}

std::string EntryCache::ledger_check(const Lookup& found, ir::Graph got, const std::string& why_not) {
  const auto& ledger = found.hit->guards.dyn.ledger;
  TORCH_CHECK(ledger, "tcap: a check capture of ", found.hit->id, " without the entry's size ledger");
  return ledger->check(found.key, std::move(got), why_not);
}

std::shared_ptr<const EntryList> EntryCache::entries() const {
  std::lock_guard<std::mutex> lock(mutex_);
  return entries_;
}

namespace {

// Whether the flattened sizes `changed` are at least 2 both as captured and in the call.
bool generalizable(const std::vector<int64_t>& captured, const CallView& call, const std::vector<size_t>& changed) {
  std::vector<int64_t> now;
  now.reserve(captured.size());
  for (const auto& t : call.tensors) {
    if (t.defined()) now.insert(now.end(), t.sizes().begin(), t.sizes().end());
  }
  if (call.sizes) now.insert(now.end(), call.sizes->begin(), call.sizes->end());
  for (size_t i : changed) {
    if (i >= captured.size() || i >= now.size() || captured[i] < 2 || now[i] < 2) return false;
  }
  return true;
}

}  // namespace

Lookup EntryCache::lookup(const CallView& call, const std::vector<at::Tensor>& primals, size_t start,
                          size_t* pos) const {
  Lookup out;
  const auto snapshot = entries();
  out.entries_seen = snapshot->size();
  for (size_t i = start; i < snapshot->size(); ++i) {
    const auto& e = (*snapshot)[i];
    // Note [The failing guard first]: with the reason to report known, an entry whose last
    // failing guard fails again is passed (a miss the rest of its check would not change:
    // not on sizes alone, not a hit).
    if (!out.first_miss.empty() && !out.first_structure_miss && e->guards.fails_again(call)) continue;
    std::vector<int64_t> key;
    Miss m = e->guards.check(call, &key);
    bool host_only = false;
    if (m.hit()) {
      std::vector<at::Tensor> p = primals;
      std::string why = e->guards.held.lock(p);
      if (why.empty()) why = e->guards.check_primals(p, &host_only);
      if (why.empty()) {
        out.hit = e;
        // Note [Checking a new size]; CompileOptions::dynamic_dims may promise the check away,
        // not for an entry whose sizes the ops derive (Note [Sizes the ops derive]).
        out.check_sizes = m.unchecked_sizes && (e->guards.dyn.derives() || (check_new_sizes_ && !promised(*e, key)));
        out.key = std::move(key);
        out.primals = std::move(p);
        if (pos) *pos = i;
        return out;
      }
      m.reason = std::move(why);
      m.sizes_only = false;
    }
    // The reason to report: the first entry's, unless that entry was for another structure
    // and a later one of this call's structure failed for a reason of its own.
    if (out.first_miss.empty() || (out.first_structure_miss && !m.structure)) {
      out.first_miss = m.reason;
      out.first_structure_miss = m.structure;
    }
    // The newest entry that missed on sizes alone: the capture nearest this call (after a
    // size check refused an older dynamic entry, the entry captured at the refused sizes;
    // Note [Checking a new size]). Sizes 0 and 1 are never made dynamic (generalize), so an
    // entry whose changed sizes are all at least 2, here and in this call, is preferred to
    // a newer one captured at a 0 or a 1: a batch of one between two others does not keep
    // the next size static.
    // CompileOptions::static_dims: an entry whose changed sizes include a static dim is
    // not generalized with this call.
    std::string kept_static = dynamic_ && m.sizes_only ? static_changes(e->guards.tensors, m.changed) : "";
    if (!kept_static.empty()) {
      if (out.static_dims.empty()) out.static_dims = std::move(kept_static);
    } else if (dynamic_ && m.sizes_only && !m.changed.empty()) {
      const bool usable = generalizable(e->guards.sizes, call, m.changed);
      if (usable || !out.size_miss_usable) {
        out.size_miss_of = e;
        out.changed = std::move(m.changed);
        out.size_miss_usable = usable;
      }
    }
    if (host_only && !out.host_miss_of) out.host_miss_of = e;
  }
  return out;
}

void EntryCache::note_replay_miss(Lookup& l, const std::shared_ptr<Entry>& e, const std::string& why) {
  // An entry of this call's structure whose replay stopped says more than one for another
  // structure (as in lookup).
  if (l.first_miss.empty() || l.first_structure_miss) {
    l.first_miss = why;
    l.first_structure_miss = false;
  }
  if (!l.host_miss_of) l.host_miss_of = e;
}

std::string EntryCache::dynamic_note(const Lookup& miss) {
  std::string note;
  if (!miss.size_miss_of) {
    if (!miss.static_dims.empty()) note = "; " + miss.static_dims + " kept static (CompileOptions::static_dims)";
    return note;
  }
  const auto& tensors = miss.size_miss_of->guards.tensors;
  for (size_t i : miss.changed) {
    if (const auto td = tensor_dim(tensors, i)) {
      note += "; marking dim " + std::to_string(td->second) + " of '" + tensors[td->first].name + "' dynamic";
    }
  }
  return note;
}

Admission EntryCache::admit(const Lookup& miss, const std::string& dynamic_note) {
  const size_t n = size();
  if (n == 0) return Admission::Capture;
  const Stance s = stance();
  if (s == Stance::FailOnRecompile) {
    throw RecompileError({__func__, __FILE__, static_cast<uint32_t>(__LINE__)},
                         "tcap: " + who_ + " would recompile (stance fail_on_recompile): " + miss.first_miss);
  }
  if (s == Stance::EagerOnRecompile) {
    TCAP_LOG(Recompiles, who_ << " runs eagerly instead of recompiling (stance eager_on_recompile): "
                              << miss.first_miss);
    return Admission::RunEager;
  }
  if (static_cast<int>(n) >= limit_) {
    const std::string why = "cache size limit (" + std::to_string(limit_) + ") reached";
    bool first = false;
    {
      std::lock_guard<std::mutex> lock(mutex_);
      first = !warned_limit_;
      warned_limit_ = true;
      if (eager_reason_.empty()) eager_reason_ = why;
    }
    if (error_on_fallback()) throw_fallback(who_, why + "; last guard failure: " + miss.first_miss);
    if (first) {
      TORCH_WARN("tcap: ", who_, " reached its cache size limit (", limit_, " compiled entries); ",
                 "new guard failures run eagerly from now on. Last guard failure: ", miss.first_miss);
    }
    TCAP_LOG(Recompiles, who_ << ": " << why << ", running eagerly: " << miss.first_miss);
    return Admission::RunEager;
  }
  TCAP_LOG(Recompiles, who_ << " recompiling (entry " << n << ", limit " << limit_ << "): " << miss.first_miss
                            << dynamic_note);
  return Admission::Capture;
}

void EntryCache::add(const std::shared_ptr<Entry>& e, const std::shared_ptr<Entry>& replaces) {
  std::lock_guard<std::mutex> lock(mutex_);
  auto next = std::make_shared<EntryList>(*entries_);
  auto it = replaces ? std::find(next->begin(), next->end(), replaces) : next->end();
  if (it != next->end()) {
    e->id = replaces->id;
    *it = e;
  } else {
    int id = 0;
    for (const auto& x : *next) id = std::max(id, x->id + 1);
    e->id = id;
    next->push_back(e);
  }
  entries_ = std::move(next);
}

int EntryCache::next_id() const {
  int id = 0;
  for (const auto& x : *entries()) id = std::max(id, x->id + 1);
  return id;
}

void EntryCache::move_into_place(Entry& e, const std::shared_ptr<Entry>& replaced) {
  std::lock_guard<std::mutex> lock(mutex_);
  auto next = std::make_shared<EntryList>(*entries_);
  auto own = std::find_if(next->begin(), next->end(), [&](const std::shared_ptr<Entry>& x) { return x.get() == &e; });
  auto place = std::find(next->begin(), next->end(), replaced);
  if (own == next->end() || place == next->end()) return;
  *place = *own;
  next->erase(own);
  e.id = replaced->id;
  entries_ = std::move(next);
}

bool EntryCache::eager_by_design() {
  const bool anomaly = torch::autograd::AnomalyMode::is_enabled();
  // Read first: every call passes here, from every thread, and a write would move the
  // cache line between them.
  if (in_anomaly_mode_.load(std::memory_order_relaxed) == anomaly) return anomaly;
  if (in_anomaly_mode_.exchange(anomaly, std::memory_order_relaxed) != anomaly && anomaly) {
    TCAP_LOG(GraphBreaks, who_ << " runs eagerly while anomaly mode is on (the engine's per-node checks and forward "
                                  "traces need the eager graph)");
  }
  return anomaly;
}

void EntryCache::fall_back(const std::string& why) {
  {
    std::lock_guard<std::mutex> lock(mutex_);
    eager_reason_ = why;
    fell_back_.store(true, std::memory_order_release);
  }
  report_fallback(who_, why);
}

void EntryCache::run_eagerly_from_now(Entry& e, const std::string& why, bool by_design) {
  auto mark = std::make_shared<const EagerMark>(EagerMark{why, by_design});
  std::atomic_store(&e.eager_, std::shared_ptr<const EagerMark>(std::move(mark)));
  if (by_design) {
    TCAP_LOG(GraphBreaks, who_ << ": " << why);
  } else {
    report_fallback(who_ + " (for these guards)", why);
  }
}

void EntryCache::run_structure_eagerly(std::string_view structure, const std::string& why) {
  TORCH_INTERNAL_ASSERT(!structure.empty(), "tcap: only a structure key can be marked eager");
  {
    std::lock_guard<std::mutex> lock(mutex_);
    eager_structures_[std::string(structure)] = std::make_shared<const EagerMark>(EagerMark{why, false});
    any_eager_structure_.store(true, std::memory_order_release);
  }
  report_fallback(who_ + " (for this graph structure, from now on)", why);
}

std::shared_ptr<const EagerMark> EntryCache::structure_runs_eagerly(std::string_view structure) const {
  if (structure.empty() || !any_eager_structure_.load(std::memory_order_acquire)) return nullptr;
  std::lock_guard<std::mutex> lock(mutex_);
  auto it = eager_structures_.find(structure);
  return it == eager_structures_.end() ? nullptr : it->second;
}

std::string EntryCache::eager_reason() const {
  std::lock_guard<std::mutex> lock(mutex_);
  return eager_reason_;
}

void throw_fallback(const std::string& who, const std::string& why) {
  throw FallbackError({__func__, __FILE__, static_cast<uint32_t>(__LINE__)},
                      "tcap: " + who + " would run eagerly (error_on_fallback): " + why);
}

void report_fallback(const std::string& who, const std::string& why) {
  if (error_on_fallback()) throw_fallback(who, why);
  TCAP_LOG(GraphBreaks, who << " runs eagerly: " << why);
}

}  // namespace tcap::cache

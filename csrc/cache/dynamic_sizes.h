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
// it again (*specialize*; one specialization per distinct class values, cached), once the
// new sizes have been checked (Note [Checking a new size]). Anything else keeps the entry
// static, with the reason logged: a float computed from a size, a different op sequence,
// an integer two classes could both explain, a size that changed to or from 0 or 1.
//
// Note [Checking a new size]
// Two captures show that the graph follows the sizes at the two sizes seen, not at a
// third: C++ host code may branch on a size (`if (x.size(0) > 64) y = y.narrow(0, 0, 64)`),
// and tcap cannot see the branch. So a fit is evidence, not a promise (DESIGN.md D15). The
// first call at class values a dynamic entry has not served is a *check capture*: the
// front door runs the user's code while recording (an eager call plus recording, no
// compile) and compares what it recorded with the entry's record specialized to those
// values (passes::first_difference). Agreement admits the values: later calls at them
// replay. A difference refuses them: the check call's own result is eager's, the entry
// misses at those values from then on (its guard says why), and the next call there
// captures an entry of its own, logged with the first difference. Verdicts live in the
// entry's SizeLedger, with the record they are checked against. CompileOptions::
// check_new_sizes = false is the user's promise that no host code branches on a dynamic
// size: values are then admitted unchecked (verify mode checks the promise).
//
// Note [Sizes the ops derive]
// A strided convolution or a pooling divides a size by its stride, rounding down or up
// (`(s + 2p - k) / stride + 1`); `chunk` and `split` do too. Two captures cannot tell such
// a size from the formulas above: at 16 and 24, ceil(s / 2) is s / 2, and it is not at 17.
// Host code divides too (`x.narrow(1, n / 2, 2)`, `arange(n / 2)`). So the integers of the
// record (its values' sizes, then its ops' integer arguments) that no class explains as
// m * s or m * s * s' (when any of them is not even affine in a class: otherwise nothing
// changes) become sizes of their own, *derived* sizes: one per distinct pair of values at
// the two captures, found at the first position the record holds it. Their values at new class
// values are not computed by tcap: they are read from the check capture's recording at that
// position (the user's code ran eagerly, and ATen's shape functions computed them), and
// every other integer that follows them is patched from those values and compared as
// usual. So an entry with derived sizes checks every new class value, whatever the
// promises (nothing else could tell its derived sizes); the values read are kept with the
// verdict and patched into the graph when the entry specializes. Strides of contiguous
// values whose sizes follow a derived size are recomputed from their patched sizes
// (passes::find_int_patches).
#pragma once

#include "cache/stats.h"
#include "passes/int_patches.h"
#include "support/logging.h"

#include <tcap/graph.h>

#include <c10/util/ArrayRef.h>
#include <c10/util/StringUtil.h>

#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <mutex>
#include <optional>
#include <set>
#include <string>
#include <vector>

namespace tcap::cache {

// Note [Sizes the ops derive]: an integer of the record that no class explains (a value's
// size, or an integer argument host code computed), at `where` (an IntPatch's position:
// kind, node or value, argument or dim, list element; its formula fields unused); at_a and
// at_b its values at the two captures (b: the dynamic entry).
struct DerivedSize {
  passes::IntPatch where;
  int64_t at_a, at_b;
};

// Note [Checking a new size]: what a dynamic entry's new class values are checked against,
// and the verdicts so far (thread-safe).
class SizeLedger {
 public:
  // `record`: the capture a check is compared with, at the entry's own class values;
  // `patches`: its integers that follow the classes; `per_call`: (node, argument) of the
  // record that differ between calls by design (a step's host scalars), taken from the
  // check's own recording before comparing; `derived`: the sizes the ops derive.
  SizeLedger(ir::Graph record, std::vector<passes::IntPatch> patches,
             std::vector<std::pair<ir::NodeId, size_t>> per_call = {}, std::vector<DerivedSize> derived = {});
  // nullopt: not checked yet; "": checked, served; else why the values were refused.
  std::optional<std::string> verdict(const std::vector<int64_t>& key) const;
  // The verdict of a check capture at class values `key`, stored and returned ("" when the
  // sizes are served): `why_not` when the capture could not record a graph, else how `got`
  // differs from the record specialized to those values (Note [Checking a new size without
  // copying the record]).
  std::string check(const std::vector<int64_t>& key, ir::Graph got, const std::string& why_not = "");
  // `derived`: the values of the derived sizes at key (none when the entry has none).
  void admit(const std::vector<int64_t>& key, std::vector<int64_t> derived = {}) { store(key, "", std::move(derived)); }
  // Note [Sizes the ops derive]: the derived sizes' values at admitted class values `key`.
  std::optional<std::vector<int64_t>> derived_at(const std::vector<int64_t>& key) const;

 private:
  void store(const std::vector<int64_t>& key, std::string verdict, std::vector<int64_t> derived = {});

  ir::Graph record_;
  std::vector<passes::IntPatch> patches_;
  std::vector<std::pair<ir::NodeId, size_t>> per_call_;
  std::vector<DerivedSize> derived_;
  mutable std::mutex mutex_;
  std::map<std::vector<int64_t>, std::string> verdicts_;
  std::map<std::vector<int64_t>, std::vector<int64_t>> derived_values_;
};

struct DynamicSizes {
  std::vector<int> size_class;               // per size: -1 static, else its class
  std::vector<passes::IntPatch> patches;     // IntPatch::size is a class, or num_classes + a derived size
  size_t num_classes = 0;
  std::vector<DerivedSize> derived;          // Note [Sizes the ops derive]
  std::vector<int64_t> own_key;              // the class values the entry was captured at
  // Note [Checking a new size]: set by the front door once the entry is dynamic.
  std::shared_ptr<SizeLedger> ledger;

  bool dynamic() const { return num_classes > 0; }
  // Note [Sizes the ops derive]: every new class value is checked, promised or not.
  bool derives() const { return !derived.empty(); }
  // The values patches read at class values `key`: key, then the derived sizes' values
  // (at_b at own_key, else those the ledger read at key's check); throws where unknown.
  std::vector<int64_t> patch_sizes(const std::vector<int64_t>& key) const;
  // The derived sizes' values at the first capture (`at_a`) or at the entry's own.
  std::vector<int64_t> derived_values(bool at_a) const;
  // "; d0 = %7.size(2) (captured at 12), ..." for the recompile log ("" without).
  std::string describe_derived() const;
  bool is_dynamic(size_t i) const { return i < size_class.size() && size_class[i] >= 0; }
  // The class values of each class at `sizes` (the flattened sizes of a capture).
  std::vector<std::pair<int64_t, int64_t>> class_pairs(const std::vector<int64_t>& sizes_a,
                                                       const std::vector<int64_t>& sizes_b) const;
};

// Note [Checking a new size]: builds d's ledger from the front door's records of the two
// captures (record_a at sizes_a, record_b at sizes_b: b is the dynamic entry), with the
// record's own integer patches, and admits b's own class values. Returns "" on success,
// else why the records do not follow the sizes (then the entry must stay static).
std::string make_ledger(const ir::Graph& record_a, const std::vector<int64_t>& sizes_a, const ir::Graph& record_b,
                        const std::vector<int64_t>& sizes_b, DynamicSizes& d,
                        std::vector<std::pair<ir::NodeId, size_t>> per_call = {}, bool first_fit = false);

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
// `first_fit`: see passes::find_int_patches (only for a graph that check captures verify
// whole: compile_step's and compiled autograd's).
// `record_a` and `record_b` (when given) are the records the derived sizes are read from
// (Note [Sizes the ops derive]); else a and b.
std::string generalize(const ir::Graph& a, const std::vector<int64_t>& sizes_a, const ir::Graph& b,
                       const std::vector<int64_t>& sizes_b, const std::vector<size_t>& changed, DynamicSizes* out,
                       bool first_fit = false, const ir::Graph* record_a = nullptr, const ir::Graph* record_b = nullptr);

// A copy of g with its integers patched for the class values `key`.
ir::Graph specialize(const ir::Graph& g, const DynamicSizes& d, const std::vector<int64_t>& key);

// Note [Dynamic sizes], for every front door: entry b generalized over entry a, which
// missed the call on sizes alone (`changed`). `why_not` is what the front door found first
// that keeps b static ("" when nothing); else the graphs a and b must differ only by
// integers that follow the changed sizes (`first_fit`: see generalize), and their records,
// which check captures are compared with (Note [Checking a new size]; `per_call` as for
// make_ledger), likewise. On success b's dynamic sizes and ledger are set; else they are
// empty. Logs the verdict (`who` names the door) and returns whether b is dynamic.
struct FitOf {
  const ir::Graph& graph;
  const ir::Graph& record;
  const std::vector<int64_t>& sizes;
};
bool make_dynamic(std::string why_not, const FitOf& a, const FitOf& b, DynamicSizes& b_dyn,
                  const std::vector<size_t>& changed, std::vector<std::pair<ir::NodeId, size_t>> per_call,
                  bool first_fit, const std::string& who, int b_id, const std::function<std::string()>& describe);

// The recompile log's line for entry `id` of `who` specialized to class values `key`.
void log_specialized(const std::string& who, int id, const std::vector<int64_t>& key);

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
    pending_.erase(key);
    auto& slot = map_[key];
    if (!slot) slot = std::move(t);
    return slot;
  }
  // Note [Specializations in the background]: whether the caller is to submit the making
  // of key's specialization (none stored, none submitted, none failed); the key is then
  // pending until insert() or fail().
  bool claim(const std::vector<int64_t>& key) {
    std::lock_guard<std::mutex> lock(mutex_);
    if (map_.count(key) || failed_.count(key)) return false;
    return pending_.insert(key).second;
  }
  // The background making of key's specialization failed: calls at it specialize on their
  // own thread from now on (and meet the failure there, as without the background).
  void fail(const std::vector<int64_t>& key) {
    std::lock_guard<std::mutex> lock(mutex_);
    pending_.erase(key);
    failed_.insert(key);
  }
  bool failed(const std::vector<int64_t>& key) const {
    std::lock_guard<std::mutex> lock(mutex_);
    return failed_.count(key) > 0;
  }
  size_t size() const {
    std::lock_guard<std::mutex> lock(mutex_);
    return map_.size();
  }

 private:
  mutable std::mutex mutex_;
  std::map<std::vector<int64_t>, std::shared_ptr<T>> map_;
  std::set<std::vector<int64_t>> pending_, failed_;
};

// Note [A dynamic entry takes the place of the static one]
// When entry b generalizes a static entry a (Note [Dynamic sizes]), the fit compared their
// graphs and records at both sizes: a's graph is b's patched to a's class values, and a's
// record is b's record there, so those values are checked sizes of b (Note [Checking a new
// size]). b admits them, keeps a as its specialization at them (a is compiled for them
// already) and takes a's place and id in the cache: one entry serves both sizes and every
// size b admits, and the cache-size limit counts the branches a function's code takes, not
// the sizes it met. `a` must be of b's type E; returns a when b takes its place (pass it
// to EntryCache::add as the entry replaced, or, for a b published already, to
// EntryCache::move_into_place), else null (a is dynamic, runs eagerly, or b
// is static). Logged under recompiles with `who`.
template <class E, class A>
std::shared_ptr<E> take_place_of_static(const std::shared_ptr<A>& a_entry, E& b, const std::string& who) {
  DynamicSizes& d = b.guards.dyn;
  if (!a_entry || !d.dynamic() || !d.ledger || a_entry->guards.dyn.dynamic() || a_entry->eager()) return nullptr;
  auto a = std::const_pointer_cast<E>(std::static_pointer_cast<const E>(a_entry));
  std::vector<int64_t> key;
  for (const auto& [at_a, at_b] : d.class_pairs(a->guards.sizes, b.guards.sizes)) key.push_back(at_a);
  if (key == d.own_key) return nullptr;
  d.ledger->admit(key, d.derived_values(/*at_a=*/true));
  b.specialized->insert(key, a);
  TCAP_LOG(Recompiles, who << " entry " << b.id << " takes the place of entry " << a->id << ", whose sizes "
                           << c10::IntArrayRef(key) << " it serves with that entry's code, and is entry " << a->id
                           << " from now on");
  return a;
}

// A specialization made (on either thread): counted as a compile, logged and stored; the
// one stored first is returned (two threads may make one at once).
template <class E>
std::shared_ptr<E> store_specialization(const E& e, const std::vector<int64_t>& key, std::shared_ptr<E> s, Stats* stats,
                                        const std::string& who) {
  if (stats) stats->count(&CompileStats::compiles);
  log_specialized(who, e.id, key);
  return e.specialized->insert(key, std::move(s));
}

// Note [Dynamic sizes]: dynamic entry `e` at class values `key`, for every front door: e
// itself at its own values, else its specialization, made once per key by `make(graph)`
// (the door compiles `e`'s graph patched for `key` into an entry; null when it cannot),
// counted as a compile in `stats` and logged (`who()` names the door). E is the door's
// entry type; it has `id`, `guards` and `specialized` (a Specializations<E>).
template <class E, class Who, class Make>
std::shared_ptr<const E> specialized(const std::shared_ptr<const E>& e, const ir::Graph& graph,
                                     const std::vector<int64_t>& key, Stats* stats, Who&& who, Make&& make) {
  const DynamicSizes& d = e->guards.dyn;
  if (!d.dynamic() || key == d.own_key) return e;
  if (auto s = e->specialized->find(key)) return s;
  std::shared_ptr<E> s = make(specialize(graph, d, key));
  if (!s) return nullptr;
  return store_specialization(*e, key, std::move(s), stats, who());
}

// Note [Specializations in the background]
// With CompileOptions::compile_in_background no call waits for a compile: not for kernels
// (Note [Kernels compiled in the background]), and not for the specialization of a dynamic
// entry to sizes it has admitted (its graph patched, partitioned and fused again, about
// 2 ms for a transformer layer). The first call at such sizes submits the specialization
// to the background compile thread through `submit(what, job)` and runs eagerly (by
// design, counted as an eager call); later calls at them run eagerly until it is stored,
// then replay it. A specialization that fails in the background is made again on the
// calling thread at the next call, which meets the failure as it would without the
// option. The job holds the entry, the key and the `make` that `make_job()` returns (it
// must hold what it reads by value: the call that submitted it has returned by the time it
// runs); `make_job` and `who` are called only when a job is submitted or a failed one is
// made again, so a call at stored sizes pays one map lookup. Returns e, its stored
// specialization, or null (the call runs eagerly).
template <class E, class Who, class MakeJob, class Submit>
std::shared_ptr<const E> specialized_in_background(const std::shared_ptr<const E>& e, const ir::Graph* graph,
                                                   const std::vector<int64_t>& key, const std::shared_ptr<Stats>& stats,
                                                   Who&& who, MakeJob&& make_job, Submit&& submit) {
  const DynamicSizes& d = e->guards.dyn;
  if (!d.dynamic() || key == d.own_key) return e;
  if (auto s = e->specialized->find(key)) return s;
  if (e->specialized->failed(key)) return specialized(e, *graph, key, stats.get(), who, make_job());
  if (e->specialized->claim(key)) {
    std::string name = who();
    TCAP_LOG(Recompiles, name << " entry " << e->id << " specializes to sizes " << c10::IntArrayRef(key)
                              << " of its dynamic dims in the background; calls at them run eagerly until then");
    std::string what = name + " entry " + std::to_string(e->id) + " at sizes " + c10::str(c10::IntArrayRef(key));
    submit(std::move(what), [e, graph, key, stats, name = std::move(name), make = make_job()]() mutable {
      std::shared_ptr<E> s;
      try {
        s = make(specialize(*graph, e->guards.dyn, key));
      } catch (...) {
        e->specialized->fail(key);
        throw;
      }
      if (!s) return e->specialized->fail(key);
      store_specialization(*e, key, std::move(s), stats.get(), name);
    });
  }
  return nullptr;
}

}  // namespace tcap::cache

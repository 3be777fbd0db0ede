// The cache of compiled entries shared by tcap::compile, tcap::compile_step and compiled
// autograd (DESIGN.md D10), and the one loop that serves their calls (Note [The serving
// loop]): the stance (include/tcap/stance.h), lookup over the entries' guards, the retry
// after a host value changed, the cache-size limit, recompile reasons, the eager fallback
// with its reason, and the stats. Each front door keeps its own entry type (derived from
// Entry) and says what differs: what a call is, how a hit is replayed, how a miss is
// captured, how the call runs eagerly. What a guard is, when to recompile, when to give up
// and how that is logged are decided here, once.
//
// Thread safety: lookup() reads an immutable snapshot of the entries (copy on write), so
// calls on several threads never block each other on a hit; add() and the fallback
// state take a mutex.
#pragma once

#include "cache/guards.h"
#include "cache/stats.h"

#include <tcap/compile.h>
#include <tcap/interpreter.h>
#include <tcap/stance.h>

#include <atomic>
#include <chrono>
#include <map>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

namespace tcap::cache {

// Note [Calls that run eagerly]
// What runs eagerly, and why, is held by the cache in one form for every front door, and
// only the serving loop acts on it (it runs the call through door.eager(why) and counts it):
//   * the whole front door (EntryCache::fall_back): every call from then on; reported once,
//     when the cause is found (a forward that cannot be recorded, a step whose parts tcap
//     cannot follow);
//   * an entry (EntryCache::run_eagerly_from_now): the calls its guards fit, such as
//     compile_step's entry whose step cannot be compiled for those guards, or that runs
//     once by design while it creates optimizer state;
//   * a structure (EntryCache::run_structure_eagerly): every call whose CallView::structure
//     is that key, whatever its sizes (compiled autograd's backward graphs that could not
//     be compiled).
// The front door goes on compiling other calls around an entry or a structure that runs
// eagerly, so each call served so is a fallback of its own: reported (logged, or thrown
// under error_on_fallback) every time, unless it runs eagerly by design.
struct EagerMark {
  std::string why;
  bool by_design = false;  // not a fallback (logged once under graph_breaks when set)
};

// Logs a fallback of one call (or one entry) and throws under error_on_fallback (Note
// [Never wrong, never silent], below).
void report_fallback(const std::string& who, const std::string& why);

// One compiled entry of any front door.
struct Entry {
  int id = 0;
  Guards guards;
  virtual ~Entry() = default;
  // Set when the entry's calls run eagerly (Note [Calls that run eagerly]); null otherwise.
  std::shared_ptr<const EagerMark> eager() const { return std::atomic_load(&eager_); }

 private:
  friend class EntryCache;
  std::shared_ptr<const EagerMark> eager_;
};

using EntryList = std::vector<std::shared_ptr<Entry>>;

struct Lookup {
  std::shared_ptr<Entry> hit;
  std::vector<int64_t> key;           // a dynamic hit's class values (Note [Dynamic sizes])
  std::vector<at::Tensor> primals;    // a hit's primals: the call's tensors, then the held ones
  // The hit is dynamic and its class values are not checked yet: the call is a check
  // capture (Note [Checking a new size]).
  bool check_sizes = false;
  std::string first_miss;             // why the first entry did not fit (see lookup)
  bool first_structure_miss = false;  // first_miss is "another structure"
  std::shared_ptr<Entry> size_miss_of;  // the newest entry that missed on sizes only (one whose
                                        // changed sizes are >= 2 preferred)
  bool size_miss_usable = false;        // size_miss_of's changed sizes are >= 2 both ways
  std::vector<size_t> changed;          // ... and the sizes that changed
  std::shared_ptr<Entry> host_miss_of;  // an entry that missed on a host value only
  size_t entries_seen = 0;              // how many entries the cache held when it looked
  std::string static_dims;              // changed dims kept static (CompileOptions::static_dims)
};

// What to do about a call no entry fits.
enum class Admission { Capture, RunEager };

// What a check capture recorded (Note [Checking a new size]): the graph the front door
// compares with a dynamic entry's record, or why it could not record one (then `graph` is
// empty and `why_not` is the verdict).
struct SizeCheckRecording {
  ir::Graph graph;
  std::string why_not;
};

// Where an entry's graphs are dumped: CompileOptions::dump_dir, else TCAP_DUMP_DIR ("" when
// neither is set).
std::string dump_dir_of(const CompileOptions& o);
// The one dump of every front door's entries: each of `graphs` ({suffix, graph}) written as
// <dump dir>/<base><suffix>.json when a dump dir is set. A graph that cannot be written is
// logged (graphs channel) and skipped: a dump never fails the call that compiles.
void dump_graphs(const CompileOptions& o, const std::string& base,
                 const std::vector<std::pair<std::string, const ir::Graph*>>& graphs);

class EntryCache {
 public:
  // `who` names the front door in messages ("'fn'", "step 'train'", "compiled autograd").
  // `check_new_sizes`: CompileOptions::check_new_sizes (Note [Checking a new size]).
  // `static_dims`: CompileOptions::static_dims, {input, dim} of the call's tensors;
  // `promises`: CompileOptions::dynamic_dims (checked: bounds, no dim both static and promised).
  EntryCache(std::string who, int limit, bool dynamic, bool check_new_sizes = true,
             std::vector<std::pair<int, int>> static_dims = {},
             std::vector<CompileOptions::DynamicDim> promises = {});

  const std::string& who() const { return who_; }
  int limit() const { return limit_; }
  std::shared_ptr<const EntryList> entries() const;
  size_t size() const { return entries()->size(); }

  // The first entry from position `start` whose guards fit the call. `primals` is the
  // call's tensors; held tensors are appended per entry. A hit's position is `*pos`.
  Lookup lookup(const CallView& call, const std::vector<at::Tensor>& primals, size_t start = 0,
                size_t* pos = nullptr) const;
  // Notes a miss found while replaying `e` (an inline host-value check) into `l`.
  static void note_replay_miss(Lookup& l, const std::shared_ptr<Entry>& e, const std::string& why);
  // Note [Serving a call]: the lookup loop of all three front doors (tcap::compile,
  // compile_step, compiled autograd; the last has no host values, so it never retries).
  // From position `start`, every entry whose guards fit is handed to serve(found), which
  // replays it and returns the call's result, or returns nullopt to stop looking (the
  // call is not served from the cache), or throws HostValueChanged when an inline
  // host-value check fails before the replay changed anything visible: the lookup then
  // goes on after that entry. Without a result, `miss` holds what the call's lookups found
  // (the first entry's reason, an entry that missed on sizes alone, one that missed on a
  // host value alone), for admit() and the recompile's log line.
  template <class R, class Serve>
  std::optional<R> serve(const CallView& call, const std::vector<at::Tensor>& primals, Lookup& miss, Serve&& serve,
                         size_t start = 0) const {
    for (bool first = true;; first = false) {
      size_t pos = 0;
      Lookup found = lookup(call, primals, start, &pos);
      if (first) miss.entries_seen = found.entries_seen;
      if (miss.first_miss.empty()) {
        miss.first_miss = found.first_miss;
        miss.first_structure_miss = found.first_structure_miss;
      }
      if (!miss.size_miss_of) {
        miss.size_miss_of = found.size_miss_of;
        miss.changed = found.changed;
        miss.size_miss_usable = found.size_miss_usable;
      }
      if (!miss.host_miss_of) miss.host_miss_of = found.host_miss_of;
      if (miss.static_dims.empty()) miss.static_dims = found.static_dims;
      if (!found.hit) return std::nullopt;
      try {
        return serve(found);
      } catch (const HostValueChanged& err) {
        note_replay_miss(miss, found.hit, err.what_without_backtrace());
        start = pos + 1;
      }
    }
  }
  // Note [The serving loop]
  // Every call of every front door goes through here, in this order:
  //   1. the stance and anomaly mode: run eagerly by design (Stance::ForceEager; anomaly
  //      mode wants the engine's per-node checks);
  //   2. door.before(): what the front door checks and reads before a lookup (the modules'
  //      tensors, the backward's walk); it may run the call eagerly itself;
  //   3. a front door that fell back for good runs eagerly (reported when it fell back);
  //   4. serve(): the entries whose guards fit, each replayed by door.replay(found, true)
  //      until one serves the call (a host-value miss inside a replay looks on); a hit at
  //      class values its dynamic entry has not served is a check capture instead
  //      (door.check, Note [Checking a new size]);
  //   5. door.after_miss(&look_again): a front door's own way to serve a miss (tcap::
  //      compile's capture that waits for its backward); when it published an entry
  //      meanwhile it sets look_again, and step 4 runs again, its lookup now the miss;
  //   6. door.explain(miss, note): the front door's words for the miss;
  //   7. door.exclusive(): the right to capture (one capture at a time); without it the call
  //      runs eagerly, by design; with it, the entries other calls published since step 4
  //      are tried first (door.replay(found, false));
  //   8. admit(): the stance, the cache limit, the recompile log line; recompiles counted;
  //   9. door.capture(miss): the call runs eagerly while recording a new entry.
  // A Door has `using Out = ...` (what a call returns) and these members:
  //   std::optional<Out> before();           const CallView& view();
  //   const std::vector<at::Tensor>& primals();
  //   std::optional<Out> replay(const Lookup& found, bool first);   (nullopt: not served)
  //   std::optional<Out> after_miss(bool* look_again);
  //   void explain(Lookup& miss, std::string& note);
  //   bool exclusive();                      Out capture(const Lookup& miss);
  //   Out eager(const std::string& why);     (runs the call eagerly; the loop counted it)
  //   std::optional<Out> check(SizeCheckRecording* recorded);
  //                                          (a check capture: the call's eager result, and
  //                                          what it recorded; Note [Checking a new size])
  template <class Door>
  typename Door::Out serve_call(Door& door) {
    using Out = typename Door::Out;
    stats_->count(&CompileStats::calls);
    if (stance() == Stance::ForceEager) return run_eagerly(door, "stance force_eager");
    if (eager_by_design()) return run_eagerly(door, "anomaly mode is on");
    const auto t0 = std::chrono::steady_clock::now();
    if (std::optional<Out> out = door.before()) return std::move(*out);
    if (fell_back()) return run_eagerly(door, eager_reason());
    if (std::shared_ptr<const EagerMark> m = structure_runs_eagerly(door.view().structure)) {
      return run_marked_eagerly(door, *m, " (for this graph structure)");
    }
    bool timed = false;
    auto note_time = [&] {
      if (timed) return;
      timed = true;
      stats_->add_lookup_ns(std::chrono::duration_cast<std::chrono::nanoseconds>(std::chrono::steady_clock::now() - t0).count());
    };
    Lookup miss;
    std::optional<Out> served = serve<Out>(door.view(), door.primals(), miss, [&](const Lookup& found) {
      note_time();
      return serve_found(door, found, /*first=*/true);
    });
    if (served) return std::move(*served);
    note_time();
    bool look_again = false;
    if (std::optional<Out> out = door.after_miss(&look_again)) return std::move(*out);
    if (look_again) {
      Lookup fresh;
      served = serve<Out>(door.view(), door.primals(), fresh,
                          [&](const Lookup& found) { return serve_found(door, found, /*first=*/true); });
      if (served) return std::move(*served);
      miss = std::move(fresh);
    }
    const size_t seen = miss.entries_seen;
    if (fell_back()) return run_eagerly(door, eager_reason());
    std::string note = dynamic_note(miss);
    door.explain(miss, note);
    if (!door.exclusive()) return run_eagerly(door, "another call is capturing");
    if (size() > seen) {
      Lookup again;
      served = serve<Out>(door.view(), door.primals(), again,
                          [&](const Lookup& found) { return serve_found(door, found, /*first=*/false); }, seen);
      if (served) return std::move(*served);
    }
    if (admit(miss, note) == Admission::RunEager) return run_eagerly(door, "no recompile (see the recompiles log)");
    if (size() > 0) stats_->count(&CompileStats::recompiles);
    return door.capture(miss);
  }
  // A hit: replayed, or at class values its entry has not served, checked (step 4).
  template <class Door>
  std::optional<typename Door::Out> serve_found(Door& door, const Lookup& found, bool first) {
    if (std::shared_ptr<const EagerMark> m = found.hit->eager()) return run_marked_eagerly(door, *m, " (for these guards)");
    return found.check_sizes ? check_sizes(door, found) : door.replay(found, first);
  }
  // A call that an entry or a structure marked eager serves (Note [Calls that run eagerly]).
  template <class Door>
  typename Door::Out run_marked_eagerly(Door& door, const EagerMark& m, const char* which) {
    if (!m.by_design) report_fallback(who_ + which, m.why);
    return run_eagerly(door, m.why);
  }
  // Note [Checking a new size]: the call runs the user's code while recording
  // (door.check(&recorded), which returns the call's eager result); the recording is
  // compared with the entry's record at the hit's class values, and the verdict logged and
  // kept by the entry's ledger so that later calls at these values replay or miss.
  //
  // Note [One check capture for every dynamic entry]
  // A function whose host code branches on a size has a dynamic entry per branch taken
  // (lengths up to a limit, lengths beyond it). A call at new sizes fits each of them, and
  // the first to refuse them is not the last word: the same recording is compared with the
  // record of every later dynamic entry whose guards fit the call and which has not checked
  // these sizes either (found before the call ran, in lookup order), until one admits them.
  // The user's code runs once per new size, not once per entry, and the next call replays
  // the entry that admitted them, or captures when none did.
  template <class Door>
  std::optional<typename Door::Out> check_sizes(Door& door, const Lookup& found) {
    stats_->count(&CompileStats::size_checks);
    std::vector<Lookup> others = also_unchecked(door.view(), door.primals(), found);
    SizeCheckRecording recorded;
    std::optional<typename Door::Out> out = door.check(&recorded);
    // A ledger edits the graph it compares: each comparison but the last gets a copy.
    std::string verdict = ledger_check(found, others.empty() ? std::move(recorded.graph) : recorded.graph, recorded.why_not);
    log_size_check(found, verdict);
    for (size_t k = 0; k < others.size() && !verdict.empty() && recorded.why_not.empty(); ++k) {
      verdict = ledger_check(others[k], k + 1 == others.size() ? std::move(recorded.graph) : recorded.graph, "");
      log_size_check(others[k], verdict, /*same_recording=*/true);
    }
    return out;
  }
  template <class Door>
  typename Door::Out run_eagerly(Door& door, const std::string& why) {
    stats_->count(&CompileStats::eager_calls);
    return door.eager(why);
  }

  Stats& stats() { return *stats_; }
  const std::shared_ptr<Stats>& shared_stats() const { return stats_; }

  // The note admit() logs for a miss on sizes alone: "; marking dim 0 of 'x' dynamic" for
  // each size that changed ("" for any other miss).
  static std::string dynamic_note(const Lookup& miss);

  // After a miss: whether to capture a new entry, per the stance and the cache limit.
  // Logs the recompile with its reason (and the sizes marked dynamic), or why the call
  // runs eagerly. Throws RecompileError under Stance::FailOnRecompile, FallbackError
  // when the limit is reached and error_on_fallback is on.
  Admission admit(const Lookup& miss, const std::string& dynamic_note = "");
  // Publishes a new entry (assigns its id); with `replaces`, in its place (an entry the
  // new one generalizes: the old one would only miss first).
  void add(const std::shared_ptr<Entry>& e, const std::shared_ptr<Entry>& replaces = nullptr);
  // Moves published entry e into the place of `replaced` (Note [A dynamic entry takes the
  // place of the static one]): e takes its slot and id, and its own slot goes. For an
  // entry generalized after it was published (compile_step's).
  void move_into_place(Entry& e, const std::shared_ptr<Entry>& replaced);
  // One more than the largest id published (ids stay unique when an entry moves into
  // another's place).
  int next_id() const;

  // Whether this call runs eagerly by design, whatever the entries (not a fallback): while
  // anomaly mode is on, a user wants the engine's per-node checks and forward traces, which
  // only the eager graph has (the reason is logged under graph_breaks once per episode).
  bool eager_by_design();

  // The eager fallback of the whole front door (Note [Never wrong, never silent]):
  // from now on every call runs eagerly; `why` is logged under graph_breaks, and thrown
  // as FallbackError when error_on_fallback is on.
  void fall_back(const std::string& why);
  // Whether fall_back() was called: every call runs eagerly.
  bool fell_back() const { return fell_back_.load(std::memory_order_acquire); }
  // Note [Calls that run eagerly]: from now on the calls that entry e serves run eagerly
  // (e need not be in the cache: a check capture's entry tells its caller so). Reported as
  // a fallback of `who()` (for these guards), or logged under graph_breaks when by design.
  void run_eagerly_from_now(Entry& e, const std::string& why, bool by_design = false);
  // ... and every call whose CallView::structure is `structure`, whatever its sizes.
  void run_structure_eagerly(std::string_view structure, const std::string& why);
  // The mark of `structure` (null when none; "" is never marked).
  std::shared_ptr<const EagerMark> structure_runs_eagerly(std::string_view structure) const;
  // Why calls run eagerly: the fall_back() reason, or the cache limit ("" if neither).
  std::string eager_reason() const;
  bool dynamic() const { return dynamic_; }
  // Logs a check capture's verdict under recompiles ("" = the values are served);
  // `same_recording`: the verdict of another entry on the same check capture's recording.
  void log_size_check(const Lookup& found, const std::string& verdict, bool same_recording = false) const;
  // Note [One check capture for every dynamic entry]: the hits after `found` (in lookup
  // order) that are dynamic entries with `found`'s need: these class values not checked.
  std::vector<Lookup> also_unchecked(const CallView& call, const std::vector<at::Tensor>& primals,
                                     const Lookup& found) const;
  // The verdict of found's ledger at found's class values (kept there) on a check capture's
  // graph `got`, or `why_not` when it recorded none.
  static std::string ledger_check(const Lookup& found, ir::Graph got, const std::string& why_not);

 private:
  std::string who_;
  int limit_;
  bool dynamic_;
  bool check_new_sizes_;
  std::vector<std::pair<int, int>> static_dims_;
  std::vector<CompileOptions::DynamicDim> promises_;
  // Whether CompileOptions::dynamic_dims covers class values `key` of dynamic entry e: every
  // class whose value is not the captured one holds a promised dim whose bounds hold it.
  // If so, the values are admitted to e's ledger without a check capture, logged once.
  bool promised(const Entry& e, const std::vector<int64_t>& key) const;
  // The changed sizes (flattened positions) that are marked static, named ("dim 1 of 'x'").
  std::string static_changes(const std::vector<TensorGuard>& tensors, const std::vector<size_t>& changed) const;
  mutable std::mutex mutex_;
  std::shared_ptr<const EntryList> entries_ = std::make_shared<EntryList>();
  std::string eager_reason_;
  std::atomic<bool> fell_back_{false};
  std::map<std::string, std::shared_ptr<const EagerMark>, std::less<>> eager_structures_;  // under mutex_
  std::atomic<bool> any_eager_structure_{false};
  bool warned_limit_ = false;
  std::atomic<bool> in_anomaly_mode_{false};
  std::shared_ptr<Stats> stats_ = std::make_shared<Stats>();
};

// Note [Never wrong, never silent]
// What tcap cannot compile it runs eagerly, and says why: one log line under
// graph_breaks naming the function and the cause. Under error_on_fallback (tcap::
// set_error_on_fallback, TCAP_ERROR_ON_FALLBACK=1) the same message is thrown as
// tcap::FallbackError instead, so tests and careful programs cannot miss it. Calls that
// run eagerly by design (the capturing first call, Stance::ForceEager,
// Stance::EagerOnRecompile) are not fallbacks.
[[noreturn]] void throw_fallback(const std::string& who, const std::string& why);
// Logs a fallback of one call (or one entry) and throws under error_on_fallback.
void report_fallback(const std::string& who, const std::string& why);

}  // namespace tcap::cache

// See Note [How tcap-bench times] in harness.h. Counting CPU bytes: byte_counter.cpp;
// reporting: report.cpp.
#include "harness.h"

#include <c10/core/Allocator.h>
#include <c10/core/CPUAllocator.h>
#include <nlohmann/json.hpp>

#include <algorithm>
#include <atomic>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <fstream>
#include <limits>
#include <mutex>
#include <ostream>
#include <stdexcept>
#include <tuple>
#include <unordered_map>

namespace tcap::bench {

// --- Record, Sample, Registry -------------------------------------------------------------

void Record::set(const std::string& key, double value) {
  for (auto& [k, v] : metrics) {
    if (k == key) {
      v = value;
      return;
    }
  }
  metrics.emplace_back(key, value);
}

std::optional<double> Record::get(const std::string& key) const {
  for (const auto& [k, v] : metrics) {
    if (k == key) return v;
  }
  return std::nullopt;
}

const std::vector<double>* Record::rounds_of(const std::string& key) const {
  for (const auto& [k, v] : per_round) {
    if (k == key) return &v;
  }
  return nullptr;
}

namespace {
void (*g_device_sync)() = nullptr;
}  // namespace

void set_device_sync(void (*sync)()) { g_device_sync = sync; }

void Sample::start() {
  if (g_device_sync) g_device_sync();
  t0_ = Clock::now();
}

void Sample::stop(const char* metric) {
  if (g_device_sync) g_device_sync();
  add(metric, std::chrono::duration<double>(Clock::now() - t0_).count());
}

void Sample::add(const char* metric, double s) {
  for (auto& [m, total] : seconds_) {
    if (m == metric || std::strcmp(m, metric) == 0) {
      total += s;
      return;
    }
  }
  seconds_.emplace_back(metric, s);
}

void Registry::add(Workload w) { workloads_.push_back(std::move(w)); }

bool Options::wants(const std::string& variant) const {
  return variants.empty() || std::find(variants.begin(), variants.end(), variant) != variants.end();
}

Variant Variant::skip(std::string name, std::string why, bool failed) {
  Variant v{std::move(name), [](Sample&) {}};
  v.skipped = std::move(why);
  v.failed = failed;
  return v;
}

Record* find_variant(std::vector<Record>& records, const std::string& variant) {
  for (auto& r : records) {
    if (r.variant == variant) return &r;
  }
  return nullptr;
}

double quantile(std::vector<double> xs, double q) {
  if (xs.empty()) return std::numeric_limits<double>::quiet_NaN();
  std::sort(xs.begin(), xs.end());
  const double pos = q * static_cast<double>(xs.size() - 1);
  const size_t lo = static_cast<size_t>(std::floor(pos));
  const size_t hi = std::min(lo + 1, xs.size() - 1);
  return xs[lo] + (pos - static_cast<double>(lo)) * (xs[hi] - xs[lo]);
}

std::vector<double> paired_difference(const Record& a, const Record& b, const std::string& metric,
                                      double scale) {
  const auto* xa = a.rounds_of(metric);
  const auto* xb = b.rounds_of(metric);
  std::vector<double> d;
  if (!xa || !xb) return d;
  for (size_t i = 0; i < std::min(xa->size(), xb->size()); ++i) d.push_back(((*xa)[i] - (*xb)[i]) * scale);
  return d;
}

void set_with_spread(Record& r, const std::string& key, double value, std::vector<double> per_round) {
  r.set(key, value);
  r.set(key + "_p10", quantile(per_round, 0.1));
  r.set(key + "_p90", quantile(per_round, 0.9));
  r.per_round.emplace_back(key, std::move(per_round));
}

// --- running ------------------------------------------------------------------------------

namespace {

using Clock = std::chrono::steady_clock;

std::string format_gbs(double gbs) {
  char buf[32];
  std::snprintf(buf, sizeof buf, "%.1f", gbs);
  return buf;
}

double ms_since(Clock::time_point t0) {
  return std::chrono::duration<double, std::milli>(Clock::now() - t0).count();
}

// Warm-up: runs v for warmup_ms (at least 2 iterations), then returns how many iterations
// fill round_ms, judged by the wall time of whole iterations (setup included).
int64_t warm_up(const Variant& v, const Options& o) {
  Sample s;
  int64_t n = 0;
  const auto t0 = Clock::now();
  do {
    v.run(s);
    ++n;
  } while (n < 2 || ms_since(t0) < o.warmup_ms);
  const double ms_per_iter = ms_since(t0) / static_cast<double>(n);
  const double iters = std::ceil(o.round_ms / std::max(ms_per_iter, 1e-6));
  return static_cast<int64_t>(std::clamp(iters, 1.0, 1e7));
}

struct Series {
  std::vector<std::pair<std::string, std::vector<double>>> per_metric;  // µs per unit, per round

  void add(const std::string& metric, double us) {
    for (auto& [m, xs] : per_metric) {
      if (m == metric) {
        xs.push_back(us);
        return;
      }
    }
    per_metric.emplace_back(metric, std::vector<double>{us});
  }
};

// The first timed metric of each variant, divided by the eager variant's ("x_eager").
void add_ratios_to_eager(std::vector<Record>& records) {
  const Record* eager = find_variant(records, "eager");
  if (!eager || eager->per_round.empty()) return;
  const std::string& metric = eager->per_round.front().first;
  const double base = *eager->get(metric);
  for (auto& r : records) {
    if (&r == eager) continue;
    if (auto v = r.get(metric)) r.set("x_eager", *v / base);
  }
}

// The peer's rows against its own eager: x_py_eager, bwd_x_py_eager (whole-step workloads:
// x_py_eager of step_us).
void add_ratios_to_py_eager(std::vector<Record>& records) {
  const Record* py = find_variant(records, "py_eager");
  if (!py) return;
  for (auto& r : records) {
    if (&r == py || r.variant != "inductor") continue;
    for (const auto& [metric, key] : {std::pair<std::string, std::string>{"fwd_us", "x_py_eager"},
                                      {"bwd_us", "bwd_x_py_eager"},
                                      {"step_us", "x_py_eager"}}) {
      if (r.get(metric) && py->get(metric)) r.set(key, *r.get(metric) / *py->get(metric));
    }
  }
}

// See Note [Bandwidth floors] in harness.h.
void add_floors(const FloorBytes& floor, const Bandwidth& bw, std::vector<Record>& records) {
  if (bw.triad_gbs <= 0) return;
  for (auto& r : records) {
    if (!r.skipped.empty()) continue;
    for (const auto& [bytes, metric, floor_key, ratio_key] :
         {std::tuple<double, const char*, const char*, const char*>{floor.fwd, "fwd_us", "floor_fwd_us",
                                                                     "fwd_x_floor"},
          {floor.bwd, "bwd_us", "floor_bwd_us", "bwd_x_floor"}}) {
      if (bytes <= 0) continue;
      const double floor_us = bytes / (bw.triad_gbs * 1e9) * 1e6;
      r.set(floor_key, floor_us);
      if (auto v = r.get(metric)) r.set(ratio_key, *v / floor_us);
    }
  }
}

// x_inductor / bwd_x_inductor / step_x_inductor of the C++ rows: the median over rounds of
// the ratio to the peer's inductor round run right after (Note [The torch.compile peer]);
// the step is forward + backward. Whole-step workloads (step_us, the programs) get
// x_inductor of their step.
void add_ratios_to_inductor(std::vector<Record>& records) {
  const Record* ind = find_variant(records, "inductor");
  if (!ind || !ind->skipped.empty()) return;
  auto paired = [](const std::vector<double>& mine, const std::vector<double>& theirs) {
    std::vector<double> ratios;
    for (size_t k = 0; k < mine.size(); ++k) ratios.push_back(mine[k] / theirs[k]);
    return quantile(ratios, 0.5);
  };
  const auto* ind_fwd = ind->rounds_of("fwd_us");
  const auto* ind_bwd = ind->rounds_of("bwd_us");
  const auto* ind_step = ind->rounds_of("step_us");
  for (auto& r : records) {
    if (&r == ind || r.variant == "py_eager" || !r.skipped.empty()) continue;
    const auto* fwd = r.rounds_of("fwd_us");
    const auto* bwd = r.rounds_of("bwd_us");
    const auto same = [](const std::vector<double>* a, const std::vector<double>* b) {
      return a && b && !a->empty() && a->size() == b->size();
    };
    const auto* step = r.rounds_of("step_us");
    if (same(step, ind_step)) r.set("x_inductor", paired(*step, *ind_step));
    if (same(fwd, ind_fwd)) r.set("x_inductor", paired(*fwd, *ind_fwd));
    if (same(bwd, ind_bwd)) r.set("bwd_x_inductor", paired(*bwd, *ind_bwd));
    if (same(fwd, ind_fwd) && same(bwd, ind_bwd) && same(fwd, bwd)) {
      std::vector<double> mine, theirs;
      for (size_t k = 0; k < fwd->size(); ++k) {
        mine.push_back((*fwd)[k] + (*bwd)[k]);
        theirs.push_back((*ind_fwd)[k] + (*ind_bwd)[k]);
      }
      r.set("step_x_inductor", paired(mine, theirs));
    }
  }
}

std::vector<Record> run_workload(const Workload& w, const Options& o, Peer* peer, const Bandwidth* bw) {
  if (peer) peer->setup(w.name);  // torch.compile's compile and check, before any warm-up here
  std::vector<Variant> variants = w.make(o);
  variants.erase(std::remove_if(variants.begin(), variants.end(), [&](const Variant& v) { return !o.wants(v.name); }),
                 variants.end());
  // A variant that throws while it is timed is reported as failed; the others go on.
  auto fails = [](Variant& v, const std::exception& e) {
    const std::string what = e.what();
    v.skipped = "threw while timed: " + what.substr(0, what.find('\n'));
    v.failed = true;
  };
  std::vector<int64_t> iters;
  for (auto& v : variants) {
    iters.push_back(0);
    if (!v.skipped.empty()) continue;
    try {
      iters.back() = warm_up(v, o);
    } catch (const std::exception& e) {
      fails(v, e);
    }
  }

  std::vector<Series> series(variants.size());
  for (int round = 0; round < o.repeats; ++round) {
    for (size_t i = 0; i < variants.size(); ++i) {  // interleaved: A B A B ...
      if (!variants[i].skipped.empty()) continue;
      Sample s;
      try {
        for (int64_t k = 0; k < iters[i]; ++k) variants[i].run(s);
      } catch (const std::exception& e) {
        fails(variants[i], e);
        continue;
      }
      const double units_in_round = static_cast<double>(iters[i]) * variants[i].units;
      for (const auto& [metric, seconds] : s.seconds()) {
        series[i].add(metric, seconds * 1e6 / units_in_round);
      }
    }
    if (peer) peer->round();
  }

  std::vector<Record> records;
  for (size_t i = 0; i < variants.size(); ++i) {
    Record r;
    r.workload = w.name;
    r.variant = variants[i].name;
    if (!variants[i].skipped.empty()) {
      r.skipped = variants[i].skipped;
      r.failed = variants[i].failed;
      records.push_back(std::move(r));
      continue;
    }
    r.rounds = o.repeats;
    r.iters_per_round = iters[i];
    for (const auto& [metric, xs] : series[i].per_metric) {
      r.set(metric, quantile(xs, 0.5));
      r.set(metric + "_p10", quantile(xs, 0.1));
      r.set(metric + "_p90", quantile(xs, 0.9));
      r.per_round.emplace_back(metric, xs);
    }
    for (const auto& [key, value] : variants[i].fixed) r.set(key, value);
    records.push_back(std::move(r));
  }
  if (peer) {
    for (auto& r : peer->finish()) {
      if (o.wants(r.variant)) records.push_back(std::move(r));
    }
  }
  add_ratios_to_eager(records);
  if (w.derive) w.derive(records);
  add_ratios_to_py_eager(records);
  add_ratios_to_inductor(records);
  if (bw && w.floor_bytes) add_floors(w.floor_bytes(o), *bw, records);
  return records;
}

// options.filter: comma-separated substrings of workload names.
bool selected(const Workload& w, const Options& o) {
  if (o.device != "cpu" && !w.cuda) return false;
  if (o.filter.empty()) return true;
  size_t from = 0;
  while (from <= o.filter.size()) {
    const size_t to = std::min(o.filter.find(',', from), o.filter.size());
    const std::string part = o.filter.substr(from, to - from);
    if (!part.empty() && w.name.find(part) != std::string::npos) return true;
    from = to + 1;
  }
  return false;
}

}  // namespace

std::vector<Record> run_all(const Registry& registry, const Options& o, std::ostream& out) {
  std::vector<Record> all;

  // The bandwidth floors' one measurement. See Note [Bandwidth floors].
  std::optional<Bandwidth> bw;
  for (const auto& w : registry.workloads()) {
    if (!selected(w, o) || !w.floor_bytes) continue;
    const int64_t bytes = o.quick ? (int64_t{64} << 20) : (int64_t{256} << 20);
    if (o.device == "cpu") {
      bw = measure_bandwidth(bytes, o.quick ? 2 : 10);
      out << "memory bandwidth (STREAM-style, 3 x " << (bw->array_bytes >> 20) << " MiB f32 arrays, "
          << bw->threads << " threads, best of " << bw->passes << " passes): copy " << format_gbs(bw->copy_gbs)
          << " GB/s, triad " << format_gbs(bw->triad_gbs) << " GB/s\n";
    } else {
      bw = measure_device_bandwidth(o.device, bytes, o.quick ? 2 : 20);
      out << o.device << " memory bandwidth (ATen copy_ and add on 3 x " << (bw->array_bytes >> 20)
          << " MiB f32 arrays, best of " << bw->passes << " passes): copy " << format_gbs(bw->copy_gbs)
          << " GB/s, triad " << format_gbs(bw->triad_gbs) << " GB/s\n";
    }
    Record r;
    r.workload = "memory_bandwidth";
    r.variant = "stream";
    r.set("bw_copy_gbs", bw->copy_gbs);
    r.set("bw_triad_gbs", bw->triad_gbs);
    r.set("array_mib", static_cast<double>(bw->array_bytes >> 20));
    r.set("threads", bw->threads);
    r.set("passes", bw->passes);
    all.push_back(std::move(r));
    break;
  }

  // The torch.compile peer, its rounds interleaved with the C++ ones. See Note [The
  // torch.compile peer].
  std::unique_ptr<Peer> peer;
  const bool peer_on = o.inductor == 1 || (o.inductor == -1 && !o.quick);
  if (peer_on && (o.wants("inductor") || o.wants("py_eager")) &&
      std::any_of(registry.workloads().begin(), registry.workloads().end(),
                  [&](const Workload& w) { return selected(w, o) && w.has_peer; })) {
    peer = Peer::start(o, out);
  }

  for (const auto& w : registry.workloads()) {
    if (!selected(w, o)) continue;
    std::vector<Record> records = run_workload(w, o, w.has_peer ? peer.get() : nullptr, bw ? &*bw : nullptr);
    print_table(out, w, records, o);
    all.insert(all.end(), records.begin(), records.end());
  }
  return all;
}

}  // namespace tcap::bench

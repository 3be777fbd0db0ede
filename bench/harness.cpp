// See Note [How tcap-bench times] in harness.h.
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

// --- counting CPU bytes ---------------------------------------------------------------------
// See Note [Counting CPU bytes] in harness.h.

namespace {

// Plain globals, not members: a DataPtr's deleter is a bare function pointer. Atomics,
// because intra-op threads allocate too.
std::atomic<int> g_counting{0};          // live CpuByteCounters (0 or 1)
std::atomic<int64_t> g_current_bytes{0};
std::atomic<int64_t> g_peak_bytes{0};
// Counted allocations alive: data pointer -> bytes. g_buckets counts them per hash of
// the pointer, read without the lock: a free whose bucket is empty (nearly all frees in
// timed rounds, even while a few counted buffers live on) skips the look-up.
std::mutex g_counted_mutex;
std::unordered_map<const void*, int64_t> g_counted;
constexpr int kBucketBits = 16;
std::atomic<uint32_t> g_buckets[size_t{1} << kBucketBits];
c10::DeleterFnPtr g_base_deleter = nullptr;  // the wrapped allocator's raw deleter

std::atomic<uint32_t>& bucket_of(const void* data) {
  const auto h = (reinterpret_cast<uintptr_t>(data) >> 4) * uint64_t{0x9E3779B97F4A7C15};
  return g_buckets[h >> (64 - kBucketBits)];
}

void raise_peak(int64_t now) {
  int64_t peak = g_peak_bytes.load(std::memory_order_relaxed);
  while (now > peak && !g_peak_bytes.compare_exchange_weak(peak, now, std::memory_order_relaxed)) {
  }
}

// The deleter of every DataPtr the counting allocator hands out (and its raw deleter).
void release(void* data) {
  auto& bucket = bucket_of(data);
  if (bucket.load(std::memory_order_acquire) > 0) {
    std::lock_guard<std::mutex> lock(g_counted_mutex);
    auto it = g_counted.find(data);
    if (it != g_counted.end()) {
      g_current_bytes.fetch_sub(it->second, std::memory_order_relaxed);
      g_counted.erase(it);
      bucket.fetch_sub(1, std::memory_order_release);
    }
  }
  g_base_deleter(data);
}

class CountingCpuAllocator final : public c10::Allocator {
 public:
  explicit CountingCpuAllocator(c10::Allocator* base) : base_(base) {}

  c10::DataPtr allocate(size_t n) override {
    c10::DataPtr inner = base_->allocate(n);
    TORCH_INTERNAL_ASSERT(inner.get() == inner.get_context() && inner.get_deleter() == g_base_deleter,
                          "tcap-bench: the CPU allocator's DataPtrs are not simple; cannot count bytes");
    const c10::Device device = inner.device();
    void* data = inner.release_context();
    if (g_counting.load(std::memory_order_relaxed) != 0 && data) {
      const auto bytes = static_cast<int64_t>(n);
      {
        std::lock_guard<std::mutex> lock(g_counted_mutex);
        g_counted[data] = bytes;
        bucket_of(data).fetch_add(1, std::memory_order_release);
      }
      raise_peak(g_current_bytes.fetch_add(bytes, std::memory_order_relaxed) + bytes);
    }
    return {data, data, &release, device};
  }

  c10::DeleterFnPtr raw_deleter() const override { return &release; }

  void copy_data(void* dest, const void* src, std::size_t count) const override {
    default_copy_data(dest, src, count);
  }

 private:
  c10::Allocator* base_;
};

CountingCpuAllocator* g_counting_allocator = nullptr;

}  // namespace

void install_cpu_byte_counter() {
  if (g_counting_allocator) return;
  c10::Allocator* base = c10::GetCPUAllocator();
  g_base_deleter = base->raw_deleter();
  if (!g_base_deleter) {
    throw std::runtime_error("tcap-bench: the CPU allocator has no raw deleter; cannot count bytes");
  }
  // Never freed: tensors may outlive main(). Priority 1 beats the stock registration (0).
  g_counting_allocator = new CountingCpuAllocator(base);
  c10::SetCPUAllocator(g_counting_allocator, /*priority=*/1);
  if (c10::GetCPUAllocator() != g_counting_allocator) {
    throw std::runtime_error("tcap-bench: could not install the counting CPU allocator");
  }
}

CpuByteCounter::CpuByteCounter() {
  // tcap's CPU buffer pool, installed at the first compiled replay, wraps the counter
  // (Note [Counting CPU bytes]): GetCPUAllocator() is then the pool.
  if (!g_counting_allocator) {
    throw std::runtime_error("tcap-bench: CpuByteCounter needs install_cpu_byte_counter() first");
  }
  if (g_counting.fetch_add(1) != 0) {
    g_counting.fetch_sub(1);
    throw std::runtime_error("tcap-bench: only one CpuByteCounter at a time");
  }
  reset_peak();
}

CpuByteCounter::~CpuByteCounter() { g_counting.fetch_sub(1); }

int64_t CpuByteCounter::current() const { return g_current_bytes.load(); }
int64_t CpuByteCounter::peak() const { return g_peak_bytes.load(); }
void CpuByteCounter::reset_peak() { g_peak_bytes.store(g_current_bytes.load()); }

std::unordered_map<const void*, int64_t> CpuByteCounter::live() const {
  std::lock_guard<std::mutex> lock(g_counted_mutex);
  return g_counted;
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

// --- reporting ----------------------------------------------------------------------------

namespace {

bool ends_with(const std::string& s, const std::string& suffix) {
  return s.size() >= suffix.size() && s.compare(s.size() - suffix.size(), suffix.size(), suffix) == 0;
}

std::string format_number(double v) {
  char buf[64];
  if (std::isnan(v)) return "-";
  if (v == std::floor(v) && std::fabs(v) < 1e15) {
    std::snprintf(buf, sizeof buf, "%.0f", v);
  } else if (std::fabs(v) >= 1000) {
    std::snprintf(buf, sizeof buf, "%.0f", v);
  } else {
    std::snprintf(buf, sizeof buf, "%.4g", v);
  }
  return buf;
}

// The floors are the same in every row: the table says them once, above it.
bool is_floor(const std::string& key) { return key == "floor_fwd_us" || key == "floor_bwd_us"; }

// Column names: every metric in first-seen order; a timed metric's p10/p90 fold into one
// "[p10, p90]" column right after it.
std::vector<std::string> columns_of(const std::vector<Record>& records) {
  std::vector<std::string> cols;
  for (const auto& r : records) {
    for (const auto& [key, value] : r.metrics) {
      if ((ends_with(key, "_p10") || ends_with(key, "_p90")) &&
          r.is_timed(key.substr(0, key.size() - 4))) {
        continue;
      }
      if (is_floor(key)) continue;
      if (std::find(cols.begin(), cols.end(), key) == cols.end()) cols.push_back(key);
    }
  }
  return cols;
}

}  // namespace

void print_table(std::ostream& out, const Workload& w, const std::vector<Record>& records,
                 const Options& o) {
  if (records.empty()) return;
  int rounds = 0;
  for (const auto& r : records) rounds = std::max(rounds, r.rounds);
  out << "\n== " << w.name << ": " << w.description << "\n   (" << rounds
      << " rounds; timed metrics: median [p10, p90] over rounds, µs)\n";
  for (const auto& r : records) {  // Note [Bandwidth floors]: the same in every row
    const auto fwd = r.get("floor_fwd_us");
    const auto bwd = r.get("floor_bwd_us");
    if (!fwd && !bwd) continue;
    auto say = [&](const char* what, std::optional<double> us, double bytes) {
      if (us) out << " " << what << " " << format_number(*us) << " µs (" << format_number(bytes / (1 << 20)) << " MiB)";
    };
    const FloorBytes floor = w.floor_bytes ? w.floor_bytes(o) : FloorBytes{};
    out << "   bandwidth floor (bytes a perfect implementation moves / triad bandwidth):";
    say("fwd", fwd, floor.fwd);
    say("bwd", bwd, floor.bwd);
    out << "\n";
    break;
  }

  const auto cols = columns_of(records);
  std::vector<bool> has_spread;  // per column: a timed metric in some record
  std::vector<std::string> header{"variant", "iters"};
  for (const auto& c : cols) {
    header.push_back(c);
    has_spread.push_back(std::any_of(records.begin(), records.end(),
                                     [&](const Record& r) { return r.is_timed(c); }));
    if (has_spread.back()) header.push_back("[p10, p90]");
  }
  std::vector<std::vector<std::string>> rows{header};
  std::vector<std::string> skipped;  // per row: the reason, printed after the variant
  skipped.emplace_back();
  for (const auto& r : records) {
    if (!r.skipped.empty()) {
      rows.push_back({r.variant});
      skipped.push_back((r.failed ? "FAILED, not timed: " : "skipped: ") + r.skipped);
      continue;
    }
    skipped.emplace_back();
    std::vector<std::string> row{r.variant, std::to_string(r.iters_per_round)};
    for (size_t i = 0; i < cols.size(); ++i) {
      const auto v = r.get(cols[i]);
      row.push_back(v ? format_number(*v) : "-");
      if (!has_spread[i]) continue;
      row.push_back(r.is_timed(cols[i]) ? "[" + format_number(*r.get(cols[i] + "_p10")) + ", " +
                                              format_number(*r.get(cols[i] + "_p90")) + "]"
                                        : "");
    }
    rows.push_back(row);
  }

  std::vector<size_t> width(header.size(), 0);
  for (const auto& row : rows) {
    for (size_t i = 0; i < row.size(); ++i) width[i] = std::max(width[i], row[i].size());
  }
  for (size_t k = 0; k < rows.size(); ++k) {
    const auto& row = rows[k];
    out << "  ";
    if (!skipped[k].empty()) {
      out << row[0] << std::string(width[0] - row[0].size(), ' ') << "  " << skipped[k] << "\n";
      continue;
    }
    for (size_t i = 0; i < row.size(); ++i) {
      const std::string pad(width[i] - row[i].size(), ' ');
      // Text columns left-aligned, numbers right-aligned.
      out << (i == 0 ? row[i] + pad : pad + row[i]) << (i + 1 < row.size() ? "  " : "");
    }
    out << "\n";
  }
  out.flush();
}

void write_json(const std::string& path, const std::vector<Record>& records) {
  nlohmann::ordered_json list = nlohmann::ordered_json::array();
  for (const auto& r : records) {
    nlohmann::ordered_json o;
    o["workload"] = r.workload;
    o["variant"] = r.variant;
    o["rounds"] = r.rounds;
    o["iters_per_round"] = r.iters_per_round;
    if (!r.skipped.empty()) {
      o["skipped"] = r.skipped;
      o["failed"] = r.failed;
    }
    for (const auto& [key, value] : r.metrics) o[key] = value;  // NaN is written as null
    list.push_back(std::move(o));
  }
  std::ofstream f(path);
  if (!f) throw std::runtime_error("tcap-bench: cannot write " + path);
  f << list.dump(2) << "\n";
}

}  // namespace tcap::bench

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
#include <ostream>
#include <stdexcept>

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

void Sample::stop(const char* metric) {
  const double s = std::chrono::duration<double>(Clock::now() - t0_).count();
  for (auto& [m, total] : seconds_) {
    if (m == metric || std::strcmp(m, metric) == 0) {
      total += s;
      return;
    }
  }
  seconds_.emplace_back(metric, s);
}

void Registry::add(Workload w) { workloads_.push_back(std::move(w)); }

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

void raise_peak(int64_t now) {
  int64_t peak = g_peak_bytes.load(std::memory_order_relaxed);
  while (now > peak && !g_peak_bytes.compare_exchange_weak(peak, now, std::memory_order_relaxed)) {
  }
}

class CountingCpuAllocator final : public c10::Allocator {
 public:
  explicit CountingCpuAllocator(c10::Allocator* base) : base_(base) {}

  c10::DataPtr allocate(size_t n) override {
    c10::DataPtr inner = base_->allocate(n);
    if (g_counting.load(std::memory_order_relaxed) == 0) return inner;
    void* data = inner.get();
    const c10::Device device = inner.device();
    auto* counted = new Counted{std::move(inner), static_cast<int64_t>(n)};
    raise_peak(g_current_bytes.fetch_add(counted->bytes, std::memory_order_relaxed) + counted->bytes);
    return {data, counted, &CountingCpuAllocator::release, device};
  }

  // The wrapped allocator's: uncounted allocations carry its deleter. (raw_allocate() of a
  // counted one would fail LibTorch's check; nothing calls it on the CPU allocator while a
  // benchmark counts.)
  c10::DeleterFnPtr raw_deleter() const override { return base_->raw_deleter(); }

  void copy_data(void* dest, const void* src, std::size_t count) const override {
    default_copy_data(dest, src, count);
  }

 private:
  // A counted allocation: the wrapped allocator's DataPtr (freed with it) and its size.
  struct Counted {
    c10::DataPtr inner;
    int64_t bytes;
  };
  static void release(void* ctx) {
    auto* counted = static_cast<Counted*>(ctx);
    g_current_bytes.fetch_sub(counted->bytes, std::memory_order_relaxed);
    delete counted;
  }

  c10::Allocator* base_;
};

CountingCpuAllocator* g_counting_allocator = nullptr;

}  // namespace

void install_cpu_byte_counter() {
  if (g_counting_allocator) return;
  // Never freed: tensors may outlive main(). Priority 1 beats the stock registration (0).
  g_counting_allocator = new CountingCpuAllocator(c10::GetCPUAllocator());
  c10::SetCPUAllocator(g_counting_allocator, /*priority=*/1);
  if (c10::GetCPUAllocator() != g_counting_allocator) {
    throw std::runtime_error("tcap-bench: could not install the counting CPU allocator");
  }
}

CpuByteCounter::CpuByteCounter() {
  if (!g_counting_allocator || c10::GetCPUAllocator() != g_counting_allocator) {
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

// --- running ------------------------------------------------------------------------------

namespace {

using Clock = std::chrono::steady_clock;

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

std::vector<Record> run_workload(const Workload& w, const Options& o) {
  const std::vector<Variant> variants = w.make(o);
  std::vector<int64_t> iters;
  for (const auto& v : variants) iters.push_back(warm_up(v, o));

  std::vector<Series> series(variants.size());
  for (int round = 0; round < o.repeats; ++round) {
    for (size_t i = 0; i < variants.size(); ++i) {  // interleaved: A B A B ...
      Sample s;
      for (int64_t k = 0; k < iters[i]; ++k) variants[i].run(s);
      const double units_in_round = static_cast<double>(iters[i]) * variants[i].units;
      for (const auto& [metric, seconds] : s.seconds()) {
        series[i].add(metric, seconds * 1e6 / units_in_round);
      }
    }
  }

  std::vector<Record> records;
  for (size_t i = 0; i < variants.size(); ++i) {
    Record r;
    r.workload = w.name;
    r.variant = variants[i].name;
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
  add_ratios_to_eager(records);
  if (w.derive) w.derive(records);
  return records;
}

}  // namespace

std::vector<Record> run_all(const Registry& registry, const Options& o, std::ostream& out) {
  std::vector<Record> all;
  for (const auto& w : registry.workloads()) {
    if (!o.filter.empty() && w.name.find(o.filter) == std::string::npos) continue;
    std::vector<Record> records = run_workload(w, o);
    print_table(out, w, records);
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
      if (std::find(cols.begin(), cols.end(), key) == cols.end()) cols.push_back(key);
    }
  }
  return cols;
}

}  // namespace

void print_table(std::ostream& out, const Workload& w, const std::vector<Record>& records) {
  if (records.empty()) return;
  out << "\n== " << w.name << ": " << w.description << "\n   (" << records.front().rounds
      << " rounds; timed metrics: median [p10, p90] over rounds, µs)\n";

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
  for (const auto& r : records) {
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
  for (const auto& row : rows) {
    out << "  ";
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
    for (const auto& [key, value] : r.metrics) o[key] = value;  // NaN is written as null
    list.push_back(std::move(o));
  }
  std::ofstream f(path);
  if (!f) throw std::runtime_error("tcap-bench: cannot write " + path);
  f << list.dump(2) << "\n";
}

}  // namespace tcap::bench

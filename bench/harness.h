// tcap-bench's harness: a registry of named workloads, each with named variants ("eager",
// "record", "tcap_eager", later "tcap_llvm", "inductor"), timed in one process and
// reported as one Record per (workload, variant).
//
// Note [How tcap-bench times]
// Absolute times on these 2-vCPU VMs move between runs (see
// shared/notes/benchmarking-here.md), so every number is relative to variants measured in
// the same run:
//   1. warm-up: each variant runs for a while; the same runs calibrate how many
//      iterations fill one round (Options::round_ms);
//   2. rounds: each round runs every variant once, in order (A B A B ...), so slow phases
//      of the machine hit all variants alike;
//   3. a round gives one value per timed metric: its mean over the round's iterations, in
//      µs per unit of work (Variant::units); the record holds the median over rounds and
//      the spread (p10, p90), and keeps the per-round values for paired differences.
// A variant times only its own region (Sample::start / stop): setup it must redo each
// iteration (constructing a CaptureGuard) stays outside the clock.
#pragma once

#include <chrono>
#include <cstdint>
#include <functional>
#include <iosfwd>
#include <optional>
#include <string>
#include <utility>
#include <vector>

namespace tcap::bench {

struct Options {
  std::string filter;     // run the workloads whose name contains this ("" = all)
  std::string json_path;  // write the records there as a JSON list ("" = no file)
  int repeats = 15;       // rounds
  double round_ms = 50;   // target time per variant per round
  double warmup_ms = 100; // warm-up time per variant (at least 2 iterations)
  bool quick = false;     // a smoke test: few rounds and iterations
};

// Named metrics of one (workload, variant), in report order. Timed metrics are medians in
// µs per unit of work, each with "<name>_p10" and "<name>_p90" beside it; other metrics
// (counts, ratios, overheads, compile_ms, peak_bytes, saved_bytes) are plain values.
struct Record {
  std::string workload;
  std::string variant;
  int rounds = 0;
  int64_t iters_per_round = 0;
  std::vector<std::pair<std::string, double>> metrics;
  // Metrics with a spread (timed ones, paired differences): one value per round, in round
  // order; their _p10 / _p90 come from these.
  std::vector<std::pair<std::string, std::vector<double>>> per_round;

  void set(const std::string& key, double value);  // replaces or appends
  std::optional<double> get(const std::string& key) const;
  const std::vector<double>* rounds_of(const std::string& key) const;
  bool is_timed(const std::string& key) const { return rounds_of(key) != nullptr; }
};

// The clock of one variant's iterations: start() / stop("metric") around each timed
// region; several metrics per iteration are fine ("fwd_us", "bwd_us").
class Sample {
 public:
  using Clock = std::chrono::steady_clock;
  void start() { t0_ = Clock::now(); }
  // Adds the time since start() to `metric` (a string literal: compared by address first).
  void stop(const char* metric);
  const std::vector<std::pair<const char*, double>>& seconds() const { return seconds_; }
  void clear() { seconds_.clear(); }

 private:
  Clock::time_point t0_;
  std::vector<std::pair<const char*, double>> seconds_;  // per metric, summed
};

struct Variant {
  Variant(std::string name_, std::function<void(Sample&)> run_, double units_ = 1)
      : name(std::move(name_)), run(std::move(run_)), units(units_) {}

  std::string name;
  // One iteration; times its own region(s) on the Sample.
  std::function<void(Sample&)> run;
  // Units of work per iteration: timed metrics are reported in µs per unit (1000 for a
  // stream of 1000 ops reported per op).
  double units = 1;
  // Metrics measured once at setup (recorded op count, compile_ms, peak_bytes).
  std::vector<std::pair<std::string, double>> fixed;
};

struct Workload {
  std::string name;
  std::string description;  // one line, printed above the workload's table
  // Builds the variants: models, inputs, captured graphs. Not timed.
  std::function<std::vector<Variant>(const Options&)> make;
  // Optional: adds metrics that compare variants of the same run (overheads).
  std::function<void(std::vector<Record>&)> derive;
};

class Registry {
 public:
  void add(Workload w);
  const std::vector<Workload>& workloads() const { return workloads_; }

 private:
  std::vector<Workload> workloads_;
};

// Runs every workload matching options.filter; prints each workload's table to `out` as
// soon as it is done. Returns every record, workload by workload.
std::vector<Record> run_all(const Registry& registry, const Options& options, std::ostream& out);

void print_table(std::ostream& out, const Workload& w, const std::vector<Record>& records);
void write_json(const std::string& path, const std::vector<Record>& records);

// --- counting CPU bytes (peak_bytes, saved_bytes) ---------------------------------------
// Note [Counting CPU bytes]
// Memory metrics come from a c10::Allocator that wraps LibTorch's CPU allocator, installed
// once at start (install_cpu_byte_counter(), before any workload runs). It counts only
// while a CpuByteCounter is alive: otherwise allocate() returns the wrapped allocator's
// DataPtr untouched, so timed rounds pay one virtual call and an atomic load per
// allocation, and nothing else. A counted allocation carries a context that knows its size,
// so its free is counted whenever it happens, counter alive or not. Frees of blocks that
// were allocated while not counting are not seen: a measurement should first run one
// priming iteration under the counter, so that what the measured iteration frees was
// counted when it was allocated. Bytes are the sizes asked of the allocator (nbytes), not
// what malloc rounds them to; only CPU tensors' storages are seen (not oneDNN scratch
// space or other malloc calls).
void install_cpu_byte_counter();

// Counts CPU tensor bytes while alive (one at a time). See Note [Counting CPU bytes].
class CpuByteCounter {
 public:
  CpuByteCounter();   // starts counting; throws if install_cpu_byte_counter() did not run
  ~CpuByteCounter();  // stops counting
  CpuByteCounter(const CpuByteCounter&) = delete;
  CpuByteCounter& operator=(const CpuByteCounter&) = delete;

  int64_t current() const;  // bytes of counted allocations alive now
  int64_t peak() const;     // the highest current() since construction or reset_peak()
  void reset_peak();        // peak() = current()
};

// --- helpers for Workload::derive -----------------------------------------------------
// The record of `variant`, or nullptr.
Record* find_variant(std::vector<Record>& records, const std::string& variant);
// The q-quantile (0..1) of xs, linearly interpolated; NaN if empty.
double quantile(std::vector<double> xs, double q);
// Per round: (a's metric - b's metric) * scale, pairing rounds of the same run.
std::vector<double> paired_difference(const Record& a, const Record& b, const std::string& metric,
                                      double scale = 1);
// Sets `key` = value on r, with the p10 / p90 of `per_round` as its spread.
void set_with_spread(Record& r, const std::string& key, double value, std::vector<double> per_round);

}  // namespace tcap::bench

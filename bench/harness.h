// tcap-bench's harness: a registry of named workloads, each with named variants ("eager",
// "record", "tcap_eager", "tcap_llvm", ...), timed in one process and reported as one
// Record per (workload, variant); plus the machine's memory bandwidth (Note [Bandwidth
// floors]) and the rows of the torch.compile peer (Note [The torch.compile peer]).
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
#include <cstdio>
#include <functional>
#include <iosfwd>
#include <memory>
#include <optional>
#include <string>
#include <unordered_map>
#include <utility>
#include <vector>

namespace tcap::bench {

struct Options {
  std::string filter;     // run the workloads whose name contains one of these (comma-
                          // separated; "" = all)
  std::string json_path;  // write the records there as a JSON list ("" = no file)
  int repeats = 15;       // rounds
  double round_ms = 50;   // target time per variant per round
  double warmup_ms = 100; // warm-up time per variant (at least 2 iterations)
  bool quick = false;     // a smoke test: few rounds and iterations
  // Run only these variants (empty = all). A workload still builds what its selected
  // variants need (a compile workload's eager step, for the checks), untimed.
  std::vector<std::string> variants;
  // The torch.compile peer (Note [The torch.compile peer]): -1 = when a python with the
  // same torch is found (never with --quick), 0 = off, 1 = on (a skipped row if it fails).
  int inductor = -1;
  std::string python;     // the peer's interpreter ("" = search, see find_peer_python)
  // Where the compile workloads run (Note [Benchmarks on a CUDA device]): "cpu" or "cuda".
  std::string device = "cpu";
  // export_cnn writes its archive here and keeps it ("" = a temporary file).
  std::string archive_dir;

  bool wants(const std::string& variant) const;
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
  // Non-empty: the variant was not timed, and why ("backend 'llvm' is not available",
  // a failed check). `failed`: the reason is an error (a check that did not hold, tcap
  // falling back to eager), not a missing backend or tool; tcap-bench then exits with 1.
  std::string skipped;
  bool failed = false;

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
  // Waits for the device first when one is set (set_device_sync): a timed region of GPU
  // work ends when the work does, not when its launches return.
  void start();
  // Adds the time since start() to `metric` (a string literal: compared by address first).
  void stop(const char* metric);
  // Adds `seconds` measured elsewhere to `metric` (same naming rule as stop()).
  void add(const char* metric, double seconds);
  const std::vector<std::pair<const char*, double>>& seconds() const { return seconds_; }
  void clear() { seconds_.clear(); }

 private:
  Clock::time_point t0_;
  std::vector<std::pair<const char*, double>> seconds_;  // per metric, summed
};

// Note [Benchmarks on a CUDA device]
// `tcap-bench --device cuda` runs the compile workloads that support it (Workload::cuda)
// on the current CUDA device: inputs and modules live there, every Sample::start/stop
// synchronises the device (set_device_sync), the variants are eager, tcap_eager,
// tcap_cuda (backend "cuda", fused NVRTC kernels), ca_eager and ca_cuda, the peer runs its
// workloads on the device too, and the bandwidth floors use the device's copy and triad
// bandwidth, measured with ATen copies of 256 MiB (measure_device_bandwidth). peak_bytes
// and the other CPU byte counts are not measured there. Without a CUDA device, tcap-bench
// says so and exits with status 2.
void set_device_sync(void (*sync)());

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
  // Non-empty: not timed (run is not called); reported with this reason. See Record.
  std::string skipped;
  bool failed = false;

  static Variant skip(std::string name, std::string why, bool failed);
};

struct FloorBytes {
  double fwd = 0;
  double bwd = 0;
};

struct Workload {
  std::string name;
  std::string description;  // one line, printed above the workload's table
  // Builds the variants: models, inputs, captured graphs. Not timed.
  std::function<std::vector<Variant>(const Options&)> make;
  // Optional: adds metrics that compare variants of the same run (overheads).
  std::function<void(std::vector<Record>&)> derive;
  // Memory-bound workloads: the bytes a perfect implementation must move in the forward
  // and the backward (0 = no floor), for the shapes `make` builds with these options. See
  // Note [Bandwidth floors].
  std::function<FloorBytes(const Options&)> floor_bytes = nullptr;
  // The torch.compile peer (bench/inductor_bench.py) knows this workload: its rows
  // (py_eager, inductor) join this workload's table.
  bool has_peer = false;
  // Runs with --device cuda too (Note [Benchmarks on a CUDA device]); the others are
  // CPU-only and not selected there.
  bool cuda = false;
};

class Registry {
 public:
  void add(Workload w);
  const std::vector<Workload>& workloads() const { return workloads_; }

 private:
  std::vector<Workload> workloads_;
};

// Runs every workload matching options.filter; prints each workload's table to `out` as
// soon as it is done. Returns every record, workload by workload (and, first, the
// bandwidth record when a selected workload has a floor).
std::vector<Record> run_all(const Registry& registry, const Options& options, std::ostream& out);

void print_table(std::ostream& out, const Workload& w, const std::vector<Record>& records,
                 const Options& options);
void write_json(const std::string& path, const std::vector<Record>& records);

// --- bandwidth floors ----------------------------------------------------------------
// Note [Bandwidth floors]
// A memory-bound workload declares the bytes a perfect implementation must move
// (Workload::floor_bytes: every input read once, every output and
// saved tensor written once, nothing else). The harness measures the machine's memory
// bandwidth once per run (measure_bandwidth: STREAM-style copy and triad over three
// arrays much larger than the last-level cache, at::parallel_for over the current
// intra-op threads, the best of several passes as STREAM reports), and gives every record
// of such a workload
//   floor_fwd_us = floor_fwd_bytes / triad bandwidth,   fwd_x_floor = fwd_us / floor_fwd_us
//   floor_bwd_us = floor_bwd_bytes / triad bandwidth,   bwd_x_floor = bwd_us / floor_bwd_us
// STREAM counts bytes as the program sees them: copy moves 2 x 4 bytes per element, triad
// (a = b + s * c) 3 x 4 (not the write-allocate read of the written line).
struct Bandwidth {
  double copy_gbs = 0;   // 1e9 bytes per second
  double triad_gbs = 0;
  int64_t array_bytes = 0;
  int threads = 0;
  int passes = 0;
};
Bandwidth measure_bandwidth(int64_t array_bytes, int passes);
// The same two figures on a device ("cuda"): copy is dst.copy_(src), triad
// at::add_out(a, b, c, s), on arrays of array_bytes, best of `passes`, synchronised.
Bandwidth measure_device_bandwidth(const std::string& device, int64_t array_bytes, int passes);

// --- the torch.compile peer ---------------------------------------------------------------
// Note [The torch.compile peer]
// bench/inductor_bench.py builds the same workloads in Python (same shapes, losses, dtype,
// thread count) and times `py_eager` and `inductor` (torch.compile, default mode) with
// this harness's method. run_all starts it once, as a server (`--serve`), and each
// workload's rounds alternate between the two processes: round r runs every C++ variant,
// then asks the peer for its round r (py_eager, inductor) and waits for it, so a slow
// phase of the machine hits both languages alike and only one process computes at a
// time. Its rows are merged into each workload's table: `x_eager` / `bwd_x_eager` of
// those rows are against the C++ `eager` row of the same run, `x_py_eager` /
// `bwd_x_py_eager` against `py_eager`; the C++ rows get `x_inductor` / `bwd_x_inductor` /
// `step_x_inductor` (forward + backward), the median over rounds of the ratio to the
// inductor round next to it. Any failure (no
// python with the same torch, torch.compile unable to build its kernels, the peer dying)
// becomes a skipped row with the reason; never an abort.
//
// The python: options.python, else $TCAP_PYTHON, else the python of the venv whose torch
// this binary links (tcap's bootstrap installs the pinned wheel there), else
// ${TCAP_CACHE_DIR:-~/.cache/tcap}/venv/bin/python3, else /opt/torch/.venv/bin/python3;
// the first that imports a torch of LibTorch's version. Returns "" and says why in `why`.
std::string find_peer_python(const Options& options, std::string& why);

// The running peer (bench/inductor_bench.py --serve), one workload at a time: setup, then
// one round() per harness round, then finish() for its rows. A peer that fails says why
// in its rows; after a failure the calls do nothing.
class Peer {
 public:
  // Starts the peer. One that cannot start is a failed peer: its rows say why.
  static std::unique_ptr<Peer> start(const Options& options, std::ostream& log);
  ~Peer();  // closes its input and waits for it
  Peer(const Peer&) = delete;
  Peer& operator=(const Peer&) = delete;

  void setup(const std::string& workload);  // builds, compiles, checks, warms up
  void round();                             // one timed round of each of its variants
  std::vector<Record> finish();             // this workload's rows

  const std::vector<std::string>& variants() const { return variants_; }

 private:
  Peer() = default;
  // Writes one JSON line and reads one back; "" once the peer has failed (error_ says why).
  std::string request(const std::string& line);
  int pid_ = -1;
  std::FILE* to_ = nullptr;
  std::FILE* from_ = nullptr;
  std::string log_path_;
  std::vector<std::string> variants_;
  std::string workload_;
  std::string error_;  // why the current workload's rows are skipped
};

// --- counting CPU bytes (peak_bytes, saved_bytes) ---------------------------------------
// Note [Counting CPU bytes]
// Memory metrics come from a c10::Allocator that wraps LibTorch's CPU allocator, installed
// once at start (install_cpu_byte_counter(), before any workload runs). Its DataPtrs are the
// wrapped allocator's own (data pointer as context), with a deleter of ours that frees
// through the wrapped one; so raw_allocate() / raw_deallocate() keep working (ATen's GELU
// kernel, among others, takes scratch memory that way). It counts only while a
// CpuByteCounter is alive: a counted allocation is entered in a table (pointer -> size),
// and its free is counted whenever it happens, counter alive or not. Timed rounds pay one
// virtual call and one atomic load per allocation, and one atomic load of a per-hash
// count per free (a locked look-up only if a counted allocation shares the hash).
// Frees of blocks that were allocated while not counting are not seen: a measurement
// should first run one priming iteration under the counter, so that what the measured
// iteration frees was counted when it was allocated. Bytes are the sizes asked of the
// allocator (nbytes), not what malloc rounds them to; CPU tensor storages and raw
// allocations through the CPU allocator are seen, not other malloc calls (oneDNN's own).
// tcap's CPU buffer pool (Note [CPU buffer pool]), installed at the first compiled replay,
// wraps this allocator: its blocks are counted from the moment the pool takes them until
// it frees them, cached or in use, as memory the process holds.
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
  // The counted allocations alive now: data pointer -> bytes.
  std::unordered_map<const void*, int64_t> live() const;
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

// The counters of a front door (tcap::CompileStats, one type for tcap::compile,
// compile_step and compiled autograd), kept by its entry cache and counted from any
// thread: the serving loop counts calls, eager calls it decides and recompiles; the front
// door counts what only it sees (captures, compiles, replays, verified replays, backward
// fallbacks).
#pragma once

#include <tcap/compile.h>

#include <c10/util/Exception.h>

#include <atomic>
#include <cstdint>
#include <iterator>

namespace tcap::cache {

class Stats {
 public:
  // Every counter of CompileStats (lookup_us aside), checked against the struct below.
  static constexpr int CompileStats::*kFields[] = {
      &CompileStats::calls,       &CompileStats::captures,   &CompileStats::compiles,
      &CompileStats::replays,     &CompileStats::eager_calls, &CompileStats::recompiles,
      &CompileStats::backward_fallbacks, &CompileStats::verified, &CompileStats::size_checks};

  void count(int CompileStats::*field) { slot(field).fetch_add(1, std::memory_order_relaxed); }
  void add_lookup_ns(int64_t ns) { lookup_ns_.fetch_add(ns, std::memory_order_relaxed); }
  CompileStats read() const {
    CompileStats s;
    for (size_t i = 0; i < std::size(kFields); ++i) s.*kFields[i] = counts_[i].load(std::memory_order_relaxed);
    s.lookup_us = static_cast<double>(lookup_ns_.load(std::memory_order_relaxed)) / 1000.0;
    return s;
  }

 private:
  // The ints, padded to lookup_us's alignment, then lookup_us.
  static_assert(sizeof(CompileStats) ==
                    (std::size(kFields) * sizeof(int) + alignof(double) - 1) / alignof(double) * alignof(double) +
                        sizeof(double),
                "a field of CompileStats is missing from Stats::kFields");
  std::atomic<int>& slot(int CompileStats::*field) {
    size_t i = 0;
    while (i < std::size(kFields) && kFields[i] != field) ++i;
    TORCH_CHECK(i < std::size(kFields), "tcap: Stats: a field of CompileStats it does not count");
    return counts_[i];
  }
  std::atomic<int> counts_[std::size(kFields)] = {};
  std::atomic<int64_t> lookup_ns_{0};
};

}  // namespace tcap::cache

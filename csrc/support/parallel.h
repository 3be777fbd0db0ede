// Work spread over a few threads of its own: a graph's kernels compiled at once (Note
// [Parallel kernel compilation], fuse/fusion.h).
#pragma once

#include "support/logging.h"

#include <algorithm>
#include <atomic>
#include <cstddef>
#include <thread>
#include <vector>

namespace tcap {

// Threads to compile `items` kernels on: `configured` when positive, else
// TCAP_COMPILE_THREADS (Config::compile_threads) when set, else the machine's cores, at
// most 8; never more than the items.
inline int compile_threads(size_t items, int configured = 0) {
  int n = configured > 0 ? configured : Config::get().compile_threads;
  if (n <= 0) n = static_cast<int>(std::min<unsigned>(8, std::max(1u, std::thread::hardware_concurrency())));
  return static_cast<int>(std::min<size_t>(static_cast<size_t>(n), items));
}

// Runs work(0) .. work(n - 1), each once, on `threads` threads (on the calling thread alone
// when threads <= 1); returns when all are done. `work` must not throw.
template <class Work>
void run_on_threads(size_t n, int threads, Work&& work) {
  if (threads <= 1) {
    for (size_t i = 0; i < n; ++i) work(i);
    return;
  }
  std::atomic<size_t> next{0};
  std::vector<std::thread> pool;
  pool.reserve(static_cast<size_t>(threads));
  for (int t = 0; t < threads; ++t) {
    pool.emplace_back([&] {
      for (size_t i = next.fetch_add(1); i < n; i = next.fetch_add(1)) work(i);
    });
  }
  for (auto& t : pool) t.join();
}

}  // namespace tcap

// Counting CPU bytes (Note [Counting CPU bytes] in harness.h): an allocator in front of
// LibTorch's CPU allocator that keeps the bytes in use and their peak.
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

}  // namespace tcap::bench

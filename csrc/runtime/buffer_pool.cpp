#include "runtime/buffer_pool.h"

#include "support/logging.h"

#include <c10/core/Allocator.h>
#include <c10/core/CPUAllocator.h>
#include <c10/util/Exception.h>

#include <atomic>
#include <map>
#include <mutex>
#include <unordered_map>

namespace tcap::runtime {

namespace {

thread_local int tls_depth = 0;

constexpr size_t kPage = size_t{4} << 10;
constexpr int kBucketBits = 14;

// Plain globals: `release` is a bare function pointer (Note [CPU buffer pool]).
struct Pool {
  c10::Allocator* base = nullptr;       // the allocator replaced
  c10::DeleterFnPtr base_deleter = nullptr;
  std::mutex mu;
  std::multimap<size_t, void*> cached;  // free blocks by size
  std::unordered_map<void*, size_t> live;  // pooled blocks in use -> block size
  std::atomic<uint32_t> buckets[size_t{1} << kBucketBits] = {};
  int64_t cap = 0;
  int64_t cached_bytes = 0;
  int64_t live_bytes = 0;
  int64_t hits = 0;
  int64_t misses = 0;
};

Pool* g_pool = nullptr;                   // set once, never freed
std::atomic<bool> g_installed{false};
std::once_flag g_install_once;

std::atomic<uint32_t>& bucket_of(Pool& p, const void* data) {
  const auto h = (reinterpret_cast<uintptr_t>(data) >> 6) * uint64_t{0x9E3779B97F4A7C15};
  return p.buckets[h >> (64 - kBucketBits)];
}

// The deleter of every DataPtr the pool allocator hands out, and its raw deleter.
void release(void* data) {
  Pool& p = *g_pool;
  auto& bucket = bucket_of(p, data);
  if (bucket.load(std::memory_order_acquire) > 0) {
    std::unique_lock<std::mutex> lock(p.mu);
    auto it = p.live.find(data);
    if (it != p.live.end()) {
      const size_t size = it->second;
      p.live.erase(it);
      bucket.fetch_sub(1, std::memory_order_release);
      p.live_bytes -= static_cast<int64_t>(size);
      if (p.cached_bytes + static_cast<int64_t>(size) <= p.cap) {
        p.cached.emplace(size, data);
        p.cached_bytes += static_cast<int64_t>(size);
        return;
      }
      lock.unlock();
      p.base_deleter(data);
      return;
    }
  }
  p.base_deleter(data);
}

class PoolAllocator final : public c10::Allocator {
 public:
  c10::DataPtr allocate(size_t n) override {
    Pool& p = *g_pool;
    if (tls_depth == 0 || n < kMinPooledBytes) return forward(n);
    const size_t want = (n + kPage - 1) / kPage * kPage;
    std::unique_lock<std::mutex> lock(p.mu);
    auto it = p.cached.lower_bound(want);
    if (it != p.cached.end() && it->first <= want + want / 8) {
      const size_t size = it->first;
      void* data = it->second;
      p.cached.erase(it);
      p.cached_bytes -= static_cast<int64_t>(size);
      ++p.hits;
      return hand_out(p, data, size);
    }
    ++p.misses;
    lock.unlock();  // malloc (and its page faults) outside the lock
    void* data = p.base->allocate(want).release_context();
    lock.lock();
    return hand_out(p, data, want);
  }

  c10::DeleterFnPtr raw_deleter() const override { return &release; }

  void copy_data(void* dest, const void* src, std::size_t count) const override {
    default_copy_data(dest, src, count);
  }

 private:
  // Registers a pooled block as in use (p.mu held).
  static c10::DataPtr hand_out(Pool& p, void* data, size_t size) {
    p.live.emplace(data, size);
    p.live_bytes += static_cast<int64_t>(size);
    bucket_of(p, data).fetch_add(1, std::memory_order_release);
    return {data, data, &release, c10::Device(c10::kCPU)};
  }

  static c10::DataPtr forward(size_t n) {
    Pool& p = *g_pool;
    c10::DataPtr inner = p.base->allocate(n);
    const c10::Device device = inner.device();
    void* data = inner.release_context();
    return {data, data, &release, device};
  }
};

// Whether `a` hands out DataPtrs with data == context and its raw deleter.
bool simple(c10::Allocator* a, std::string* why) {
  if (!a->raw_deleter()) {
    *why = "LibTorch's CPU allocator has no raw deleter";
    return false;
  }
  c10::DataPtr probe = a->allocate(kMinPooledBytes);
  if (probe.get() != probe.get_context() || probe.get_deleter() != a->raw_deleter()) {
    *why = "LibTorch's CPU allocator hands out DataPtrs with a context of their own";
    return false;
  }
  return true;
}

void install() {
  const long long mb = Config::get().buffer_pool_mb;
  if (mb <= 0) {
    TCAP_LOG(Perf, "CPU buffer pool off (TCAP_BUFFER_POOL_MB=0)");
    return;
  }
  c10::Allocator* base = c10::GetCPUAllocator();
  std::string why;
  if (!simple(base, &why)) {
    TCAP_LOG(Perf, "CPU buffer pool not installed: " << why);
    return;
  }
  auto* pool = new Pool();
  pool->base = base;
  pool->base_deleter = base->raw_deleter();
  pool->cap = static_cast<int64_t>(mb) << 20;
  g_pool = pool;
  static auto* allocator = new PoolAllocator();  // never freed: tensors may outlive main()
  c10::SetCPUAllocator(allocator, /*priority=*/1);
  if (c10::GetCPUAllocator() != allocator) {
    TCAP_LOG(Perf, "CPU buffer pool not installed: a CPU allocator of higher priority is set");
    return;
  }
  g_installed.store(true);
  TCAP_LOG(Perf, "CPU buffer pool installed (cap " << mb << " MB)");
}

}  // namespace

PoolScope::PoolScope() {
  std::call_once(g_install_once, install);
  ++tls_depth;
}

PoolScope::~PoolScope() { --tls_depth; }

int64_t set_buffer_pool_cap_for_testing(int64_t bytes) {
  std::call_once(g_install_once, install);
  if (!g_pool) return 0;
  std::lock_guard<std::mutex> lock(g_pool->mu);
  const int64_t old = g_pool->cap;
  g_pool->cap = bytes;
  return old;
}

}  // namespace tcap::runtime

namespace tcap {

BufferPoolStats buffer_pool_stats() {
  BufferPoolStats s;
  runtime::Pool* p = runtime::g_pool;
  if (!runtime::g_installed.load() || !p) return s;
  std::lock_guard<std::mutex> lock(p->mu);
  s.enabled = true;
  s.hits = p->hits;
  s.misses = p->misses;
  s.cached_bytes = p->cached_bytes;
  s.cached_blocks = static_cast<int64_t>(p->cached.size());
  s.live_bytes = p->live_bytes;
  s.cap_bytes = p->cap;
  return s;
}

void empty_buffer_pool() {
  runtime::Pool* p = runtime::g_pool;
  if (!p) return;
  std::multimap<size_t, void*> blocks;
  {
    std::lock_guard<std::mutex> lock(p->mu);
    blocks.swap(p->cached);
    p->cached_bytes = 0;
  }
  for (const auto& [size, data] : blocks) p->base_deleter(data);
}

}  // namespace tcap

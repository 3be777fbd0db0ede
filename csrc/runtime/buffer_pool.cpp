#include "runtime/pool_internal.h"

#include "support/logging.h"

#include <c10/core/Allocator.h>
#include <c10/core/CPUAllocator.h>
#include <c10/util/Exception.h>

#include <algorithm>
#include <atomic>
#include <mutex>
#include <set>
#include <unordered_map>
#include <vector>

namespace tcap::runtime {
namespace pool {

std::atomic<Pool*> g_pool{nullptr};
std::atomic<bool> g_installed{false};

namespace {

thread_local int tls_depth = 0;
thread_local MemoryPlan::Impl* tls_plan = nullptr;
std::once_flag g_install_once;

// Merges piece `upper` into its lower neighbour `lower` (neither in p.cached).
void absorb(Block* lower, Block* upper) {
  lower->size += upper->size;
  lower->next = upper->next;
  if (lower->next) lower->next->prev = lower;
  delete upper;
}

// Merges free piece `b` (not in p.cached) with its free neighbours; returns the result,
// which is not in p.cached either (p.mu held).
Block* coalesce(Pool& p, Block* b) {
  if (Block* n = b->next; n && n->free) {
    p.cached.erase(n);
    absorb(b, n);
  }
  if (Block* q = b->prev; q && q->free) {
    p.cached.erase(q);
    absorb(q, b);
    b = q;
  }
  return b;
}

// The arena holding `data`, or null (p.mu held).
Arena* arena_of(Pool& p, const void* data) {
  const char* c = static_cast<const char*>(data);
  auto it = std::upper_bound(p.arenas.begin(), p.arenas.end(), c,
                             [](const char* x, const Arena* a) { return x < a->base; });
  if (it == p.arenas.begin()) return nullptr;
  Arena* a = *(it - 1);
  return c < a->base + a->layout->bytes ? a : nullptr;
}

}  // namespace

void unregister(Pool& p, Arena* a) {
  p.arenas.erase(std::find(p.arenas.begin(), p.arenas.end(), a));
}

namespace {

// Frees a detached arena once nothing holds it any more: its block goes back to the pool
// (lent) or to the replaced allocator (p.mu held by `lock`, released here when it frees).
void free_if_done(Pool& p, Arena* a, std::unique_lock<std::mutex>& lock) {
  if (!a->detached || a->live_count > 0) return;
  char* base = a->base;
  const bool lent = a->lent;
  if (base != nullptr) unregister(p, a);
  delete a;
  if (base == nullptr) return;
  lock.unlock();
  if (lent) {
    release(base);
  } else {
    p.base_deleter(base);
  }
}

}  // namespace

void retire(Pool& p, Arena* a, std::unique_lock<std::mutex>& lock) {
  a->detached = true;
  free_if_done(p, a, lock);
  if (!lock.owns_lock()) lock.lock();
}

void release(void* data) {
  Pool& p = pool();
  const bool recording = p.recording_count.load(std::memory_order_acquire) > 0;
  if (recording) {
    std::lock_guard<std::mutex> lock(p.mu);
    for (Recording* r : p.recordings) {  // Note [Memory plans]: a recorded allocation dies
      auto rit = r->live.find(data);
      if (rit == r->live.end()) continue;
      r->allocs[rit->second].freed = r->clock++;
      r->live.erase(rit);
      break;
    }
  }
  if (p.small.holds(data)) {
    p.small.give_back(data);
    return;
  }
  auto& bucket = bucket_of(p, data);
  if (bucket.load(std::memory_order_acquire) > 0) {
    std::unique_lock<std::mutex> lock(p.mu);
    if (Arena* a = p.arenas.empty() ? nullptr : arena_of(p, data)) {
      const size_t offset = static_cast<size_t>(static_cast<char*>(data) - a->base);
      auto at = a->at_or_above(offset);
      TORCH_INTERNAL_ASSERT(at != a->live.end() && at->offset == offset,
                            "tcap buffer pool: a free inside a memory plan's arena matches no live piece");
      a->live.erase(at);
      a->live_count.fetch_sub(1, std::memory_order_release);
      bucket.fetch_sub(1, std::memory_order_release);
      free_if_done(p, a, lock);
      return;
    }
    auto it = p.live.find(data);
    if (it != p.live.end()) {
      Block* b = it->second;
      p.live.erase(it);
      bucket.fetch_sub(1, std::memory_order_release);
      p.live_bytes -= static_cast<int64_t>(b->size);
      p.cached_bytes += static_cast<int64_t>(b->size);
      b->free = true;
      b = coalesce(p, b);
      // Over the cap, a segment that is wholly free goes back; a piece of a segment still
      // partly in use stays until its neighbours are freed too.
      if (p.cached_bytes > p.cap && b->whole_segment()) {
        p.cached_bytes -= static_cast<int64_t>(b->size);
        void* segment = b->ptr;
        delete b;
        lock.unlock();
        p.base_deleter(segment);
        return;
      }
      p.cached.insert(b);
      return;
    }
  }
  p.base_deleter(data);
}

namespace {

class PoolAllocator final : public c10::Allocator {
 public:
  c10::DataPtr allocate(size_t n) override {
    if (tls_plan != nullptr && tls_depth > 0 && n > 0) return planned(*tls_plan, n);
    return pooled_block(n);
  }

  c10::DeleterFnPtr raw_deleter() const override { return &release; }

  void copy_data(void* dest, const void* src, std::size_t count) const override {
    default_copy_data(dest, src, count);
  }

  // A pooled block inside a PoolScope of this thread, else the replaced allocator's.
  static c10::DataPtr pooled_block(size_t n) {
    Pool& p = pool();
    if (tls_depth == 0 || n == 0) return forward(n);
    if (n < kMinPooledBytes) {
      if (void* d = p.small.take(n)) return {d, d, &release, c10::Device(c10::kCPU)};
      return forward(n);
    }
    const size_t want = (n + kPage - 1) / kPage * kPage;
    std::unique_lock<std::mutex> lock(p.mu);
    Block key;
    key.size = want;
    auto it = p.cached.lower_bound(&key);
    if (it != p.cached.end()) {
      Block* b = *it;
      p.cached.erase(it);
      p.cached_bytes -= static_cast<int64_t>(b->size);
      if (b->size - want >= kMinPooledBytes) {
        // Split: the rest stays cached, a free piece of the same segment.
        auto* rest = new Block{b->ptr + want, b->size - want, b, b->next, true};
        if (rest->next) rest->next->prev = rest;
        b->next = rest;
        b->size = want;
        p.cached.insert(rest);
        p.cached_bytes += static_cast<int64_t>(rest->size);
      }
      ++p.hits;
      return hand_out(p, b);
    }
    ++p.misses;
    lock.unlock();  // malloc (and its page faults) outside the lock
    void* data = p.base->allocate(want).release_context();
    auto* b = new Block{static_cast<char*>(data), want, nullptr, nullptr, false};
    lock.lock();
    return hand_out(p, b);
  }

  // Registers a piece as in use (p.mu held).
  static c10::DataPtr hand_out(Pool& p, Block* b) {
    b->free = false;
    p.live.emplace(b->ptr, b);
    p.live_bytes += static_cast<int64_t>(b->size);
    bucket_of(p, b->ptr).fetch_add(1, std::memory_order_release);
    return {b->ptr, b->ptr, &release, c10::Device(c10::kCPU)};
  }

  static c10::DataPtr forward(size_t n) {
    Pool& p = pool();
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
  auto* fresh = new Pool();
  fresh->base = base;
  fresh->base_deleter = base->raw_deleter();
  fresh->cap = static_cast<int64_t>(mb) << 20;
  fresh->small.reserve(std::min(size_t{64} << 20, static_cast<size_t>(fresh->cap)));
  g_pool.store(fresh, std::memory_order_release);
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

c10::DataPtr pooled(size_t n) { return PoolAllocator::pooled_block(n); }

void ensure_installed() { std::call_once(g_install_once, install); }

// Free pieces of segments still partly in use stay (they merge back into their segment as
// its other pieces are freed).
void free_whole_segments(Pool& p) {
  std::vector<void*> segments;
  {
    std::lock_guard<std::mutex> lock(p.mu);
    for (auto it = p.cached.begin(); it != p.cached.end();) {
      Block* b = *it;
      if (!b->whole_segment()) {
        ++it;
        continue;
      }
      it = p.cached.erase(it);
      p.cached_bytes -= static_cast<int64_t>(b->size);
      segments.push_back(b->ptr);
      delete b;
    }
  }
  for (void* data : segments) p.base_deleter(data);
}

}  // namespace pool

using namespace pool;

PoolScope::PoolScope() {
  ensure_installed();
  ++tls_depth;
}

PoolScope::PoolScope(MemoryPlan* plan) : PoolScope() {
  outer_ = tls_plan;
  MemoryPlan::Impl* m = plan ? plan->impl_.get() : nullptr;
  if (m != nullptr && !g_installed.load()) m->stats.disabled = true;
  if (m == nullptr || m->stats.disabled) {
    tls_plan = nullptr;  // a graph without a plan: its allocations are not the outer plan's
    return;
  }
  m->next = 0;
  m->runs.fetch_add(1, std::memory_order_relaxed);
  // The usual case takes no lock: the arena of the current layout, no piece of it alive
  // (only this plan's runs, serialized by their executable, hand pieces out of it).
  const Arena* a = m->arena;
  const bool ready = !m->replan && (a == nullptr ? m->layout->bytes == 0
                                                 : !a->lent && a->layout == m->layout && a->live_count.load() == 0);
  if (!ready && !start_run(*m)) {
    tls_plan = nullptr;
    return;
  }
  plan_ = m;
  tls_plan = m;
}

PoolScope::~PoolScope() {
  tls_plan = outer_;
  --tls_depth;
  if (plan_ != nullptr) finish_run(*plan_);
}

int64_t set_buffer_pool_cap_for_testing(int64_t bytes) {
  ensure_installed();
  Pool* p = g_pool.load(std::memory_order_acquire);
  if (p == nullptr) return 0;
  std::lock_guard<std::mutex> lock(p->mu);
  const int64_t old = p->cap;
  p->cap = bytes;
  return old;
}

}  // namespace tcap::runtime

namespace tcap {

BufferPoolStats buffer_pool_stats() {
  BufferPoolStats s;
  runtime::pool::Pool* p = runtime::pool::g_pool.load(std::memory_order_acquire);
  if (!runtime::pool::g_installed.load() || !p) return s;
  std::lock_guard<std::mutex> lock(p->mu);
  s.enabled = true;
  s.hits = p->hits;
  s.misses = p->misses;
  s.cached_bytes = p->cached_bytes;
  s.cached_blocks = static_cast<int64_t>(p->cached.size());
  s.live_bytes = p->live_bytes;
  s.cap_bytes = p->cap;
  std::lock_guard<std::mutex> small_lock(p->small.mu);
  s.small_served = p->small.served;
  s.small_carved_bytes = static_cast<int64_t>(p->small.carved);
  s.small_live_blocks = p->small.live_blocks();
  return s;
}

void empty_buffer_pool() {
  if (!runtime::pool::g_pool.load(std::memory_order_acquire)) return;
  runtime::pool::free_whole_segments(runtime::pool::pool());
  runtime::pool::pool().small.trim();
}

}  // namespace tcap

#include "runtime/buffer_pool.h"

#include "support/logging.h"

#include <c10/core/Allocator.h>
#include <c10/core/CPUAllocator.h>
#include <c10/util/Exception.h>

#include <atomic>
#include <mutex>
#include <set>
#include <unordered_map>
#include <vector>

namespace tcap::runtime {

namespace {

thread_local int tls_depth = 0;

constexpr size_t kPage = size_t{4} << 10;
constexpr int kBucketBits = 14;

// A piece of a segment (one block the replaced allocator handed out). Pieces of a segment
// are linked in address order; a free piece merges with free neighbours, so a segment
// whose pieces are all free is one piece again (Note [CPU buffer pool]).
struct Block {
  char* ptr = nullptr;
  size_t size = 0;
  Block* prev = nullptr;  // the piece just below in the same segment
  Block* next = nullptr;  // the piece just above
  bool free = false;
  bool whole_segment() const { return prev == nullptr && next == nullptr; }
};

struct BySize {
  bool operator()(const Block* a, const Block* b) const {
    return a->size != b->size ? a->size < b->size : a->ptr < b->ptr;
  }
};

// Plain globals: `release` is a bare function pointer (Note [CPU buffer pool]).
struct Pool {
  c10::Allocator* base = nullptr;       // the allocator replaced
  c10::DeleterFnPtr base_deleter = nullptr;
  std::mutex mu;
  std::set<Block*, BySize> cached;         // free pieces, smallest first
  std::unordered_map<void*, Block*> live;  // pieces in use, by address
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

// The deleter of every DataPtr the pool allocator hands out, and its raw deleter.
void release(void* data) {
  Pool& p = *g_pool;
  auto& bucket = bucket_of(p, data);
  if (bucket.load(std::memory_order_acquire) > 0) {
    std::unique_lock<std::mutex> lock(p.mu);
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

class PoolAllocator final : public c10::Allocator {
 public:
  c10::DataPtr allocate(size_t n) override {
    Pool& p = *g_pool;
    if (tls_depth == 0 || n < kMinPooledBytes) return forward(n);
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

  c10::DeleterFnPtr raw_deleter() const override { return &release; }

  void copy_data(void* dest, const void* src, std::size_t count) const override {
    default_copy_data(dest, src, count);
  }

 private:
  // Registers a piece as in use (p.mu held).
  static c10::DataPtr hand_out(Pool& p, Block* b) {
    b->free = false;
    p.live.emplace(b->ptr, b);
    p.live_bytes += static_cast<int64_t>(b->size);
    bucket_of(p, b->ptr).fetch_add(1, std::memory_order_release);
    return {b->ptr, b->ptr, &release, c10::Device(c10::kCPU)};
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
  // Wholly free segments go back; free pieces of segments still partly in use stay (they
  // merge back into their segment as its other pieces are freed).
  std::vector<void*> segments;
  {
    std::lock_guard<std::mutex> lock(p->mu);
    for (auto it = p->cached.begin(); it != p->cached.end();) {
      runtime::Block* b = *it;
      if (!b->whole_segment()) {
        ++it;
        continue;
      }
      it = p->cached.erase(it);
      p->cached_bytes -= static_cast<int64_t>(b->size);
      segments.push_back(b->ptr);
      delete b;
    }
  }
  for (void* data : segments) p->base_deleter(data);
}

}  // namespace tcap

#include "runtime/buffer_pool.h"

#include "support/logging.h"

#include <c10/core/Allocator.h>
#include <c10/core/CPUAllocator.h>
#include <c10/util/Exception.h>

#include <sys/mman.h>

#include <algorithm>
#include <atomic>
#include <mutex>
#include <set>
#include <unordered_map>
#include <vector>

namespace tcap::runtime {

namespace {

thread_local int tls_depth = 0;

constexpr size_t kPage = size_t{4} << 10;
constexpr size_t kCpuAlign = 64;  // c10's CPU alignment: planned slots and small blocks keep it
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

// Note [Memory plans]: where each allocation index of a run goes. Made once per
// recording, shared by the plan and the arenas made from it (immutable).
struct Layout {
  struct Slot {
    size_t offset = 0;
    size_t size = 0;       // rounded up to kCpuAlign
    bool planned = false;  // false: it escaped when recorded (an output, a saved tensor)
  };
  std::vector<Slot> slots;  // by allocation index within a run
  int64_t planned = 0;
  size_t bytes = 0;
};

// The bytes a layout's pieces are handed out of.
struct Arena {
  struct Piece {
    size_t offset = 0;
    size_t end = 0;
  };
  char* base = nullptr;  // null while a lent arena is idle
  // Lent: the bytes are a pool block, taken at the start of each run and given back at its
  // end (an arena of kMinPooledBytes or more); else its own block, held for good.
  bool lent = false;
  std::shared_ptr<const Layout> layout;
  std::vector<Piece> live;  // pieces in use, by offset (they never overlap); p.mu guards it
  std::atomic<int64_t> live_count{0};  // live.size(), read without the lock
  bool detached = false;  // its plan has moved on (or died): freed when live_count is 0

  // The first live piece at or above `offset`.
  std::vector<Piece>::iterator at_or_above(size_t offset) {
    return std::lower_bound(live.begin(), live.end(), offset, [](const Piece& q, size_t o) { return q.offset < o; });
  }
  // Whether [offset, end) is free of live pieces.
  bool free(size_t offset, size_t end) {
    auto it = at_or_above(offset);
    if (it != live.end() && it->offset < end) return false;
    return it == live.begin() || (it - 1)->end <= offset;
  }
};

// A recording run's allocations (p.mu guards it: frees may come from any thread).
struct Recording {
  struct Alloc {
    size_t size = 0;
    int64_t made = 0;
    int64_t freed = -1;  // -1: still alive
  };
  std::vector<Alloc> allocs;
  std::unordered_map<const void*, size_t> live;  // data -> index into allocs
  int64_t clock = 0;
};

// Note [Small blocks]
// Why: with a memory plan, a small model's steady-state run allocates only what escapes it
// (outputs, tensors saved for the backward, gradients), a few bytes to a few KiB each. The
// replaced allocator serves those with posix_memalign and free: about 0.1 us a pair here,
// 0.6 us of mlp_small's 19 us forward + backward, more than the kernels that fill them.
// How: inside a PoolScope, a request under kMinPooledBytes is served by a size class (a
// power of two from 64 bytes, c10's alignment, to 64 KiB). Each class has a stack of free
// blocks; an empty stack is refilled by cutting a span (256 KiB) of one address range
// reserved at install into blocks of that class, so a span holds one class for good. A free
// pushes the block back on its class's stack. `release` tells a small block by its address
// (one compare against the range), so the free of any other block pays nothing for it. The
// stacks are vectors beside the blocks, not lists inside them: empty_buffer_pool() hands the
// pages of spans with no block in use back to the system (madvise), and their blocks stay on
// the stacks, served again (on fresh zero pages) when asked for. When the range is used up,
// small requests go to the replaced allocator as before (logged once). The range is
// min(64 MiB, the pool's cap), reserved without being committed: the memory it holds is the
// most small blocks alive at once, rounded up to their classes and spans.
struct SmallBlocks {
  static constexpr int kMinShift = 6;  // 64 bytes, kCpuAlign
  static constexpr int kClasses = 11;  // 64 bytes .. 64 KiB
  static constexpr size_t kSpan = size_t{256} << 10;
  static_assert((size_t{1} << kMinShift) == kCpuAlign, "the smallest class keeps c10's alignment");
  static_assert((size_t{1} << (kMinShift + kClasses - 1)) == kMinPooledBytes, "classes end at the pool's minimum");

  char* base = nullptr;  // the reserved range; null when the reservation failed (then unused)
  size_t range = 0;
  std::mutex mu;
  size_t carved = 0;  // bytes of the range cut into spans so far
  bool full_logged = false;
  std::vector<void*> free[kClasses];
  std::vector<int32_t> span_live;  // blocks in use, by span
  std::vector<uint8_t> span_class;
  int64_t served = 0;

  static int class_of(size_t n) {
    return n <= (size_t{1} << kMinShift) ? 0 : 64 - __builtin_clzll(n - 1) - kMinShift;
  }
  bool holds(const void* d) const {
    const char* c = static_cast<const char*>(d);
    return c >= base && c < base + range;
  }
  size_t span_of(const void* d) const { return static_cast<size_t>(static_cast<const char*>(d) - base) / kSpan; }

  void reserve(size_t bytes) {
    range = bytes / kSpan * kSpan;
    if (range == 0) return;
    void* r = mmap(nullptr, range, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0);
    if (r == MAP_FAILED) {
      TCAP_LOG(Perf, "CPU buffer pool: no range for small blocks (mmap failed); they come from malloc");
      range = 0;
      return;
    }
    base = static_cast<char*>(r);
    span_live.assign(range / kSpan, 0);
    span_class.assign(range / kSpan, 0);
  }

  // A free block of n bytes' class, or null when the range is used up.
  void* take(size_t n) {
    const int c = class_of(n);
    std::lock_guard<std::mutex> lock(mu);
    auto& stack = free[c];
    if (stack.empty() && !carve(c)) return nullptr;
    void* d = stack.back();
    stack.pop_back();
    ++span_live[span_of(d)];
    ++served;
    return d;
  }

  void give_back(void* d) {
    std::lock_guard<std::mutex> lock(mu);
    const size_t s = span_of(d);
    --span_live[s];
    free[span_class[s]].push_back(d);
  }

  // Cuts the next span into blocks of class c (mu held).
  bool carve(int c) {
    if (carved + kSpan > range) {
      if (!full_logged && base != nullptr) {
        full_logged = true;
        TCAP_LOG(Perf, "CPU buffer pool: the " << (range >> 20)
                                               << " MiB range for small blocks is used up; more come from malloc");
      }
      return false;
    }
    const size_t size = size_t{1} << (c + kMinShift);
    char* span = base + carved;
    span_class[carved / kSpan] = static_cast<uint8_t>(c);
    carved += kSpan;
    auto& stack = free[c];
    stack.reserve(stack.size() + kSpan / size);
    for (size_t off = kSpan; off >= size; off -= size) stack.push_back(span + off - size);  // lowest first out
    return true;
  }

  // Gives the pages of spans with no block in use back to the system.
  void trim() {
    std::lock_guard<std::mutex> lock(mu);
    for (size_t s = 0; s < carved / kSpan; ++s) {
      if (span_live[s] == 0) madvise(base + s * kSpan, kSpan, MADV_DONTNEED);
    }
  }

  // Blocks in use (mu held).
  int64_t live_blocks() const {
    int64_t n = 0;
    for (size_t s = 0; s < carved / kSpan; ++s) n += span_live[s];
    return n;
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
  std::vector<Arena*> arenas;           // by base address (Note [Memory plans])
  std::vector<Recording*> recordings;   // recording runs in progress
  std::atomic<int> recording_count{0};  // recordings.size(), read without the lock
  MemoryPlanStats totals;               // every plan's counts added up
  SmallBlocks small;                    // Note [Small blocks]
};

// Set once, never freed. Atomic: a thread reaches the pool through LibTorch's allocator
// table, which is not synchronized, so the pool's fields are published by this pointer
// (its store releases them, every load acquires them).
std::atomic<Pool*> g_pool{nullptr};

Pool& pool() { return *g_pool.load(std::memory_order_acquire); }
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

// The arena holding `data`, or null (p.mu held).
Arena* arena_of(Pool& p, const void* data) {
  const char* c = static_cast<const char*>(data);
  auto it = std::upper_bound(p.arenas.begin(), p.arenas.end(), c,
                             [](const char* x, const Arena* a) { return x < a->base; });
  if (it == p.arenas.begin()) return nullptr;
  Arena* a = *(it - 1);
  return c < a->base + a->layout->bytes ? a : nullptr;
}

void unregister(Pool& p, Arena* a) {
  p.arenas.erase(std::find(p.arenas.begin(), p.arenas.end(), a));
}

void release(void* data);

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

// Detaches an arena its plan no longer uses; freed now if no piece of it lives, else by
// the free of its last piece (`lock` holds p.mu; held again on return).
void retire(Pool& p, Arena* a, std::unique_lock<std::mutex>& lock) {
  a->detached = true;
  free_if_done(p, a, lock);
  if (!lock.owns_lock()) lock.lock();
}

// The deleter of every DataPtr the pool allocator hands out, and its raw deleter.
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

thread_local MemoryPlan::Impl* tls_plan = nullptr;

class PoolAllocator final : public c10::Allocator {
 public:
  c10::DataPtr allocate(size_t n) override {
    if (tls_plan != nullptr && tls_depth > 0 && n > 0) return planned(*tls_plan, n);
    return pooled(n);
  }

  c10::DeleterFnPtr raw_deleter() const override { return &release; }

  void copy_data(void* dest, const void* src, std::size_t count) const override {
    default_copy_data(dest, src, count);
  }

 private:
  // Note [Memory plans]: allocation number `next` of a run under a plan.
  static c10::DataPtr planned(MemoryPlan::Impl& m, size_t n);

 public:
  // A pooled block inside a PoolScope of this thread, else the replaced allocator's.
  static c10::DataPtr pooled(size_t n) {
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

// Note [Memory plans]
struct MemoryPlan::Impl {
  std::string name;
  std::shared_ptr<const Layout> layout;  // null until the first recording ends
  Arena* arena = nullptr;                // the arena this plan's runs use
  std::unique_ptr<Recording> recording;  // while a recording run is on
  bool replan = true;                    // the next run records
  size_t next = 0;                       // allocation index within the current run
  std::atomic<int64_t> runs{0};
  MemoryPlanStats stats;                 // the rest of the counts (p.mu guards them)
};

namespace {

// Offsets for the allocations a recording saw freed, greedy by size (largest first, each at
// the lowest offset where no allocation alive at the same time already lies), as
// Inductor's and Static Runtime's planners do.
std::shared_ptr<const Layout> lay_out(const Recording& r) {
  auto layout = std::make_shared<Layout>();
  auto& slots = layout->slots;
  slots.resize(r.allocs.size());
  std::vector<int32_t> order;
  for (size_t k = 0; k < r.allocs.size(); ++k) {
    slots[k].size = (r.allocs[k].size + kCpuAlign - 1) / kCpuAlign * kCpuAlign;
    if (r.allocs[k].freed >= 0) order.push_back(static_cast<int32_t>(k));
  }
  std::stable_sort(order.begin(), order.end(), [&](int32_t a, int32_t b) { return slots[a].size > slots[b].size; });
  auto alive_together = [&](int32_t a, int32_t b) {
    const auto& x = r.allocs[static_cast<size_t>(a)];
    const auto& y = r.allocs[static_cast<size_t>(b)];
    return x.made < y.freed && y.made < x.freed;
  };
  std::vector<int32_t> placed;
  std::vector<std::pair<size_t, size_t>> busy;  // (offset, end) of placed ones alive together
  for (int32_t k : order) {
    busy.clear();
    for (int32_t j : placed) {
      if (alive_together(k, j)) busy.emplace_back(slots[j].offset, slots[j].offset + slots[j].size);
    }
    std::sort(busy.begin(), busy.end());
    size_t at = 0;
    for (const auto& [lo, hi] : busy) {
      if (at + slots[k].size <= lo) break;
      at = std::max(at, hi);
    }
    slots[k].offset = at;
    slots[k].planned = true;
    layout->bytes = std::max(layout->bytes, at + slots[k].size);
    placed.push_back(k);
  }
  layout->planned = static_cast<int64_t>(placed.size());
  return layout;
}

c10::DataPtr PoolAllocator::planned(MemoryPlan::Impl& m, size_t n) {
  Pool& p = pool();
  const size_t k = m.next++;
  if (m.recording) {
    c10::DataPtr d = pooled(n);
    std::lock_guard<std::mutex> lock(p.mu);
    Recording& r = *m.recording;
    r.live[d.get()] = r.allocs.size();  // == k
    r.allocs.push_back({n, r.clock++, -1});
    return d;
  }
  if (m.arena != nullptr) {
    std::unique_lock<std::mutex> lock(p.mu);
    Arena& a = *m.arena;
    const Layout& layout = *a.layout;
    if (k >= layout.slots.size()) {
      m.replan = true;  // more allocations than recorded
    } else if (const auto& slot = layout.slots[k]; slot.planned) {
      // Its bytes are free unless a piece lives longer than when recorded.
      if (n <= slot.size && a.free(slot.offset, slot.offset + slot.size)) {
        a.live.insert(a.at_or_above(slot.offset), Arena::Piece{slot.offset, slot.offset + slot.size});
        a.live_count.fetch_add(1, std::memory_order_release);
        ++m.stats.served;
        ++p.totals.served;
        char* data = a.base + slot.offset;
        bucket_of(p, data).fetch_add(1, std::memory_order_release);
        return {data, data, &release, c10::Device(c10::kCPU)};
      }
      ++m.stats.missed;
      ++p.totals.missed;
      m.replan = true;  // larger than recorded, or its bytes still in use
    }
  }
  return pooled(n);
}

// Gives the wholly free segments back to the replaced allocator; free pieces of segments
// still partly in use stay (they merge back into their segment as its other pieces are
// freed). Takes p.mu.
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

void register_arena(Pool& p, Arena* a) {
  p.arenas.insert(std::upper_bound(p.arenas.begin(), p.arenas.end(), a,
                                   [](const Arena* x, const Arena* y) { return x->base < y->base; }),
                  a);
}

// Makes the arena of m's layout (`lock` holds p.mu; released while an allocator runs). A
// small one gets its own block for good; a large one is lent a pool block per run (borrow).
void make_arena(Pool& p, MemoryPlan::Impl& m, std::unique_lock<std::mutex>& lock) {
  auto* a = new Arena();
  a->layout = m.layout;
  a->lent = m.layout->bytes >= kMinPooledBytes;
  m.arena = a;
  ++m.stats.arenas_made;
  ++p.totals.arenas_made;
  if (a->lent) return;
  lock.unlock();
  char* base = static_cast<char*>(p.base->allocate(a->layout->bytes).release_context());
  lock.lock();
  a->base = base;
  register_arena(p, a);
}

// Takes a lent arena's block from the pool for one run (`lock` holds p.mu; released while
// the pool serves it). In steady state that is a hit on the block the last run gave back.
void borrow(Pool& p, Arena& a, std::unique_lock<std::mutex>& lock) {
  lock.unlock();
  char* base = static_cast<char*>(PoolAllocator::pooled(a.layout->bytes).release_context());
  lock.lock();
  a.base = base;
  register_arena(p, &a);
}

}  // namespace

MemoryPlan::MemoryPlan(std::string name) : impl_(std::make_unique<Impl>()) {
  impl_->name = std::move(name);
  impl_->stats.disabled = !Config::get().memory_plans;
}

MemoryPlan::~MemoryPlan() {
  Pool* p = g_pool.load(std::memory_order_acquire);
  if (p == nullptr || impl_->arena == nullptr) return;
  std::unique_lock<std::mutex> lock(p->mu);
  retire(*p, impl_->arena, lock);
}

MemoryPlanStats MemoryPlan::stats() const {
  MemoryPlanStats s;
  if (Pool* p = g_pool.load(std::memory_order_acquire); p == nullptr) {
    s = impl_->stats;
  } else {
    std::lock_guard<std::mutex> lock(p->mu);
    s = impl_->stats;
  }
  s.runs = impl_->runs.load(std::memory_order_relaxed);
  return s;
}

MemoryPlanStats memory_plan_totals() {
  std::call_once(g_install_once, install);
  Pool* p = g_pool.load(std::memory_order_acquire);
  if (p == nullptr) return {};
  std::lock_guard<std::mutex> lock(p->mu);
  return p->totals;
}

PoolScope::PoolScope() {
  std::call_once(g_install_once, install);
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

// A run that records, or that needs a fresh arena, or a plan that gives up; false when it
// gave up (Note [Memory plans]).
bool PoolScope::start_run(MemoryPlan::Impl& m) {
  Pool& p = pool();
  std::unique_lock<std::mutex> lock(p.mu);
  auto drop_arena = [&] {
    if (Arena* old = m.arena) {
      m.arena = nullptr;
      retire(p, old, lock);
    }
  };
  if (m.replan && m.stats.recordings >= MemoryPlan::kMaxRecordings) {
    m.stats.disabled = true;
    drop_arena();
    lock.unlock();
    TCAP_LOG(Perf, "memory plan of " << m.name << ": off after " << m.stats.recordings
                                     << " recordings (its allocations keep changing); the pool serves them");
    return false;
  }
  if (m.replan) {
    m.recording = std::make_unique<Recording>();
    p.recordings.push_back(m.recording.get());
    p.recording_count.fetch_add(1, std::memory_order_release);
    ++m.stats.recordings;
    ++p.totals.recordings;
    return true;
  }
  // A fresh arena for the first planned run, a new layout, or when a piece of the old
  // arena is still alive (it escaped its run).
  if (m.arena && (m.arena->live_count.load() > 0 || m.arena->layout != m.layout)) drop_arena();
  if (m.arena == nullptr && m.layout->bytes > 0) make_arena(p, m, lock);
  if (m.arena != nullptr && m.arena->lent) borrow(p, *m.arena, lock);
  return true;
}

PoolScope::~PoolScope() {
  tls_plan = outer_;
  --tls_depth;
  MemoryPlan::Impl* m = plan_;
  if (m == nullptr) return;
  Arena* a = m->arena;
  const bool give_back = a != nullptr && a->lent && a->base != nullptr;
  if (!m->recording && !give_back && (a == nullptr || a->live_count.load() == 0)) return;
  Pool& p = pool();
  std::string line;
  const bool recorded = m->recording != nullptr;
  char* block = nullptr;
  {
    std::lock_guard<std::mutex> lock(p.mu);
    if (recorded) {
      Recording* r = m->recording.get();
      p.recordings.erase(std::find(p.recordings.begin(), p.recordings.end(), r));
      p.recording_count.fetch_sub(1, std::memory_order_release);
      m->layout = lay_out(*r);
      m->replan = false;
      m->stats.planned = m->layout->planned;
      m->stats.escaping = static_cast<int64_t>(r->allocs.size()) - m->stats.planned;
      m->stats.arena_bytes = static_cast<int64_t>(m->layout->bytes);
      m->recording.reset();
      if (log_enabled(LogChannel::Perf)) {
        line = "memory plan of " + m->name + ": " + std::to_string(m->stats.planned) + " allocations in a " +
               std::to_string(m->layout->bytes) + "-byte arena, " + std::to_string(m->stats.escaping) +
               " escape the run (recording " + std::to_string(m->stats.recordings) + ")";
      }
    } else if (a != nullptr && a->live_count.load() > 0) {
      m->replan = true;  // a planned allocation outlived the run: record again
    } else if (give_back) {
      unregister(p, a);  // before the pool sees its block again
      block = a->base;
      a->base = nullptr;
    }
  }
  if (block != nullptr) release(block);
  if (!line.empty()) TCAP_LOG(Perf, line);
  // The pool cached the blocks of the recorded intermediates; the arena takes their place
  // from the next run on, so they go back rather than sit beside it.
  if (recorded) free_whole_segments(p);
}

int64_t set_buffer_pool_cap_for_testing(int64_t bytes) {
  std::call_once(g_install_once, install);
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
  runtime::Pool* p = runtime::g_pool.load(std::memory_order_acquire);
  if (!runtime::g_installed.load() || !p) return s;
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
  if (!runtime::g_pool.load(std::memory_order_acquire)) return;
  runtime::free_whole_segments(runtime::pool());
  runtime::pool().small.trim();
}

}  // namespace tcap

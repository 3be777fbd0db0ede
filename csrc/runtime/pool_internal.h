// The CPU buffer pool's internals, shared by its three parts: the pool of blocks and its
// allocator (buffer_pool.cpp, Note [CPU buffer pool] in buffer_pool.h), the size classes
// of small blocks (small_blocks.cpp, Note [Small blocks]) and memory plans with their
// arenas (memory_plan.cpp, Note [Memory plans] in buffer_pool.h). Nothing outside
// runtime/ includes it.
#pragma once

#include "runtime/buffer_pool.h"

#include <c10/core/Allocator.h>

#include <atomic>
#include <cstdint>
#include <memory>
#include <mutex>
#include <set>
#include <string>
#include <unordered_map>
#include <vector>

namespace tcap::runtime {
namespace pool {

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

  // Reserves the range (not committed).
  void reserve(size_t bytes);
  // A free block of n bytes' class, or null when the range is used up.
  void* take(size_t n);
  void give_back(void* d);
  // Cuts the next span into blocks of class c (mu held).
  bool carve(int c);
  // Gives the pages of spans with no block in use back to the system.
  void trim();
  // Blocks in use (mu held).
  int64_t live_blocks() const;
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
extern std::atomic<Pool*> g_pool;
inline Pool& pool() { return *g_pool.load(std::memory_order_acquire); }
// Whether the pool is LibTorch's CPU allocator.
extern std::atomic<bool> g_installed;
// Installs the pool once (unless TCAP_BUFFER_POOL_MB=0 or the allocator does not allow it).
void ensure_installed();

inline std::atomic<uint32_t>& bucket_of(Pool& p, const void* data) {
  const auto h = (reinterpret_cast<uintptr_t>(data) >> 6) * uint64_t{0x9E3779B97F4A7C15};
  return p.buckets[h >> (64 - kBucketBits)];
}

// The pool (buffer_pool.cpp).
// The deleter of every DataPtr the pool allocator hands out, and its raw deleter.
void release(void* data);
// A pooled block inside a PoolScope of this thread, else the replaced allocator's.
c10::DataPtr pooled(size_t n);
// Removes an arena from the pool's table (p.mu held).
void unregister(Pool& p, Arena* a);
// Detaches an arena its plan no longer uses; freed now if no piece of it lives, else by
// the free of its last piece (`lock` holds p.mu; held again on return).
void retire(Pool& p, Arena* a, std::unique_lock<std::mutex>& lock);
// Gives the wholly free segments back to the replaced allocator. Takes p.mu.
void free_whole_segments(Pool& p);

// Memory plans (memory_plan.cpp).
// Allocation number `next` of a run under plan m.
c10::DataPtr planned(MemoryPlan::Impl& m, size_t n);
// The end of a run under plan m: a recording becomes a layout, a lent arena's block goes
// back to the pool.
void finish_run(MemoryPlan::Impl& m);

}  // namespace pool

// Note [Memory plans]
struct MemoryPlan::Impl {
  std::string name;
  std::shared_ptr<const pool::Layout> layout;  // null until the first recording ends
  pool::Arena* arena = nullptr;                // the arena this plan's runs use
  std::unique_ptr<pool::Recording> recording;  // while a recording run is on
  bool replan = true;                    // the next run records
  size_t next = 0;                       // allocation index within the current run
  std::atomic<int64_t> runs{0};
  MemoryPlanStats stats;                       // the rest of the counts (p.mu guards them)
};

}  // namespace tcap::runtime

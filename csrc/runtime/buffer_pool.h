// The CPU buffer pool behind include/tcap/buffer_pool.h.
//
// Note [CPU buffer pool]
// Why: on these VMs freed memory goes back to the host in 8 MiB blocks, so with stock glibc
// malloc an eager step that frees and re-allocates its large tensors page-faults them in
// again every step (docs/memory.md). mlp_big's eager backward runs 25 ms
// in a process of its own against 18 ms with tuned malloc settings. A compiled graph knows
// its allocations repeat every step, so its runtime keeps the blocks.
//
// How: a c10::Allocator installed as LibTorch's CPU allocator at the first PoolScope
// (c10::SetCPUAllocator, priority 1 so it also wraps an allocator installed at that
// priority before it, such as tcap-bench's byte counter). Outside a PoolScope it forwards
// to the allocator it replaced. Inside one, on the scope's thread, requests of at least
// kMinPooledBytes (sizes rounded up to 4 KiB) are served from cached free blocks, best
// fit, or, on a miss, by a new segment from the replaced allocator; smaller ones by size
// classes of their own (Note [Small blocks], pool_internal.h). A cached block larger
// than the request is split when the rest is at least kMinPooledBytes: the rest stays
// cached, a piece of the same segment. When a pooled tensor dies its piece returns to the
// cache and merges with free neighbours of its segment, as in PyTorch's CUDA caching
// allocator; so a segment whose pieces are all free is one block again. Over the cap
// (TCAP_BUFFER_POOL_MB), a wholly free segment is freed; empty_buffer_pool() frees every
// wholly free segment (a free piece of a segment still partly in use stays).
//
// Every DataPtr it hands out has data == context and the one deleter `release`, which is
// also its raw_deleter (c10's contract for raw_allocate, used by ideep and others).
// `release` tells small blocks by their address range, pooled blocks from forwarded ones by
// a table of live pooled pointers; a per-hash-bucket counter read without the lock lets the
// free of a forwarded block skip the table. This needs the replaced allocator to hand out simple DataPtrs (data ==
// context, its raw deleter); if it does not, the pool is not installed (logged).
//
// The pool is never uninstalled and never freed: tensors may die at static destruction.
// TensorImpls and storages are unchanged: a pooled tensor is an ordinary CPU tensor.
#pragma once

#include <tcap/buffer_pool.h>

#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>

namespace tcap::runtime {

constexpr size_t kMinPooledBytes = size_t{64} << 10;

// Note [Memory plans]
// Static memory planning per graph, as Inductor's and Static Runtime's memory planners do,
// on top of the pool. A compiled graph's executable owns a MemoryPlan and runs under a
// PoolScope of it. Its first run records, on the scope's thread, every CPU allocation in
// order (its size, when it was made and when it was freed). Those freed before the run
// ends are the graph's intermediates (an ATen op's output, scratch an op allocates, a fused
// kernel's output): at the end of the run they get offsets in one arena, packed greedily by
// size so that allocations whose lifetimes overlap never share bytes. The ones still alive
// at the end escape (outputs, tensors saved for the backward) and are never planned.
//
// Later runs hand out allocation k of the run at its offset in the arena: no allocator
// call, no search of the pool's free blocks, one DataPtr (data == context, the pool's
// deleter, so raw_allocate works as for pooled blocks; a free finds its arena by address).
// An arena under kMinPooledBytes is its own block, kept for good. A larger one is lent a
// pool block for each run and gives it back at the end of the run, so between runs its
// bytes serve other graphs (a forward's arena and its backward's are not both held for the
// whole step); in steady state taking it is a hit on the block it gave back. The pool's
// free blocks that a recording leaves behind go back to the allocator when it ends: the
// arena takes their place. Nothing depends on the prediction being right:
//   - a request that is larger than its slot, beyond the recorded count, or whose bytes a
//     still-live piece of the arena holds (a tensor that lived longer than it did when
//     recorded) is served by the pool as before, and the next run records again;
//   - a piece still alive when the run ends (it escaped this time) keeps the arena: the
//     next run records again and the run after takes a fresh arena; the old one's block is
//     freed (or given back to the pool) when its last piece dies. No piece is ever handed
//     out over a live one: every hand-out checks the arena's live pieces;
//   - smaller requests fit their slots, so an arena sized by the largest sizes seen serves
//     calls with smaller dynamic sizes without re-planning.
// A plan that has recorded kMaxRecordings times gives up (logged: its sizes keep
// changing) and its graph runs on the pool alone. TCAP_MEMORY_PLAN=0 turns plans off.
// Allocations on other threads (at::parallel_for's workers) are the pool's, as before.
struct MemoryPlanStats {
  int64_t runs = 0;           // runs under the plan
  int64_t recordings = 0;     // runs that recorded (the first, and after a miss)
  int64_t served = 0;         // allocations handed out from the arena
  int64_t missed = 0;         // allocations of a planned run served elsewhere
  int64_t planned = 0;        // planned allocations of the current layout
  int64_t escaping = 0;       // allocations of the last recording still alive at its end
  int64_t arena_bytes = 0;    // the current layout's arena
  int64_t arenas_made = 0;    // arenas allocated (one, unless a piece escaped or sizes grew)
  bool disabled = false;      // gave up, or TCAP_MEMORY_PLAN=0, or no pool
};

class MemoryPlan {
 public:
  static constexpr int kMaxRecordings = 8;
  explicit MemoryPlan(std::string name);
  ~MemoryPlan();
  MemoryPlan(const MemoryPlan&) = delete;
  MemoryPlan& operator=(const MemoryPlan&) = delete;
  MemoryPlanStats stats() const;
  struct Impl;

 private:
  friend class PoolScope;
  std::unique_ptr<Impl> impl_;
};

// Every plan's counts added up since the process started (recordings, served, missed,
// arenas_made; the rest zero), for tests and benchmarks.
MemoryPlanStats memory_plan_totals();

// Pooled allocation on this thread while alive (nests). The first one installs the pool
// unless TCAP_BUFFER_POOL_MB=0. With a plan, this thread's allocations until the scope
// ends follow it (Note [Memory plans]); a nested scope without one keeps the outer plan.
// One run at a time per plan (the executables hold a mutex around their runs).
class PoolScope {
 public:
  PoolScope();
  explicit PoolScope(MemoryPlan* plan);
  ~PoolScope();
  PoolScope(const PoolScope&) = delete;
  PoolScope& operator=(const PoolScope&) = delete;

 private:
  static bool start_run(MemoryPlan::Impl& m);
  MemoryPlan::Impl* outer_ = nullptr;
  MemoryPlan::Impl* plan_ = nullptr;
};

// Tests: sets the cap (bytes) of cached blocks; returns the previous one.
int64_t set_buffer_pool_cap_for_testing(int64_t bytes);

}  // namespace tcap::runtime

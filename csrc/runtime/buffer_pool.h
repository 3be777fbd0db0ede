// The CPU buffer pool behind include/tcap/buffer_pool.h.
//
// Note [CPU buffer pool]
// Why: on these VMs freed memory goes back to the host in 8 MiB blocks, so with stock glibc
// malloc an eager step that frees and re-allocates its large tensors page-faults them in
// again every step (shared/notes/benchmarking-here.md). mlp_big's eager backward runs 25 ms
// in a process of its own against 18 ms with tuned malloc settings. A compiled graph knows
// its allocations repeat every step, so its runtime keeps the blocks.
//
// How: a c10::Allocator installed as LibTorch's CPU allocator at the first PoolScope
// (c10::SetCPUAllocator, priority 1 so it also wraps an allocator installed at that
// priority before it, such as tcap-bench's byte counter). Outside a PoolScope it forwards
// to the allocator it replaced. Inside one, on the scope's thread, requests of at least
// kMinPooledBytes (sizes rounded up to 4 KiB) are served from cached free blocks, best
// fit, or, on a miss, by a new segment from the replaced allocator. A cached block larger
// than the request is split when the rest is at least kMinPooledBytes: the rest stays
// cached, a piece of the same segment. When a pooled tensor dies its piece returns to the
// cache and merges with free neighbours of its segment, as in PyTorch's CUDA caching
// allocator; so a segment whose pieces are all free is one block again. Over the cap
// (TCAP_BUFFER_POOL_MB), a wholly free segment is freed; empty_buffer_pool() frees every
// wholly free segment (a free piece of a segment still partly in use stays).
//
// Every DataPtr it hands out has data == context and the one deleter `release`, which is
// also its raw_deleter (c10's contract for raw_allocate, used by ideep and others).
// `release` tells pooled blocks from forwarded ones by a table of live pooled pointers; a
// per-hash-bucket counter read without the lock lets the free of a forwarded block skip
// the table. This needs the replaced allocator to hand out simple DataPtrs (data ==
// context, its raw deleter); if it does not, the pool is not installed (logged).
//
// The pool is never uninstalled and never freed: tensors may die at static destruction.
// TensorImpls and storages are unchanged: a pooled tensor is an ordinary CPU tensor.
#pragma once

#include <tcap/buffer_pool.h>

#include <cstddef>

namespace tcap::runtime {

constexpr size_t kMinPooledBytes = size_t{64} << 10;

// Pooled allocation on this thread while alive (nests). The first one installs the pool
// unless TCAP_BUFFER_POOL_MB=0.
class PoolScope {
 public:
  PoolScope();
  ~PoolScope();
  PoolScope(const PoolScope&) = delete;
  PoolScope& operator=(const PoolScope&) = delete;
};

// Tests: sets the cap (bytes) of cached blocks; returns the previous one.
int64_t set_buffer_pool_cap_for_testing(int64_t bytes);

}  // namespace tcap::runtime

// tcap's CPU buffer pool: compiled code reuses freed CPU blocks instead of returning them
// to malloc (docs/memory.md).
//
// While a compiled graph runs (tcap::compile's forward and backward, compile_step,
// compiled autograd; fused kernels' outputs), CPU allocations on that thread come from a
// pool; when such a tensor dies, wherever and whenever, its block goes back to the pool for
// the next step, up to TCAP_BUFFER_POOL_MB cached megabytes (default 1024; 0 turns the
// pool off). Eager code outside compiled graphs allocates as before. As in PyTorch's CUDA caching allocator, a cached block is split to serve a
// smaller request and freed pieces merge back; cached blocks are memory the process
// keeps: empty_buffer_pool() gives them back.
#pragma once

#include <cstdint>

namespace tcap {

struct BufferPoolStats {
  bool enabled = false;        // the pool is installed (after the first compiled replay)
  int64_t hits = 0;            // pooled allocations served from a cached block
  int64_t misses = 0;          // pooled allocations that took a new block from malloc
  int64_t cached_bytes = 0;    // free blocks kept for reuse
  int64_t cached_blocks = 0;
  int64_t live_bytes = 0;      // pooled blocks in use by tensors
  int64_t cap_bytes = 0;       // the most cached_bytes may reach
  // Blocks under 64 KiB (outputs and saved tensors of small graphs) come from size classes
  // carved out of one reserved range (docs/memory.md, "Small blocks").
  int64_t small_served = 0;       // small allocations served from the range
  int64_t small_live_blocks = 0;  // small blocks in use by tensors
  int64_t small_carved_bytes = 0; // bytes of the range cut into blocks so far
};

BufferPoolStats buffer_pool_stats();

// Frees every cached segment that is wholly free. A free piece of a segment still partly
// in use stays cached; it merges back into its segment as the other pieces are freed. The
// pages of small-block spans with no block in use go back to the system.
// Blocks in use return to the pool when their tensors die (to malloc, when the pool is
// over its cap and their segment is then wholly free).
void empty_buffer_pool();

}  // namespace tcap

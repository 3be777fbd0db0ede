// The loop plan of one CPU kernel: how the renderer walks a kir::Kernel's iteration
// domain (coalesced dims, which dim the vector lanes walk, how many passes). LLVM-free,
// so every decision here is plain C++ that tests and logs can print.
#pragma once

#include "kir/kir.h"

#include <cstdint>
#include <string>
#include <vector>

namespace tcap::codegen::cpu_llvm {

// What the planner and the renderer need to know about the target.
struct TargetInfo {
  std::string triple;        // "x86_64-pc-linux-gnu"
  std::string cpu;           // "znver3"
  std::string features;      // LLVM feature string of the host ("+avx2,+fma,...", sorted)
  int vector_bits = 128;     // the vector register width kernels use (128, 256 or 512)
  bool x86 = false;
  bool has_avx2 = false;
  bool has_avx512f = false;
  bool has_fma = false;      // fused multiply-add in hardware (x86 FMA3, AArch64)
  bool libmvec = false;      // glibc libmvec's x86-64 vector-ABI functions can be called
};

// Loop strategies; see Note [CPU loop nests] in render.cpp.
enum class LoopMode {
  Pointwise,    // no reduce dims: lanes walk the innermost dim of a row
  ReduceInner,  // lanes walk the innermost reduce dim; horizontal reduce per outer index
  ReduceOuter,  // lanes walk the innermost outer dim (VF outer indices at once)
};
const char* to_string(LoopMode m);

using Access = kir::Access;  // over the plan's (coalesced) dims

struct KernelPlan {
  // The coalesced domain (kir::coalesce): sizes[0, num_outer) are the outer dims, the
  // rest the reduce dims.
  std::vector<int64_t> sizes;
  int num_outer = 0;
  std::vector<Access> loads;   // indexed by value id (empty strides for non-Loads)
  std::vector<Access> stores;  // indexed like Kernel::stores
  std::vector<bool> elem;      // kir::element_level
  std::vector<int> level;      // kir::reduce_level
  int num_passes = 0;          // passes over the reduce dims per outer index
  LoopMode mode = LoopMode::Pointwise;
  int lane_dim = -1;           // plan dim the vector lanes walk; -1 for a scalar kernel
  int vf = 1;                  // vector lanes (1 = scalar code only)
  int unroll = 1;              // ReduceInner: vector accumulators per Reduce;
                               // ReduceOuter: vectors of outer indices per block
  int64_t grain = 1;           // at::parallel_for grain (iterations of parallel_range)
  // Per number slot (Note [Kernel numbers]), whether the code reads it from the launch's
  // numbers (Note [Sizes at launch] in cpu_llvm.h). Empty: every number is built in.
  std::vector<bool> at_launch;
  // Per store: whether its vector stores are streaming (non-temporal) where aligned (Note
  // [Streaming stores] in render.cpp).
  std::vector<bool> stream;
  // ReduceInner: the second pass over a row prefetches the next row's data for the first
  // pass's loads (Note [Prefetching the next row] in render_reductions.cpp).
  bool prefetch_next_row = false;

  bool is_reduction() const { return mode != LoopMode::Pointwise; }
  int rank() const { return static_cast<int>(sizes.size()); }
};

// Heuristics of the planner, one named constant each.
struct PlanOptions {
  // A parallel chunk should hold about this many element evaluations: big enough that
  // at::parallel_for's per-task overhead (~1-5 us) is noise, small enough to split a
  // 1M-element op over a handful of threads.
  int64_t chunk_work = 32768;
  // Independent vector accumulators for a unit-stride innermost reduction: hides the
  // 3-4 cycle latency of a vector add on current x86 cores. For a column reduction
  // (ReduceOuter), 4 vectors of adjacent outputs make each row access read two whole
  // 64-byte cache lines instead of half of one.
  int max_unroll = 4;
  // A store that writes at least this many bytes streams past the caches (Note
  // [Streaming stores]): more than a server CPU's last-level cache holds, so its lines
  // would be evicted before anything reads them again.
  int64_t stream_bytes = int64_t{32} << 20;
  // Note [Prefetching the next row]: rows of at most this many bytes (the current row and
  // the next one fit a core's L2), in kernels that read at least prefetch_min_bytes.
  int64_t prefetch_row_bytes = int64_t{256} << 10;
  int64_t prefetch_min_bytes = int64_t{8} << 20;
};

// Plans a kernel for a target. Calls kir::check_renderable first. With `varying` (a mask
// over number_slots: the numbers seen to differ between kernels of k's structure), the
// code reads the numbers `varying` marks at launch and has k's others built in; a
// decision that depends on a size read at launch (a vector body, the unroll) is taken as
// for a large size, and is correct at any size (the loops' tails cover small ones), so
// the code serves every kernel of the structure whose other numbers are k's.
KernelPlan make_plan(const kir::Kernel& k, const TargetInfo& t, const PlanOptions& o = {},
                     const std::vector<bool>* varying = nullptr);

// Note [Kernel numbers]
// Where a kernel's numbers live, one int64 slot each: the plan's (coalesced) sizes at
// slots [0, rank); for each Load, its offset and then one stride per plan dim; the same
// for each Store; for each Const, its value (an integer's value, a float's double bits).
// Two kernels of one `structure` (their text with every number left out, and each
// stride's class: 0, 1 or other) differ only in these numbers, so code that reads the
// numbers that differ at launch serves both.
struct NumberSlots {
  std::vector<int32_t> load;   // value id -> slot of the Load's offset (its strides follow); -1
  std::vector<int32_t> store;  // store index -> slot of its offset (its strides follow)
  std::vector<int32_t> value;  // value id -> slot of a Const's value; -1
  int32_t count = 0;
};
NumberSlots number_slots(const kir::Kernel& k, const KernelPlan& p);
// The numbers of kernel k as planned by p, in slot order.
std::vector<int64_t> kernel_numbers(const kir::Kernel& k, const KernelPlan& p, const NumberSlots& slots);
// The canonical text of k without its numbers (and without names): what a kernel shares
// with every kernel its code can serve when all its numbers are read at launch.
std::string kernel_structure(const kir::Kernel& k, const KernelPlan& p);
// Whether a number may be read at launch: a size, offset or stride (a stride's class, 0,
// 1 or other, is part of the structure), an F32 or F64 constant other than a pow's
// exponent (whose special values are compiled as ATen special-cases them); not another
// constant.
bool may_read_at_launch(const kir::Kernel& k, const NumberSlots& slots, int32_t slot);

// Note [Masked tails] (render.cpp): on unless TCAP_MASKED_TAILS=0 (read at each compile;
// part of every kernel's cache key, so code of one setting never serves the other).
bool masked_tails_on();

// One line per decision, for TCAP_LOGS=fusion and test failure messages.
std::string to_string(const KernelPlan& p);

}  // namespace tcap::codegen::cpu_llvm

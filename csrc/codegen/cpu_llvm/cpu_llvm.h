// cpu_llvm: renders a kir::Kernel to LLVM IR, optimises it at O3 for the host CPU and
// JIT-compiles it with ORC LLJIT (D7). This header is LLVM-free: callers (the runtime,
// tests) never see LLVM types; LLVM's headers stay inside codegen/cpu_llvm/.
//
// Calling convention of a compiled kernel:
//   void fn(void* const* args, int64_t begin, int64_t end, const int64_t* numbers);
// args[b] is the data pointer of kernel buffer b (the first element the kernel's
// offsets and strides are relative to); `numbers` are the kernel's sizes, offsets,
// strides and constants (Note [Kernel numbers] in plan.h), of which the code reads those
// it was compiled to read at launch (CpuKernel::run passes the kernel's own). The kernel computes iterations [begin, end) of
// kir::Kernel::parallel_range(): elements in row-major domain order for a kernel without
// reduce dims, outer indices (row-major over the outer dims) otherwise. Disjoint ranges
// may run concurrently on different threads (the runtime splits with at::parallel_for).
//
// Note [Sizes at launch]
// The first kernel of a structure (its IR with every number left out, Note [Kernel
// numbers] in plan.h) is compiled with its numbers built in. A second kernel of the same
// structure with other numbers (the same fused group at another batch size or sequence
// length: a dynamic entry specialized to new sizes) is compiled once more, as code that
// reads the numbers that differed (sizes, the strides and offsets that follow them, a
// mean's 1/n) at launch and keeps the others (a hidden width, a head size) built in; that
// code serves every later kernel of the structure whose other numbers are the same. A
// kernel that differs elsewhere widens the set (the union of what differed), as automatic
// dynamic shapes widen: a workload whose sizes vary in the same dims pays two compiles per
// kernel structure, whatever the number of sizes, and one more each time a number that
// had stayed the same starts to vary. A size read at launch is planned as a large one
// (vector body, unroll), the loops' tails covering small sizes. Only F32 and F64
// constants other than pow's exponents are read at launch; a kernel whose other constants
// differ compiles with them. A size of 1 changes the structure (the dim coalesces away),
// as it does for torch.compile's specialization of sizes 0 and 1.
//
// Kernels are cached in memory (per process) and on disk under
// <TCAP_CACHE_DIR or ~/.cache/tcap>/kernels/, keyed by the kernel IR's canonical text,
// the target (triple, CPU, features) and the LLVM and codegen versions. A cache file that
// is corrupt, truncated or written for another key is detected, logged and rebuilt.
#pragma once

#include "kir/kir.h"

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

namespace tcap::codegen::cpu_llvm {

struct CpuKernel {
  using Fn = void (*)(void* const* args, int64_t begin, int64_t end, const int64_t* numbers);
  Fn fn = nullptr;
  std::string name;        // the symbol in the JIT
  std::string key_hash;    // hex hash of the cache key of the code
  std::vector<int64_t> numbers;  // the kernel's numbers in slot order (Note [Kernel numbers])
  int numbers_at_launch = 0;     // how many of them the code reads at launch (0: all built in)
  int64_t range = 0;       // kernel.parallel_range()
  int64_t grain = 1;       // suggested at::parallel_for grain size (iterations)
  double compile_ms = 0;   // wall time of compile() for this kernel (0 on a memory hit)
  bool from_disk = false;  // loaded from the disk cache (no LLVM optimisation ran)
  // The optimised LLVM IR text (for TCAP_DUMP_DIR), shared by the kernels one code serves.
  std::shared_ptr<const std::string> llvm_ir;

  // Iterations [begin, end) of the kernel.
  void run(void* const* args, int64_t begin, int64_t end) const { fn(args, begin, end, numbers.data()); }
};

struct CpuLlvmStats {
  int memory_hits = 0;
  int disk_hits = 0;
  int compiled = 0;
  int corrupt_cache_files = 0;  // rejected and rebuilt
  int compiled_at_launch = 0;   // of `compiled`, code reading sizes at launch (Note [Sizes at launch])
  int served_at_launch = 0;     // kernels served by such code, compiled for other sizes
};

// Whether the backend can run here (built with LLVM, host target initialised). When it
// cannot, `why` says why in one line ("tcap was built without LLVM", ...).
bool cpu_llvm_available(std::string* why = nullptr);

// Compiles (or finds in the caches) a kernel. Throws c10::Error naming the kernel and the
// problem if the kernel uses something the renderer does not support; the caller then
// leaves the group's ops to ATen. Thread-safe.
std::shared_ptr<const CpuKernel> compile_cpu_kernel(const kir::Kernel& k);

// The kernel if no LLVM compile is needed for it: in the memory cache, or served by code
// of its structure compiled for other sizes (Note [Sizes at launch]); nullptr when it
// must be compiled (its numbers are then the first of its structure if none came before,
// so that kernels of other numbers compile code that reads them at launch). Throws as
// compile_cpu_kernel does for a kernel the renderer does not support. Thread-safe; never
// waits for a compile in progress (Note [Kernels compiled in the background],
// runtime/background_compiles.h; Note [Kernels compiled at their first run], pipeline.cpp).
std::shared_ptr<const CpuKernel> find_cpu_kernel(const kir::Kernel& k);

// The optimised LLVM IR text of a kernel (renders and optimises without JIT or caches),
// for kernels that need not run here (tests of other vector widths). A compiled kernel
// carries its own in CpuKernel::llvm_ir.
std::string cpu_kernel_llvm_ir(const kir::Kernel& k);

// A short description of the target ("x86_64-pc-linux-gnu znver3 +avx2,+fma vf32=8").
std::string cpu_target_description();

CpuLlvmStats cpu_llvm_stats();
// For tests: forget the in-memory cache and the structures seen (the disk cache stays), as
// a fresh process would, so the next compile of a kernel goes to disk.
void cpu_llvm_clear_memory_cache_for_testing();

}  // namespace tcap::codegen::cpu_llvm

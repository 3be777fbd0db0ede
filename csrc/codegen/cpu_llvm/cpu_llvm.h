// cpu_llvm: renders a kir::Kernel to LLVM IR, optimises it at O3 for the host CPU and
// JIT-compiles it with ORC LLJIT (D7). This header is LLVM-free: callers (the runtime,
// tests) never see LLVM types; LLVM's headers stay inside codegen/cpu_llvm/.
//
// Calling convention of a compiled kernel:
//   void fn(void* const* args, int64_t begin, int64_t end);
// args[b] is the data pointer of kernel buffer b (the first element the kernel's
// offsets and strides are relative to). The kernel computes iterations [begin, end) of
// kir::Kernel::parallel_range(): elements in row-major domain order for a kernel without
// reduce dims, outer indices (row-major over the outer dims) otherwise. Disjoint ranges
// may run concurrently on different threads (the runtime splits with at::parallel_for).
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

namespace tcap::codegen::cpu_llvm {

struct CpuKernel {
  using Fn = void (*)(void* const* args, int64_t begin, int64_t end);
  Fn fn = nullptr;
  std::string name;        // the symbol in the JIT
  std::string key_hash;    // hex hash of the cache key
  int64_t range = 0;       // kernel.parallel_range()
  int64_t grain = 1;       // suggested at::parallel_for grain size (iterations)
  double compile_ms = 0;   // wall time of compile() for this kernel (0 on a memory hit)
  bool from_disk = false;  // loaded from the disk cache (no LLVM optimisation ran)
  std::string llvm_ir;     // the optimised LLVM IR text (for TCAP_DUMP_DIR)
};

struct CpuLlvmStats {
  int memory_hits = 0;
  int disk_hits = 0;
  int compiled = 0;
  int corrupt_cache_files = 0;  // rejected and rebuilt
};

// Whether the backend can run here (built with LLVM, host target initialised). When it
// cannot, `why` says why in one line ("tcap was built without LLVM", ...).
bool cpu_llvm_available(std::string* why = nullptr);

// Compiles (or finds in the caches) a kernel. Throws c10::Error naming the kernel and the
// problem if the kernel uses something the renderer does not support; the caller then
// leaves the group's ops to ATen. Thread-safe.
std::shared_ptr<const CpuKernel> compile_cpu_kernel(const kir::Kernel& k);

// The optimised LLVM IR text of a kernel (renders and optimises without JIT or caches),
// for kernels that need not run here (tests of other vector widths). A compiled kernel
// carries its own in CpuKernel::llvm_ir.
std::string cpu_kernel_llvm_ir(const kir::Kernel& k);

// A short description of the target ("x86_64-pc-linux-gnu znver3 +avx2,+fma vf32=8").
std::string cpu_target_description();

CpuLlvmStats cpu_llvm_stats();
// For tests: forget the in-memory cache (the disk cache stays), so the next compile of a
// kernel goes to disk.
void cpu_llvm_clear_memory_cache_for_testing();

}  // namespace tcap::codegen::cpu_llvm

// cuda: renders a kir::Kernel to CUDA C++ (render.h), compiles it with NVRTC for the
// device's compute capability and launches it through the driver API (driver.h) on
// LibTorch's current CUDA stream (D7). Header free of CUDA types.
//
// Target choice: machine code (cubin) for sm_<capability of the device> when NVRTC
// supports that architecture; PTX for the newest architecture NVRTC supports when the
// device is newer (the driver JIT-compiles it); an error when the device is older than
// anything NVRTC supports.
//
// Caches: in memory per process, keyed by the source and the architecture; on disk under
// <TCAP_CACHE_DIR or ~/.cache/tcap>/kernels/ (Note [Kernel cache files]) keyed by the
// codegen version, libtcap's build id, the NVRTC version, the architecture and binary
// kind, and the CUDA source (which embeds the kernel IR), so a second process loads the
// cubin without running NVRTC.
#pragma once

#include "codegen/cuda/render.h"
#include "kir/kir.h"

#include <cstdint>
#include <memory>
#include <mutex>
#include <string>
#include <unordered_map>
#include <vector>

namespace tcap::codegen::cuda {

// One source compiled: the code that one kernel, or every kernel of a structure whose
// numbers are read at launch (Note [CUDA sizes at launch], numbers.h), runs.
struct CudaCode {
  std::string entry;       // the __global__ function
  std::string source;      // CUDA C++
  std::string binary;      // cubin, or PTX text when is_ptx
  bool is_ptx = false;
  int arch = 0;            // 90: sm_90 (cubin) / compute_90 (PTX)
  std::string key_hash;    // hex hash of the disk cache key
  double compile_ms = 0;   // NVRTC time (0 when the binary came from a cache)
  bool from_disk = false;
  bool reads_numbers = false;  // takes a `tcap_numbers` parameter

  // Per device, loaded on the first launch there, so a launch takes no global lock.
  mutable std::mutex mu;
  mutable std::unordered_map<int, void*> functions;
};

// A kernel ready to launch: its code, and its own plan and numbers.
struct CudaKernel {
  std::string name;        // the kernel IR's name (for messages)
  std::shared_ptr<const CudaCode> code;
  LaunchPlan plan;         // this kernel's (grid, alignment checks, scratch)
  std::vector<int64_t> numbers;  // this kernel's numbers, passed when code->reads_numbers
  size_t num_buffers = 0;
  std::vector<bool> by_value;  // per buffer: a parameter, passed by value (Note [Kernel parameters])

  // Per device: the grid size (which depends only on the plan and the device).
  mutable std::mutex mu;
  mutable std::unordered_map<int, int64_t> grids;
};

struct CudaStats {
  int memory_hits = 0;
  int disk_hits = 0;
  int compiled = 0;
  int compiled_at_launch = 0;  // of `compiled`, code reading numbers at launch (Note [CUDA sizes at launch])
  int served_at_launch = 0;    // kernels served by such code without a compile
  int corrupt_cache_files = 0;
  int64_t launches = 0;
};

// Whether kernels can run on a CUDA device here: NVRTC loads, the driver loads, a device
// exists. When not, `why` says why in one line.
bool cuda_available(std::string* why = nullptr);

// The architecture tcap compiles for on device `device` ({capability, cubin?}).
struct Target {
  int arch = 0;
  bool cubin = true;
};
Target target_for(int device);

// Compiles (or finds in the caches) a kernel for `target`: a kernel of a structure seen
// with other numbers gets code that reads them at launch (Note [CUDA sizes at launch]).
// Throws c10::Error naming the kernel with NVRTC's log when the source does not compile,
// or the renderer's reason when the kernel uses something it does not support. Thread-safe.
std::shared_ptr<const CudaKernel> compile_cuda_kernel(const kir::Kernel& k, const Target& target);

// PTX for compute_<arch> without caches or a device: what the no-GPU tests check.
std::string compile_to_ptx(const kir::Kernel& k, int arch, std::string* source = nullptr);

// Launches on device `device` and `stream` (a cudaStream_t). buffers: one data pointer per
// kernel buffer (the element the kernel's offsets are relative to); for a parameter, the
// host address of its number (Note [Kernel parameters]). scratch: device memory
// of k.plan.scratch_bytes (null when that is 0), usable in the stream's order; the launch
// zeroes its semaphores there first (Note [Split column reductions]). Errors name the kernel.
void launch(const CudaKernel& k, int device, void* stream, void* const* buffers, size_t num_buffers,
            void* scratch = nullptr);

CudaStats cuda_stats();
// Forgets the kernels and code in memory and the structures seen, as a fresh process would.
void cuda_clear_memory_cache_for_testing();

}  // namespace tcap::codegen::cuda

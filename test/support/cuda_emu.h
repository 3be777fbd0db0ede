// A host emulator for the kernels of the cuda backend (codegen/cuda), so that what the
// CUDA renderer writes runs, and is checked against eager LibTorch, on machines without a
// GPU (CI machines have none).
//
// Note [CUDA host emulation]
// The rendered CUDA C++ source itself is compiled with the host C++ compiler, with
// cuda_emu_device.h force-included in front of it (CUDA's keywords, threadIdx & co.,
// __syncthreads, __shfl_xor_sync, the bit casts and conversions the prelude uses), into a
// shared library that is loaded into the test. A launch runs the kernel's launch plan as
// the cuda backend would (the same vector_path_ok and grid rule, capped at a few blocks so
// the grid-stride loops take more than one turn), block after block; each CUDA thread of a
// block is a fiber with its own stack (switched by a few instructions of x86-64 assembly;
// ucontext elsewhere). __syncthreads parks a fiber until every thread of the block has
// arrived; a shuffle parks it until its 32 lanes have put their values in, then again
// until all have read, so block reductions, warp shuffles and multi-pass row kernels
// execute with CUDA's semantics. Between two barriers, even blocks run their threads in
// index order and odd blocks in reverse, so a shared-memory value read without a barrier
// after its write is stale in one of the two orders. The emulator is strict where CUDA
// is undefined: a full-mask shuffle without all 32 lanes, a thread that exits while others
// wait at a barrier, or a deadlock fail the launch with a message naming the kernel.
//
// Buffers are guarded: a launch runs on copies of the kernel's buffers (at the same
// alignment) with poisoned elements on either side (0xff bytes: NaN, -1); writing outside
// the elements the kernel IR can touch, or into an input, fails the launch, and a read
// outside reads poison, which the value comparisons then catch.
//
// What it checks: every index, offset, vector path (taken when the buffers are aligned,
// skipped when not), tail loop, grid-stride loop, reduction strategy and value conversion
// of the generated code. What it cannot: NVRTC itself (the PTX tests do that), the driver
// API, device math libraries (host libm stands in for libdevice: transcendentals may
// differ by an ulp or two), memory coalescing and speed.
//
// The compiled libraries are cached under <cache dir>/emu/, keyed by the whole source,
// the device header and the compiler, so a second run compiles nothing.
#pragma once

#include "codegen/cpu_llvm/cpu_llvm.h"
#include "codegen/cuda/numbers.h"
#include "codegen/cuda/render.h"
#include "kir/kir.h"

#include <tcap/compile.h>
#include <tcap/graph.h>

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

namespace tcap::testing::cuda_emu {

struct Options {
  // Grid cap: the backend's grid rule for a one-SM device, at most this many blocks (so the
  // grid-stride loops over elements and rows run more than once on small inputs).
  int max_blocks = 3;
};

// The elements [lo, hi] of a kernel buffer, relative to its data pointer, that the kernel
// IR's loads and stores can touch (hi < lo: none); per buffer, in kernel buffer order.
struct BufferExtent {
  int64_t lo = 0, hi = -1;
  int64_t elem_size = 1;
  bool is_output = false;
};
std::vector<BufferExtent> buffer_extents(const kir::Kernel& k);

// Whether kernels can be emulated here (a host compiler runs); else `why` says why.
bool available(std::string* why = nullptr);

// The kernel as the cuda backend renders it, compiled for the host, as a CPU kernel whose
// run(args, 0, 1) runs the whole grid (range 1). As in the backend, a kernel of a structure
// seen with other numbers (shapes()) gets code that reads them at launch (Note [CUDA sizes
// at launch]). Throws c10::Error naming the kernel when
// the source does not compile (with the compiler's output) and std::runtime_error from a
// launch that breaks CUDA's rules (see the Note).
std::shared_ptr<const codegen::cpu_llvm::CpuKernel> build(const kir::Kernel& k, const Options& o = {});
// The structures the emulator has seen (clear() makes the next kernel of each built-in).
// TCAP_EMU_NUMBERS_AT_LAUNCH=1: every kernel's code reads every number at launch (a whole
// test binary run through the renderer's launch path, e.g. the CUDA op sweep).
codegen::cuda::LaunchShapes& shapes();

// The same for a hand-written source (tests of the emulator itself): `src.source` defines
// the __global__ function `src.entry`, launched with `src.plan`. `bounds`: a kernel IR
// whose accesses bound each buffer (else the buffers are not guarded).
std::shared_ptr<const codegen::cpu_llvm::CpuKernel> build_source(const std::string& name, const codegen::cuda::CudaSource& src,
                                                       const Options& o = {}, const kir::Kernel* bounds = nullptr);

// A fw/bw compiler for tcap::CompileOptions: fuses the graph as the cuda backend does
// (kernels for the graph's CPU tensors) and runs every kernel through the emulator.
// `also_ptx`: every kernel is also compiled to PTX with NVRTC (when it is available).
tcap::Executable compiler(const ir::Graph& g, bool also_ptx = false, const Options& o = {});

struct Stats {
  int64_t built = 0;        // kernels compiled by the host compiler
  int64_t cache_hits = 0;   // kernels loaded from the disk cache
  int64_t sources = 0;      // distinct sources built or loaded: code, as the backend would compile it
  int64_t launches = 0;
  int64_t vector_launches = 0;  // launches that took the vector path (vec_ok = 1)
  int64_t column_launches = 0;  // launches of Column kernels (Note [Split column reductions])
  int64_t split_launches = 0;   // launches of kernels whose rows are split over several blocks
  int64_t fiber_switches = 0;
};
Stats stats();

}  // namespace tcap::testing::cuda_emu

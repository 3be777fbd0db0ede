// Inside the CUDA emulator (cuda_emu.cpp builds and loads kernel libraries;
// cuda_emu_grid.cpp runs their launches): what the two share.
#pragma once

#include "support/cuda_emu.h"

#include "codegen/cuda/cuda.h"

#include <cstdint>
#include <string>
#include <vector>

// The device header's structs, for the host side (the header itself is for kernels only).
struct tcap_emu_dim3 {
  unsigned int x, y, z;
};
struct tcap_emu_thread {
  tcap_emu_dim3 thread_idx, block_idx, block_dim, grid_dim;
};
struct tcap_emu_api {
  tcap_emu_thread* const* current;
  void (*syncthreads)();
  void (*shfl_xor)(void* value, int bytes, int lane_mask, unsigned int mask);
  void (*launch)(void* slot, void (*call)(void* const* args, int vec_ok), void* const* args, const int64_t* numbers);
};

namespace tcap::testing::cuda_emu::grid {

using Extent = BufferExtent;

// One compiled kernel library.
struct EmuKernel {
  std::string name;   // the kernel IR's name
  std::string entry;  // the __global__ function
  codegen::cuda::LaunchPlan plan;
  Options options;
  std::vector<Extent> extents;  // per buffer (kernels from kernel IR; empty: unguarded)
  std::vector<int64_t> numbers;  // read at launch (Note [CUDA sizes at launch]); empty: none
};

// The functions a kernel library calls (bound when it is loaded); its launches run the
// EmuKernel the library's entry passes.
const tcap_emu_api& api();

struct LaunchCounts {
  int64_t launches = 0, vector_launches = 0, column_launches = 0, split_launches = 0, fiber_switches = 0;
};
LaunchCounts launch_counts();

}  // namespace tcap::testing::cuda_emu::grid

// Launch planning for the cuda renderer: which strategy a kernel runs as (Note [CUDA
// kernel shapes], render.h), the block size, the vector width and the alignment checks
// it needs, whether rows stay in registers, and how reductions are split over blocks
// (Note [Split column reductions], plan.cpp). Apart from the code emission because every
// decision here is arithmetic on the kernel's shape that tests and logs print
// (to_string(LaunchPlan)), while emission only follows it.
// Preconditions: kir::check_renderable(k) holds and `c`, `elem`, `level` are
// kir::coalesce, kir::element_level and kir::reduce_level of k. Postconditions: the plan
// depends only on the kernel and the options, never on the device.
#pragma once

#include "codegen/cuda/render.h"
#include "kir/kir.h"

#include <cstdint>
#include <vector>

namespace tcap::codegen::cuda {

struct KernelPlan {
  LaunchPlan launch;
  int64_t split_len = 0;                  // splits > 1: reduce points per split
  std::vector<int64_t> workspace_offset;  // splits > 1: per value id of a Reduce, its
                                          // partial results' byte offset in the scratch
};

KernelPlan plan_kernel(const kir::Kernel& k, const kir::Coalesced& c, const std::vector<bool>& elem,
                       const std::vector<int>& level, const RenderOptions& o);

// kir passes of a reduction kernel (kir::reduce_level): one per level of nested Reduces.
int num_passes(const kir::Kernel& k, const std::vector<bool>& elem, const std::vector<int>& level);

}  // namespace tcap::codegen::cuda

// Replay of a compiled region (Note [Replaying a compiled region]): through
// ReplayFunction, a torch::autograd::Function whose backward runs the compiled backward,
// when the call needs a gradient; directly otherwise.
#pragma once

#include "aot/region_entry.h"

#include <ATen/core/Tensor.h>

#include <memory>
#include <vector>

namespace tcap::aot {

// The region's user outputs for `primals` (the call's tensors, then the held ones).
std::vector<at::Tensor> replay_region(const std::shared_ptr<const RegionEntry>& e,
                                      const std::vector<at::Tensor>& primals);

}  // namespace tcap::aot

// Replay of a compiled region (Note [Replaying a compiled region]): through
// ReplayFunction, a torch::autograd::Function whose backward runs the compiled backward,
// when the call needs a gradient; directly otherwise.
#pragma once

#include "aot/region_entry.h"

#include <ATen/core/Tensor.h>
#include <torch/csrc/autograd/variable.h>

#include <memory>
#include <vector>

namespace tcap::aot {

// The region's user outputs for `primals` (the call's tensors, then the held ones).
std::vector<at::Tensor> replay_region(const std::shared_ptr<const RegionEntry>& e,
                                      const std::vector<at::Tensor>& primals);

// Gradients by recomputation: runs `forward` (a graph over `primals`) through autograd
// and differentiates its first `num_outputs` outputs against `grads` (undefined: none),
// one gradient per primal (undefined where a primal does not require grad or is not
// reached). Primals listed in `written` are written by the graph (in place, or without its
// schema saying so: Note [Writes a schema does not show]): it runs on clones of them, so
// the recompute changes nothing. With create_graph the result is differentiable.
torch::autograd::variable_list recompute_gradients(const ir::Graph& forward, const std::vector<size_t>& written,
                                                   const std::vector<at::Tensor>& primals,
                                                   const torch::autograd::variable_list& grads, size_t num_outputs,
                                                   bool create_graph);

}  // namespace tcap::aot

// Replay of a compiled region (Note [Replaying a compiled region]): through
// ReplayFunction, a torch::autograd::Function whose backward runs the compiled backward,
// when the call needs a gradient; directly otherwise.
#pragma once

#include "aot/region_entry.h"
#include "cache/verify.h"

#include <ATen/core/Generator.h>

#include <ATen/core/Tensor.h>
#include <torch/csrc/autograd/variable.h>

#include <memory>
#include <string>
#include <vector>

namespace tcap::aot {

// What a verified replay's backward compares (Note [Verifying a compiled region]): the
// outputs of the eager run of the same call, whose gradients with respect to the primals
// eager's backward would compute.
struct RegionVerify {
  std::vector<at::Tensor> eager_outputs;
  std::vector<at::Tensor> primals;   // the call's primals (the eager run's inputs)
  std::vector<std::string> names;    // per primal, for messages
  cache::Tolerances tolerances;
  VerifyOptions options;
  cache::VerifyReport report;        // who and the likely cause; what and how filled per difference
};

// The region's user outputs for `primals` (the call's tensors, then the held ones). With
// `verify`, the replay's backward (if one runs) also computes eager's gradients and
// compares them (Note [Verifying a compiled region]).
std::vector<at::Tensor> replay_region(const std::shared_ptr<const RegionEntry>& e,
                                      const std::vector<at::Tensor>& primals,
                                      std::shared_ptr<RegionVerify> verify = nullptr);

// RNG state of the default generators of `devices`, to run a call twice on the same
// random numbers (a recompute, a verified replay).
class RngStates {
 public:
  static RngStates save(const std::vector<c10::Device>& devices);
  void restore() const;

 private:
  std::vector<std::pair<at::Generator, at::Tensor>> states_;
};
// The devices the values of g live on (the CPU when none).
std::vector<c10::Device> devices_of(const ir::Graph& g);

// Gradients by recomputation: runs `forward` (a graph over `primals`) through autograd
// and differentiates its first `num_outputs` outputs against `grads` (undefined: none),
// one gradient per primal (undefined where a primal does not require grad or is not
// reached). Primals listed in `written` are written by the graph (in place, or without its
// schema saying so: Note [Writes a schema does not show]): it runs on clones of them, so
// the recompute changes nothing. With create_graph the result is differentiable.
// `outputs`, when given, receives every output of the recomputed forward.
torch::autograd::variable_list recompute_gradients(const ir::Graph& forward, const std::vector<size_t>& written,
                                                   const std::vector<at::Tensor>& primals,
                                                   const torch::autograd::variable_list& grads, size_t num_outputs,
                                                   bool create_graph, std::vector<at::Tensor>* outputs = nullptr);

}  // namespace tcap::aot

// Comparing the two captures that precede a compiled training step (Note [Compiling a
// whole training step] in train_step.cpp): the graphs must be the same but for
//   * scalars the optimizers compute on the host: each is explained as a HostScalar of
//     one parameter's host state in both captures (Note [Host scalars of optimizers]) and
//     becomes a ScalarPatch that replay recomputes; a constant argument of a parameter
//     update that matches a learning-rate expression in both is patched too, so that the
//     learning rate is an input of the graph;
//   * values read on the host that differ, which are observations when the program says
//     so (CompileOptions::observe_host_values).
// Anything else is a reason the step cannot be compiled.
#pragma once

#include "step/optimizers.h"

#include <tcap/graph.h>

#include <string>
#include <unordered_map>
#include <utility>
#include <vector>

namespace tcap::step {

// A scalar argument of the step graph recomputed from an optimizer's host state.
struct ScalarPatch {
  ir::NodeId node;
  size_t arg;
  size_t opt, param;  // whose host state (optimizer, parameter index in it)
  HostScalar expr;
};

struct StepComparison {
  std::vector<ScalarPatch> patches;
  std::vector<ir::NodeId> observed;  // host reads whose values differ
  std::string why_not;               // "" when the captures are the same step
};

// `host1`, `host2`: per optimizer, per parameter, the host state each capture started
// from. `input_param`: the Input nodes of optimizers' parameters, with their (optimizer,
// index). Node ids are those of `second` (the graph that will be compiled).
StepComparison compare_step_captures(const ir::Graph& first, const ir::Graph& second,
                                     const std::vector<std::vector<HostState>>& host1,
                                     const std::vector<std::vector<HostState>>& host2,
                                     const std::vector<const OptimizerAdapter*>& opts,
                                     const std::unordered_map<ir::NodeId, std::pair<size_t, size_t>>& input_param,
                                     bool observe_host_values);

}  // namespace tcap::step

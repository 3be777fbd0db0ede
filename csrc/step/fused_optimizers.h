// Multi-tensor optimizer updates in a compiled training step (Note [Fused optimizer steps]
// in fused_optimizers.cpp): the per-parameter op chains that torch::optim's Adam, AdamW
// and SGD record are replaced by one ATen multi-tensor call per optimizer group
// (_fused_adam_, _fused_adamw_, _fused_sgd_), as Python's fused=True optimizers run.
#pragma once

#include "step/optimizers.h"
#include "step/step_captures.h"

#include <tcap/graph.h>

#include <map>
#include <string>
#include <utility>
#include <vector>

namespace tcap::step {

// Parameters one fused call updates with one step count: a replay is exact only while
// their optimizer's step counters agree (fused_steps_agree).
struct MultiTensorUpdate {
  size_t opt = 0;
  std::vector<size_t> params;
};

struct FusedOptimizerSteps {
  ir::Graph graph;                   // the step graph with fused updates
  std::vector<ScalarPatch> patches;  // the patches, renumbered, with the fused calls' own
  std::vector<MultiTensorUpdate> groups;
  int fused_params = 0;              // parameter updates that became part of a fused call
  std::vector<std::string> kept;     // why the other updates stayed as they were recorded
};

// `params`: (optimizer, parameter index) -> the parameter's Input value in g. A parameter
// whose update does not match its optimizer's recorded chain exactly (an option tcap has
// no fused form for, another op in between, a view a fused kernel cannot take) keeps its
// recorded ops, with the reason in `kept`.
FusedOptimizerSteps fuse_optimizer_steps(const ir::Graph& g, const std::vector<ScalarPatch>& patches,
                                         const std::vector<const OptimizerAdapter*>& opts,
                                         const std::map<std::pair<size_t, size_t>, ir::ValueId>& params);

// Whether the step counters of every group agree (see MultiTensorUpdate).
bool fused_steps_agree(const std::vector<MultiTensorUpdate>& groups, const std::vector<const OptimizerAdapter*>& opts);

}  // namespace tcap::step

// The min-cut partitioner's choice of what to save (Note [Min-cut recomputation]).
//
// Given the split joint graph, returns the forward values to save so that everything the
// backward reads is either saved or recomputable from saved values by cheap ops, with the
// fewest bytes saved. Precondition: `ph` comes from split_joint on the same graph.
// Postcondition: every value the backward reads is saved or produced by forward nodes
// that never_recomputed() allows, reading only saved values or other such nodes.
#pragma once

#include "passes/joint.h"

namespace tcap::passes {

std::vector<ir::ValueId> min_cut_saved(const ir::Graph& g, const JointPhases& ph, const MinCutOptions& options);

}  // namespace tcap::passes

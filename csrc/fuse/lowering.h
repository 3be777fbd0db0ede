// Lowering of ATen nodes into kernel IR: one row per operator (STYLE: op properties are
// rows in one table). The fusion pass (fusion.cpp) decides which nodes share a kernel;
// this table says what each node computes, in kir instructions (emitter.h), with eager's
// semantics, and how it uses the group's iteration space (classify.h reads that).
// Preconditions of lower(): classify() accepted the node. Postconditions: one Val per
// tensor output, in the node's compute dtype (the store casts to the output's dtype).
#pragma once

#include "fuse/emitter.h"

#include <tcap/graph.h>

#include <cstdint>
#include <vector>

namespace tcap::fuse {

// How a node uses the fusion group's iteration space.
enum class OpClass {
  Pointwise,  // one output element per element of its (broadcast) output shape
  Reduction,  // reduces its first tensor argument over `reduce_dims`
  Row,        // full-shape in and out, with reductions over `reduce_dims` inside (softmax)
};

using LowerFn = std::vector<Val> (*)(Emitter& e, const ir::Node& n);
// Reduce dims of a Reduction/Row node (in its first tensor argument's dims).
using DimsFn = std::vector<int64_t> (*)(const ir::Graph& g, const ir::Node& n);

// One row of the table.
struct LoweringRow {
  OpClass cls;
  LowerFn lower;
  DimsFn dims = nullptr;
};

// The row of n's operator (by overload, then by name), or null when it has none.
const LoweringRow* find_lowering(const ir::Node& n);

// Every key of the table ("aten::mul" or "aten::sum.dim_IntList") with its class; a test
// checks it against ir/op_facts.h.
std::vector<std::pair<std::string, OpClass>> lowered_ops();

// Lowers node n; returns one value per tensor output (ir Value / ValueList entries, in
// order), in a compute dtype.
std::vector<Val> lower(Emitter& e, const ir::Node& n);

}  // namespace tcap::fuse

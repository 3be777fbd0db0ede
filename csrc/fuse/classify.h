// Which nodes the fusion pass may put in a kernel, and how each uses the group's
// iteration space. Kept apart from the lowering table (lowering.h) because the rules here
// are about the node's arguments and device, not about what the operator computes: an
// operator with a row in the table is still refused for a tensor-list argument, a dtype
// kir has no kernels for, a tensor on another device, or arguments the table does not
// model (a _to_copy to another layout, round with decimals, ...).
// Postconditions: when classify() returns std::nullopt, lower() (lowering.h) can lower the
// node and `info` says its class; otherwise the string says why not, for the fusion log.
#pragma once

#include "fuse/lowering.h"

#include <tcap/graph.h>

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

namespace tcap::fuse {

// A node's fusion classification: how it uses the iteration space and which dims it
// reduces.
struct NodeClass {
  OpClass cls = OpClass::Pointwise;
  std::vector<int64_t> reduce_dims;  // Reduction / Row: dims of the first tensor argument, sorted;
                                     // Contraction: the last dim of contraction_space()
};

// Why a node cannot be lowered for kernels on `device` (every tensor it reads and writes
// must live there), or std::nullopt with `info` filled in.
// Matmuls (OpClass::Contraction) are accepted up to `max_matmul_macs` multiply-adds, on
// the CPU (Note [Small matmuls as kernels]).
std::optional<std::string> classify(const ir::Graph& g, const ir::Node& n, NodeClass* info,
                                    const c10::Device& device = c10::Device(c10::kCPU),
                                    int64_t max_matmul_macs = 0);

}  // namespace tcap::fuse

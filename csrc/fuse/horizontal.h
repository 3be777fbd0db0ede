// Independent kernels next to each other launched as one (Note [Horizontal kernels] in
// horizontal.cpp): an optimizer step's per-parameter updates become one launch per run.
#pragma once

#include <tcap/graph.h>

#include <string>
#include <vector>

namespace tcap::fuse {

constexpr const char* kHorizontalOp = "tcap::fused_horizontal";
constexpr const char* kHorizontalSchema =
    "tcap::fused_horizontal(Tensor[] inputs, int[] kernels, int[] arity) -> Tensor[]";

struct HorizontalResult {
  ir::Graph graph;                     // the rewritten graph; empty when runs == 0 (the input stands)
  int runs = 0;                        // tcap::fused_horizontal nodes made
  int kernels = 0;                     // tcap::fused nodes they replaced
  std::vector<std::string> decisions;  // per run: its kernels; per refused neighbour: why
};

// g (a fused graph) with each run of at least two tcap::fused nodes that follow each other
// and touch no memory another one of the run writes replaced by one tcap::fused_horizontal
// node, at the run's last node: its inputs the kernels' inputs in order, `arity` how many
// each kernel takes, its results the kernels' results in order.
HorizontalResult horizontal_kernels(const ir::Graph& g);

}  // namespace tcap::fuse

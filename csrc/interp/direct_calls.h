// Nodes the interpreter runs without the dispatcher (Note [Direct fused calls] in
// interpreter.cpp). The interpreter sits below the stages that generate kernels, so it
// knows them only through this interface: a later stage (runtime/fused_kernel.cpp)
// installs a finder that maps a node to the object that runs it.
// Contract of a node with a DirectCall: its first argument is a tensor list (the inputs)
// and its first output a tensor list (the results), as tcap::fused(Tensor[], int).
#pragma once

#include <tcap/graph.h>

#include <ATen/core/Tensor.h>

#include <memory>
#include <vector>

namespace tcap::interp {

class DirectCall {
 public:
  virtual ~DirectCall() = default;
  // Runs the node on its inputs; returns one tensor per output of its result list.
  virtual std::vector<at::Tensor> call(const std::vector<at::Tensor>& inputs) = 0;
};

// The object that runs node n directly, or null (it runs through the dispatcher).
using DirectCallFinder = std::shared_ptr<DirectCall> (*)(const ir::Node& n);
// Installs the finder Interpreters consult when they are built (one per process; a later
// call replaces it). Thread-safe.
void set_direct_call_finder(DirectCallFinder finder);

}  // namespace tcap::interp

// Nodes the interpreter runs without the dispatcher (Note [Direct fused calls] in
// interpreter.cpp). The interpreter sits below the stages that generate kernels, so it
// knows them only through these interfaces: a compiled graph hands its interpreter the
// table of its own kernels (runtime::KernelTable), which maps a node to the object that
// runs it.
// Contract of a node with a DirectCall: its first argument is a tensor list (the inputs)
// and its first output a tensor list (the results), as tcap::fused(Tensor[], int).
#pragma once

#include <tcap/graph.h>

#include <ATen/core/Tensor.h>

#include <memory>
#include <string>
#include <vector>

namespace tcap::interp {

class DirectCall {
 public:
  virtual ~DirectCall() = default;
  // Runs the node on its inputs; returns one tensor per output of its result list.
  virtual std::vector<at::Tensor> call(const std::vector<at::Tensor>& inputs) = 0;
  // The same results from the ATen ops the node stands for, each through the dispatcher:
  // what a run under a mode key (a capture recording the replay) does, so the recording
  // holds those ops and no node that only this graph's table can run.
  virtual std::vector<at::Tensor> call_ops(const std::vector<at::Tensor>& inputs) = 0;
};

// The kernels of one compiled graph, which its nodes name by their place in the table.
class DirectCalls {
 public:
  virtual ~DirectCalls() = default;
  // The object that runs node n, an op with ir::OpFact::RunsTableKernel; throws
  // c10::Error saying why when this table has none for it.
  virtual std::shared_ptr<DirectCall> find(const ir::Node& n) const = 0;
};

}  // namespace tcap::interp

// Host scalars as graph inputs (Note [Host scalars as graph inputs] in scalar_inputs.cpp).
#pragma once

#include <tcap/graph.h>

#include <ATen/core/Tensor.h>

#include <string>
#include <vector>

namespace tcap::passes {

// A constant scalar argument (Double or WrappedScalar) that changes between calls.
struct ScalarArg {
  ir::NodeId node;
  size_t arg;
  std::string name;  // the new input's name
};

// A copy of g where each argument of `args` reads a new input of kind HostScalar (a 0-dim
// float64 CPU tensor), the k-th new input after g's own inputs for args[k]. Throws if an
// argument is not a floating-point scalar constant.
ir::Graph scalars_as_inputs(const ir::Graph& g, const std::vector<ScalarArg>& args);

// The value of a host scalar as a graph input takes it.
at::Tensor host_scalar_input(double value);

}  // namespace tcap::passes

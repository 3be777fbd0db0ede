// What a compiled training step reads (Note [Compiling a whole training step] in
// train_step.cpp): the tensors of a call in the order its graph's inputs take them (user
// inputs, parameters, buffers, defined .grads, optimizer state), the host values guarded
// with them (module training flags, optimizer options and learning rates) and the
// structure key that says which tensors are there (a parameter whose .grad appears, a
// hook registered on a parameter: a different structure, so another cache entry); their
// names only when asked (Note [A structure key without names]).
#pragma once

#include "step/optimizers.h"
#include "cache/entry_cache.h"

#include <tcap/graph.h>

#include <torch/nn/module.h>

#include <memory>
#include <string>
#include <utility>
#include <vector>

namespace tcap::step {

// A parameter of the step: the models' (named_parameters order), then optimizer
// parameters that are in no model.
struct StepParam {
  at::Tensor tensor;
  std::string name;
  int opt = -1;      // the optimizer stepping it, -1: none
  size_t index = 0;  // its index in that optimizer's params()
};

// The inputs of one call.
struct StepInputs {
  std::vector<at::Tensor> ts;
  std::vector<std::string> names;  // with_names only
  std::vector<ir::InputKind> kinds;
  std::vector<StepParam> params;
  // Note [Leaves of a step]
  // The tensors whose .grad the step's backward may set, as eager's AccumulateGrad would:
  // the parameters, then the user inputs that are leaves requiring grad (an adversarial
  // example's input, a latent code being optimized). A replay runs no AccumulateGrad, so
  // it sets, keeps or clears each one's .grad as the captured step did; whether each has a
  // .grad, and which inputs are such leaves (requires_grad is guarded per input), are
  // part of the structure key. A tensor the step reads from outside its inputs that gets a
  // gradient runs the step eagerly, with the reason (pass it as an input).
  std::vector<size_t> input_leaves;  // positions of those user inputs
  std::vector<int> grad_input;       // per leaf: index of its .grad input, or -1
  size_t num_leaves() const { return params.size() + input_leaves.size(); }
  const at::Tensor& leaf(size_t j) const;
  std::string leaf_name(size_t j) const;  // "fc.weight", "in0"
  std::vector<int> param_input;  // per parameter: index of the parameter input
  cache::ModuleView modules;     // the models' state (Note [Module state guards]); paths with_names
  std::vector<double> scalars;
  std::vector<std::string> scalar_names;  // with_names only
  std::vector<bool> scalar_is_lr;
  std::vector<size_t> state_input;                // positions of the optimizers' state tensors
  std::vector<int> state_param;                   // per state tensor: its parameter (index in params), or -1
  std::vector<std::pair<size_t, size_t>> hooked;  // (tensor, number of leaf hooks) of hooked inputs, parameters
  std::string structure;  // the structure key (Note [A structure key without names])
  // The history nodes of earlier replayed steps behind user inputs, whose tensors are
  // inputs too (Note [Backpropagating into an earlier step's outputs]).
  std::vector<std::shared_ptr<torch::autograd::Node>> histories;

  // The view the entry cache's guards read.
  cache::CallView view() const;
};

// The models and the optimizers of a step, as compile_step was given them (the models'
// trees are read on every call: Note [Module state guards]).
struct StepParts {
  std::vector<std::shared_ptr<torch::nn::Module>> models;
  std::vector<const OptimizerAdapter*> opts;
};

// with_names: fill names and scalar_names too (to capture; a replay needs only the
// structure key, Note [A structure key without names]).
StepInputs gather_step_inputs(const StepParts& parts, const std::vector<at::Tensor>& user, bool with_names);

// Per optimizer, per parameter: the host state (step counts, learning rates) now.
std::vector<std::vector<HostState>> host_states(const std::vector<const OptimizerAdapter*>& opts);

}  // namespace tcap::step

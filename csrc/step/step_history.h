// Note [Outputs with history from a replayed step]
// A step may return a tensor whose autograd history a later backward still runs through:
// a GAN written as two steps, the discriminator's step returning the generator's images,
// which the generator's update then backpropagates into. A replay runs below autograd, so
// the compiled step gives such outputs a history of its own: one node (StepHistory, a
// torch::autograd::Function) whose inputs are the tensors the outputs were computed from
// that require grad (the generator's parameters, an input with a history of its own), and
// whose backward recomputes the outputs from them through autograd, from the slice of the
// step graph that made them, and differentiates it. The engine routes the gradients on as
// it would have from the eager history: into the parameters' AccumulateGrad (.grad, leaf
// hooks) and into the histories of inputs that have one. Gradients are eager's: the
// recompute runs the recorded ops on the same values.
//
// The slice is what the outputs depend on: the ops that made them, over the step's
// inputs, each read as the step's start left it or, for an input the step updates and the
// outputs were computed from afterwards (a weight after the optimizer's step), as the end
// of the step left it (the update itself is not redone: it wrote a leaf). What a replay
// keeps for the backward: references to the tensors the slice reads and their versions
// after the step (a tensor changed in place before the backward is an error, as eager's
// SavedVariable check makes it one, since the recompute would read the new values), and
// clones of the buffers the slice itself writes (a BatchNorm's running statistics: the
// recompute writes into the clones and reads the values the step read).
//
// A step whose slice cannot be recomputed exactly runs eagerly, with the reason:
//   * the slice reads a tensor that the step's other ops change in place afterwards (an
//     optimizer updating the weights the output was computed with: eager's backward would
//     reject or use the changed weights, a recompute could not tell);
//   * the slice writes a tensor other than a module buffer (a parameter, a .grad);
//   * the slice draws random numbers (its recompute would draw others), calls hooks,
//     issues collectives or uses a scalar recomputed per step (an optimizer's).
#pragma once

#include <tcap/graph.h>

#include <ATen/core/Tensor.h>
#include <torch/csrc/autograd/function.h>

#include <memory>
#include <string>
#include <vector>

namespace tcap::step {

struct HistorySlice {
  ir::Graph graph;              // inputs: the step inputs it reads; outputs: the outputs' values
  std::vector<size_t> outputs;  // the step outputs it makes, in graph-output order
  std::vector<size_t> inputs;   // per slice input: its position among the step's primals
  std::vector<size_t> written;  // slice inputs (positions in `inputs`) the slice writes
};

// The slice of step graph `g` that makes its outputs `outputs` (user outputs first in
// g's outputs). `buffer` says which primals are module buffers (the only inputs the slice
// may write); `patched` lists nodes whose arguments are recomputed per step. Returns ""
// and fills `out`, or the reason the outputs' history cannot be given by recomputing.
std::string make_history_slice(const ir::Graph& g, const std::vector<size_t>& outputs, const std::vector<bool>& buffer,
                               const std::vector<ir::NodeId>& patched, HistorySlice* out);

// What one replay keeps for the history: taken before the step's executable runs (it
// clones the buffers the slice writes, whose values the executable is about to change).
struct HistoryCall;
std::shared_ptr<HistoryCall> before_step(const std::shared_ptr<const HistorySlice>& slice,
                                         const std::vector<at::Tensor>& primals, std::string who);
// After the executable: gives the slice's outputs among `outs` their history (none when
// grad mode is off or nothing the slice read requires grad, as in eager).
void attach_history(const std::shared_ptr<HistoryCall>& call, std::vector<at::Tensor>& outs);

// Note [Backpropagating into an earlier step's outputs]
// A step that takes such an output as an input (the generator's update of a two-step GAN,
// compiled too) runs the history's backward inside its own: capture records the
// recompute's ops, which read the tensors the history kept. Those differ every call, so
// they are inputs of the step, gathered from the input's history node each call (after
// the history's own version checks), not constants. Only a StepHistory node directly
// behind a step input is gathered that way. A step whose backward runs into a history
// eager code made (its saved tensors would be constants of the graph, different every
// call) runs eagerly, with the reason.
//
// If `input`'s grad_fn is a replayed step's history node that has not run its backward:
// appends the tensors it keeps to `out` (checking their versions as its backward would),
// and their names to `names` when given, and returns the node; else null.
std::shared_ptr<torch::autograd::Node> history_tensors(const at::Tensor& input, std::vector<at::Tensor>& out,
                                                       std::vector<std::string>* names);
// Whether n is a replayed step's history node.
bool is_history_node(const torch::autograd::Node& n);
// After a replay that ran that backward in its graph: the node frees what it kept, as its
// own backward would have (a second backward through it is an error).
void release_history(torch::autograd::Node& node);

}  // namespace tcap::step

// What compiled autograd needs to know about the backward node of a tcap::compile region
// (a ReplayNode or CppNode<ReplayFunction>, whose saved state Node::compiled_args cannot
// describe).
#pragma once

#include <torch/csrc/autograd/function.h>

#include <ATen/core/ivalue.h>

#include <string>
#include <typeinfo>
#include <vector>

namespace tcap::aot {

// Whether nodes of type `t` are such nodes (ReplayNode, or CppNode<ReplayFunction> for the
// calls it does not take: Note [The replay node]): describe_replay_node describes exactly
// the nodes of these types.
bool is_replay_node_type(const std::type_info& t);

// If `node` is the backward of a tcap::compile region: appends what fixes its backward
// computation (the compiled entry, by address, kept alive through `keep_alive`) to `key`
// and the tensors its backward reads to `tensors`, and returns true. Else returns false.
bool describe_replay_node(const torch::autograd::Node& node, std::string& key, std::vector<at::Tensor>& tensors,
                          std::vector<c10::IValue>& keep_alive);

// Drops what the backward of a tcap::compile region keeps (Note [Saved tensors of a
// compiled region]), as release_variables() does for its context: call both when the node
// runs without retain_graph. A node of another type is left alone.
void release_replay_node(torch::autograd::Node& node);

}  // namespace tcap::aot

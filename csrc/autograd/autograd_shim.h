// The one header through which compiled autograd reaches LibTorch's internal autograd
// API, which has no stability promise and changes between releases: the generated node
// classes (torch/csrc/autograd/generated/Functions.h, whose members the generated list in
// autograd/generated/ mirrors), AccumulateGrad and GraphRoot, dynamo's CompiledNodeArgs
// (Node::compiled_args), and SavedVariable's private is_output_. A LibTorch upgrade that
// breaks compiled autograd breaks here, in autograd_shim.cpp or in the generated list
// (whose static_asserts name the node; rerun tools/gen_node_describers.py), not in the walk.
#pragma once

#include <torch/csrc/autograd/function.h>
#include <torch/csrc/autograd/functions/accumulate_grad.h>
#include <torch/csrc/autograd/functions/basic_ops.h>
#include <torch/csrc/autograd/generated/Functions.h>
#include <torch/csrc/autograd/saved_variable.h>
#include <torch/csrc/dynamo/compiled_autograd.h>

namespace tcap::ca {

// LibTorch's generated autograd nodes (SinBackward0, MulBackward0, ...).
namespace G = torch::autograd::generated;

// Whether a SavedVariable saved an output of its node: unpack() needs the node for a saved
// output (and must not get it for a saved input, see Note [Generated nodes described
// from their fields]). is_output_ is private.
bool is_saved_output(const torch::autograd::SavedVariable& sv);

}  // namespace tcap::ca

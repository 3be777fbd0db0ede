// The checks the interpreter makes before calling a kernel that trusts its arguments.
//
// Note [Kernels that trust their arguments]
// A few ATen CPU kernels index their inputs by sizes they assume agree, without checking
// (found by fuzzing: native_layer_norm_backward with a grad_out smaller than its input
// read past grad_out). Eager autograd only ever passes them consistent tensors; a graph
// file can pass anything. For these operators the interpreter checks the relation first.
#pragma once

#include <tcap/graph.h>

#include <ATen/core/stack.h>

namespace tcap::interp {

// Whether n's operator indexes its inputs by sizes it assumes agree.
bool trusts_its_arguments(const ir::Node& n);
// Throws c10::Error when the arguments on `stack` for n do not agree as its kernel assumes.
void check_trusted_arguments(const ir::Node& n, const torch::jit::Stack& stack);

}  // namespace tcap::interp
